// The GatedDeltaNet layer (HF Qwen3_5GatedDeltaNet semantics) on packed THD input under
// TP, SP and CP. Forward and backward by hand; no autograd.
//
// Per rank, with T the global padded token count, cp/tp/sp the layout (sp = tp with SP):
//   x  [T/(cp*sp), H] zig-zag rows ─all-gather(tp, SP)─▶ [T/cp, H]
//   ─in_proj (4 GEMMs into one buffer)─▶ [T/cp, C_tp] = [q_t | k_t | v_t | z_t | b_t | a_t]
//   ─cp2hp (cp > 1)─▶ [T, C_tp/cp] natural order, this CP rank's head slice
//   ─conv1d+SiLU on [q|k|v]─▶ l2norm(q), l2norm(k) ─ gates(a, b) ─ chunked delta rule
//   ─gated RMSNorm with z─▶ [T, Hv_l*dv] ─hp2cp─▶ [T/cp, Hv_tp*dv]
//   ─out_proj (row-parallel)─▶ [T/cp, H] partial ─reduce-scatter(tp, SP) | all-reduce(tp)─▶ y
// With RunCtx::gdn_cp_comm = all_gather (cp > 1) the CP conversions move x and y instead:
//   x ─all-gather(tp, SP)─▶ [T/cp, H] ─all-gather(cp), cp_idx gather─▶ xn [T, H] natural order
//   ─in_proj, this rank's head rows of each section (6 GEMMs)─▶ hp [T, C_l] ─ ... ─▶ yn [T, v_l]
//   ─out_proj, this rank's head columns─▶ [T, H] partial over cp ─cp_inv gather, reduce-scatter(cp)─▶
//   [T/cp, H] ─reduce-scatter(tp, SP) | all-reduce(tp)─▶ y
// The in_proj gradients then hold only this rank's head rows (the out_proj ones its head
// columns); the dp x cp sum of reduce_grads completes them, as for the CP-sliced parameters.
// Hk_l = Hk/(tp*cp) and Hv_l = Hv/(tp*cp) heads per rank inside the kernels; the kernels use
// the GLOBAL padded cu_seqlens. Parameter gradients accumulate (+=) into Param::grad; the
// caller's reduction over dp x cp (and tp for grad_sum_tp parameters) completes them.
// CP-sliced parameters (conv1d, A_log, dt_bias) get gradients only on this CP rank's slice.
#pragma once
#include <array>
#include <string>
#include <vector>

#include "deltatron/data/packed_seq.h"
#include "deltatron/dist/parallel.h"
#include "deltatron/layers/common.h"
#include "deltatron/model/param.h"
#include "deltatron/ops/cp_a2a.h"
#include "deltatron/ops/gdn.h"

namespace dt::layers {

struct GdnConfig {
  int64_t hidden = 0;
  int64_t num_k_heads = 0;  // Hk (linear_num_key_heads)
  int64_t num_v_heads = 0;  // Hv (linear_num_value_heads)
  int64_t head_k_dim = 128; // dk
  int64_t head_v_dim = 128; // dv
  int64_t conv_kernel = 4;  // W
  float norm_eps = 1e-6f;
  float init_std = 0.02f;
};

class GatedDeltaNet {
 public:
  // `prefix`: the HF layer prefix, e.g. "model.layers.0" (params are "<prefix>.linear_attn.*").
  GatedDeltaNet(const GdnConfig& cfg, const std::string& prefix, const RunCtx& ctx);

  static std::vector<model::ParamSpec> param_specs(const GdnConfig& cfg, const std::string& prefix);
  // "" when (tp, cp) fit the head counts (rule C1/C2), else the config error.
  static std::string check_layout(const GdnConfig& cfg, int tp, int cp);

  std::vector<model::Param>& params() { return params_; }
  model::Param& param(const std::string& suffix);  // e.g. "in_proj_qkv.weight"

  // x: [T/(cp*sp), H] act_dtype; y (=): same shape. Saves what backward needs.
  void forward(const TensorView& y, const TensorView& x, const data::PackedSeqParams& psp);
  // The next forward's x is this tensor, unwritten until backward: kept, not copied (LentInput).
  void lend_input(Tensor x) { lent_.lend(std::move(x)); }
  // dy: like y; dx (=): like x. Accumulates parameter gradients.
  void backward(const TensorView& dx, const TensorView& dy, const data::PackedSeqParams& psp);

 private:
  LentInput lent_;
  // Widths per rank (thd-context-parallel.md 5): *_t on the TP rank, *_l inside the kernels
  // (after cp2hp); off_* are column offsets of z, b, a in the [T, C_l] buffer.
  struct Dims {
    int64_t T, T_cp, T_in, qk_t, v_t, h_t, C_tp, qk_l, v_l, conv_l, C_l, off_z, off_b, off_a;
  };
  Dims dims(const data::PackedSeqParams& psp) const;
  // This CP rank's heads in the input projection weights: TP-local rows [row, row + n) of
  // params_[param] give the hp columns [col, col + n), for q, k, v, z, b, a in that order.
  struct HeadRows {
    int param;
    int64_t row, n, col;
  };
  std::array<HeadRows, 6> head_rows(const Dims& d) const;
  TensorView out_proj_cols(const TensorView& w) const;  // this CP rank's head columns of out_proj
  TensorView conv_weight_slice(Tensor* keep) const;  // keep: holds a CP slice's copy
  // hp -> conv output's v columns, l2norm(q, k) with their rstd, into saved_ (with_v false: q, k
  // alone, from hp's q|k columns). gates: the forward's gates, computed in the conv's launch (null
  // in the backward's recompute).
  void conv_norm(const Dims& d, const TensorView& wc, const ops::VarlenMeta& meta,
                 const ops::GdnGateFwdViews* gates = nullptr, bool with_v = true);
  // CP all_gather: a [T, H] partial sum over cp in natural token order -> this rank's zig-zag
  // rows, summed over cp and then tp (reduce-scattered over tp under SP) into out.
  void reduce_partial_to_zigzag(const TensorView& out, const TensorView& partial, const data::PackedSeqParams& psp,
                                bool sp);
  void add_conv_weight_grad(const TensorView& dwc);
  TensorView head_slice(int which) const;
  TensorView head_slice_grad(int which);

  GdnConfig cfg_;
  RunCtx ctx_;
  std::string prefix_;
  int tp_ = 1, cp_ = 1, tp_rank_ = 0, cp_rank_ = 0;
  int64_t hk_l_ = 0, hv_l_ = 0;  // heads per rank inside the kernels
  bool gather_ = false;          // cp > 1 and gdn_cp_comm = all_gather
  std::vector<model::Param> params_;
  ops::CpHeadLayout heads_;      // cp2hp column permutation (cp > 1, all_to_all), built once
  std::vector<Tensor> saved_;    // forward activations kept for backward (see gdn.cpp)
  ops::GdnChunkSaved chunk_saved_;  // the chunk kernel's intermediates (CUDA), forward -> backward
};

}  // namespace dt::layers
