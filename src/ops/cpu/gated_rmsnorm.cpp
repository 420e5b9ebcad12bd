// CPU reference of the gated RMSNorm on the GDN output, gdn-math.md section 8.1 (HF
// Qwen3_5RMSNormGated: norm first, then the gate; plain weight w, not 1 + w).
//   rstd = 1 / sqrt(mean(o^2) + eps) over dv;  xh = o * rstd;  y = xh * w * silu(z)
//   dz = dy * xh * w * silu'(z);  dy0 = dy * silu(z);  dw += sum_rows dy0 * xh
//   do = rstd * (w * dy0 - xh * mean(xh * w * dy0))
// Layouts and dtypes (f32 only on the CPU): o, z, y, do, dz, dy one shape, [rows, dv] or
// [T, Hv, dv] (rows = T Hv; leading strides arbitrary, unit inner stride); w, dw [dv]; rstd
// [rows] contiguous.
// Gradients: do, dz overwritten (=); dw accumulates (+=), summed over rows in double in a fixed
// order (deterministic). Math: ref::gated_rmsnorm_fwd/bwd in gdn_ref.h.
#include "ops/gdn_backends.h"
#include "ops/cpu/gdn_cpu_views.h"

namespace dt::ops::cpu {

void gated_rmsnorm_fwd(const TensorView& y, const TensorView& rstd, const TensorView& o, const TensorView& z,
                       const TensorView& w, float eps, Stream) {
  constexpr const char* op = "gated_rmsnorm_fwd";
  int64_t R, D;
  views::rows_and_d(o, &R, &D, op, "o");
  auto orr = views::head_rows(o, o.shape, op, "o");            // [rows, dv] | [T, Hv, dv]
  auto zr = views::head_rows(z, o.shape, op, "z");             // like o
  auto yr = views::head_rows(y, o.shape, op, "y");             // like o
  const float* wp = views::dense(w, {D}, op, "w", false);      // [dv]
  float* rp = views::dense(rstd, {R}, op, "rstd", false);      // [rows]
  ref::gated_rmsnorm_fwd<float>(yr, rp, orr, zr, wp, R, D, double(eps));
}

void gated_rmsnorm_bwd(const TensorView& do_, const TensorView& dz, const TensorView& dw, const TensorView& dy,
                       const TensorView& o, const TensorView& z, const TensorView& w, const TensorView& rstd,
                       Stream) {
  constexpr const char* op = "gated_rmsnorm_bwd";
  int64_t R, D;
  views::rows_and_d(o, &R, &D, op, "o");
  auto orr = views::head_rows(o, o.shape, op, "o");                 // [rows, dv] | [T, Hv, dv]
  auto zr = views::head_rows(z, o.shape, op, "z");                  // like o
  auto dyr = views::head_rows(dy, o.shape, op, "dy");               // like o
  auto dor = views::head_rows(do_, o.shape, op, "do");              // like o (=)
  auto dzr = views::head_rows(dz, o.shape, op, "dz");               // like o (=)
  const float* wp = views::dense(w, {D}, op, "w", false);           // [dv]
  const float* rp = views::dense(rstd, {R}, op, "rstd", false);     // [rows]
  float* dwp = views::dense(dw, {D}, op, "dw", false);              // [dv] (+=)
  ref::gated_rmsnorm_bwd<float>(dor, dzr, dwp, dyr, orr, zr, wp, rp, R, D);
}

}  // namespace dt::ops::cpu
