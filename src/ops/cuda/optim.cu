// CUDA optimizer updates (ops/optim.h): AdamW with bias correction and decoupled weight
// decay, and SGD with L2 weight decay. Layouts: p, m, v, g are contiguous f32 [n] (any shape,
// flattened). p, m, v are overwritten (=) in place; g is read only. Deterministic
// (elementwise). Arithmetic uses explicit round-to-nearest intrinsics (no FMA contraction)
// in the CPU reference's order, and sqrtf / division are IEEE-rounded (nvcc's default
// -prec-sqrt=true -prec-div=true), so the result matches src/ops/cpu/optim.cpp bit for bit.
#include <nvtx3/nvToolsExt.h>

#include "core/cuda_check.h"
#include "ops/optim_backends.h"

namespace dt::ops::cuda {
namespace {

// ---- kernels --------------------------------------------------------------------------
__global__ void adamw_kernel(float* g_p, float* g_m, float* g_v, const float* g_g, AdamWConsts c, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float r_g = __fmul_rn(c.grad_scale, g_g[i]);
    const float r_m = __fadd_rn(__fmul_rn(c.beta1, g_m[i]), __fmul_rn(c.one_minus_beta1, r_g));
    const float r_v = __fadd_rn(__fmul_rn(c.beta2, g_v[i]), __fmul_rn(__fmul_rn(c.one_minus_beta2, r_g), r_g));
    const float r_denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(r_v), c.bc2_sqrt), c.eps);
    g_p[i] = __fsub_rn(__fmul_rn(g_p[i], c.decay), __fmul_rn(c.step_size, __fdiv_rn(r_m, r_denom)));
    g_m[i] = r_m;
    g_v[i] = r_v;
  }
}

__global__ void sgd_kernel(float* g_p, const float* g_g, SgdConsts c, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float r_p = g_p[i];
    const float r_g = __fadd_rn(__fmul_rn(c.grad_scale, g_g[i]), __fmul_rn(c.weight_decay, r_p));
    g_p[i] = __fsub_rn(r_p, __fmul_rn(c.lr, r_g));
  }
}

constexpr int kThreads = 256;
unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 65536 ? (b > 0 ? b : 1) : 65536);  // grid-stride loops cover the rest
}

struct Range {  // NVTX range for the launcher's lifetime
  explicit Range(const char* name) { nvtxRangePushA(name); }
  ~Range() { nvtxRangePop(); }
};

}  // namespace

// ---- launchers (no workspace) ---------------------------------------------------------
void adamw_update(const TensorView& p, const TensorView& m, const TensorView& v, const TensorView& g,
                  const AdamWConsts& c, Stream s) {
  const int64_t n = p.numel();
  if (!n) return;
  Range r("dt::adamw_update");
  adamw_kernel<<<blocks_for(n), kThreads, 0, cuda_stream(s)>>>(p.ptr<float>(), m.ptr<float>(), v.ptr<float>(),
                                                               g.ptr<float>(), c, n);
  DT_CUDA_LAUNCH_CHECK();
}

void sgd_update(const TensorView& p, const TensorView& g, const SgdConsts& c, Stream s) {
  const int64_t n = p.numel();
  if (!n) return;
  Range r("dt::sgd_update");
  sgd_kernel<<<blocks_for(n), kThreads, 0, cuda_stream(s)>>>(p.ptr<float>(), g.ptr<float>(), c, n);
  DT_CUDA_LAUNCH_CHECK();
}

}  // namespace dt::ops::cuda
