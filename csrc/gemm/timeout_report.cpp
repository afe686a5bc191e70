#include "gemm/timeout_report.h"

#include <cuda_runtime.h>

#include "common/error.cuh"
#include "config/kernel_config.cuh"

namespace mok {
namespace {

constexpr int kReportInts = 4;  // sm90::kReportInts
constexpr int kRecords = kReportKernels * kMaxRanks;

int* records_host() {
  static int* records = [] {
    int* p = nullptr;
    MOK_CUDA_CHECK(cudaHostAlloc(&p, kRecords * kReportInts * sizeof(int),
                                 cudaHostAllocMapped | cudaHostAllocPortable));
    for (int i = 0; i < kRecords * kReportInts; ++i) p[i] = -1;
    return p;
  }();
  return records;
}

int64_t timeout_ms[kRecords];  // of each record's last launch (host only)

}  // namespace

int* timeout_report_device(int kernel, int64_t rank, int64_t timeout_ns) {
  MOK_HOST_CHECK(kernel >= 0 && kernel < kReportKernels && rank >= 0 && rank < kMaxRanks,
                 "timeout report of kernel ", kernel, ", rank ", rank, " out of range");
  const int record = kernel * kMaxRanks + static_cast<int>(rank);
  timeout_ms[record] = timeout_ns / 1000000;
  int* d = nullptr;
  MOK_CUDA_CHECK(cudaHostGetDevicePointer(&d, records_host() + record * kReportInts, 0));
  return d;
}

std::vector<int64_t> timeout_reports() {
  const volatile int* r = records_host();
  std::vector<int64_t> out;
  for (int record = 0; record < kRecords; ++record) {
    const volatile int* rec = r + record * kReportInts;
    if (rec[0] < 0) continue;
    out.insert(out.end(), {record / kMaxRanks, record % kMaxRanks, rec[0], rec[1], rec[2],
                           rec[3], timeout_ms[record]});
  }
  return out;
}

}  // namespace mok
