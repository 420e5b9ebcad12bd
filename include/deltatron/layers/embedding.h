// Vocab-parallel token embedding (HF model.embed_tokens.weight [vocab, H]). TP rank t owns the
// vocab rows [t V/tp, (t+1) V/tp) and gathers the rows of the tokens it owns (zeros elsewhere):
//   ids [T/cp] (this CP rank's zig-zag rows, every TP rank the same) ─gather─▶ [T/cp, H] partial
//   ─all-reduce(tp) | reduce-scatter(tp, SP)─▶ y [T_local, H]
// Backward: dy ─all-gather(tp, SP)─▶ [T/cp, H]; dW[v] += sum of dy over the tokens with id v
// (deterministic scatter-add, ops::embedding_bwd) on the owned rows only. The TP shards are
// disjoint, so the gradient needs no TP sum; reduce_grads sums it over dp x cp.
// Under tie_word_embeddings the LM head reads the same Param (LmHeadLoss takes it).
#pragma once
#include <span>
#include <vector>

#include "deltatron/data/packed_seq.h"
#include "deltatron/layers/common.h"
#include "deltatron/model/param.h"

namespace dt::layers {

struct EmbeddingConfig {
  int64_t vocab = 0;   // vocab_size (global)
  int64_t hidden = 0;
  float init_std = 0.02f;
};

class VocabEmbedding {
 public:
  VocabEmbedding(const EmbeddingConfig& cfg, const RunCtx& ctx);
  static std::vector<model::ParamSpec> param_specs(const EmbeddingConfig& cfg);
  // "" when tp divides vocab_size, else the config error.
  static std::string check_layout(const EmbeddingConfig& cfg, int tp);

  std::vector<model::Param>& params() { return params_; }
  model::Param& weight() { return params_[0]; }
  int64_t vocab_begin() const { return vocab_begin_; }

  // ids: [T/cp] i32 on the device; y (=): [T/cp / sp, H] act_dtype (sp = tp under SP, else 1).
  void forward(const TensorView& y, const TensorView& ids);
  // dy: like y. Accumulates (+=) into weight().grad; after defer_next_backward() it keeps its
  // rows and ids instead (weight().grad untouched), for apply_deferred.
  void backward(const TensorView& dy);

  // train.overlap_embedding_reduce: the weight's dp x cp gradient all-reduce can start before
  // the last backward when that backward's rows stay out of it. The next backward keeps its rows
  // and ids padded to max_rows (the largest T/cp a micro-batch can have, the same on every rank);
  // apply_deferred, called on every rank of `group` once the all-reduce is complete, all-gathers
  // them and adds them in rank order, then token order: the same bits on every rank, so the
  // replicas stay equal.
  void defer_next_backward(int64_t max_rows) { defer_rows_ = max_rows; }
  void apply_deferred(dist::Communicator& group, Stream s);

 private:
  EmbeddingConfig cfg_;
  RunCtx ctx_;
  int tp_ = 1;
  bool sp_ = false;
  int64_t vocab_begin_ = 0;
  std::vector<model::Param> params_;
  Tensor ids_;  // saved [T/cp] i32
  int64_t defer_rows_ = 0;               // > 0: the next backward is deferred, padded to this
  Tensor deferred_rows_, deferred_ids_;  // [max_rows, H] act_dtype, [max_rows] i32
};

// This CP rank's token ids [T/cp] (zig-zag rows) of the global packed ids [T] (host), uploaded to
// `dev` as i32: the input of VocabEmbedding::forward.
Tensor local_token_ids(std::span<const int32_t> ids_global, const data::PackedSeqParams& psp, Device dev,
                       Stream s = {});

}  // namespace dt::layers
