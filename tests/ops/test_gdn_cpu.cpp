// Tests of the CPU reference of the five GDN kernel families (include/deltatron/ops/cpu/gdn_ref.h,
// src/ops/cpu/*.cpp), issue 3.
//   * every backward vs central finite differences, float64 instantiation (rel. L2 error < 1e-6;
//     4th-order stencil for the recurrence, see numgrad5)
//   * packed batch == each sequence alone, bitwise (recurrence and conv1d)
//   * state hand-over: two parts with ht -> h0 (and dh0 -> dht) == the whole run, bitwise
//   * long sequences under strong decay and beta ~ 1 stay finite
//   * the f32 ops (TensorView wrappers, strided views, += / = contracts) agree with float64
// Inputs are fresh each run (test_seed(); replay with DT_TEST_SEED=<n>).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "deltatron/core/tensor.h"
#include "deltatron/dist/comm.h"
#include "deltatron/ops/cpu/gdn_ref.h"
#include "deltatron/ops/gdn.h"
#include "deltatron/ops/varlen.h"
#include "test_util.h"

namespace {

using dt::DType;
using dt::Shape;
using dt::Tensor;
using dt::TensorView;
using Vec = std::vector<double>;
namespace ref = dt::ops::cpu::ref;

constexpr double kFdTol = 1e-6;  // relative L2 error of analytic vs central-difference gradients

// ------------------------------------------------------------------ helpers
class Rand {
 public:
  explicit Rand(uint64_t salt) : gen_(dt::testing::test_seed() * 0x9E3779B97F4A7C15ull + salt) {}
  Vec uniform(size_t n, double lo, double hi) {
    std::uniform_real_distribution<double> d(lo, hi);
    Vec v(n);
    for (auto& x : v) x = d(gen_);
    return v;
  }
  Vec normal(size_t n, double std = 1.0) {
    std::normal_distribution<double> d(0.0, std);
    Vec v(n);
    for (auto& x : v) x = d(gen_);
    return v;
  }

 private:
  std::mt19937_64 gen_;
};

double dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences of loss() with respect to every element of x (x is restored).
Vec numgrad(Vec& x, const std::function<double()>& loss, double eps = 1e-6) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + eps;
    const double lp = loss();
    x[i] = x0 - eps;
    const double lm = loss();
    x[i] = x0;
    g[i] = (lp - lm) / (2 * eps);
  }
  return g;
}

// Fourth-order central differences (5-point stencil). For the recurrence, the loss is affine in
// exp(g_t), beta_t, v_t, h0 and linear in q_t, quadratic in k_t (one element at a time), so a
// large step has (almost) no truncation error and far less round-off than eps = 1e-6: strong
// decay makes dg tiny (~1e-7), below the ~1e-9 noise of the 2-point formula.
Vec numgrad5(Vec& x, const std::function<double()>& loss, double h = 1e-3) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    double f[4];
    const double off[4] = {2 * h, h, -h, -2 * h};
    for (int j = 0; j < 4; ++j) {
      x[i] = x0 + off[j];
      f[j] = loss();
    }
    x[i] = x0;
    g[i] = (-f[0] + 8 * f[1] - 8 * f[2] + f[3]) / (12 * h);
  }
  return g;
}

// Row-wise L2-normalised rows of width d (realistic keys).
void l2_rows(Vec& x, int64_t d) {
  for (size_t r = 0; r < x.size() / size_t(d); ++r) {
    double s = 0;
    for (int64_t i = 0; i < d; ++i) s += x[r * d + i] * x[r * d + i];
    for (int64_t i = 0; i < d; ++i) x[r * d + i] /= std::sqrt(s);
  }
}

std::vector<int32_t> cu_of(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> cu{0};
  for (int32_t L : lengths) cu.push_back(cu.back() + L);
  return cu;
}

bool all_finite(const Vec& v) {
  for (double x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

// f32 host tensors <-> double vectors; gather() reads any strided f32 CPU view (up to 4 dims).
Tensor tensor_of(const Vec& v, Shape s) {
  Tensor t = Tensor::empty(s, DType::f32);
  EXPECT_EQ(size_t(t.numel()), v.size());
  for (size_t i = 0; i < v.size(); ++i) t.ptr<float>()[i] = float(v[i]);
  return t;
}
std::vector<float> gather(const TensorView& v) {
  std::vector<float> out;
  out.reserve(size_t(v.numel()));
  int64_t sh[4] = {1, 1, 1, 1}, st[4] = {0, 0, 0, 0};
  const int off = 4 - v.ndim();
  for (int i = 0; i < v.ndim(); ++i) sh[off + i] = v.shape[i], st[off + i] = v.stride[i];
  const float* p = v.ptr<float>();
  for (int64_t a = 0; a < sh[0]; ++a)
    for (int64_t b = 0; b < sh[1]; ++b)
      for (int64_t c = 0; c < sh[2]; ++c)
        for (int64_t d = 0; d < sh[3]; ++d) out.push_back(p[a * st[0] + b * st[1] + c * st[2] + d * st[3]]);
  return out;
}
Vec to_vec(const TensorView& v) {
  auto f = gather(v);
  return Vec(f.begin(), f.end());
}
// Bitwise equality of two f32 sequences; reports the first difference.
::testing::AssertionResult bitwise_eq(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes " << a.size() << " vs " << b.size();
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "first difference at " << i << ": " << a[i] << " vs " << b[i];
  return ::testing::AssertionSuccess();
}
::testing::AssertionResult bitwise_eq(const Vec& a, const Vec& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes " << a.size() << " vs " << b.size();
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(double)) != 0)
      return ::testing::AssertionFailure() << "first difference at " << i << ": " << a[i] << " vs " << b[i];
  return ::testing::AssertionSuccess();
}
template <typename E>
ref::Rows<E> rows(std::vector<E>& v, int64_t ld) {
  return {v.data(), ld};
}
template <typename E>
ref::Rows<const E> crows(const std::vector<E>& v, int64_t ld) {
  return {v.data(), ld};
}

// ------------------------------------------------------------------ 1. conv1d
struct ConvProblem {
  std::vector<int32_t> cu;
  int64_t D;
  int W;
  bool silu, has_bias;
  Vec x, w, bias, wy;  // wy: loss weights, loss = sum(y * wy)

  int64_t T() const { return cu.back(); }
  int64_t N() const { return int64_t(cu.size()) - 1; }
  Vec forward() const {
    Vec y(size_t(T() * D));
    ref::conv1d_varlen_fwd<double>(rows(y, D), crows(x, D), w.data(), has_bias ? bias.data() : nullptr, D, W, silu,
                                   cu.data(), N());
    return y;
  }
  double loss() const { return dot(forward(), wy); }
  // dx, dw, dbias (parameter grads start from zero)
  void backward(Vec& dx, Vec& dw, Vec& db) const {
    dx.assign(x.size(), NAN);
    dw.assign(w.size(), 0.0);
    db.assign(size_t(D), 0.0);
    ref::conv1d_varlen_bwd<double>(rows(dx, D), dw.data(), has_bias ? db.data() : nullptr, crows(wy, D), crows(x, D),
                                   w.data(), has_bias ? bias.data() : nullptr, D, W, silu, cu.data(), N());
  }
};

ConvProblem make_conv(Rand& r, std::vector<int32_t> lengths, int64_t D, int W, bool silu, bool has_bias) {
  ConvProblem p{cu_of(lengths), D, W, silu, has_bias, {}, {}, {}, {}};
  p.x = r.normal(size_t(p.T() * D));
  p.w = r.normal(size_t(D * W), 0.5);
  p.bias = r.normal(size_t(D), 0.5);
  p.wy = r.normal(size_t(p.T() * D));
  return p;
}

TEST(GdnCpuRef, ConvBackwardMatchesFiniteDifferences) {
  Rand r(1);
  for (int W : {2, 3, 4, 8})
    for (bool silu : {false, true})
      for (bool has_bias : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "W=" << W << " silu=" << silu << " bias=" << has_bias);
        ConvProblem p = make_conv(r, {1, 2, 9, 4}, 3, W, silu, has_bias);
        Vec dx, dw, db;
        p.backward(dx, dw, db);
        auto loss = [&] { return p.loss(); };
        EXPECT_TRUE(dt::testing::close_rel(dx, numgrad(p.x, loss), kFdTol)) << "dx";
        EXPECT_TRUE(dt::testing::close_rel(dw, numgrad(p.w, loss), kFdTol)) << "dw";
        if (has_bias) EXPECT_TRUE(dt::testing::close_rel(db, numgrad(p.bias, loss), kFdTol)) << "dbias";
      }
}

// Taps never read another sequence: the first W-1 outputs of a sequence ignore its predecessor.
TEST(GdnCpuRef, ConvWindowNeverCrossesSequenceStart) {
  Rand r(2);
  ConvProblem p = make_conv(r, {5, 3, 1, 6}, 4, 4, true, true);
  Vec y0 = p.forward();
  for (int64_t t = 0; t < p.cu[1]; ++t)
    for (int64_t c = 0; c < p.D; ++c) p.x[size_t(t * p.D + c)] += 100.0;  // change sequence 0 only
  Vec y1 = p.forward();
  for (int64_t t = p.cu[1]; t < p.T(); ++t)
    for (int64_t c = 0; c < p.D; ++c) EXPECT_EQ(y0[size_t(t * p.D + c)], y1[size_t(t * p.D + c)]) << t << "," << c;
}

// Tap orientation (tap W-1 on the current token, HF conv1d with padding W-1): an impulse at a
// sequence start gives y_pre[start + i] = w[c, W-1-i] for i < W, then bias alone.
TEST(GdnCpuRef, ConvTapOrientation) {
  const int64_t D = 2;
  const int W = 4;
  ConvProblem p{cu_of({3, 8}), D, W, false, true, Vec(size_t(11 * D), 0.0), {}, {0.25, -0.5}, {}};
  for (int i = 0; i < D * W; ++i) p.w.push_back(1.0 + i);
  for (int64_t c = 0; c < D; ++c) p.x[size_t(3 * D + c)] = 1.0;  // impulse at the start of sequence 1
  const Vec y = p.forward();
  for (int64_t i = 0; i < 8; ++i)
    for (int64_t c = 0; c < D; ++c)
      EXPECT_EQ(y[size_t((3 + i) * D + c)], p.bias[size_t(c)] + (i < W ? p.w[size_t(c * W + (W - 1 - i))] : 0.0))
          << "token " << i << " channel " << c;
}

// ------------------------------------------------------------------ 2. l2norm
TEST(GdnCpuRef, L2NormBackwardMatchesFiniteDifferences) {
  Rand r(3);
  const int64_t R = 7, d = 6;
  const double eps = 1e-6;
  Vec x = r.normal(size_t(R * d)), wy = r.normal(size_t(R * d));
  for (int64_t i = 0; i < d; ++i) x[size_t(2 * d + i)] *= 1e-2;  // a small row: eps matters there
  auto fwd = [&](Vec& y, Vec& rstd) {
    y.assign(x.size(), 0.0);
    rstd.assign(size_t(R), 0.0);
    ref::l2norm_fwd<double>(rows(y, d), rstd.data(), crows(x, d), R, d, eps);
  };
  auto loss = [&] {
    Vec y, rs;
    fwd(y, rs);
    return dot(y, wy);
  };
  Vec y, rstd, dx(x.size(), NAN);
  fwd(y, rstd);
  for (int64_t rr = 0; rr < R; ++rr) {  // eps inside the root of the SUM
    double s = 0;
    for (int64_t i = 0; i < d; ++i) s += x[size_t(rr * d + i)] * x[size_t(rr * d + i)];
    EXPECT_DOUBLE_EQ(rstd[size_t(rr)], 1.0 / std::sqrt(s + eps));
  }
  ref::l2norm_bwd<double>(rows(dx, d), crows(wy, d), crows(x, d), rstd.data(), R, d);
  EXPECT_TRUE(dt::testing::close_rel(dx, numgrad(x, loss), kFdTol));
  // From y itself (what the fused conv + l2norm forward keeps): the same gradient.
  Vec dx_y(x.size(), NAN);
  ref::l2norm_bwd_y<double>(rows(dx_y, d), crows(wy, d), crows(y, d), rstd.data(), R, d);
  EXPECT_TRUE(dt::testing::close_rel(dx_y, numgrad(x, loss), kFdTol));
  EXPECT_TRUE(dt::testing::close_rel(dx_y, dx, 1e-12));
}

// ------------------------------------------------------------------ 3. gates
TEST(GdnCpuRef, GateBackwardMatchesFiniteDifferences) {
  Rand r(4);
  const int64_t T = 9, H = 3;
  Vec a = r.normal(size_t(T * H), 2.0), b = r.normal(size_t(T * H), 2.0);
  a[0] = 25.0;   // softplus linear branch (x > 20)
  a[4] = -30.0;  // deep in the exponential tail
  Vec A_log = r.uniform(size_t(H), 0.0, std::log(16.0)), dt_bias = r.uniform(size_t(H), -1.0, 1.0);
  Vec wg = r.normal(size_t(T * H)), wb = r.normal(size_t(T * H));
  auto loss = [&] {
    Vec g(size_t(T * H)), beta(size_t(T * H));
    ref::gate_fwd<double>(rows(g, H), rows(beta, H), crows(a, H), crows(b, H), A_log.data(), dt_bias.data(), T, H);
    return dot(g, wg) + dot(beta, wb);
  };
  Vec da(a.size(), NAN), db(b.size(), NAN), dA(size_t(H), 0.0), ddt(size_t(H), 0.0);
  ref::gate_bwd<double>(rows(da, H), rows(db, H), dA.data(), ddt.data(), crows(wg, H), crows(wb, H), crows(a, H),
                        crows(b, H), A_log.data(), dt_bias.data(), T, H);
  EXPECT_TRUE(dt::testing::close_rel(da, numgrad(a, loss), kFdTol)) << "da";
  EXPECT_TRUE(dt::testing::close_rel(db, numgrad(b, loss), kFdTol)) << "db";
  EXPECT_TRUE(dt::testing::close_rel(dA, numgrad(A_log, loss), kFdTol)) << "dA_log";
  EXPECT_TRUE(dt::testing::close_rel(ddt, numgrad(dt_bias, loss), kFdTol)) << "ddt_bias";
  // g <= 0 always, and softplus(x) = x above 20
  Vec g(size_t(T * H)), beta(size_t(T * H));
  ref::gate_fwd<double>(rows(g, H), rows(beta, H), crows(a, H), crows(b, H), A_log.data(), dt_bias.data(), T, H);
  for (double x : g) EXPECT_LE(x, 0.0);
  EXPECT_DOUBLE_EQ(g[0], -std::exp(A_log[0]) * (a[0] + dt_bias[0]));
}

// ------------------------------------------------------------------ 5. gated RMSNorm
TEST(GdnCpuRef, GatedRmsnormBackwardMatchesFiniteDifferences) {
  Rand r(5);
  const int64_t R = 6, d = 8;
  const double eps = 1e-6;
  Vec o = r.normal(size_t(R * d)), z = r.normal(size_t(R * d), 2.0), w = r.uniform(size_t(d), 0.5, 1.5);
  Vec wy = r.normal(size_t(R * d));
  auto fwd = [&](Vec& y, Vec& rstd) {
    y.assign(o.size(), 0.0);
    rstd.assign(size_t(R), 0.0);
    ref::gated_rmsnorm_fwd<double>(rows(y, d), rstd.data(), crows(o, d), crows(z, d), w.data(), R, d, eps);
  };
  auto loss = [&] {
    Vec y, rs;
    fwd(y, rs);
    return dot(y, wy);
  };
  Vec y, rstd, dO(o.size(), NAN), dz(z.size(), NAN), dw(size_t(d), 0.0);
  fwd(y, rstd);
  ref::gated_rmsnorm_bwd<double>(rows(dO, d), rows(dz, d), dw.data(), crows(wy, d), crows(o, d), crows(z, d), w.data(),
                                 rstd.data(), R, d);
  EXPECT_TRUE(dt::testing::close_rel(dO, numgrad(o, loss), kFdTol)) << "do";
  EXPECT_TRUE(dt::testing::close_rel(dz, numgrad(z, loss), kFdTol)) << "dz";
  EXPECT_TRUE(dt::testing::close_rel(dw, numgrad(w, loss), kFdTol)) << "dw";
}

// ------------------------------------------------------------------ 4. gated delta rule
struct GdnProblem {
  std::vector<int32_t> cu;
  int64_t Hk, Hv, dk, dv;
  bool use_h0, use_dht;
  Vec q, k, v, g, beta, h0, dO, dht;  // q, k [T, Hk, dk]; v, dO [T, Hv, dv]; g, beta [T, Hv]; h0, dht [N, Hv, dk, dv]

  int64_t T() const { return cu.back(); }
  int64_t N() const { return int64_t(cu.size()) - 1; }
  ref::GdnRefShape shape() const { return {N(), Hk, Hv, dk, dv, 1.0 / std::sqrt(double(dk))}; }
  void forward(Vec& o, Vec& ht) const {
    o.assign(size_t(T() * Hv * dv), NAN);
    ht.assign(size_t(N() * Hv * dk * dv), NAN);
    ref::GdnRefFwd<double> a;
    a.o = rows(o, Hv * dv);
    a.ht = ht.data();
    a.q = crows(q, Hk * dk);
    a.k = crows(k, Hk * dk);
    a.v = crows(v, Hv * dv);
    a.g = crows(g, Hv);
    a.beta = crows(beta, Hv);
    a.h0 = use_h0 ? h0.data() : nullptr;
    ref::gdn_recurrent_fwd<double>(a, shape(), cu.data());
  }
  double loss() const {
    Vec o, ht;
    forward(o, ht);
    return dot(o, dO) + (use_dht ? dot(ht, dht) : 0.0);
  }
  struct Grads {
    Vec dq, dk, dv, dg, dbeta, dh0;
  };
  Grads backward(int64_t ckpt) const {
    Grads r{Vec(q.size(), NAN), Vec(k.size(), NAN), Vec(v.size(), NAN),
            Vec(g.size(), NAN), Vec(beta.size(), NAN), Vec(h0.size(), NAN)};
    ref::GdnRefBwd<double> a;
    a.dq = rows(r.dq, Hk * dk);
    a.dk = rows(r.dk, Hk * dk);
    a.dv = rows(r.dv, Hv * dv);
    a.dg = rows(r.dg, Hv);
    a.dbeta = rows(r.dbeta, Hv);
    a.dh0 = r.dh0.data();
    a.do_ = crows(dO, Hv * dv);
    a.dht = use_dht ? dht.data() : nullptr;
    a.q = crows(q, Hk * dk);
    a.k = crows(k, Hk * dk);
    a.v = crows(v, Hv * dv);
    a.g = crows(g, Hv);
    a.beta = crows(beta, Hv);
    a.h0 = use_h0 ? h0.data() : nullptr;
    ref::gdn_recurrent_bwd<double>(a, shape(), cu.data(), ckpt);
    return r;
  }
};

struct GdnSpec {
  std::vector<int32_t> lengths;
  int64_t Hk, Hv, dk, dv;
  double g_lo, g_hi, b_lo, b_hi;
  bool use_h0, use_dht;
};

GdnProblem make_gdn(Rand& r, const GdnSpec& s) {
  GdnProblem p{cu_of(s.lengths), s.Hk, s.Hv, s.dk, s.dv, s.use_h0, s.use_dht, {}, {}, {}, {}, {}, {}, {}, {}};
  const size_t T = size_t(p.T()), N = size_t(p.N());
  p.q = r.normal(T * s.Hk * s.dk);
  p.k = r.normal(T * s.Hk * s.dk);
  l2_rows(p.k, s.dk);
  p.v = r.normal(T * s.Hv * s.dv);
  p.g = r.uniform(T * s.Hv, s.g_lo, s.g_hi);
  p.beta = r.uniform(T * s.Hv, s.b_lo, s.b_hi);
  p.h0 = r.normal(N * s.Hv * s.dk * s.dv);
  p.dO = r.normal(T * s.Hv * s.dv);
  p.dht = r.normal(N * s.Hv * s.dk * s.dv);
  return p;
}

struct GdnFdCase {
  const char* name;
  GdnSpec spec;
  int64_t ckpt;
};

void PrintTo(const GdnFdCase& c, std::ostream* os) { *os << c.name; }

class GdnRecurrenceFd : public ::testing::TestWithParam<GdnFdCase> {};

TEST_P(GdnRecurrenceFd, BackwardMatchesFiniteDifferences) {
  const GdnFdCase& c = GetParam();
  Rand r(100 + uint64_t(c.ckpt) * 7 + uint64_t(c.spec.lengths.size()));
  GdnProblem p = make_gdn(r, c.spec);
  const auto gr = p.backward(c.ckpt);
  auto loss = [&] { return p.loss(); };
  EXPECT_TRUE(dt::testing::close_rel(gr.dq, numgrad5(p.q, loss), kFdTol)) << "dq";
  EXPECT_TRUE(dt::testing::close_rel(gr.dk, numgrad5(p.k, loss), kFdTol)) << "dk";
  EXPECT_TRUE(dt::testing::close_rel(gr.dv, numgrad5(p.v, loss), kFdTol)) << "dv";
  EXPECT_TRUE(dt::testing::close_rel(gr.dg, numgrad5(p.g, loss), kFdTol)) << "dg";
  EXPECT_TRUE(dt::testing::close_rel(gr.dbeta, numgrad5(p.beta, loss), kFdTol)) << "dbeta";
  if (p.use_h0) {
    EXPECT_TRUE(dt::testing::close_rel(gr.dh0, numgrad5(p.h0, loss), kFdTol)) << "dh0";
  } else {
    // Invariant (gdn-math.md 4.4): with h0 = 0, g at a sequence's first token scales a zero state.
    for (int64_t n = 0; n < p.N(); ++n)
      for (int64_t h = 0; h < p.Hv; ++h)
        if (p.cu[n + 1] > p.cu[n]) EXPECT_EQ(gr.dg[size_t(p.cu[n] * p.Hv + h)], 0.0) << "seq " << n << " head " << h;
  }
  // The checkpoint interval only changes memory, never a bit of the result.
  const auto g1 = p.backward(1);
  EXPECT_TRUE(bitwise_eq(gr.dq, g1.dq));
  EXPECT_TRUE(bitwise_eq(gr.dk, g1.dk));
  EXPECT_TRUE(bitwise_eq(gr.dv, g1.dv));
  EXPECT_TRUE(bitwise_eq(gr.dg, g1.dg));
  EXPECT_TRUE(bitwise_eq(gr.dbeta, g1.dbeta));
  EXPECT_TRUE(bitwise_eq(gr.dh0, g1.dh0));
}

// GQA (Hk = 2, Hv = 4), dk != dv to catch transposes. Small checkpoint intervals make short
// sequences cross several checkpoint segments, with a partial last one.
INSTANTIATE_TEST_SUITE_P(
    GdnCpuRef, GdnRecurrenceFd,
    ::testing::Values(
        GdnFdCase{"moderate_h0_dht", {{1, 2, 9, 6}, 2, 4, 5, 3, -1.0, -0.01, 0.05, 0.95, true, true}, 4},
        GdnFdCase{"strong_decay_beta_near_1", {{2, 1, 11}, 2, 4, 5, 3, -20.0, -2.0, 0.97, 0.9999, true, true}, 4},
        GdnFdCase{"no_state", {{1, 2, 5, 7}, 2, 4, 5, 3, -2.0, -0.01, 0.05, 0.95, false, false}, 64},
        GdnFdCase{"partial_chunk_70", {{70, 2, 1}, 2, 4, 4, 3, -0.3, -0.01, 0.05, 0.95, true, true}, 64},
        GdnFdCase{"mixed_decay_dht_only", {{3, 13}, 2, 4, 3, 4, -20.0, -0.001, 0.5, 0.9999, false, true}, 5}),
    [](const ::testing::TestParamInfo<GdnFdCase>& i) { return std::string(i.param.name); });

// The forward equals the closed form of gdn-math.md section 2, evaluated with dense matrices
// (an independent formulation): S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,
// o_t = scale * S_t^T q_t, with v-head h reading key head h / (Hv / Hk) (repeat_interleave).
TEST(GdnCpuRef, ForwardMatchesClosedFormWithGqaMapping) {
  Rand r(13);
  GdnProblem p = make_gdn(r, {{1, 4, 9}, 2, 6, 5, 3, -3.0, -0.01, 0.05, 0.99, true, true});
  Vec o, ht;
  p.forward(o, ht);
  const int64_t Hk = p.Hk, Hv = p.Hv, dk = p.dk, dv = p.dv, G = Hv / Hk;
  const double scale = 1.0 / std::sqrt(double(dk));
  Vec o_cf(o.size()), ht_cf(ht.size());
  for (int64_t n = 0; n < p.N(); ++n)
    for (int64_t h = 0; h < Hv; ++h) {
      const int64_t kh = h / G;
      Vec S(p.h0.begin() + (n * Hv + h) * dk * dv, p.h0.begin() + (n * Hv + h + 1) * dk * dv);
      for (int64_t t = p.cu[size_t(n)]; t < p.cu[size_t(n + 1)]; ++t) {
        const double* k = &p.k[size_t((t * Hk + kh) * dk)];
        const double* q = &p.q[size_t((t * Hk + kh) * dk)];
        const double* v = &p.v[size_t((t * Hv + h) * dv)];
        const double eg = std::exp(p.g[size_t(t * Hv + h)]), b = p.beta[size_t(t * Hv + h)];
        Vec A(size_t(dk * dk)), S2(S.size(), 0.0);
        for (int64_t i = 0; i < dk; ++i)
          for (int64_t j = 0; j < dk; ++j) A[size_t(i * dk + j)] = eg * ((i == j ? 1.0 : 0.0) - b * k[i] * k[j]);
        for (int64_t i = 0; i < dk; ++i)
          for (int64_t j = 0; j < dv; ++j) {
            double acc = b * k[i] * v[j];
            for (int64_t m = 0; m < dk; ++m) acc += A[size_t(i * dk + m)] * S[size_t(m * dv + j)];
            S2[size_t(i * dv + j)] = acc;
          }
        S = S2;
        for (int64_t j = 0; j < dv; ++j) {
          double acc = 0.0;
          for (int64_t i = 0; i < dk; ++i) acc += S[size_t(i * dv + j)] * q[i];
          o_cf[size_t((t * Hv + h) * dv + j)] = scale * acc;
        }
      }
      std::copy(S.begin(), S.end(), ht_cf.begin() + (n * Hv + h) * dk * dv);
    }
  EXPECT_TRUE(dt::testing::close_rel(o, o_cf, 1e-12)) << "o";
  EXPECT_TRUE(dt::testing::close_rel(ht, ht_cf, 1e-12)) << "ht";
}

// A sequence run in two parts, ht of the first passed as h0 of the second, equals the whole run;
// the backward composes the same way (dh0 of part 2 fed as dht of part 1). Bitwise, float64.
TEST(GdnCpuRef, StateHandOverComposesBitwise) {
  Rand r(6);
  GdnProblem whole = make_gdn(r, {{150, 90}, 2, 4, 8, 6, -3.0, -0.01, 0.1, 0.99, true, true});
  const std::vector<int32_t> split{37, 64};  // split points inside sequence 0 and 1
  const int64_t Hk = whole.Hk, Hv = whole.Hv, dk = whole.dk, dv = whole.dv;
  // token index lists of part 1 and part 2, in packed order
  std::vector<int64_t> tok1, tok2;
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t t = whole.cu[n]; t < whole.cu[n + 1]; ++t) (t - whole.cu[n] < split[n] ? tok1 : tok2).push_back(t);
  auto take = [](const Vec& src, const std::vector<int64_t>& toks, int64_t w) {
    Vec out;
    for (int64_t t : toks) out.insert(out.end(), src.begin() + t * w, src.begin() + (t + 1) * w);
    return out;
  };
  auto part = [&](const std::vector<int64_t>& toks, std::vector<int32_t> lengths) {
    GdnProblem p = whole;
    p.cu = cu_of(lengths);
    p.q = take(whole.q, toks, Hk * dk);
    p.k = take(whole.k, toks, Hk * dk);
    p.v = take(whole.v, toks, Hv * dv);
    p.dO = take(whole.dO, toks, Hv * dv);
    p.g = take(whole.g, toks, Hv);
    p.beta = take(whole.beta, toks, Hv);
    return p;
  };
  GdnProblem p1 = part(tok1, {split[0], split[1]});
  GdnProblem p2 = part(tok2, {150 - split[0], 90 - split[1]});

  Vec o, ht, o1, ht1, o2, ht2;
  whole.forward(o, ht);
  p1.forward(o1, ht1);
  p2.h0 = ht1;
  p2.forward(o2, ht2);
  EXPECT_TRUE(bitwise_eq(take(o, tok1, Hv * dv), o1));
  EXPECT_TRUE(bitwise_eq(take(o, tok2, Hv * dv), o2));
  EXPECT_TRUE(bitwise_eq(ht, ht2));

  const auto gw = whole.backward(64);
  const auto g2 = p2.backward(64);
  p1.dht = g2.dh0;
  const auto g1 = p1.backward(64);
  EXPECT_TRUE(bitwise_eq(gw.dh0, g1.dh0));
  EXPECT_TRUE(bitwise_eq(take(gw.dq, tok1, Hk * dk), g1.dq));
  EXPECT_TRUE(bitwise_eq(take(gw.dk, tok1, Hk * dk), g1.dk));
  EXPECT_TRUE(bitwise_eq(take(gw.dv, tok1, Hv * dv), g1.dv));
  EXPECT_TRUE(bitwise_eq(take(gw.dg, tok1, Hv), g1.dg));
  EXPECT_TRUE(bitwise_eq(take(gw.dbeta, tok1, Hv), g1.dbeta));
  EXPECT_TRUE(bitwise_eq(take(gw.dq, tok2, Hk * dk), g2.dq));
  EXPECT_TRUE(bitwise_eq(take(gw.dk, tok2, Hk * dk), g2.dk));
  EXPECT_TRUE(bitwise_eq(take(gw.dg, tok2, Hv), g2.dg));
}

// ------------------------------------------------------------------ f32 ops through dt::ops (TensorView)
struct GdnTensors {
  Tensor q, k, v, g, beta, h0, dO, dht;
};
GdnTensors gdn_tensors(const GdnProblem& p) {
  const int64_t T = p.T(), N = p.N();
  return {tensor_of(p.q, {T, p.Hk, p.dk}),    tensor_of(p.k, {T, p.Hk, p.dk}),
          tensor_of(p.v, {T, p.Hv, p.dv}),    tensor_of(p.g, {T, p.Hv}),
          tensor_of(p.beta, {T, p.Hv}),       tensor_of(p.h0, {N, p.Hv, p.dk, p.dv}),
          tensor_of(p.dO, {T, p.Hv, p.dv}),   tensor_of(p.dht, {N, p.Hv, p.dk, p.dv})};
}
struct GdnOut {
  Tensor o, ht, dq, dk, dv, dg, dbeta, dh0;
};
// Runs fwd + bwd on tokens [t0, t1) and states [n0, n1) of the packed tensors (views, no copies).
GdnOut run_gdn_ops(const GdnTensors& in, const std::vector<int32_t>& cu, int64_t n0, int64_t n1) {
  const int64_t t0 = cu[size_t(n0)], t1 = cu[size_t(n1)];
  std::vector<int32_t> local;
  for (int64_t n = n0; n <= n1; ++n) local.push_back(cu[size_t(n)] - int32_t(t0));
  dt::ops::VarlenBatch vb(local);
  auto tok = [&](const Tensor& x) { return x.view().slice(0, t0, t1); };
  auto seq = [&](const Tensor& x) { return x.view().slice(0, n0, n1); };
  const Shape qs = tok(in.q).shape, vs = tok(in.v).shape, gs = tok(in.g).shape, ss = seq(in.h0).shape;
  GdnOut r{Tensor::empty(vs, DType::f32),  Tensor::empty(ss, DType::f32), Tensor::empty(qs, DType::f32),
           Tensor::empty(qs, DType::f32),  Tensor::empty(vs, DType::f32), Tensor::empty(gs, DType::f32),
           Tensor::empty(gs, DType::f32),  Tensor::empty(ss, DType::f32)};
  for (const Tensor* t : {&r.o, &r.ht, &r.dq, &r.dk, &r.dv, &r.dg, &r.dbeta, &r.dh0}) dt::testing::poison(*t);
  dt::ops::gdn_chunk_fwd(r.o, r.ht, tok(in.q), tok(in.k), tok(in.v), tok(in.g), tok(in.beta), seq(in.h0), {},
                         vb.meta());
  dt::ops::gdn_chunk_bwd(r.dq, r.dk, r.dv, r.dg, r.dbeta, r.dh0, tok(in.dO), seq(in.dht), tok(in.q), tok(in.k),
                         tok(in.v), tok(in.g), tok(in.beta), seq(in.h0), {}, vb.meta());
  return r;
}

const std::vector<int32_t> kPackLengths{1, 2, 63, 64, 65, 127, 300};

TEST(GdnCpuOps, GdnPackedEqualsSeparateBitwise) {
  Rand r(7);
  GdnProblem p = make_gdn(r, {kPackLengths, 2, 4, 16, 16, -4.0, -0.01, 0.05, 0.99, true, true});
  const GdnTensors in = gdn_tensors(p);
  const GdnOut packed = run_gdn_ops(in, p.cu, 0, p.N());
  for (int64_t n = 0; n < p.N(); ++n) {
    SCOPED_TRACE(::testing::Message() << "sequence " << n << " of length " << kPackLengths[size_t(n)]);
    const GdnOut one = run_gdn_ops(in, p.cu, n, n + 1);
    auto tok = [&](const Tensor& x) { return gather(x.view().slice(0, p.cu[size_t(n)], p.cu[size_t(n + 1)])); };
    auto seq = [&](const Tensor& x) { return gather(x.view().slice(0, n, n + 1)); };
    EXPECT_TRUE(bitwise_eq(tok(packed.o), gather(one.o))) << "o";
    EXPECT_TRUE(bitwise_eq(seq(packed.ht), gather(one.ht))) << "ht";
    EXPECT_TRUE(bitwise_eq(tok(packed.dq), gather(one.dq))) << "dq";
    EXPECT_TRUE(bitwise_eq(tok(packed.dk), gather(one.dk))) << "dk";
    EXPECT_TRUE(bitwise_eq(tok(packed.dv), gather(one.dv))) << "dv";
    EXPECT_TRUE(bitwise_eq(tok(packed.dg), gather(one.dg))) << "dg";
    EXPECT_TRUE(bitwise_eq(tok(packed.dbeta), gather(one.dbeta))) << "dbeta";
    EXPECT_TRUE(bitwise_eq(seq(packed.dh0), gather(one.dh0))) << "dh0";
  }
}

// The f32 op equals the float64 reference rounded (internal math is double in both).
TEST(GdnCpuOps, GdnF32MatchesFloat64) {
  Rand r(8);
  GdnProblem p = make_gdn(r, {{1, 2, 65, 30}, 2, 4, 16, 8, -6.0, -0.01, 0.05, 0.999, true, true});
  const GdnOut got = run_gdn_ops(gdn_tensors(p), p.cu, 0, p.N());
  // the reference sees the f32-rounded inputs
  for (Vec* x : {&p.q, &p.k, &p.v, &p.g, &p.beta, &p.h0, &p.dO, &p.dht})
    for (double& e : *x) e = double(float(e));
  Vec o, ht;
  p.forward(o, ht);
  const auto gr = p.backward(64);
  const double tol = 1e-6;
  EXPECT_TRUE(dt::testing::close_rel(to_vec(got.o), o, tol)) << "o";
  EXPECT_TRUE(dt::testing::close_rel(to_vec(got.ht), ht, tol)) << "ht";
  EXPECT_TRUE(dt::testing::close_rel(to_vec(got.dq), gr.dq, tol)) << "dq";
  EXPECT_TRUE(dt::testing::close_rel(to_vec(got.dk), gr.dk, tol)) << "dk";
  EXPECT_TRUE(dt::testing::close_rel(to_vec(got.dv), gr.dv, tol)) << "dv";
  EXPECT_TRUE(dt::testing::close_rel(to_vec(got.dg), gr.dg, tol)) << "dg";
  EXPECT_TRUE(dt::testing::close_rel(to_vec(got.dbeta), gr.dbeta, tol)) << "dbeta";
  EXPECT_TRUE(dt::testing::close_rel(to_vec(got.dh0), gr.dh0, tol)) << "dh0";
}

// Strided token rows (q, k, v as slices of a wider buffer, as after the fused conv), absent
// h0 / dht, and a zero-length sequence (ht = h0 = 0 there, dh0 = dht = 0).
TEST(GdnCpuOps, GdnStridedViewsAndAbsentStates) {
  Rand r(9);
  const int64_t Hk = 1, Hv = 2, dk = 8, dv = 8;
  GdnProblem p = make_gdn(r, {{5, 0, 17}, Hk, Hv, dk, dv, -2.0, -0.01, 0.1, 0.9, false, false});
  const int64_t T = p.T(), N = p.N(), W = 2 * Hk * dk + Hv * dv + 3;  // [q | k | v | pad] per token
  Tensor buf = Tensor::empty({T, W}, DType::f32);
  for (int64_t t = 0; t < T; ++t) {
    float* row = buf.ptr<float>() + t * W;
    for (int64_t i = 0; i < Hk * dk; ++i) row[i] = float(p.q[size_t(t * Hk * dk + i)]);
    for (int64_t i = 0; i < Hk * dk; ++i) row[Hk * dk + i] = float(p.k[size_t(t * Hk * dk + i)]);
    for (int64_t i = 0; i < Hv * dv; ++i) row[2 * Hk * dk + i] = float(p.v[size_t(t * Hv * dv + i)]);
  }
  auto sect = [&](int64_t c0, int64_t c1, int64_t H, int64_t d) {
    TensorView s = buf.view().slice(1, c0, c1);
    s.shape = Shape{T, H, d};
    s.stride = {W, d, 1, 0, 0, 0};
    return s;
  };
  const TensorView q = sect(0, Hk * dk, Hk, dk), k = sect(Hk * dk, 2 * Hk * dk, Hk, dk),
                   v = sect(2 * Hk * dk, 2 * Hk * dk + Hv * dv, Hv, dv);
  Tensor g = tensor_of(p.g, {T, Hv}), beta = tensor_of(p.beta, {T, Hv}), dO = tensor_of(p.dO, {T, Hv, dv});
  Tensor o = Tensor::empty({T, Hv, dv}, DType::f32), ht = Tensor::empty({N, Hv, dk, dv}, DType::f32);
  Tensor dq = Tensor::empty({T, Hk, dk}, DType::f32), dk_ = Tensor::empty({T, Hk, dk}, DType::f32);
  Tensor dv_ = Tensor::empty({T, Hv, dv}, DType::f32), dg = Tensor::empty({T, Hv}, DType::f32);
  Tensor dbeta = Tensor::empty({T, Hv}, DType::f32), dh0 = Tensor::empty({N, Hv, dk, dv}, DType::f32);
  for (const Tensor* t : {&o, &ht, &dq, &dk_, &dv_, &dg, &dbeta, &dh0}) dt::testing::poison(*t);
  dt::ops::VarlenBatch vb(p.cu);
  const TensorView none;
  dt::ops::gdn_chunk_fwd(o, ht, q, k, v, g, beta, none, {}, vb.meta());
  dt::ops::gdn_chunk_bwd(dq, dk_, dv_, dg, dbeta, dh0, dO, none, q, k, v, g, beta, none, {}, vb.meta());
  for (Vec* x : {&p.q, &p.k, &p.v, &p.g, &p.beta, &p.dO})
    for (double& e : *x) e = double(float(e));
  Vec o_ref, ht_ref;
  p.forward(o_ref, ht_ref);
  const auto gr = p.backward(64);
  EXPECT_TRUE(dt::testing::close_rel(to_vec(o), o_ref, 1e-6)) << "o";
  EXPECT_TRUE(dt::testing::close_rel(to_vec(ht), ht_ref, 1e-6)) << "ht";
  EXPECT_TRUE(dt::testing::close_rel(to_vec(dq), gr.dq, 1e-6)) << "dq";
  EXPECT_TRUE(dt::testing::close_rel(to_vec(dk_), gr.dk, 1e-6)) << "dk";
  EXPECT_TRUE(dt::testing::close_rel(to_vec(dv_), gr.dv, 1e-6)) << "dv";
  EXPECT_TRUE(dt::testing::close_rel(to_vec(dg), gr.dg, 1e-6)) << "dg";
  EXPECT_TRUE(dt::testing::close_rel(to_vec(dbeta), gr.dbeta, 1e-6)) << "dbeta";
  EXPECT_TRUE(dt::testing::close_rel(to_vec(dh0), gr.dh0, 1e-6)) << "dh0";
  const auto ht1 = gather(ht.view().slice(0, 1, 2)), dh01 = gather(dh0.view().slice(0, 1, 2));
  for (size_t i = 0; i < ht1.size(); ++i) {
    EXPECT_EQ(ht1[i], 0.0f) << "ht of the empty sequence";
    EXPECT_EQ(dh01[i], 0.0f) << "dh0 of the empty sequence";
  }
}

// 4097 tokens under strong decay (g in [-20, -5]) or almost none (g ~ -1e-4), beta ~ 1.
TEST(GdnCpuOps, GdnLongSequenceStaysFinite) {
  for (auto [g_lo, g_hi] : {std::pair{-20.0, -5.0}, std::pair{-1e-4, -1e-6}}) {
    SCOPED_TRACE(::testing::Message() << "g in [" << g_lo << ", " << g_hi << "]");
    Rand r(10);
    GdnProblem p = make_gdn(r, {{4097, 3}, 1, 2, 32, 32, g_lo, g_hi, 0.99, 1.0, true, true});
    const GdnOut out = run_gdn_ops(gdn_tensors(p), p.cu, 0, p.N());
    for (const Tensor* t : {&out.o, &out.ht, &out.dq, &out.dk, &out.dv, &out.dg, &out.dbeta, &out.dh0})
      EXPECT_TRUE(all_finite(to_vec(*t))) << t->view().str();
  }
}

TEST(GdnCpuOps, ConvPackedEqualsSeparate) {
  Rand r(11);
  const int64_t D = 80;  // two channel blocks of the backward
  ConvProblem p = make_conv(r, kPackLengths, D, 4, true, true);
  const int64_t T = p.T();
  // float64 reference: outputs, dx, and dw / dbias (per-sequence partials, added in order) bitwise
  Vec y = p.forward(), dx, dw, db;
  p.backward(dx, dw, db);
  Vec dw_sep(dw.size(), 0.0), db_sep(db.size(), 0.0);
  // f32 ops: y, dx bitwise; dw, dbias (+=) close
  Tensor x = tensor_of(p.x, {T, D}), w = tensor_of(p.w, {D, 4}), bias = tensor_of(p.bias, {D});
  Tensor dy = tensor_of(p.wy, {T, D});
  Tensor yp = Tensor::empty({T, D}, DType::f32), dxp = Tensor::empty({T, D}, DType::f32);
  Tensor dwp = Tensor::zeros({D, 4}, DType::f32), dbp = Tensor::zeros({D}, DType::f32);
  Tensor dws = Tensor::zeros({D, 4}, DType::f32), dbs = Tensor::zeros({D}, DType::f32);
  dt::ops::VarlenBatch vb(p.cu);
  dt::ops::causal_conv1d_fwd(yp, x, w, bias, true, vb.meta());
  dt::ops::causal_conv1d_bwd(dxp, dwp, dbp, dy, x, w, bias, true, vb.meta());
  for (int64_t n = 0; n < p.N(); ++n) {
    SCOPED_TRACE(::testing::Message() << "sequence " << n);
    const int32_t t0 = p.cu[size_t(n)], t1 = p.cu[size_t(n + 1)];
    ConvProblem one = p;
    one.cu = {0, t1 - t0};
    one.x.assign(p.x.begin() + t0 * D, p.x.begin() + t1 * D);
    one.wy.assign(p.wy.begin() + t0 * D, p.wy.begin() + t1 * D);
    Vec y1 = one.forward(), dx1, dw1, db1;
    one.backward(dx1, dw1, db1);
    EXPECT_TRUE(bitwise_eq(Vec(y.begin() + t0 * D, y.begin() + t1 * D), y1)) << "y";
    EXPECT_TRUE(bitwise_eq(Vec(dx.begin() + t0 * D, dx.begin() + t1 * D), dx1)) << "dx";
    for (size_t i = 0; i < dw.size(); ++i) dw_sep[i] += dw1[i];
    for (size_t i = 0; i < db.size(); ++i) db_sep[i] += db1[i];

    dt::ops::VarlenBatch vb1(one.cu);
    Tensor y1p = Tensor::empty({t1 - t0, D}, DType::f32), dx1p = Tensor::empty({t1 - t0, D}, DType::f32);
    dt::ops::causal_conv1d_fwd(y1p, x.view().slice(0, t0, t1), w, bias, true, vb1.meta());
    dt::ops::causal_conv1d_bwd(dx1p, dws, dbs, dy.view().slice(0, t0, t1), x.view().slice(0, t0, t1), w, bias, true,
                               vb1.meta());
    EXPECT_TRUE(bitwise_eq(gather(yp.view().slice(0, t0, t1)), gather(y1p))) << "f32 y";
    EXPECT_TRUE(bitwise_eq(gather(dxp.view().slice(0, t0, t1)), gather(dx1p))) << "f32 dx";
  }
  EXPECT_TRUE(bitwise_eq(dw, dw_sep)) << "dw";
  EXPECT_TRUE(bitwise_eq(db, db_sep)) << "dbias";
  EXPECT_TRUE(dt::testing::close_rel(to_vec(dws), to_vec(dwp), 1e-6)) << "f32 dw";
  EXPECT_TRUE(dt::testing::close_rel(to_vec(dbs), to_vec(dbp), 1e-6)) << "f32 dbias";
  EXPECT_TRUE(dt::testing::close_rel(to_vec(dwp), dw, 1e-6)) << "f32 dw vs float64";
}

// causal_conv1d_l2norm_fwd / _bwd (the layer's conv + q/k L2 norm): qn, kn, rstd, v and dx, dw
// against the float64 conv and l2norm references; a v of the wrong width fails naming the rule.
TEST(GdnCpuOps, ConvL2NormMatchesFloat64) {
  Rand r(12);
  const int64_t H = 2, d = 8, Dv = 12, D = 2 * H * d + Dv;
  ConvProblem p = make_conv(r, kPackLengths, D, 4, true, false);
  const int64_t T = p.T();
  Vec c = p.forward();  // [T, D] float64 conv output, then each q|k head row normalised in place
  Vec rs(size_t(2 * T * H));
  for (int sec = 0; sec < 2; ++sec) {
    Vec xs(size_t(T * H * d)), ys(xs.size());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < H * d; ++i) xs[size_t(t * H * d + i)] = c[size_t(t * D + sec * H * d + i)];
    ref::l2norm_fwd<double>(rows(ys, d), rs.data() + sec * T * H, crows(xs, d), T * H, d, 1e-6);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < H * d; ++i) c[size_t(t * D + sec * H * d + i)] = ys[size_t(t * H * d + i)];
  }
  Tensor x = tensor_of(p.x, {T, D}), w = tensor_of(p.w, {D, 4});
  Tensor qn = Tensor::empty({T, H, d}, DType::f32), kn = Tensor::empty({T, H, d}, DType::f32);
  Tensor rq = Tensor::empty({T * H}, DType::f32), rk = Tensor::empty({T * H}, DType::f32);
  Tensor v = Tensor::empty({T, Dv}, DType::f32);
  for (Tensor* e : {&qn, &kn, &rq, &rk, &v}) dt::testing::poison(*e);
  dt::ops::VarlenBatch vb(p.cu);
  dt::ops::causal_conv1d_l2norm_fwd({qn, kn, rq, rk, v}, x, w, TensorView{}, true, 1e-6f, vb.meta(), nullptr);
  Vec got;
  for (int64_t t = 0; t < T; ++t) {
    for (const Tensor* e : {&qn, &kn})
      for (int64_t i = 0; i < H * d; ++i) got.push_back(e->ptr<float>()[t * H * d + i]);
    for (int64_t i = 0; i < Dv; ++i) got.push_back(v.ptr<float>()[t * Dv + i]);
  }
  EXPECT_TRUE(dt::testing::close_rel(got, c, 1e-6)) << "qn | kn | v";
  Vec got_rs = to_vec(rq), rk_v = to_vec(rk);
  got_rs.insert(got_rs.end(), rk_v.begin(), rk_v.end());
  EXPECT_TRUE(dt::testing::close_rel(got_rs, rs, 1e-6)) << "rstd";

  // Backward (causal_conv1d_l2norm_bwd): dc = [l2norm_bwd_y(dq) | l2norm_bwd_y(dk) | dv], then the
  // conv backward, all in float64; the op from the f32 qn, kn, rstd.
  Vec dqk[2] = {r.normal(size_t(T * H * d)), r.normal(size_t(T * H * d))}, dv = r.normal(size_t(T * Dv));
  for (Vec* e : {&dqk[0], &dqk[1], &dv})
    for (double& u : *e) u = double(float(u));
  Vec dc(size_t(T * D));
  for (int sec = 0; sec < 2; ++sec) {
    Vec ys(size_t(T * H * d)), dxs(ys.size());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < H * d; ++i) ys[size_t(t * H * d + i)] = c[size_t(t * D + sec * H * d + i)];
    ref::l2norm_bwd_y<double>(rows(dxs, d), crows(dqk[sec], d), crows(ys, d), rs.data() + sec * T * H, T * H, d);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < H * d; ++i) dc[size_t(t * D + sec * H * d + i)] = dxs[size_t(t * H * d + i)];
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < Dv; ++i) dc[size_t(t * D + 2 * H * d + i)] = dv[size_t(t * Dv + i)];
  p.wy = dc;
  Vec dx_r, dw_r, db_r;
  p.backward(dx_r, dw_r, db_r);
  Tensor dx = Tensor::empty({T, D}, DType::f32), dw = Tensor::zeros({D, 4}, DType::f32);
  dt::testing::poison(dx);
  dt::ops::causal_conv1d_l2norm_bwd(dx, dw, TensorView{},
                                    {tensor_of(dqk[0], {T, H, d}), tensor_of(dqk[1], {T, H, d}), qn, kn, rq, rk,
                                     tensor_of(dv, {T, Dv})},
                                    x, w, TensorView{}, true, vb.meta(), nullptr);
  EXPECT_TRUE(dt::testing::close_rel(to_vec(dx), dx_r, 1e-5)) << "dx";
  EXPECT_TRUE(dt::testing::close_rel(to_vec(dw), dw_r, 1e-5)) << "dw (+=)";
}

TEST(GdnCpuOpsDeathTest, ConvL2NormNamesTheBadView) {
  // A death test re-executes the binary, which cannot rejoin a running MPI job.
  if (dt::dist::world_size() > 1) GTEST_SKIP() << "single-process only";
  Rand r(12);
  const int64_t H = 2, d = 8, Dv = 12, D = 2 * H * d + Dv;
  ConvProblem p = make_conv(r, kPackLengths, D, 4, true, false);
  const int64_t T = p.T();
  Tensor x = tensor_of(p.x, {T, D}), w = tensor_of(p.w, {D, 4});
  Tensor qn = Tensor::empty({T, H, d}, DType::f32), kn = Tensor::empty({T, H, d}, DType::f32);
  Tensor rq = Tensor::empty({T * H}, DType::f32), rk = Tensor::empty({T * H}, DType::f32);
  dt::ops::VarlenBatch vb(p.cu);
  Tensor v_bad = Tensor::empty({T, Dv + 1}, DType::f32);
  EXPECT_DEATH(dt::ops::causal_conv1d_l2norm_fwd({qn, kn, rq, rk, v_bad}, x, w, TensorView{}, true, 1e-6f, vb.meta(),
                                                 nullptr),
               "causal_conv1d_l2norm_fwd: v must be \\[T=622, D - 2 Hk dk = 12\\] \\(D = 44, Hk dk = 16\\)");
}

// Activation gradients overwrite (=), parameter gradients accumulate (+=), for every f32 op;
// row-strided activation views are accepted.
// Head rows read in place: l2norm and the gated RMSNorm on [T, H, d] views with a wide row
// stride (the layer's q, k columns of the conv output, z of the projections; outputs into
// columns of a wider buffer) give the bits of the same ops on packed [T * H, d] copies, and
// leave the buffer's other columns alone.
TEST(GdnCpuOps, HeadRowViewsMatchPackedBitwise) {
  Rand r(21);
  const int64_t T = 9, H = 3, D = 8, W = H * D + 7;  // 7 other columns per row
  auto wide = [&](uint64_t) {
    Tensor t = Tensor::empty({T, W}, DType::f32);
    for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = float(r.normal(1)[0]);
    return t;
  };
  auto heads_of = [&](const Tensor& t) {  // columns [2, 2 + H D) as [T, H, D]
    TensorView v = t.view().slice(1, 2, 2 + H * D);
    v.shape = Shape{T, H, D};
    v.stride = {W, D, 1};
    return v;
  };
  auto packed = [&](const TensorView& v) {
    Tensor p = Tensor::empty({T, H, D}, DType::f32);
    dt::ops::copy(p, v);
    return p;
  };
  auto same = [&](const TensorView& a, const Tensor& b) {
    Tensor pa = packed(a);
    return std::memcmp(pa.ptr<float>(), b.ptr<float>(), size_t(b.numel()) * 4) == 0;
  };
  Tensor xb = wide(1), dyb = wide(2), zb = wide(3), ob = wide(4);
  const TensorView x = heads_of(xb), z = heads_of(zb);
  Tensor xp = packed(x), zp = packed(z), dy = packed(heads_of(dyb)), o = packed(heads_of(ob));
  Tensor w = tensor_of(r.uniform(size_t(D), 0.5, 1.5), {D});
  // l2norm: x read in place, dx written in place.
  Tensor y = Tensor::empty({T, H, D}, DType::f32), rs = Tensor::empty({T * H}, DType::f32);
  Tensor yp = Tensor::empty({T * H, D}, DType::f32), rsp = Tensor::empty({T * H}, DType::f32);
  dt::ops::l2norm_fwd(y, rs, x);
  dt::ops::l2norm_fwd(yp, rsp, xp.view().reshape(Shape{T * H, D}));
  EXPECT_EQ(std::memcmp(y.ptr<float>(), yp.ptr<float>(), size_t(y.numel()) * 4), 0) << "l2norm y";
  Tensor dxb = wide(5), before = Tensor::empty({T, W}, DType::f32);
  dt::ops::copy(before, dxb);
  Tensor dxp = Tensor::empty({T * H, D}, DType::f32);
  dt::ops::l2norm_bwd(heads_of(dxb), dy, x, rs);
  dt::ops::l2norm_bwd(dxp, dy.view().reshape(Shape{T * H, D}), xp.view().reshape(Shape{T * H, D}), rsp);
  EXPECT_TRUE(same(heads_of(dxb), dxp)) << "l2norm dx";
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j : {int64_t(0), int64_t(1), W - 1})
      EXPECT_EQ(dxb.ptr<float>()[i * W + j], before.ptr<float>()[i * W + j]) << "row " << i << " column " << j;
  // gated RMSNorm: z read in place, dz written in place.
  Tensor g = Tensor::empty({T, H, D}, DType::f32), gr = Tensor::empty({T * H}, DType::f32);
  Tensor gp = Tensor::empty({T * H, D}, DType::f32), grp = Tensor::empty({T * H}, DType::f32);
  dt::ops::gated_rmsnorm_fwd(g, gr, o, z, w, 1e-6f);
  dt::ops::gated_rmsnorm_fwd(gp, grp, o.view().reshape(Shape{T * H, D}), zp.view().reshape(Shape{T * H, D}), w, 1e-6f);
  EXPECT_EQ(std::memcmp(g.ptr<float>(), gp.ptr<float>(), size_t(g.numel()) * 4), 0) << "gated rmsnorm y";
  Tensor dzb = wide(6), d_o = Tensor::empty({T, H, D}, DType::f32), dzp = Tensor::empty({T * H, D}, DType::f32);
  Tensor dop = Tensor::empty({T * H, D}, DType::f32);
  Tensor dw = Tensor::zeros({D}, DType::f32), dwp = Tensor::zeros({D}, DType::f32);
  dt::ops::gated_rmsnorm_bwd(d_o, heads_of(dzb), dw, dy, o, z, w, gr);
  dt::ops::gated_rmsnorm_bwd(dop, dzp, dwp, dy.view().reshape(Shape{T * H, D}), o.view().reshape(Shape{T * H, D}),
                             zp.view().reshape(Shape{T * H, D}), w, grp);
  EXPECT_TRUE(same(heads_of(dzb), dzp)) << "gated rmsnorm dz";
  EXPECT_EQ(std::memcmp(d_o.ptr<float>(), dop.ptr<float>(), size_t(d_o.numel()) * 4), 0) << "gated rmsnorm do";
  EXPECT_EQ(std::memcmp(dw.ptr<float>(), dwp.ptr<float>(), size_t(D) * 4), 0) << "gated rmsnorm dw";
}

TEST(GdnCpuOps, GradientContractsAndStridedRows) {
  Rand r(12);
  const int64_t T = 11, H = 3, D = 6;
  auto strided = [&](const Vec& v, int64_t rows_, int64_t cols, Tensor& owner) {
    owner = Tensor::empty({rows_, cols + 5}, DType::f32);  // 5 columns of padding per row
    dt::testing::poison(owner);
    TensorView s = owner.view().slice(1, 2, 2 + cols);
    for (int64_t i = 0; i < rows_; ++i)
      for (int64_t j = 0; j < cols; ++j) s.ptr<float>()[i * s.stride[0] + j] = float(v[size_t(i * cols + j)]);
    return s;
  };
  Tensor keep[16];
  int nk = 0;
  // gates: da, db (=); dA_log, ddt_bias (+=) starting from 1
  {
    Vec a = r.normal(size_t(T * H)), b = r.normal(size_t(T * H)), dg = r.normal(size_t(T * H)),
        dbeta = r.normal(size_t(T * H));
    Vec A_log = r.uniform(size_t(H), 0.0, 2.0), dtb = r.uniform(size_t(H), -1.0, 1.0);
    TensorView av = strided(a, T, H, keep[nk++]), bv = strided(b, T, H, keep[nk++]);
    Tensor Al = tensor_of(A_log, {H}), dt_ = tensor_of(dtb, {H});
    Tensor g = Tensor::empty({T, H}, DType::f32), beta = Tensor::empty({T, H}, DType::f32);
    dt::ops::gdn_gate_fwd(g, beta, av, bv, Al, dt_);
    Vec g_ref(size_t(T * H)), beta_ref(size_t(T * H));
    for (Vec* x : {&a, &b, &A_log, &dtb})
      for (double& e : *x) e = double(float(e));
    ref::gate_fwd<double>(rows(g_ref, H), rows(beta_ref, H), crows(a, H), crows(b, H), A_log.data(), dtb.data(), T, H);
    EXPECT_TRUE(dt::testing::close_rel(to_vec(g), g_ref, 1e-6)) << "g";
    EXPECT_TRUE(dt::testing::close_rel(to_vec(beta), beta_ref, 1e-6)) << "beta";
    Tensor dgt = tensor_of(dg, {T, H}), dbt = tensor_of(dbeta, {T, H});
    Tensor da = Tensor::empty({T, H}, DType::f32), db = Tensor::empty({T, H}, DType::f32);
    dt::testing::poison(da);
    dt::testing::poison(db);
    Tensor dA = tensor_of(Vec(size_t(H), 1.0), {H}), ddt = tensor_of(Vec(size_t(H), 1.0), {H});
    dt::ops::gdn_gate_bwd(da, db, dA, ddt, dgt, dbt, av, bv, Al, dt_);
    for (Vec* x : {&dg, &dbeta})
      for (double& e : *x) e = double(float(e));
    Vec da_r(size_t(T * H)), db_r(size_t(T * H)), dA_r(size_t(H), 1.0), ddt_r(size_t(H), 1.0);
    ref::gate_bwd<double>(rows(da_r, H), rows(db_r, H), dA_r.data(), ddt_r.data(), crows(dg, H), crows(dbeta, H),
                          crows(a, H), crows(b, H), A_log.data(), dtb.data(), T, H);
    EXPECT_TRUE(dt::testing::close_rel(to_vec(da), da_r, 1e-6)) << "da";
    EXPECT_TRUE(dt::testing::close_rel(to_vec(db), db_r, 1e-6)) << "db";
    EXPECT_TRUE(dt::testing::close_rel(to_vec(dA), dA_r, 1e-6)) << "dA_log (+=)";
    EXPECT_TRUE(dt::testing::close_rel(to_vec(ddt), ddt_r, 1e-6)) << "ddt_bias (+=)";
  }
  // l2norm on strided rows: dx (=)
  {
    Vec x = r.normal(size_t(T * D)), dy = r.normal(size_t(T * D));
    TensorView xv = strided(x, T, D, keep[nk++]), dyv = strided(dy, T, D, keep[nk++]);
    Tensor yo;
    TensorView yv = strided(Vec(size_t(T * D), 0.0), T, D, yo);
    Tensor rstd = Tensor::empty({T}, DType::f32), dx = Tensor::empty({T, D}, DType::f32);
    dt::testing::poison(dx);
    dt::ops::l2norm_fwd(yv, rstd, xv);
    dt::ops::l2norm_bwd(dx, dyv, xv, rstd);
    Tensor dx_y = Tensor::empty({T, D}, DType::f32);  // from y: within fp32 rounding of y
    dt::testing::poison(dx_y);
    dt::ops::l2norm_bwd_y(dx_y, dyv, yv, rstd);
    EXPECT_TRUE(dt::testing::close_rel(to_vec(dx_y), to_vec(dx), 1e-6)) << "l2norm dx from y";
    for (Vec* e : {&x, &dy})
      for (double& u : *e) u = double(float(u));
    Vec y_r(x.size()), rs_r(static_cast<size_t>(T)), dx_r(x.size());
    ref::l2norm_fwd<double>(rows(y_r, D), rs_r.data(), crows(x, D), T, D, 1e-6);
    ref::l2norm_bwd<double>(rows(dx_r, D), crows(dy, D), crows(x, D), rs_r.data(), T, D);
    EXPECT_TRUE(dt::testing::close_rel(to_vec(yv), y_r, 1e-6)) << "l2norm y";
    EXPECT_TRUE(dt::testing::close_rel(to_vec(dx), dx_r, 1e-6)) << "l2norm dx";
    // the padding columns of the strided output stay untouched (NaN-poisoned)
    EXPECT_TRUE(std::isnan(yo.ptr<float>()[0]) && std::isnan(yo.ptr<float>()[D + 2]));
  }
  // gated RMSNorm: do, dz (=); dw (+=) starting from 1
  {
    Vec o = r.normal(size_t(T * D)), z = r.normal(size_t(T * D)), w = r.uniform(size_t(D), 0.5, 1.5),
        dy = r.normal(size_t(T * D));
    TensorView ov = strided(o, T, D, keep[nk++]), zv = strided(z, T, D, keep[nk++]);
    Tensor wt = tensor_of(w, {D}), dyt = tensor_of(dy, {T, D});
    Tensor y = Tensor::empty({T, D}, DType::f32), rstd = Tensor::empty({T}, DType::f32);
    Tensor dO = Tensor::empty({T, D}, DType::f32), dz = Tensor::empty({T, D}, DType::f32);
    dt::testing::poison(dO);
    dt::testing::poison(dz);
    Tensor dw = tensor_of(Vec(size_t(D), 1.0), {D});
    dt::ops::gated_rmsnorm_fwd(y, rstd, ov, zv, wt, 1e-6f);
    dt::ops::gated_rmsnorm_bwd(dO, dz, dw, dyt, ov, zv, wt, rstd);
    for (Vec* e : {&o, &z, &w, &dy})
      for (double& u : *e) u = double(float(u));
    Vec y_r(o.size()), rs_r(static_cast<size_t>(T)), do_r(o.size()), dz_r(o.size()), dw_r(size_t(D), 1.0);
    ref::gated_rmsnorm_fwd<double>(rows(y_r, D), rs_r.data(), crows(o, D), crows(z, D), w.data(), T, D, 1e-6);
    ref::gated_rmsnorm_bwd<double>(rows(do_r, D), rows(dz_r, D), dw_r.data(), crows(dy, D), crows(o, D), crows(z, D),
                                   w.data(), rs_r.data(), T, D);
    EXPECT_TRUE(dt::testing::close_rel(to_vec(y), y_r, 1e-6)) << "rmsnorm y";
    EXPECT_TRUE(dt::testing::close_rel(to_vec(dO), do_r, 1e-6)) << "rmsnorm do";
    EXPECT_TRUE(dt::testing::close_rel(to_vec(dz), dz_r, 1e-6)) << "rmsnorm dz";
    EXPECT_TRUE(dt::testing::close_rel(to_vec(dw), dw_r, 1e-6)) << "rmsnorm dw (+=)";
  }
  // conv: dw, dbias accumulate over two calls; dx is overwritten
  {
    ConvProblem p = make_conv(r, {4, 7}, D, 3, false, true);
    Tensor x = tensor_of(p.x, {p.T(), D}), w = tensor_of(p.w, {D, 3}), bias = tensor_of(p.bias, {D});
    Tensor dy = tensor_of(p.wy, {p.T(), D}), dx = Tensor::empty({p.T(), D}, DType::f32);
    Tensor dw = Tensor::zeros({D, 3}, DType::f32), db = Tensor::zeros({D}, DType::f32);
    dt::ops::VarlenBatch vb(p.cu);
    dt::ops::causal_conv1d_bwd(dx, dw, db, dy, x, w, bias, false, vb.meta());
    const Vec dx1 = to_vec(dx), dw1 = to_vec(dw), db1 = to_vec(db);
    dt::ops::causal_conv1d_bwd(dx, dw, db, dy, x, w, bias, false, vb.meta());
    EXPECT_TRUE(bitwise_eq(to_vec(dx), dx1)) << "dx overwritten";
    Vec dw2 = dw1, db2 = db1;
    for (double& e : dw2) e *= 2;
    for (double& e : db2) e *= 2;
    EXPECT_TRUE(dt::testing::close_rel(to_vec(dw), dw2, 1e-6)) << "dw accumulates";
    EXPECT_TRUE(dt::testing::close_rel(to_vec(db), db2, 1e-6)) << "dbias accumulates";
  }
}

}  // namespace
