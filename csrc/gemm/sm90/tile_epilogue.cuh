// The sm90 tile engine's epilogue: turns one consumer warpgroup's fp32 accumulators (64 rows
// of a finished tile) into bf16 output rows, through a shared-memory staging buffer.
//
// Epilogues (kAct):
//   kPlain      out = bf16(acc)                                     (FC2)
//   activation  out = bf16(act(bf16(acc)) * prob[row])             (FC1, non-gated)
//   gated       out = bf16(act(bf16(g)) * bf16(u) * prob[row])      (FC1, SwiGLU / GeGLU)
// The rounding points are those of the reference (FC1 output in bf16, activation in fp32);
// h, when wanted, is the bf16 pre-activation [gate | up] that backward needs.
//
// Why staged: the warpgroup writes its 64 x kCols values into a 128-byte-swizzled buffer
// (conflict-free 4-byte shared stores) and then
//   - a full 64-row block whose rows are consecutive in a tensor leaves by TMA stores that
//     one thread issues; the warpgroup goes on to its next tile's MMAs while they drain;
//   - an expert's last, partial block (TMA clips only at a tensor's edge and the rows below
//     belong to the next expert) is copied out with 16-byte plain stores;
//   - rows that each go somewhere else (FC2 rows into their (token, k) combine slots, local
//     or on a peer) leave as one 1-D bulk store per row, also asynchronous.
// The grouped GEMM does all of it in its consumer warpgroups (store_rows_staged); the
// megakernel hands the staged rows to a storer warp instead (megakernel/epilogue_storer.cuh).
// Either way each output element is computed once in a fixed order, so the result does not
// depend on the path taken.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "config/kernel_config.cuh"
#include "epilogue/activation_math.cuh"
#include "gemm/sm90/tile_engine.cuh"
#include "gemm/sm90/tma.cuh"

namespace mok::sm90 {

// Rows one consumer warpgroup stages, and its buffer: kGemmBlockN bf16 columns as boxes of
// 64 rows x 64 columns (one 128-byte swizzle row each: kStagedBoxBytes, below).
constexpr int kStagedRows = kGemmWarpgroupRows;

// A staged box of 64 rows x kBoxCols bf16 columns, each row one TMA swizzle span: 64 columns
// (128-byte swizzle), or 32 (64-byte swizzle) for a tile whose columns are not whole 64s - the
// FP8 engine's wide gated tiles, 96 output columns - since TMA stores whole boxes. 16-byte
// chunk c of row r sits at chunk c ^ swizzle(r): the 8 rows one warp store touches land in
// 8 different bank groups either way.
template <int kBoxCols>
struct StagedBox {
  static_assert(kBoxCols == 64 || kBoxCols == 32, "128- or 64-byte swizzled rows");
  static constexpr int kRowBytes = kBoxCols * 2;
  static constexpr int kChunks = kRowBytes / 16;  // per row
  static constexpr int kBytes = kStagedRows * kRowBytes;
  __device__ static int swizzle(int r) { return kBoxCols == 64 ? r % 8 : (r / 2) % 4; }
  // Chunk c (8 columns) of row r of a staged tile of such boxes.
  __device__ static int offset(int r, int c) {
    return (c / kChunks) * kBytes + r * kRowBytes + ((c % kChunks) ^ swizzle(r)) * 16;
  }
};
constexpr int kStagedBoxBytes = StagedBox<64>::kBytes;

// The box width a staged tile of `cols` columns (a multiple of 32) is stored in - on the
// device and for the host's tensor maps (staged_rows_map's box_cols).
constexpr int staged_box_cols(int cols) { return cols % 64 == 0 ? 64 : 32; }
// Scattered rows (store_rows_scattered) are staged unswizzled, one row of kGemmBlockN bf16 per
// kScatterRowBytes: the 16 bytes of padding put the 8 rows one warp store touches in 8
// different bank groups. The buffer holds either layout; 33 KiB keeps it 1024-aligned.
constexpr int kScatterRowBytes = kGemmBlockN * 2 + 16;
constexpr int kStagedBufBytes = kStagedRows * kScatterRowBytes;
static_assert(kStagedBufBytes >= kStagedRows * kGemmBlockN * 2 && kStagedBufBytes % 1024 == 0,
              "staging buffer: both layouts, swizzle-atom aligned");

// Named barriers kStagingBarrier + c (c < kGemmConsumers) order consumer warpgroup c's
// staging buffer; ids from kStagingBarrier + kGemmConsumers on are free for the caller.
constexpr int kStagingBarrier = 1;

struct EpilogueBuffers {
  uint8_t out[kGemmConsumers][kStagedBufBytes];  // 1024-aligned where the struct is
};

__device__ __forceinline__ float round_bf16(float x) {
  return __bfloat162float(__float2bfloat16(x));
}

template <int kAct>
__device__ __forceinline__ float activate(float h) {
  if constexpr (kAct == kPlain) return h;
  else return act_eval<kAct>(h).f;
}

// The epilogue's value for accumulator pair (8-column chunk j, row half i) with row prob p:
// output columns 8j + 2(lane % 4) + {0, 1} of the thread's row 16 warp + lane / 4 + 8i, in a
// tile of kTileN accumulator columns (the first kTileN / 2 registers of d).
template <int kAct, int kTileN = kGemmBlockN, int kRegs>
__device__ __forceinline__ __nv_bfloat162 output_pair(const float (&d)[kRegs], int j, int i,
                                                      float p) {
  static_assert(kRegs >= kTileN / 2, "accumulators of the whole tile");
  constexpr bool kGated = gated_epilogue<kAct>();
  constexpr int kCols = tile_cols<kAct, kTileN>();
  float v[2];
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const float h = round_bf16(d[4 * j + 2 * i + c]);
    if constexpr (kGated) {
      const float u = round_bf16(d[4 * (j + kCols / 8) + 2 * i + c]);
      v[c] = activate<kAct>(h) * u * p;
    } else {
      v[c] = activate<kAct>(h) * p;
    }
  }
  return __floats2bfloat162_rn(v[0], v[1]);
}

// A tensor of bf16 rows the epilogue writes: its TMA map (viewed as [rows, halves, n_out], so a
// box never crosses from gate into up) and the same memory as pointer + row stride, for rows
// copied out.
struct EpilogueTensor {
  const CUtensorMap* map;
  __nv_bfloat16* base;
  int64_t stride;
};

// Writes value(j, i) for this thread's accumulator pairs into buf as StagedBox rows (64
// columns a box, 128-byte swizzled, unless kCols is not a multiple of 64): box b starts at
// b * StagedBox::kBytes. `t` is the thread's index in its consumer warpgroup.
template <int kCols, class Value>
__device__ __forceinline__ void write_staged(uint8_t* buf, int t, Value value) {
  static_assert(kCols % 32 == 0, "staged tiles are whole 32-column boxes");
  constexpr int kBoxCols = staged_box_cols(kCols);
  using Box = StagedBox<kBoxCols>;
  const int warp = t / 32, lane = t % 32;
  // Chunk j of row r sits in box j / kChunks at chunk (j % kChunks) ^ swizzle(r); rows r and
  // r + 8 share the swizzle, so kChunks base addresses plus immediates cover every store and
  // the address arithmetic stays out of the registers the MMAs need.
  const int r0 = 16 * warp + lane / 4;
  uint8_t* row_base = buf + r0 * Box::kRowBytes + (lane % 4) * 4;
#pragma unroll
  for (int jj = 0; jj < Box::kChunks; ++jj) {
    uint8_t* base = row_base + ((jj ^ Box::swizzle(r0)) * 16);
#pragma unroll
    for (int box = 0; box < kCols / kBoxCols; ++box) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        *reinterpret_cast<__nv_bfloat162*>(base + box * Box::kBytes + i * 8 * Box::kRowBytes) =
            value(Box::kChunks * box + jj, i);
      }
    }
  }
}

// The accumulators acc[first ..] as write_staged's values: bf16 pairs in the fragment's order.
template <int kRegs>
__device__ __forceinline__ auto rounded_pairs(const float (&acc)[kRegs], int first = 0) {
  return [&acc, first](int j, int i) {
    return __floats2bfloat162_rn(acc[first + 4 * j + 2 * i], acc[first + 4 * j + 2 * i + 1]);
  };
}

template <int kCols, int kRegs>
__device__ __forceinline__ void write_staged_rounded(uint8_t* buf, int t,
                                                     const float (&acc)[kRegs], int first = 0) {
  write_staged<kCols>(buf, t, rounded_pairs(acc, first));
}

// One thread: the staged boxes (write_staged) of a whole 64-row block into half `half` of
// `dst` at rows row0 .. row0 + 63 by TMA, one bulk group; columns at or past n_out are
// clipped by box. dst's map has kBoxCols-column boxes (staged_rows_map's box_cols).
template <int kBoxCols = 64>
__device__ __forceinline__ void issue_staged_boxes(const EpilogueTensor& dst, const uint8_t* buf,
                                                   int boxes, int half, int row0, int col0,
                                                   int n_out) {
  for (int box = 0; box < boxes; ++box) {
    if (col0 + kBoxCols * box < n_out) {
      tma_store_4d(dst.map, buf + box * StagedBox<kBoxCols>::kBytes, col0 + kBoxCols * box,
                   half, row0, 0);
    }
  }
  bulk_commit();
}

// Threads t = 0 .. threads - 1: the first rows_valid staged rows (an expert's partial last
// block: TMA clips only at a tensor's edge and the rows below belong to the next expert)
// copied out with 16-byte plain stores.
template <int kCols>
__device__ __forceinline__ void copy_staged_rows(const uint8_t* buf, const EpilogueTensor& dst,
                                                 int half, int row0, int rows_valid, int col0,
                                                 int n_out, int t, int threads) {
  constexpr int kChunksPerRow = kCols / 8;
  for (int idx = t; idx < rows_valid * kChunksPerRow; idx += threads) {
    const int r = idx / kChunksPerRow, c = idx % kChunksPerRow;
    const int col = col0 + 8 * c;
    if (col >= n_out) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(
        buf + StagedBox<staged_box_cols(kCols)>::offset(r, c));
    *reinterpret_cast<uint4*>(dst.base + int64_t(row0 + r) * dst.stride +
                              int64_t(half) * n_out + col) = v;
  }
}

// One round of the engine's epilogue: value(j, i) -> buf, then into half `half` of `dst` at
// rows row0 .. row0 + 63: by TMA when the block is `full`, else its first rows_valid rows
// copied out. The buffer is reused only after the previous round's TMA stores have read it
// (leader's bulk_wait_read, then the barrier).
template <int kCols, class Value>
__device__ __forceinline__ void store_round(uint8_t* buf, const EpilogueTensor& dst, int half,
                                            int row0, bool full, int rows_valid, int col0,
                                            int n_out, int consumer, bool leader, Value value) {
  const int t = threadIdx.x % 128;
  if (leader) bulk_wait_read<0>();
  named_barrier_sync(kStagingBarrier + consumer, 128);
  write_staged<kCols>(buf, t, value);
  fence_proxy_async_shared();
  named_barrier_sync(kStagingBarrier + consumer, 128);
  if (full) {
    constexpr int kBoxCols = staged_box_cols(kCols);
    if (leader) {
      issue_staged_boxes<kBoxCols>(dst, buf, kCols / kBoxCols, half, row0, col0, n_out);
    }
    return;
  }
  copy_staged_rows<kCols>(buf, dst, half, row0, rows_valid, col0, n_out, t, 128);
}

// The router probs of this thread's two rows of its warpgroup's 64 (rows 16 warp + lane / 4
// + 8i; 1 past rows_valid and for the plain epilogue), prob_row0 being the warpgroup's first
// row in row_prob. Callers load them before the tile's mainloop, so the global loads' latency
// hides behind the MMAs instead of opening the epilogue.
template <int kAct>
__device__ __forceinline__ void load_row_probs(const float* __restrict__ row_prob,
                                               int prob_row0, int rows_valid, float (&p)[2]) {
  const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = 16 * warp + lane / 4 + 8 * i;
    p[i] = (kAct == kPlain || r >= rows_valid) ? 1.f : row_prob[prob_row0 + r];
  }
}

// The whole epilogue of one consumer warpgroup for a tile whose rows are consecutive in the
// output tensors: out, then (h.base != nullptr) h's gate and, gated, up halves, each a round
// through the same buffer. row0 is the warpgroup's first row in the output tensors, p its
// rows' probs (load_row_probs); `full` says all 64 rows belong to the tile (decided by the
// caller with its own comparison: when ptxas derived the branch from `rows_valid == 64` after
// a min/max, partial blocks took the TMA path).
template <int kAct, int kTileN = kGemmBlockN, int kRegs>
__device__ __forceinline__ void store_rows_staged(const float (&d)[kRegs], uint8_t* buf,
                                                  const EpilogueTensor& out,
                                                  const EpilogueTensor& h, int row0, bool full,
                                                  int rows_valid, int col0, int n_out,
                                                  const float (&p)[2], int consumer,
                                                  bool leader) {
  constexpr int kCols = tile_cols<kAct, kTileN>();
  store_round<kCols>(buf, out, 0, row0, full, rows_valid, col0, n_out, consumer, leader,
                     [&](int j, int i) { return output_pair<kAct, kTileN>(d, j, i, p[i]); });
  if constexpr (kAct != kPlain) {
    if (h.base != nullptr) {
      store_round<kCols>(buf, h, 0, row0, full, rows_valid, col0, n_out, consumer, leader,
                         rounded_pairs(d));
      if constexpr (gated_epilogue<kAct>()) {
        store_round<kCols>(buf, h, 1, row0, full, rows_valid, col0, n_out, consumer, leader,
                           rounded_pairs(d, 4 * (kCols / 8)));
      }
    }
  }
}

// FC2's rows in the megakernel, staged unswizzled (row r of the warpgroup's 64 at
// r * kScatterRowBytes) so that each leaves as one 1-D bulk store to its own destination:
// kCols columns (the tile engine's kGemmBlockN, the FP8 engine's kFp8BlockN).
template <int kCols = kGemmBlockN, int kRegs>
__device__ __forceinline__ void write_scatter_staged(const float (&d)[kRegs], uint8_t* buf,
                                                     int t) {
  static_assert(kRegs >= kCols / 2 && kCols <= kGemmBlockN, "a staged row holds the tile's");
  const int warp = t / 32, lane = t % 32;
  uint8_t* base = buf + (16 * warp + lane / 4) * kScatterRowBytes + (lane % 4) * 4;
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      *reinterpret_cast<__nv_bfloat162*>(base + j * 16 + i * 8 * kScatterRowBytes) =
          __floats2bfloat162_rn(d[4 * j + 2 * i], d[4 * j + 2 * i + 1]);
    }
  }
}

}  // namespace mok::sm90
