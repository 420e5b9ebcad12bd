// Routing and argument checks of the optimizer update ops (include/deltatron/ops/optim.h).
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

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

bool overlap(const TensorView& a, const TensorView& b) {
  const auto a0 = reinterpret_cast<uintptr_t>(a.data), b0 = reinterpret_cast<uintptr_t>(b.data);
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

// The optional compute copy: a cast target of p's shape that no input aliases (the kernels read
// p, m, v, g and write compute in one pass, so an overlap would read half-written values).
// ins: p first, g last.
void check_writes(const UpdateWrites& w, std::initializer_list<const TensorView*> ins, const char* op) {
  if (w.zero_grad) {  // g is written too: it must not share bytes with what the update writes
    const TensorView& g = **(ins.end() - 1);
    for (const TensorView* x : ins)
      DT_CHECK(x == &g || !overlap(g, *x), "{}: with zero_grad, g must not overlap p, m or v: g {} at {} overlaps {} at {}",
               op, g.str(), g.data, x->str(), x->data);
  }
  const TensorView& c = w.compute;
  if (!c.data) return;
  const TensorView& p = **ins.begin();
  DT_CHECK(c.dtype == DType::bf16 || c.dtype == DType::f16 || c.dtype == DType::f32,
           "{}: compute must be bf16, f16 or f32, got {}", op, c.str());
  DT_CHECK(c.is_contiguous(), "{}: compute must be contiguous, got {}", op, c.str());
  DT_CHECK(c.shape == p.shape, "{}: compute must have p's shape: compute {} vs p {}", op, c.str(), p.str());
  DT_CHECK(c.device == p.device, "{}: compute must be on p's device: compute {} vs p {}", op, c.str(), p.str());
  for (const TensorView* x : ins)
    DT_CHECK(!overlap(c, *x), "{}: compute must not overlap p, m, v or g: compute {} at {} overlaps {} at {}", op,
             c.str(), c.data, x->str(), x->data);
}

// The checks of one AdamW update (adamw_update and each item of adamw_update_multi).
void check_adamw(const TensorView& p, const TensorView& m, const TensorView& v, const TensorView& g,
                 const AdamWArgs& a, const UpdateWrites& w, const char* op) {
  const char* names[] = {"p", "m", "v", "g"};
  const TensorView* views[] = {&p, &m, &v, &g};
  for (int i = 0; i < 4; ++i) check_state(*views[i], p, fmt::format("{} {}", op, names[i]).c_str());
  check_writes(w, {&p, &m, &v, &g}, op);
  DT_CHECK(a.step >= 1, "{}: step is the 1-based update count, got {}", op, a.step);
  DT_CHECK(a.beta1 >= 0.f && a.beta1 < 1.f && a.beta2 >= 0.f && a.beta2 < 1.f && a.eps > 0.f,
           "{}: need 0 <= beta1, beta2 < 1 and eps > 0, got beta1 {} beta2 {} eps {}", op, a.beta1, a.beta2, a.eps);
}

// The host-side constants, in double, rounded once (both backends see the same floats).
AdamWConsts adamw_consts(const AdamWArgs& a, float weight_decay) {
  const double bc1 = 1.0 - std::pow(double(a.beta1), double(a.step));
  const double bc2 = 1.0 - std::pow(double(a.beta2), double(a.step));
  AdamWConsts c{};
  c.beta1 = a.beta1;
  c.beta2 = a.beta2;
  c.one_minus_beta1 = float(1.0 - double(a.beta1));
  c.one_minus_beta2 = float(1.0 - double(a.beta2));
  c.eps = a.eps;
  c.decay = float(1.0 - double(a.lr) * double(weight_decay));
  c.step_size = float(double(a.lr) / bc1);
  c.bc2_sqrt = float(std::sqrt(bc2));
  c.grad_scale = a.grad_scale;
  return c;
}
}  // namespace

void adamw_update(const TensorView& p, const TensorView& m, const TensorView& v, const TensorView& g,
                  const AdamWArgs& a, Stream s) {
  adamw_update(p, m, v, g, a, UpdateWrites{}, s);
}

void adamw_update(const TensorView& p, const TensorView& m, const TensorView& v, const TensorView& g,
                  const AdamWArgs& a, const UpdateWrites& w, Stream s) {
  check_adamw(p, m, v, g, a, w, "adamw_update");
  if (p.empty()) return;
  const AdamWConsts c = adamw_consts(a, a.weight_decay);
  DT_ROUTE(adamw_update, p, p, m, v, g, c, w, s);
}

void adamw_update_multi(std::span<const AdamWItem> items, const AdamWArgs& a, Stream s) {
  std::vector<AdamWItem> live;  // the non-empty items
  std::vector<AdamWConsts> consts;
  for (size_t i = 0; i < items.size(); ++i) {
    const AdamWItem& it = items[i];
    const std::string op = fmt::format("adamw_update_multi item {}", i);
    check_adamw(it.p, it.m, it.v, it.g, a, it.w, op.c_str());
    DT_CHECK(it.p.device == items[0].p.device, "{}: p is on {} but item 0's p on {}: one device per call", op,
             it.p.device.str(), items[0].p.device.str());
    if (it.p.empty()) continue;
    live.push_back(it);
    consts.push_back(adamw_consts(a, it.weight_decay));
  }
  if (live.empty()) return;
  const std::span<const AdamWItem> li(live);
  const std::span<const AdamWConsts> lc(consts);
  DT_ROUTE(adamw_update_multi, live[0].p, li, lc, s);
}

void sgd_update(const TensorView& p, const TensorView& g, const SgdArgs& a, Stream s) {
  sgd_update(p, g, a, UpdateWrites{}, s);
}

void sgd_update(const TensorView& p, const TensorView& g, const SgdArgs& a, const UpdateWrites& w, Stream s) {
  check_state(p, p, "sgd_update p");
  check_state(g, p, "sgd_update g");
  check_writes(w, {&p, &g}, "sgd_update");
  if (p.empty()) return;
  SgdConsts c{a.lr, a.weight_decay, a.grad_scale};
  DT_ROUTE(sgd_update, p, p, g, c, w, s);
}

}  // namespace dt::ops
