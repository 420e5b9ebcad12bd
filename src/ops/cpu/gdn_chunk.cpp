// CPU reference of the gated delta rule on packed sequences, gdn-math.md sections 2 and 5,
// computed as the TOKEN-BY-TOKEN recurrence (not the chunked algorithm of sections 3-4, which
// the CUDA backend implements and tests against this). Per sequence n and v-head h (key head
// h / (Hv / Hk), repeat_interleave GQA), with S = h0[n, h] (or 0) at the sequence start:
//   S <- exp(g_t) S;  u_t = beta_t (v_t - S^T k_t);  S <- S + k_t u_t^T;  o_t = scale * S^T q_t
//   ht[n, h] = S at the sequence end.
// The backward is the exact reverse-time recurrence (derivation in gdn_ref.h), with states
// recomputed from checkpoints every kGdnChunk tokens.
// Layouts and dtypes (f32 only on the CPU): q, k, dq, dk [T, Hk, dk]; v, o, dv, do [T, Hv, dv]
// (token stride arbitrary, heads packed inside a token); g, beta, dg, dbeta [T, Hv] (g: natural
// log decay per token, not cumulated; row stride arbitrary); h0, ht, dht, dh0 [N, Hv, dk, dv]
// contiguous or empty. Natural exp throughout (no exp2).
// Gradients: all overwritten (=): dq, dk (summed over the G v-heads of a key head in head
// order), dv, dg, dbeta, dh0. Internal math in double; deterministic and bitwise independent
// of how the sequences are packed.
#include <cmath>

#include "ops/gdn_backends.h"
#include "ops/cpu/gdn_cpu_views.h"

namespace dt::ops::cpu {

namespace {
struct Dims {
  int64_t T, N, Hk, Hv, dk, dv;
};
Dims gdn_dims(const TensorView& q, const TensorView& v, const VarlenMeta& m, const char* op) {
  DT_CHECK(q.ndim() == 3, "cpu::{}: q must be [T, Hk, dk], got {}", op, q.str());
  DT_CHECK(v.ndim() == 3, "cpu::{}: v must be [T, Hv, dv], got {}", op, v.str());
  const Dims d{q.shape[0], m.num_seqs, q.shape[1], v.shape[1], q.shape[2], v.shape[2]};
  DT_CHECK(v.shape[0] == d.T, "cpu::{}: q has {} tokens ({}) but v has {} ({})", op, d.T, q.str(), v.shape[0], v.str());
  DT_CHECK(d.Hk > 0 && d.Hv % d.Hk == 0, "cpu::{}: Hv = {} must be a multiple of Hk = {} (q {}, v {})", op, d.Hv,
           d.Hk, q.str(), v.str());
  return d;
}
ref::GdnRefShape ref_shape(const Dims& d, const GdnArgs& args) {
  const double scale = args.scale != 0.0f ? double(args.scale) : 1.0 / std::sqrt(double(d.dk));
  return {d.N, d.Hk, d.Hv, d.dk, d.dv, scale};
}
}  // namespace

void gdn_chunk_fwd(const TensorView& o, const TensorView& ht, const TensorView& q, const TensorView& k,
                   const TensorView& v, const TensorView& g, const TensorView& beta, const TensorView& h0,
                   const GdnArgs& args, const VarlenMeta& m, Stream) {
  constexpr const char* op = "gdn_chunk_fwd";
  const Dims d = gdn_dims(q, v, m, op);
  const Shape state{d.N, d.Hv, d.dk, d.dv};
  ref::GdnRefFwd<float> a;
  a.q = views::rows(q, {d.T, d.Hk, d.dk}, op, "q");              // [T, Hk, dk]
  a.k = views::rows(k, {d.T, d.Hk, d.dk}, op, "k");              // [T, Hk, dk]
  a.v = views::rows(v, {d.T, d.Hv, d.dv}, op, "v");              // [T, Hv, dv]
  a.o = views::rows(o, {d.T, d.Hv, d.dv}, op, "o");              // [T, Hv, dv] (=)
  a.g = views::rows(g, {d.T, d.Hv}, op, "g");                    // [T, Hv]
  a.beta = views::rows(beta, {d.T, d.Hv}, op, "beta");           // [T, Hv]
  a.h0 = views::dense(h0, state, op, "h0", true);                // [N, Hv, dk, dv] or null
  a.ht = views::dense(ht, state, op, "ht", true);                // [N, Hv, dk, dv] or null
  const int32_t* cu = views::host_cu(m, d.T, op);
  ref::gdn_recurrent_fwd<float>(a, ref_shape(d, args), cu);
  if (const GdnOutNorm* n = args.norm) cpu::gated_rmsnorm_fwd(n->y, n->rstd, o, n->z, n->w, n->eps, {});
}

void gdn_chunk_bwd(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dg,
                   const TensorView& dbeta, const TensorView& dh0, const TensorView& do_, const TensorView& dht,
                   const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                   const TensorView& beta, const TensorView& h0, const GdnArgs& args, const VarlenMeta& m, Stream) {
  constexpr const char* op = "gdn_chunk_bwd";
  if (const GdnOutNormBwd* n = args.norm_bwd)  // do_ is made here first
    cpu::gated_rmsnorm_bwd(do_, n->dz, n->dw, n->dy, n->o, n->z, n->w, n->rstd, {});
  const Dims d = gdn_dims(q, v, m, op);
  const Shape state{d.N, d.Hv, d.dk, d.dv};
  ref::GdnRefBwd<float> a;
  a.q = views::rows(q, {d.T, d.Hk, d.dk}, op, "q");              // [T, Hk, dk]
  a.k = views::rows(k, {d.T, d.Hk, d.dk}, op, "k");              // [T, Hk, dk]
  a.v = views::rows(v, {d.T, d.Hv, d.dv}, op, "v");              // [T, Hv, dv]
  a.g = views::rows(g, {d.T, d.Hv}, op, "g");                    // [T, Hv]
  a.beta = views::rows(beta, {d.T, d.Hv}, op, "beta");           // [T, Hv]
  a.h0 = views::dense(h0, state, op, "h0", true);                // [N, Hv, dk, dv] or null
  a.do_ = views::rows(do_, {d.T, d.Hv, d.dv}, op, "do");         // [T, Hv, dv]
  a.dht = views::dense(dht, state, op, "dht", true);             // [N, Hv, dk, dv] or null (= 0)
  a.dq = views::rows(dq, {d.T, d.Hk, d.dk}, op, "dq");           // [T, Hk, dk] (=)
  a.dk = views::rows(dk, {d.T, d.Hk, d.dk}, op, "dk");           // [T, Hk, dk] (=)
  a.dv = views::rows(dv, {d.T, d.Hv, d.dv}, op, "dv");           // [T, Hv, dv] (=)
  a.dg = views::rows(dg, {d.T, d.Hv}, op, "dg");                 // [T, Hv] (=)
  a.dbeta = views::rows(dbeta, {d.T, d.Hv}, op, "dbeta");        // [T, Hv] (=)
  a.dh0 = views::dense(dh0, state, op, "dh0", true);             // [N, Hv, dk, dv] (=) or null
  const int32_t* cu = views::host_cu(m, d.T, op);
  ref::gdn_recurrent_bwd<float>(a, ref_shape(d, args), cu, kGdnChunk);
}

}  // namespace dt::ops::cpu
