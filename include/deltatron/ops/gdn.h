// Gated DeltaNet kernel families (../shared/docs/gdn-math.md). Each op dispatches on the
// device of its views: CPU reference (src/ops/cpu/<family>.cpp, fp32 views; the templated
// float64 versions in include/deltatron/ops/cpu/gdn_ref.h serve finite-difference tests) or
// CUDA (src/ops/cuda/<family>.cu, bf16 or f32 activations, fp32 math).
//
// Conventions: activations are token-major THD views; every sequence boundary comes from
// the VarlenMeta (padded boundaries). Activation gradients are OVERWRITTEN (=); parameter
// gradients ACCUMULATE (+=) and are always f32. Reductions are deterministic (no atomics).
// Scratch comes from the caching allocator (no cudaMalloc once warm).
#pragma once
#include "deltatron/core/tensor.h"
#include "deltatron/ops/varlen.h"

namespace dt::ops {

// ---- 1. causal_conv1d_varlen (gdn-math.md section 7) ----------------------------------------
// y[t, c] = act( bias[c] + sum_{i<W} w[c, i] * x[t - (W-1) + i, c] ), where positions before the
// start of t's sequence read 0. act = SiLU when `silu`, identity otherwise.
//   x, y: [T, D] (bf16|f32; rows may be strided, unit inner stride)
//   w:    [D, W] f32 (HF conv1d.weight [D, 1, W] viewed as [D, W]), 2 <= W <= 8
//   bias: [D] f32 or an empty view
void causal_conv1d_fwd(const TensorView& y, const TensorView& x, const TensorView& w, const TensorView& bias,
                       bool silu, const VarlenMeta& m, Stream s = {});
// dx (=) [T, D]; dw (+=) [D, W] f32; dbias (+=) [D] f32 or empty.
void causal_conv1d_bwd(const TensorView& dx, const TensorView& dw, const TensorView& dbias, const TensorView& dy,
                       const TensorView& x, const TensorView& w, const TensorView& bias, bool silu,
                       const VarlenMeta& m, Stream s = {});

// ---- 2. l2norm over the last dim (gdn-math.md section 6) ----------------------------------
// y = x * rstd, rstd = 1 / sqrt(sum(x^2) + eps) per row (eps inside the root of the SUM).
//   x, y: [rows, d] (bf16|f32; rows may be strided); rstd: [rows] f32 (saved for backward)
void l2norm_fwd(const TensorView& y, const TensorView& rstd, const TensorView& x, float eps = 1e-6f, Stream s = {});
// dx = rstd * (dy - y * sum(dy * y)), with y recomputed from x and rstd.
void l2norm_bwd(const TensorView& dx, const TensorView& dy, const TensorView& x, const TensorView& rstd,
                Stream s = {});

// The same from the normalised y itself, as causal_conv1d_l2norm_fwd leaves it (x is never
// stored): dx = rstd * (dy - y * sum(dy * y)). Equal to l2norm_bwd up to y's rounding (f32
// views on CUDA: the same bits, since l2norm_bwd recomputes y = x * rstd exactly as stored).
void l2norm_bwd_y(const TensorView& dx, const TensorView& dy, const TensorView& y, const TensorView& rstd,
                  Stream s = {});

// ---- 3. gates (gdn-math.md section 1.1, B9, B10) -----------------------------------------
// g = -exp(A_log[h]) * softplus(a + dt_bias[h]) (softplus(x) = x for x > 20), beta = sigmoid(b).
//   a, b: [T, Hv] (bf16|f32; rows may be strided); A_log, dt_bias: [Hv] f32; g, beta: [T, Hv] f32
void gdn_gate_fwd(const TensorView& g, const TensorView& beta, const TensorView& a, const TensorView& b,
                  const TensorView& A_log, const TensorView& dt_bias, Stream s = {});
// da, db (=) [T, Hv] like a, b; dA_log, ddt_bias (+=) [Hv] f32. dg, dbeta: [T, Hv] f32.
void gdn_gate_bwd(const TensorView& da, const TensorView& db, const TensorView& dA_log, const TensorView& ddt_bias,
                  const TensorView& dg, const TensorView& dbeta, const TensorView& a, const TensorView& b,
                  const TensorView& A_log, const TensorView& dt_bias, Stream s = {});

// ---- 1 + 3. causal_conv1d_varlen and the gates in one call ---------------------------------
// Exactly causal_conv1d_fwd followed by gdn_gate_fwd (backward: causal_conv1d_bwd and
// gdn_gate_bwd), with the same argument rules. y, dx, dw, dbias, g, beta, da, db are the same
// bits as the two ops; dA_log and ddt_bias are summed over another fixed tiling (within fp32
// rounding, deterministic). On CUDA the gates run as extra blocks at the front of the conv
// launch: alone they move too few bytes (~13 MB) to hide their launch and DRAM round trip
// (docs/perf.md); on the CPU the two ops run in turn. The layer uses these.
struct GdnGateFwdViews {
  TensorView g, beta, a, b, A_log, dt_bias;
};
struct GdnGateBwdViews {
  TensorView da, db, dA_log, ddt_bias, dg, dbeta, a, b, A_log, dt_bias;
};
void causal_conv1d_gate_fwd(const TensorView& y, const TensorView& x, const TensorView& w, const TensorView& bias,
                            bool silu, const VarlenMeta& m, const GdnGateFwdViews& gate, Stream s = {});
void causal_conv1d_gate_bwd(const TensorView& dx, const TensorView& dw, const TensorView& dbias,
                            const TensorView& dy, const TensorView& x, const TensorView& w, const TensorView& bias,
                            bool silu, const VarlenMeta& m, const GdnGateBwdViews& gate, Stream s = {});

// ---- 1 (+ 3) + 2. conv1d over [q | k | v] with the L2 norm of the q and k heads -------------
// Exactly causal_conv1d_gate_fwd (gate given) or causal_conv1d_fwd into c = [c_q | c_k | c_v],
// then l2norm_fwd(qn, rq, c_q) and l2norm_fwd(kn, rk, c_k) per head of dk, except that c_q and
// c_k are never stored: qn, kn, rq, rk, v (= c_v) and the gates are the same bits as those ops'.
// CUDA: one launch when dk divides 256 (each 16-row tile's q|k outputs are normalised in shared
// memory: no [T, 2 Hk dk] round trip through DRAM), else the ops in turn; CPU: the ops in turn.
//   x: [T, 2 Hk dk + Dv] (the projection's q|k|v columns; rows may be strided); w, bias as above;
//   qn, kn: [T, Hk, dk] contiguous; rq, rk: [T * Hk] f32; v: [T, Dv] (rows may be strided; Dv may be
//   0, then x is only the q|k columns and the same q, k bits come out: the GDN backward's rebuild
//   of q, k alone under gdn.recompute_v=false)
struct ConvNormOut {
  TensorView qn, kn, rq, rk, v;
};
void causal_conv1d_l2norm_fwd(const ConvNormOut& out, const TensorView& x, const TensorView& w,
                              const TensorView& bias, bool silu, float eps, const VarlenMeta& m,
                              const GdnGateFwdViews* gate, Stream s = {});

// Its backward: exactly l2norm_bwd_y(dc_q, dq, qn, rq) and l2norm_bwd_y(dc_k, dk, kn, rk) into
// dc = [dc_q | dc_k | dv], then causal_conv1d_gate_bwd (gate given) or causal_conv1d_bwd with
// dy = dc, except that dc_q, dc_k are never stored: dx, dw, dbias (and the gates' gradients) are
// the same bits. CUDA: one launch when each head row's chunks are one group of l2norm's lanes (dk
// a power of two, 16..256 in bf16, 16..128 in f32: each tile's q|k rows are transformed in
// shared memory as they land), else the ops in turn; CPU: the ops in turn.
//   dq, dk, qn, kn: [T, Hk, dk] contiguous; rq, rk: [T * Hk] f32; dv: [T, Dv] (rows may be strided)
struct ConvNormGrad {
  TensorView dq, dk, qn, kn, rq, rk, dv;
};
void causal_conv1d_l2norm_bwd(const TensorView& dx, const TensorView& dw, const TensorView& dbias,
                              const ConvNormGrad& grad, const TensorView& x, const TensorView& w,
                              const TensorView& bias, bool silu, const VarlenMeta& m, const GdnGateBwdViews* gate,
                              Stream s = {});

// ---- 4. chunk_gated_delta_rule_varlen (gdn-math.md sections 2-5) --------------------------
// Per sequence n and v-head h (key head h / (Hv/Hk)), token by token:
//   S <- exp(g_t) S;  u = beta_t (v_t - S^T k_t);  S <- S + k_t u^T;  o_t = scale * S^T q_t
// with S = h0[n, h] (or 0) at the sequence start; ht[n, h] = S at its end.
//   q, k: [T, Hk, dk]; v, o: [T, Hv, dv] (bf16|f32, one dtype); g, beta: [T, Hv] f32 (g: natural
//   log decay per token, NOT cumulated); h0, ht: [N, Hv, dk, dv] f32 or empty views.
//   v and (backward) dv may be token-strided: packed [Hv, dv] rows, any token stride (CUDA: a
//   multiple of 16 bytes, 16-byte aligned start), e.g. v's columns of the conv output read in
//   place; every other activation is contiguous on CUDA.
// Forward intermediates handed to the backward, which then skips recomputing them (the prep
// and state kernels: ~1.9 of 9.7 ms fwd+bwd at bench shape (a)); bitwise the same result.
// CUDA only: the CPU recurrence ignores it. Memory: gamma [T, Hv] f32; W, Delta [T, Hv, dk|dv]
// and Tm, P = (Q K^T) (.) Gamma [NT, Hv, 64, 64] in the input dtype; chunk states h [NT, Hv, dk,
// dv] (NT = chunks): about 5x the bytes of v. Give the same object to gdn_chunk_fwd (fills it) and gdn_chunk_bwd
// (reads it); clear it after the backward.
struct GdnChunkSaved {
  std::vector<Tensor> tensors;  // opaque to callers
  const char* fwd_form = "";    // the CUDA forward that filled it (DT_GDN_FWD: "split", "fused", "split_tma")
  bool defined() const { return !tensors.empty(); }
  void clear() {
    tensors.clear();
    fwd_form = "";
  }
};
// The gated RMSNorm of the output (section 5 below) as part of the forward: exactly
// gated_rmsnorm_fwd(y, rstd, o, z, w, eps) after the chunk rule (o is still written). CUDA
// (unless DT_GDN_OUT_NORM=0): in the out kernel's epilogue (the o tile normalised in shared memory
// with gated_rmsnorm_fwd's lanes, order and rounding, so o is never read back); otherwise, and
// on the CPU, the two ops in turn.
struct GdnOutNorm {
  TensorView y, rstd, z, w;  // as gated_rmsnorm_fwd's: y, z [T, Hv, dv]; rstd [T * Hv]; w [dv]
  float eps = 1e-6f;
};
// Its backward as part of the chunk backward: exactly gated_rmsnorm_bwd(do_, dz, dw, dy, o, z, w,
// rstd) first, so gdn_chunk_bwd's do_ is then an OUTPUT (=). CUDA (unless DT_GDN_OUT_NORM=0): in
// the dvl kernel (do_ and dz the same bits; dw (+=) summed over another fixed tiling, within fp32
// rounding); otherwise, and on the CPU, the ops in turn.
struct GdnOutNormBwd {
  TensorView dz, dw, dy, o, z, w, rstd;  // as gated_rmsnorm_bwd's
};
struct GdnArgs {
  float scale = 0.0f;                        // 0: dk^-0.5
  GdnChunkSaved* saved = nullptr;            // optional: see GdnChunkSaved
  const GdnOutNorm* norm = nullptr;          // forward only, optional: see GdnOutNorm
  const GdnOutNormBwd* norm_bwd = nullptr;   // backward only, optional: see GdnOutNormBwd
};
void gdn_chunk_fwd(const TensorView& o, const TensorView& ht, const TensorView& q, const TensorView& k,
                   const TensorView& v, const TensorView& g, const TensorView& beta, const TensorView& h0,
                   const GdnArgs& args, const VarlenMeta& m, Stream s = {});
// All gradients overwritten (=): dq, dk like q, k; dv like v; dg, dbeta [T, Hv] f32;
// dh0 [N, Hv, dk, dv] f32 or empty. dht: [N, Hv, dk, dv] f32 or empty (= zero).
void gdn_chunk_bwd(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dg,
                   const TensorView& dbeta, const TensorView& dh0, const TensorView& do_, const TensorView& dht,
                   const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                   const TensorView& beta, const TensorView& h0, const GdnArgs& args, const VarlenMeta& m,
                   Stream s = {});

// ---- 5. gated_rmsnorm (gdn-math.md section 8.1) ------------------------------------------
// y = o * rstd * w * silu(z), rstd = 1 / sqrt(mean(o^2) + eps) over the last dim (dv) per row.
//   o, z, y: [rows, dv] (bf16|f32; rows may be strided); w: [dv] f32; rstd: [rows] f32 (saved)
void gated_rmsnorm_fwd(const TensorView& y, const TensorView& rstd, const TensorView& o, const TensorView& z,
                       const TensorView& w, float eps, Stream s = {});
// do_, dz (=) like o, z; dw (+=) [dv] f32.
void gated_rmsnorm_bwd(const TensorView& do_, const TensorView& dz, const TensorView& dw, const TensorView& dy,
                       const TensorView& o, const TensorView& z, const TensorView& w, const TensorView& rstd,
                       Stream s = {});

}  // namespace dt::ops
