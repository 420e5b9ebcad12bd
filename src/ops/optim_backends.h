// Internal: CPU and CUDA implementations behind include/deltatron/ops/optim.h. optim.cpp
// checks the views and folds the host-side constants into these argument structs, so both
// backends run exactly the same fp32 arithmetic. `w` is already checked: w.compute is null or a
// valid f32 / bf16 / f16 view of p's shape.
#pragma once
#include "deltatron/ops/optim.h"

namespace dt::ops {
struct AdamWConsts {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, eps;
  float decay;       // 1 - lr * weight_decay
  float step_size;   // lr / (1 - beta1^t)
  float bc2_sqrt;    // sqrt(1 - beta2^t)
  float grad_scale;
};
struct SgdConsts {
  float lr, weight_decay, grad_scale;
};
}  // namespace dt::ops

#define DT_OPTIM_DECLS                                                                                        \
  void adamw_update(const TensorView& p, const TensorView& m, const TensorView& v, const TensorView& g,      \
                    const AdamWConsts& c, const UpdateWrites& w, Stream s);                                   \
  void adamw_update_multi(std::span<const AdamWItem> items, std::span<const AdamWConsts> c, Stream s);         \
  void sgd_update(const TensorView& p, const TensorView& g, const SgdConsts& c, const UpdateWrites& w, Stream s);

namespace dt::ops::cpu {
DT_OPTIM_DECLS
}
namespace dt::ops::cuda {
DT_OPTIM_DECLS
}
