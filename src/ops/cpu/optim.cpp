// CPU reference of the optimizer updates (ops/optim.h): fp32, one pass per element, in the
// operation order the CUDA kernels use (no FMA contraction: ISO C++ mode keeps
// -ffp-contract=off), so both backends give the same bits. The optional writes (UpdateWrites)
// happen in the same pass: the compute copy through the bit functions ops::copy uses, and the
// gradient reset after the element's gradient is read.
#include <cmath>

#include "deltatron/core/numeric.h"
#include "ops/optim_backends.h"

namespace dt::ops::cpu {
namespace {
// compute[i] = cast(x), round to nearest even (ops::copy's rule); no-op without a compute copy.
void store_compute(const TensorView& c, int64_t i, float x) {
  if (!c.data) return;
  if (c.dtype == DType::f32) c.ptr<float>()[i] = x;
  else if (c.dtype == DType::bf16) c.ptr<uint16_t>()[i] = f32_to_bf16_bits(x);
  else c.ptr<uint16_t>()[i] = f32_to_f16_bits(x);
}
}  // namespace

void adamw_update(const TensorView& p, const TensorView& m, const TensorView& v, const TensorView& g,
                  const AdamWConsts& c, const UpdateWrites& w, Stream) {
  float* P = p.ptr<float>();
  float* M = m.ptr<float>();
  float* V = v.ptr<float>();
  float* G = g.ptr<float>();  // written only when w.zero_grad
  for (int64_t i = 0, n = p.numel(); i < n; ++i) {
    const float gi = c.grad_scale * G[i];
    const float mi = c.beta1 * M[i] + c.one_minus_beta1 * gi;
    const float vi = c.beta2 * V[i] + (c.one_minus_beta2 * gi) * gi;
    const float denom = std::sqrt(vi) / c.bc2_sqrt + c.eps;
    P[i] = P[i] * c.decay - c.step_size * (mi / denom);
    M[i] = mi;
    V[i] = vi;
    store_compute(w.compute, i, P[i]);
    if (w.zero_grad) G[i] = 0.f;
  }
}

void adamw_update_multi(std::span<const AdamWItem> items, std::span<const AdamWConsts> c, Stream s) {
  for (size_t i = 0; i < items.size(); ++i)
    adamw_update(items[i].p, items[i].m, items[i].v, items[i].g, c[i], items[i].w, s);
}

void sgd_update(const TensorView& p, const TensorView& g, const SgdConsts& c, const UpdateWrites& w, Stream) {
  float* P = p.ptr<float>();
  float* G = g.ptr<float>();  // written only when w.zero_grad
  for (int64_t i = 0, n = p.numel(); i < n; ++i) {
    const float gi = c.grad_scale * G[i] + c.weight_decay * P[i];
    P[i] = P[i] - c.lr * gi;
    store_compute(w.compute, i, P[i]);
    if (w.zero_grad) G[i] = 0.f;
  }
}

}  // namespace dt::ops::cpu
