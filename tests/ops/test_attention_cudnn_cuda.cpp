// attention.backend=cudnn (src/ops/cuda/attention_cudnn.cpp) and cudnn_fwd (cuDNN's forward, the
// native backward on its o and lse) against the CPU reference (itself checked against a double
// softmax and finite differences in test_attention_ops.cpp), bf16, each case under both:
//  * varlen fwd + bwd, rel. L2 < 1e-2 on o, dq, dk, dv and < 1e-3 on lse (inputs rounded to bf16
//    first so both sides see the same values), outputs NaN-poisoned, packed lengths
//    {1, 2, 63, 64, 0 (pure padding), 65, 127, 300} with alignment padding, head dims 64, 128,
//    256, GQA 1/2/4, K/V as row-strided column blocks of one [T, 2 Hkv D] buffer; with and
//    without the max_seqlen host hint (the second reads cu_seqlens_padded back);
//  * CP zig-zag query rows (q_div = 2, both ranks) against the CPU on the same rows;
//  * all-padding packs: every output exactly 0, never NaN;
//  * choose_attention_backend("cudnn" / "cudnn_fwd", cuda) is that backend exactly when the path is
//    available, else an error carrying the reason; "auto" is native (the GPU-free cases are in
//    test_attention_backend.cpp).
// The GPU cases skip (with the reason) when cudnn_attention_unavailable() is non-empty, e.g. a
// runtime cuDNN older than 9.19 or a build without cudnn_frontend.
#include <gtest/gtest.h>

#include <vector>

#include "attention_cuda_harness.h"
#include "deltatron/data/packed_seq.h"
#include "ops/attention_backends.h"

using namespace dt;
using namespace dt::testing;

namespace {
std::string skip_reason() { return ops::cuda::cudnn_attention_unavailable(); }
constexpr DType kBf16 = DType::bf16;
constexpr ops::AttnBackend kBackends[2] = {ops::AttnBackend::cudnn, ops::AttnBackend::cudnn_fwd};
const char* name(ops::AttnBackend b) { return b == ops::AttnBackend::cudnn ? "cudnn" : "cudnn_fwd"; }
}  // namespace

TEST(AttentionCudnnCuda, ChooseCudnnMatchesAvailability) {
  const std::string why = skip_reason();
  const ops::AttnBackendChoice a = ops::choose_attention_backend("auto", kGpu);
  EXPECT_EQ(a.backend, ops::AttnBackend::native);  // auto never picks cuDNN (graph rebuilds, perf.md v0.4.0)
  EXPECT_EQ(a.error, "");
  for (ops::AttnBackend b : kBackends) {
    const ops::AttnBackendChoice c = ops::choose_attention_backend(name(b), kGpu);
    if (why.empty()) {
      EXPECT_EQ(c.backend, b);
      EXPECT_EQ(c.error, "");
    } else {  // refused with the reason, never silently native
      EXPECT_NE(c.error.find(why), std::string::npos) << c.error;
    }
  }
  if (!why.empty()) GTEST_SKIP() << why;
}

TEST(AttentionCudnnCuda, VarlenMatchesCpu) {
  if (std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  // real 1 of 8, 2, 63, 64, 0 of 16 (pure padding), 65 of 72, 127 of 128, 300 of 304
  const Varlen L = packed({1, 2, 63, 64, 0, 65, 127, 300}, {8, 2, 63, 64, 16, 72, 128, 304});
  const int64_t T = L.T();
  struct Case {
    int64_t D, Hq, Hkv;
  };
  for (ops::AttnBackend b : kBackends)
    for (Case c : {Case{64, 4, 2}, Case{128, 4, 1}, Case{256, 4, 4}, Case{256, 8, 2}})
      for (int64_t hint : {L.max_padded(), int64_t(0)}) {
        const std::string what = fmt::format("{} D {} Hq {} Hkv {} max_seqlen {}", name(b), c.D, c.Hq, c.Hkv, hint);
        SCOPED_TRACE(what);
        Tensor q = rounded(rand_host(Shape{T, c.Hq, c.D}, -2.f, 2.f), kBf16);
        Tensor kv = rounded(rand_host(Shape{T, 2 * c.Hkv * c.D}, -2.f, 2.f), kBf16);
        Tensor d_o = rounded(rand_host(Shape{T, c.Hq, c.D}), kBf16);
        AttnOut cpu = run_attention(Device::cpu(), kBf16, L, q, kv, d_o, L.pos, 1, c.Hkv, c.D);
        AttnOut gpu = run_attention(kGpu, kBf16, L, q, kv, d_o, L.pos, 1, c.Hkv, c.D, b, hint);
        expect_close(gpu, cpu, kBf16, what);
      }
}

TEST(AttentionCudnnCuda, ZigzagQueryRowsMatchCpu) {
  if (std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const int cp = 2;
  const Varlen L = packed({5, 0, 130, 64, 300}, {8, 4, 132, 64, 304});
  const int64_t T = L.T(), Hq = 4, Hkv = 2, D = 128;
  std::vector<int64_t> cu64(L.cu_pad.begin(), L.cu_pad.end()), ca64(L.cu_act.begin(), L.cu_act.end());
  Tensor qf = rand_host(Shape{T, Hq, D}, -2.f, 2.f), dof = rand_host(Shape{T, Hq, D});
  Tensor kv = rounded(rand_host(Shape{T, 2 * Hkv * D}, -2.f, 2.f), kBf16);
  for (ops::AttnBackend b : kBackends)
    for (int r = 0; r < cp; ++r) {
      SCOPED_TRACE(fmt::format("{} rank {}", name(b), r));
      data::PackedSeqParams psp = data::PackedSeqParams::build({ca64, cu64, 1, T / cp, 1, cp, r});
      std::span<const int32_t> cu32(psp.cu_seqlens_padded());
      Tensor q = rounded(data::zigzag_slice_rows(qf, cu32, cp, r), kBf16);
      Tensor d_o = rounded(data::zigzag_slice_rows(dof, cu32, cp, r), kBf16);
      Tensor pos_h = ops::to_host(psp.position_ids_local_dev());
      std::vector<int32_t> pos(pos_h.ptr<int32_t>(), pos_h.ptr<int32_t>() + pos_h.numel());
      AttnOut cpu = run_attention(Device::cpu(), kBf16, L, q, kv, d_o, pos, cp, Hkv, D);
      AttnOut gpu = run_attention(kGpu, kBf16, L, q, kv, d_o, pos, cp, Hkv, D, b, psp.max_seqlen());
      expect_close(gpu, cpu, kBf16, "zig-zag");
    }
}

TEST(AttentionCudnnCuda, AllPaddingIsZeroNotNaN) {
  if (std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const Varlen L = packed({0, 0}, {64, 72});
  const int64_t T = L.T();
  Tensor q = rand_host(Shape{T, 2, 64}), kv = rand_host(Shape{T, 2 * 64}), d_o = rand_host(Shape{T, 2, 64});
  for (ops::AttnBackend b : kBackends) {
    AttnOut g = run_attention(kGpu, kBf16, L, q, kv, d_o, L.pos, 1, 1, 64, b, L.max_padded());
    for (const Tensor* t : {&g.o, &g.lse, &g.dq, &g.dk, &g.dv}) {
      Tensor h = host32(*t);
      for (int64_t i = 0; i < h.numel(); ++i) ASSERT_EQ(h.ptr<float>()[i], 0.f) << name(b) << " element " << i;
    }
  }
}
