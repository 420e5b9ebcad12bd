// Routes each GDN op to its CPU or CUDA implementation by the device of the first view.
#include "deltatron/ops/basic.h"
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
void l2norm_bwd_y(const TensorView& dx, const TensorView& dy, const TensorView& y, const TensorView& rstd, Stream s) {
  DT_ROUTE(l2norm_bwd_y, dx, dx, dy, y, rstd, s);
}
void causal_conv1d_l2norm_fwd(const ConvNormOut& out, const TensorView& x, const TensorView& w, const TensorView& bias,
                              bool silu, float eps, const VarlenMeta& m, const GdnGateFwdViews* gate, Stream s) {
  constexpr const char* op = "causal_conv1d_l2norm_fwd";
  DT_CHECK(x.ndim() == 2, "{}: x must be [T, 2 Hk dk + Dv], got {}", op, x.str());
  const TensorView* qk[2] = {&out.qn, &out.kn};
  const TensorView* rs[2] = {&out.rq, &out.rk};
  const int64_t T = x.shape[0];
  for (int i = 0; i < 2; ++i) {
    const char* name = i ? "kn" : "qn";
    DT_CHECK(qk[i]->ndim() == 3 && qk[i]->shape[0] == T && qk[i]->shape == out.qn.shape && qk[i]->is_contiguous() &&
                 qk[i]->dtype == x.dtype && qk[i]->device == x.device,
             "{}: {} must be a contiguous [T={}, Hk, dk] view like qn {} in x's dtype {} on {}, got {}", op, name, T,
             out.qn.str(), dtype_name(x.dtype), x.device.str(), qk[i]->str());
    DT_CHECK(rs[i]->dtype == DType::f32 && rs[i]->is_contiguous() && rs[i]->device == x.device &&
                 rs[i]->numel() == T * out.qn.shape[1],
             "{}: {} must be a contiguous f32 view of T * Hk = {} rows on {}, got {}", op, i ? "rk" : "rq",
             T * out.qn.shape[1], x.device.str(), rs[i]->str());
  }
  const int64_t qk_ch = out.qn.shape[1] * out.qn.shape[2];
  DT_CHECK(out.v.ndim() == 2 && out.v.shape[0] == T && out.v.shape[1] == x.shape[1] - 2 * qk_ch && out.v.shape[1] > 0 &&
               out.v.dtype == x.dtype && out.v.device == x.device,
           "{}: v must be [T={}, D - 2 Hk dk = {}] (D = {}, Hk dk = {}) in x's dtype on x's device, got {}", op, T,
           x.shape[1] - 2 * qk_ch, x.shape[1], qk_ch, out.v.str());
  DT_ROUTE(causal_conv1d_l2norm_fwd, x, out, x, w, bias, silu, eps, m, gate, s);
}

void causal_conv1d_l2norm_bwd(const TensorView& dx, const TensorView& dw, const TensorView& dbias,
                              const ConvNormGrad& g, const TensorView& x, const TensorView& w, const TensorView& bias,
                              bool silu, const VarlenMeta& m, const GdnGateBwdViews* gate, Stream s) {
  constexpr const char* op = "causal_conv1d_l2norm_bwd";
  DT_CHECK(x.ndim() == 2, "{}: x must be [T, 2 Hk dk + Dv], got {}", op, x.str());
  const int64_t T = x.shape[0];
  const TensorView* heads[4] = {&g.dq, &g.dk, &g.qn, &g.kn};
  const char* names[4] = {"dq", "dk", "qn", "kn"};
  for (int i = 0; i < 4; ++i)
    DT_CHECK(heads[i]->ndim() == 3 && heads[i]->shape[0] == T && heads[i]->shape == g.qn.shape &&
                 heads[i]->is_contiguous() && heads[i]->dtype == x.dtype && heads[i]->device == x.device,
             "{}: {} must be a contiguous [T={}, Hk, dk] view like qn {} in x's dtype {} on {}, got {}", op, names[i],
             T, g.qn.str(), dtype_name(x.dtype), x.device.str(), heads[i]->str());
  for (const TensorView* r : {&g.rq, &g.rk})
    DT_CHECK(r->dtype == DType::f32 && r->is_contiguous() && r->device == x.device && r->numel() == T * g.qn.shape[1],
             "{}: {} must be a contiguous f32 view of T * Hk = {} rows on {}, got {}", op, r == &g.rq ? "rq" : "rk",
             T * g.qn.shape[1], x.device.str(), r->str());
  const int64_t qk_ch = g.qn.shape[1] * g.qn.shape[2];
  DT_CHECK(g.dv.ndim() == 2 && g.dv.shape[0] == T && g.dv.shape[1] == x.shape[1] - 2 * qk_ch && g.dv.shape[1] > 0 &&
               g.dv.dtype == x.dtype && g.dv.device == x.device,
           "{}: dv must be [T={}, D - 2 Hk dk = {}] (D = {}, Hk dk = {}) in x's dtype on x's device, got {}", op, T,
           x.shape[1] - 2 * qk_ch, x.shape[1], qk_ch, g.dv.str());
  DT_ROUTE(causal_conv1d_l2norm_bwd, x, dx, dw, dbias, g, x, w, bias, silu, m, gate, s);
}

namespace detail {
void conv_l2norm_bwd_composed(const TensorView& dx, const TensorView& dw, const TensorView& dbias,
                              const ConvNormGrad& g, const TensorView& x, const TensorView& w, const TensorView& bias,
                              bool silu, const VarlenMeta& m, const GdnGateBwdViews* gate, Stream s) {
  const int64_t T = x.shape[0], H = g.qn.shape[1], d = g.qn.shape[2];
  Tensor dc = Tensor::empty(x.shape, x.dtype, x.device);  // [T, D]
  const TensorView* dy[2] = {&g.dq, &g.dk};
  const TensorView* y[2] = {&g.qn, &g.kn};
  const TensorView* r[2] = {&g.rq, &g.rk};
  for (int i = 0; i < 2; ++i) {
    TensorView ci = dc.view().slice(1, i * H * d, (i + 1) * H * d);  // [T, H d] -> [T, H, d] heads in place
    ci.shape = Shape{T, H, d};
    ci.stride[0] = dc.view().stride[0], ci.stride[1] = d, ci.stride[2] = 1;
    l2norm_bwd_y(ci, *dy[i], *y[i], *r[i], s);
  }
  copy(dc.view().slice(1, 2 * H * d, x.shape[1]), g.dv, s);
  if (gate) causal_conv1d_gate_bwd(dx, dw, dbias, dc, x, w, bias, silu, m, *gate, s);
  else causal_conv1d_bwd(dx, dw, dbias, dc, x, w, bias, silu, m, s);
}

void conv_l2norm_composed(const ConvNormOut& out, const TensorView& x, const TensorView& w, const TensorView& bias,
                          bool silu, float eps, const VarlenMeta& m, const GdnGateFwdViews* gate, Stream s) {
  const int64_t T = x.shape[0], H = out.qn.shape[1], d = out.qn.shape[2];
  Tensor c = Tensor::empty(x.shape, x.dtype, x.device);  // [T, D]
  if (gate) causal_conv1d_gate_fwd(c, x, w, bias, silu, m, *gate, s);
  else causal_conv1d_fwd(c, x, w, bias, silu, m, s);
  const TensorView* y[2] = {&out.qn, &out.kn};
  const TensorView* r[2] = {&out.rq, &out.rk};
  for (int i = 0; i < 2; ++i) {
    TensorView ci = c.view().slice(1, i * H * d, (i + 1) * H * d);  // [T, H d] -> [T, H, d] heads in place
    ci.shape = Shape{T, H, d};
    ci.stride[0] = c.view().stride[0], ci.stride[1] = d, ci.stride[2] = 1;
    l2norm_fwd(*y[i], *r[i], ci, eps, s);
  }
  copy(out.v, c.view().slice(1, 2 * H * d, x.shape[1]), s);
}
}  // namespace detail
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
  if (const GdnOutNorm* n = args.norm) {  // the epilogue's views, as gated_rmsnorm_fwd takes them
    constexpr const char* op = "gdn_chunk_fwd (GdnOutNorm)";
    for (const TensorView* a : {&n->y, &n->z})
      DT_CHECK(a->ndim() == 3 && a->shape == o.shape && a->dtype == o.dtype && a->device == o.device &&
                   a->stride[2] == 1,
               "{}: {} must be {} like o {} with a unit inner stride, got {}", op, a == &n->y ? "y" : "z",
               o.shape.str(), o.str(), a->str());
    DT_CHECK(n->rstd.dtype == DType::f32 && n->rstd.is_contiguous() && n->rstd.device == o.device &&
                 n->rstd.numel() == o.shape[0] * o.shape[1],
             "{}: rstd must be a contiguous f32 view of T * Hv = {} rows on {}, got {}", op, o.shape[0] * o.shape[1],
             o.device.str(), n->rstd.str());
    DT_CHECK(n->w.dtype == DType::f32 && n->w.is_contiguous() && n->w.device == o.device && n->w.numel() == o.shape[2],
             "{}: w must be a contiguous f32 [dv={}] view on {}, got {}", op, o.shape[2], o.device.str(), n->w.str());
  }
  DT_ROUTE(gdn_chunk_fwd, o, o, ht, q, k, v, g, beta, h0, args, m, s);
}
void gdn_chunk_bwd(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dg,
                   const TensorView& dbeta, const TensorView& dh0, const TensorView& do_, const TensorView& dht,
                   const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                   const TensorView& beta, const TensorView& h0, const GdnArgs& args, const VarlenMeta& m,
                   Stream s) {
  if (const GdnOutNormBwd* n = args.norm_bwd) {  // the prologue's views, as gated_rmsnorm_bwd takes them
    constexpr const char* op = "gdn_chunk_bwd (GdnOutNormBwd)";
    const char* names[4] = {"dz", "dy", "o", "z"};
    const TensorView* acts[4] = {&n->dz, &n->dy, &n->o, &n->z};
    for (int i = 0; i < 4; ++i)
      DT_CHECK(acts[i]->ndim() == 3 && acts[i]->shape == do_.shape && acts[i]->dtype == do_.dtype &&
                   acts[i]->device == do_.device && acts[i]->stride[2] == 1,
               "{}: {} must be {} like do {} with a unit inner stride, got {}", op, names[i], do_.shape.str(),
               do_.str(), acts[i]->str());
    for (const TensorView* a : {&n->w, &n->dw})
      DT_CHECK(a->dtype == DType::f32 && a->is_contiguous() && a->device == do_.device && a->numel() == do_.shape[2],
               "{}: {} must be a contiguous f32 [dv={}] view on {}, got {}", op, a == &n->w ? "w" : "dw",
               do_.shape[2], do_.device.str(), a->str());
    DT_CHECK(n->rstd.dtype == DType::f32 && n->rstd.is_contiguous() && n->rstd.device == do_.device &&
                 n->rstd.numel() == do_.shape[0] * do_.shape[1],
             "{}: rstd must be a contiguous f32 view of T * Hv = {} rows on {}, got {}", op,
             do_.shape[0] * do_.shape[1], do_.device.str(), n->rstd.str());
  }
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
