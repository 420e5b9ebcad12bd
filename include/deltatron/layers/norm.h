// Qwen3.5 RMSNorm with (1 + w) as a layer (HF Qwen3_5RMSNorm, gdn-math.md 8.2): the decoder's
// input_layernorm / post_attention_layernorm and the final model.norm.
//   y = x * rstd * (1 + w),  rstd = 1 / sqrt(mean(x^2) + eps) over hidden;  w [H] zeros-init, fp32.
// Runs on the rank's local token rows (the SP shard under SP) and communicates nothing.
// Gradient reduction (thd-context-parallel.md 6): with SP each TP rank holds different tokens, so
// dw is a partial sum over TP as well as over dp x cp: the ParamSpec sets grad_sum_tp = sp. Without
// SP every TP rank holds the same tokens and computes the same dw; summing over TP would count it
// tp times, so grad_sum_tp is false. In both cases reduce_grads then sums over dp x cp.
#pragma once
#include <string>
#include <vector>

#include "deltatron/layers/common.h"
#include "deltatron/model/param.h"

namespace dt::layers {

class RmsNorm1p {
 public:
  // `name`: the full HF parameter name, e.g. "model.layers.0.input_layernorm.weight".
  RmsNorm1p(int64_t hidden, float eps, const std::string& name, const RunCtx& ctx);
  static model::ParamSpec param_spec(int64_t hidden, const std::string& name, bool sp);

  std::vector<model::Param>& params() { return params_; }
  model::Param& weight() { return params_[0]; }

  // x: [T_local, H] act_dtype; y (=): same shape. Saves a copy of x and rstd.
  void forward(const TensorView& y, const TensorView& x);
  // dy: like y; dx (=): like x. dw accumulates (+=) into weight().grad.
  void backward(const TensorView& dx, const TensorView& dy);

 private:
  int64_t hidden_;
  float eps_;
  RunCtx ctx_;
  std::vector<model::Param> params_;
  Tensor x_, rstd_;  // saved: [T_local, H] act, [T_local] f32
};

}  // namespace dt::layers
