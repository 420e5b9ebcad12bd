// The Qwen3.5 hybrid text model (HF Qwen3_5ForCausalLM semantics) assembled from the layers,
// forward and backward by hand, under TP/SP/CP (DP is the caller's: one micro-batch per rank).
//
//   ids [T/cp] ─VocabEmbedding─▶ h [T_local, H]
//   for each layer N (type from resolved_layer_types: HF names, looked up in the mixer registry)
//     h = h + mixer(input_layernorm(h))          mixer: linear_attention = GatedDeltaNet,
//     h = h + mlp(post_attention_layernorm(h))          full_attention  = GatedAttention
//   ─model.norm─▶ LmHeadLoss (tied to model.embed_tokens.weight under tie_word_embeddings)
//   ─▶ (loss SUM, predicted COUNT) of this CP rank's rows.
// Hidden states between layers are [T_local, H] with T_local = T/(cp*sp) (sp = tp under SP,
// else 1): the zig-zag rows of this CP rank, SP-split over TP as Megatron's sequence parallelism
// does, replicated over TP without SP. Every layer takes and returns exactly that shape (the
// embedding reduce-scatters into it, the mixers, MLP and LM head gather from it), so the
// residual adds and the norms are purely local.
//
// Parameters are created by the layers from their ParamSpecs and initialised from the seed by
// global element index (model/param.h), so the weights never depend on the layout. params()
// lists each Param once (a tied LM head adds none): the table the optimizer, model::reduce_grads,
// the grad norm and checkpoints read. Names are HF's: model.embed_tokens.weight,
// model.layers.N.{input_layernorm,post_attention_layernorm}.weight, model.layers.N.linear_attn.*
// | model.layers.N.self_attn.*, model.layers.N.mlp.*, model.norm.weight, lm_head.weight.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "deltatron/data/packed_seq.h"
#include "deltatron/io/config.h"
#include "deltatron/layers/attention.h"
#include "deltatron/layers/common.h"
#include "deltatron/layers/embedding.h"
#include "deltatron/layers/gdn.h"
#include "deltatron/layers/lm_head.h"
#include "deltatron/layers/mlp.h"
#include "deltatron/layers/norm.h"
#include "deltatron/model/param.h"

namespace dt::model {

// Layer configs derived from the HF-named model config.
layers::GdnConfig gdn_config(const io::ModelConfig& m);
layers::AttentionConfig attention_config(const io::ModelConfig& m);
layers::MlpConfig mlp_config(const io::ModelConfig& m);
layers::EmbeddingConfig embedding_config(const io::ModelConfig& m);
layers::LmHeadConfig lm_head_config(const io::ModelConfig& m);

// The token mixer of a decoder layer, whatever its type. Same contract as the layers:
// x [T_local, H] -> y (=) [T_local, H]; backward writes dx (=) and accumulates (+=) the
// parameter gradients.
class Mixer {
 public:
  virtual ~Mixer() = default;
  virtual std::vector<Param>& params() = 0;
  // The next forward's x, unwritten until backward: kept instead of copied (layers::LentInput).
  virtual void lend_input(Tensor x) = 0;
  virtual void forward(const TensorView& y, const TensorView& x, const data::PackedSeqParams& psp) = 0;
  virtual void backward(const TensorView& dx, const TensorView& dy, const data::PackedSeqParams& psp) = 0;
};

// One registry entry per HF layer type (style guide 7): the factory, the parameter table
// (shapes, TP split, HF names) and the layout rule. The model loop does one lookup per layer.
struct MixerEntry {
  std::string layer_type;  // HF layer_types value: "linear_attention" | "full_attention"
  std::string module;      // HF module name under model.layers.N: "linear_attn" | "self_attn"
  std::function<std::unique_ptr<Mixer>(const io::ModelConfig&, const std::string& prefix, const layers::RunCtx&)>
      make;
  std::function<std::vector<ParamSpec>(const io::ModelConfig&, const std::string& prefix)> param_specs;
  std::function<std::string(const io::ModelConfig&, int tp, int cp)> check_layout;  // "" when it fits
};
const std::vector<MixerEntry>& mixer_registry();
// The entry of `layer_type`, or nullptr.
const MixerEntry* find_mixer(const std::string& layer_type);

// h = h + mixer(input_layernorm(h)); h = h + mlp(post_attention_layernorm(h)), in place.
class DecoderLayer {
 public:
  // index: N of model.layers.N; layer_type: an HF layer type with a registry entry.
  DecoderLayer(const io::ModelConfig& cfg, int64_t index, const std::string& layer_type, const layers::RunCtx& ctx);

  const std::string& layer_type() const { return type_; }
  // Appends every parameter of the layer (norms, mixer, MLP) in HF order.
  void collect_params(std::vector<Param*>& out);

  // The sub-blocks, for benchmarks that time them alone.
  Mixer& mixer() { return *mixer_; }
  layers::SwiGluMlp& mlp() { return *mlp_; }

  // h: [T_local, H], updated in place (input -> output). Saves what backward needs.
  void forward(const TensorView& h, const data::PackedSeqParams& psp);
  // dh: [T_local, H], in place: the gradient w.r.t. the output becomes the gradient w.r.t. the
  // input. Accumulates the parameter gradients.
  void backward(const TensorView& dh, const data::PackedSeqParams& psp);

 private:
  std::string type_;
  layers::RunCtx ctx_;
  std::unique_ptr<layers::RmsNorm1p> input_norm_, post_norm_;
  std::unique_ptr<Mixer> mixer_;
  std::unique_ptr<layers::SwiGluMlp> mlp_;
};

class Qwen35Model {
 public:
  // Builds and initialises every parameter from ctx.seed; the layout comes from *ctx.pg and
  // ctx.sp. A config that does not fit the layout is a user_error naming the field.
  Qwen35Model(const io::ModelConfig& cfg, const layers::RunCtx& ctx);

  // "" when every layer fits (tp, cp) (head counts, vocab, intermediate size, layer types),
  // else the first config error.
  static std::string check_layout(const io::ModelConfig& cfg, int tp, int cp);
  // The global parameter table in params() order (sp: the norms' grad_sum_tp rule).
  static std::vector<ParamSpec> param_specs(const io::ModelConfig& cfg, bool sp);

  const io::ModelConfig& config() const { return cfg_; }
  int64_t num_layers() const { return int64_t(layers_.size()); }
  DecoderLayer& layer(int64_t i) { return *layers_.at(size_t(i)); }
  layers::VocabEmbedding& embedding() { return *embed_; }
  // Every Param once, in HF order: embedding, layers, final norm, lm_head (unless tied).
  std::vector<Param*> params();
  Param* find_param(const std::string& name);  // nullptr when absent

  // ids: [T/cp] i32 (this CP rank's zig-zag rows: layers::local_token_ids); psp: the
  // micro-batch metadata built with sp = (ctx.sp ? tp : 1) and this rank's cp; targets:
  // layers::targets_from_labels (or next_token_targets). Returns this CP rank's loss SUM and predicted COUNT (as
  // LmHeadLoss does): all-reduce both over dp x cp (global_loss) and divide once.
  // backward_scale: the scale the backward will get, when known now (training): the LM head then
  // computes its gradient chunk by chunk during the forward (LmHeadLoss's fused mode: no logits
  // recompute); the backward must get the same scale.
  layers::LmHeadLoss::Result forward(const TensorView& ids, const data::PackedSeqParams& psp,
                                     const layers::LmTargets& targets, std::optional<float> backward_scale = {});
  // Reverse pass of the last forward through every layer; scale = d(total loss)/d(loss sum),
  // i.e. 1 / (global predicted count) for the mean loss. Parameter gradients accumulate (+=);
  // model::reduce_grads completes them.
  // layer_done(i), when given, runs right after layer i's backward (in reverse order): its
  // parameter gradients are complete for this micro-batch from then on (the trainer starts
  // their reduction while the backward goes on).
  void backward(float scale, const std::function<void(int64_t)>& layer_done = {});
  // Eval: the full-vocab logits [T/cp, V] f32 of this CP rank's rows (zig-zag order), the same
  // on every TP rank. ids and psp as in forward. No backward may follow.
  Tensor logits(const TensorView& ids, const data::PackedSeqParams& psp);

 private:
  // Embedding -> layers -> final norm: the LM head input [T_local, H] of this rank.
  Tensor final_hidden(const TensorView& ids, const data::PackedSeqParams& psp);

  io::ModelConfig cfg_;
  layers::RunCtx ctx_;
  std::unique_ptr<layers::VocabEmbedding> embed_;
  std::vector<std::unique_ptr<DecoderLayer>> layers_;
  std::unique_ptr<layers::RmsNorm1p> norm_;
  std::unique_ptr<layers::LmHeadLoss> head_;
  const data::PackedSeqParams* psp_ = nullptr;  // of the last forward (alive until backward)
  int64_t T_local_ = 0;
};

// The loss of one step over every rank: loss_sum and count all-reduced over dp x cp (the TP
// ranks of a group hold the same values). mean() is 0 when nothing was predicted.
struct GlobalLoss {
  double sum = 0;
  int64_t count = 0;
  double mean() const { return count > 0 ? sum / double(count) : 0.0; }
};
GlobalLoss global_loss(const layers::LmHeadLoss::Result& local, const dist::ProcessGroups& pg, Stream s = {});

}  // namespace dt::model
