// CPU reference of the row L2-norm, gdn-math.md sections 1.1 and 6 (backward B11).
//   rstd = 1 / sqrt(sum_i x_i^2 + eps)   (eps inside the root of the SUM, as FLA and HF)
//   y = x * rstd;   dx = rstd * (dy - y * sum(dy * y)), y recomputed from x and the saved rstd
//   (l2norm_bwd_y: y itself, as the fused conv + l2norm forward keeps it).
// Layouts and dtypes (f32 only on the CPU): x, y, dx, dy one shape, [rows, d] or [A, B, d]
// (rows = A B; leading strides arbitrary, unit inner stride); rstd [rows] contiguous. Gradient: dx overwritten (=). Row sums in double.
#include "ops/gdn_backends.h"
#include "ops/cpu/gdn_cpu_views.h"

namespace dt::ops::cpu {

void l2norm_fwd(const TensorView& y, const TensorView& rstd, const TensorView& x, float eps, Stream) {
  constexpr const char* op = "l2norm_fwd";
  int64_t R, D;
  views::rows_and_d(x, &R, &D, op, "x");
  auto xr = views::head_rows(x, x.shape, op, "x");           // [rows, d] | [A, B, d]
  auto yr = views::head_rows(y, x.shape, op, "y");           // like x
  float* rp = views::dense(rstd, {R}, op, "rstd", false);    // [rows]
  ref::l2norm_fwd<float>(yr, rp, xr, R, D, double(eps));
}

void l2norm_bwd(const TensorView& dx, const TensorView& dy, const TensorView& x, const TensorView& rstd, Stream) {
  constexpr const char* op = "l2norm_bwd";
  int64_t R, D;
  views::rows_and_d(x, &R, &D, op, "x");
  auto xr = views::head_rows(x, x.shape, op, "x");                 // [rows, d] | [A, B, d]
  auto dyr = views::head_rows(dy, x.shape, op, "dy");              // like x
  auto dxr = views::head_rows(dx, x.shape, op, "dx");              // like x (=)
  const float* rp = views::dense(rstd, {R}, op, "rstd", false);    // [rows]
  ref::l2norm_bwd<float>(dxr, dyr, xr, rp, R, D);
}

void l2norm_bwd_y(const TensorView& dx, const TensorView& dy, const TensorView& y, const TensorView& rstd, Stream) {
  constexpr const char* op = "l2norm_bwd_y";
  int64_t R, D;
  views::rows_and_d(y, &R, &D, op, "y");
  auto yr = views::head_rows(y, y.shape, op, "y");                 // [rows, d] | [A, B, d]
  auto dyr = views::head_rows(dy, y.shape, op, "dy");              // like y
  auto dxr = views::head_rows(dx, y.shape, op, "dx");              // like y (=)
  const float* rp = views::dense(rstd, {R}, op, "rstd", false);    // [rows]
  ref::l2norm_bwd_y<float>(dxr, dyr, yr, rp, R, D);
}

}  // namespace dt::ops::cpu
