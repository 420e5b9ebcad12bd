// CPU reference of the depthwise causal conv1d on packed sequences, gdn-math.md section 7.
//   y_pre[t, c] = bias[c] + sum_{j<W} w[c, j] * x[t - (W-1) + j, c]  (taps before the start of t's
//   sequence read 0), y = silu(y_pre) when `silu`, else y_pre. The backward recomputes y_pre.
// Layouts and dtypes (f32 only on the CPU): x, y, dx, dy [T, D] (row stride arbitrary, unit
// inner stride); w, dw [D, W] contiguous, 2 <= W <= 8; bias, dbias [D] or empty.
// Gradients: dx overwritten (=); dw and dbias accumulate (+=), summed over tokens in double in
// a fixed order (deterministic). Math: ref::conv1d_varlen_fwd/bwd in gdn_ref.h (float64 inside).
#include "ops/gdn_backends.h"
#include "ops/cpu/gdn_cpu_views.h"

namespace dt::ops::cpu {

namespace {
struct ConvDims {
  int64_t T, D;
  int W;
};
ConvDims conv_dims(const TensorView& x, const TensorView& w, const char* op) {
  DT_CHECK(x.ndim() == 2, "cpu::{}: x must be [T, D], got {}", op, x.str());
  DT_CHECK(w.ndim() == 2, "cpu::{}: w must be [D, W] (HF [D, 1, W] viewed as [D, W]), got {}", op, w.str());
  DT_CHECK(w.shape[0] == x.shape[1], "cpu::{}: w has {} channels ({}) but x has {} ({})", op, w.shape[0], w.str(),
           x.shape[1], x.str());
  DT_CHECK(w.shape[1] >= 2 && w.shape[1] <= 8, "cpu::{}: conv width W must be in [2, 8], got {} ({})", op,
           w.shape[1], w.str());
  return {x.shape[0], x.shape[1], int(w.shape[1])};
}
}  // namespace

void causal_conv1d_fwd(const TensorView& y, const TensorView& x, const TensorView& w, const TensorView& bias,
                       bool silu, const VarlenMeta& m, Stream) {
  constexpr const char* op = "causal_conv1d_fwd";
  const ConvDims d = conv_dims(x, w, op);
  auto xr = views::rows(x, {d.T, d.D}, op, "x");                      // [T, D]
  auto yr = views::rows(y, {d.T, d.D}, op, "y");                      // [T, D]
  const float* wp = views::dense(w, {d.D, d.W}, op, "w", false);       // [D, W]
  const float* bp = views::dense(bias, {d.D}, op, "bias", true);      // [D] or null
  const int32_t* cu = views::host_cu(m, d.T, op);
  ref::conv1d_varlen_fwd<float>(yr, xr, wp, bp, d.D, d.W, silu, cu, m.num_seqs);
}

void causal_conv1d_bwd(const TensorView& dx, const TensorView& dw, const TensorView& dbias, const TensorView& dy,
                       const TensorView& x, const TensorView& w, const TensorView& bias, bool silu,
                       const VarlenMeta& m, Stream) {
  constexpr const char* op = "causal_conv1d_bwd";
  const ConvDims d = conv_dims(x, w, op);
  auto xr = views::rows(x, {d.T, d.D}, op, "x");                      // [T, D]
  auto dyr = views::rows(dy, {d.T, d.D}, op, "dy");                   // [T, D]
  auto dxr = views::rows(dx, {d.T, d.D}, op, "dx");                   // [T, D] (=)
  const float* wp = views::dense(w, {d.D, d.W}, op, "w", false);       // [D, W]
  const float* bp = views::dense(bias, {d.D}, op, "bias", true);      // [D] or null
  float* dwp = views::dense(dw, {d.D, d.W}, op, "dw", false);          // [D, W] (+=)
  float* dbp = views::dense(dbias, {d.D}, op, "dbias", true);         // [D] (+=) or null
  const int32_t* cu = views::host_cu(m, d.T, op);
  ref::conv1d_varlen_bwd<float>(dxr, dwp, dbp, dyr, xr, wp, bp, d.D, d.W, silu, cu, m.num_seqs);
}

// The conv and the gates in one call (ops::causal_conv1d_gate_fwd/bwd): on the CPU the two ops in turn.
void causal_conv1d_gate_fwd(const TensorView& y, const TensorView& x, const TensorView& w, const TensorView& bias,
                            bool silu, const VarlenMeta& m, const GdnGateFwdViews& gt, Stream s) {
  cpu::causal_conv1d_fwd(y, x, w, bias, silu, m, s);
  cpu::gdn_gate_fwd(gt.g, gt.beta, gt.a, gt.b, gt.A_log, gt.dt_bias, s);
}
void causal_conv1d_gate_bwd(const TensorView& dx, const TensorView& dw, const TensorView& dbias,
                            const TensorView& dy, const TensorView& x, const TensorView& w, const TensorView& bias,
                            bool silu, const VarlenMeta& m, const GdnGateBwdViews& gt, Stream s) {
  cpu::causal_conv1d_bwd(dx, dw, dbias, dy, x, w, bias, silu, m, s);
  cpu::gdn_gate_bwd(gt.da, gt.db, gt.dA_log, gt.ddt_bias, gt.dg, gt.dbeta, gt.a, gt.b, gt.A_log, gt.dt_bias, s);
}

// The conv with the q, k heads' L2 norm (ops::causal_conv1d_l2norm_fwd): the ops in turn.
void causal_conv1d_l2norm_fwd(const ConvNormOut& out, const TensorView& x, const TensorView& w, const TensorView& bias,
                              bool silu, float eps, const VarlenMeta& m, const GdnGateFwdViews* gate, Stream s) {
  detail::conv_l2norm_composed(out, x, w, bias, silu, eps, m, gate, s);
}

void causal_conv1d_l2norm_bwd(const TensorView& dx, const TensorView& dw, const TensorView& dbias,
                              const ConvNormGrad& grad, const TensorView& x, const TensorView& w,
                              const TensorView& bias, bool silu, const VarlenMeta& m, const GdnGateBwdViews* gate,
                              Stream s) {
  detail::conv_l2norm_bwd_composed(dx, dw, dbias, grad, x, w, bias, silu, m, gate, s);
}

}  // namespace dt::ops::cpu
