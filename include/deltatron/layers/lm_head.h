// Vocab-parallel LM head with the vocab-parallel cross entropy (HF lm_head.weight [vocab, H], or
// model.embed_tokens.weight under tie_word_embeddings). TP rank t owns the vocab rows
// [t V/tp, (t+1) V/tp). Per rank, with T_cp = T/cp rows and V_t = V/tp:
//   h [T_local, H] ─all-gather(tp, SP)─▶ hg [T_cp, H]; then per chunk of <= chunk_tokens rows:
//   logits = hg W_t^T [n, V_t] (activation dtype) ─ce_stats (one read: local max m_t, sum exp relative to it,
//   target logit)─▶ all-reduce MAX(tp) -> M; se_t *= exp(m_t - M) ─▶ all-reduce SUM(tp) of [2, n]
//   ─▶ loss_t = log(se) + M - l_target  (0 where nothing is predicted)
// Full-vocab logits never exist on one rank; at most [chunk_tokens, V_t] at a time, in the
// activation dtype (bf16 on CUDA, as HF's and Megatron's logits; fp32 statistics on top of them;
// f32 on the CPU). The gradient overwrites its chunk of logits in place (dlogits, same dtype).
// Targets (targets_from_labels of the packer's labels; next_token_targets inside one sequence):
// token x of a document predicts token x + 1 of the SAME document; the last real token of a
// document and padding predict nothing (label -1). forward returns the
// loss SUM over this CP rank's predicted tokens (identical on the TP ranks of a group) and their
// COUNT; the caller all-reduces both over dp x cp and divides once: loss = sum / count. A rank
// with no predicted token contributes 0 and 0 (never NaN).
// The gradient, with scale = d(total loss)/d(loss sum) (1 / global count for the mean), per chunk:
//   dlogits = scale (softmax - onehot) ; dW_t += dlogits^T hg ; dhg = dlogits W_t
//   then ─reduce-scatter(tp, SP) | all-reduce(tp)─▶ dh. Two modes, the same operations on the same
//   values per chunk (bitwise equal on the CPU backend, tested):
// * two-pass: forward(h, targets) saves hg and the statistics; backward(dh, scale) recomputes
//   each chunk's logits (a second logits GEMM and a second write and read of the chunk).
// * fused: forward(h, targets, scale), when the scale is known before the forward (the trainer
//   knows its global count before any micro-batch runs): each chunk's gradient is computed while
//   its logits are live, so no recompute; forward saves dhg [T_cp, H] (activation dtype) and
//   backward(dh, scale) only finishes the TP reduction (and checks that scale is the same).
//   dW is accumulated during the forward: a fused forward must be followed by its backward.
// dW accumulates (+=); TP shards are disjoint, reduce_grads sums over dp x cp.
#pragma once
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "deltatron/data/packed_seq.h"
#include "deltatron/layers/common.h"
#include "deltatron/model/param.h"

namespace dt::layers {

struct LmHeadConfig {
  int64_t vocab = 0;
  int64_t hidden = 0;
  float init_std = 0.02f;
  bool tie_word_embeddings = false;
  // Rows of logits alive at once; 0: as many as fit 1 GiB of logits [rows, V/tp] of elem_bytes
  // each (the activation dtype), at most 4096, a multiple of 64 (vocab 248320: 2112 rows in
  // bf16, 1024 in f32). Fewer, larger chunks halve the f32 dW read-modify-writes of the dW GEMMs.
  int64_t chunk_tokens = 0;
  int64_t chunk_rows(int tp, int64_t elem_bytes) const;
};

// Next-token targets of this CP rank's rows, built on the host once per micro-batch.
struct LmTargets {
  Tensor labels;      // [T/cp] i32 on the device: global vocab id of the next token, or -1
  int64_t count = 0;  // labels >= 0 (this CP rank)
};
// ids_global: the packed token ids [T] of the whole micro-batch (all CP ranks), host.
LmTargets next_token_targets(std::span<const int32_t> ids_global, const data::PackedSeqParams& psp, Device dev,
                             Stream s = {});
// The packer's labels [T] (data::MicroBatch::labels: the next token of the same document, across
// the boundary of a split document's pieces; -1 on pads and documents' last tokens) as this CP
// rank's targets: what training and eval use, so that a split document loses no target.
LmTargets targets_from_labels(std::span<const int32_t> labels_global, const data::PackedSeqParams& psp, Device dev,
                              Stream s = {});

class LmHeadLoss {
 public:
  // tied: the embedding's weight Param (same [V, H] vocab-parallel shard) under
  // tie_word_embeddings; then this layer owns no parameter and adds its gradient to tied->grad.
  LmHeadLoss(const LmHeadConfig& cfg, const RunCtx& ctx, model::Param* tied = nullptr);
  static std::vector<model::ParamSpec> param_specs(const LmHeadConfig& cfg);  // empty when tied
  static std::string check_layout(const LmHeadConfig& cfg, int tp);

  std::vector<model::Param>& params() { return params_; }
  model::Param& weight() { return tied_ ? *tied_ : params_[0]; }
  int64_t vocab_begin() const { return vocab_begin_; }

  struct Result {
    Tensor loss_sum;    // [1] f32 on the device: sum of the token losses of this CP rank
    int64_t count = 0;  // predicted tokens of this CP rank (host)
  };
  // h: [T_local, H] act_dtype (the final-norm output). Without backward_scale (two-pass mode)
  // saves hg, labels, row max and sum-exp for backward; with it (fused mode) computes the
  // gradient of backward_scale * loss_sum too (dW += now) and saves only dhg.
  Result forward(const TensorView& h, const LmTargets& targets, std::optional<float> backward_scale = {});
  // dh (=): like h. scale: gradient of the total loss w.r.t. loss_sum (1 / global count); after
  // a fused forward it must equal that forward's backward_scale.
  void backward(const TensorView& dh, float scale);
  // Full-vocab logits of this CP rank's rows for eval and dumps (no loss, nothing saved):
  // h [T_local, H] as in forward -> out (=) [T_cp, V] f32 on every TP rank (each rank's
  // [T_cp, V/tp] vocab slice, all-gathered over TP). Materialises [T_cp, V]: meant for eval-sized
  // batches, never for training.
  void logits(const TensorView& out, const TensorView& h);

 private:
  LmHeadConfig cfg_;
  RunCtx ctx_;
  int tp_ = 1;
  bool sp_ = false;
  int64_t vocab_begin_ = 0;
  model::Param* tied_ = nullptr;
  std::vector<model::Param> params_;
  Tensor hg_, labels_, m_, se_;  // two-pass: [T_cp, H] act, [T_cp] i32, [T_cp] f32 (global over tp) x2
  Tensor dhg_;                   // fused: [T_cp, H] act, this rank's partial dh before the TP reduction
  std::optional<float> fused_scale_;

  // Statistics and token losses of rows [c0, c0 + n) from their logits lg [n, V_t] (act dtype),
  // into m_, se_ (global over tp) and loss [T_cp]; labels_ set.
  void chunk_stats(const TensorView& lg, int64_t c0, const TensorView& loss);
  // Gradient of rows [c0, c0 + n): lg [n, V_t] becomes dl in place, dW += dl^T hc, dhc (=) dl W.
  void chunk_grad(const TensorView& lg, int64_t c0, const TensorView& hc, const TensorView& dhc, float scale);
};

}  // namespace dt::layers
