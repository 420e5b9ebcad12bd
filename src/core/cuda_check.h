// Internal: CUDA-side check macros (cudart, cuBLAS/cuBLASLt, cuDNN), routed to dt::fatal,
// and DT_CUDA_LAUNCH_CHECK() for use right after a kernel launch (with DT_SYNC_CHECK=ON it
// also synchronises, so an asynchronous fault is reported at its launcher).
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "deltatron/core/check.h"
#include "deltatron/core/dtype.h"

#ifndef DT_SYNC_CHECK
#define DT_SYNC_CHECK 0
#endif

#define DT_CUDA_CHECK(call)                                                                         \
  do {                                                                                              \
    cudaError_t dt_err_ = (call);                                                                   \
    if (dt_err_ != cudaSuccess) [[unlikely]]                                                        \
      ::dt::fatal("CUDA error", #call, __func__, __FILE__, __LINE__,                                \
                  DT_FORMAT("CUDA error {} '{}'", int(dt_err_), cudaGetErrorString(dt_err_)));   \
  } while (0)

#define DT_CUDA_LAUNCH_CHECK()                                  \
  do {                                                          \
    DT_CUDA_CHECK(cudaGetLastError());                          \
    if (DT_SYNC_CHECK) DT_CUDA_CHECK(cudaDeviceSynchronize());  \
  } while (0)

#define DT_CUBLAS_CHECK(call)                                                                       \
  do {                                                                                              \
    cublasStatus_t dt_st_ = (call);                                                                 \
    if (dt_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                               \
      ::dt::fatal("cuBLAS error", #call, __func__, __FILE__, __LINE__,                              \
                  DT_FORMAT("cuBLAS status {} '{}'", int(dt_st_), cublasGetStatusString(dt_st_))); \
  } while (0)

#define DT_CUDNN_CHECK(call)                                                                        \
  do {                                                                                              \
    auto dt_st_ = (call);                                                                           \
    if (int(dt_st_) != 0) [[unlikely]]                                                              \
      ::dt::fatal("cuDNN error", #call, __func__, __FILE__, __LINE__,                               \
                  DT_FORMAT("cuDNN status {} '{}'", int(dt_st_), cudnnGetErrorString(dt_st_))); \
  } while (0)

namespace dt {
inline cudaStream_t cuda_stream(Stream s) { return static_cast<cudaStream_t>(s.handle); }
}  // namespace dt
