// CPU reference of the attention-layer ops (include/deltatron/ops/attention.h has the math):
// partial RoPE (angles in double), varlen causal softmax attention with GQA (plain softmax per
// query row in double, fp32 storage, lse saved for the backward), the sigmoid output gate and the
// row gather. Views are f32 with any row stride (checked by src/ops/attention.cpp).
// Deterministic: fixed loop orders; dk/dv accumulate in double over query rows in row order.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/attention_backends.h"

namespace dt::ops::cpu {
namespace {

inline double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }
// Row t, head h of a [T, H, D] view (head stride D, unit inner stride).
inline float* at(const TensorView& v, int64_t t, int64_t h) { return v.ptr<float>() + t * v.stride[0] + h * v.stride[1]; }
inline float* row(const TensorView& v, int64_t r) { return v.ptr<float>() + r * v.stride[0]; }

// Rotation by sign * angle (sign = -1: the transpose, for the backward).
void rope_apply(const TensorView& y, const TensorView& x, const TensorView& pos, int64_t rd, double theta,
                double sign) {
  const int64_t T = x.shape[0], H = x.shape[1], D = x.shape[2], half = rd / 2;
  const size_t nh = size_t(half);
  std::vector<double> inv(nh), c(nh), s(nh);
  for (int64_t j = 0; j < half; ++j) inv[size_t(j)] = std::pow(theta, -double(2 * j) / double(rd));
  for (int64_t t = 0; t < T; ++t) {
    const double p = pos.ptr<int32_t>()[t];
    for (int64_t j = 0; j < half; ++j) {
      c[size_t(j)] = std::cos(p * inv[size_t(j)]);
      s[size_t(j)] = sign * std::sin(p * inv[size_t(j)]);
    }
    for (int64_t h = 0; h < H; ++h) {
      const float* xr = at(x, t, h);
      float* yr = at(y, t, h);
      for (int64_t j = 0; j < half; ++j) {  // read both halves before writing (y may alias x)
        const double a = xr[j], b = xr[j + half];
        yr[j] = float(a * c[size_t(j)] - b * s[size_t(j)]);
        yr[j + half] = float(b * c[size_t(j)] + a * s[size_t(j)]);
      }
      if (yr != xr)
        for (int64_t d = rd; d < D; ++d) yr[d] = xr[d];
    }
  }
}

// The key range of query row l (see AttnVarlen): [k0, k0 + n), n = 0 for a row that is not live.
struct RowKeys {
  int64_t k0 = 0, n = 0;
};
std::vector<RowKeys> row_keys(const AttnVarlen& m, int64_t Tq) {
  const int32_t* cp = m.cu_seqlens_padded.ptr<int32_t>();
  const int32_t* ca = m.cu_seqlens.ptr<int32_t>();
  const int32_t* pos = m.q_pos.ptr<int32_t>();
  const int64_t N = m.cu_seqlens_padded.shape[0] - 1;
  std::vector<RowKeys> out(static_cast<size_t>(Tq));
  for (int64_t i = 0; i < N; ++i) {
    const int64_t a = int64_t(ca[i + 1]) - ca[i], p_len = int64_t(cp[i + 1]) - cp[i];
    DT_CHECK(a >= 0 && a <= p_len, "attention: sequence {} has actual length {} and padded length {}", i, a, p_len);
    for (int64_t l = cp[i] / m.q_div; l < cp[i + 1] / m.q_div; ++l) {
      const int64_t p = pos[l];
      DT_CHECK(p >= 0 && p < p_len, "attention: query row {} has position {} outside sequence {} of length {}", l, p,
               i, p_len);
      if (p < a) out[size_t(l)] = {cp[i], p + 1};
    }
  }
  return out;
}

}  // namespace

void rope_fwd(const TensorView& y, const TensorView& x, const TensorView& pos, int64_t rotary_dim, double theta,
              Stream) {
  rope_apply(y, x, pos, rotary_dim, theta, 1.0);
}
void rope_bwd(const TensorView& dx, const TensorView& dy, const TensorView& pos, int64_t rotary_dim, double theta,
              Stream) {
  rope_apply(dx, dy, pos, rotary_dim, theta, -1.0);
}

void attention_fwd(const TensorView& o, const TensorView& lse, const TensorView& q, const TensorView& k,
                   const TensorView& v, const AttnVarlen& meta, float scale, Stream) {
  const int64_t Tq = q.shape[0], Hq = q.shape[1], D = q.shape[2], G = Hq / k.shape[1];
  const std::vector<RowKeys> keys = row_keys(meta, Tq);
  std::vector<double> sc, acc(static_cast<size_t>(D));
  for (int64_t l = 0; l < Tq; ++l) {
    const RowKeys rk = keys[size_t(l)];
    for (int64_t h = 0; h < Hq; ++h) {
      float* orow = at(o, l, h);
      float& L = lse.ptr<float>()[l * Hq + h];
      if (rk.n == 0) {  // not live: defined zeros, never 0/0
        std::fill(orow, orow + D, 0.f);
        L = 0.f;
        continue;
      }
      const float* qr = at(q, l, h);
      sc.assign(size_t(rk.n), 0.0);
      double mx = -INFINITY;
      for (int64_t j = 0; j < rk.n; ++j) {
        const float* kr = at(k, rk.k0 + j, h / G);
        double d = 0;
        for (int64_t e = 0; e < D; ++e) d += double(qr[e]) * kr[e];
        sc[size_t(j)] = d * scale;
        mx = std::max(mx, sc[size_t(j)]);
      }
      double sum = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < rk.n; ++j) {
        const double w = std::exp(sc[size_t(j)] - mx);
        sum += w;
        const float* vr = at(v, rk.k0 + j, h / G);
        for (int64_t e = 0; e < D; ++e) acc[size_t(e)] += w * vr[e];
      }
      for (int64_t e = 0; e < D; ++e) orow[e] = float(acc[size_t(e)] / sum);
      L = float(mx + std::log(sum));
    }
  }
}

void attention_bwd(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& d_o,
                   const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                   const TensorView& lse, const AttnVarlen& meta, float scale, Stream) {
  const int64_t Tq = q.shape[0], Hq = q.shape[1], D = q.shape[2], Tk = k.shape[0], Hkv = k.shape[1], G = Hq / Hkv;
  const std::vector<RowKeys> keys = row_keys(meta, Tq);
  const size_t nkv = size_t(Tk * Hkv * D);
  std::vector<double> dK(nkv, 0.0), dV(nkv, 0.0), dQ(static_cast<size_t>(D));
  std::vector<double> P;
  for (int64_t l = 0; l < Tq; ++l) {
    const RowKeys rk = keys[size_t(l)];
    for (int64_t h = 0; h < Hq; ++h) {
      float* dqr = at(dq, l, h);
      if (rk.n == 0) {
        std::fill(dqr, dqr + D, 0.f);
        continue;
      }
      const int64_t hk = h / G;
      const float *qr = at(q, l, h), *dor = at(d_o, l, h), *orow = at(o, l, h);
      const double L = lse.ptr<float>()[l * Hq + h];
      double Dl = 0;
      for (int64_t e = 0; e < D; ++e) Dl += double(dor[e]) * orow[e];
      P.assign(size_t(rk.n), 0.0);
      std::fill(dQ.begin(), dQ.end(), 0.0);
      for (int64_t j = 0; j < rk.n; ++j) {
        const int64_t kj = rk.k0 + j;
        const float *kr = at(k, kj, hk), *vr = at(v, kj, hk);
        double s = 0, dp = 0;
        for (int64_t e = 0; e < D; ++e) {
          s += double(qr[e]) * kr[e];
          dp += double(dor[e]) * vr[e];
        }
        const double p = std::exp(s * scale - L), ds = p * (dp - Dl) * scale;
        double* dkr = &dK[size_t((kj * Hkv + hk) * D)];
        double* dvr = &dV[size_t((kj * Hkv + hk) * D)];
        for (int64_t e = 0; e < D; ++e) {
          dQ[size_t(e)] += ds * kr[e];
          dkr[e] += ds * qr[e];
          dvr[e] += p * dor[e];
        }
      }
      for (int64_t e = 0; e < D; ++e) dqr[e] = float(dQ[size_t(e)]);
    }
  }
  for (int64_t j = 0; j < Tk; ++j)
    for (int64_t h = 0; h < Hkv; ++h) {
      float *dkr = at(dk, j, h), *dvr = at(dv, j, h);
      for (int64_t e = 0; e < D; ++e) {
        dkr[e] = float(dK[size_t((j * Hkv + h) * D + e)]);
        dvr[e] = float(dV[size_t((j * Hkv + h) * D + e)]);
      }
    }
}

void sigmoid_gate_fwd(const TensorView& y, const TensorView& o, const TensorView& g, Stream) {
  const int64_t R = o.shape[0], D = o.shape[1];
  for (int64_t r = 0; r < R; ++r) {
    const float *orow = row(o, r), *gr = row(g, r);
    float* yr = row(y, r);
    for (int64_t j = 0; j < D; ++j) yr[j] = float(double(orow[j]) * sigmoid(gr[j]));
  }
}
void sigmoid_gate_bwd(const TensorView& d_o, const TensorView& dg, const TensorView& dy, const TensorView& o,
                      const TensorView& g, Stream) {
  const int64_t R = o.shape[0], D = o.shape[1];
  for (int64_t r = 0; r < R; ++r) {
    const float *orow = row(o, r), *gr = row(g, r), *dyr = row(dy, r);
    float *dor = row(d_o, r), *dgr = row(dg, r);
    for (int64_t j = 0; j < D; ++j) {
      const double sg = sigmoid(gr[j]), d = dyr[j];
      dgr[j] = float(d * orow[j] * sg * (1.0 - sg));
      dor[j] = float(d * sg);
    }
  }
}

void gather_rows(const TensorView& out, const TensorView& in, const TensorView& idx, Stream) {
  const int64_t R = out.shape[0], C = out.shape[1], Rin = in.shape[0];
  const size_t bytes = size_t(C) * dtype_size(out.dtype);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t src = idx.ptr<int32_t>()[r];
    DT_CHECK(src >= 0 && src < Rin, "gather_rows: idx[{}]={} outside [0, {})", r, src, Rin);
    std::memcpy(out.at_offset(r * out.stride[0]), in.at_offset(src * in.stride[0]), bytes);
  }
}

}  // namespace dt::ops::cpu
