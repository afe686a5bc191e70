// Where a bounded wait inside a persistent kernel gave up: {role, block, tile, stage} in
// mapped pinned host memory, written by the kernel just before it traps, so the host can
// still read it after the trap has killed the CUDA context. One record per (kernel, EP rank):
// the kernel never needs to know its rank (ranks emulated on one GPU each get their own), and
// the host names both. Roles: sm90::WaitRole.
#pragma once

#include <cstdint>
#include <vector>

namespace mok {

enum ReportKernel : int {
  kReportGroupedGemm = 0,
  kReportForwardMegakernel = 1,
  kReportBackwardMegakernel = 2,
  kReportKernels
};

// The record a launch of `kernel` by EP rank `rank` traps into; remembers the launch's
// timeout for the report.
int* timeout_report_device(int kernel, int64_t rank, int64_t timeout_ns);
// Every record written so far: {kernel, rank, role, block, tile, stage, timeout_ms} each.
std::vector<int64_t> timeout_reports();

}  // namespace mok
