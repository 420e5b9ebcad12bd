// Routing and argument checks of the optimizer update ops (include/deltatron/ops/optim.h).
#include <cmath>

#include "ops/optim_backends.h"
#include "ops/route.h"

namespace dt::ops {
namespace {
void check_state(const TensorView& x, const TensorView& p, const char* what) {
  check_dtype(x, DType::f32, what);
  check_contiguous(x, what);
  check_same_shape(x, p, what);
  check_device(x, p, what);
}
}  // namespace

void adamw_update(const TensorView& p, const TensorView& m, const TensorView& v, const TensorView& g,
                  const AdamWArgs& a, Stream s) {
  for (const TensorView* x : {&p, &m, &v, &g}) check_state(*x, p, "adamw_update");
  DT_CHECK(a.step >= 1, "adamw_update: step is the 1-based update count, got {}", a.step);
  DT_CHECK(a.beta1 >= 0.f && a.beta1 < 1.f && a.beta2 >= 0.f && a.beta2 < 1.f && a.eps > 0.f,
           "adamw_update: need 0 <= beta1, beta2 < 1 and eps > 0, got beta1 {} beta2 {} eps {}", a.beta1, a.beta2,
           a.eps);
  if (p.empty()) return;
  const double bc1 = 1.0 - std::pow(double(a.beta1), double(a.step));
  const double bc2 = 1.0 - std::pow(double(a.beta2), double(a.step));
  AdamWConsts c{};
  c.beta1 = a.beta1;
  c.beta2 = a.beta2;
  c.one_minus_beta1 = float(1.0 - double(a.beta1));
  c.one_minus_beta2 = float(1.0 - double(a.beta2));
  c.eps = a.eps;
  c.decay = float(1.0 - double(a.lr) * double(a.weight_decay));
  c.step_size = float(double(a.lr) / bc1);
  c.bc2_sqrt = float(std::sqrt(bc2));
  c.grad_scale = a.grad_scale;
  DT_ROUTE(adamw_update, p, p, m, v, g, c, s);
}

void sgd_update(const TensorView& p, const TensorView& g, const SgdArgs& a, Stream s) {
  check_state(p, p, "sgd_update");
  check_state(g, p, "sgd_update");
  if (p.empty()) return;
  SgdConsts c{a.lr, a.weight_decay, a.grad_scale};
  DT_ROUTE(sgd_update, p, p, g, c, s);
}

}  // namespace dt::ops
