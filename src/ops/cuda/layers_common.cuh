// Internal: helpers shared by the dense-layer kernel families (rmsnorm1p, swiglu, embedding,
// cross_entropy): fp32 load/store of f32 | bf16 elements, a fixed-order block reduction, the
// dtype switch of the launchers. Anonymous namespace: each .cu has its own copy (no -rdc).
// Reductions use a butterfly within each warp and then the warp sums in index order: the same
// bits on every run, independent of timing.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <cstdint>

#include "core/cuda_check.h"
#include "deltatron/core/tensor.h"

namespace dt::ops::cuda {
namespace {
namespace lc {

struct Nvtx {
  explicit Nvtx(const char* name) { nvtxRangePushA(name); }
  ~Nvtx() { nvtxRangePop(); }
};

constexpr int kThreads = 256;

__device__ __forceinline__ float ld(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ld(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

enum class Red { sum, max };
// Block-wide reduction of one value per thread (blockDim.x == kThreads); every thread gets
// the result. s_buf: 32 floats of shared memory. Fixed order.
template <Red R>
__device__ __forceinline__ float block_reduce(float v, float* s_buf) {
  auto op = [](float a, float b) { return R == Red::sum ? a + b : fmaxf(a, b); };
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();  // s_buf may still be read by a previous call
  if (lane == 0) s_buf[warp] = v;
  __syncthreads();
  float r = s_buf[0];
  for (int w = 1; w < nw; ++w) r = op(r, s_buf[w]);
  return r;
}

inline unsigned grid_for(int64_t n, int64_t cap = 65535) { return unsigned(n < 1 ? 1 : (n < cap ? n : cap)); }

}  // namespace lc
}  // namespace
}  // namespace dt::ops::cuda

// Calls body with E = float or __nv_bfloat16 according to `dtype` (f32 | bf16; checked upstream).
#define DT_LC_DISPATCH(dtype, ...)                \
  do {                                            \
    if ((dtype) == ::dt::DType::bf16) {           \
      using E = __nv_bfloat16;                    \
      __VA_ARGS__;                                \
    } else {                                      \
      using E = float;                            \
      __VA_ARGS__;                                \
    }                                             \
  } while (0)
