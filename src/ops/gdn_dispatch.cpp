// Routes each GDN op to its CPU or CUDA implementation by the device of the first view.
#include "ops/gdn_backends.h"
#include "ops/route.h"

namespace dt::ops {
void causal_conv1d_fwd(const TensorView& y, const TensorView& x, const TensorView& w, const TensorView& bias,
                       bool silu, const VarlenMeta& m, Stream s) {
  DT_ROUTE(causal_conv1d_fwd, y, y, x, w, bias, silu, m, s);
}
void causal_conv1d_bwd(const TensorView& dx, const TensorView& dw, const TensorView& dbias, const TensorView& dy,
                       const TensorView& x, const TensorView& w, const TensorView& bias, bool silu,
                       const VarlenMeta& m, Stream s) {
  DT_ROUTE(causal_conv1d_bwd, dx, dx, dw, dbias, dy, x, w, bias, silu, m, s);
}
void l2norm_fwd(const TensorView& y, const TensorView& rstd, const TensorView& x, float eps, Stream s) {
  DT_ROUTE(l2norm_fwd, y, y, rstd, x, eps, s);
}
void l2norm_bwd(const TensorView& dx, const TensorView& dy, const TensorView& x, const TensorView& rstd, Stream s) {
  DT_ROUTE(l2norm_bwd, dx, dx, dy, x, rstd, s);
}
void gdn_gate_fwd(const TensorView& g, const TensorView& beta, const TensorView& a, const TensorView& b,
                  const TensorView& A_log, const TensorView& dt_bias, Stream s) {
  DT_ROUTE(gdn_gate_fwd, g, g, beta, a, b, A_log, dt_bias, s);
}
void gdn_gate_bwd(const TensorView& da, const TensorView& db, const TensorView& dA_log, const TensorView& ddt_bias,
                  const TensorView& dg, const TensorView& dbeta, const TensorView& a, const TensorView& b,
                  const TensorView& A_log, const TensorView& dt_bias, Stream s) {
  DT_ROUTE(gdn_gate_bwd, da, da, db, dA_log, ddt_bias, dg, dbeta, a, b, A_log, dt_bias, s);
}
void causal_conv1d_gate_fwd(const TensorView& y, const TensorView& x, const TensorView& w, const TensorView& bias,
                            bool silu, const VarlenMeta& m, const GdnGateFwdViews& gate, Stream s) {
  DT_ROUTE(causal_conv1d_gate_fwd, y, y, x, w, bias, silu, m, gate, s);
}
void causal_conv1d_gate_bwd(const TensorView& dx, const TensorView& dw, const TensorView& dbias,
                            const TensorView& dy, const TensorView& x, const TensorView& w, const TensorView& bias,
                            bool silu, const VarlenMeta& m, const GdnGateBwdViews& gate, Stream s) {
  DT_ROUTE(causal_conv1d_gate_bwd, dx, dx, dw, dbias, dy, x, w, bias, silu, m, gate, s);
}
void gdn_chunk_fwd(const TensorView& o, const TensorView& ht, const TensorView& q, const TensorView& k,
                   const TensorView& v, const TensorView& g, const TensorView& beta, const TensorView& h0,
                   const GdnArgs& args, const VarlenMeta& m, Stream s) {
  DT_ROUTE(gdn_chunk_fwd, o, o, ht, q, k, v, g, beta, h0, args, m, s);
}
void gdn_chunk_bwd(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dg,
                   const TensorView& dbeta, const TensorView& dh0, const TensorView& do_, const TensorView& dht,
                   const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                   const TensorView& beta, const TensorView& h0, const GdnArgs& args, const VarlenMeta& m,
                   Stream s) {
  DT_ROUTE(gdn_chunk_bwd, dq, dq, dk, dv, dg, dbeta, dh0, do_, dht, q, k, v, g, beta, h0, args, m, s);
}
void gated_rmsnorm_fwd(const TensorView& y, const TensorView& rstd, const TensorView& o, const TensorView& z,
                       const TensorView& w, float eps, Stream s) {
  DT_ROUTE(gated_rmsnorm_fwd, y, y, rstd, o, z, w, eps, s);
}
void gated_rmsnorm_bwd(const TensorView& do_, const TensorView& dz, const TensorView& dw, const TensorView& dy,
                       const TensorView& o, const TensorView& z, const TensorView& w, const TensorView& rstd,
                       Stream s) {
  DT_ROUTE(gated_rmsnorm_bwd, do_, do_, dz, dw, dy, o, z, w, rstd, s);
}

}  // namespace dt::ops
