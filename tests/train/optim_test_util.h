// Helpers for the optimizer tests: a small model's ParamSpec table (one GDN block, one gated
// attention block, norms with and without SP), double-precision reference updates, and the
// inputs of the fused-update comparisons (views at chosen offsets into their buffers).
#pragma once
#include <array>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "deltatron/ops/basic.h"
#include "deltatron/ops/optim.h"
#include "test_util.h"

#include "deltatron/layers/attention.h"
#include "deltatron/layers/gdn.h"
#include "deltatron/layers/norm.h"
#include "deltatron/model/param.h"

namespace dt::testing {

// Every parameter kind: column (with sections) and row TP splits, the 3-D conv1d weight,
// 1-D head-sharded gates (A_log, dt_bias), replicated norms with grad_sum_tp on (SP / shared by
// heads) and off (replicated, no SP). Splittable over tp in {1, 2, 4}.
inline std::vector<model::ParamSpec> small_model_specs() {
  layers::GdnConfig g;
  g.hidden = 16;
  g.num_k_heads = 4;
  g.num_v_heads = 8;
  g.head_k_dim = 4;
  g.head_v_dim = 4;
  g.conv_kernel = 4;
  layers::AttentionConfig a;
  a.hidden = 16;
  a.num_heads = 4;
  a.num_kv_heads = 4;
  a.head_dim = 4;
  std::vector<model::ParamSpec> s = layers::GatedDeltaNet::param_specs(g, "model.layers.0");
  for (auto& x : layers::GatedAttention::param_specs(a, "model.layers.1")) s.push_back(x);
  s.push_back(layers::RmsNorm1p::param_spec(16, "model.layers.0.input_layernorm.weight", true));
  s.push_back(layers::RmsNorm1p::param_spec(16, "model.norm.weight", false));
  return s;
}

inline std::vector<double> to_doubles(const TensorView& h) {  // host f32 view
  std::vector<double> out(size_t(h.numel()));
  for (int64_t i = 0; i < h.numel(); ++i) out[size_t(i)] = h.ptr<float>()[i];
  return out;
}

struct RefAdamW {  // double-precision AdamW state of one tensor
  std::vector<double> p, m, v;
};
inline void ref_adamw_step(RefAdamW& r, const std::vector<double>& g, double lr, double b1, double b2, double eps,
                           double wd, int64_t t, double clip) {
  const double bc1 = 1 - std::pow(b1, double(t)), bc2 = 1 - std::pow(b2, double(t));
  for (size_t i = 0; i < r.p.size(); ++i) {
    const double gi = clip * g[i];
    r.m[i] = b1 * r.m[i] + (1 - b1) * gi;
    r.v[i] = b2 * r.v[i] + (1 - b2) * gi * gi;
    const double mhat = r.m[i] / bc1, vhat = r.v[i] / bc2;
    r.p[i] = r.p[i] * (1 - lr * wd) - lr * mhat / (std::sqrt(vhat) + eps);
  }
}
inline void ref_sgd_step(std::vector<double>& p, const std::vector<double>& g, double lr, double wd, double clip) {
  for (size_t i = 0; i < p.size(); ++i) p[i] -= lr * (clip * g[i] + wd * p[i]);
}

// One update op's operands p, m, v, g (f32) and a compute copy (f32 / bf16 / f16), each a
// view n elements long, off[k] elements into its own buffer of n + 8: an odd offset puts the
// view off its 16-byte boundary, differing offsets put the views off it by different amounts.
struct UpdateCase {
  std::array<Tensor, 5> buf;      // [n + 8] each: p, m, v, g f32; compute
  std::array<TensorView, 5> x;    // [n] each, views into buf
  std::array<int64_t, 5> off{};
  int64_t n = 0;
  const TensorView& p() const { return x[0]; }
  const TensorView& m() const { return x[1]; }
  const TensorView& v() const { return x[2]; }
  const TensorView& g() const { return x[3]; }
  const TensorView& c() const { return x[4]; }
};
inline void set_views(UpdateCase& u) {
  for (size_t k = 0; k < 5; ++k) u.x[k] = u.buf[k].view().slice(0, u.off[k], u.off[k] + u.n);
}
// Fresh random operands on the host; compute starts as garbage (7), so unwritten elements show.
inline UpdateCase make_update_case(int64_t n, DType compute, std::array<int64_t, 5> off) {
  UpdateCase u;
  u.n = n;
  u.off = off;
  const Shape s{n + 8};
  u.buf = {randn_host(s), randn_host(s, 1e-2f), rand_host(s, 0.f, 1e-3f), randn_host(s), Tensor::empty(s, compute)};
  ops::fill(u.buf[4], 7.0);
  set_views(u);
  return u;
}
// The same bytes and offsets on `dev`.
inline UpdateCase clone_to(const UpdateCase& src, Device dev) {
  UpdateCase u = src;
  for (size_t k = 0; k < 5; ++k) u.buf[k] = ops::to_device(src.buf[k], dev);
  set_views(u);
  return u;
}

enum class UpdateKind { adamw, sgd };
inline const char* kind_name(UpdateKind k) { return k == UpdateKind::adamw ? "adamw" : "sgd"; }
// One update with non-trivial arguments (decay, clip scale, step 3). fused: the op writes the
// compute copy and zeroes g in its pass; else the three separate passes the optimizer made
// before (update, ops::copy cast, fill 0).
inline void apply_update(UpdateKind k, const UpdateCase& u, bool fused) {
  ops::UpdateWrites w;
  if (fused) {
    w.compute = u.c();
    w.zero_grad = true;
  }
  if (k == UpdateKind::adamw)
    ops::adamw_update(u.p(), u.m(), u.v(), u.g(), ops::AdamWArgs{2e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.5f}, w);
  else
    ops::sgd_update(u.p(), u.g(), ops::SgdArgs{0.05f, 0.01f, 0.5f}, w);
  if (!fused) {
    ops::copy(u.c(), u.p());
    ops::fill(u.g(), 0.0);
  }
}

// Bitwise equality of two views of any device (copied to the host), reporting the first mismatch.
inline ::testing::AssertionResult same_bits(const TensorView& got, const TensorView& want) {
  Tensor a = ops::to_host(got), b = ops::to_host(want);
  if (a.dtype() != b.dtype() || a.shape() != b.shape())
    return ::testing::AssertionFailure() << got.str() << " vs " << want.str();
  const size_t es = dtype_size(a.dtype());
  for (int64_t i = 0; i < a.numel(); ++i)
    if (std::memcmp(static_cast<const char*>(a.data()) + size_t(i) * es,
                    static_cast<const char*>(b.data()) + size_t(i) * es, es) != 0)
      return ::testing::AssertionFailure() << "first differing element " << i << " of " << a.numel();
  return ::testing::AssertionSuccess();
}

}  // namespace dt::testing
