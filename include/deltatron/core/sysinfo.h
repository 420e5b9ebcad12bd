// What this process runs on: versions and devices, for the startup banner.
#pragma once
#include <string>

namespace dt {
// Multi-line description of this process: version, host, CUDA driver/runtime, cuBLAS,
// cuDNN, NCCL versions and the visible GPUs ("CPU-only build" without CUDA).
std::string sysinfo();
// Number of usable CUDA devices (0 without CUDA or without a driver).
int cuda_device_count();
}  // namespace dt
