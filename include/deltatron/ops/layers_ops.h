// The per-token op families of the dense layers (issue 5): the Qwen3.5 RMSNorm with (1 + w),
// SwiGLU, the vocab-parallel embedding gather/scatter and the vocab-parallel cross-entropy
// pieces. One header for the four families (each is a handful of launchers); one file per family
// and backend: src/ops/cpu/<family>.cpp (the fp32 reference) and src/ops/cuda/<family>.cu.
// Every op routes by the device of its first view (src/ops/layers_ops.cpp). Activations: f32 on
// the CPU, f32 or bf16 on CUDA (one dtype per view, math in fp32). Outputs marked (=) are
// overwritten, parameter gradients marked (+=) accumulate. Every op is deterministic: no
// atomics; reductions run in an order fixed by the shape.
#pragma once
#include <cstdint>

#include "deltatron/core/tensor.h"

namespace dt::ops {

// ---- rmsnorm1p: HF Qwen3_5RMSNorm (gdn-math.md 8.2), per row over the last dim D ---------------
//   rstd = 1 / sqrt(mean_j x_j^2 + eps);  xh = x * rstd;  y = xh * (1 + w)
//   backward: g = dy * (1 + w);  dx = rstd * (g - xh * mean_j(g_j * xh_j));  dw += sum_rows dy * xh
// x, y, dy, dx: [rows, D] (row stride arbitrary, unit inner stride); w, dw: [D] f32 contiguous;
// rstd: [rows] f32 contiguous (=, saved by the forward for the backward).
void rmsnorm1p_fwd(const TensorView& y, const TensorView& rstd, const TensorView& x, const TensorView& w, float eps,
                   Stream s = {});
void rmsnorm1p_bwd(const TensorView& dx, const TensorView& dw, const TensorView& dy, const TensorView& x,
                   const TensorView& w, const TensorView& rstd, Stream s = {});

// ---- swiglu: y = silu(g) * u, elementwise -------------------------------------------------------
//   backward: sg = sigmoid(g);  du = dy * g * sg;  dg = dy * u * sg * (1 + g * (1 - sg))
// g, u, y, dy, dg, du: [T, F] (row stride arbitrary, unit inner stride: g and u may be the two
// column halves of one [T, 2F] gate|up buffer). y, dg, du (=).
void swiglu_fwd(const TensorView& y, const TensorView& g, const TensorView& u, Stream s = {});
void swiglu_bwd(const TensorView& dg, const TensorView& du, const TensorView& dy, const TensorView& g,
                const TensorView& u, Stream s = {});

// ---- embedding: vocab-parallel gather and its deterministic scatter-add --------------------------
// This rank owns vocab rows [vocab_begin, vocab_begin + V_l).
//   forward:  y[t] = w[ids[t] - vocab_begin] when ids[t] is owned, else 0              y (=)
//   backward: dw[v] += sum over t with ids[t] = vocab_begin + v of dy[t], in token order  dw (+=)
// ids: [T] i32 contiguous (any value; ids outside the range are skipped); w: [V_l, H] f32|bf16;
// y, dy: [T, H] (row stride arbitrary); dw: [V_l, H] f32 contiguous. CUDA backward: a stable
// radix sort of (id, t) groups the tokens of each row in token order, then one block per row
// sums its tokens in that order (no atomics).
void embedding_fwd(const TensorView& y, const TensorView& ids, const TensorView& w, int64_t vocab_begin,
                   Stream s = {});
void embedding_bwd(const TensorView& dw, const TensorView& dy, const TensorView& ids, int64_t vocab_begin,
                   Stream s = {});

// ---- cross entropy over vocab-parallel logits ----------------------------------------------------
// logits: [T, V_l] f32|bf16 (row stride arbitrary), this rank's vocab columns [vocab_begin,
// vocab_begin + V_l). targets: [T] i32 global vocab ids; < 0 means "predicts nothing". All
// per-row vectors are [T] f32 contiguous. The protocol (LmHeadLoss) with the tp reductions:
//   ce_stats        m = max_j l_j,  se = sum_j exp(l_j - m),  tl = l[target] if owned else 0
//                   (one read of the logits: online softmax)
//   under tp > 1:   M = all-reduce MAX of m;  ce_rescale  se *= exp(m - M)  (this rank's sum
//                   relative to the global max);  then all-reduce SUM of [se | tl] (one [2, T]
//                   buffer); m := M
//   ce_loss         loss = log(se) + m - tl if target >= 0 else 0
//   ce_bwd          dl_j = scale * (exp(l_j - m) / se - [j == target]) if target >= 0 else 0
// m, se, tl, loss (=); se (=) in place for ce_rescale (factor exactly 1 where m == M); dlogits
// [T, V_l] (=) f32|bf16 (row stride arbitrary; on CUDA f32 logits may give bf16 dlogits, the dtype
// of the GEMMs that follow). Natural exp. -inf logits add exactly 0 to se (a row of them gives
// m = -inf, se = 0); a NaN logit makes se NaN (the loss guard sees it).
void ce_stats(const TensorView& m, const TensorView& se, const TensorView& tl, const TensorView& logits,
              const TensorView& targets, int64_t vocab_begin, Stream s = {});
void ce_rescale(const TensorView& se, const TensorView& m, const TensorView& m_global, Stream s = {});
void ce_loss(const TensorView& loss, const TensorView& m, const TensorView& se, const TensorView& tl,
             const TensorView& targets, Stream s = {});
void ce_bwd(const TensorView& dlogits, const TensorView& logits, const TensorView& m, const TensorView& se,
            const TensorView& targets, int64_t vocab_begin, float scale, Stream s = {});

}  // namespace dt::ops
