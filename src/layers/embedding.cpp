// VocabEmbedding layer (include/deltatron/layers/embedding.h).
#include "deltatron/layers/embedding.h"

#include "deltatron/ops/basic.h"
#include "deltatron/ops/layers_ops.h"

namespace dt::layers {

std::vector<model::ParamSpec> VocabEmbedding::param_specs(const EmbeddingConfig& c) {
  return {{"model.embed_tokens.weight", Shape{c.vocab, c.hidden}, model::InitRule::normal(c.init_std), 0}};
}

std::string VocabEmbedding::check_layout(const EmbeddingConfig& c, int tp) {
  if (c.vocab % tp)
    return fmt::format("config: the vocab-parallel embedding needs tp={} to divide vocab_size={} (pad the vocab to {})",
                       tp, c.vocab, (c.vocab + tp - 1) / tp * tp);
  return "";
}

VocabEmbedding::VocabEmbedding(const EmbeddingConfig& cfg, const RunCtx& ctx) : cfg_(cfg), ctx_(ctx) {
  DT_CHECK(ctx.pg != nullptr, "VocabEmbedding: RunCtx.pg is null");
  tp_ = ctx.pg->dims.tp;
  sp_ = ctx.sp && tp_ > 1;
  std::string err = check_layout(cfg, tp_);
  if (!err.empty()) user_error(err);
  vocab_begin_ = cfg.vocab / tp_ * ctx.pg->coord.tp;
  params_.push_back(model::make_param(param_specs(cfg)[0], tp_, ctx.pg->coord.tp, ctx.seed, ctx.device, ctx.act_dtype,
                                      ctx.stream));
}

void VocabEmbedding::forward(const TensorView& y, const TensorView& ids) {
  const Stream s = ctx_.stream;
  const int64_t H = cfg_.hidden, T_cp = ids.numel(), T_in = T_cp / (sp_ ? tp_ : 1);
  DT_CHECK(ids.ndim() == 1 && T_cp % (sp_ ? tp_ : 1) == 0, "VocabEmbedding: ids {} must be [T/cp], divisible by sp={}",
           ids.str(), sp_ ? tp_ : 1);
  check_shape(y, Shape{T_in, H}, "VocabEmbedding y [T_local, hidden]");
  ids_ = Tensor::empty(Shape{T_cp}, DType::i32, ctx_.device);  // [T/cp]
  ops::copy(ids_, ids, s);
  if (sp_) {
    Tensor partial = Tensor::empty(Shape{T_cp, H}, ctx_.act_dtype, ctx_.device);  // [T/cp, H]
    ops::embedding_fwd(partial, ids_, params_[0].w(), vocab_begin_, s);
    ctx_.pg->tp->reduce_scatter(y, partial, dist::ReduceOp::sum, s);
  } else {
    ops::embedding_fwd(y, ids_, params_[0].w(), vocab_begin_, s);
    if (tp_ > 1) ctx_.pg->tp->all_reduce(y, dist::ReduceOp::sum, s);
  }
}

void VocabEmbedding::backward(const TensorView& dy) {
  DT_CHECK(ids_.defined(), "VocabEmbedding: backward without forward");
  const int64_t H = cfg_.hidden, T_cp = ids_.numel(), T_in = T_cp / (sp_ ? tp_ : 1);
  check_shape(dy, Shape{T_in, H}, "VocabEmbedding dy [T_local, hidden]");
  const Stream s = ctx_.stream;
  const int64_t R = defer_rows_;  // > 0: deferred (defer_next_backward)
  defer_rows_ = 0;
  if (R > 0) {
    // The rows and ids go straight into the padded buffers apply_deferred gathers; padding ids
    // are -1 (owned by no rank: skipped), padding rows are never read.
    DT_CHECK(T_cp <= R, "VocabEmbedding: {} rows exceed the deferred backward's max_rows={}", T_cp, R);
    deferred_rows_ = Tensor::empty(Shape{R, H}, dy.dtype, ctx_.device);  // [R, H]
    deferred_ids_ = Tensor::empty(Shape{R}, DType::i32, ctx_.device);    // [R] i32
    ops::fill(deferred_ids_, -1.0, s);
    if (T_cp > 0) {
      ops::copy(deferred_ids_.view().slice(0, 0, T_cp), ids_, s);
      const TensorView rows = deferred_rows_.view().slice(0, 0, T_cp);
      if (sp_) ctx_.pg->tp->all_gather(rows, dy, s);
      else ops::copy(rows, dy, s);
    }
    ids_ = Tensor();
    return;
  }
  Tensor dyg_t;  // [T/cp, H]
  TensorView dyg = dy;
  if (sp_) {
    dyg_t = Tensor::empty(Shape{T_cp, H}, dy.dtype, ctx_.device);
    ctx_.pg->tp->all_gather(dyg_t, dy, s);
    dyg = dyg_t;
  }
  ops::embedding_bwd(params_[0].grad, dyg, ids_, vocab_begin_, s);
  ids_ = Tensor();
}

void VocabEmbedding::apply_deferred(dist::Communicator& group, Stream s) {
  DT_CHECK(deferred_rows_.defined(), "VocabEmbedding: apply_deferred without a deferred backward");
  const int64_t R = deferred_ids_.numel(), P = group.size();
  Tensor all_rows = Tensor::empty(Shape{P * R, cfg_.hidden}, deferred_rows_.dtype(), ctx_.device);  // [P*R, H]
  Tensor all_ids = Tensor::empty(Shape{P * R}, DType::i32, ctx_.device);                           // [P*R] i32
  group.all_gather(all_rows, deferred_rows_, s);
  group.all_gather(all_ids, deferred_ids_, s);
  // One call: equal ids are summed in index order (rank, then token), on every rank alike.
  ops::embedding_bwd(params_[0].grad, all_rows, all_ids, vocab_begin_, s);
  deferred_rows_ = Tensor();
  deferred_ids_ = Tensor();
}

Tensor local_token_ids(std::span<const int32_t> ids_global, const data::PackedSeqParams& psp, Device dev, Stream s) {
  DT_CHECK(int64_t(ids_global.size()) == psp.tokens(), "local_token_ids: {} ids for a batch of T={} tokens",
           ids_global.size(), psp.tokens());
  Tensor g(Tensor::empty(Shape{psp.tokens()}, DType::i32));
  std::copy(ids_global.begin(), ids_global.end(), g.ptr<int32_t>());
  Tensor loc = data::zigzag_slice_rows(g, psp.cu_seqlens_padded(), psp.cp(), psp.cp_rank());  // [T/cp]
  return dev.is_cpu() ? loc : ops::to_device(loc, dev, s);
}

}  // namespace dt::layers
