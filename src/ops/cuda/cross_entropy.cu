// CUDA vocab-parallel cross-entropy pieces (include/deltatron/ops/layers_ops.h has the protocol).
// Per row t of logits [T, V_l] f32 | bf16 (any row stride), this rank's vocab columns
// [vocab_begin, vocab_begin + V_l); targets [T] i32 (< 0: predicts nothing); vectors [T] f32:
//   ce_row_max:  m = max_j l_j                                                         m (=)
//   ce_sum_exp:  se = sum_j expf(l_j - m);  tl = l[target - vocab_begin] if owned else 0  (=)
//   ce_loss:     loss = logf(se) + m - tl, or 0 when target < 0                         (=)
//   ce_bwd:      dl_j = scale * (expf(l_j - m) / se - [j is the target]), or 0           (=)
//                (f32 logits may give bf16 dlogits: the GEMMs after it run in the activation dtype)
// One block of 256 threads per row (grid-stride over rows); reductions in a fixed order, so the
// results are deterministic. Accurate expf / logf (not the __ intrinsics).
#include <cmath>

#include "ops/cuda/layers_common.cuh"
#include "ops/layers_ops_backends.h"

namespace dt::ops::cuda {
namespace {

template <typename T>
__global__ __launch_bounds__(lc::kThreads) void ce_row_max_kernel(float* g_m, const T* g_l, int64_t ldl, int64_t T_,
                                                                   int64_t V) {
  __shared__ float s_buf[32];
  for (int64_t t = blockIdx.x; t < T_; t += gridDim.x) {
    const T* l = g_l + t * ldl;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, lc::ld(l, j));
    mx = lc::block_reduce<lc::Red::max>(mx, s_buf);
    if (threadIdx.x == 0) g_m[t] = mx;
  }
}

template <typename T>
__global__ __launch_bounds__(lc::kThreads) void ce_sum_exp_kernel(float* g_se, float* g_tl, const T* g_l,
                                                                   int64_t ldl, const float* g_m, const int32_t* g_tg,
                                                                   int64_t T_, int64_t V, int64_t vb) {
  __shared__ float s_buf[32];
  for (int64_t t = blockIdx.x; t < T_; t += gridDim.x) {
    const T* l = g_l + t * ldl;
    const float m = g_m[t];
    float acc = 0.f;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) acc += expf(lc::ld(l, j) - m);
    acc = lc::block_reduce<lc::Red::sum>(acc, s_buf);
    if (threadIdx.x == 0) {
      g_se[t] = acc;
      const int32_t tg = g_tg[t];
      const int64_t c = int64_t(tg) - vb;
      g_tl[t] = (tg >= 0 && c >= 0 && c < V) ? lc::ld(l, c) : 0.f;
    }
  }
}

__global__ void ce_loss_kernel(float* g_loss, const float* g_m, const float* g_se, const float* g_tl,
                               const int32_t* g_tg, int64_t T_) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < T_; t += int64_t(gridDim.x) * blockDim.x)
    g_loss[t] = g_tg[t] >= 0 ? logf(g_se[t]) + g_m[t] - g_tl[t] : 0.f;
}

template <typename T, typename TD>
__global__ __launch_bounds__(lc::kThreads) void ce_bwd_kernel(TD* g_d, int64_t ldd, const T* g_l, int64_t ldl,
                                                               const float* g_m, const float* g_se,
                                                               const int32_t* g_tg, int64_t T_, int64_t V, int64_t vb,
                                                               float scale) {
  for (int64_t t = blockIdx.x; t < T_; t += gridDim.x) {
    const T* l = g_l + t * ldl;
    TD* d = g_d + t * ldd;
    const int32_t tg = g_tg[t];
    if (tg < 0) {
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x) lc::st(d, j, 0.f);
      continue;
    }
    const float m = g_m[t], inv = 1.f / g_se[t];
    const int64_t c = int64_t(tg) - vb;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
      lc::st(d, j, scale * (expf(lc::ld(l, j) - m) * inv - (j == c ? 1.f : 0.f)));
  }
}

}  // namespace

void ce_row_max(const TensorView& m, const TensorView& logits, Stream s) {
  lc::Nvtx nv("ce_row_max");
  const int64_t T = logits.shape[0], V = logits.shape[1];
  auto st = static_cast<cudaStream_t>(s.handle);
  DT_LC_DISPATCH(logits.dtype, ce_row_max_kernel<E><<<lc::grid_for(T), lc::kThreads, 0, st>>>(
                                   m.ptr<float>(), logits.ptr<E>(), logits.stride[0], T, V));
  DT_CUDA_LAUNCH_CHECK();
}

void ce_sum_exp(const TensorView& se, const TensorView& tl, const TensorView& logits, const TensorView& m,
                const TensorView& targets, int64_t vocab_begin, Stream s) {
  lc::Nvtx nv("ce_sum_exp");
  const int64_t T = logits.shape[0], V = logits.shape[1];
  auto st = static_cast<cudaStream_t>(s.handle);
  DT_LC_DISPATCH(logits.dtype, ce_sum_exp_kernel<E><<<lc::grid_for(T), lc::kThreads, 0, st>>>(
                                   se.ptr<float>(), tl.ptr<float>(), logits.ptr<E>(), logits.stride[0],
                                   m.ptr<float>(), targets.ptr<int32_t>(), T, V, vocab_begin));
  DT_CUDA_LAUNCH_CHECK();
}

void ce_loss(const TensorView& loss, const TensorView& m, const TensorView& se, const TensorView& tl,
             const TensorView& targets, Stream s) {
  lc::Nvtx nv("ce_loss");
  const int64_t T = loss.numel();
  auto st = static_cast<cudaStream_t>(s.handle);
  ce_loss_kernel<<<lc::grid_for((T + 255) / 256), 256, 0, st>>>(loss.ptr<float>(), m.ptr<float>(), se.ptr<float>(),
                                                                tl.ptr<float>(), targets.ptr<int32_t>(), T);
  DT_CUDA_LAUNCH_CHECK();
}

void ce_bwd(const TensorView& dlogits, const TensorView& logits, const TensorView& m, const TensorView& se,
            const TensorView& targets, int64_t vocab_begin, float scale, Stream s) {
  lc::Nvtx nv("ce_bwd");
  DT_CHECK(dlogits.dtype == logits.dtype || logits.dtype == DType::f32,
           "cuda::ce_bwd: dlogits {} from logits {}: f32 -> f32 | bf16 or bf16 -> bf16", dlogits.str(), logits.str());
  const int64_t T = logits.shape[0], V = logits.shape[1];
  auto st = static_cast<cudaStream_t>(s.handle);
  auto launch = [&](auto* lp) {
    using L = std::remove_const_t<std::remove_pointer_t<decltype(lp)>>;
    DT_LC_DISPATCH(dlogits.dtype, ce_bwd_kernel<L, E><<<lc::grid_for(T), lc::kThreads, 0, st>>>(
                                      dlogits.ptr<E>(), dlogits.stride[0], lp, logits.stride[0], m.ptr<float>(),
                                      se.ptr<float>(), targets.ptr<int32_t>(), T, V, vocab_begin, scale));
  };
  if (logits.dtype == DType::bf16) launch(logits.ptr<__nv_bfloat16>());
  else launch(logits.ptr<float>());
  DT_CUDA_LAUNCH_CHECK();
}

}  // namespace dt::ops::cuda
