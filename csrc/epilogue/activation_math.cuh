// Activation math shared by the elementwise epilogue kernels and the fused GEMM epilogue.
#pragma once

namespace mok {

// Mirrored in mok_megatron/cuda/ops.py (ACTIVATION_IDS).
enum ActivationId : int { kSwiglu = 0, kGeglu = 1, kSilu = 2, kGelu = 3, kRelu = 4, kSquaredRelu = 5 };

__host__ __device__ constexpr bool is_gated(int act) { return act == kSwiglu || act == kGeglu; }

struct ActValue {
  float f;   // act(x)
  float df;  // act'(x)
};

// The SiLU's sigmoid, 1 / (1 + exp(-x)), in two MUFU ops. exp(-x) is the instruction __expf(-x)
// runs (ex2.approx of x * -log2 e) without its fix-up for results below 2^-126, which are
// flushed to 0 instead: they only ever meet 1 + exp(-x), where they round away (same bits,
// three instructions fewer on the chain). The reciprocal is rcp.approx (~1 ulp; the IEEE
// division's refinement and slow-path branch were a third of the FC1 epilogue's
// instructions; results are rounded to bf16); 1 + exp(-x) = inf gives 0, the limit.
__device__ __forceinline__ float sigmoid_approx(float x) {
  float e, s;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x * -1.4426950408889634f));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(s) : "f"(1.f + e));
  return s;
}

template <int kAct>
__device__ __forceinline__ ActValue act_eval(float x) {
  if constexpr (kAct == kSwiglu || kAct == kSilu) {
    const float s = sigmoid_approx(x);
    return {x * s, s * (1.f + x * (1.f - s))};
  } else if constexpr (kAct == kGeglu || kAct == kGelu) {
    const float cdf = 0.5f * (1.f + erff(x * 0.70710678118654752f));
    return {x * cdf, cdf + x * __expf(-0.5f * x * x) * 0.39894228040143268f};
  } else if constexpr (kAct == kRelu) {
    return {fmaxf(x, 0.f), x > 0.f ? 1.f : 0.f};
  } else {
    const float r = fmaxf(x, 0.f);
    return {r * r, 2.f * r};
  }
}

// Host side: runs __VA_ARGS__ with `constexpr int KACT` set to the activation id; an id
// outside ActivationId is an error (needs common/error.cuh).
#define MOK_DISPATCH_ACTIVATION(act, KACT, ...)                                         \
  switch (act) {                                                                        \
    case kSwiglu: { constexpr int KACT = kSwiglu; __VA_ARGS__; break; }                 \
    case kGeglu: { constexpr int KACT = kGeglu; __VA_ARGS__; break; }                   \
    case kSilu: { constexpr int KACT = kSilu; __VA_ARGS__; break; }                     \
    case kGelu: { constexpr int KACT = kGelu; __VA_ARGS__; break; }                     \
    case kRelu: { constexpr int KACT = kRelu; __VA_ARGS__; break; }                     \
    case kSquaredRelu: { constexpr int KACT = kSquaredRelu; __VA_ARGS__; break; }       \
    default: MOK_HOST_CHECK(false, "unknown activation id ", act);                      \
  }

}  // namespace mok
