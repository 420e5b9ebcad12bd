// CPU reference of SwiGLU, f32 views with any row stride, math in double per element:
//   y = silu(g) * u = g * sigmoid(g) * u                                            y (=)
//   sg = sigmoid(g);  du = dy * g * sg;  dg = dy * u * sg * (1 + g * (1 - sg))      dg, du (=)
#include <cmath>

#include "ops/layers_ops_backends.h"

namespace dt::ops::cpu {
namespace {
inline double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }
inline float* row(const TensorView& v, int64_t r) { return v.ptr<float>() + r * v.stride[0]; }
}  // namespace

void swiglu_fwd(const TensorView& y, const TensorView& g, const TensorView& u, Stream) {
  const int64_t T = g.shape[0], F = g.shape[1];
  for (int64_t t = 0; t < T; ++t) {
    const float *gr = row(g, t), *ur = row(u, t);
    float* yr = row(y, t);
    for (int64_t j = 0; j < F; ++j) yr[j] = float(double(gr[j]) * sigmoid(gr[j]) * double(ur[j]));
  }
}

void swiglu_bwd(const TensorView& dg, const TensorView& du, const TensorView& dy, const TensorView& g,
                const TensorView& u, Stream) {
  const int64_t T = g.shape[0], F = g.shape[1];
  for (int64_t t = 0; t < T; ++t) {
    const float *gr = row(g, t), *ur = row(u, t), *dyr = row(dy, t);
    float *dgr = row(dg, t), *dur = row(du, t);
    for (int64_t j = 0; j < F; ++j) {
      const double gv = gr[j], uv = ur[j], d = dyr[j], sg = sigmoid(gv);
      dur[j] = float(d * gv * sg);
      dgr[j] = float(d * uv * sg * (1.0 + gv * (1.0 - sg)));
    }
  }
}

}  // namespace dt::ops::cpu
