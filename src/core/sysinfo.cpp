#include "deltatron/core/sysinfo.h"

#include <fmt/format.h>

#include "deltatron/core/check.h"
#include "deltatron/core/version.h"
#if DELTATRON_HAVE_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>
#endif

namespace dt {

int cuda_device_count() {
#if DELTATRON_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

std::string sysinfo() {
  std::string s = fmt::format("deltatron {} (git {}), host {}\n", version(), git_hash(), process_info().host);
#if DELTATRON_HAVE_CUDA
  int drv = 0, rt = 0, nccl = 0;
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rt);
  ncclGetVersion(&nccl);
  size_t lt = cublasLtGetVersion(), dnn = cudnnGetVersion();
  const std::string driver = drv > 0 ? fmt::format("{}.{}", drv / 1000, (drv % 1000) / 10) : "none";
  s += fmt::format("  CUDA driver {}, runtime {}.{}, cuBLASLt {}, cuDNN {}.{}.{}, NCCL {}.{}.{}\n", driver, rt / 1000,
                   (rt % 1000) / 10, lt, dnn / 10000, (dnn % 10000) / 100, dnn % 100, nccl / 10000,
                   (nccl % 10000) / 100, nccl % 100);
  int n = cuda_device_count();
  if (n == 0) s += "  no usable CUDA device\n";
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    cudaGetDeviceProperties(&p, i);
    s += fmt::format("  cuda:{} {} (sm_{}{}, {} SMs, {:.1f} GiB, L2 {} MiB)\n", i, p.name, p.major, p.minor,
                     p.multiProcessorCount, double(p.totalGlobalMem) / (1 << 30), p.l2CacheSize >> 20);
  }
#else
  s += "  CPU-only build (DELTATRON_CUDA=OFF)\n";
#endif
  return s;
}

}  // namespace dt
