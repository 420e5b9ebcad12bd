// CPU reference of the GDN gates, gdn-math.md section 1.1 (backward B9, B10).
//   g = -exp(A_log[h]) * softplus(a + dt_bias[h]), softplus(x) = x for x > 20 (FLA/torch threshold)
//   beta = sigmoid(b)
//   da = dg * -exp(A_log) * softplus'(a + dt_bias);  db = dbeta * beta (1 - beta)
//   dA_log[h] += sum_t dg * g;  ddt_bias[h] += sum_t da
// Layouts and dtypes (f32 only on the CPU): a, b, g, beta, da, db, dg, dbeta [T, Hv] (row stride
// arbitrary, unit inner stride); A_log, dt_bias, dA_log, ddt_bias [Hv] contiguous.
// Gradients: da, db overwritten (=); dA_log, ddt_bias accumulate (+=), token sums in double in
// a fixed order (deterministic). Math: ref::gate_fwd/bwd in gdn_ref.h.
#include "ops/gdn_backends.h"
#include "ops/cpu/gdn_cpu_views.h"

namespace dt::ops::cpu {

void gdn_gate_fwd(const TensorView& g, const TensorView& beta, const TensorView& a, const TensorView& b,
                  const TensorView& A_log, const TensorView& dt_bias, Stream) {
  constexpr const char* op = "gdn_gate_fwd";
  DT_CHECK(a.ndim() == 2, "cpu::{}: a must be [T, Hv], got {}", op, a.str());
  const int64_t T = a.shape[0], H = a.shape[1];
  auto ar = views::rows(a, {T, H}, op, "a");                          // [T, Hv]
  auto br = views::rows(b, {T, H}, op, "b");                          // [T, Hv]
  auto gr = views::rows(g, {T, H}, op, "g");                          // [T, Hv]
  auto betar = views::rows(beta, {T, H}, op, "beta");                 // [T, Hv]
  const float* Ap = views::dense(A_log, {H}, op, "A_log", false);     // [Hv]
  const float* dtp = views::dense(dt_bias, {H}, op, "dt_bias", false); // [Hv]
  ref::gate_fwd<float>(gr, betar, ar, br, Ap, dtp, T, H);
}

void gdn_gate_bwd(const TensorView& da, const TensorView& db, const TensorView& dA_log, const TensorView& ddt_bias,
                  const TensorView& dg, const TensorView& dbeta, const TensorView& a, const TensorView& b,
                  const TensorView& A_log, const TensorView& dt_bias, Stream) {
  constexpr const char* op = "gdn_gate_bwd";
  DT_CHECK(a.ndim() == 2, "cpu::{}: a must be [T, Hv], got {}", op, a.str());
  const int64_t T = a.shape[0], H = a.shape[1];
  auto ar = views::rows(a, {T, H}, op, "a");                              // [T, Hv]
  auto br = views::rows(b, {T, H}, op, "b");                              // [T, Hv]
  auto dgr = views::rows(dg, {T, H}, op, "dg");                           // [T, Hv]
  auto dbetar = views::rows(dbeta, {T, H}, op, "dbeta");                  // [T, Hv]
  auto dar = views::rows(da, {T, H}, op, "da");                           // [T, Hv] (=)
  auto dbr = views::rows(db, {T, H}, op, "db");                           // [T, Hv] (=)
  const float* Ap = views::dense(A_log, {H}, op, "A_log", false);         // [Hv]
  const float* dtp = views::dense(dt_bias, {H}, op, "dt_bias", false);    // [Hv]
  float* dAp = views::dense(dA_log, {H}, op, "dA_log", false);            // [Hv] (+=)
  float* ddtp = views::dense(ddt_bias, {H}, op, "ddt_bias", false);       // [Hv] (+=)
  ref::gate_bwd<float>(dar, dbr, dAp, ddtp, dgr, dbetar, ar, br, Ap, dtp, T, H);
}

}  // namespace dt::ops::cpu
