// CPU reference of the Qwen3.5 RMSNorm with (1 + w) (HF Qwen3_5RMSNorm, gdn-math.md 8.2), per row
// over the last dim D, f32 views, double accumulation within a row:
//   rstd = 1 / sqrt(mean_j x_j^2 + eps);  xh = x * rstd;  y = xh * (1 + w)          y, rstd (=)
//   g = dy * (1 + w);  dx = rstd * (g - xh * mean_j(g_j * xh_j))                      dx (=)
//   dw += sum_rows dy * xh (rows in order, in double, then added once)               dw (+=)
// x, y, dy, dx: [rows, D] with any row stride; w, dw: [D]; rstd: [rows] (checked by layers_ops.cpp).
#include <cmath>
#include <vector>

#include "ops/layers_ops_backends.h"

namespace dt::ops::cpu {

void rmsnorm1p_fwd(const TensorView& y, const TensorView& rstd, const TensorView& x, const TensorView& w, float eps,
                   Stream) {
  const int64_t R = x.shape[0], D = x.shape[1];
  const float* wp = w.ptr<float>();
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x.ptr<float>() + r * x.stride[0];
    float* yr = y.ptr<float>() + r * y.stride[0];
    double ss = 0;
    for (int64_t j = 0; j < D; ++j) ss += double(xr[j]) * xr[j];
    const double rs = 1.0 / std::sqrt(ss / double(D) + double(eps));
    rstd.ptr<float>()[r] = float(rs);
    for (int64_t j = 0; j < D; ++j) yr[j] = float(double(xr[j]) * rs * (1.0 + double(wp[j])));
  }
}

void rmsnorm1p_bwd(const TensorView& dx, const TensorView& dw, const TensorView& dy, const TensorView& x,
                   const TensorView& w, const TensorView& rstd, Stream) {
  const int64_t R = x.shape[0], D = x.shape[1];
  const float* wp = w.ptr<float>();
  std::vector<double> acc(size_t(D), 0.0);
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x.ptr<float>() + r * x.stride[0];
    const float* dyr = dy.ptr<float>() + r * dy.stride[0];
    float* dxr = dx.ptr<float>() + r * dx.stride[0];
    const double rs = rstd.ptr<float>()[r];
    double dot = 0;
    for (int64_t j = 0; j < D; ++j) {
      const double xh = xr[j] * rs, g = double(dyr[j]) * (1.0 + double(wp[j]));
      dot += g * xh;
      acc[size_t(j)] += double(dyr[j]) * xh;
    }
    const double mean = dot / double(D);
    for (int64_t j = 0; j < D; ++j) {
      const double xh = xr[j] * rs, g = double(dyr[j]) * (1.0 + double(wp[j]));
      dxr[j] = float(rs * (g - xh * mean));
    }
  }
  float* dwp = dw.ptr<float>();
  for (int64_t j = 0; j < D; ++j) dwp[j] = float(double(dwp[j]) + acc[size_t(j)]);
}

}  // namespace dt::ops::cpu
