// Optimizer update ops: one fused elementwise pass per parameter shard. Each dispatches on
// the device of its views to the CPU reference (src/ops/cpu/optim.cpp) or the CUDA kernels
// (src/ops/cuda/optim.cu). Every view is f32 and contiguous, of one shape and one device:
// the fp32 master weights, the fp32 gradient and the fp32 optimizer state (mixed precision
// keeps all of these in fp32).
// Deterministic: elementwise, no reductions; CPU and CUDA run the same fp32 operations in the
// same order without FMA contraction, so they agree to the last bit or nearly so.
// `p`, `m`, `v` are updated in place (=); `g` is read only, unless `zero_grad` is set.
//
// The rest of the optimizer phase can ride in the same pass (UpdateWrites): the compute copy
// of the weights (compute = cast(updated p), round to nearest even, the bits ops::copy gives)
// and the gradient reset (g = 0 after it is read, ready for the next accumulation). One pass
// moves each byte once instead of three launches re-reading p and g.
#pragma once
#include <cstdint>
#include <span>

#include "deltatron/core/tensor.h"

namespace dt::ops {

// Optional writes of the update ops, beyond p (and m, v).
struct UpdateWrites {
  TensorView compute;      // none when data is null; else bf16, f16 or f32, p's shape, contiguous, same
                           // device, not overlapping p, m, v or g: = cast(updated p)
  bool zero_grad = false;  // g = 0 after it is read (g is then written, no longer read only)
};

struct AdamWArgs {
  float lr = 0.f;
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.f;  // decoupled (AdamW): p *= 1 - lr * weight_decay, before the Adam step
  int64_t step = 1;          // 1-based update count t: bias corrections 1 - beta1^t, 1 - beta2^t
  float grad_scale = 1.f;    // multiplies g first (the global-norm clip coefficient)
};
// With g' = grad_scale * g:
//   m = beta1 m + (1 - beta1) g';  v = beta2 v + (1 - beta2) g'^2
//   p = p (1 - lr wd) - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// The bias-correction factors are computed once on the host in double.
void adamw_update(const TensorView& p, const TensorView& m, const TensorView& v, const TensorView& g,
                  const AdamWArgs& a, Stream s = {});
// The same update, plus the writes `w` in the same pass (p, m, v get the same bits).
void adamw_update(const TensorView& p, const TensorView& m, const TensorView& v, const TensorView& g,
                  const AdamWArgs& a, const UpdateWrites& w, Stream s = {});

// One AdamW step over many parameters: the same bits as adamw_update(item.p, item.m, item.v,
// item.g, a with weight_decay = item.weight_decay, item.w) on each item in turn (a.weight_decay
// is not used). Every item is checked as adamw_update checks its views; all on one device. CUDA:
// up to 48 items per launch (a few launches for a whole model instead of one per parameter,
// whose fixed cost dominates the small ones); CPU: adamw_update per item.
struct AdamWItem {
  TensorView p, m, v, g;
  UpdateWrites w;
  float weight_decay = 0.f;
};
void adamw_update_multi(std::span<const AdamWItem> items, const AdamWArgs& a, Stream s = {});

struct SgdArgs {
  float lr = 0.f;
  float weight_decay = 0.f;  // L2: g' += weight_decay * p
  float grad_scale = 1.f;
};
// p = p - lr * (grad_scale * g + weight_decay * p)
void sgd_update(const TensorView& p, const TensorView& g, const SgdArgs& a, Stream s = {});
void sgd_update(const TensorView& p, const TensorView& g, const SgdArgs& a, const UpdateWrites& w, Stream s = {});

}  // namespace dt::ops
