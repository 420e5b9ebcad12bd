// CPU reference of the dense-layer ops (include/deltatron/ops/layers_ops.h): central finite
// differences of rmsnorm1p, swiglu and the cross entropy (loss of a random linear functional,
// fp32 ops, step 1e-2, rel. error < 2e-3), the CE pieces against a direct float64 full-vocab
// softmax split into vocab shards (each shard's sum rescaled to the global max), ce_stats on
// -inf and NaN rows, and the embedding scatter-add with repeated ids.
#include <gtest/gtest.h>

#include <cmath>

#include "deltatron/ops/basic.h"
#include "deltatron/ops/layers_ops.h"
#include "test_util.h"

using namespace dt;
using dt::testing::close_rel;
using dt::testing::rand_host;

namespace {
double dot(const TensorView& a, const TensorView& c) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += double(a.ptr<float>()[i]) * c.ptr<float>()[i];
  return s;
}
// Numeric gradient of f (a function of x's contents) at every element of x.
template <typename F>
std::vector<double> numeric_grad(const TensorView& x, F f, float h = 1e-2f) {
  std::vector<double> g(size_t(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) {
    float& v = x.ptr<float>()[i];
    const float v0 = v;
    v = v0 + h;
    const double fp = f();
    v = v0 - h;
    const double fm = f();
    v = v0;
    g[size_t(i)] = (fp - fm) / (2.0 * double(h));
  }
  return g;
}
std::vector<double> vec(const TensorView& t) { return {t.ptr<float>(), t.ptr<float>() + t.numel()}; }
}  // namespace

TEST(LayersOpsCpu, Rmsnorm1pFiniteDifferences) {
  const int64_t R = 5, D = 24;
  Tensor x = rand_host(Shape{R, D}, -2.f, 2.f), w = rand_host(Shape{D}, -0.5f, 0.5f), c = rand_host(Shape{R, D});
  Tensor y = Tensor::empty(Shape{R, D}, DType::f32), rstd = Tensor::empty(Shape{R}, DType::f32);
  auto f = [&] {
    ops::rmsnorm1p_fwd(y, rstd, x, w, 1e-6f);
    return dot(y, c);
  };
  f();
  // The HF formula in double for the forward.
  for (int64_t r = 0; r < R; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < D; ++j) ss += double(x.ptr<float>()[r * D + j]) * x.ptr<float>()[r * D + j];
    for (int64_t j = 0; j < D; ++j)
      EXPECT_NEAR(y.ptr<float>()[r * D + j],
                  x.ptr<float>()[r * D + j] / std::sqrt(ss / D + 1e-6) * (1.0 + w.ptr<float>()[j]), 1e-5);
  }
  Tensor dx = Tensor::empty(Shape{R, D}, DType::f32), dw = Tensor::zeros(Shape{D}, DType::f32);
  ops::rmsnorm1p_bwd(dx, dw, c, x, w, rstd);
  EXPECT_TRUE(close_rel(vec(dx), numeric_grad(x, f), 2e-3)) << "dx";
  EXPECT_TRUE(close_rel(vec(dw), numeric_grad(w, f), 2e-3)) << "dw";
  // dw accumulates.
  ops::rmsnorm1p_bwd(dx, dw, c, x, w, rstd);
  std::vector<double> twice = numeric_grad(w, f);
  for (double& v : twice) v *= 2;
  EXPECT_TRUE(close_rel(vec(dw), twice, 2e-3)) << "dw +=";
}

TEST(LayersOpsCpu, SwigluFiniteDifferencesOnHalvesOfOneBuffer) {
  const int64_t T = 6, F = 10;
  Tensor gu = rand_host(Shape{T, 2 * F}, -4.f, 4.f), c = rand_host(Shape{T, F});
  TensorView g = gu.view().slice(1, 0, F), u = gu.view().slice(1, F, 2 * F);
  Tensor y = Tensor::empty(Shape{T, F}, DType::f32);
  auto f = [&] {
    ops::swiglu_fwd(y, g, u);
    return dot(y, c);
  };
  f();
  Tensor dgu = Tensor::empty(Shape{T, 2 * F}, DType::f32);
  ops::swiglu_bwd(dgu.view().slice(1, 0, F), dgu.view().slice(1, F, 2 * F), c, g, u);
  EXPECT_TRUE(close_rel(vec(dgu), numeric_grad(gu, f), 2e-3));
}

TEST(LayersOpsCpu, CrossEntropyShardsMatchFloat64AndFiniteDifferences) {
  const int64_t T = 7, V = 40;
  Tensor logits = rand_host(Shape{T, V}, -6.f, 6.f);
  std::vector<int32_t> tg_v = {3, -1, 39, 0, 17, -1, 21};
  Tensor tg = Tensor::empty(Shape{T}, DType::i32);
  std::copy(tg_v.begin(), tg_v.end(), tg.ptr<int32_t>());
  const float scale = 0.37f;
  // Full-vocab float64 reference.
  std::vector<double> ref_loss(T, 0.0), ref_d(size_t(T * V), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    if (tg_v[size_t(t)] < 0) continue;
    double mx = -1e300, se = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, double(logits.ptr<float>()[t * V + j]));
    for (int64_t j = 0; j < V; ++j) se += std::exp(double(logits.ptr<float>()[t * V + j]) - mx);
    ref_loss[size_t(t)] = std::log(se) + mx - logits.ptr<float>()[t * V + tg_v[size_t(t)]];
    for (int64_t j = 0; j < V; ++j)
      ref_d[size_t(t * V + j)] =
          scale * (std::exp(double(logits.ptr<float>()[t * V + j]) - mx) / se - (j == tg_v[size_t(t)] ? 1.0 : 0.0));
  }
  // The vocab-parallel protocol with 4 shards, reductions done by hand: each shard's sum is
  // relative to its own max, rescaled to the global max (ce_rescale), then summed.
  const int S = 4;
  const int64_t Vl = V / S;
  Tensor m = Tensor::empty(Shape{T}, DType::f32), se = Tensor::zeros(Shape{T}, DType::f32),
         tl = Tensor::zeros(Shape{T}, DType::f32);
  std::vector<Tensor> ms, ses, tls;
  for (int s = 0; s < S; ++s) {
    for (auto* v : {&ms, &ses, &tls}) v->push_back(Tensor::empty(Shape{T}, DType::f32));
    ops::ce_stats(ms[size_t(s)], ses[size_t(s)], tls[size_t(s)], logits.view().slice(1, s * Vl, (s + 1) * Vl), tg,
                  s * Vl);
  }
  for (int64_t t = 0; t < T; ++t) {
    float mx = -INFINITY;
    for (int s = 0; s < S; ++s) mx = std::max(mx, ms[size_t(s)].ptr<float>()[t]);
    m.ptr<float>()[t] = mx;
  }
  for (int s = 0; s < S; ++s) {
    ops::ce_rescale(ses[size_t(s)], ms[size_t(s)], m);
    ops::axpy(se, 1.f, ses[size_t(s)]);
    ops::axpy(tl, 1.f, tls[size_t(s)]);
  }
  Tensor loss = Tensor::empty(Shape{T}, DType::f32), d = Tensor::empty(Shape{T, V}, DType::f32);
  dt::testing::poison(d);
  ops::ce_loss(loss, m, se, tl, tg);
  for (int s = 0; s < S; ++s)
    ops::ce_bwd(d.view().slice(1, s * Vl, (s + 1) * Vl), logits.view().slice(1, s * Vl, (s + 1) * Vl), m, se, tg,
                s * Vl, scale);
  EXPECT_TRUE(close_rel(vec(loss), ref_loss, 1e-6)) << "loss";
  EXPECT_TRUE(close_rel(vec(d), ref_d, 1e-6)) << "dlogits";
  EXPECT_EQ(loss.ptr<float>()[1], 0.f);
  // Finite differences of scale * sum(loss) on the one-shard path.
  auto f = [&] {
    Tensor mm = Tensor::empty(Shape{T}, DType::f32), s1 = Tensor::empty(Shape{T}, DType::f32),
           t1 = Tensor::empty(Shape{T}, DType::f32), l1 = Tensor::empty(Shape{T}, DType::f32);
    ops::ce_stats(mm, s1, t1, logits, tg, 0);
    ops::ce_loss(l1, mm, s1, t1, tg);
    double acc = 0;
    for (int64_t t = 0; t < T; ++t) acc += l1.ptr<float>()[t];
    return double(scale) * acc;
  };
  EXPECT_TRUE(close_rel(vec(d), numeric_grad(logits, f), 2e-3)) << "finite differences";
}

// ce_stats on special rows: all -inf (m = -inf, se = 0, no NaN), -inf mixed with finite values
// (add exactly 0: se equals the float64 sum over the finite ones, rel. 1e-6), one NaN (se NaN).
TEST(LayersOpsCpu, CrossEntropyStatsInfAndNan) {
  const int64_t V = 37;
  Tensor l = rand_host(Shape{3, V}, -5.f, 5.f), tg = Tensor::zeros(Shape{3}, DType::i32);
  float* p = l.ptr<float>();
  for (int64_t j = 0; j < V; ++j) p[j] = -INFINITY;
  for (int64_t j = 0; j < V; j += 3) p[V + j] = -INFINITY;
  p[2 * V + 17] = NAN;
  Tensor m = Tensor::empty(Shape{3}, DType::f32), se = Tensor::empty(Shape{3}, DType::f32),
         tl = Tensor::empty(Shape{3}, DType::f32);
  ops::ce_stats(m, se, tl, l, tg, 0);
  EXPECT_EQ(m.ptr<float>()[0], -INFINITY);
  EXPECT_EQ(se.ptr<float>()[0], 0.f);
  double mx = -1e300, want = 0;
  for (int64_t j = 0; j < V; ++j) mx = std::max(mx, double(p[V + j]));
  for (int64_t j = 0; j < V; ++j) want += j % 3 ? std::exp(double(p[V + j]) - mx) : 0.0;
  EXPECT_EQ(m.ptr<float>()[1], float(mx));
  EXPECT_LT(std::abs(se.ptr<float>()[1] - want) / want, 1e-6);
  EXPECT_TRUE(std::isnan(se.ptr<float>()[2]));
}

TEST(LayersOpsCpu, EmbeddingScatterAddWithRepeatsAndForeignIds) {
  const int64_t T = 9, V = 6, H = 5, vb = 6;  // this shard owns ids [6, 12)
  std::vector<int32_t> id_v = {7, 2, 7, 11, 6, 7, 15, 6, 0};
  Tensor ids = Tensor::empty(Shape{T}, DType::i32);
  std::copy(id_v.begin(), id_v.end(), ids.ptr<int32_t>());
  Tensor w = rand_host(Shape{V, H}), dy = rand_host(Shape{T, H}), y = Tensor::empty(Shape{T, H}, DType::f32);
  ops::embedding_fwd(y, ids, w, vb);
  Tensor dw = rand_host(Shape{V, H});
  std::vector<double> want = vec(dw);
  ops::embedding_bwd(dw, dy, ids, vb);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t v = id_v[size_t(t)] - vb;
    for (int64_t h = 0; h < H; ++h) {
      EXPECT_EQ(y.ptr<float>()[t * H + h], v >= 0 && v < V ? w.ptr<float>()[v * H + h] : 0.f);
      if (v >= 0 && v < V) want[size_t(v * H + h)] += dy.ptr<float>()[t * H + h];
    }
  }
  EXPECT_TRUE(close_rel(vec(dw), want, 1e-6));
}
