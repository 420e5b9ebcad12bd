// CUDA Qwen3.5 RMSNorm with (1 + w) (HF Qwen3_5RMSNorm, gdn-math.md 8.2), per row over D:
//   forward:  rstd = 1 / sqrt(mean_j x_j^2 + eps);  y = x * rstd * (1 + w)            y, rstd (=)
//   backward: g = dy * (1 + w);  dx = rstd * (g - xh * mean_j(g_j xh_j))                dx (=)
//             dw += sum_rows dy * xh                                                    dw (+=)
// Layouts: x, y, dy, dx [rows, D] f32 | bf16 (any row stride, unit inner stride); w, dw [D] f32;
// rstd [rows] f32. Math fp32, rstd via 1/sqrtf (IEEE), one block of 256 threads per row.
// Determinism: the backward grid is G = min(rows, 512) blocks (fixed by rows); block b owns rows
// b, b + G, ... in order and accumulates its dw partials in a scratch row [G, D] (each thread
// owns fixed columns); a second kernel sums the G partials per column in order and adds to dw.
#include "ops/cuda/layers_common.cuh"
#include "deltatron/core/allocator.h"
#include "ops/layers_ops_backends.h"

namespace dt::ops::cuda {
namespace {

constexpr int kMaxBwdBlocks = 512;

template <typename T>
__global__ __launch_bounds__(lc::kThreads) void rmsnorm1p_fwd_kernel(T* g_y, int64_t ldy, float* g_rstd,
                                                                      const T* g_x, int64_t ldx, const float* g_w,
                                                                      int64_t R, int64_t D, float eps) {
  __shared__ float s_buf[32];
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const T* x = g_x + r * ldx;
    float ss = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float v = lc::ld(x, j);
      ss = fmaf(v, v, ss);
    }
    ss = lc::block_reduce<lc::Red::sum>(ss, s_buf);
    const float rs = 1.f / sqrtf(ss / float(D) + eps);
    if (threadIdx.x == 0) g_rstd[r] = rs;
    T* y = g_y + r * ldy;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) lc::st(y, j, lc::ld(x, j) * rs * (1.f + g_w[j]));
  }
}

template <typename T>
__global__ __launch_bounds__(lc::kThreads) void rmsnorm1p_bwd_kernel(T* g_dx, int64_t lddx, float* g_part,
                                                                      const T* g_dy, int64_t lddy, const T* g_x,
                                                                      int64_t ldx, const float* g_w,
                                                                      const float* g_rstd, int64_t R, int64_t D) {
  __shared__ float s_buf[32];
  float* part = g_part + int64_t(blockIdx.x) * D;  // zeroed by the launcher
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const T *x = g_x + r * ldx, *dy = g_dy + r * lddy;
    const float rs = g_rstd[r];
    float dot = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float xh = lc::ld(x, j) * rs, d = lc::ld(dy, j);
      dot = fmaf(d * (1.f + g_w[j]), xh, dot);
      part[j] = fmaf(d, xh, part[j]);
    }
    const float mean = lc::block_reduce<lc::Red::sum>(dot, s_buf) / float(D);
    T* dx = g_dx + r * lddx;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float xh = lc::ld(x, j) * rs, g = lc::ld(dy, j) * (1.f + g_w[j]);
      lc::st(dx, j, rs * (g - xh * mean));
    }
  }
}

// dw[j] += sum_b part[b, j], b in order.
__global__ void colsum_add_kernel(float* g_dw, const float* g_part, int nparts, int64_t D) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < D; j += int64_t(gridDim.x) * blockDim.x) {
    float acc = 0.f;
    for (int b = 0; b < nparts; ++b) acc += g_part[int64_t(b) * D + j];
    g_dw[j] += acc;
  }
}

}  // namespace

void rmsnorm1p_fwd(const TensorView& y, const TensorView& rstd, const TensorView& x, const TensorView& w, float eps,
                   Stream s) {
  lc::Nvtx nv("rmsnorm1p_fwd");
  DT_CHECK(x.dtype == y.dtype, "cuda::rmsnorm1p_fwd: x {} and y {} must share a dtype", x.str(), y.str());
  const int64_t R = x.shape[0], D = x.shape[1];
  auto st = static_cast<cudaStream_t>(s.handle);
  DT_LC_DISPATCH(x.dtype, rmsnorm1p_fwd_kernel<E><<<lc::grid_for(R), lc::kThreads, 0, st>>>(
                              y.ptr<E>(), y.stride[0], rstd.ptr<float>(), x.ptr<E>(), x.stride[0], w.ptr<float>(), R,
                              D, eps));
  DT_CUDA_LAUNCH_CHECK();
}

void rmsnorm1p_bwd(const TensorView& dx, const TensorView& dw, const TensorView& dy, const TensorView& x,
                   const TensorView& w, const TensorView& rstd, Stream s) {
  lc::Nvtx nv("rmsnorm1p_bwd");
  DT_CHECK(x.dtype == dy.dtype && x.dtype == dx.dtype, "cuda::rmsnorm1p_bwd: x {}, dy {}, dx {} must share a dtype",
           x.str(), dy.str(), dx.str());
  const int64_t R = x.shape[0], D = x.shape[1];
  auto st = static_cast<cudaStream_t>(s.handle);
  const int G = int(R < kMaxBwdBlocks ? R : kMaxBwdBlocks);
  Tensor part = Tensor::empty(Shape{int64_t(G), D}, DType::f32, x.device);  // [G, D] dw partials
  DT_CUDA_CHECK(cudaMemsetAsync(part.data(), 0, part.nbytes(), st));
  DT_LC_DISPATCH(x.dtype, rmsnorm1p_bwd_kernel<E><<<G, lc::kThreads, 0, st>>>(
                              dx.ptr<E>(), dx.stride[0], part.ptr<float>(), dy.ptr<E>(), dy.stride[0], x.ptr<E>(),
                              x.stride[0], w.ptr<float>(), rstd.ptr<float>(), R, D));
  DT_CUDA_LAUNCH_CHECK();
  colsum_add_kernel<<<lc::grid_for((D + 255) / 256, 4096), 256, 0, st>>>(dw.ptr<float>(), part.ptr<float>(), G, D);
  DT_CUDA_LAUNCH_CHECK();
}

}  // namespace dt::ops::cuda
