// CPU reference of the optimizer updates (ops/optim.h): fp32, one pass per element, in the
// operation order the CUDA kernels use (no FMA contraction: ISO C++ mode keeps
// -ffp-contract=off), so both backends give the same bits.
#include <cmath>

#include "ops/optim_backends.h"

namespace dt::ops::cpu {

void adamw_update(const TensorView& p, const TensorView& m, const TensorView& v, const TensorView& g,
                  const AdamWConsts& c, Stream) {
  float* P = p.ptr<float>();
  float* M = m.ptr<float>();
  float* V = v.ptr<float>();
  const float* G = g.ptr<float>();
  for (int64_t i = 0, n = p.numel(); i < n; ++i) {
    const float gi = c.grad_scale * G[i];
    const float mi = c.beta1 * M[i] + c.one_minus_beta1 * gi;
    const float vi = c.beta2 * V[i] + (c.one_minus_beta2 * gi) * gi;
    const float denom = std::sqrt(vi) / c.bc2_sqrt + c.eps;
    P[i] = P[i] * c.decay - c.step_size * (mi / denom);
    M[i] = mi;
    V[i] = vi;
  }
}

void sgd_update(const TensorView& p, const TensorView& g, const SgdConsts& c, Stream) {
  float* P = p.ptr<float>();
  const float* G = g.ptr<float>();
  for (int64_t i = 0, n = p.numel(); i < n; ++i) {
    const float gi = c.grad_scale * G[i] + c.weight_decay * P[i];
    P[i] = P[i] - c.lr * gi;
  }
}

}  // namespace dt::ops::cpu
