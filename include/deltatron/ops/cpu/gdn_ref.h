// CPU reference of the five Gated DeltaNet kernel families, forward and backward, on raw
// pointers with explicit row strides. Templated on the storage type Real (float or double);
// all arithmetic is done in double inside, so the float instantiation is the double result
// rounded once per stored element. The double instantiation is what the finite-difference
// tests differentiate; src/ops/cpu/*.cpp wrap the float one behind dt::ops::cpu.
// Port of ../shared/reference/gdn_reference.py (float64 oracle); math in gdn-math.md.
//
// Storage: a Rows<E> is a 2-D array, element (r, c) at data[r * ld + c] (unit inner stride,
// any row stride). Sequences come from cu_seqlens `cu` [N+1] (cu[0] = 0, cu[N] = T).
// A nullptr means "absent" for bias, h0, ht, dht, dh0, dbias.
//
// 1. causal conv1d, varlen (section 7). x, y, dx, dy: [T, D] rows; w, dw: [D, W] contiguous,
//    tap W-1 on the current token, 2 <= W <= 8; bias, dbias: [D].
//      y_pre[t,c] = bias[c] + sum_j w[c,j] x[t-(W-1)+j, c]   (taps before the start of t's sequence read 0)
//      y = silu(y_pre) or y_pre.   Backward recomputes y_pre.
//    dx (=); dw (+=); dbias (+=).
// 2. l2norm (section 6, B11). x, y, dx, dy: [rows, d] rows; rstd: [rows].
//      rstd = 1 / sqrt(sum x^2 + eps) (eps inside the root of the SUM), y = x * rstd
//      dx = rstd * (dy - y * sum(dy * y)), y recomputed from x and the saved rstd.   dx (=).
// 3. gates (section 1.1, B9, B10). a, b, g, beta, da, db, dg, dbeta: [T, Hv] rows; A_log, dt_bias: [Hv].
//      g = -exp(A_log) * softplus(a + dt_bias), softplus(x) = x for x > 20;  beta = sigmoid(b)
//      da = dg * (-exp(A_log)) * softplus'(a + dt_bias)  (=);  db = dbeta * beta * (1 - beta)  (=)
//      dA_log += sum_t dg * g;  ddt_bias += sum_t da.
// 4. gated delta rule, the TOKEN-BY-TOKEN recurrence (section 2; not the chunked algorithm).
//    q, k: [T, Hk*dk] rows (head-major inside a row); v, o: [T, Hv*dv] rows; g, beta: [T, Hv] rows
//    (g is the natural-log per-token decay, not cumulated); h0, ht, dht, dh0: [N, Hv, dk, dv]
//    contiguous. v-head h reads key head h / (Hv / Hk) (repeat_interleave GQA). Per token:
//      S <- exp(g) S;  p = S^T k;  u = beta (v - p);  S <- S + k u^T;  o = scale * S^T q
//    Backward (reverse time; dS starts at dht, or 0), with Sa the decayed state and St the updated one:
//      dq  = scale * St dO;   dS += scale * q dO^T          (read-out)
//      dk  = dS u;  du = dS^T k                              (rank-1 write)
//      dbeta = du . (v - p);  dv = beta du;  dp = -beta du   (innovation)
//      dS += k dp^T;  dk += Sa dp                            (prediction p = Sa^T k)
//      dg  = sum(Sa (.) dS);  dS <- exp(g) dS                (decay)
//    dh0 = dS after the first token of the sequence. dq, dk are summed over the G v-heads of a key
//    head in v-head order. All gradients overwrite (=). The states needed in reverse are recomputed
//    from checkpoints stored every `ckpt` tokens on a forward sweep (memory
//    O((L/ckpt + ckpt) dk dv) per sequence and head); recomputation repeats the forward's exact
//    operations, so gradients are bitwise independent of `ckpt` and of how sequences are packed.
// 5. gated RMSNorm (section 8.1). o, z, y, do, dz, dy: [rows, dv] rows; w, dw: [dv]; rstd: [rows].
//      rstd = 1 / sqrt(mean(o^2) + eps);  y = o * rstd * w * silu(z)
//      dz = dy * o*rstd*w * silu'(z) (=);  dy0 = dy * silu(z);  dw += sum_rows dy0 * o*rstd;
//      do = rstd * (w * dy0 - xh * mean(xh * w * dy0)), xh = o * rstd  (=).
//
// Determinism: single-threaded, fixed summation order; parameter gradients are summed over
// tokens in double (per-sequence partials added in sequence order for conv) and added to the
// output once. No exp/exp2 mixing: natural exp everywhere.
#pragma once
#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <vector>

namespace dt::ops::cpu::ref {

// Row-strided 2-D array: element (r, c) at data[r * ld + c].
template <typename E>
struct Rows {
  E* data = nullptr;
  int64_t ld = 0;
  // Rows of heads, [A, B, d] with strides (ld, ld_inner, 1): row r = (r / inner, r % inner).
  int64_t inner = 1, ld_inner = 0;

  Rows() = default;
  Rows(E* d, int64_t l) : data(d), ld(l) {}
  Rows(E* d, int64_t l, int64_t b, int64_t lb) : data(d), ld(l), inner(b), ld_inner(lb) {}
  template <typename U>
    requires std::convertible_to<U*, E*>
  Rows(const Rows<U>& o)  // NOLINT: Rows<T> -> Rows<const T>
      : data(o.data), ld(o.ld), inner(o.inner), ld_inner(o.ld_inner) {}

  E* row(int64_t r) const { return inner == 1 ? data + r * ld : data + (r / inner) * ld + (r % inner) * ld_inner; }
  bool present() const { return data != nullptr; }
};

namespace detail {
inline std::vector<double> zeros(int64_t n) { return std::vector<double>(size_t(n), 0.0); }
inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
// d silu / dx = sigma(x) (1 + x (1 - sigma(x)))
inline double silu_grad(double x) {
  double s = sigmoid(x);
  return s * (1.0 + x * (1.0 - s));
}
// The FLA / torch threshold: softplus(x) = x above 20 (its derivative is then exactly 1).
inline double softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }
inline double softplus_grad(double x) { return x > 20.0 ? 1.0 : sigmoid(x); }
}  // namespace detail

// =============================================================== 1. causal conv1d, varlen
namespace detail {
// Pre-activation of channel c at token t of the sequence that starts at token `bos`.
template <typename Real>
double conv_pre(Rows<const Real> x, const Real* w, const Real* bias, int W, int64_t c, int64_t t, int64_t bos) {
  double acc = bias ? double(bias[c]) : 0.0;
  for (int j = 0; j < W; ++j) {
    int64_t src = t - (W - 1) + j;
    if (src >= bos) acc += double(w[c * W + j]) * double(x.row(src)[c]);
  }
  return acc;
}
}  // namespace detail

template <typename Real>
void conv1d_varlen_fwd(Rows<Real> y, Rows<const Real> x, const Real* w, const Real* bias, int64_t D, int W, bool silu,
                       const int32_t* cu, int64_t n_seq) {
  for (int64_t n = 0; n < n_seq; ++n) {
    const int64_t bos = cu[n], eos = cu[n + 1];
    for (int64_t t = bos; t < eos; ++t) {
      Real* yr = y.row(t);
      for (int64_t c = 0; c < D; ++c) {
        double p = detail::conv_pre(x, w, bias, W, c, t, bos);
        yr[c] = Real(silu ? p * detail::sigmoid(p) : p);
      }
    }
  }
}

template <typename Real>
void conv1d_varlen_bwd(Rows<Real> dx, Real* dw, Real* dbias, Rows<const Real> dy, Rows<const Real> x, const Real* w,
                       const Real* bias, int64_t D, int W, bool silu, const int32_t* cu, int64_t n_seq) {
  constexpr int64_t kCB = 64;  // channels per block: bounds the dy_pre buffer to L x 64 doubles
  auto dw_acc = detail::zeros(D * W), db_acc = detail::zeros(D);
  std::vector<double> dyp;  // [L, cb] dy_pre of one sequence and channel block
  for (int64_t n = 0; n < n_seq; ++n) {
    const int64_t bos = cu[n], eos = cu[n + 1], L = eos - bos;
    for (int64_t c0 = 0; c0 < D; c0 += kCB) {
      const int64_t cb = std::min(kCB, D - c0);
      dyp.assign(size_t(L * cb), 0.0);
      for (int64_t t = bos; t < eos; ++t)
        for (int64_t cc = 0; cc < cb; ++cc) {
          const int64_t c = c0 + cc;
          double d = double(dy.row(t)[c]);
          if (silu) d *= detail::silu_grad(detail::conv_pre(x, w, bias, W, c, t, bos));
          dyp[size_t((t - bos) * cb + cc)] = d;
        }
      // dx[s] = sum_i w[W-1-i] dy_pre[s+i], same-sequence taps only
      for (int64_t s = bos; s < eos; ++s)
        for (int64_t cc = 0; cc < cb; ++cc) {
          const int64_t c = c0 + cc;
          double acc = 0.0;
          for (int i = 0; i < W && s + i < eos; ++i)
            acc += double(w[c * W + (W - 1 - i)]) * dyp[size_t((s - bos + i) * cb + cc)];
          dx.row(s)[c] = Real(acc);
        }
      // per-sequence partials of dw, dbias, added in sequence order
      for (int64_t cc = 0; cc < cb; ++cc) {
        const int64_t c = c0 + cc;
        for (int j = 0; j < W; ++j) {
          double p = 0.0;
          for (int64_t t = bos; t < eos; ++t) {
            int64_t src = t - (W - 1) + j;
            if (src >= bos) p += dyp[size_t((t - bos) * cb + cc)] * double(x.row(src)[c]);
          }
          dw_acc[size_t(c * W + j)] += p;
        }
        double p = 0.0;
        for (int64_t t = bos; t < eos; ++t) p += dyp[size_t((t - bos) * cb + cc)];
        db_acc[size_t(c)] += p;
      }
    }
  }
  for (int64_t i = 0; i < D * W; ++i) dw[i] = Real(double(dw[i]) + dw_acc[size_t(i)]);
  if (dbias)
    for (int64_t c = 0; c < D; ++c) dbias[c] = Real(double(dbias[c]) + db_acc[size_t(c)]);
}

// =============================================================== 2. l2norm
template <typename Real>
void l2norm_fwd(Rows<Real> y, Real* rstd, Rows<const Real> x, int64_t rows, int64_t d, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const Real* xr = x.row(r);
    double ss = 0.0;
    for (int64_t i = 0; i < d; ++i) ss += double(xr[i]) * double(xr[i]);
    const double rs = 1.0 / std::sqrt(ss + eps);
    rstd[r] = Real(rs);
    Real* yr = y.row(r);
    for (int64_t i = 0; i < d; ++i) yr[i] = Real(double(xr[i]) * rs);
  }
}

template <typename Real>
void l2norm_bwd(Rows<Real> dx, Rows<const Real> dy, Rows<const Real> x, const Real* rstd, int64_t rows, int64_t d) {
  for (int64_t r = 0; r < rows; ++r) {
    const Real* xr = x.row(r);
    const Real* dyr = dy.row(r);
    const double rs = double(rstd[r]);
    double dot = 0.0;  // sum dy * y
    for (int64_t i = 0; i < d; ++i) dot += double(dyr[i]) * (double(xr[i]) * rs);
    Real* dxr = dx.row(r);
    for (int64_t i = 0; i < d; ++i) dxr[i] = Real(rs * (double(dyr[i]) - double(xr[i]) * rs * dot));
  }
}

// From the normalised y itself (causal_conv1d_l2norm_fwd keeps y, not x).
template <typename Real>
void l2norm_bwd_y(Rows<Real> dx, Rows<const Real> dy, Rows<const Real> y, const Real* rstd, int64_t rows, int64_t d) {
  for (int64_t r = 0; r < rows; ++r) {
    const Real* yr = y.row(r);
    const Real* dyr = dy.row(r);
    const double rs = double(rstd[r]);
    double dot = 0.0;  // sum dy * y
    for (int64_t i = 0; i < d; ++i) dot += double(dyr[i]) * double(yr[i]);
    Real* dxr = dx.row(r);
    for (int64_t i = 0; i < d; ++i) dxr[i] = Real(rs * (double(dyr[i]) - double(yr[i]) * dot));
  }
}

// =============================================================== 3. gates
template <typename Real>
void gate_fwd(Rows<Real> g, Rows<Real> beta, Rows<const Real> a, Rows<const Real> b, const Real* A_log,
              const Real* dt_bias, int64_t T, int64_t Hv) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hv; ++h) {
      g.row(t)[h] = Real(-std::exp(double(A_log[h])) * detail::softplus(double(a.row(t)[h]) + double(dt_bias[h])));
      beta.row(t)[h] = Real(detail::sigmoid(double(b.row(t)[h])));
    }
}

template <typename Real>
void gate_bwd(Rows<Real> da, Rows<Real> db, Real* dA_log, Real* ddt_bias, Rows<const Real> dg, Rows<const Real> dbeta,
              Rows<const Real> a, Rows<const Real> b, const Real* A_log, const Real* dt_bias, int64_t T, int64_t Hv) {
  for (int64_t h = 0; h < Hv; ++h) {
    const double eA = std::exp(double(A_log[h]));
    double sA = 0.0, sdt = 0.0;  // token sums in a fixed order
    for (int64_t t = 0; t < T; ++t) {
      const double x = double(a.row(t)[h]) + double(dt_bias[h]);
      const double dgt = double(dg.row(t)[h]);
      const double dat = dgt * -eA * detail::softplus_grad(x);
      da.row(t)[h] = Real(dat);
      sA += dgt * (-eA * detail::softplus(x));  // dg/dA_log = g
      sdt += dat;
      const double s = detail::sigmoid(double(b.row(t)[h]));
      db.row(t)[h] = Real(double(dbeta.row(t)[h]) * s * (1.0 - s));
    }
    dA_log[h] = Real(double(dA_log[h]) + sA);
    ddt_bias[h] = Real(double(ddt_bias[h]) + sdt);
  }
}

// =============================================================== 4. gated delta rule (recurrence)
struct GdnRefShape {
  int64_t n_seq = 0;
  int64_t Hk = 0, Hv = 0, dk = 0, dv = 0;
  double scale = 0.0;  // the caller resolves the default dk^-0.5
};

template <typename Real>
struct GdnRefFwd {
  Rows<Real> o;                 // [T, Hv*dv]
  Real* ht = nullptr;           // [N, Hv, dk, dv] or null
  Rows<const Real> q, k;        // [T, Hk*dk]
  Rows<const Real> v;           // [T, Hv*dv]
  Rows<const Real> g, beta;     // [T, Hv]
  const Real* h0 = nullptr;     // [N, Hv, dk, dv] or null (= 0)
};

template <typename Real>
struct GdnRefBwd {
  Rows<Real> dq, dk;            // [T, Hk*dk] (=)
  Rows<Real> dv;                // [T, Hv*dv] (=)
  Rows<Real> dg, dbeta;         // [T, Hv] (=)
  Real* dh0 = nullptr;          // [N, Hv, dk, dv] (=) or null
  Rows<const Real> do_;         // [T, Hv*dv]
  const Real* dht = nullptr;    // [N, Hv, dk, dv] or null (= 0)
  Rows<const Real> q, k, v, g, beta;
  const Real* h0 = nullptr;
};

namespace detail {
// One token on the double state S [dk, dv] (row-major): decay, innovation, rank-1 write.
// Writes p = Sa^T k (prediction) and u (innovation) [dv]. The backward recomputes states with
// this same function, so its recomputed states are bitwise those of the forward.
inline void gdn_step(double* S, double* p, double* u, const double* k, const double* v, double eg, double beta,
                     int64_t dk, int64_t dv) {
  for (int64_t i = 0; i < dk * dv; ++i) S[i] *= eg;
  std::fill(p, p + dv, 0.0);
  for (int64_t i = 0; i < dk; ++i)
    for (int64_t j = 0; j < dv; ++j) p[j] += S[i * dv + j] * k[i];
  for (int64_t j = 0; j < dv; ++j) u[j] = beta * (v[j] - p[j]);
  for (int64_t i = 0; i < dk; ++i)
    for (int64_t j = 0; j < dv; ++j) S[i * dv + j] += k[i] * u[j];
}

template <typename Real>
void load(double* dst, const Real* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = double(src[i]);
}
}  // namespace detail

template <typename Real>
void gdn_recurrent_fwd(const GdnRefFwd<Real>& a, const GdnRefShape& d, const int32_t* cu) {
  const int64_t dk = d.dk, dv = d.dv, G = d.Hv / d.Hk, SS = dk * dv;
  auto S = detail::zeros(SS), p = detail::zeros(dv), u = detail::zeros(dv);
  auto q = detail::zeros(dk), k = detail::zeros(dk), v = detail::zeros(dv);
  for (int64_t n = 0; n < d.n_seq; ++n)
    for (int64_t h = 0; h < d.Hv; ++h) {
      const int64_t kh = h / G, sidx = (n * d.Hv + h) * SS;
      if (a.h0) detail::load(S.data(), a.h0 + sidx, SS);
      else std::fill(S.begin(), S.end(), 0.0);
      for (int64_t t = cu[n]; t < cu[n + 1]; ++t) {
        detail::load(q.data(), a.q.row(t) + kh * dk, dk);
        detail::load(k.data(), a.k.row(t) + kh * dk, dk);
        detail::load(v.data(), a.v.row(t) + h * dv, dv);
        detail::gdn_step(S.data(), p.data(), u.data(), k.data(), v.data(), std::exp(double(a.g.row(t)[h])),
                         double(a.beta.row(t)[h]), dk, dv);
        Real* o = a.o.row(t) + h * dv;
        for (int64_t j = 0; j < dv; ++j) {
          double acc = 0.0;
          for (int64_t i = 0; i < dk; ++i) acc += S[size_t(i * dv + j)] * q[size_t(i)];
          o[j] = Real(d.scale * acc);
        }
      }
      if (a.ht)
        for (int64_t i = 0; i < SS; ++i) a.ht[sidx + i] = Real(S[size_t(i)]);
    }
}

template <typename Real>
void gdn_recurrent_bwd(const GdnRefBwd<Real>& a, const GdnRefShape& d, const int32_t* cu, int64_t ckpt = 64) {
  const int64_t dk = d.dk, dv = d.dv, G = d.Hv / d.Hk, SS = dk * dv;
  const double sc = d.scale;
  std::vector<double> ck;                                   // [L/ckpt, dk, dv] state before each segment
  auto seg = detail::zeros((ckpt + 1) * SS);              // [ckpt+1, dk, dv] states inside one segment
  auto dS = detail::zeros(SS), Sa = detail::zeros(SS);
  auto p = detail::zeros(dv), u = detail::zeros(dv), du = detail::zeros(dv), dp = detail::zeros(dv);
  auto q = detail::zeros(dk), k = detail::zeros(dk), v = detail::zeros(dv), dO = detail::zeros(dv);
  std::vector<double> dq_acc, dk_acc;                       // [L, dk] sums over the G v-heads
  for (int64_t n = 0; n < d.n_seq; ++n) {
    const int64_t bos = cu[n], L = cu[n + 1] - bos, nseg = (L + ckpt - 1) / ckpt;
    for (int64_t kh = 0; kh < d.Hk; ++kh) {
      dq_acc.assign(size_t(L * dk), 0.0);
      dk_acc.assign(size_t(L * dk), 0.0);
      for (int64_t h = kh * G; h < (kh + 1) * G; ++h) {
        const int64_t sidx = (n * d.Hv + h) * SS;
        auto load_tok = [&](int64_t t) {
          detail::load(q.data(), a.q.row(t) + kh * dk, dk);
          detail::load(k.data(), a.k.row(t) + kh * dk, dk);
          detail::load(v.data(), a.v.row(t) + h * dv, dv);
        };
        // forward sweep: checkpoint the state entering every segment
        ck.resize(size_t(nseg * SS));
        std::vector<double>& S = Sa;  // Sa is free until the reverse sweep
        if (a.h0) detail::load(S.data(), a.h0 + sidx, SS);
        else std::fill(S.begin(), S.end(), 0.0);
        for (int64_t i = 0; i < L; ++i) {
          if (i % ckpt == 0) std::copy(S.begin(), S.end(), ck.begin() + (i / ckpt) * SS);
          load_tok(bos + i);
          detail::gdn_step(S.data(), p.data(), u.data(), k.data(), v.data(), std::exp(double(a.g.row(bos + i)[h])),
                           double(a.beta.row(bos + i)[h]), dk, dv);
        }
        // reverse sweep
        if (a.dht) detail::load(dS.data(), a.dht + sidx, SS);
        else std::fill(dS.begin(), dS.end(), 0.0);
        for (int64_t sg = nseg - 1; sg >= 0; --sg) {
          const int64_t i0 = sg * ckpt, i1 = std::min(L, i0 + ckpt);
          std::copy(ck.begin() + sg * SS, ck.begin() + (sg + 1) * SS, seg.begin());
          for (int64_t i = i0; i < i1; ++i) {  // seg[i-i0+1] = state after token i
            double* Sn = seg.data() + (i - i0 + 1) * SS;
            std::copy(Sn - SS, Sn, Sn);
            load_tok(bos + i);
            detail::gdn_step(Sn, p.data(), u.data(), k.data(), v.data(), std::exp(double(a.g.row(bos + i)[h])),
                             double(a.beta.row(bos + i)[h]), dk, dv);
          }
          for (int64_t i = i1 - 1; i >= i0; --i) {
            const int64_t t = bos + i;
            const double* Sprev = seg.data() + (i - i0) * SS;
            const double* St = Sprev + SS;
            load_tok(t);
            detail::load(dO.data(), a.do_.row(t) + h * dv, dv);
            const double eg = std::exp(double(a.g.row(t)[h])), bt = double(a.beta.row(t)[h]);
            // recompute Sa, p, u exactly as gdn_step did
            for (int64_t e = 0; e < SS; ++e) Sa[size_t(e)] = Sprev[e] * eg;
            std::fill(p.begin(), p.end(), 0.0);
            for (int64_t ii = 0; ii < dk; ++ii)
              for (int64_t j = 0; j < dv; ++j) p[size_t(j)] += Sa[size_t(ii * dv + j)] * k[size_t(ii)];
            for (int64_t j = 0; j < dv; ++j) u[size_t(j)] = bt * (v[size_t(j)] - p[size_t(j)]);
            double* dqr = dq_acc.data() + i * dk;
            double* dkr = dk_acc.data() + i * dk;
            // read-out o = scale St^T q
            for (int64_t ii = 0; ii < dk; ++ii) {
              double acc = 0.0;
              for (int64_t j = 0; j < dv; ++j) acc += St[ii * dv + j] * dO[size_t(j)];
              dqr[ii] += sc * acc;
            }
            for (int64_t ii = 0; ii < dk; ++ii)
              for (int64_t j = 0; j < dv; ++j) dS[size_t(ii * dv + j)] += sc * q[size_t(ii)] * dO[size_t(j)];
            // rank-1 write S = Sa + k u^T
            std::fill(du.begin(), du.end(), 0.0);
            for (int64_t ii = 0; ii < dk; ++ii) {
              double acc = 0.0;
              for (int64_t j = 0; j < dv; ++j) {
                acc += dS[size_t(ii * dv + j)] * u[size_t(j)];
                du[size_t(j)] += dS[size_t(ii * dv + j)] * k[size_t(ii)];
              }
              dkr[ii] += acc;
            }
            // innovation u = beta (v - p)
            double dbt = 0.0;
            Real* dvr = a.dv.row(t) + h * dv;
            for (int64_t j = 0; j < dv; ++j) {
              dbt += du[size_t(j)] * (v[size_t(j)] - p[size_t(j)]);
              dvr[j] = Real(bt * du[size_t(j)]);
              dp[size_t(j)] = -bt * du[size_t(j)];
            }
            a.dbeta.row(t)[h] = Real(dbt);
            // prediction p = Sa^T k
            for (int64_t ii = 0; ii < dk; ++ii) {
              double acc = 0.0;
              for (int64_t j = 0; j < dv; ++j) {
                dS[size_t(ii * dv + j)] += k[size_t(ii)] * dp[size_t(j)];
                acc += Sa[size_t(ii * dv + j)] * dp[size_t(j)];
              }
              dkr[ii] += acc;
            }
            // decay Sa = exp(g) S_prev
            double dgt = 0.0;
            for (int64_t e = 0; e < SS; ++e) {
              dgt += Sa[size_t(e)] * dS[size_t(e)];
              dS[size_t(e)] *= eg;
            }
            a.dg.row(t)[h] = Real(dgt);
          }
        }
        if (a.dh0)
          for (int64_t e = 0; e < SS; ++e) a.dh0[sidx + e] = Real(dS[size_t(e)]);
      }
      for (int64_t i = 0; i < L; ++i)
        for (int64_t ii = 0; ii < dk; ++ii) {
          a.dq.row(bos + i)[kh * dk + ii] = Real(dq_acc[size_t(i * dk + ii)]);
          a.dk.row(bos + i)[kh * dk + ii] = Real(dk_acc[size_t(i * dk + ii)]);
        }
    }
  }
}

// =============================================================== 5. gated RMSNorm
template <typename Real>
void gated_rmsnorm_fwd(Rows<Real> y, Real* rstd, Rows<const Real> o, Rows<const Real> z, const Real* w, int64_t rows,
                       int64_t dv, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const Real* xr = o.row(r);
    const Real* zr = z.row(r);
    double ss = 0.0;
    for (int64_t i = 0; i < dv; ++i) ss += double(xr[i]) * double(xr[i]);
    const double rs = 1.0 / std::sqrt(ss / double(dv) + eps);
    rstd[r] = Real(rs);
    Real* yr = y.row(r);
    for (int64_t i = 0; i < dv; ++i) {
      const double zi = double(zr[i]);
      yr[i] = Real(double(xr[i]) * rs * double(w[i]) * (zi * detail::sigmoid(zi)));
    }
  }
}

template <typename Real>
void gated_rmsnorm_bwd(Rows<Real> dx, Rows<Real> dz, Real* dw, Rows<const Real> dy, Rows<const Real> o,
                       Rows<const Real> z, const Real* w, const Real* rstd, int64_t rows, int64_t dv) {
  auto dw_acc = detail::zeros(dv), dy0 = detail::zeros(dv), xh = detail::zeros(dv);
  for (int64_t r = 0; r < rows; ++r) {
    const Real* xr = o.row(r);
    const Real* zr = z.row(r);
    const Real* dyr = dy.row(r);
    const double rs = double(rstd[r]);
    double m = 0.0;  // sum xh * w * dy0
    for (int64_t i = 0; i < dv; ++i) {
      const double zi = double(zr[i]), wi = double(w[i]), dyi = double(dyr[i]);
      xh[size_t(i)] = double(xr[i]) * rs;
      dy0[size_t(i)] = dyi * zi * detail::sigmoid(zi);
      dz.row(r)[i] = Real(dyi * xh[size_t(i)] * wi * detail::silu_grad(zi));
      dw_acc[size_t(i)] += dy0[size_t(i)] * xh[size_t(i)];
      m += xh[size_t(i)] * wi * dy0[size_t(i)];
    }
    m /= double(dv);
    for (int64_t i = 0; i < dv; ++i)
      dx.row(r)[i] = Real(rs * (double(w[i]) * dy0[size_t(i)] - xh[size_t(i)] * m));
  }
  for (int64_t i = 0; i < dv; ++i) dw[i] = Real(double(dw[i]) + dw_acc[size_t(i)]);
}

}  // namespace dt::ops::cpu::ref
