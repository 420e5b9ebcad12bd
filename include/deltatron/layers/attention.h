// The gated attention layer (HF Qwen3_5Attention semantics) on packed THD input under TP, SP and
// CP. Forward and backward by hand; no autograd. Per rank (T global padded tokens, T_cp = T/cp
// zig-zag rows, Hq_t = Hq/tp and Hkv_t = Hkv/tp heads, d = head_dim, sp = tp with SP else 1):
//   x [T/(cp*sp), H] ─all-gather(tp, SP)─▶ xg [T_cp, H]
//   ─q_proj─▶ qg [T_cp, Hq_t, 2d] = per head [query | gate]     ─k_proj, v_proj─▶ k, v [T_cp, Hkv_t*d]
//   query, k ─rmsnorm1p over d (q_norm, k_norm: y = x rstd (1 + w))─▶ ─partial RoPE (positions restart
//   at 0 in every sequence: position_ids_local)─▶ q_r [T_cp, Hq_t, d], k_r
//   CP: [k_r | v] ─all-gather(cp)─▶ rank-major [T, 2 Hkv_t d] ─gather rows by cp_idx─▶ natural order
//   ─causal softmax attention per sequence (scale d^-1/2, GQA: q head h uses kv head h/(Hq/Hkv)); each
//   rank's query rows attend the GLOBAL keys up to their global position─▶ o [T_cp, Hq_t, d]
//   ─o * sigmoid(gate)─▶ yo [T_cp, Hq_t*d] ─o_proj (row-parallel)─▶ partial [T_cp, H]
//   ─reduce-scatter(tp, SP) | all-reduce(tp)─▶ y
// Backward mirrors it; dK/dV of the global keys go back to their owners by a gather with cp_inv and
// a SUM reduce-scatter over cp. Pad rows (position >= actual length) attend nothing: their output
// is 0 before o_proj and they pass no gradient.
// TP: q_proj rows are split in blocks of whole heads (each head's [query | gate] rows stay
// together), k_proj/v_proj rows per kv head (Hkv % tp == 0: no kv-head replication), o_proj columns.
// q_norm/k_norm [d] are replicated fp32 weights applied to this rank's heads only: grad_sum_tp.
// Parameter gradients accumulate (+=); model::reduce_grads completes them (tp for the norms,
// then dp x cp for all).
// CPU backend only for now: the attention ops have no CUDA kernels yet (ops/attention.h).
#pragma once
#include <string>
#include <vector>

#include "deltatron/data/packed_seq.h"
#include "deltatron/layers/common.h"
#include "deltatron/model/param.h"
#include "deltatron/ops/attention.h"

namespace dt::layers {

struct AttentionConfig {
  int64_t hidden = 0;
  int64_t num_heads = 0;            // Hq (num_attention_heads)
  int64_t num_kv_heads = 0;         // Hkv (num_key_value_heads)
  int64_t head_dim = 256;           // d
  double partial_rotary_factor = 0.25;
  double rope_theta = 1e7;
  float norm_eps = 1e-6f;
  float init_std = 0.02f;
  // HF: int(head_dim * partial_rotary_factor).
  int64_t rotary_dim() const { return int64_t(double(head_dim) * partial_rotary_factor); }
};

class GatedAttention {
 public:
  // `prefix`: the HF layer prefix, e.g. "model.layers.3" (params "<prefix>.self_attn.*").
  GatedAttention(const AttentionConfig& cfg, const std::string& prefix, const RunCtx& ctx);

  static std::vector<model::ParamSpec> param_specs(const AttentionConfig& cfg, const std::string& prefix);
  // "" when the config and tp fit (head counts, GQA, rotary dim), else the config error.
  static std::string check_layout(const AttentionConfig& cfg, int tp);

  std::vector<model::Param>& params() { return params_; }
  model::Param& param(const std::string& suffix);  // e.g. "q_norm.weight"

  // x: [T/(cp*sp), H] f32; y (=): same shape. Saves what backward needs.
  void forward(const TensorView& y, const TensorView& x, const data::PackedSeqParams& psp);
  // The next forward's x is this tensor, unwritten until backward: kept, not copied (LentInput).
  void lend_input(Tensor x) { lent_.lend(std::move(x)); }
  // dy: like y; dx (=): like x. Accumulates parameter gradients.
  void backward(const TensorView& dx, const TensorView& dy, const data::PackedSeqParams& psp);

 private:
  LentInput lent_;
  ops::AttnVarlen varlen(const data::PackedSeqParams& psp) const;

  AttentionConfig cfg_;
  RunCtx ctx_;
  std::string prefix_;
  int tp_ = 1, cp_ = 1;
  bool sp_ = false;
  int64_t hq_t_ = 0, hkv_t_ = 0;  // heads on this TP rank
  std::vector<model::Param> params_;
  std::vector<Tensor> saved_;     // forward activations kept for backward (see attention.cpp)
};

}  // namespace dt::layers
