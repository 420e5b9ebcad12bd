// CPU reference of the attention-layer ops (include/deltatron/ops/attention.h):
//  * rope_fwd against the HF formula written out directly (cos/sin concatenated twice,
//    rotate_half), on a row-strided view, partial and full rotary dims; in place == out of place
//    bitwise; rope_bwd is the exact transpose (<rope(x), g> = <x, rope_bwd(g)>).
//  * attention_fwd against a direct masked softmax in double (packed, unequal lengths 1, 2, odd,
//    > 64, alignment padding, a pure-padding sequence, GQA 2): rel. L2 < 1e-6 on o and lse;
//    rows that are not live give o = 0, lse = 0.
//  * attention_bwd against central finite differences (a) of that double forward (eps 1e-5;
//    rel. L2 < 1e-6, measured ~5e-8: the fp32 storage of o/lse/grads) and (b) of the op's own fp32
//    forward (eps 1e-2; rel. L2 < 5e-4, measured ~1e-5: fp32 rounding / eps, O(eps^2) truncation).
//  * zig-zag query rows (q_div = cp = 2) give the same o and summed dK/dV as natural order.
//  * all-padding batches stay finite (zeros); sigmoid_gate against its formula.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "deltatron/data/packed_seq.h"
#include "deltatron/ops/attention.h"
#include "deltatron/ops/basic.h"
#include "test_util.h"

using namespace dt;
using namespace dt::testing;

namespace {

std::vector<double> to_vec(const TensorView& t) {
  Tensor c = Tensor::empty(t.shape, DType::f32);
  ops::copy(c, t);
  return std::vector<double>(c.ptr<float>(), c.ptr<float>() + c.numel());
}
TensorView heads_view(const TensorView& x2d, int64_t H, int64_t D) {
  TensorView v = x2d;
  v.shape = Shape{x2d.shape[0], H, D};
  v.stride = {x2d.stride[0], D, 1};
  return v;
}

// ---- RoPE -------------------------------------------------------------------------------------

TEST(AttentionOps, RopeMatchesHfFormula) {
  const int64_t T = 9, H = 3, D = 16;
  const double theta = 1e4;
  Tensor buf = rand_host(Shape{T, 2 * H * D});  // x is the second column block: row-strided
  TensorView x = heads_view(buf.view().slice(1, H * D, 2 * H * D), H, D);
  Tensor pos = Tensor::empty(Shape{T}, DType::i32);
  for (int64_t t = 0; t < T; ++t) pos.ptr<int32_t>()[t] = int32_t((t * 37 + 5) % 211);
  for (int64_t rd : {int64_t(4), int64_t(8), D, int64_t(0)}) {
    SCOPED_TRACE(fmt::format("rotary_dim {}", rd));
    Tensor y = Tensor::empty(Shape{T, H, D}, DType::f32);
    ops::rope_fwd(y, x, pos, rd, theta);
    std::vector<double> want;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const float* xr = x.ptr<float>() + t * x.stride[0] + h * D;
        // cos/sin of pos * inv_freq, inv_freq = 1/theta^(arange(0, rd, 2)/rd), concatenated twice.
        const size_t n = static_cast<size_t>(rd);
        std::vector<double> c(n), s(n), rh(n);
        for (int64_t j = 0; j < rd; ++j) {
          const double f = 1.0 / std::pow(theta, double(2 * (j % (rd / 2))) / double(rd));
          c[size_t(j)] = std::cos(pos.ptr<int32_t>()[t] * f);
          s[size_t(j)] = std::sin(pos.ptr<int32_t>()[t] * f);
          rh[size_t(j)] = j < rd / 2 ? -double(xr[j + rd / 2]) : double(xr[j - rd / 2]);  // rotate_half
        }
        for (int64_t j = 0; j < D; ++j)
          want.push_back(j < rd ? xr[j] * c[size_t(j)] + rh[size_t(j)] * s[size_t(j)] : double(xr[j]));
      }
    EXPECT_TRUE(close_rel(to_vec(y), want, 1e-6));
    // In place on the strided view equals out of place, bitwise.
    Tensor copy = Tensor::empty(buf.shape(), DType::f32);
    ops::copy(copy, buf);
    TensorView xc = heads_view(copy.view().slice(1, H * D, 2 * H * D), H, D);
    ops::rope_fwd(xc, xc, pos, rd, theta);
    EXPECT_EQ(to_vec(xc), to_vec(y));
  }
}

TEST(AttentionOps, RopeBackwardIsTheTranspose) {
  const int64_t T = 11, H = 2, D = 32, rd = 8;
  Tensor x = rand_host(Shape{T, H, D}), g = rand_host(Shape{T, H, D});
  Tensor pos = Tensor::empty(Shape{T}, DType::i32);
  for (int64_t t = 0; t < T; ++t) pos.ptr<int32_t>()[t] = int32_t(t * 13);
  Tensor y = Tensor::empty(x.shape(), DType::f32), dx = Tensor::empty(x.shape(), DType::f32);
  ops::rope_fwd(y, x, pos, rd, 1e7);
  ops::rope_bwd(dx, g, pos, rd, 1e7);
  double a = 0, b = 0, n = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    a += double(y.ptr<float>()[i]) * g.ptr<float>()[i];
    b += double(x.ptr<float>()[i]) * dx.ptr<float>()[i];
    n += std::abs(double(y.ptr<float>()[i]) * g.ptr<float>()[i]);
  }
  EXPECT_LT(std::abs(a - b), 1e-6 * n) << a << " vs " << b;
}

// ---- attention --------------------------------------------------------------------------------

// A packed problem in natural order: keys and queries share rows (q_div = 1).
struct AttnProblem {
  int64_t Hq, Hkv, D;
  std::vector<int64_t> real, padded;  // per sequence
  std::vector<int32_t> cu_pad, cu_act, pos;
  Tensor q, k, v;                     // [T, H, D] f32
  int64_t T() const { return cu_pad.back(); }
};

AttnProblem make_problem(std::vector<int64_t> real, std::vector<int64_t> padded, int64_t Hq, int64_t Hkv, int64_t D,
                         float qk_scale = 1.f) {
  AttnProblem P{Hq, Hkv, D, real, padded, {0}, {0}, {}, {}, {}, {}};
  for (size_t i = 0; i < real.size(); ++i) {
    P.cu_pad.push_back(P.cu_pad.back() + int32_t(padded[i]));
    P.cu_act.push_back(P.cu_act.back() + int32_t(real[i]));
    for (int64_t p = 0; p < padded[i]; ++p) P.pos.push_back(int32_t(p));
  }
  const int64_t T = P.T();
  P.q = rand_host(Shape{T, Hq, D}, -qk_scale, qk_scale);
  P.k = rand_host(Shape{T, Hkv, D}, -qk_scale, qk_scale);
  P.v = rand_host(Shape{T, Hkv, D});
  return P;
}
Tensor i32_tensor(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty(Shape{int64_t(v.size())}, DType::i32);
  std::copy(v.begin(), v.end(), t.ptr<int32_t>());
  return t;
}

// Direct softmax in double: o [T, Hq, D] and lse [T, Hq] (0 on rows that are not live).
void ref_attention(const AttnProblem& P, const std::vector<double>& q, const std::vector<double>& k,
                   const std::vector<double>& v, std::vector<double>* o, std::vector<double>* lse) {
  const int64_t T = P.T(), Hq = P.Hq, Hkv = P.Hkv, D = P.D, G = Hq / Hkv;
  const double scale = 1.0 / std::sqrt(double(D));
  o->assign(size_t(T * Hq * D), 0.0);
  lse->assign(size_t(T * Hq), 0.0);
  for (size_t i = 0; i < P.real.size(); ++i)
    for (int64_t p = 0; p < P.real[i]; ++p) {
      const int64_t t = P.cu_pad[i] + p;
      for (int64_t h = 0; h < Hq; ++h) {
        std::vector<double> s;
        for (int64_t j = 0; j <= p; ++j) {
          double d = 0;
          for (int64_t e = 0; e < D; ++e) d += q[size_t((t * Hq + h) * D + e)] * k[size_t(((P.cu_pad[i] + j) * Hkv + h / G) * D + e)];
          s.push_back(d * scale);
        }
        double z = 0;
        for (double x : s) z += std::exp(x);
        (*lse)[size_t(t * Hq + h)] = std::log(z);
        for (int64_t j = 0; j <= p; ++j)
          for (int64_t e = 0; e < D; ++e)
            (*o)[size_t((t * Hq + h) * D + e)] += std::exp(s[size_t(j)]) / z * v[size_t(((P.cu_pad[i] + j) * Hkv + h / G) * D + e)];
      }
    }
}

struct AttnOut {
  Tensor o, lse, dq, dk, dv;
};
AttnOut run_op(const AttnProblem& P, const TensorView& q, const TensorView& k, const TensorView& v,
               const TensorView& d_o) {
  const int64_t T = P.T();
  AttnOut r{Tensor::empty(Shape{T, P.Hq, P.D}, DType::f32), Tensor::empty(Shape{T, P.Hq}, DType::f32),
            Tensor::empty(Shape{T, P.Hq, P.D}, DType::f32), Tensor::empty(Shape{T, P.Hkv, P.D}, DType::f32),
            Tensor::empty(Shape{T, P.Hkv, P.D}, DType::f32)};
  for (Tensor* t : {&r.o, &r.lse, &r.dq, &r.dk, &r.dv}) poison(*t);
  Tensor cp = i32_tensor(P.cu_pad), ca = i32_tensor(P.cu_act), pos = i32_tensor(P.pos);
  ops::AttnVarlen m{cp, ca, pos, 1};
  const float scale = float(1.0 / std::sqrt(double(P.D)));
  ops::attention_fwd(r.o, r.lse, q, k, v, m, scale);
  if (d_o.data) ops::attention_bwd(r.dq, r.dk, r.dv, d_o, q, k, v, r.o, r.lse, m, scale);
  return r;
}

TEST(AttentionOps, ForwardMatchesDirectSoftmax) {
  // real 1 of 4, 2, 0 of 4 (pure padding), 13 of 14, 70 of 72, 5 of 5
  AttnProblem P = make_problem({1, 2, 0, 13, 70, 5}, {4, 2, 4, 14, 72, 5}, 4, 2, 16, 1.5f);
  AttnOut r = run_op(P, P.q, P.k, P.v, TensorView{});
  std::vector<double> o, lse;
  ref_attention(P, to_vec(P.q), to_vec(P.k), to_vec(P.v), &o, &lse);
  EXPECT_TRUE(close_rel(to_vec(r.o), o, 1e-6)) << "o";
  EXPECT_TRUE(close_rel(to_vec(r.lse), lse, 1e-6)) << "lse";
  // Rows that are not live: exactly zero output and lse (the reference has zeros there too).
  for (size_t i = 0; i < P.real.size(); ++i)
    for (int64_t p = P.real[i]; p < P.padded[i]; ++p)
      for (int64_t h = 0; h < P.Hq; ++h) {
        EXPECT_EQ(r.lse.ptr<float>()[(P.cu_pad[i] + p) * P.Hq + h], 0.f);
        for (int64_t e = 0; e < P.D; ++e) EXPECT_EQ(r.o.ptr<float>()[((P.cu_pad[i] + p) * P.Hq + h) * P.D + e], 0.f);
      }
}

// Central differences of L = sum(w * o) for every element of q, k and v.
template <typename Fwd>
std::vector<double> fd_grad(std::vector<double> x, const std::vector<double>& w, double eps, Fwd fwd) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + eps;
    const std::vector<double> op = fwd(x);
    x[i] = x0 - eps;
    const std::vector<double> om = fwd(x);
    x[i] = x0;
    double lp = 0, lm = 0;
    for (size_t j = 0; j < w.size(); ++j) {
      lp += w[j] * op[j];
      lm += w[j] * om[j];
    }
    g[i] = (lp - lm) / (2 * eps);
  }
  return g;
}

TEST(AttentionOps, BackwardMatchesFiniteDifferences) {
  // real 3 of 4, 1 of 2, 0 of 2, 6 of 6; GQA 2.
  AttnProblem P = make_problem({3, 1, 0, 6}, {4, 2, 2, 6}, 4, 2, 4, 1.5f);
  const int64_t T = P.T();
  Tensor w = rand_host(Shape{T, P.Hq, P.D});
  AttnOut r = run_op(P, P.q, P.k, P.v, w);
  const std::vector<double> q = to_vec(P.q), k = to_vec(P.k), v = to_vec(P.v), wv = to_vec(w);
  std::vector<double> o, lse;
  // (a) the double forward (matches the op to 1e-6, ForwardMatchesDirectSoftmax).
  auto fq = [&](const std::vector<double>& x) { ref_attention(P, x, k, v, &o, &lse); return o; };
  auto fk = [&](const std::vector<double>& x) { ref_attention(P, q, x, v, &o, &lse); return o; };
  auto fv = [&](const std::vector<double>& x) { ref_attention(P, q, k, x, &o, &lse); return o; };
  EXPECT_TRUE(close_rel(to_vec(r.dq), fd_grad(q, wv, 1e-5, fq), 1e-6)) << "dq vs FD (double)";
  EXPECT_TRUE(close_rel(to_vec(r.dk), fd_grad(k, wv, 1e-5, fk), 1e-6)) << "dk vs FD (double)";
  EXPECT_TRUE(close_rel(to_vec(r.dv), fd_grad(v, wv, 1e-5, fv), 1e-6)) << "dv vs FD (double)";
  // (b) the op's own fp32 forward.
  auto op_fwd = [&](int which) {
    return [&, which](const std::vector<double>& x) {
      Tensor t = Tensor::empty(which == 0 ? P.q.shape() : P.k.shape(), DType::f32);
      for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = float(x[size_t(i)]);
      AttnOut a = run_op(P, which == 0 ? t.view() : P.q.view(), which == 1 ? t.view() : P.k.view(),
                         which == 2 ? t.view() : P.v.view(), TensorView{});
      return to_vec(a.o);
    };
  };
  EXPECT_TRUE(close_rel(to_vec(r.dq), fd_grad(q, wv, 1e-2, op_fwd(0)), 5e-4)) << "dq vs FD (op, fp32)";
  EXPECT_TRUE(close_rel(to_vec(r.dk), fd_grad(k, wv, 1e-2, op_fwd(1)), 5e-4)) << "dk vs FD (op, fp32)";
  EXPECT_TRUE(close_rel(to_vec(r.dv), fd_grad(v, wv, 1e-2, op_fwd(2)), 5e-4)) << "dv vs FD (op, fp32)";
}

TEST(AttentionOps, ZigzagQueryRowsMatchNaturalOrder) {
  const int cp = 2;
  AttnProblem P = make_problem({5, 0, 13, 70}, {8, 4, 16, 72}, 4, 2, 8);
  const int64_t T = P.T();
  Tensor d_o = rand_host(Shape{T, P.Hq, P.D});
  AttnOut nat = run_op(P, P.q, P.k, P.v, d_o);
  std::vector<int64_t> cu64(P.cu_pad.begin(), P.cu_pad.end()), ca64(P.cu_act.begin(), P.cu_act.end());
  std::vector<double> dk(size_t(nat.dk.numel()), 0.0), dv(size_t(nat.dv.numel()), 0.0);
  const float scale = float(1.0 / std::sqrt(double(P.D)));
  for (int r = 0; r < cp; ++r) {
    data::PackedSeqParams psp = data::PackedSeqParams::build({ca64, cu64, 1, T / cp, 1, cp, r});
    std::span<const int32_t> cu32(psp.cu_seqlens_padded());
    Tensor q = data::zigzag_slice_rows(P.q, cu32, cp, r), g = data::zigzag_slice_rows(d_o, cu32, cp, r);
    Tensor o = Tensor::empty(q.shape(), DType::f32), lse = Tensor::empty(Shape{T / cp, P.Hq}, DType::f32);
    Tensor dq = Tensor::empty(q.shape(), DType::f32), dkr = Tensor::empty(P.k.shape(), DType::f32),
           dvr = Tensor::empty(P.v.shape(), DType::f32);
    ops::AttnVarlen m{psp.cu_seqlens_padded_dev(), psp.cu_seqlens_dev(), psp.position_ids_local_dev(), cp};
    ops::attention_fwd(o, lse, q, P.k, P.v, m, scale);
    ops::attention_bwd(dq, dkr, dvr, g, q, P.k, P.v, o, lse, m, scale);
    EXPECT_TRUE(close_rel(o, data::zigzag_slice_rows(nat.o, cu32, cp, r), 1e-6)) << "o rank " << r;
    EXPECT_TRUE(close_rel(dq, data::zigzag_slice_rows(nat.dq, cu32, cp, r), 1e-6)) << "dq rank " << r;
    for (int64_t i = 0; i < dkr.numel(); ++i) {
      dk[size_t(i)] += dkr.ptr<float>()[i];
      dv[size_t(i)] += dvr.ptr<float>()[i];
    }
  }
  EXPECT_TRUE(close_rel(dk, to_vec(nat.dk), 1e-6)) << "dk summed over CP ranks";
  EXPECT_TRUE(close_rel(dv, to_vec(nat.dv), 1e-6)) << "dv summed over CP ranks";
}

TEST(AttentionOps, AllPaddingStaysFinite) {
  AttnProblem P = make_problem({0, 0}, {4, 8}, 2, 1, 8);
  Tensor d_o = rand_host(Shape{P.T(), P.Hq, P.D});
  AttnOut r = run_op(P, P.q, P.k, P.v, d_o);
  for (const Tensor* t : {&r.o, &r.lse, &r.dq, &r.dk, &r.dv})
    for (int64_t i = 0; i < t->numel(); ++i) ASSERT_EQ(t->ptr<float>()[i], 0.f);
}

TEST(AttentionOps, SigmoidGateMatchesFormula) {
  const int64_t R = 7, D = 12;
  Tensor buf = rand_host(Shape{R, 2 * D}, -4.f, 4.f), o = rand_host(Shape{R, D}), dy = rand_host(Shape{R, D});
  TensorView g = buf.view().slice(1, D, 2 * D);  // row-strided, as the gate half of q_proj
  Tensor y = Tensor::empty(Shape{R, D}, DType::f32), d_o = Tensor::empty(Shape{R, D}, DType::f32),
         dg = Tensor::empty(Shape{R, D}, DType::f32);
  ops::sigmoid_gate_fwd(y, o, g);
  ops::sigmoid_gate_bwd(d_o, dg, dy, o, g);
  std::vector<double> wy, wdo, wdg;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < D; ++j) {
      const double gv = g.ptr<float>()[r * g.stride[0] + j], sg = 1 / (1 + std::exp(-gv));
      const double ov = o.ptr<float>()[r * D + j], d = dy.ptr<float>()[r * D + j];
      wy.push_back(ov * sg);
      wdo.push_back(d * sg);
      wdg.push_back(d * ov * sg * (1 - sg));
    }
  EXPECT_TRUE(close_rel(to_vec(y), wy, 1e-6));
  EXPECT_TRUE(close_rel(to_vec(d_o), wdo, 1e-6));
  EXPECT_TRUE(close_rel(to_vec(dg), wdg, 1e-6));
}

}  // namespace
