// Turns on the tensor cores for the FP8 engine's two consumer warpgroups (an option of the
// blockwise grouped GEMM, `warpgroup_turns`, timed against the default by bench_gemm.py).
//
// By default both warpgroups wait for the same stage, issue their MMAs together and, once
// both have finished, promote their partial sums together, so the tensor cores idle through
// every promotion and loop (perf-log session 25: the stage takes ~2x its MMAs' time, the
// tensor pipe ~50% busy). With turns, consumer 1 issues a stage's MMAs once consumer 0's have
// completed and consumer 0 the next stage's once consumer 1's have: each one's promotion runs
// while the other's MMAs do. The bits are the default's (the same MMAs and promotions per
// element; only when they run changes).
// Named barrier kTurnBarrier + c is consumer c's turn: it waits there (bar.sync) and the other
// arrives (bar.arrive) when handing the turn over, 128 threads each.
#pragma once

#include "config/kernel_config.cuh"
#include "gemm/sm90/tile_epilogue.cuh"
#include "gemm/sm90/tma.cuh"

namespace mok::sm90 {

// After the staging barriers and the consumers' shared one (wgrad.cuh).
constexpr int kTurnBarrier = kStagingBarrier + kGemmConsumers + 1;
static_assert(kGemmConsumers == 2, "turns alternate between two warpgroups");

// Turns off: each warpgroup issues its MMAs as soon as its stage is full.
struct NoTurns {
  static constexpr bool kOn = false;
  int consumer;  // as WarpgroupTurns (one initializer for either)
  __device__ void start() const {}
  __device__ void wait_mine() const {}
  __device__ void pass() const {}
  __device__ void finish() const {}
};

struct WarpgroupTurns {
  static constexpr bool kOn = true;
  int consumer;

  __device__ void wait_mine() const { named_barrier_sync(kTurnBarrier + consumer, 256); }
  __device__ void pass() const { named_barrier_arrive(kTurnBarrier + (consumer ^ 1), 256); }
  // Consumer 1 hands consumer 0 the first turn; consumer 0 takes the last one consumer 1
  // hands back, so every arrival is met before the block exits. Both warpgroups must run the
  // same k-blocks in the same order between the two (a warpgroup without rows still takes its
  // turns: pass_fp8_tile).
  __device__ void start() const {
    if (consumer == 1) pass();
  }
  __device__ void finish() const {
    if (consumer == 0) wait_mine();
  }
};

}  // namespace mok::sm90
