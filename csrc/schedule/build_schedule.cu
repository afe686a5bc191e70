// The schedule: which rows this rank's experts compute, in one fixed order. Every owner reads
// all ranks' published routing through peer memory; for each (source rank, token, slot),
//   flat = source * max_tokens * topk + token * topk + slot,
// a slot routed to one of our experts becomes a row. Rows are ordered by expert position,
// then by flat (source rank, token, slot) - whatever the arrival timing: this is what makes
// results deterministic.
//
// A counting sort in three kernels, all on the GPU (no host sync), over tiles of
// kScheduleTileSlots consecutive flats:
//   count  each tile reads its slots' routing, keeps (position, prob) per slot and counts
//          rows per expert position (shared-memory histogram, order free);
//   scan   one block: per position, each tile's first row (exclusive scan of the counts
//          over tiles, in tile order, after the positions before it) and offsets;
//   place  each tile walks its slots in flat order, 32 per warp and the block's warps in
//          order, and gives each row its place: the tile's cursor for that position + rows
//          of it in earlier warps of the step + its rank among equal lanes (match_any).
// Stable, so the order is the one a sort of (position, flat) keys would give. The row arrays
// hold `capacity` rows (kernel.schedule_capacity of the worst case); a routing that needs more
// stops in the scan with a report naming the rows it needed (no row is ever dropped).
// Every rank reads every published expert id here, so this is where a bad id is caught without
// a host sync: count records each tile's first id outside [0, E) other than -1 (unused), and
// the scan stops every rank with a report naming the source rank, token, slot and id - the
// same report on each rank, as they all read the same routing.
#include <ATen/cuda/CUDAContext.h>
#include <torch/extension.h>

#include "common/error.cuh"
#include "config/kernel_config.cuh"
#include "ops.h"

namespace mok {
namespace {

constexpr int kWarps = kScheduleThreads / 32;
constexpr int kSteps = kScheduleTileSlots / kScheduleThreads;
static_assert(kScheduleTileSlots % kScheduleThreads == 0 && kScheduleThreads % 32 == 0,
              "a tile is whole steps of whole warps");

struct Routing {
  const int64_t* peer_bases;
  int64_t ids_offset, probs_offset, count_offset;
  int world;
  int64_t max_tokens;
  int topk, expert_begin, num_local;
  const int32_t* expert_position;  // [num_local] local expert -> position
};

constexpr int32_t kNoBadId = INT32_MAX;  // a tile's first bad flat slot, when it has none

__device__ __forceinline__ bool is_bad_id(int32_t id, int num_experts) {
  return id < -1 || id >= num_experts;
}

__global__ void schedule_count_kernel(const Routing r, int64_t n, int32_t* __restrict__ pos,
                                      float* __restrict__ prob, int32_t* __restrict__ counts,
                                      int32_t* __restrict__ first_bad) {
  extern __shared__ int32_t hist[];  // [num_local]
  __shared__ int32_t tokens_of[kMaxRanks];
  __shared__ int32_t tile_first_bad;
  for (int e = threadIdx.x; e < r.num_local; e += blockDim.x) hist[e] = 0;
  if (threadIdx.x == 0) tile_first_bad = kNoBadId;
  if (threadIdx.x < r.world) {
    tokens_of[threadIdx.x] =
        *reinterpret_cast<const int32_t*>(r.peer_bases[threadIdx.x] + r.count_offset);
  }
  __syncthreads();
  const int64_t per_rank = r.max_tokens * r.topk;
  const int num_experts = r.world * r.num_local;
  const int64_t tile0 = int64_t(blockIdx.x) * kScheduleTileSlots;
#pragma unroll 4
  for (int step = 0; step < kSteps; ++step) {
    const int64_t flat = tile0 + step * kScheduleThreads + threadIdx.x;
    if (flat >= n) break;
    const int src = static_cast<int>(flat / per_rank);
    const int64_t local = flat - src * per_rank;
    int p = -1;
    float pr = 0.f;
    if (local / r.topk < tokens_of[src]) {
      const int32_t id =
          reinterpret_cast<const int32_t*>(r.peer_bases[src] + r.ids_offset)[local];
      const int e = id - r.expert_begin;
      if (is_bad_id(id, num_experts)) atomicMin(&tile_first_bad, static_cast<int32_t>(flat));
      if (id >= 0 && e >= 0 && e < r.num_local) {
        p = r.expert_position[e];
        pr = reinterpret_cast<const float*>(r.peer_bases[src] + r.probs_offset)[local];
        atomicAdd(&hist[p], 1);
      }
    }
    pos[flat] = p;
    prob[flat] = pr;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < r.num_local; e += blockDim.x) {
    counts[int64_t(blockIdx.x) * r.num_local + e] = hist[e];
  }
  if (threadIdx.x == 0) first_bad[blockIdx.x] = tile_first_bad;
}

// The first bad id over all tiles (flat order, so every rank names the same one): report it
// and stop. Ids are published as int32, int64 ones saturated (publish.cu), so an id beyond
// int32 shows as INT32_MIN / INT32_MAX and is named as such.
__device__ void stop_on_bad_id(const Routing& r, const int32_t* __restrict__ first_bad,
                               int tiles, int rank) {
  __shared__ int32_t first;
  if (threadIdx.x == 0) first = kNoBadId;
  __syncthreads();
  int32_t mine = kNoBadId;
  for (int t = threadIdx.x; t < tiles; t += blockDim.x) mine = min(mine, first_bad[t]);
  if (mine != kNoBadId) atomicMin(&first, mine);
  __syncthreads();
  if (threadIdx.x != 0 || first == kNoBadId) return;
  const int64_t per_rank = r.max_tokens * r.topk;
  const int src = static_cast<int>(first / per_rank);
  const int64_t local = first - src * per_rank;
  const int32_t id = reinterpret_cast<const int32_t*>(r.peer_bases[src] + r.ids_offset)[local];
  const char* beyond = id == INT32_MIN ? " (an int64 id below -2^31)"
                       : id == INT32_MAX ? " (an int64 id of 2^31 - 1 or more)"
                                         : "";
  printf("mok_megatron: BAD EXPERT ID (seen by rank %d): source rank %d, token %lld, slot %d "
         "has expert id %d%s, outside [0, %d); -1 marks an unused slot\n",
         rank, src, (long long)(local / r.topk), static_cast<int>(local % r.topk), id, beyond,
         r.world * r.num_local);
  __trap();
}

// One block of kScheduleScanThreads: counts [tiles, E] -> first [tiles, E], each tile's first
// row per position, and offsets [E + 1].
__global__ void schedule_scan_kernel(const Routing r, const int32_t* __restrict__ counts,
                                     const int32_t* __restrict__ first_bad, int tiles,
                                     int num_local, int64_t capacity, int rank,
                                     int32_t* __restrict__ first,
                                     int32_t* __restrict__ offsets) {
  stop_on_bad_id(r, first_bad, tiles, rank);
  __shared__ int32_t carry;
  __shared__ int32_t warp_sums[kScheduleScanThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (int e0 = 0; e0 < num_local; e0 += blockDim.x) {
    const int e = e0 + threadIdx.x;
    int total = 0;
    if (e < num_local) {
#pragma unroll 8
      for (int t = 0; t < tiles; ++t) total += counts[int64_t(t) * num_local + e];
    }
    // Exclusive scan of the totals over this round's positions, after the rounds before.
    int incl = total;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int v = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += v;
    }
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    int before = carry;
    for (int w = 0; w < warp; ++w) before += warp_sums[w];
    before += incl - total;
    if (e < num_local) {
      offsets[e] = before;
      int run = before;
#pragma unroll 8
      for (int t = 0; t < tiles; ++t) {
        first[int64_t(t) * num_local + e] = run;
        run += counts[int64_t(t) * num_local + e];
      }
    }
    __syncthreads();
    if (threadIdx.x == blockDim.x - 1) carry = before + total;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    offsets[num_local] = carry;
    if (carry > capacity) {
      printf("mok_megatron: SCHEDULE OVERFLOW rank %d: %d rows routed to its experts, "
             "capacity %lld rows; raise kernel.schedule_capacity\n",
             rank, carry, (long long)capacity);
      __trap();
    }
  }
}

__global__ void schedule_place_kernel(const int32_t* __restrict__ pos,
                                      const float* __restrict__ prob,
                                      const int32_t* __restrict__ first, int64_t n,
                                      int num_local, int64_t capacity,
                                      int32_t* __restrict__ row_slot,
                                      float* __restrict__ row_prob) {
  extern __shared__ int32_t smem[];
  int32_t* cursor = smem;                 // [num_local] next row of each position
  int32_t* in_warp = smem + num_local;    // [kWarps][num_local] rows per warp this step
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int e = threadIdx.x; e < num_local; e += blockDim.x) {
    cursor[e] = first[int64_t(blockIdx.x) * num_local + e];
    for (int w = 0; w < kWarps; ++w) in_warp[w * num_local + e] = 0;
  }
  __syncthreads();
  const int64_t tile0 = int64_t(blockIdx.x) * kScheduleTileSlots;
  // Every step's slot is loaded up front: the steps then wait on each other only through
  // shared memory.
  int p_of[kSteps];
  float prob_of[kSteps];
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    const int64_t flat = tile0 + step * kScheduleThreads + threadIdx.x;
    p_of[step] = flat < n ? pos[flat] : -1;
    prob_of[step] = flat < n ? prob[flat] : 0.f;
  }
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    const int64_t flat = tile0 + step * kScheduleThreads + threadIdx.x;
    const int p = p_of[step];
    const unsigned same = __match_any_sync(0xffffffffu, p);
    const bool group_leader = lane == __ffs(same) - 1;
    if (p >= 0 && group_leader) in_warp[warp * num_local + p] = __popc(same);
    __syncthreads();
    if (p >= 0) {
      int dest = cursor[p] + __popc(same & ((1u << lane) - 1u));
      for (int w = 0; w < warp; ++w) dest += in_warp[w * num_local + p];
      if (dest < capacity) {  // past it the scan has already stopped the kernel sequence
        row_slot[dest] = static_cast<int32_t>(flat);
        row_prob[dest] = prob_of[step];
      }
    }
    __syncthreads();
    if (p >= 0 && group_leader) {
      atomicAdd(&cursor[p], __popc(same));
      in_warp[warp * num_local + p] = 0;
    }
    __syncthreads();
  }
}

}  // namespace

void build_schedule(const at::Tensor& peer_bases, int64_t ids_offset, int64_t probs_offset,
                    int64_t count_offset, int64_t world, int64_t max_tokens, int64_t topk,
                    int64_t expert_begin, const at::Tensor& expert_position, at::Tensor& offsets,
                    at::Tensor& row_slot, at::Tensor& row_prob) {
  MOK_HOST_CHECK(world >= 1 && world <= kMaxRanks, "EP size ", world, " outside [1, ",
                 kMaxRanks, "]");
  const int64_t num_local = expert_position.numel();
  const int64_t n = world * max_tokens * topk;
  MOK_HOST_CHECK(num_local >= 1 && num_local <= kGemmMaxExperts, "build_schedule: 1..",
                 kGemmMaxExperts, " local experts, got ", num_local);
  MOK_HOST_CHECK(n < (int64_t(1) << 31), "build_schedule: ", n,
                 " slots (EP x max_tokens x topk) exceed int32 row indices");
  const int64_t capacity = row_slot.numel();
  MOK_HOST_CHECK(offsets.numel() == num_local + 1 && capacity >= 1 && capacity <= n &&
                     row_prob.numel() == capacity,
                 "build_schedule: offsets [E + 1], row_slot and row_prob [capacity] with "
                 "capacity in [1, ", n, "]");
  const int64_t tiles = (n + kScheduleTileSlots - 1) / kScheduleTileSlots;
  auto i32 = expert_position.options().dtype(at::kInt);
  at::Tensor pos = at::empty({n}, i32);
  at::Tensor prob = at::empty({n}, expert_position.options().dtype(at::kFloat));
  at::Tensor counts = at::empty({tiles, num_local}, i32);
  at::Tensor first = at::empty({tiles, num_local}, i32);
  at::Tensor first_bad = at::empty({tiles}, i32);
  auto stream = at::cuda::getCurrentCUDAStream();
  const Routing r{peer_bases.data_ptr<int64_t>(), ids_offset, probs_offset, count_offset,
                  static_cast<int>(world), max_tokens, static_cast<int>(topk),
                  static_cast<int>(expert_begin), static_cast<int>(num_local),
                  expert_position.data_ptr<int32_t>()};
  schedule_count_kernel<<<tiles, kScheduleThreads, num_local * sizeof(int32_t), stream>>>(
      r, n, pos.data_ptr<int32_t>(), prob.data_ptr<float>(), counts.data_ptr<int32_t>(),
      first_bad.data_ptr<int32_t>());
  MOK_LAUNCH_CHECK();
  schedule_scan_kernel<<<1, kScheduleScanThreads, 0, stream>>>(
      r, counts.data_ptr<int32_t>(), first_bad.data_ptr<int32_t>(), static_cast<int>(tiles),
      static_cast<int>(num_local),
      capacity, static_cast<int>(expert_begin / num_local), first.data_ptr<int32_t>(),
      offsets.data_ptr<int32_t>());
  MOK_LAUNCH_CHECK();
  const size_t place_smem = (1 + kWarps) * num_local * sizeof(int32_t);
  schedule_place_kernel<<<tiles, kScheduleThreads, place_smem, stream>>>(
      pos.data_ptr<int32_t>(), prob.data_ptr<float>(), first.data_ptr<int32_t>(), n,
      static_cast<int>(num_local), capacity, row_slot.data_ptr<int32_t>(),
      row_prob.data_ptr<float>());
  MOK_LAUNCH_CHECK();
}

}  // namespace mok
