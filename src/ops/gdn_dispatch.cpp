// Routes each GDN op to its CPU or CUDA implementation by the device of the first view.
#include <initializer_list>
#include <utility>

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
namespace {
// The q|k head views of the conv + l2norm ops: contiguous [T, Hk, dk] like qn in x's dtype, rstd
// [T * Hk] f32, and the v-side view [T, D - 2 Hk dk] (vname: "v" forward, "dv" backward).
using NamedView = std::pair<const char*, const TensorView*>;
// v_may_be_empty: the forward may be asked for q, k alone (x holds only the q|k columns, v is [T, 0]).
void check_conv_norm(const char* op, const TensorView& x, std::initializer_list<NamedView> heads, const TensorView& qn,
                     const TensorView& rq, const TensorView& rk, const TensorView& v, const char* vname,
                     bool v_may_be_empty = false) {
  DT_CHECK(x.ndim() == 2, "{}: x must be [T, 2 Hk dk + Dv], got {}", op, x.str());
  const int64_t T = x.shape[0];
  for (const auto& [name, h] : heads)
    DT_CHECK(h->ndim() == 3 && h->shape[0] == T && h->shape == qn.shape && h->is_contiguous() &&
                 h->dtype == x.dtype && h->device == x.device,
             "{}: {} must be a contiguous [T={}, Hk, dk] view like qn {} in x's dtype {} on {}, got {}", op, name, T,
             qn.str(), dtype_name(x.dtype), x.device.str(), h->str());
  for (const TensorView* r : {&rq, &rk})
    DT_CHECK(r->dtype == DType::f32 && r->is_contiguous() && r->device == x.device && r->numel() == T * qn.shape[1],
             "{}: {} must be a contiguous f32 view of T * Hk = {} rows on {}, got {}", op, r == &rq ? "rq" : "rk",
             T * qn.shape[1], x.device.str(), r->str());
  const int64_t qk_ch = qn.shape[1] * qn.shape[2];
  DT_CHECK(v.ndim() == 2 && v.shape[0] == T && v.shape[1] == x.shape[1] - 2 * qk_ch && (v.shape[1] > 0 || v_may_be_empty) &&
               v.dtype == x.dtype && v.device == x.device,
           "{}: {} must be [T={}, D - 2 Hk dk = {}] (D = {}, Hk dk = {}) in x's dtype on x's device, got {}", op, vname,
           T, x.shape[1] - 2 * qk_ch, x.shape[1], qk_ch, v.str());
}

// Section i (q: 0, k: 1) of a [T, D] buffer's q|k columns as its head rows [T, H, d], in place.
TensorView section_heads(const Tensor& c, int i, int64_t H, int64_t d) {
  TensorView v = c.view().slice(1, i * H * d, (i + 1) * H * d);
  v.shape = Shape{c.shape()[0], H, d};
  v.stride[0] = c.view().stride[0], v.stride[1] = d, v.stride[2] = 1;
  return v;
}
}  // namespace

void causal_conv1d_l2norm_fwd(const ConvNormOut& out, const TensorView& x, const TensorView& w, const TensorView& bias,
                              bool silu, float eps, const VarlenMeta& m, const GdnGateFwdViews* gate, Stream s) {
  check_conv_norm("causal_conv1d_l2norm_fwd", x, {{"qn", &out.qn}, {"kn", &out.kn}}, out.qn, out.rq, out.rk, out.v,
                  "v", /*v_may_be_empty=*/true);
  DT_ROUTE(causal_conv1d_l2norm_fwd, x, out, x, w, bias, silu, eps, m, gate, s);
}

void causal_conv1d_l2norm_bwd(const TensorView& dx, const TensorView& dw, const TensorView& dbias,
                              const ConvNormGrad& g, const TensorView& x, const TensorView& w, const TensorView& bias,
                              bool silu, const VarlenMeta& m, const GdnGateBwdViews* gate, Stream s) {
  check_conv_norm("causal_conv1d_l2norm_bwd", x, {{"dq", &g.dq}, {"dk", &g.dk}, {"qn", &g.qn}, {"kn", &g.kn}}, g.qn,
                  g.rq, g.rk, g.dv, "dv");
  DT_ROUTE(causal_conv1d_l2norm_bwd, x, dx, dw, dbias, g, x, w, bias, silu, m, gate, s);
}

namespace detail {
void conv_l2norm_bwd_composed(const TensorView& dx, const TensorView& dw, const TensorView& dbias,
                              const ConvNormGrad& g, const TensorView& x, const TensorView& w, const TensorView& bias,
                              bool silu, const VarlenMeta& m, const GdnGateBwdViews* gate, Stream s) {
  const int64_t H = g.qn.shape[1], d = g.qn.shape[2];
  Tensor dc = Tensor::empty(x.shape, x.dtype, x.device);  // [T, D]
  l2norm_bwd_y(section_heads(dc, 0, H, d), g.dq, g.qn, g.rq, s);
  l2norm_bwd_y(section_heads(dc, 1, H, d), g.dk, g.kn, g.rk, s);
  copy(dc.view().slice(1, 2 * H * d, x.shape[1]), g.dv, s);
  if (gate) causal_conv1d_gate_bwd(dx, dw, dbias, dc, x, w, bias, silu, m, *gate, s);
  else causal_conv1d_bwd(dx, dw, dbias, dc, x, w, bias, silu, m, s);
}

void conv_l2norm_composed(const ConvNormOut& out, const TensorView& x, const TensorView& w, const TensorView& bias,
                          bool silu, float eps, const VarlenMeta& m, const GdnGateFwdViews* gate, Stream s) {
  const int64_t H = out.qn.shape[1], d = out.qn.shape[2];
  Tensor c = Tensor::empty(x.shape, x.dtype, x.device);  // [T, D]
  if (gate) causal_conv1d_gate_fwd(c, x, w, bias, silu, m, *gate, s);
  else causal_conv1d_fwd(c, x, w, bias, silu, m, s);
  l2norm_fwd(out.qn, out.rq, section_heads(c, 0, H, d), eps, s);
  l2norm_fwd(out.kn, out.rk, section_heads(c, 1, H, d), eps, s);
  if (out.v.shape[1] > 0) copy(out.v, c.view().slice(1, 2 * H * d, x.shape[1]), s);
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
