// Names of the points where a rank waits on its peers; a timeout report names the stage.
// Mirrored in mok_megatron/cuda/ops.py (Stage).
#pragma once

namespace mok {

enum Stage : int {
  kStageForwardPublished = 0,  // forward: every rank has published its tokens and routing
  kStageForwardCombined = 1,   // forward: every owner has pushed its expert outputs back
  kStageBackwardPublished = 2, // backward: every rank has published its output gradients
  kStageBackwardCombined = 3,  // backward: every owner has pushed input gradients back
  kStageTest = 4,              // a wait planted by the tests
};

__host__ __device__ inline const char* stage_name(int stage) {
  switch (stage) {
    case kStageForwardPublished: return "forward: waiting for peers to publish tokens";
    case kStageForwardCombined: return "forward: waiting for peers to push expert outputs";
    case kStageBackwardPublished: return "backward: waiting for peers to publish dY";
    case kStageBackwardCombined: return "backward: waiting for peers to push dX";
    case kStageTest: return "test: planted stall";
    default: return "unknown stage";
  }
}

}  // namespace mok
