// GatedAttention layer: forward and backward by hand (data flow in include/deltatron/layers/attention.h).
// Buffers per rank: qg [T_cp, Hq_t*2d] (per head [query | gate], the q_proj output), k [T_cp, Hkv_t*d]
// (k_proj output, the k_norm input), kvl [T_cp, 2 Hkv_t d] = [k_r | v] (this rank's rows, the CP
// all-gather unit) and kvn [T, 2 Hkv_t d] (the global keys in natural order; kvl itself when cp = 1).
#include "deltatron/layers/attention.h"

#include <cmath>

#include "deltatron/ops/basic.h"
#include "deltatron/ops/gemm.h"
#include "deltatron/ops/layers_ops.h"

namespace dt::layers {
namespace {

enum P { kQ, kK, kV, kO, kQNorm, kKNorm };
const char* kSuffixes[] = {"q_proj.weight", "k_proj.weight", "v_proj.weight",
                           "o_proj.weight", "q_norm.weight", "k_norm.weight"};

// Rows of a contiguous [T, H*2D] buffer as [T*H, 2D], then the columns [off, off + D).
TensorView per_head_half(const TensorView& qg, int64_t H, int64_t D, int64_t off) {
  return cols(qg.reshape(Shape{qg.shape[0] * H, 2 * D}), off, D);
}

}  // namespace

// Forward activations kept for backward, by index into saved_.
enum S { kXg, kQg, kKraw, kRq, kRk, kQr, kKvn, kOut, kLse, kYo, kNumSaved };

std::vector<model::ParamSpec> GatedAttention::param_specs(const AttentionConfig& c, const std::string& prefix) {
  const int64_t H = c.hidden, d = c.head_dim, q = c.num_heads * d, kv = c.num_kv_heads * d;
  const std::string p = prefix + ".self_attn.";
  using model::InitRule;
  return {
      // Rows are [query_0 | gate_0 | query_1 | gate_1 | ...] (2d per head): an even dim-0 split
      // hands every TP rank whole heads with their gates.
      {p + kSuffixes[kQ], Shape{2 * q, H}, InitRule::normal(c.init_std), 0},
      {p + kSuffixes[kK], Shape{kv, H}, InitRule::normal(c.init_std), 0},
      {p + kSuffixes[kV], Shape{kv, H}, InitRule::normal(c.init_std), 0},
      {p + kSuffixes[kO], Shape{H, q}, InitRule::normal(c.init_std), 1},
      // (1 + w) convention, zeros as HF initialises them; replicated, but each TP rank applies
      // them to its own heads only, so the gradient is a partial sum over TP.
      {p + kSuffixes[kQNorm], Shape{d}, InitRule::zeros(), -1, {}, true, true},
      {p + kSuffixes[kKNorm], Shape{d}, InitRule::zeros(), -1, {}, true, true},
  };
}

std::string GatedAttention::check_layout(const AttentionConfig& c, int tp) {
  if (c.hidden <= 0 || c.num_heads <= 0 || c.num_kv_heads <= 0 || c.head_dim <= 0)
    return fmt::format(
        "config: attention needs positive hidden_size={}, num_attention_heads={}, num_key_value_heads={}, head_dim={}",
        c.hidden, c.num_heads, c.num_kv_heads, c.head_dim);
  if (c.num_heads % c.num_kv_heads)
    return fmt::format("config: model.num_attention_heads={} is not a multiple of model.num_key_value_heads={}",
                       c.num_heads, c.num_kv_heads);
  if (c.num_heads % tp || c.num_kv_heads % tp)
    return fmt::format(
        "config: attention TP needs tp={} to divide num_attention_heads={} and num_key_value_heads={} "
        "(kv heads are not replicated)",
        tp, c.num_heads, c.num_kv_heads);
  const int64_t rd = c.rotary_dim();
  if (rd < 0 || rd % 2 || rd > c.head_dim)
    return fmt::format("config: rotary dim int(head_dim={} * partial_rotary_factor={}) = {} must be even and <= head_dim",
                       c.head_dim, c.partial_rotary_factor, rd);
  if (!(c.rope_theta > 0)) return fmt::format("config: rope_theta={} must be > 0", c.rope_theta);
  return "";
}

GatedAttention::GatedAttention(const AttentionConfig& cfg, const std::string& prefix, const RunCtx& ctx)
    : cfg_(cfg), ctx_(ctx), prefix_(prefix) {
  DT_CHECK(ctx.pg != nullptr, "GatedAttention {}: RunCtx.pg is null", prefix);
  tp_ = ctx.pg->dims.tp;
  cp_ = ctx.pg->dims.cp;
  sp_ = ctx.sp && tp_ > 1;
  std::string err = check_layout(cfg, tp_);
  if (!err.empty()) user_error(err);
  hq_t_ = cfg.num_heads / tp_;
  hkv_t_ = cfg.num_kv_heads / tp_;
  for (const model::ParamSpec& s : param_specs(cfg, prefix))
    params_.push_back(model::make_param(s, tp_, ctx.pg->coord.tp, ctx.seed, ctx.device, ctx.act_dtype, ctx.stream));
}

model::Param& GatedAttention::param(const std::string& suffix) {
  for (model::Param& p : params_)
    if (p.spec.name == prefix_ + ".self_attn." + suffix) return p;
  DT_FAIL("GatedAttention {}: no parameter '{}'", prefix_, suffix);
}

ops::AttnVarlen GatedAttention::varlen(const data::PackedSeqParams& psp) const {
  return {psp.cu_seqlens_padded_dev(), psp.cu_seqlens_dev(), psp.position_ids_local_dev(), cp_, ctx_.attn_backend,
          psp.max_seqlen()};
}

void GatedAttention::forward(const TensorView& y, const TensorView& x, const data::PackedSeqParams& psp) {
  const Stream s = ctx_.stream;
  const DType A = ctx_.act_dtype;
  const Device dev = ctx_.device;
  const int64_t H = cfg_.hidden, d = cfg_.head_dim, rd = cfg_.rotary_dim();
  const int64_t T = psp.tokens(), T_cp = psp.tokens_cp(), T_in = psp.tokens_local();
  const int64_t qw = hq_t_ * d, kvw = hkv_t_ * d;
  DT_CHECK(psp.cp() == cp_ && psp.sp() == (sp_ ? tp_ : 1),
           "GatedAttention {}: packed params built for cp {} sp {}, layer runs cp {} sp {}", prefix_, psp.cp(),
           psp.sp(), cp_, sp_ ? tp_ : 1);
  check_shape(x, Shape{T_in, H}, "GatedAttention input x [T_local, hidden]");
  check_shape(y, Shape{T_in, H}, "GatedAttention output y [T_local, hidden]");
  saved_.assign(kNumSaved, Tensor());
  const TensorView pos = psp.position_ids_local_dev();  // [T_cp] i32

  // SP: gather the token shards of the TP group.                        xg [T_cp, H]
  Tensor& xg = saved_[kXg];
  xg = kept_input(lent_.take(x), x, T_cp, sp_, ctx_);

  // Projections.                          qg [T_cp, Hq_t*2d]; k [T_cp, Hkv_t*d]; v into kvl
  Tensor& qg = saved_[kQg];
  qg = Tensor::empty(Shape{T_cp, 2 * qw}, A, dev);
  ops::gemm(qg, xg, params_[kQ].w(), {false, true}, s);
  Tensor& kraw = saved_[kKraw];
  kraw = Tensor::empty(Shape{T_cp, kvw}, A, dev);
  ops::gemm(kraw, xg, params_[kK].w(), {false, true}, s);
  Tensor kvl = Tensor::empty(Shape{T_cp, 2 * kvw}, A, dev);  // [k_r | v]
  ops::gemm(cols(kvl, kvw, kvw), xg, params_[kV].w(), {false, true}, s);

  // q_norm / k_norm over d, then partial RoPE.      q_r [T_cp, Hq_t, d]; k_r into kvl[:, :kvw]
  saved_[kRq] = Tensor::empty(Shape{T_cp * hq_t_}, DType::f32, dev);
  saved_[kRk] = Tensor::empty(Shape{T_cp * hkv_t_}, DType::f32, dev);
  Tensor& qr = saved_[kQr];
  qr = Tensor::empty(Shape{T_cp, hq_t_, d}, A, dev);
  ops::rmsnorm1p_fwd(qr.view().reshape(Shape{T_cp * hq_t_, d}), saved_[kRq], per_head_half(qg, hq_t_, d, 0),
                     params_[kQNorm].w(), cfg_.norm_eps, s);
  ops::rope_fwd(qr, qr, pos, rd, cfg_.rope_theta, s);
  Tensor kn = Tensor::empty(Shape{T_cp, hkv_t_, d}, A, dev);
  ops::rmsnorm1p_fwd(kn.view().reshape(Shape{T_cp * hkv_t_, d}), saved_[kRk], kraw.view().reshape(Shape{T_cp * hkv_t_, d}),
                     params_[kKNorm].w(), cfg_.norm_eps, s);
  ops::rope_fwd(heads(cols(kvl, 0, kvw), hkv_t_, d), kn, pos, rd, cfg_.rope_theta, s);

  // CP: every rank needs the global keys of its sequences, in natural order.   kvn [T, 2 kvw]
  Tensor& kvn = saved_[kKvn];
  if (cp_ > 1) {
    Tensor gathered = Tensor::empty(Shape{T, 2 * kvw}, A, dev);  // rank-major: row r*T_cp + l
    ctx_.pg->cp->all_gather(gathered, kvl, s);
    kvn = Tensor::empty(Shape{T, 2 * kvw}, A, dev);
    ops::gather_rows(kvn, gathered, psp.cp_idx_dev(), s);  // kvn[x] = gathered[cp_idx[x]]
  } else {
    kvn = kvl;
  }

  // Causal attention of this rank's query rows against the global keys.  o [T_cp, Hq_t, d]
  saved_[kOut] = Tensor::empty(Shape{T_cp, hq_t_, d}, A, dev);
  saved_[kLse] = Tensor::empty(Shape{T_cp, hq_t_}, DType::f32, dev);
  const float scale = float(1.0 / std::sqrt(double(d)));
  ops::attention_fwd(saved_[kOut], saved_[kLse], qr, heads(cols(kvn, 0, kvw), hkv_t_, d),
                     heads(cols(kvn, kvw, kvw), hkv_t_, d), varlen(psp), scale, s);

  // Output gate.                                                        yo [T_cp, Hq_t*d]
  Tensor& yo = saved_[kYo];
  yo = Tensor::empty(Shape{T_cp, qw}, A, dev);
  ops::sigmoid_gate_fwd(yo.view().reshape(Shape{T_cp * hq_t_, d}), saved_[kOut].view().reshape(Shape{T_cp * hq_t_, d}),
                        per_head_half(qg, hq_t_, d, d), s);

  // Row-parallel o_proj, then the TP reduction (reduce-scatter under SP).
  if (sp_) {
    Tensor partial = Tensor::empty(Shape{T_cp, H}, A, dev);
    ops::gemm(partial, yo, params_[kO].w(), {false, true}, s);
    ctx_.pg->tp->reduce_scatter(y, partial, dist::ReduceOp::sum, s);
  } else {
    ops::gemm(y, yo, params_[kO].w(), {false, true}, s);
    if (tp_ > 1) ctx_.pg->tp->all_reduce(y, dist::ReduceOp::sum, s);
  }
}

void GatedAttention::backward(const TensorView& dx, const TensorView& dy, const data::PackedSeqParams& psp) {
  const Stream s = ctx_.stream;
  const DType A = ctx_.act_dtype;
  const Device dev = ctx_.device;
  const int64_t H = cfg_.hidden, d = cfg_.head_dim, rd = cfg_.rotary_dim();
  const int64_t T = psp.tokens(), T_cp = psp.tokens_cp(), T_in = psp.tokens_local();
  const int64_t qw = hq_t_ * d, kvw = hkv_t_ * d;
  DT_CHECK(int(saved_.size()) == kNumSaved && saved_[kXg].defined(), "GatedAttention {}: backward without forward",
           prefix_);
  check_shape(dy, Shape{T_in, H}, "GatedAttention dy [T_local, hidden]");
  check_shape(dx, Shape{T_in, H}, "GatedAttention dx [T_local, hidden]");
  const TensorView pos = psp.position_ids_local_dev();

  // SP: gather dy of the TP group (the adjoint of the reduce-scatter).    dyg [T_cp, H]
  Tensor dyg_t;
  TensorView dyg = dy;
  if (sp_) {
    dyg_t = Tensor::empty(Shape{T_cp, H}, A, dev);
    ctx_.pg->tp->all_gather(dyg_t, dy, s);
    dyg = dyg_t;
  }
  // o_proj: dW += dy^T yo;  dyo = dy W.                                   dyo [T_cp, Hq_t*d]
  ops::gemm(params_[kO].grad, dyg, saved_[kYo], {true, false, 1.f, 1.f}, s);
  Tensor dyo = Tensor::empty(Shape{T_cp, qw}, A, dev);
  ops::gemm(dyo, dyg, params_[kO].w(), {}, s);

  // Gate backward: do, and d(gate) straight into the gate half of dqg.   dqg [T_cp, Hq_t*2d]
  Tensor dqg = Tensor::empty(Shape{T_cp, 2 * qw}, A, dev);
  Tensor d_o = Tensor::empty(Shape{T_cp, hq_t_, d}, A, dev);
  ops::sigmoid_gate_bwd(d_o.view().reshape(Shape{T_cp * hq_t_, d}), per_head_half(dqg, hq_t_, d, d),
                        dyo.view().reshape(Shape{T_cp * hq_t_, d}), saved_[kOut].view().reshape(Shape{T_cp * hq_t_, d}),
                        per_head_half(saved_[kQg], hq_t_, d, d), s);

  // Attention backward: dq for this rank's rows, dK/dV for the global keys.  dkvn [T, 2 kvw]
  const Tensor& kvn = saved_[kKvn];
  Tensor dq = Tensor::empty(Shape{T_cp, hq_t_, d}, A, dev);
  Tensor dkvn = Tensor::empty(Shape{T, 2 * kvw}, A, dev);
  const float scale = float(1.0 / std::sqrt(double(d)));
  ops::attention_bwd(dq, heads(cols(dkvn, 0, kvw), hkv_t_, d), heads(cols(dkvn, kvw, kvw), hkv_t_, d), d_o,
                     saved_[kQr], heads(cols(kvn, 0, kvw), hkv_t_, d), heads(cols(kvn, kvw, kvw), hkv_t_, d),
                     saved_[kOut], saved_[kLse], varlen(psp), scale, s);

  // CP: back to rank-major rows (the adjoint of the cp_idx gather is the cp_inv gather), then
  // every owner sums the contributions of all CP ranks to its rows.     dkvl [T_cp, 2 kvw]
  Tensor dkvl;
  if (cp_ > 1) {
    Tensor rank_major = Tensor::empty(Shape{T, 2 * kvw}, A, dev);
    ops::gather_rows(rank_major, dkvn, psp.cp_inv_dev(), s);
    dkvl = Tensor::empty(Shape{T_cp, 2 * kvw}, A, dev);
    ctx_.pg->cp->reduce_scatter(dkvl, rank_major, dist::ReduceOp::sum, s);
  } else {
    dkvl = dkvn;
  }

  // RoPE and norm backward into dqg's query half and dk.
  ops::rope_bwd(dq, dq, pos, rd, cfg_.rope_theta, s);
  ops::rmsnorm1p_bwd(per_head_half(dqg, hq_t_, d, 0), params_[kQNorm].grad, dq.view().reshape(Shape{T_cp * hq_t_, d}),
                     per_head_half(saved_[kQg], hq_t_, d, 0), params_[kQNorm].w(), saved_[kRq], s);
  Tensor dkn = Tensor::empty(Shape{T_cp, hkv_t_, d}, A, dev);
  ops::rope_bwd(dkn, heads(cols(dkvl, 0, kvw), hkv_t_, d), pos, rd, cfg_.rope_theta, s);
  Tensor dk = Tensor::empty(Shape{T_cp, kvw}, A, dev);
  ops::rmsnorm1p_bwd(dk.view().reshape(Shape{T_cp * hkv_t_, d}), params_[kKNorm].grad,
                     dkn.view().reshape(Shape{T_cp * hkv_t_, d}), saved_[kKraw].view().reshape(Shape{T_cp * hkv_t_, d}),
                     params_[kKNorm].w(), saved_[kRk], s);

  // Projections: dW_i += d_i^T xg;  dxg = sum_i d_i W_i.
  Tensor dxg_t;
  TensorView dxg = dx;
  if (sp_) {
    dxg_t = Tensor::empty(Shape{T_cp, H}, A, dev);
    dxg = dxg_t;
  }
  const TensorView douts[3] = {dqg, dk, cols(dkvl, kvw, kvw)};
  for (int i = kQ; i <= kV; ++i) {
    ops::gemm(params_[i].grad, douts[i], saved_[kXg], {true, false, 1.f, 1.f}, s);
    ops::gemm(dxg, douts[i], params_[i].w(), {false, false, 1.f, i ? 1.f : 0.f}, s);
  }
  if (sp_) ctx_.pg->tp->reduce_scatter(dx, dxg, dist::ReduceOp::sum, s);
  else if (tp_ > 1) ctx_.pg->tp->all_reduce(dx, dist::ReduceOp::sum, s);
  saved_.clear();
}

}  // namespace dt::layers
