// The forward megakernel's epilogue in two halves. A consumer warpgroup only converts its
// accumulators to bf16 rows in its staging buffer and hands them on: FC1's pre-activation h
// (gate | up when gated), FC2's output rows. A storer warp of the producer warpgroup (one per
// consumer warpgroup) does the rest - for FC1 stores h when backward keeps it, computes
// act(h) * prob (act(gate) * up * prob) in place and stores that; stores are TMA boxes, an
// expert's partial last block copied out, FC2's rows one bulk store each - and the counting
// that waits on them: fc1_done once a tile's activation rows are in memory, fc2_done once the
// consumer's MMAs have read an FC2 tile's act rows. The consumers go straight on to their
// next tile's MMAs, so the activation's math, the stores, their completion waits and the
// release fences are off the tensor cores' path (docs/perf-log.md: 5-9 µs of a 20-90 µs tile).
// The rounding points are the consumer epilogue's (output_pair): h is bf16, the activation
// is computed in fp32 and rounded once, so results are the same bits either way. Under the
// blockwise FP8 recipe an FC1 tile is 128 activation columns (gated: two passes, each its
// own slot) and the storer stores act as FC2 reads it, E4M3 codes and a scale code per row
// (store_fp8_act); FC2 tiles are 128 columns.
//
// The backward megakernel's storers (backward_storer.cuh) take the same handoffs, with a
// record of their own, and reuse the FC1 path (store_fc1_staged).
//
// Handoffs use the buffer's two slots in sequence q = 0, 1, ... (slot q % 2, phase parity
// (q / 2) & 1). A tile's rows (64 x 256 bf16 of h, or FC2's unswizzled 33 KiB) take both,
// starting at slot 0 (a skip record fills slot 1 first when needed); a record without rows
// (count only, end) takes one. The record
// travels in its first slot's entry. `full`: every consumer thread arrives, each after its
// own fence.proxy.async (TMA then sees its writes); `empty`: the storer, once the stores
// have read the slots. The storer cannot get a phase ahead of a lagging consumer warp (it
// needs that warp's arrive), nor the consumers of the storer.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/ptx.cuh"
#include "common/vec.cuh"
#include "gemm/sm90/tile_engine.cuh"
#include "gemm/sm90/tile_epilogue.cuh"
#include "gemm/sm90/tma.cuh"
#include "megakernel/tile_trace.cuh"
#include "quant/fp8_rows.h"
#include "quant/mx_block_scale.cuh"

namespace mok {

constexpr int kStagedSlotBytes = 16 * 1024;  // one 64 x 128 bf16 round: two swizzled boxes
static_assert(2 * kStagedSlotBytes <= sm90::kStagedBufBytes &&
                  kStagedSlotBytes == 2 * sm90::kStagedBoxBytes,
              "a consumer's staging buffer holds two slots");

enum StagedKind : int { kStagedFc1 = 0, kStagedFc2 = 1, kStagedSkip = 2, kStagedEnd = 3 };

struct StagedRecord {
  int kind;
  int slots;       // slots it takes (1 or 2)
  int has_rows;    // 0: count only (the warpgroup had no rows, or a profile skips stores)
  int row0;        // FC1: the warpgroup's first row in act / h; FC2: its first schedule row
  int prob_row0;   // FC1: its first schedule row (row_prob)
  int rows_valid;  // rows of the 64 that exist
  int full;        // FC1: all 64 rows consecutive in the tensor (TMA), else copied out
  int col0;        // first output column
  int counter;     // FC1: m-block (fc1_done); FC2: macrobatch (fc2_done)
};

// Record: StagedRecord, or a record with its fields and more (the backward megakernel's).
template <class Record = StagedRecord>
struct StagingHandoff {
  uint64_t full[2];
  uint64_t empty[2];
  Record rec[2];
};

template <class Record>
__device__ __forceinline__ void init_staging_handoff(StagingHandoff<Record>& h) {
  for (int i = 0; i < 2; ++i) {
    sm90::mbar_init(&h.full[i], 128);
    sm90::mbar_init(&h.empty[i], 1);
  }
}

// What the storer writes and counts (pointers and sizes of the launch).
struct StorerTargets {
  const float* row_prob;
  const CUtensorMap* act_map;  // act's store map (kActFp8Codes: of its codes)
  const CUtensorMap* h_map;   // h's store map: forward's kept h, by schedule row; the
                              // backward ring's h, by slot row
  __nv_bfloat16* act;
  __nv_bfloat16* h;          // or null: no h kept
  int h_rows;                // forward: the schedule's first rows whose h is kept
  int ffn, f1, hidden;       // act row width, h row width (2F gated), FC2 row width
  const int32_t* row_slot;   // FC2 rows: flat (source, token, k) slot
  const int64_t* peer_bases;
  int64_t slots_offset;
  int per_rank;
  uint32_t* fc1_done;
  uint32_t* fc2_done;
  uint64_t timeout_ns;
  int* report;
  Fp8Rows act_fp8;  // kActFp8Codes: act as FC2 reads it (act_map: its codes' store map)
};

// What the storer makes of an FC1 tile's activation (the recipe's FC2 operand): bf16 rows;
// bf16 rows of MXFP8 values (rounded along F); or, blockwise, E4M3 codes and E8M0 scale codes
// per 1 x 128 of each row (FC1 tiles of kFp8ScaleBlock activation columns).
enum ActForm : int { kActBf16 = 0, kActMxRounded = 1, kActFp8Codes = 2 };

// Consumer warpgroup side; every one of its 128 threads keeps the same sequence position.
template <class Record = StagedRecord>
struct StagingWriter {
  StagingHandoff<Record>* hand;
  uint8_t* buf;
  int q;
  bool leader;

  __device__ void wait_free(int pos, int tile, uint64_t timeout_ns, int* report) const {
    sm90::mbar_wait(&hand->empty[pos % 2], ((pos / 2) & 1) ^ 1, timeout_ns,
                    sm90::kWaitStaging, tile, pos % 2, report);
  }
  __device__ void arrive(int slots) const {
    sm90::fence_proxy_async_shared();
    for (int i = 0; i < slots; ++i) sm90::mbar_arrive(&hand->full[(q + i) % 2]);
  }
  // The slots for a handoff of `slots`, once free: returns where its rows go.
  __device__ uint8_t* acquire(int slots, int tile, uint64_t timeout_ns, int* report) {
    if (slots == 2 && q % 2 == 1) {
      wait_free(q, tile, timeout_ns, report);
      if (leader) hand->rec[1] = Record{kStagedSkip, 1};
      arrive(1);
      ++q;
    }
    for (int i = 0; i < slots; ++i) wait_free(q + i, tile, timeout_ns, report);
    return buf + (q % 2) * kStagedSlotBytes;
  }
  // After this thread's writes into the acquired slots: the record goes with them.
  __device__ void hand_off(const Record& r) {
    if (leader) hand->rec[q % 2] = r;
    arrive(r.slots);
    q += r.slots;
  }
  // A record without rows (count only, end): one slot.
  __device__ void hand_off_record(Record r, int tile, uint64_t timeout_ns, int* report) {
    r.slots = 1;
    r.has_rows = 0;
    acquire(1, tile, timeout_ns, report);
    hand_off(r);
  }
  // Both slots free (every handoff before released) for a use outside the handoffs: the
  // backward's rounding tiles keep scratch there. The sequence position does not move.
  __device__ void drain(int tile, uint64_t timeout_ns, int* report) const {
    wait_free(q, tile, timeout_ns, report);
    wait_free(q + 1, tile, timeout_ns, report);
  }
};

// 16 bytes of shared memory at a shared-window address (what the storer's generic pointer
// would otherwise become: a generic access, resolved to shared memory per access).
__device__ __forceinline__ void ld_shared_v4(uint32_t addr, uint32_t (&v)[4]) {
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "r"(addr));
}
__device__ __forceinline__ void st_shared_v4(uint32_t addr, const uint32_t (&v)[4]) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v[0]), "r"(v[1]),
               "r"(v[2]), "r"(v[3])
               : "memory");
}

// Shared-space address of 16-byte chunk c (8 bf16 columns) of staged row r: write_staged's
// swizzled boxes of 64 columns.
__device__ __forceinline__ uint32_t staged_chunk(uint32_t base, int c, int r) {
  return base + (c / 8) * sm90::kStagedBoxBytes + r * 128 + (((c % 8) ^ (r % 8)) * 16);
}

// One 16-byte chunk (8 columns) of one row: h (and, gated, up) read at h_off (u_off), the
// activation times p written at out_off - which may be h_off.
template <int kAct>
__device__ __forceinline__ void activate_chunk(uint32_t h_off, uint32_t u_off, uint32_t out_off,
                                               float p) {
  constexpr bool kGated = sm90::gated_epilogue<kAct>();
  uint32_t h[4], u[4];
  ld_shared_v4(h_off, h);
  if constexpr (kGated) ld_shared_v4(u_off, u);
  uint32_t out[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    float a[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      a[i] = sm90::activate<kAct>(bf16_of(h[e], i));
      if constexpr (kGated) a[i] = a[i] * bf16_of(u[e], i) * p;
      else a[i] = a[i] * p;
    }
    out[e] = pack_bf16x2(a[0], a[1]);
  }
  st_shared_v4(out_off, out);
}

// Lane l's rows l and l + 32 (probs p_lo, p_hi), kChunks output chunks each: chunk c of row r
// activated from what where(c, r) says - {h, up, out} shared-space addresses.
template <int kAct, int kChunks, class Where>
__device__ __forceinline__ void activate_rows(float p_lo, float p_hi, int lane, Where where) {
#pragma unroll 1
  for (int half = 0; half < 2; ++half) {
    const int r = lane + 32 * half;
    const float p = half == 0 ? p_lo : p_hi;
#pragma unroll 1
    for (int c = 0; c < kChunks; ++c) {
      const uint3 at = where(c, r);
      activate_chunk<kAct>(at.x, at.y, at.z, p);
    }
  }
}

// act(h) * prob (gated: act(gate) * up * prob) of one staged FC1 tile of kCols activation
// columns, in place: slot 0 (and slot 1) held h as write_staged<256> left it (gated: gate in
// slot 0, up at the same place in slot 1) and afterwards slot 0 holds the activation as
// write_staged<kCols> would have (same swizzled chunk positions). Lane l takes rows l and
// l + 32 (p_lo / p_hi are their probs), 16-byte chunks (8 columns) at a time; the 8 lanes of
// a quarter-warp are 8 consecutive rows, whose swizzled chunks lie in 8 different bank groups.
// One warp does all of a tile's 64 rows (8192 outputs for SwiGLU), so its time is the
// latency of the exp -> reciprocal chains that ptxas overlaps in the registers it has (two at
// 56, one at 40: docs/perf-log.md); no chunk waits on a shuffle or a spilled prob.
template <int kAct, int kCols = sm90::tile_cols<kAct>()>
__device__ __forceinline__ void activate_staged(uint8_t* slots, float p_lo, float p_hi,
                                                int lane) {
  const uint32_t base = sm90::smem_addr(slots);
  activate_rows<kAct, kCols / 8>(p_lo, p_hi, lane, [&](int c, int r) {
    const uint32_t off = staged_chunk(base, c, r);
    return make_uint3(off, off + kStagedSlotBytes, off);
  });
}

// The blockwise recipe's FC1 tile (one 1 x kFp8ScaleBlock block of act per row): slot 0 holds
// h of its 128 columns (plain), or - gated, two passes of 64 columns - slot p holds pass p's
// gate (box 0) and up (box 1) columns; afterwards slot 0 holds the tile's 128 activation
// columns as write_staged<128> would have (output chunk c at box c / 8). Output chunk c >= 8
// overwrites what chunk c - 8 read before, in the same lane.
template <int kAct>
__device__ __forceinline__ void activate_staged_fp8(uint8_t* slots, float p_lo, float p_hi,
                                                    int lane) {
  const uint32_t base = sm90::smem_addr(slots);
  activate_rows<kAct, kFp8ScaleBlock / 8>(p_lo, p_hi, lane, [&](int c, int r) {
    const uint32_t out = staged_chunk(base, c, r);
    if constexpr (!sm90::gated_epilogue<kAct>()) return make_uint3(out, out, out);
    const uint32_t h = staged_chunk(base + (c / 8) * kStagedSlotBytes, c % 8, r);
    return make_uint3(h, h + sm90::kStagedBoxBytes, out);
  });
}

// The blockwise recipe's act as FC2 reads it (ops.fp8_quantize_rows' values: 1 x 128 blocks
// of bf16(act(h) * p) along F): each staged row of activate_staged_fp8 at the scale of its
// amax, as E4M3 codes into `codes` - 64 rows of 128 bytes, 16-byte chunk c of row r at chunk
// c ^ (r % 8) (the 128-byte swizzle of fp8_staged_codes_map's box) - and returns the rows'
// E8M0 scale codes (lane l: row l's in bits 0-7, row l + 32's in bits 8-15; a byte array
// indexed by the loop would live in local memory). A block with a NaN or an Inf is NaN codes
// with scale code 255, as the quantizer writes it. The columns past F hold act(0) * 0 = 0,
// which leaves a short last block's amax alone.
__device__ __forceinline__ uint32_t quantize_staged_fp8(const uint8_t* act, uint8_t* codes,
                                                        int lane) {
  constexpr int kChunks = kFp8ScaleBlock / 8;
  const uint32_t base = sm90::smem_addr(act), out = sm90::smem_addr(codes);
  uint32_t scale_codes = 0;
#pragma unroll 1
  for (int half = 0; half < 2; ++half) {
    const int r = lane + 32 * half;
    uint32_t m = 0;
#pragma unroll 4
    for (int c = 0; c < kChunks; ++c) {
      uint32_t v[4];
      ld_shared_v4(staged_chunk(base, c, r), v);
#pragma unroll
      for (int k = 0; k < 4; ++k) m = larger_halves(m, magnitudes(v[k]));
    }
    const BlockScale scale(max(m & 0xFFFFu, m >> 16));
    scale_codes |= uint32_t(scale.finite ? scale.e + kE8m0Bias : kE8m0Nan) << (8 * half);
#pragma unroll 1
    for (int cc = 0; cc < kChunks / 2; ++cc) {  // 16 codes: two chunks of bf16
      uint32_t q[4];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        uint32_t v[4];
        ld_shared_v4(staged_chunk(base, 2 * cc + j, r), v);
#pragma unroll
        for (int k = 0; k < 4; k += 2) {
          const uint32_t lo = code_pair(bf16_of(v[k], 0), bf16_of(v[k], 1), scale.down, scale.down);
          const uint32_t hi =
              code_pair(bf16_of(v[k + 1], 0), bf16_of(v[k + 1], 1), scale.down, scale.down);
          q[2 * j + k / 2] = scale.finite ? lo | (hi << 16) : uint32_t(kE4m3Nan) * 0x01010101u;
        }
      }
      st_shared_v4(out + r * 128 + ((cc ^ (r % 8)) * 16), q);
    }
  }
  return scale_codes;
}

// MXFP8's act as FC2 reads it (mok_megatron/recipes/mxfp8.py: bf16(act(h) * p) along F): the staged
// activation of activate_staged rounded in place, each row's blocks of kMxBlock columns (four
// chunks; a tile's first column is a multiple of 64, so no block spans two tiles) at the
// scale of their amax - the values mx_round_columns writes. The columns of the tile past F
// hold act(0) * 0 = 0 (TMA reads W1's missing rows as zeros), which leaves a short last
// block's amax alone. Lane l rounds rows l and l + 32, the rows activate_staged gave it.
template <int kAct>
__device__ __forceinline__ void mx_round_staged(uint8_t* slot, int lane) {
  constexpr int kChunks = sm90::tile_cols<kAct>() / 8;
  constexpr int kBlockChunks = kMxBlock / 8;
  static_assert(kChunks % kBlockChunks == 0, "a tile holds whole blocks");
  const uint32_t base = sm90::smem_addr(slot);
#pragma unroll 1
  for (int half = 0; half < 2; ++half) {
    const int r = lane + 32 * half;
#pragma unroll 1
    for (int c0 = 0; c0 < kChunks; c0 += kBlockChunks) {
      uint32_t v[kBlockChunks][4];
      uint32_t m = 0;
#pragma unroll
      for (int j = 0; j < kBlockChunks; ++j) {
        ld_shared_v4(staged_chunk(base, c0 + j, r), v[j]);
#pragma unroll
        for (int k = 0; k < 4; ++k) m = larger_halves(m, magnitudes(v[j][k]));
      }
      const BlockScale scale(max(m & 0xFFFFu, m >> 16));
#pragma unroll
      for (int j = 0; j < kBlockChunks; ++j) {
        const int4 q = round_vector(v[j], &scale, &scale, 0);
        const uint32_t o[4] = {uint32_t(q.x), uint32_t(q.y), uint32_t(q.z), uint32_t(q.w)};
        st_shared_v4(staged_chunk(base, c0 + j, r), o);
      }
    }
  }
}

// One part of a staged FC1 tile's h (kCols columns from `src`: half `half` of h at column
// col0) into h. kScheduleRows: h's rows are schedule rows, the first tg.h_rows of them kept
// (forward); else the tile's rows in act's buffer (the backward's ring). One TMA box per 64
// columns when the warpgroup's 64 rows are consecutive (the map's edge clips the rows past
// h's), else its rows copied out, those below tg.h_rows by schedule row.
template <int kCols, bool kScheduleRows, class Record>
__device__ __forceinline__ void store_h_part(const uint8_t* src, const Record& r,
                                             const StorerTargets& tg, int half, int col0,
                                             int lane) {
  const sm90::EpilogueTensor h{tg.h_map, tg.h, tg.f1};
  const int row0 = kScheduleRows ? r.prob_row0 : r.row0;
  if (r.full) {
    if (lane == 0) sm90::issue_staged_boxes(h, src, kCols / 64, half, row0, col0, tg.ffn);
  } else {
    const int rows = kScheduleRows ? min(r.rows_valid, tg.h_rows - r.prob_row0) : r.rows_valid;
    sm90::copy_staged_rows<kCols>(src, h, half, row0, rows, col0, tg.ffn, lane, 32);
  }
}

// An FC1 tile's h, as its consumer staged it, into h (store_h_part's rows). The slots hold h as
// [gate | up] halves of the tile's kCols columns, one per slot; the blockwise gated tile holds
// 64 act columns per slot instead, each slot's two boxes its gate and its up columns
// (activate_staged_fp8 reads them so).
template <int kAct, int kActForm, int kCols, bool kScheduleRows, class Record>
__device__ __forceinline__ void store_staged_h(const uint8_t* buf, const Record& r,
                                               const StorerTargets& tg, int lane) {
  constexpr bool kGated = sm90::gated_epilogue<kAct>();
  if constexpr (kActForm == kActFp8Codes && kGated) {
    for (int slot = 0; slot < 2; ++slot) {
      for (int half = 0; half < 2; ++half) {
        store_h_part<64, kScheduleRows>(
            buf + slot * kStagedSlotBytes + half * sm90::kStagedBoxBytes, r, tg, half,
            r.col0 + 64 * slot, lane);
      }
    }
  } else {
    constexpr int kHCols = kActForm == kActFp8Codes ? kFp8ScaleBlock : kCols;
    for (int half = 0; half < (kGated ? 2 : 1); ++half) {
      store_h_part<kHCols, kScheduleRows>(buf + half * kStagedSlotBytes, r, tg, half, r.col0,
                                          lane);
    }
  }
}

// Stores a blockwise FC1 tile's act (slots as activate_staged_fp8 leaves them, backward's h
// not kept): its codes quantized into slot 1, stored as one TMA box when all 64 rows are
// consecutive (r.full), else copied out row by row; its scale codes into the transposed
// scales. The caller's warp barrier and release order the plain stores.
__device__ __forceinline__ void store_fp8_act(uint8_t* slots, const StagedRecord& r,
                                              const StorerTargets& tg, int lane) {
  uint8_t* codes = slots + kStagedSlotBytes;
  const uint32_t scale_codes = quantize_staged_fp8(slots, codes, lane);
  const Fp8Rows& dst = tg.act_fp8;
  uint8_t* scales = dst.scales + int64_t(r.col0 / kFp8ScaleBlock) * dst.scale_stride + r.row0;
  if (lane < r.rows_valid) scales[lane] = uint8_t(scale_codes);
  if (lane + 32 < r.rows_valid) scales[lane + 32] = uint8_t(scale_codes >> 8);
  if (r.full) {
    sm90::fence_proxy_async_shared();
    __syncwarp();
    if (lane == 0) {
      sm90::tma_store_4d(tg.act_map, codes, r.col0, r.row0, 0, 0);
      sm90::bulk_commit();
      sm90::bulk_wait_read<0>();
    }
    return;
  }
  __syncwarp();
  constexpr int kChunks = kFp8ScaleBlock / 16;  // 16-byte chunks of codes per row
  for (int idx = lane; idx < r.rows_valid * kChunks; idx += 32) {
    const int row = idx / kChunks, c = idx % kChunks;
    if (r.col0 + 16 * c >= tg.ffn) continue;  // rows are padded to 16 codes
    *reinterpret_cast<uint4*>(dst.codes + int64_t(r.row0 + row) * dst.code_stride + r.col0 +
                              16 * c) =
        sm90::ld_shared_16(codes + row * 128 + ((c ^ (row % 8)) * 16));
  }
}

// A staged FC1 tile of kCols activation columns (slots as the consumer left them: h, gate in
// slot 0 and up at the same place in slot 1 when gated): h stored where it is kept (tg.h), then
// act(h) * prob made in place and stored as kActForm says. kScheduleRows: h's rows are
// schedule rows, the first tg.h_rows of them kept (forward); else the tile's rows in act's
// buffer (the backward's ring). On return the stores have read the slots; lane 0's TMA stores
// may still be writing (its caller waits before counting). trace stamps slot h_out at row seq
// once h is stored, `activated` once act is made.
template <int kAct, int kActForm, int kCols, bool kScheduleRows, class Record, class Trace>
__device__ __forceinline__ void store_fc1_staged(uint8_t* buf, const Record& r,
                                                 const StorerTargets& tg, int lane,
                                                 const Trace& trace, int seq, int h_out,
                                                 int activated) {
  const float p_lo = lane < r.rows_valid ? tg.row_prob[r.prob_row0 + lane] : 0.f;
  const float p_hi = lane + 32 < r.rows_valid ? tg.row_prob[r.prob_row0 + lane + 32] : 0.f;
  // h where it is kept, stored before the activation overwrites it.
  if (tg.h != nullptr && (!kScheduleRows || r.prob_row0 < tg.h_rows)) {
    store_staged_h<kAct, kActForm, kCols, kScheduleRows>(buf, r, tg, lane);
    if (lane == 0) sm90::bulk_wait_read<0>();
    __syncwarp();
  }
  trace.stamp(seq, h_out);
  if constexpr (kActForm == kActFp8Codes) {
    activate_staged_fp8<kAct>(buf, p_lo, p_hi, lane);
    trace.stamp(seq, activated);
    store_fp8_act(buf, r, tg, lane);
  } else {
    activate_staged<kAct, kCols>(buf, p_lo, p_hi, lane);
    if constexpr (kActForm == kActMxRounded) mx_round_staged<kAct>(buf, lane);
    trace.stamp(seq, activated);
    const sm90::EpilogueTensor act{tg.act_map, tg.act, tg.ffn};
    if (r.full) {
      sm90::fence_proxy_async_shared();
      __syncwarp();
      if (lane == 0) {
        sm90::issue_staged_boxes(act, buf, kCols / 64, 0, r.row0, r.col0, tg.ffn);
        sm90::bulk_wait_read<0>();
      }
    } else {
      __syncwarp();
      sm90::copy_staged_rows<kCols>(buf, act, 0, r.row0, r.rows_valid, r.col0, tg.ffn, lane,
                                    32);
    }
  }
}

// The storer warp of one consumer warpgroup: takes its handoffs in order until the end record.
// `trace` (diagnostic kernel, storer of consumer 0, lane 0; else null) stamps each tile's
// handoff at the consumer's tile index. kActForm: what FC1's activation is stored as.
template <int kAct, int kActForm>
__device__ __forceinline__ void run_storer(StagingHandoff<>& hand, uint8_t* buf,
                                           const StorerTargets& tg, const TileTrace& trace) {
  constexpr int kFc1Cols = sm90::tile_cols<kAct>();
  constexpr int kFc2Cols = kActForm == kActFp8Codes ? kFp8BlockN : kGemmBlockN;
  const int lane = threadIdx.x % 32;
  // Between two handoffs its consumers wait (tile queue, stages, staging slots), each wait
  // bounded by timeout_ns and reporting itself; the storer's one wait spans them, so it gets
  // twice the bound: a stuck consumer is reported by the consumer's wait, within the bound,
  // and a stall is still reported within 2x the bound if it is the storer's own.
  const uint64_t handoff_timeout_ns = 2 * tg.timeout_ns;
  int seq = 0;  // the consumer's tile index of the handoff (skip records are not tiles)
  for (int q = 0;; ) {
    const int slot = q % 2;
    const uint32_t parity = (q / 2) & 1;
    sm90::mbar_wait(&hand.full[slot], parity, handoff_timeout_ns, sm90::kWaitStaging, -1, slot,
                    tg.report);
    // Read in place, not copied: the activation loop needs the registers (its MUFU chains
    // only overlap with ~20 free). What is used after the release is copied before it.
    const StagedRecord& r = hand.rec[slot];
    if (r.slots == 2) {
      sm90::mbar_wait(&hand.full[1], parity, handoff_timeout_ns, sm90::kWaitStaging, -1, 1,
                      tg.report);
    }
    if (r.kind == kStagedEnd) {
      sm90::bulk_wait<0>();  // this lane's stores are complete before the kernel ends
      return;
    }
    trace.stamp(seq, kTrStorerTook);
    if (r.kind == kStagedFc1 && r.has_rows) {
      // h kept by schedule row, the first tg.h_rows of them (kernel.kept_h_tokens with the
      // ring, every row with saved inputs).
      store_fc1_staged<kAct, kActForm, kFc1Cols, true>(buf, r, tg, lane, trace, seq,
                                                       kTrStorerHOut, kTrStorerActivated);
    } else if (r.kind == kStagedFc2) {
      // The consumer's MMAs have read the tile's act rows (wgmma_wait<0> before its arrive).
      if (lane == 0) red_release_gpu_add_u32(&tg.fc2_done[r.counter], 1);
      if (r.has_rows) {
        const int cols = min(kFc2Cols, tg.hidden - r.col0);
        for (int row = lane; row < r.rows_valid; row += 32) {
          const int flat = tg.row_slot[r.row0 + row];
          const int peer = flat / tg.per_rank;
          __nv_bfloat16* dst = reinterpret_cast<__nv_bfloat16*>(tg.peer_bases[peer] +
                                                                tg.slots_offset) +
                               int64_t(flat - peer * tg.per_rank) * tg.hidden + r.col0;
          sm90::bulk_store(dst, buf + row * sm90::kScatterRowBytes, uint32_t(cols) * 2);
        }
        sm90::bulk_commit();
        sm90::bulk_wait_read<0>();
      }
    }
    const int kind = r.kind, slots = r.slots, counter = r.counter;
    __syncwarp();
    if (lane == 0) {
      for (int i = 0; i < slots; ++i) sm90::mbar_arrive(&hand.empty[(q + i) % 2]);
      trace.stamp(seq, kTrStorerReleased);
      if (kind == kStagedFc1) {
        // Rows stored by TMA are complete (wait) and ordered before the release for the FC2
        // tiles' TMA loads (fence.proxy.async); copied-out rows are ordered by the warp
        // barrier above and the release's cumulativity.
        sm90::bulk_wait<0>();
        fence_proxy_async_global();
        red_release_gpu_add_u32(&tg.fc1_done[counter], 1);
      }
      trace.stamp(seq, kTrStorerDone);
    }
    if (kind != kStagedSkip) ++seq;
    q += slots;
  }
}

}  // namespace mok
