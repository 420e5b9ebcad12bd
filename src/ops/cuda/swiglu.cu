// CUDA SwiGLU, elementwise over [T, F] views (any row stride, unit inner stride; g and u may be
// the two halves of one [T, 2F] buffer), f32 | bf16 with fp32 math:
//   y = silu(g) * u                                                                  y (=)
//   sg = sigmoid(g);  du = dy * g * sg;  dg = dy * u * sg * (1 + g (1 - sg))         dg, du (=)
// sigmoid = 1 / (1 + expf(-g)) (IEEE division, accurate expf). Deterministic (no reductions).
#include "ops/cuda/layers_common.cuh"
#include "ops/layers_ops_backends.h"

namespace dt::ops::cuda {
namespace {

__device__ __forceinline__ float sigm(float v) { return 1.f / (1.f + expf(-v)); }

template <typename T>
__global__ void swiglu_fwd_kernel(T* g_y, int64_t ldy, const T* g_g, int64_t ldg, const T* g_u, int64_t ldu,
                                  int64_t T_, int64_t F) {
  const int64_t n = T_ * F;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / F, j = i - t * F;
    const float g = lc::ld(g_g, t * ldg + j), u = lc::ld(g_u, t * ldu + j);
    lc::st(g_y, t * ldy + j, g * sigm(g) * u);
  }
}

template <typename T>
__global__ void swiglu_bwd_kernel(T* g_dg, int64_t lddg, T* g_du, int64_t lddu, const T* g_dy, int64_t lddy,
                                  const T* g_g, int64_t ldg, const T* g_u, int64_t ldu, int64_t T_, int64_t F) {
  const int64_t n = T_ * F;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / F, j = i - t * F;
    const float g = lc::ld(g_g, t * ldg + j), u = lc::ld(g_u, t * ldu + j), d = lc::ld(g_dy, t * lddy + j);
    const float sg = sigm(g);
    lc::st(g_du, t * lddu + j, d * g * sg);
    lc::st(g_dg, t * lddg + j, d * u * sg * (1.f + g * (1.f - sg)));
  }
}

unsigned blocks(int64_t n) { return lc::grid_for((n + lc::kThreads - 1) / lc::kThreads, 65535 * 16); }

}  // namespace

void swiglu_fwd(const TensorView& y, const TensorView& g, const TensorView& u, Stream s) {
  lc::Nvtx nv("swiglu_fwd");
  DT_CHECK(g.dtype == u.dtype && g.dtype == y.dtype, "cuda::swiglu_fwd: y {}, g {}, u {} must share a dtype", y.str(),
           g.str(), u.str());
  const int64_t T = g.shape[0], F = g.shape[1];
  auto st = static_cast<cudaStream_t>(s.handle);
  DT_LC_DISPATCH(g.dtype, swiglu_fwd_kernel<E><<<blocks(T * F), lc::kThreads, 0, st>>>(
                              y.ptr<E>(), y.stride[0], g.ptr<E>(), g.stride[0], u.ptr<E>(), u.stride[0], T, F));
  DT_CUDA_LAUNCH_CHECK();
}

void swiglu_bwd(const TensorView& dg, const TensorView& du, const TensorView& dy, const TensorView& g,
                const TensorView& u, Stream s) {
  lc::Nvtx nv("swiglu_bwd");
  for (const TensorView* v : {&dg, &du, &dy, &u})
    DT_CHECK(v->dtype == g.dtype, "cuda::swiglu_bwd: {} must have the dtype of g {}", v->str(), g.str());
  const int64_t T = g.shape[0], F = g.shape[1];
  auto st = static_cast<cudaStream_t>(s.handle);
  DT_LC_DISPATCH(g.dtype, swiglu_bwd_kernel<E><<<blocks(T * F), lc::kThreads, 0, st>>>(
                              dg.ptr<E>(), dg.stride[0], du.ptr<E>(), du.stride[0], dy.ptr<E>(), dy.stride[0],
                              g.ptr<E>(), g.stride[0], u.ptr<E>(), u.stride[0], T, F));
  DT_CUDA_LAUNCH_CHECK();
}

}  // namespace dt::ops::cuda
