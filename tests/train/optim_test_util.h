// Helpers for the optimizer tests: a small model's ParamSpec table (one GDN block, one gated
// attention block, norms with and without SP), and double-precision reference updates.
#pragma once
#include <cmath>
#include <string>
#include <vector>

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

}  // namespace dt::testing
