// RmsNorm1p layer (include/deltatron/layers/norm.h): rmsnorm1p_fwd/bwd on the local rows.
#include "deltatron/layers/norm.h"

#include "deltatron/ops/basic.h"
#include "deltatron/ops/layers_ops.h"

namespace dt::layers {

model::ParamSpec RmsNorm1p::param_spec(int64_t hidden, const std::string& name, bool sp) {
  // Replicated, fp32, zeros (HF stores w with y = xh * (1 + w)); a TP partial sum only under SP.
  return {name, Shape{hidden}, model::InitRule::zeros(), -1, {}, true, sp};
}

RmsNorm1p::RmsNorm1p(int64_t hidden, float eps, const std::string& name, const RunCtx& ctx)
    : hidden_(hidden), eps_(eps), ctx_(ctx) {
  DT_CHECK(ctx.pg != nullptr, "RmsNorm1p {}: RunCtx.pg is null", name);
  const bool sp = ctx.sp && ctx.pg->dims.tp > 1;
  params_.push_back(model::make_param(param_spec(hidden, name, sp), ctx.pg->dims.tp, ctx.pg->coord.tp, ctx.seed,
                                      ctx.device, ctx.act_dtype, ctx.stream));
}

void RmsNorm1p::forward(const TensorView& y, const TensorView& x) {
  DT_CHECK(x.ndim() == 2 && x.shape[1] == hidden_, "RmsNorm1p {}: x must be [T_local, {}], got {}",
           params_[0].spec.name, hidden_, x.str());
  check_shape(y, x.shape, "RmsNorm1p y [T_local, hidden]");
  x_ = Tensor::empty(x.shape, x.dtype, x.device);  // [T_local, H]
  ops::copy(x_, x, ctx_.stream);
  rstd_ = Tensor::empty(Shape{x.shape[0]}, DType::f32, x.device);  // [T_local]
  ops::rmsnorm1p_fwd(y, rstd_, x_, params_[0].master, eps_, ctx_.stream);
}

void RmsNorm1p::backward(const TensorView& dx, const TensorView& dy) {
  DT_CHECK(x_.defined(), "RmsNorm1p {}: backward without forward", params_[0].spec.name);
  check_shape(dy, x_.shape(), "RmsNorm1p dy [T_local, hidden]");
  check_shape(dx, x_.shape(), "RmsNorm1p dx [T_local, hidden]");
  ops::rmsnorm1p_bwd(dx, params_[0].grad, dy, x_, params_[0].master, rstd_, ctx_.stream);
  x_ = Tensor();
  rstd_ = Tensor();
}

}  // namespace dt::layers
