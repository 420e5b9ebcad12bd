// The Qwen3.5 hybrid model (include/deltatron/model/qwen35.h): the mixer registry, the decoder
// layer with pre-norm residuals, and the model (embedding -> layers -> norm -> LM head loss).
#include "deltatron/model/qwen35.h"

#include <fmt/format.h>

#include "deltatron/core/check.h"
#include "deltatron/ops/basic.h"

namespace dt::model {

layers::GdnConfig gdn_config(const io::ModelConfig& m) {
  layers::GdnConfig c;
  c.hidden = m.hidden_size;
  c.num_k_heads = m.linear_num_key_heads;
  c.num_v_heads = m.linear_num_value_heads;
  c.head_k_dim = m.linear_key_head_dim;
  c.head_v_dim = m.linear_value_head_dim;
  c.conv_kernel = m.linear_conv_kernel_dim;
  c.norm_eps = float(m.rms_norm_eps);
  c.init_std = float(m.initializer_range);
  return c;
}

layers::AttentionConfig attention_config(const io::ModelConfig& m) {
  layers::AttentionConfig c;
  c.hidden = m.hidden_size;
  c.num_heads = m.num_attention_heads;
  c.num_kv_heads = m.num_key_value_heads;
  c.head_dim = m.head_dim;
  c.partial_rotary_factor = m.partial_rotary_factor;
  c.rope_theta = m.rope_theta;
  c.norm_eps = float(m.rms_norm_eps);
  c.init_std = float(m.initializer_range);
  return c;
}

layers::MlpConfig mlp_config(const io::ModelConfig& m) {
  return {m.hidden_size, m.intermediate_size, float(m.initializer_range)};
}

layers::EmbeddingConfig embedding_config(const io::ModelConfig& m) {
  return {m.vocab_size, m.hidden_size, float(m.initializer_range)};
}

layers::LmHeadConfig lm_head_config(const io::ModelConfig& m) {
  layers::LmHeadConfig c;
  c.vocab = m.vocab_size;
  c.hidden = m.hidden_size;
  c.init_std = float(m.initializer_range);
  c.tie_word_embeddings = m.tie_word_embeddings;
  return c;
}

// ---- mixer registry ----------------------------------------------------------------------

namespace {

// Any layer with forward(y, x, psp) / backward(dx, dy, psp) / params() as a Mixer.
template <typename Layer>
class MixerOf final : public Mixer {
 public:
  template <typename Cfg>
  MixerOf(const Cfg& cfg, const std::string& prefix, const layers::RunCtx& ctx) : layer_(cfg, prefix, ctx) {}
  std::vector<Param>& params() override { return layer_.params(); }
  void lend_input(Tensor x) override { layer_.lend_input(std::move(x)); }
  void forward(const TensorView& y, const TensorView& x, const data::PackedSeqParams& psp) override {
    layer_.forward(y, x, psp);
  }
  void backward(const TensorView& dx, const TensorView& dy, const data::PackedSeqParams& psp) override {
    layer_.backward(dx, dy, psp);
  }

 private:
  Layer layer_;
};

std::vector<MixerEntry> build_registry() {
  std::vector<MixerEntry> r;
  r.push_back({"linear_attention", "linear_attn",
               [](const io::ModelConfig& m, const std::string& prefix, const layers::RunCtx& ctx) {
                 return std::unique_ptr<Mixer>(new MixerOf<layers::GatedDeltaNet>(gdn_config(m), prefix, ctx));
               },
               [](const io::ModelConfig& m, const std::string& prefix) {
                 return layers::GatedDeltaNet::param_specs(gdn_config(m), prefix);
               },
               [](const io::ModelConfig& m, int tp, int cp) {
                 return layers::GatedDeltaNet::check_layout(gdn_config(m), tp, cp);
               }});
  r.push_back({"full_attention", "self_attn",
               [](const io::ModelConfig& m, const std::string& prefix, const layers::RunCtx& ctx) {
                 return std::unique_ptr<Mixer>(new MixerOf<layers::GatedAttention>(attention_config(m), prefix, ctx));
               },
               [](const io::ModelConfig& m, const std::string& prefix) {
                 return layers::GatedAttention::param_specs(attention_config(m), prefix);
               },
               [](const io::ModelConfig& m, int tp, int /*cp: K/V are all-gathered*/) {
                 return layers::GatedAttention::check_layout(attention_config(m), tp);
               }});
  return r;
}

std::string known_types() {
  std::string s;
  for (const MixerEntry& e : mixer_registry()) s += (s.empty() ? "" : ", ") + e.layer_type;
  return s;
}

std::string layer_prefix(int64_t index) { return fmt::format("model.layers.{}", index); }

}  // namespace

const std::vector<MixerEntry>& mixer_registry() {
  static const std::vector<MixerEntry> r = build_registry();
  return r;
}

const MixerEntry* find_mixer(const std::string& layer_type) {
  for (const MixerEntry& e : mixer_registry())
    if (e.layer_type == layer_type) return &e;
  return nullptr;
}

// ---- decoder layer -----------------------------------------------------------------------

DecoderLayer::DecoderLayer(const io::ModelConfig& cfg, int64_t index, const std::string& layer_type,
                           const layers::RunCtx& ctx)
    : type_(layer_type), ctx_(ctx) {
  const MixerEntry* e = find_mixer(layer_type);
  if (!e)
    user_error(fmt::format("config: model.layer_types[{}]='{}' is not a known layer type (known: {})", index,
                           layer_type, known_types()));
  const std::string p = layer_prefix(index);
  const float eps = float(cfg.rms_norm_eps);
  input_norm_ = std::make_unique<layers::RmsNorm1p>(cfg.hidden_size, eps, p + ".input_layernorm.weight", ctx);
  mixer_ = e->make(cfg, p, ctx);
  post_norm_ = std::make_unique<layers::RmsNorm1p>(cfg.hidden_size, eps, p + ".post_attention_layernorm.weight", ctx);
  mlp_ = std::make_unique<layers::SwiGluMlp>(mlp_config(cfg), p, ctx);
}

void DecoderLayer::collect_params(std::vector<Param*>& out) {
  for (Param& q : input_norm_->params()) out.push_back(&q);
  for (Param& q : mixer_->params()) out.push_back(&q);
  for (Param& q : post_norm_->params()) out.push_back(&q);
  for (Param& q : mlp_->params()) out.push_back(&q);
}

void DecoderLayer::forward(const TensorView& h, const data::PackedSeqParams& psp) {
  const Stream s = ctx_.stream;
  // Each sub-block's normed input is its own tensor, lent to it: the mixer and the MLP keep it
  // for their backward instead of a copy (layers::LentInput).          n1, n2, o [T_local, H]
  Tensor n1 = Tensor::empty(h.shape, h.dtype, h.device), n2 = Tensor::empty(h.shape, h.dtype, h.device);
  Tensor o = Tensor::empty(h.shape, h.dtype, h.device);
  input_norm_->forward(n1, h);
  mixer_->lend_input(n1);
  mixer_->forward(o, n1, psp);
  ops::add(h, h, o, s);  // h = h + mixer(input_layernorm(h))
  post_norm_->forward(n2, h);
  mlp_->lend_input(n2);
  mlp_->forward(o, n2);
  ops::add(h, h, o, s);  // h = h + mlp(post_attention_layernorm(h))
}

void DecoderLayer::backward(const TensorView& dh, const data::PackedSeqParams& psp) {
  const Stream s = ctx_.stream;
  Tensor dn = Tensor::empty(dh.shape, dh.dtype, dh.device);  // [T_local, H] d(normed input)
  Tensor dx = Tensor::empty(dh.shape, dh.dtype, dh.device);  // [T_local, H] d(residual input) of a branch
  // dh is d(out); out = mid + mlp(post_norm(mid)): d(mid) = dh + post_norm^T mlp^T dh.
  mlp_->backward(dn, dh);
  post_norm_->backward(dx, dn);
  ops::axpy(dh, 1.f, dx, s);
  // mid = in + mixer(input_norm(in)): d(in) = d(mid) + input_norm^T mixer^T d(mid).
  mixer_->backward(dn, dh, psp);
  input_norm_->backward(dx, dn);
  ops::axpy(dh, 1.f, dx, s);
}

// ---- model -------------------------------------------------------------------------------

std::string Qwen35Model::check_layout(const io::ModelConfig& cfg, int tp, int cp) {
  std::string err = layers::VocabEmbedding::check_layout(embedding_config(cfg), tp);
  if (err.empty()) err = layers::LmHeadLoss::check_layout(lm_head_config(cfg), tp);
  if (err.empty()) err = layers::SwiGluMlp::check_layout(mlp_config(cfg), tp);
  if (!err.empty()) return err;
  const std::vector<std::string> types = io::resolved_layer_types(cfg);
  if (int64_t(types.size()) != cfg.num_hidden_layers)
    return fmt::format("config: model.layer_types has {} entries but model.num_hidden_layers={}", types.size(),
                       cfg.num_hidden_layers);
  std::vector<bool> checked(mixer_registry().size(), false);
  for (size_t i = 0; i < types.size(); ++i) {
    const MixerEntry* e = find_mixer(types[i]);
    if (!e)
      return fmt::format("config: model.layer_types[{}]='{}' is not a known layer type (known: {})", i, types[i],
                         known_types());
    const size_t k = size_t(e - mixer_registry().data());
    if (checked[k]) continue;
    checked[k] = true;
    err = e->check_layout(cfg, tp, cp);
    if (!err.empty()) return err;
  }
  return "";
}

std::vector<ParamSpec> Qwen35Model::param_specs(const io::ModelConfig& cfg, bool sp) {
  std::vector<ParamSpec> out = layers::VocabEmbedding::param_specs(embedding_config(cfg));
  const std::vector<std::string> types = io::resolved_layer_types(cfg);
  auto append = [&](std::vector<ParamSpec> v) { out.insert(out.end(), v.begin(), v.end()); };
  for (size_t i = 0; i < types.size(); ++i) {
    const MixerEntry* e = find_mixer(types[i]);
    DT_CHECK(e != nullptr, "Qwen35Model::param_specs: unknown layer type '{}'", types[i]);
    const std::string p = layer_prefix(int64_t(i));
    out.push_back(layers::RmsNorm1p::param_spec(cfg.hidden_size, p + ".input_layernorm.weight", sp));
    append(e->param_specs(cfg, p));
    out.push_back(layers::RmsNorm1p::param_spec(cfg.hidden_size, p + ".post_attention_layernorm.weight", sp));
    append(layers::SwiGluMlp::param_specs(mlp_config(cfg), p));
  }
  out.push_back(layers::RmsNorm1p::param_spec(cfg.hidden_size, "model.norm.weight", sp));
  append(layers::LmHeadLoss::param_specs(lm_head_config(cfg)));
  return out;
}

Qwen35Model::Qwen35Model(const io::ModelConfig& cfg, const layers::RunCtx& ctx) : cfg_(cfg), ctx_(ctx) {
  DT_CHECK(ctx.pg != nullptr, "Qwen35Model: RunCtx.pg is null");
  const std::string err = check_layout(cfg, ctx.pg->dims.tp, ctx.pg->dims.cp);
  if (!err.empty()) user_error(err);
  embed_ = std::make_unique<layers::VocabEmbedding>(embedding_config(cfg), ctx);
  const std::vector<std::string> types = io::resolved_layer_types(cfg);
  for (size_t i = 0; i < types.size(); ++i)
    layers_.push_back(std::make_unique<DecoderLayer>(cfg, int64_t(i), types[i], ctx));
  norm_ = std::make_unique<layers::RmsNorm1p>(cfg.hidden_size, float(cfg.rms_norm_eps), "model.norm.weight", ctx);
  head_ = std::make_unique<layers::LmHeadLoss>(lm_head_config(cfg), ctx,
                                               cfg.tie_word_embeddings ? &embed_->weight() : nullptr);
}

std::vector<Param*> Qwen35Model::params() {
  std::vector<Param*> out;
  for (Param& p : embed_->params()) out.push_back(&p);
  for (auto& l : layers_) l->collect_params(out);
  for (Param& p : norm_->params()) out.push_back(&p);
  for (Param& p : head_->params()) out.push_back(&p);  // empty when tied
  return out;
}

Param* Qwen35Model::find_param(const std::string& name) {
  for (Param* p : params())
    if (p->spec.name == name) return p;
  return nullptr;
}

layers::LmHeadLoss::Result Qwen35Model::forward(const TensorView& ids, const data::PackedSeqParams& psp,
                                                const layers::LmTargets& targets,
                                                std::optional<float> backward_scale) {
  DT_CHECK(targets.labels.numel() == psp.tokens_cp(), "Qwen35Model: labels {} must hold T/cp={} rows",
           targets.labels.view().str(), psp.tokens_cp());
  Tensor hn = final_hidden(ids, psp);
  psp_ = &psp;
  return head_->forward(hn, targets, backward_scale);
}

Tensor Qwen35Model::final_hidden(const TensorView& ids, const data::PackedSeqParams& psp) {
  const int tp = ctx_.pg->dims.tp, cp = ctx_.pg->dims.cp;
  const int sp = ctx_.sp && tp > 1 ? tp : 1;
  DT_CHECK(psp.cp() == cp && psp.cp_rank() == ctx_.pg->coord.cp && psp.sp() == sp,
           "Qwen35Model: the batch metadata has cp={} cp_rank={} sp={}, the layout cp={} cp_rank={} sp={}", psp.cp(),
           psp.cp_rank(), psp.sp(), cp, ctx_.pg->coord.cp, sp);
  DT_CHECK(ids.numel() == psp.tokens_cp(), "Qwen35Model: ids {} must hold T/cp={} rows", ids.str(), psp.tokens_cp());
  T_local_ = psp.tokens_local();
  const Shape hs{T_local_, cfg_.hidden_size};
  Tensor h = Tensor::empty(hs, ctx_.act_dtype, ctx_.device);  // [T_local, H] residual stream
  embed_->forward(h, ids);
  for (auto& l : layers_) l->forward(h, psp);
  Tensor hn = Tensor::empty(hs, ctx_.act_dtype, ctx_.device);  // [T_local, H] final-norm output
  norm_->forward(hn, h);
  return hn;
}

Tensor Qwen35Model::logits(const TensorView& ids, const data::PackedSeqParams& psp) {
  Tensor hn = final_hidden(ids, psp);
  psp_ = nullptr;  // the layers' saved state is not a forward of the loss
  Tensor out = Tensor::empty(Shape{psp.tokens_cp(), cfg_.vocab_size}, DType::f32, ctx_.device);  // [T/cp, V]
  head_->logits(out, hn);
  return out;
}

void Qwen35Model::backward(float scale, const std::function<void(int64_t)>& layer_done) {
  DT_CHECK(psp_ != nullptr, "Qwen35Model: backward without forward");
  const Shape hs{T_local_, cfg_.hidden_size};
  Tensor dhn = Tensor::empty(hs, ctx_.act_dtype, ctx_.device);  // [T_local, H] d(final-norm output)
  Tensor dh = Tensor::empty(hs, ctx_.act_dtype, ctx_.device);   // [T_local, H] d(residual stream)
  head_->backward(dhn, scale);
  norm_->backward(dh, dhn);
  for (int64_t i = int64_t(layers_.size()) - 1; i >= 0; --i) {
    layers_[size_t(i)]->backward(dh, *psp_);
    if (layer_done) layer_done(i);
  }
  embed_->backward(dh);
  psp_ = nullptr;
}

GlobalLoss global_loss(const layers::LmHeadLoss::Result& local, const dist::ProcessGroups& pg, Stream s) {
  // Reduced where the loss lives (NCCL communicators take device tensors), read back once.
  const Device dev = local.loss_sum.device();
  Tensor sum = Tensor::empty(Shape{1}, DType::f32, dev);  // [1] f32
  ops::copy(sum, local.loss_sum, s);
  Tensor cnt = Tensor::empty(Shape{1}, DType::i64);  // [1] i64
  cnt.ptr<int64_t>()[0] = local.count;
  if (!dev.is_cpu()) cnt = ops::to_device(cnt, dev, s);
  if (pg.dp_cp && pg.dp_cp->size() > 1) {
    pg.dp_cp->all_reduce(sum, dist::ReduceOp::sum, s);
    pg.dp_cp->all_reduce(cnt, dist::ReduceOp::sum, s);
  }
  GlobalLoss g;
  g.sum = double(ops::item(sum, s));
  g.count = ops::to_host(cnt, s).ptr<int64_t>()[0];
  return g;
}

}  // namespace dt::model
