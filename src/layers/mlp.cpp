// SwiGluMlp layer: forward and backward by hand (data flow in include/deltatron/layers/mlp.h).
#include "deltatron/layers/mlp.h"

#include "deltatron/ops/basic.h"
#include "deltatron/ops/gemm.h"
#include "deltatron/ops/layers_ops.h"

namespace dt::layers {
namespace {
enum P { kGate, kUp, kDown };
}  // namespace

std::vector<model::ParamSpec> SwiGluMlp::param_specs(const MlpConfig& c, const std::string& prefix) {
  const std::string p = prefix + ".mlp.";
  using model::InitRule;
  return {
      {p + "gate_proj.weight", Shape{c.intermediate, c.hidden}, InitRule::normal(c.init_std), 0},
      {p + "up_proj.weight", Shape{c.intermediate, c.hidden}, InitRule::normal(c.init_std), 0},
      {p + "down_proj.weight", Shape{c.hidden, c.intermediate}, InitRule::normal(c.init_std), 1},
  };
}

std::string SwiGluMlp::check_layout(const MlpConfig& c, int tp) {
  if (c.intermediate % tp)
    return fmt::format("config: the column-parallel MLP needs tp={} to divide intermediate_size={}", tp,
                       c.intermediate);
  return "";
}

SwiGluMlp::SwiGluMlp(const MlpConfig& cfg, const std::string& prefix, const RunCtx& ctx)
    : cfg_(cfg), ctx_(ctx), prefix_(prefix) {
  DT_CHECK(ctx.pg != nullptr, "SwiGluMlp {}: RunCtx.pg is null", prefix);
  tp_ = ctx.pg->dims.tp;
  sp_ = ctx.sp && tp_ > 1;
  std::string err = check_layout(cfg, tp_);
  if (!err.empty()) user_error(err);
  // gate_proj and up_proj in one allocation: one GEMM makes [g | u] (and two differentiate it).
  const std::vector<model::ParamSpec> specs = param_specs(cfg, prefix);
  params_ = model::make_params_rows({specs[kGate], specs[kUp]}, tp_, ctx.pg->coord.tp, ctx.seed, ctx.device,
                                    ctx.act_dtype, ctx.stream);
  params_.push_back(model::make_param(specs[kDown], tp_, ctx.pg->coord.tp, ctx.seed, ctx.device, ctx.act_dtype,
                                      ctx.stream));
}

void SwiGluMlp::forward(const TensorView& y, const TensorView& x) {
  const Stream s = ctx_.stream;
  const DType A = ctx_.act_dtype;
  const Device dev = ctx_.device;
  const int64_t H = cfg_.hidden, F_t = cfg_.intermediate / tp_;
  DT_CHECK(x.ndim() == 2 && x.shape[1] == H, "SwiGluMlp {}: x must be [T_local, {}], got {}", prefix_, H, x.str());
  check_shape(y, x.shape, "SwiGluMlp y [T_local, hidden]");
  const int64_t T_r = x.shape[0] * (sp_ ? tp_ : 1);

  xg_ = kept_input(lent_.take(x), x, T_r, sp_, ctx_);  // [T_r, H]
  gu_ = Tensor::empty(Shape{T_r, 2 * F_t}, A, dev);  // [T_r, 2 F_t] = [g | u]
  ops::gemm(gu_, xg_, model::rows_joined(&params_[kGate], 2).w, {false, true}, s);  // gate | up joined
  Tensor h = Tensor::empty(Shape{T_r, F_t}, A, dev);  // [T_r, F_t], not saved: backward recomputes it
  ops::swiglu_fwd(h, cols(gu_, 0, F_t), cols(gu_, F_t, F_t), s);
  if (sp_) {
    Tensor partial = Tensor::empty(Shape{T_r, H}, A, dev);  // [T_r, H] partial over TP
    ops::gemm(partial, h, params_[kDown].w(), {false, true}, s);
    ctx_.pg->tp->reduce_scatter(y, partial, dist::ReduceOp::sum, s);
  } else {
    ops::gemm(y, h, params_[kDown].w(), {false, true}, s);
    if (tp_ > 1) ctx_.pg->tp->all_reduce(y, dist::ReduceOp::sum, s);
  }
}

void SwiGluMlp::backward(const TensorView& dx, const TensorView& dy) {
  const Stream s = ctx_.stream;
  const DType A = ctx_.act_dtype;
  const Device dev = ctx_.device;
  const int64_t H = cfg_.hidden, F_t = cfg_.intermediate / tp_;
  DT_CHECK(xg_.defined(), "SwiGluMlp {}: backward without forward", prefix_);
  const int64_t T_r = xg_.shape()[0], T_in = T_r / (sp_ ? tp_ : 1);
  check_shape(dy, Shape{T_in, H}, "SwiGluMlp dy [T_local, hidden]");
  check_shape(dx, Shape{T_in, H}, "SwiGluMlp dx [T_local, hidden]");

  Tensor dyg_t;  // [T_r, H]
  TensorView dyg = dy;
  if (sp_) {
    dyg_t = Tensor::empty(Shape{T_r, H}, A, dev);
    ctx_.pg->tp->all_gather(dyg_t, dy, s);
    dyg = dyg_t;
  }
  // down_proj: dW += dy^T h, with h = silu(g) u recomputed from the saved [g | u] (one cheap
  // element-wise pass instead of keeping a third of the MLP's activations: 59 MB per layer of
  // bench-0.8b); then dh = dy W into the same buffer (stream order: the dW GEMM has read h by
  // then).                                                                  h, dh [T_r, F_t]
  Tensor dh = Tensor::empty(Shape{T_r, F_t}, A, dev);
  ops::swiglu_fwd(dh, cols(gu_, 0, F_t), cols(gu_, F_t, F_t), s);
  ops::gemm(params_[kDown].grad, dyg, dh, {true, false, 1.f, 1.f}, s);
  ops::gemm(dh, dyg, params_[kDown].w(), {}, s);
  Tensor dgu = Tensor::empty(Shape{T_r, 2 * F_t}, A, dev);  // [T_r, 2 F_t] = [dg | du]
  ops::swiglu_bwd(cols(dgu, 0, F_t), cols(dgu, F_t, F_t), dh, cols(gu_, 0, F_t), cols(gu_, F_t, F_t), s);
  // gate | up, joined: dW += dgu^T xg;  dxg = dgu W = dg Wg + du Wu.
  Tensor dxg_t;
  TensorView dxg = dx;
  if (sp_) {
    dxg_t = Tensor::empty(Shape{T_r, H}, A, dev);
    dxg = dxg_t;
  }
  const model::JoinedRows gu = model::rows_joined(&params_[kGate], 2);
  ops::gemm(gu.grad, dgu, xg_, {true, false, 1.f, 1.f}, s);
  ops::gemm(dxg, dgu, gu.w, {}, s);
  if (sp_) ctx_.pg->tp->reduce_scatter(dx, dxg, dist::ReduceOp::sum, s);
  else if (tp_ > 1) ctx_.pg->tp->all_reduce(dx, dist::ReduceOp::sum, s);
  xg_ = gu_ = Tensor();
}

}  // namespace dt::layers
