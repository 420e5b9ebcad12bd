// SwiGLU MLP (HF Qwen3_5MLP): y = down_proj(silu(gate_proj(x)) * up_proj(x)), bias-free.
// gate_proj, up_proj [F, H] are column-parallel (TP rank t owns rows [t F/tp, (t+1) F/tp));
// down_proj [H, F] is row-parallel (columns of the same range). Per rank (F_t = F/tp):
//   x [T_local, H] ─all-gather(tp, SP)─▶ xg [T_r, H] ─2 GEMMs─▶ gu [T_r, 2 F_t] = [g | u]
//   ─swiglu─▶ h [T_r, F_t] ─down GEMM─▶ [T_r, H] partial ─reduce-scatter(tp, SP) | all-reduce(tp)─▶ y
// with T_r = T_local * tp under SP, else T_r = T_local (the rows are replicated over TP). The MLP
// is per token: CP only changes which tokens a rank holds. Backward mirrors it (all-gather of dy
// under SP; reduce-scatter / all-reduce of dx). Weight gradients accumulate (+=) and are partial
// sums over dp x cp only (TP shards are disjoint).
#pragma once
#include <string>
#include <vector>

#include "deltatron/layers/common.h"
#include "deltatron/model/param.h"

namespace dt::layers {

struct MlpConfig {
  int64_t hidden = 0;
  int64_t intermediate = 0;  // F (intermediate_size)
  float init_std = 0.02f;
};

class SwiGluMlp {
 public:
  // `prefix`: the HF layer prefix, e.g. "model.layers.0" (params "<prefix>.mlp.*").
  SwiGluMlp(const MlpConfig& cfg, const std::string& prefix, const RunCtx& ctx);
  static std::vector<model::ParamSpec> param_specs(const MlpConfig& cfg, const std::string& prefix);
  // "" when tp divides intermediate_size, else the config error.
  static std::string check_layout(const MlpConfig& cfg, int tp);

  std::vector<model::Param>& params() { return params_; }

  // x: [T_local, H] act_dtype; y (=): same shape.
  void forward(const TensorView& y, const TensorView& x);
  // The next forward's x is this tensor, unwritten until backward: kept, not copied (LentInput).
  void lend_input(Tensor x) { lent_.lend(std::move(x)); }
  // dy: like y; dx (=): like x. Accumulates the three weight gradients.
  void backward(const TensorView& dx, const TensorView& dy);

 private:
  LentInput lent_;
  MlpConfig cfg_;
  RunCtx ctx_;
  std::string prefix_;
  int tp_ = 1;
  bool sp_ = false;
  std::vector<model::Param> params_;  // gate_proj, up_proj, down_proj
  Tensor xg_, gu_;                    // saved: [T_r, H], [T_r, 2 F_t] (h is recomputed from gu_)
};

}  // namespace dt::layers
