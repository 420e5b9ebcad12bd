// Shared by the CUDA attention tests (native kernels: test_attention_cuda.cpp; cuDNN:
// test_attention_cudnn_cuda.cpp): packed varlen problems, one fwd + bwd run on a device with a
// chosen backend (K/V as the two column blocks of one [Tk, 2 Hkv D] buffer, as the layer passes
// them; outputs NaN-poisoned), and the comparison with the CPU reference.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "deltatron/ops/attention.h"

namespace dt::testing {

inline Tensor i32(const std::vector<int32_t>& v, Device d = Device::cpu()) {
  Tensor t = Tensor::empty(Shape{int64_t(v.size())}, DType::i32);
  std::copy(v.begin(), v.end(), t.ptr<int32_t>());
  return d.is_cpu() ? std::move(t) : ops::to_device(t, d);
}
// Columns [off, off + H*D) of a [T, C] buffer seen as [T, H, D].
inline TensorView heads(const TensorView& x2d, int64_t off, int64_t H, int64_t D) {
  TensorView v = x2d.slice(1, off, off + H * D);
  v.shape = Shape{x2d.shape[0], H, D};
  v.stride = {x2d.stride[0], D, 1};
  return v;
}

struct Varlen {
  std::vector<int32_t> cu_pad{0}, cu_act{0}, pos;
  int64_t T() const { return cu_pad.back(); }
  int64_t max_padded() const {
    int64_t m = 0;
    for (size_t i = 1; i < cu_pad.size(); ++i) m = std::max<int64_t>(m, cu_pad[i] - cu_pad[i - 1]);
    return m;
  }
};
// Sequence i: real[i] real tokens padded to padded[i]; positions restart at 0.
inline Varlen packed(const std::vector<int>& real, const std::vector<int>& padded) {
  Varlen v;
  for (size_t i = 0; i < real.size(); ++i) {
    v.cu_pad.push_back(v.cu_pad.back() + padded[i]);
    v.cu_act.push_back(v.cu_act.back() + real[i]);
    for (int p = 0; p < padded[i]; ++p) v.pos.push_back(p);
  }
  return v;
}

struct AttnOut {
  Tensor o, lse, dq, dk, dv;
};
// fwd + bwd on `d` (the CPU reference in f32, or the GPU in `dt` through `backend`) with query
// rows q (positions q_pos, q_div) against all of L's keys. Inputs are host f32 (already rounded
// to dt); max_seqlen is the optional host hint.
inline AttnOut run_attention(Device d, DType dt, const Varlen& L, const Tensor& q, const Tensor& kv,
                             const Tensor& d_o, const std::vector<int32_t>& q_pos, int q_div, int64_t Hkv,
                             int64_t D, ops::AttnBackend backend = ops::AttnBackend::native,
                             int64_t max_seqlen = 0) {
  const int64_t Tq = q.shape()[0], Hq = q.shape()[1], Tk = L.T();
  const DType odt = d.is_cpu() ? DType::f32 : dt;
  auto put = [&](const Tensor& h) { return d.is_cpu() ? as(h, DType::f32) : ops::to_device(as(h, dt), d); };
  Tensor gq = put(q), gkv = put(kv), gdo = put(d_o);
  Tensor dkv = Tensor::empty(Shape{Tk, 2 * Hkv * D}, odt, d);
  AttnOut r{Tensor::empty(Shape{Tq, Hq, D}, odt, d), Tensor::empty(Shape{Tq, Hq}, DType::f32, d),
            Tensor::empty(Shape{Tq, Hq, D}, odt, d), Tensor(), Tensor()};
  for (Tensor* t : {&r.o, &r.lse, &r.dq, &dkv}) poison(*t);
  Tensor cp = i32(L.cu_pad, d), ca = i32(L.cu_act, d), pos = i32(q_pos, d);
  ops::AttnVarlen m{cp, ca, pos, q_div, d.is_cpu() ? ops::AttnBackend::native : backend, max_seqlen};
  const float scale = float(1.0 / std::sqrt(double(D)));
  const TensorView k = heads(gkv, 0, Hkv, D), v = heads(gkv, Hkv * D, Hkv, D);
  ops::attention_fwd(r.o, r.lse, gq, k, v, m, scale);
  ops::attention_bwd(r.dq, heads(dkv, 0, Hkv, D), heads(dkv, Hkv * D, Hkv, D), gdo, gq, k, v, r.o, r.lse, m, scale);
  r.dk = as(heads(dkv, 0, Hkv, D), odt);
  r.dv = as(heads(dkv, Hkv * D, Hkv, D), odt);
  return r;
}

// GPU outputs against the CPU's: finite, rel. L2 < tol(dt) (lse: 1e-3 bf16, 1e-5 f32).
inline void expect_close(const AttnOut& g, const AttnOut& c, DType dt, const std::string& what) {
  const std::pair<const Tensor*, const Tensor*> outs[] = {{&g.o, &c.o}, {&g.lse, &c.lse}, {&g.dq, &c.dq},
                                                          {&g.dk, &c.dk}, {&g.dv, &c.dv}};
  const char* names[] = {"o", "lse", "dq", "dk", "dv"};
  for (int i = 0; i < 5; ++i) {
    const double t = i == 1 ? (dt == DType::bf16 ? 1e-3 : 1e-5) : tol(dt);
    EXPECT_TRUE(close_rel(host32(*outs[i].first), *outs[i].second, t)) << what << " " << names[i];
  }
}

}  // namespace dt::testing
