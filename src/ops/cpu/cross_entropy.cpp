// CPU reference of the vocab-parallel cross-entropy pieces (f32 views, double within a row). See
// include/deltatron/ops/layers_ops.h for the protocol; per row t of logits [T, V_l] (this rank's
// vocab columns [vocab_begin, vocab_begin + V_l)):
//   m = max_j l_j;  se = sum_j exp(l_j - m);  tl = l[target - vocab_begin] if owned else 0   (=)
//   se *= exp(m - M)  (ce_rescale: this rank's sum relative to the global max M)            (=)
//   loss = log(se) + m - tl if target >= 0 else 0                                            (=)
//   dl_j = scale * (exp(l_j - m) / se - [j + vocab_begin == target]) if target >= 0 else 0   (=)
// m and se arrive already reduced over tp for ce_loss / ce_bwd. ce_stats reads each row twice
// (max, then the sum relative to it): the oracle for the CUDA kernel's one-pass online softmax,
// the same value up to rounding. Every loop runs in index order: deterministic.
#include <cmath>
#include <limits>

#include "ops/layers_ops_backends.h"

namespace dt::ops::cpu {
namespace {
inline const float* row(const TensorView& v, int64_t r) { return v.ptr<float>() + r * v.stride[0]; }
}  // namespace

void ce_stats(const TensorView& m, const TensorView& se, const TensorView& tl, const TensorView& logits,
              const TensorView& targets, int64_t vocab_begin, Stream) {
  const int64_t T = logits.shape[0], V = logits.shape[1];
  for (int64_t t = 0; t < T; ++t) {
    const float* l = row(logits, t);
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < V; ++j) mx = l[j] > mx ? l[j] : mx;
    // -inf adds exactly 0 (never -inf - -inf = NaN); NaN (skipped by the max) makes se NaN.
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    double acc = 0;
    for (int64_t j = 0; j < V; ++j) acc += l[j] == kNegInf ? 0.0 : std::exp(double(l[j]) - double(mx));
    m.ptr<float>()[t] = mx;
    se.ptr<float>()[t] = float(acc);
    const int64_t c = int64_t(targets.ptr<int32_t>()[t]) - vocab_begin;
    tl.ptr<float>()[t] = (targets.ptr<int32_t>()[t] >= 0 && c >= 0 && c < V) ? l[c] : 0.f;
  }
}

void ce_rescale(const TensorView& se, const TensorView& m, const TensorView& m_global, Stream) {
  for (int64_t t = 0, T = se.numel(); t < T; ++t) {
    const float mt = m.ptr<float>()[t], M = m_global.ptr<float>()[t];
    float& s = se.ptr<float>()[t];
    // m == M (this rank holds the max, or every rank's row is -inf): factor exactly 1.
    if (mt != M) s = float(double(s) * std::exp(double(mt) - double(M)));
  }
}

void ce_loss(const TensorView& loss, const TensorView& m, const TensorView& se, const TensorView& tl,
             const TensorView& targets, Stream) {
  for (int64_t t = 0, T = loss.numel(); t < T; ++t)
    loss.ptr<float>()[t] = targets.ptr<int32_t>()[t] >= 0
                               ? float(std::log(double(se.ptr<float>()[t])) + double(m.ptr<float>()[t]) -
                                       double(tl.ptr<float>()[t]))
                               : 0.f;
}

void ce_bwd(const TensorView& dlogits, const TensorView& logits, const TensorView& m, const TensorView& se,
            const TensorView& targets, int64_t vocab_begin, float scale, Stream) {
  const int64_t T = logits.shape[0], V = logits.shape[1];
  for (int64_t t = 0; t < T; ++t) {
    const float* l = row(logits, t);
    float* d = dlogits.ptr<float>() + t * dlogits.stride[0];
    const int32_t tgt = targets.ptr<int32_t>()[t];
    if (tgt < 0) {
      for (int64_t j = 0; j < V; ++j) d[j] = 0.f;
      continue;
    }
    const double mx = m.ptr<float>()[t], inv = 1.0 / double(se.ptr<float>()[t]);
    const int64_t c = int64_t(tgt) - vocab_begin;
    for (int64_t j = 0; j < V; ++j)
      d[j] = float(double(scale) * (std::exp(double(l[j]) - mx) * inv - (j == c ? 1.0 : 0.0)));
  }
}

}  // namespace dt::ops::cpu
