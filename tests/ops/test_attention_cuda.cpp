// CUDA attention-layer ops against the CPU reference (itself checked against a double softmax
// and finite differences in test_attention_ops.cpp), on fresh random data every run:
//  * varlen attention fwd + bwd, f32 (rel. L2 < 1e-4) and bf16 (< 1e-2; inputs rounded to bf16
//    first so both sides see the same values), outputs NaN-poisoned, for head dims 16 (padded
//    tiles), 64, 128, 256, GQA G = 1 (dk/dv written by the dkv kernel) and 2/4 (per-query-head
//    partials summed by the group-sum kernel) on every padded head dim, packed lengths {1, 2,
//    63, 64, 65, 127, 300} with alignment padding and a pure-padding sequence (outputs 0, never
//    NaN; T = 657, not a multiple of the 64/128-row tiles or the 32/64-key blocks), K/V as
//    row-strided column blocks of one [T, 2 Hkv D] buffer as the layer passes them;
//  * one 2100-token document (33 query tiles: the dk/dv kernel's tile search and its two-stage
//    Q/dO pipeline over many tiles);
//  * CP zig-zag query rows (q_div = 2) against the CPU on the same rows;
//  * two runs give the same bits (no atomics), in every case of the first test;
//  * rope (in place on a strided view; out of place, with the pass-through copy), sigmoid gate
//    (16-byte path and element fallback), gather_rows, f32 and bf16.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "attention_cuda_harness.h"
#include "deltatron/data/packed_seq.h"

using namespace dt;
using namespace dt::testing;

namespace {
bool bitwise_equal(const TensorView& a, const TensorView& b) {
  Tensor x = ops::to_host(a), y = ops::to_host(b);
  return std::memcmp(x.data(), y.data(), size_t(x.numel()) * dtype_size(x.dtype())) == 0;
}
}  // namespace

TEST(AttentionCuda, VarlenMatchesCpu) {
  // real 1 of 8, 2, 63, 64, 0 of 16 (pure padding), 65 of 72, 127 of 128, 300 of 304
  const Varlen L = packed({1, 2, 63, 64, 0, 65, 127, 300}, {8, 2, 63, 64, 16, 72, 128, 304});
  const int64_t T = L.T();
  struct Case {
    int64_t D, Hq, Hkv;
  };
  // G = Hq / Hkv: 1 and > 1 for each padded head dim (DP 64, 128, 256); {256, 8, 2} is bench-0.8b's.
  for (Case c : {Case{16, 4, 4}, Case{64, 4, 2}, Case{128, 4, 1}, Case{128, 2, 2}, Case{256, 4, 2}, Case{256, 4, 4},
                 Case{256, 8, 2}})
    for (DType dt : {DType::f32, DType::bf16}) {
      const std::string what = fmt::format("D {} Hq {} Hkv {} {}", c.D, c.Hq, c.Hkv, dtype_name(dt));
      SCOPED_TRACE(what);
      Tensor q = rounded(rand_host(Shape{T, c.Hq, c.D}, -2.f, 2.f), dt);
      Tensor kv = rounded(rand_host(Shape{T, 2 * c.Hkv * c.D}, -2.f, 2.f), dt);
      Tensor d_o = rounded(rand_host(Shape{T, c.Hq, c.D}), dt);
      AttnOut cpu = run_attention(Device::cpu(), dt, L, q, kv, d_o, L.pos, 1, c.Hkv, c.D);
      AttnOut gpu = run_attention(kGpu, dt, L, q, kv, d_o, L.pos, 1, c.Hkv, c.D);
      expect_close(gpu, cpu, dt, what);
      // Determinism: the same inputs give the same bits twice (fwd and every bwd output).
      AttnOut again = run_attention(kGpu, dt, L, q, kv, d_o, L.pos, 1, c.Hkv, c.D);
      for (auto [a, b, n] : {std::tuple{&gpu.o, &again.o, "o"}, {&gpu.lse, &again.lse, "lse"},
                             {&gpu.dq, &again.dq, "dq"}, {&gpu.dk, &again.dk, "dk"}, {&gpu.dv, &again.dv, "dv"}})
        EXPECT_TRUE(bitwise_equal(*a, *b)) << n << " differs between two runs";
    }
}

// One long document (2100 tokens, 33 query tiles of 64) and a short one: the last key blocks of
// the long one are seen by none of its first 32 query tiles, so the dk/dv kernel's search for
// the next visible tile crosses its 32-tile window; bf16 D 256 runs the two-stage Q/dO pipeline
// over 33+ tiles of one block. Head dims 16 (f32, bf16) and 256 (bf16), G = 2.
TEST(AttentionCuda, LongSequenceMatchesCpu) {
  const Varlen L = packed({2100, 37}, {2104, 40});
  const int64_t T = L.T(), Hq = 2, Hkv = 1;
  for (auto [D, dt] : {std::pair{int64_t(16), DType::f32}, {int64_t(16), DType::bf16}, {int64_t(256), DType::bf16}}) {
    const std::string what = fmt::format("long D {} {}", D, dtype_name(dt));
    SCOPED_TRACE(what);
    Tensor q = rounded(rand_host(Shape{T, Hq, D}, -2.f, 2.f), dt);
    Tensor kv = rounded(rand_host(Shape{T, 2 * Hkv * D}, -2.f, 2.f), dt);
    Tensor d_o = rounded(rand_host(Shape{T, Hq, D}), dt);
    AttnOut cpu = run_attention(Device::cpu(), dt, L, q, kv, d_o, L.pos, 1, Hkv, D);
    AttnOut gpu = run_attention(kGpu, dt, L, q, kv, d_o, L.pos, 1, Hkv, D);
    expect_close(gpu, cpu, dt, what);
  }
}

TEST(AttentionCuda, ZigzagQueryRowsMatchCpu) {
  const int cp = 2;
  const Varlen L = packed({5, 0, 130, 64}, {8, 4, 132, 64});
  const int64_t T = L.T(), Hq = 4, Hkv = 2, D = 64;
  std::vector<int64_t> cu64(L.cu_pad.begin(), L.cu_pad.end()), ca64(L.cu_act.begin(), L.cu_act.end());
  Tensor qf = rand_host(Shape{T, Hq, D}, -2.f, 2.f), dof = rand_host(Shape{T, Hq, D});
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor kv = rounded(rand_host(Shape{T, 2 * Hkv * D}, -2.f, 2.f), dt);
    for (int r = 0; r < cp; ++r) {
      SCOPED_TRACE(fmt::format("{} rank {}", dtype_name(dt), r));
      data::PackedSeqParams psp = data::PackedSeqParams::build({ca64, cu64, 1, T / cp, 1, cp, r});
      std::span<const int32_t> cu32(psp.cu_seqlens_padded());
      Tensor q = rounded(data::zigzag_slice_rows(qf, cu32, cp, r), dt);
      Tensor d_o = rounded(data::zigzag_slice_rows(dof, cu32, cp, r), dt);
      Tensor pos_h = ops::to_host(psp.position_ids_local_dev());
      std::vector<int32_t> pos(pos_h.ptr<int32_t>(), pos_h.ptr<int32_t>() + pos_h.numel());
      AttnOut cpu = run_attention(Device::cpu(), dt, L, q, kv, d_o, pos, cp, Hkv, D);
      AttnOut gpu = run_attention(kGpu, dt, L, q, kv, d_o, pos, cp, Hkv, D);
      expect_close(gpu, cpu, dt, "zig-zag");
    }
  }
}

TEST(AttentionCuda, AllPaddingIsZeroNotNaN) {
  const Varlen L = packed({0, 0}, {64, 72});
  const int64_t T = L.T();
  Tensor q = rand_host(Shape{T, 2, 64}), kv = rand_host(Shape{T, 2 * 64}), d_o = rand_host(Shape{T, 2, 64});
  AttnOut g = run_attention(kGpu, DType::bf16, L, q, kv, d_o, L.pos, 1, 1, 64);
  for (const Tensor* t : {&g.o, &g.lse, &g.dq, &g.dk, &g.dv}) {
    Tensor h = host32(*t);
    for (int64_t i = 0; i < h.numel(); ++i) ASSERT_EQ(h.ptr<float>()[i], 0.f) << "element " << i;
  }
}

TEST(AttentionCuda, RopeGateGather) {
  const int64_t T = 333, H = 3, D = 64, rd = 16;
  std::vector<int32_t> posv(T);
  for (int64_t t = 0; t < T; ++t) posv[size_t(t)] = int32_t((t * 977 + 3) % 40000);  // large angles
  Tensor pos = i32(posv), gpos = i32(posv, kGpu);
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    // rope fwd/bwd in place on a row-strided column block.
    Tensor buf = rounded(rand_host(Shape{T, 2 * H * D}), dt);
    Tensor cbuf = as(buf, DType::f32), gbuf = dev(buf, dt);
    const TensorView cx = heads(cbuf, H * D, H, D), gx = heads(gbuf, H * D, H, D);
    ops::rope_fwd(cx, cx, pos, rd, 1e7);
    ops::rope_fwd(gx, gx, gpos, rd, 1e7);
    EXPECT_TRUE(close_rel(host32(gbuf), cbuf, dt == DType::bf16 ? 5e-3 : 1e-6)) << "rope_fwd";
    ops::rope_bwd(cx, cx, pos, rd, 1e7);
    ops::rope_bwd(gx, gx, gpos, rd, 1e7);
    EXPECT_TRUE(close_rel(host32(gbuf), cbuf, dt == DType::bf16 ? 5e-3 : 1e-6)) << "rope_bwd";
    // sigmoid gate on the halves of one [R, 2D] buffer.
    const int64_t R = T * H;
    Tensor og = rounded(rand_host(Shape{R, 2 * D}, -4.f, 4.f), dt), dy = rounded(rand_host(Shape{R, D}), dt);
    Tensor y = Tensor::empty(Shape{R, D}, DType::f32), d_o = Tensor::empty(Shape{R, D}, DType::f32),
           dg = Tensor::empty(Shape{R, D}, DType::f32);
    ops::sigmoid_gate_fwd(y, og.view().slice(1, 0, D), og.view().slice(1, D, 2 * D));
    ops::sigmoid_gate_bwd(d_o, dg, dy, og.view().slice(1, 0, D), og.view().slice(1, D, 2 * D));
    Tensor gog = dev(og, dt), gdy = dev(dy, dt);
    Tensor gy = Tensor::empty(Shape{R, D}, dt, kGpu), gdo = Tensor::empty(Shape{R, D}, dt, kGpu),
           gdg = Tensor::empty(Shape{R, D}, dt, kGpu);
    for (Tensor* t : {&gy, &gdo, &gdg}) poison(*t);
    ops::sigmoid_gate_fwd(gy, gog.view().slice(1, 0, D), gog.view().slice(1, D, 2 * D));
    ops::sigmoid_gate_bwd(gdo, gdg, gdy, gog.view().slice(1, 0, D), gog.view().slice(1, D, 2 * D));
    EXPECT_TRUE(close_rel(host32(gy), y, tol(dt))) << "gate y";
    EXPECT_TRUE(close_rel(host32(gdo), d_o, tol(dt))) << "gate do";
    EXPECT_TRUE(close_rel(host32(gdg), dg, tol(dt))) << "gate dg";
    // gather_rows: a permutation, bitwise.
    std::vector<int32_t> idx(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) idx[size_t(t)] = int32_t((t * 101) % T);
    Tensor src = dev(rand_host(Shape{T, 2 * H * D}), dt), out = Tensor::empty(Shape{T, H * D}, dt, kGpu);
    poison(out);
    ops::gather_rows(out, src.view().slice(1, 0, H * D), i32(idx, kGpu));
    Tensor hs = ops::to_host(src), ho = ops::to_host(out);
    const size_t es = dtype_size(dt);
    bool same = true;
    for (int64_t t = 0; t < T; ++t)
      same &= std::memcmp(static_cast<char*>(ho.data()) + size_t(t * H * D) * es,
                          static_cast<char*>(hs.data()) + size_t(idx[size_t(t)] * 2 * H * D) * es, size_t(H * D) * es) == 0;
    EXPECT_TRUE(same) << "gather_rows";
  }
}

// RoPE out of place (the pass-through dims copied in 16-byte words or, for 24-byte offsets, in
// elements), more heads than one thread rotates at once (10 > 8), rd = D and rd = 0; the sigmoid
// gate's element fallback (D = 37: not a whole number of 16-byte vectors; a view one column off).
TEST(AttentionCuda, RopeOutOfPlaceAndGateFallbacks) {
  struct Case {
    int64_t H, D, rd;
  };
  const int64_t T = 97;
  std::vector<int32_t> posv(T);
  for (int64_t t = 0; t < T; ++t) posv[size_t(t)] = int32_t((t * 7919 + 11) % 100000);
  Tensor pos = i32(posv), gpos = i32(posv, kGpu);
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const Case c : {Case{10, 64, 16}, Case{3, 36, 12}, Case{2, 32, 32}, Case{2, 24, 0}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " H " + std::to_string(c.H) + " D " + std::to_string(c.D) +
                   " rd " + std::to_string(c.rd));
      const int64_t H = c.H, D = c.D;
      Tensor buf = rounded(rand_host(Shape{T, 2 * H * D}), dt);
      Tensor gbuf = dev(buf, dt);
      const TensorView cx = heads(buf, H * D, H, D), gx = heads(gbuf, H * D, H, D);
      Tensor cy = Tensor::empty(Shape{T, H, D}, DType::f32), gy = Tensor::empty(Shape{T, H, D}, dt, kGpu);
      poison(gy);
      ops::rope_fwd(cy, cx, pos, c.rd, 1e6);
      ops::rope_fwd(gy, gx, gpos, c.rd, 1e6);
      EXPECT_TRUE(close_rel(host32(gy), cy, dt == DType::bf16 ? 5e-3 : 1e-6)) << "rope_fwd";
      Tensor cdx = Tensor::empty(Shape{T, H, D}, DType::f32), gdx = Tensor::empty(Shape{T, H, D}, dt, kGpu);
      poison(gdx);
      ops::rope_bwd(cdx, cx, pos, c.rd, 1e6);
      ops::rope_bwd(gdx, gx, gpos, c.rd, 1e6);
      EXPECT_TRUE(close_rel(host32(gdx), cdx, dt == DType::bf16 ? 5e-3 : 1e-6)) << "rope_bwd";
    }
    for (const int64_t off : {int64_t(0), int64_t(1)}) {
      const int64_t R = 301, D = off ? 64 : 37;
      SCOPED_TRACE(std::string(dtype_name(dt)) + " gate D " + std::to_string(D) + " off " + std::to_string(off));
      Tensor og = rounded(rand_host(Shape{R, 2 * D + 1}, -4.f, 4.f), dt), dy = rounded(rand_host(Shape{R, D}), dt);
      auto o_of = [&](const TensorView& v) { return v.slice(1, off, off + D); };
      auto g_of = [&](const TensorView& v) { return v.slice(1, off + D, off + 2 * D); };
      Tensor y = Tensor::empty(Shape{R, D}, DType::f32), d_o = Tensor::empty(Shape{R, D}, DType::f32),
             dg = Tensor::empty(Shape{R, D}, DType::f32);
      ops::sigmoid_gate_fwd(y, o_of(og), g_of(og));
      ops::sigmoid_gate_bwd(d_o, dg, dy, o_of(og), g_of(og));
      Tensor gog = dev(og, dt), gdy = dev(dy, dt);
      Tensor gy = Tensor::empty(Shape{R, D}, dt, kGpu), gdo = Tensor::empty(Shape{R, D}, dt, kGpu),
             gdg = Tensor::empty(Shape{R, D}, dt, kGpu);
      for (Tensor* t : {&gy, &gdo, &gdg}) poison(*t);
      ops::sigmoid_gate_fwd(gy, o_of(gog), g_of(gog));
      ops::sigmoid_gate_bwd(gdo, gdg, gdy, o_of(gog), g_of(gog));
      EXPECT_TRUE(close_rel(host32(gy), y, tol(dt))) << "gate y";
      EXPECT_TRUE(close_rel(host32(gdo), d_o, tol(dt))) << "gate do";
      EXPECT_TRUE(close_rel(host32(gdg), dg, tol(dt))) << "gate dg";
    }
  }
}
