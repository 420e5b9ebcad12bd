// GatedDeltaNet layer: forward and backward by hand (see include/deltatron/layers/gdn.h for the
// data flow). Column layout of the projection output on a TP rank, [q | k | v | z | b | a]
// (thd-context-parallel.md 5); after cp2hp the same sections hold this CP rank's heads.
// Under gdn.cp_comm = all_gather the hp layout is computed directly (head_rows).
#include "deltatron/layers/gdn.h"

#include <cmath>

#include "deltatron/ops/attention.h"
#include "deltatron/ops/basic.h"
#include "deltatron/ops/gdn.h"
#include "deltatron/ops/gemm.h"

namespace dt::layers {
namespace {

const char* kSuffixes[] = {"in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight",
                           "conv1d.weight",      "dt_bias",          "A_log",            "norm.weight",
                           "out_proj.weight"};
enum P { kQkv, kZ, kB, kA, kConv, kDtBias, kALog, kNorm, kOut };
constexpr size_t kInProjs = kConv;  // params_[0, 4): in_proj_qkv, _z, _b, _a, in one allocation

// Rows [r0, r0 + n) of a row-major 2-D view.
TensorView rows(const TensorView& v, int64_t r0, int64_t n) { return v.slice(0, r0, r0 + n); }

}  // namespace

// Forward activations kept for backward, by index into saved_. Under all_gather, kXg is the
// input in natural order [T, H], kYo the normed output yn [T, v_l] and kWp this rank's head rows
// of the input projection weights packed in hp's column order [C_l, H]. kC is the conv output's
// v columns [T, v_l] (the chunk rule reads them as [T, Hv_l, dv]); q and k leave the conv already
// L2-normalised (kQn, kKn [T, Hk_l, dk], rstd kRq, kRk), so the conv output's q|k columns are
// never stored; the backward writes dv into the conv gradient's v columns, and the gated RMSNorm
// reads z in place from hp (no contiguous copies of q, k, v, z).
enum S { kXg, kHp, kC, kQn, kKn, kRq, kRk, kG, kBeta, kO, kRn, kYo, kWp, kNumSaved };
// What conv_norm makes from hp alone; under gdn.recompute_elementwise the forward drops them
// and the backward makes them again (~100 MB per layer of the bench model at 8192 tokens), all
// but v (kC) under gdn.recompute_v=false: the backward then rebuilds q, k from hp's q|k columns
// only, half the bytes of the full rebuild.
constexpr S kConvNorm[] = {kC, kQn, kKn, kRq, kRk};

std::vector<model::ParamSpec> GatedDeltaNet::param_specs(const GdnConfig& c, const std::string& prefix) {
  const int64_t H = c.hidden, qk = c.num_k_heads * c.head_k_dim, v = c.num_v_heads * c.head_v_dim;
  const int64_t Hv = c.num_v_heads, conv = 2 * qk + v;
  const std::string p = prefix + ".linear_attn.";
  using model::InitRule;
  const float conv_bound = 1.f / std::sqrt(float(c.conv_kernel));  // PyTorch's Conv1d default bound
  return {
      {p + kSuffixes[kQkv], Shape{conv, H}, InitRule::normal(c.init_std), 0, {qk, qk, v}},
      {p + kSuffixes[kZ], Shape{v, H}, InitRule::normal(c.init_std), 0},
      {p + kSuffixes[kB], Shape{Hv, H}, InitRule::normal(c.init_std), 0},
      {p + kSuffixes[kA], Shape{Hv, H}, InitRule::normal(c.init_std), 0},
      {p + kSuffixes[kConv], Shape{conv, 1, c.conv_kernel}, InitRule::uniform(-conv_bound, conv_bound), 0, {qk, qk, v},
       true},
      {p + kSuffixes[kDtBias], Shape{Hv}, InitRule::ones(), 0, {}, true},
      {p + kSuffixes[kALog], Shape{Hv}, InitRule::log_uniform(1.f, 16.f), 0, {}, true},
      // Shared by every head and replicated: each rank sees only its heads, so the gradient
      // is a partial sum over TP too (thd-context-parallel.md 6).
      {p + kSuffixes[kNorm], Shape{c.head_v_dim}, InitRule::ones(), -1, {}, true, true},
      {p + kSuffixes[kOut], Shape{H, v}, InitRule::normal(c.init_std), 1},
  };
}

std::string GatedDeltaNet::check_layout(const GdnConfig& c, int tp, int cp) {
  if (c.num_v_heads % c.num_k_heads)
    return fmt::format("config: model.linear_num_value_heads={} is not a multiple of model.linear_num_key_heads={}",
                       c.num_v_heads, c.num_k_heads);
  if (c.num_k_heads % (tp * cp) || c.num_v_heads % (tp * cp))
    return fmt::format(
        "config: GDN head-parallel CP needs tp*cp={} to divide linear_num_key_heads={} and linear_num_value_heads={}",
        tp * cp, c.num_k_heads, c.num_v_heads);
  return "";
}

GatedDeltaNet::GatedDeltaNet(const GdnConfig& cfg, const std::string& prefix, const RunCtx& ctx)
    : cfg_(cfg), ctx_(ctx), prefix_(prefix) {
  DT_CHECK(ctx.pg != nullptr, "GatedDeltaNet {}: RunCtx.pg is null", prefix);
  tp_ = ctx.pg->dims.tp;
  cp_ = ctx.pg->dims.cp;
  tp_rank_ = ctx.pg->coord.tp;
  cp_rank_ = ctx.pg->coord.cp;
  std::string err = check_layout(cfg, tp_, cp_);
  if (!err.empty()) user_error(err);
  hk_l_ = cfg.num_k_heads / (tp_ * cp_);
  hv_l_ = cfg.num_v_heads / (tp_ * cp_);
  // in_proj_qkv, _z, _b and _a in one allocation: one GEMM makes (and two differentiate) all
  // four projections (b and a alone are Hv rows: ~15 us of GEMM each for ~1 us of work).
  const std::vector<model::ParamSpec> specs = param_specs(cfg, prefix);
  params_ = model::make_params_rows({specs.begin(), specs.begin() + kInProjs}, tp_, tp_rank_, ctx.seed, ctx.device,
                                    ctx.act_dtype, ctx.stream);
  for (size_t i = kInProjs; i < specs.size(); ++i)
    params_.push_back(model::make_param(specs[i], tp_, tp_rank_, ctx.seed, ctx.device, ctx.act_dtype, ctx.stream));
  const int64_t qk_t = cfg.num_k_heads * cfg.head_k_dim / tp_, v_t = cfg.num_v_heads * cfg.head_v_dim / tp_,
                h_t = cfg.num_v_heads / tp_;
  gather_ = cp_ > 1 && ctx.gdn_cp_comm == GdnCpComm::all_gather;
  if (cp_ > 1 && !gather_)
    heads_ = ops::CpHeadLayout({qk_t, qk_t, v_t, v_t, h_t, h_t}, cp_, ctx.device, ctx.stream);
}

model::Param& GatedDeltaNet::param(const std::string& suffix) {
  for (model::Param& p : params_)
    if (p.spec.name == prefix_ + ".linear_attn." + suffix) return p;
  DT_FAIL("GatedDeltaNet {}: no parameter '{}'", prefix_, suffix);
}

GatedDeltaNet::Dims GatedDeltaNet::dims(const data::PackedSeqParams& psp) const {
  Dims d;
  d.T = psp.tokens();
  d.T_cp = psp.tokens_cp();
  d.T_in = psp.tokens_local();
  d.qk_t = cfg_.num_k_heads * cfg_.head_k_dim / tp_;
  d.v_t = cfg_.num_v_heads * cfg_.head_v_dim / tp_;
  d.h_t = cfg_.num_v_heads / tp_;
  d.C_tp = 2 * d.qk_t + 2 * d.v_t + 2 * d.h_t;
  d.qk_l = hk_l_ * cfg_.head_k_dim;
  d.v_l = hv_l_ * cfg_.head_v_dim;
  d.conv_l = 2 * d.qk_l + d.v_l;
  d.C_l = d.C_tp / cp_;
  d.off_z = d.conv_l;
  d.off_b = d.off_z + d.v_l;
  d.off_a = d.off_b + hv_l_;
  return d;
}

// Block r of cp_head_perm({qk_t, qk_t, v_t, v_t, h_t, h_t}) is [x_r for each section x], x_r
// the r-th of cp equal column ranges of section x: the same rows as conv_weight_slice (q, k,
// v) and head_slice (b, a), so all_gather computes exactly the hp of all_to_all.
std::array<GatedDeltaNet::HeadRows, 6> GatedDeltaNet::head_rows(const Dims& d) const {
  const int64_t r = cp_rank_;
  return {{{kQkv, r * d.qk_l, d.qk_l, 0},
           {kQkv, d.qk_t + r * d.qk_l, d.qk_l, d.qk_l},
           {kQkv, 2 * d.qk_t + r * d.v_l, d.v_l, 2 * d.qk_l},
           {kZ, r * d.v_l, d.v_l, d.off_z},
           {kB, r * hv_l_, hv_l_, d.off_b},
           {kA, r * hv_l_, hv_l_, d.off_a}}};
}

// Columns of the TP-local out_proj [H, v_t] (or its gradient) for this CP rank's v heads: hp2cp
// puts rank r's yn [T, v_l] at columns [r*v_l, (r+1)*v_l) of its output.
TensorView GatedDeltaNet::out_proj_cols(const TensorView& w) const {
  const int64_t v_l = hv_l_ * cfg_.head_v_dim;
  return cols(w, cp_rank_ * v_l, v_l);
}

void GatedDeltaNet::forward(const TensorView& y, const TensorView& x, const data::PackedSeqParams& psp) {
  const GdnConfig& c = cfg_;
  const Stream s = ctx_.stream;
  const DType A = ctx_.act_dtype;
  const Device dev = ctx_.device;
  const bool sp = ctx_.sp && tp_ > 1;
  const Dims d = dims(psp);
  const int64_t H = c.hidden, dv = c.head_v_dim;
  const int64_t T = d.T, T_cp = d.T_cp, T_in = d.T_in, v_t = d.v_t, C_tp = d.C_tp;
  const int64_t v_l = d.v_l, C_l = d.C_l;
  DT_CHECK(psp.cp() == cp_ && psp.sp() == (sp ? tp_ : 1),
           "GatedDeltaNet {}: packed params built for cp {} sp {}, layer runs cp {} sp {}", prefix_, psp.cp(), psp.sp(),
           cp_, sp ? tp_ : 1);
  check_shape(x, Shape{T_in, H}, "GatedDeltaNet input x [T_local, hidden]");
  check_shape(y, Shape{T_in, H}, "GatedDeltaNet output y [T_local, hidden]");
  DT_CHECK(!gather_ || y.is_contiguous(), "GatedDeltaNet {}: cp_comm all_gather reduce-scatters into y, got {}",
           prefix_, y.str());
  saved_.assign(kNumSaved, Tensor());

  // SP: gather the token shards of the TP group.                       xg [T/cp, H]
  // all_to_all keeps xg for the backward (without SP x itself when lent, else a copy);
  // all_gather sends it as it is (collectives take contiguous operands).
  Tensor lent = lent_.take(x), xg_t;
  TensorView xg = x;
  if (sp || !gather_) {
    xg_t = kept_input(std::move(lent), x, T_cp, sp, ctx_);
    xg = xg_t;
  } else if (!x.is_contiguous()) {
    xg_t = Tensor::empty(Shape{T_cp, H}, A, dev);
    ops::copy(xg_t, x, s);
    xg = xg_t;
  }

  Tensor& hp = saved_[kHp];
  if (gather_) {
    // CP all_gather: every token in natural order, then the projections of this rank's heads
    // only, straight into the hp layout (no cp2hp).                 xn [T, H]; hp [T, C_l]
    Tensor rank_major = Tensor::empty(Shape{T, H}, A, dev);  // row r*T/cp + l: row l of CP rank r
    ctx_.pg->cp->all_gather(rank_major, xg, s);
    Tensor& xn = saved_[kXg];
    xn = Tensor::empty(Shape{T, H}, A, dev);
    ops::gather_rows(xn, rank_major, psp.cp_idx_dev(), s);  // xn[x] = rank_major[cp_idx[x]]
    // The six sections' head rows packed in hp's column order, so one GEMM makes hp (six thin
    // ones, b and a only Hv_l wide, would each read all of xn).                   wp [C_l, H]
    Tensor& wp = saved_[kWp];
    wp = Tensor::empty(Shape{C_l, H}, A, dev);
    for (const HeadRows& h : head_rows(d)) ops::copy(rows(wp, h.col, h.n), rows(params_[h.param].w(), h.row, h.n), s);
    hp = Tensor::empty(Shape{T, C_l}, A, dev);
    ops::gemm(hp, xn, wp, {false, true}, s);
  } else {
    // Input projections: one GEMM over the four weights' rows (make_params_rows).  proj [T/cp, C_tp]
    saved_[kXg] = xg_t;
    Tensor proj = Tensor::empty(Shape{T_cp, C_tp}, A, dev);
    ops::gemm(proj, xg, model::rows_joined(&params_[kQkv], kInProjs).w, {false, true}, s);

    // CP: zig-zag rows, all heads -> all tokens in natural order, this rank's heads.  hp [T, C_l]
    if (cp_ > 1) {
      hp = Tensor::empty(Shape{T, C_l}, A, dev);
      ops::cp2hp_fwd(hp, proj, heads_, psp.cp_map(), *ctx_.pg->cp, ctx_.cp_a2a, s);
    } else {
      hp = proj;
    }
  }
  const ops::VarlenMeta& meta = psp.varlen_meta();  // GLOBAL padded boundaries
  // Gates in fp32 from fp32 A_log and dt_bias (this CP rank's heads), computed in the conv's
  // launch.                                                                g, beta [T, Hv_l]
  saved_[kG] = Tensor::empty(Shape{T, hv_l_}, DType::f32, dev);
  saved_[kBeta] = Tensor::empty(Shape{T, hv_l_}, DType::f32, dev);
  const ops::GdnGateFwdViews gates{saved_[kG], saved_[kBeta], cols(hp, d.off_a, hv_l_), cols(hp, d.off_b, hv_l_),
                                   head_slice(kALog), head_slice(kDtBias)};
  Tensor wc_keep;
  conv_norm(d, conv_weight_slice(&wc_keep), meta, &gates);

  // The chunked gated delta rule on whole sequences.                     o [T, Hv_l, dv]
  saved_[kO] = Tensor::empty(Shape{T, hv_l_, dv}, A, dev);
  // On CUDA the forward's chunk intermediates (W, U, Tm, chunk states) go to the backward,
  // which then skips recomputing them (GdnChunkSaved: ~5x the bytes of v, ~20% of the kernel time;
  // gdn.save_chunk_intermediates=false trades that time for the memory).
  ops::GdnArgs chunk_args;
  chunk_saved_.clear();
  if (dev.is_cuda() && ctx_.gdn_save_chunk) chunk_args.saved = &chunk_saved_;
  // With the gated RMSNorm with z, per v-head over dv (GdnOutNorm).      yn [T, Hv_l * dv]
  saved_[kRn] = Tensor::empty(Shape{T * hv_l_}, DType::f32, dev);
  Tensor yn = Tensor::empty(Shape{T, v_l}, A, dev);
  const ops::GdnOutNorm norm{yn.view().reshape(Shape{T, hv_l_, dv}), saved_[kRn],
                             heads(cols(hp, d.off_z, v_l), hv_l_, dv), params_[kNorm].w(), c.norm_eps};
  chunk_args.norm = &norm;
  ops::gdn_chunk_fwd(saved_[kO], TensorView{}, saved_[kQn], saved_[kKn],
                     heads(saved_[kC], hv_l_, dv), saved_[kG], saved_[kBeta], TensorView{},
                     chunk_args, meta, s);
  if (ctx_.gdn_recompute)
    for (S i : kConvNorm)
      if (i != kC || ctx_.gdn_recompute_v) saved_[i] = Tensor();

  if (gather_) {
    // CP all_gather: out_proj on this rank's head columns is a partial sum over cp for every
    // token, summed into this rank's zig-zag rows.
    saved_[kYo] = yn;
    Tensor partial = Tensor::empty(Shape{T, H}, A, dev);
    ops::gemm(partial, yn, out_proj_cols(params_[kOut].w()), {false, true}, s);
    reduce_partial_to_zigzag(y, partial, psp, sp);  // y [T/(cp*sp), H]
    return;
  }

  // CP: back to zig-zag rows with all of the TP rank's heads.            yo [T/cp, v_t]
  Tensor& yo = saved_[kYo];
  if (cp_ > 1) {
    yo = Tensor::empty(Shape{T_cp, v_t}, A, dev);
    ops::hp2cp_fwd(yo, yn, psp.cp_map(), *ctx_.pg->cp, ctx_.cp_a2a, s);
  } else {
    yo = yn;
  }

  // Row-parallel out_proj, then the TP reduction (reduce-scatter under SP).
  if (sp) {
    Tensor partial = Tensor::empty(Shape{T_cp, H}, A, dev);
    ops::gemm(partial, yo, params_[kOut].w(), {false, true}, s);
    ctx_.pg->tp->reduce_scatter(y, partial, dist::ReduceOp::sum, s);
  } else {
    ops::gemm(y, yo, params_[kOut].w(), {false, true}, s);
    if (tp_ > 1) ctx_.pg->tp->all_reduce(y, dist::ReduceOp::sum, s);
  }
}

void GatedDeltaNet::backward(const TensorView& dx, const TensorView& dy, const data::PackedSeqParams& psp) {
  const GdnConfig& c = cfg_;
  const Stream s = ctx_.stream;
  const DType A = ctx_.act_dtype;
  const Device dev = ctx_.device;
  const bool sp = ctx_.sp && tp_ > 1;
  const Dims d = dims(psp);
  const int64_t H = c.hidden, dk = c.head_k_dim, dv = c.head_v_dim;
  const int64_t T = d.T, T_cp = d.T_cp, T_in = d.T_in, v_t = d.v_t, C_tp = d.C_tp;
  const int64_t v_l = d.v_l, conv_l = d.conv_l, C_l = d.C_l;
  const int64_t off_z = d.off_z, off_b = d.off_b, off_a = d.off_a;
  DT_CHECK(int(saved_.size()) == kNumSaved && saved_[kXg].defined(), "GatedDeltaNet {}: backward without forward",
           prefix_);
  check_shape(dy, Shape{T_in, H}, "GatedDeltaNet dy [T_local, hidden]");
  check_shape(dx, Shape{T_in, H}, "GatedDeltaNet dx [T_local, hidden]");
  DT_CHECK(!gather_ || dx.is_contiguous(), "GatedDeltaNet {}: cp_comm all_gather reduce-scatters into dx, got {}",
           prefix_, dx.str());
  const ops::VarlenMeta& meta = psp.varlen_meta();

  // SP: gather dy of the TP group (the adjoint of the reduce-scatter).   dyg [T/cp, H]
  Tensor dyg_t;
  TensorView dyg = dy;
  if (sp || (gather_ && !dy.is_contiguous())) {  // all_gather's cp gather takes contiguous rows
    dyg_t = Tensor::empty(Shape{T_cp, H}, A, dev);
    if (sp) ctx_.pg->tp->all_gather(dyg_t, dy, s);
    else ops::copy(dyg_t, dy, s);
    dyg = dyg_t;
  }
  Tensor dyn;
  if (gather_) {
    // CP all_gather: dy of every token in natural order (the adjoint of the reduce-scatter and
    // the cp_inv gather); out_proj's dW on this rank's head columns only.  dyf [T, H]
    Tensor rank_major = Tensor::empty(Shape{T, H}, A, dev), dyf = Tensor::empty(Shape{T, H}, A, dev);
    ctx_.pg->cp->all_gather(rank_major, dyg, s);
    ops::gather_rows(dyf, rank_major, psp.cp_idx_dev(), s);
    ops::gemm(out_proj_cols(params_[kOut].grad), dyf, saved_[kYo], {true, false, 1.f, 1.f}, s);
    dyn = Tensor::empty(Shape{T, v_l}, A, dev);
    ops::gemm(dyn, dyf, out_proj_cols(params_[kOut].w()), {}, s);
  } else {
    // out_proj: dW += dy^T yo;  dyo = dy W.                              dyo [T/cp, v_t]
    ops::gemm(params_[kOut].grad, dyg, saved_[kYo], {true, false, 1.f, 1.f}, s);
    Tensor dyo = Tensor::empty(Shape{T_cp, v_t}, A, dev);
    ops::gemm(dyo, dyg, params_[kOut].w(), {}, s);
    if (cp_ > 1) {
      dyn = Tensor::empty(Shape{T, v_l}, A, dev);
      ops::hp2cp_bwd(dyn, dyo, psp.cp_map(), *ctx_.pg->cp, ctx_.cp_a2a, s);
    } else {
      dyn = dyo;
    }
  }

  // gdn.recompute_elementwise: the forward's conv, l2norm and z again (bitwise). Kept or rebuilt,
  // each is released after its last use below rather than at the end of the backward.
  Tensor wc_keep;
  const TensorView wc = conv_weight_slice(&wc_keep);
  if (ctx_.gdn_recompute) conv_norm(d, wc, meta, nullptr, /*with_v=*/!saved_[kC].defined());
  auto release = [&](std::initializer_list<S> which) {
    for (S i : which) saved_[i] = Tensor();
  };

  // Gated RMSNorm backward (made by the chunk backward first: GdnOutNormBwd); dz straight into
  // its columns of dhp.                                          do [T, Hv_l, dv]; dhp [T, C_l]
  Tensor dhp = Tensor::empty(Shape{T, C_l}, A, dev);
  Tensor d_o = Tensor::empty(Shape{T, hv_l_, dv}, A, dev);
  const ops::GdnOutNormBwd norm_bwd{heads(cols(dhp, off_z, v_l), hv_l_, dv), params_[kNorm].grad,
                                    dyn.view().reshape(Shape{T, hv_l_, dv}), saved_[kO],
                                    heads(cols(saved_[kHp], off_z, v_l), hv_l_, dv), params_[kNorm].w(), saved_[kRn]};

  // Core backward.                  dq, dk [T, Hk_l, dk] (of qn, kn); dv [T, v_l] (of the conv's v)
  Tensor dvc = Tensor::empty(Shape{T, v_l}, A, dev);
  Tensor dq = Tensor::empty(Shape{T, hk_l_, dk}, A, dev), dkk = Tensor::empty(Shape{T, hk_l_, dk}, A, dev);
  Tensor dg = Tensor::empty(Shape{T, hv_l_}, DType::f32, dev), dbeta = Tensor::empty(Shape{T, hv_l_}, DType::f32, dev);
  ops::GdnArgs chunk_args;
  if (chunk_saved_.defined()) chunk_args.saved = &chunk_saved_;
  chunk_args.norm_bwd = &norm_bwd;
  ops::gdn_chunk_bwd(dq, dkk, heads(dvc, hv_l_, dv), dg, dbeta, TensorView{}, d_o, TensorView{},
                     saved_[kQn], saved_[kKn], heads(saved_[kC], hv_l_, dv), saved_[kG],
                     saved_[kBeta], TensorView{}, chunk_args, meta, s);
  chunk_saved_.clear();
  release({kC});

  // Gradient of the (post-cp2hp) projection output, section by section.  dhp [T, C_l]
  // L2-norm backward (from the normalised q, k and rstd) and conv backward in one launch: d(qkv
  // pre-conv) into dhp; dw for this CP rank's channels. The gates' backward (da, db into their
  // columns of dhp) runs in the same launch. Both accumulate (+=) straight into the parameter
  // gradients: A_log's and dt_bias's head slices, and the conv weight's when its rows are one
  // block (cp == 1; else three sections, added after).
  Tensor dwc_t;
  TensorView dwc;
  if (cp_ > 1) {
    dwc_t = Tensor::zeros(wc.shape, DType::f32, dev, s);
    dwc = dwc_t;
  } else {
    dwc = params_[kConv].grad.view().reshape(wc.shape);
  }
  const ops::GdnGateBwdViews gates{cols(dhp, off_a, hv_l_),          cols(dhp, off_b, hv_l_),
                                   head_slice_grad(kALog),
                                   head_slice_grad(kDtBias),
                                   dg,
                                   dbeta,
                                   cols(saved_[kHp], off_a, hv_l_),  cols(saved_[kHp], off_b, hv_l_),
                                   head_slice(kALog),                head_slice(kDtBias)};
  ops::causal_conv1d_l2norm_bwd(cols(dhp, 0, conv_l), dwc, TensorView{},
                                {dq, dkk, saved_[kQn], saved_[kKn], saved_[kRq], saved_[kRk], dvc},
                                cols(saved_[kHp], 0, conv_l), wc, TensorView{}, true, meta, &gates, s);
  release({kQn, kKn, kRq, kRk});
  if (cp_ > 1) add_conv_weight_grad(dwc);

  if (gather_) {
    // CP all_gather: dW += dhp^T xn on this rank's head rows only (one GEMM over the packed rows,
    // added into the six sections); dxn = dhp Wp [T, H] is a partial sum over cp, reduce-scattered
    // in rank-major row order like the forward's output.
    Tensor dwp = Tensor::empty(Shape{C_l, H}, DType::f32, dev);  // [C_l, H] f32
    ops::gemm(dwp, dhp, saved_[kXg], {true, false}, s);
    for (const HeadRows& h : head_rows(d))
      ops::axpy(rows(params_[h.param].grad, h.row, h.n), 1.f, rows(dwp, h.col, h.n), s);
    Tensor dxn = Tensor::empty(Shape{T, H}, A, dev);
    ops::gemm(dxn, dhp, saved_[kWp], {}, s);
    reduce_partial_to_zigzag(dx, dxn, psp, sp);
    saved_.clear();
    return;
  }

  // CP: back to zig-zag rows and all TP-local columns.                  dproj [T/cp, C_tp]
  Tensor dproj;
  if (cp_ > 1) {
    dproj = Tensor::empty(Shape{T_cp, C_tp}, A, dev);
    ops::cp2hp_bwd(dproj, dhp, heads_, psp.cp_map(), *ctx_.pg->cp, ctx_.cp_a2a, s);
  } else {
    dproj = dhp;
  }

  // Input projections, joined: dW += dproj^T xg;  dxg = dproj W.
  Tensor dxg_t;
  TensorView dxg = dx;
  if (sp) {
    dxg_t = Tensor::empty(Shape{T_cp, H}, A, dev);
    dxg = dxg_t;
  }
  const model::JoinedRows in = model::rows_joined(&params_[kQkv], kInProjs);
  ops::gemm(in.grad, dproj, saved_[kXg], {true, false, 1.f, 1.f}, s);
  ops::gemm(dxg, dproj, in.w, {}, s);
  if (sp) ctx_.pg->tp->reduce_scatter(dx, dxg, dist::ReduceOp::sum, s);
  else if (tp_ > 1) ctx_.pg->tp->all_reduce(dx, dist::ReduceOp::sum, s);
  saved_.clear();
}

// The element-wise steps from hp to the chunk kernel's inputs (the conv output's v columns, the
// L2-normalised q and k), into saved_: the forward's, and the backward's recomputation of them
// (the same op on the same hp and conv weight, so the same bits). wc: conv_weight_slice(&keep).
void GatedDeltaNet::conv_norm(const Dims& d, const TensorView& wc, const ops::VarlenMeta& meta,
                              const ops::GdnGateFwdViews* gates, bool with_v) {
  const Stream s = ctx_.stream;
  const DType A = ctx_.act_dtype;
  const Device dev = ctx_.device;
  const int64_t T = d.T, dk = cfg_.head_k_dim;
  const TensorView hp = saved_[kHp];  // [T, C_l]

  // Causal conv + SiLU over [q | k | v] with this CP rank's channel slices, and the L2 norm of
  // the q, k heads in the same pass.       v [T, v_l]; qn, kn [T, Hk_l, dk]; rstd [T * Hk_l]
  // Without v: over [q | k] alone (their channels' sums are the same, so the same bits).
  for (int i = 0; i < 2; ++i) {
    saved_[kQn + i] = Tensor::empty(Shape{T, hk_l_, dk}, A, dev);
    saved_[kRq + i] = Tensor::empty(Shape{T * hk_l_}, DType::f32, dev);
  }
  const int64_t ch = with_v ? d.conv_l : 2 * d.qk_l;  // conv channels: q | k | v or q | k
  TensorView v = cols(hp, ch, 0);                     // [T, 0] without v
  if (with_v) {
    saved_[kC] = Tensor::empty(Shape{T, d.v_l}, A, dev);
    v = saved_[kC];
  }
  ops::causal_conv1d_l2norm_fwd({saved_[kQn], saved_[kKn], saved_[kRq], saved_[kRk], v}, cols(hp, 0, ch),
                                rows(wc, 0, ch), TensorView{}, true, 1e-6f, meta, gates, s);
}

void GatedDeltaNet::reduce_partial_to_zigzag(const TensorView& out, const TensorView& partial,
                                             const data::PackedSeqParams& psp, bool sp) {
  const Stream s = ctx_.stream;
  const int64_t T = partial.shape[0], H = partial.shape[1];
  // Rank-major rows (row r*T/cp + l: row l of CP rank r), so the reduce-scatter hands each
  // rank its zig-zag rows.                                   rank_major[q] = partial[cp_inv[q]]
  Tensor rank_major = Tensor::empty(Shape{T, H}, partial.dtype, ctx_.device);
  ops::gather_rows(rank_major, partial, psp.cp_inv_dev(), s);
  if (sp) {
    Tensor yc = Tensor::empty(Shape{psp.tokens_cp(), H}, partial.dtype, ctx_.device);
    ctx_.pg->cp->reduce_scatter(yc, rank_major, dist::ReduceOp::sum, s);
    ctx_.pg->tp->reduce_scatter(out, yc, dist::ReduceOp::sum, s);
  } else {
    ctx_.pg->cp->reduce_scatter(out, rank_major, dist::ReduceOp::sum, s);
    if (tp_ > 1) ctx_.pg->tp->all_reduce(out, dist::ReduceOp::sum, s);
  }
}

// Rows of the TP-local conv weight [conv_t, 1, W] used by this CP rank: its slice of each of
// the q, k, v sections, as a contiguous [conv_l, W] f32 view. Without CP that is the whole
// weight, viewed in place; under CP the three slices are copied into *keep, which the caller
// holds while the view is used.
TensorView GatedDeltaNet::conv_weight_slice(Tensor* keep) const {
  const model::Param& p = params_[kConv];
  const int64_t W = cfg_.conv_kernel, conv_t = p.master.shape()[0];
  TensorView w = p.master.view().reshape(Shape{conv_t, W});
  if (cp_ == 1) return w;
  const int64_t qk_t = cfg_.num_k_heads * cfg_.head_k_dim / tp_, qk_l = qk_t / cp_;
  const int64_t v_t = cfg_.num_v_heads * cfg_.head_v_dim / tp_, v_l = v_t / cp_;
  Tensor& t = *keep;
  t = Tensor::empty(Shape{2 * qk_l + v_l, W}, DType::f32, ctx_.device);
  const int64_t src[3] = {cp_rank_ * qk_l, qk_t + cp_rank_ * qk_l, 2 * qk_t + cp_rank_ * v_l};
  const int64_t dst[3] = {0, qk_l, 2 * qk_l}, len[3] = {qk_l, qk_l, v_l};
  for (int i = 0; i < 3; ++i)
    ops::copy(t.view().slice(0, dst[i], dst[i] + len[i]), w.slice(0, src[i], src[i] + len[i]), ctx_.stream);
  return t;
}

void GatedDeltaNet::add_conv_weight_grad(const TensorView& dwc) {
  model::Param& p = params_[kConv];
  const int64_t W = cfg_.conv_kernel, conv_t = p.grad.shape()[0];
  TensorView g = p.grad.view().reshape(Shape{conv_t, W});
  const int64_t qk_t = cfg_.num_k_heads * cfg_.head_k_dim / tp_, qk_l = qk_t / cp_;
  const int64_t v_t = cfg_.num_v_heads * cfg_.head_v_dim / tp_, v_l = v_t / cp_;
  const int64_t dst[3] = {cp_rank_ * qk_l, qk_t + cp_rank_ * qk_l, 2 * qk_t + cp_rank_ * v_l};
  const int64_t src[3] = {0, qk_l, 2 * qk_l}, len[3] = {qk_l, qk_l, v_l};
  for (int i = 0; i < 3; ++i)
    ops::axpy(g.slice(0, dst[i], dst[i] + len[i]), 1.f, dwc.slice(0, src[i], src[i] + len[i]), ctx_.stream);
}

// This CP rank's heads of a per-head fp32 parameter (A_log, dt_bias), and of its gradient.
TensorView GatedDeltaNet::head_slice(int which) const {
  return params_[which].master.view().slice(0, cp_rank_ * hv_l_, (cp_rank_ + 1) * hv_l_);
}
TensorView GatedDeltaNet::head_slice_grad(int which) {
  return params_[which].grad.view().slice(0, cp_rank_ * hv_l_, (cp_rank_ + 1) * hv_l_);
}

}  // namespace dt::layers
