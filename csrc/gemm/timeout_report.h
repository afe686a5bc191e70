// Where a bounded wait inside a persistent kernel gave up: {role, block, tile, stage} in
// mapped pinned host memory, written by the kernel just before it traps, so the host can
// still read it after the trap has killed the CUDA context. Roles: sm90::WaitRole.
#pragma once

#include <cstdint>
#include <vector>

namespace mok {

int* timeout_report_device();
// The last report, or -1s when no wait has timed out in this process.
std::vector<int64_t> timeout_report();

}  // namespace mok
