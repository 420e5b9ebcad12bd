// attention.backend=cudnn (src/ops/cuda/attention_cudnn.cpp) against the CPU reference (itself
// checked against a double softmax and finite differences in test_attention_ops.cpp), bf16:
//  * varlen fwd + bwd, rel. L2 < 1e-2 on o, dq, dk, dv and < 1e-3 on lse (inputs rounded to bf16
//    first so both sides see the same values), outputs NaN-poisoned, packed lengths
//    {1, 2, 63, 64, 0 (pure padding), 65, 127, 300} with alignment padding, head dims 64, 128,
//    256, GQA 1/2/4, K/V as row-strided column blocks of one [T, 2 Hkv D] buffer; with and
//    without the max_seqlen host hint (the second reads cu_seqlens_padded back);
//  * CP zig-zag query rows (q_div = 2, both ranks) against the CPU on the same rows;
//  * all-padding packs: every output exactly 0, never NaN;
//  * choose_attention_backend("cudnn", cuda) is cudnn exactly when the path is available, else an
//    error carrying the reason (the GPU-free cases are in test_attention_backend.cpp).
// The GPU cases skip (with the reason) when cudnn_attention_unavailable() is non-empty, e.g. a
// runtime cuDNN older than 9.19 or a build without cudnn_frontend.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "deltatron/data/packed_seq.h"
#include "deltatron/ops/attention.h"
#include "deltatron/ops/basic.h"
#include "ops/attention_backends.h"
#include "test_util.h"

using namespace dt;
using dt::testing::close_rel;
using dt::testing::poison;
using dt::testing::rand_host;

namespace {
const Device kGpu = Device::cuda(0);
Tensor as(const TensorView& x, DType t) {
  Tensor o = Tensor::empty(x.shape, t, x.device);
  ops::copy(o, x);
  return o;
}
Tensor rounded(const TensorView& h) { return as(as(h, DType::bf16), DType::f32); }
Tensor host32(const TensorView& d) { return as(ops::to_host(d), DType::f32); }
Tensor i32(const std::vector<int32_t>& v, Device d = Device::cpu()) {
  Tensor t = Tensor::empty(Shape{int64_t(v.size())}, DType::i32);
  std::copy(v.begin(), v.end(), t.ptr<int32_t>());
  return d.is_cpu() ? std::move(t) : ops::to_device(t, d);
}
TensorView heads(const TensorView& x2d, int64_t off, int64_t H, int64_t D) {
  TensorView v = x2d.slice(1, off, off + H * D);
  v.shape = Shape{x2d.shape[0], H, D};
  v.stride = {x2d.stride[0], D, 1};
  return v;
}
std::string skip_reason() { return ops::cuda::cudnn_attention_unavailable(); }

struct Varlen {
  std::vector<int32_t> cu_pad{0}, cu_act{0}, pos;
  int64_t T() const { return cu_pad.back(); }
  int64_t max_padded() const {
    int64_t m = 0;
    for (size_t i = 1; i < cu_pad.size(); ++i) m = std::max<int64_t>(m, cu_pad[i] - cu_pad[i - 1]);
    return m;
  }
};
Varlen packed(const std::vector<int>& real, const std::vector<int>& padded) {
  Varlen v;
  for (size_t i = 0; i < real.size(); ++i) {
    v.cu_pad.push_back(v.cu_pad.back() + padded[i]);
    v.cu_act.push_back(v.cu_act.back() + real[i]);
    for (int p = 0; p < padded[i]; ++p) v.pos.push_back(p);
  }
  return v;
}

struct Out {
  Tensor o, lse, dq, dk, dv;
};
// fwd + bwd on `d` (CPU reference, or the GPU through cuDNN) with query rows q (positions q_pos,
// q_div) and K/V the two column blocks of one kv buffer [Tk, 2 Hkv D]. Inputs are host f32
// already rounded to bf16.
Out run(Device d, const Varlen& L, const Tensor& q, const Tensor& kv, const Tensor& d_o,
        const std::vector<int32_t>& q_pos, int q_div, int64_t Hkv, int64_t D, int64_t max_seqlen) {
  const int64_t Tq = q.shape()[0], Hq = q.shape()[1], Tk = L.T();
  const DType dt = d.is_cpu() ? DType::f32 : DType::bf16;
  auto put = [&](const Tensor& h) { return d.is_cpu() ? as(h, DType::f32) : ops::to_device(as(h, dt), d); };
  Tensor gq = put(q), gkv = put(kv), gdo = put(d_o);
  Tensor dkv = Tensor::empty(Shape{Tk, 2 * Hkv * D}, dt, d);
  Out r{Tensor::empty(Shape{Tq, Hq, D}, dt, d), Tensor::empty(Shape{Tq, Hq}, DType::f32, d),
        Tensor::empty(Shape{Tq, Hq, D}, dt, d), Tensor(), Tensor()};
  for (Tensor* t : {&r.o, &r.lse, &r.dq, &dkv}) poison(*t);
  Tensor cp = i32(L.cu_pad, d), ca = i32(L.cu_act, d), pos = i32(q_pos, d);
  ops::AttnVarlen m{cp, ca, pos, q_div, d.is_cpu() ? ops::AttnBackend::native : ops::AttnBackend::cudnn,
                    max_seqlen};
  const float scale = float(1.0 / std::sqrt(double(D)));
  const TensorView k = heads(gkv, 0, Hkv, D), v = heads(gkv, Hkv * D, Hkv, D);
  ops::attention_fwd(r.o, r.lse, gq, k, v, m, scale);
  ops::attention_bwd(r.dq, heads(dkv, 0, Hkv, D), heads(dkv, Hkv * D, Hkv, D), gdo, gq, k, v, r.o, r.lse, m, scale);
  r.dk = as(heads(dkv, 0, Hkv, D), dt);
  r.dv = as(heads(dkv, Hkv * D, Hkv, D), dt);
  return r;
}

bool finite(const Tensor& h) {
  for (int64_t i = 0; i < h.numel(); ++i)
    if (!std::isfinite(h.ptr<float>()[i])) return false;
  return true;
}
void expect_close(const Out& g, const Out& c, const std::string& what) {
  const std::pair<const Tensor*, const Tensor*> outs[] = {{&g.o, &c.o}, {&g.lse, &c.lse}, {&g.dq, &c.dq},
                                                          {&g.dk, &c.dk}, {&g.dv, &c.dv}};
  const char* names[] = {"o", "lse", "dq", "dk", "dv"};
  for (int i = 0; i < 5; ++i) {
    Tensor h = host32(*outs[i].first);
    ASSERT_TRUE(finite(h)) << what << " " << names[i] << " has NaN/Inf";
    EXPECT_TRUE(close_rel(h, *outs[i].second, i == 1 ? 1e-3 : 1e-2)) << what << " " << names[i];
  }
}
}  // namespace

TEST(AttentionCudnnCuda, ChooseCudnnMatchesAvailability) {
  const std::string why = skip_reason();
  const ops::AttnBackendChoice c = ops::choose_attention_backend("cudnn", kGpu);
  if (why.empty()) {
    EXPECT_EQ(c.backend, ops::AttnBackend::cudnn);
    EXPECT_EQ(c.error, "");
  } else {  // refused with the reason, never silently native
    EXPECT_NE(c.error.find(why), std::string::npos) << c.error;
    GTEST_SKIP() << why;
  }
}

TEST(AttentionCudnnCuda, VarlenMatchesCpu) {
  if (std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  // real 1 of 8, 2, 63, 64, 0 of 16 (pure padding), 65 of 72, 127 of 128, 300 of 304
  const Varlen L = packed({1, 2, 63, 64, 0, 65, 127, 300}, {8, 2, 63, 64, 16, 72, 128, 304});
  const int64_t T = L.T();
  struct Case {
    int64_t D, Hq, Hkv;
  };
  for (Case c : {Case{64, 4, 2}, Case{128, 4, 1}, Case{256, 4, 4}, Case{256, 8, 2}})
    for (int64_t hint : {L.max_padded(), int64_t(0)}) {
      const std::string what = fmt::format("D {} Hq {} Hkv {} max_seqlen {}", c.D, c.Hq, c.Hkv, hint);
      SCOPED_TRACE(what);
      Tensor q = rounded(rand_host(Shape{T, c.Hq, c.D}, -2.f, 2.f));
      Tensor kv = rounded(rand_host(Shape{T, 2 * c.Hkv * c.D}, -2.f, 2.f));
      Tensor d_o = rounded(rand_host(Shape{T, c.Hq, c.D}));
      Out cpu = run(Device::cpu(), L, q, kv, d_o, L.pos, 1, c.Hkv, c.D, 0);
      Out gpu = run(kGpu, L, q, kv, d_o, L.pos, 1, c.Hkv, c.D, hint);
      expect_close(gpu, cpu, what);
    }
}

TEST(AttentionCudnnCuda, ZigzagQueryRowsMatchCpu) {
  if (std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const int cp = 2;
  const Varlen L = packed({5, 0, 130, 64, 300}, {8, 4, 132, 64, 304});
  const int64_t T = L.T(), Hq = 4, Hkv = 2, D = 128;
  std::vector<int64_t> cu64(L.cu_pad.begin(), L.cu_pad.end()), ca64(L.cu_act.begin(), L.cu_act.end());
  Tensor qf = rand_host(Shape{T, Hq, D}, -2.f, 2.f), dof = rand_host(Shape{T, Hq, D});
  Tensor kv = rounded(rand_host(Shape{T, 2 * Hkv * D}, -2.f, 2.f));
  for (int r = 0; r < cp; ++r) {
    SCOPED_TRACE(fmt::format("rank {}", r));
    data::PackedSeqParams psp = data::PackedSeqParams::build({ca64, cu64, 1, T / cp, 1, cp, r});
    std::span<const int32_t> cu32(psp.cu_seqlens_padded());
    Tensor q = rounded(data::zigzag_slice_rows(qf, cu32, cp, r));
    Tensor d_o = rounded(data::zigzag_slice_rows(dof, cu32, cp, r));
    Tensor pos_h = ops::to_host(psp.position_ids_local_dev());
    std::vector<int32_t> pos(pos_h.ptr<int32_t>(), pos_h.ptr<int32_t>() + pos_h.numel());
    Out cpu = run(Device::cpu(), L, q, kv, d_o, pos, cp, Hkv, D, 0);
    Out gpu = run(kGpu, L, q, kv, d_o, pos, cp, Hkv, D, psp.max_seqlen());
    expect_close(gpu, cpu, "zig-zag");
  }
}

TEST(AttentionCudnnCuda, AllPaddingIsZeroNotNaN) {
  if (std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const Varlen L = packed({0, 0}, {64, 72});
  const int64_t T = L.T();
  Tensor q = rand_host(Shape{T, 2, 64}), kv = rand_host(Shape{T, 2 * 64}), d_o = rand_host(Shape{T, 2, 64});
  Out g = run(kGpu, L, q, kv, d_o, L.pos, 1, 1, 64, L.max_padded());
  for (const Tensor* t : {&g.o, &g.lse, &g.dq, &g.dk, &g.dv}) {
    Tensor h = host32(*t);
    for (int64_t i = 0; i < h.numel(); ++i) ASSERT_EQ(h.ptr<float>()[i], 0.f) << "element " << i;
  }
}
