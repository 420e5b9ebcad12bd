// CPU reference of the row L2-norm, gdn-math.md sections 1.1 and 6 (backward B11).
//   rstd = 1 / sqrt(sum_i x_i^2 + eps)   (eps inside the root of the SUM, as FLA and HF)
//   y = x * rstd;   dx = rstd * (dy - y * sum(dy * y)), y recomputed from x and the saved rstd.
// Layouts and dtypes (f32 only on the CPU): x, y, dx, dy [rows, d] (row stride arbitrary, unit
// inner stride); rstd [rows] contiguous. Gradient: dx overwritten (=). Row sums in double.
#include "ops/gdn_backends.h"
#include "ops/cpu/gdn_cpu_views.h"

namespace dt::ops::cpu {

void l2norm_fwd(const TensorView& y, const TensorView& rstd, const TensorView& x, float eps, Stream) {
  constexpr const char* op = "l2norm_fwd";
  DT_CHECK(x.ndim() == 2, "cpu::{}: x must be [rows, d], got {}", op, x.str());
  const int64_t R = x.shape[0], D = x.shape[1];
  auto xr = views::rows(x, {R, D}, op, "x");                 // [rows, d]
  auto yr = views::rows(y, {R, D}, op, "y");                 // [rows, d]
  float* rp = views::dense(rstd, {R}, op, "rstd", false);    // [rows]
  ref::l2norm_fwd<float>(yr, rp, xr, R, D, double(eps));
}

void l2norm_bwd(const TensorView& dx, const TensorView& dy, const TensorView& x, const TensorView& rstd, Stream) {
  constexpr const char* op = "l2norm_bwd";
  DT_CHECK(x.ndim() == 2, "cpu::{}: x must be [rows, d], got {}", op, x.str());
  const int64_t R = x.shape[0], D = x.shape[1];
  auto xr = views::rows(x, {R, D}, op, "x");                       // [rows, d]
  auto dyr = views::rows(dy, {R, D}, op, "dy");                    // [rows, d]
  auto dxr = views::rows(dx, {R, D}, op, "dx");                    // [rows, d] (=)
  const float* rp = views::dense(rstd, {R}, op, "rstd", false);    // [rows]
  ref::l2norm_bwd<float>(dxr, dyr, xr, rp, R, D);
}

}  // namespace dt::ops::cpu
