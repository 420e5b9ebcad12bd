// LmHeadLoss layer and next-token targets (include/deltatron/layers/lm_head.h).
#include "deltatron/layers/lm_head.h"

#include <algorithm>

#include "deltatron/ops/basic.h"
#include "deltatron/ops/gemm.h"
#include "deltatron/ops/layers_ops.h"

namespace dt::layers {

namespace {
// This CP rank's rows of a target per global position x: label(x, real_end) for x inside its
// sequence's real tokens [.., real_end), -1 on pads.
template <class Label>
LmTargets targets_by(const data::PackedSeqParams& psp, Device dev, Stream s, Label label) {
  const int64_t T_cp = psp.tokens_cp();
  const std::vector<int32_t>& cu_pad = psp.cu_seqlens_padded();
  const std::vector<int32_t>& cu = psp.cu_seqlens();
  Tensor lab = Tensor::empty(Shape{T_cp}, DType::i32);  // [T/cp] host
  int32_t* lp = lab.ptr<int32_t>();
  LmTargets out;
  for (int64_t l = 0; l < T_cp; ++l) {
    const int64_t x = psp.cp() == 1 ? l : data::zigzag_local_to_global(cu_pad, psp.cp(), psp.cp_rank(), l);
    // Sequence i with cu_pad[i] <= x < cu_pad[i + 1]; its real tokens end at cu_pad[i] + len_i.
    const int64_t i = std::upper_bound(cu_pad.begin(), cu_pad.end(), int32_t(x)) - cu_pad.begin() - 1;
    const int64_t real_end = int64_t(cu_pad[size_t(i)]) + (cu[size_t(i) + 1] - cu[size_t(i)]);
    lp[l] = x < real_end ? label(x, real_end) : -1;
    out.count += lp[l] >= 0;
  }
  out.labels = dev.is_cpu() ? lab : ops::to_device(lab, dev, s);
  return out;
}
}  // namespace

LmTargets next_token_targets(std::span<const int32_t> ids_global, const data::PackedSeqParams& psp, Device dev,
                             Stream s) {
  DT_CHECK(int64_t(ids_global.size()) == psp.tokens(), "next_token_targets: {} ids for a batch of T={} tokens",
           ids_global.size(), psp.tokens());
  return targets_by(psp, dev, s, [&](int64_t x, int64_t real_end) {
    return x + 1 < real_end ? ids_global[size_t(x + 1)] : int32_t(-1);
  });
}

LmTargets targets_from_labels(std::span<const int32_t> labels_global, const data::PackedSeqParams& psp, Device dev,
                              Stream s) {
  DT_CHECK(int64_t(labels_global.size()) == psp.tokens(), "targets_from_labels: {} labels for a batch of T={} tokens",
           labels_global.size(), psp.tokens());
  return targets_by(psp, dev, s, [&](int64_t x, int64_t) { return labels_global[size_t(x)]; });
}

std::vector<model::ParamSpec> LmHeadLoss::param_specs(const LmHeadConfig& c) {
  if (c.tie_word_embeddings) return {};
  return {{"lm_head.weight", Shape{c.vocab, c.hidden}, model::InitRule::normal(c.init_std), 0}};
}

std::string LmHeadLoss::check_layout(const LmHeadConfig& c, int tp) {
  if (c.vocab % tp)
    return fmt::format("config: the vocab-parallel LM head needs tp={} to divide vocab_size={} (pad the vocab to {})",
                       tp, c.vocab, (c.vocab + tp - 1) / tp * tp);
  return "";
}

LmHeadLoss::LmHeadLoss(const LmHeadConfig& cfg, const RunCtx& ctx, model::Param* tied)
    : cfg_(cfg), ctx_(ctx), tied_(tied) {
  DT_CHECK(ctx.pg != nullptr, "LmHeadLoss: RunCtx.pg is null");
  DT_CHECK(cfg.tie_word_embeddings == (tied != nullptr),
           "LmHeadLoss: tie_word_embeddings={} but the tied weight is {}", cfg.tie_word_embeddings,
           tied ? "given" : "null");
  DT_CHECK(cfg.chunk_tokens >= 0, "LmHeadLoss: chunk_tokens={} must be >= 0 (0: automatic)", cfg.chunk_tokens);
  tp_ = ctx.pg->dims.tp;
  sp_ = ctx.sp && tp_ > 1;
  std::string err = check_layout(cfg, tp_);
  if (!err.empty()) user_error(err);
  vocab_begin_ = cfg.vocab / tp_ * ctx.pg->coord.tp;
  for (const model::ParamSpec& sp : param_specs(cfg))
    params_.push_back(model::make_param(sp, tp_, ctx.pg->coord.tp, ctx.seed, ctx.device, ctx.act_dtype, ctx.stream));
  if (tied) {
    check_shape(tied->master, Shape{cfg.vocab / tp_, cfg.hidden}, "LmHeadLoss tied weight [V/tp, hidden]");
  }
}

int64_t LmHeadConfig::chunk_rows(int tp, int64_t elem_bytes) const {
  if (chunk_tokens > 0) return chunk_tokens;
  const int64_t fit = (int64_t(1) << 30) / (elem_bytes * std::max<int64_t>(vocab / std::max(tp, 1), 1));
  return std::clamp<int64_t>(fit / 64 * 64, 64, 4096);
}

void LmHeadLoss::chunk_stats(const TensorView& lg, int64_t c0, const TensorView& loss) {
  const Stream s = ctx_.stream;
  const int64_t n = lg.shape[0];
  TensorView mc = m_.view().slice(0, c0, c0 + n), tg = labels_.view().slice(0, c0, c0 + n);
  Tensor st = Tensor::empty(Shape{2, n}, DType::f32, ctx_.device);  // [se | tl], one all-reduce
  const TensorView sec = st.view().select(0, 0), tlc = st.view().select(0, 1);
  if (tp_ == 1) {
    ops::ce_stats(mc, sec, tlc, lg, tg, vocab_begin_, s);
  } else {
    // Each rank's sum is relative to its own max; rescaled to the global max before summing.
    Tensor m_loc = Tensor::empty(Shape{n}, DType::f32, ctx_.device);  // [n] this rank's row max
    ops::ce_stats(m_loc, sec, tlc, lg, tg, vocab_begin_, s);
    ops::copy(mc, m_loc, s);
    ctx_.pg->tp->all_reduce(mc, dist::ReduceOp::max, s);
    ops::ce_rescale(sec, m_loc, mc, s);
    ctx_.pg->tp->all_reduce(st, dist::ReduceOp::sum, s);
  }
  ops::copy(se_.view().slice(0, c0, c0 + n), sec, s);
  ops::ce_loss(loss.slice(0, c0, c0 + n), mc, sec, tlc, tg, s);
}

// lg: the chunk's logits, overwritten by its dlogits (ce_bwd reads and writes each element once).
void LmHeadLoss::chunk_grad(const TensorView& lg, int64_t c0, const TensorView& hc, const TensorView& dhc,
                            float scale) {
  const Stream s = ctx_.stream;
  const int64_t n = lg.shape[0];
  model::Param& w = weight();
  const TensorView& dl = lg;
  ops::ce_bwd(dl, lg, m_.view().slice(0, c0, c0 + n), se_.view().slice(0, c0, c0 + n),
              labels_.view().slice(0, c0, c0 + n), vocab_begin_, scale, s);
  ops::gemm(w.grad, dl, hc, {true, false, 1.f, 1.f}, s);  // dW_t += dl^T hg
  ops::gemm(dhc, dl, w.w(), {}, s);                      // dhg = dl W_t
}

LmHeadLoss::Result LmHeadLoss::forward(const TensorView& h, const LmTargets& targets,
                                       std::optional<float> backward_scale) {
  const Stream s = ctx_.stream;
  const Device dev = ctx_.device;
  const int64_t H = cfg_.hidden, V_t = cfg_.vocab / tp_, T_cp = targets.labels.numel();
  const int64_t T_in = T_cp / (sp_ ? tp_ : 1);
  check_shape(h, Shape{T_in, H}, "LmHeadLoss h [T_local, hidden]");
  DT_CHECK(!fused_scale_, "LmHeadLoss: forward after a fused forward whose backward has not run");
  hg_ = Tensor::empty(Shape{T_cp, H}, h.dtype, dev);  // [T_cp, H]
  if (sp_) ctx_.pg->tp->all_gather(hg_, h, s);
  else ops::copy(hg_, h, s);
  labels_ = targets.labels;
  m_ = Tensor::empty(Shape{T_cp}, DType::f32, dev);
  se_ = Tensor::empty(Shape{T_cp}, DType::f32, dev);
  Tensor loss = Tensor::empty(Shape{T_cp}, DType::f32, dev);  // [T_cp] per-token losses
  const int64_t C = std::min(cfg_.chunk_rows(tp_, int64_t(dtype_size(h.dtype))), std::max<int64_t>(T_cp, 1));
  Tensor logits = Tensor::empty(Shape{C, V_t}, h.dtype, dev);  // [C, V_t] act; dlogits in place
  if (backward_scale) dhg_ = Tensor::empty(Shape{T_cp, H}, h.dtype, dev);
  const TensorView W = weight().w();
  for (int64_t c0 = 0; c0 < T_cp; c0 += C) {
    const int64_t n = std::min(C, T_cp - c0);
    const TensorView lg = logits.view().slice(0, 0, n), hc = hg_.view().slice(0, c0, c0 + n);
    ops::gemm(lg, hc, W, {false, true}, s);
    chunk_stats(lg, c0, loss);
    if (backward_scale) chunk_grad(lg, c0, hc, dhg_.view().slice(0, c0, c0 + n), *backward_scale);
  }
  Result r;
  r.loss_sum = Tensor::zeros(Shape{1}, DType::f32, dev, s);
  if (T_cp > 0) ops::sum(r.loss_sum, loss, s);
  r.count = targets.count;
  if (backward_scale) {  // the backward needs nothing but dhg
    fused_scale_ = backward_scale;
    hg_ = labels_ = m_ = se_ = Tensor();
  }
  return r;
}

void LmHeadLoss::backward(const TensorView& dh, float scale) {
  const Stream s = ctx_.stream;
  const Device dev = ctx_.device;
  const int64_t H = cfg_.hidden, V_t = cfg_.vocab / tp_;
  if (fused_scale_) {
    // The scale is part of the gradient already computed: a different one would be silently wrong.
    DT_CHECK(scale == *fused_scale_, "LmHeadLoss: backward scale {} but the fused forward applied {}", scale,
             *fused_scale_);
    const int64_t T_cp = dhg_.shape()[0];
    check_shape(dh, Shape{T_cp / (sp_ ? tp_ : 1), H}, "LmHeadLoss dh [T_local, hidden]");
    if (sp_) {
      ctx_.pg->tp->reduce_scatter(dh, dhg_, dist::ReduceOp::sum, s);
    } else {
      ops::copy(dh, dhg_, s);
      if (tp_ > 1) ctx_.pg->tp->all_reduce(dh, dist::ReduceOp::sum, s);
    }
    dhg_ = Tensor();
    fused_scale_.reset();
    return;
  }
  DT_CHECK(hg_.defined(), "LmHeadLoss: backward without forward");
  const DType A = hg_.dtype();
  const int64_t T_cp = hg_.shape()[0];
  const int64_t T_in = T_cp / (sp_ ? tp_ : 1);
  check_shape(dh, Shape{T_in, H}, "LmHeadLoss dh [T_local, hidden]");
  Tensor dhg_t;  // [T_cp, H]
  TensorView dhg = dh;
  if (sp_) {
    dhg_t = Tensor::empty(Shape{T_cp, H}, A, dev);
    dhg = dhg_t;
  }
  const int64_t C = std::min(cfg_.chunk_rows(tp_, int64_t(dtype_size(A))), std::max<int64_t>(T_cp, 1));
  Tensor logits = Tensor::empty(Shape{C, V_t}, A, dev);  // [C, V_t] recomputed; dlogits in place
  for (int64_t c0 = 0; c0 < T_cp; c0 += C) {
    const int64_t n = std::min(C, T_cp - c0);
    const TensorView lg = logits.view().slice(0, 0, n), hc = hg_.view().slice(0, c0, c0 + n);
    ops::gemm(lg, hc, weight().w(), {false, true}, s);
    chunk_grad(lg, c0, hc, dhg.slice(0, c0, c0 + n), scale);
  }
  if (sp_) ctx_.pg->tp->reduce_scatter(dh, dhg, dist::ReduceOp::sum, s);
  else if (tp_ > 1) ctx_.pg->tp->all_reduce(dh, dist::ReduceOp::sum, s);
  hg_ = labels_ = m_ = se_ = Tensor();
}

void LmHeadLoss::logits(const TensorView& out, const TensorView& h) {
  const Stream s = ctx_.stream;
  const Device dev = ctx_.device;
  const int64_t H = cfg_.hidden, V = cfg_.vocab, V_t = V / tp_, T_in = h.shape[0];
  const int64_t T_cp = T_in * (sp_ ? tp_ : 1);
  check_shape(h, Shape{T_in, H}, "LmHeadLoss::logits h [T_local, hidden]");
  check_shape(out, Shape{T_cp, V}, "LmHeadLoss::logits out [T_cp, vocab]");
  check_dtype(out, DType::f32, "LmHeadLoss::logits out");
  Tensor hg_t;  // [T_cp, H]
  TensorView hg = h;
  if (sp_) {
    hg_t = Tensor::empty(Shape{T_cp, H}, h.dtype, dev);
    ctx_.pg->tp->all_gather(hg_t, h, s);
    hg = hg_t;
  }
  if (T_cp == 0) return;
  if (tp_ == 1) {
    ops::gemm(out, hg, weight().w(), {false, true}, s);
    return;
  }
  Tensor part = Tensor::empty(Shape{T_cp, V_t}, DType::f32, dev);     // [T_cp, V_t] this rank's vocab slice
  Tensor all = Tensor::empty(Shape{tp_, T_cp, V_t}, DType::f32, dev);  // [tp, T_cp, V_t]
  ops::gemm(part, hg, weight().w(), {false, true}, s);
  ctx_.pg->tp->all_gather(all, part, s);
  for (int t = 0; t < tp_; ++t) ops::copy(out.slice(1, t * V_t, (t + 1) * V_t), all.view().select(0, t), s);
}

}  // namespace dt::layers
