// Core: views, dtype parsing, f32 <-> bf16/f16 rounding, Philox known answers, allocators.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "deltatron/core/allocator.h"
#include "deltatron/core/log.h"
#include "deltatron/core/numeric.h"
#include "deltatron/core/rng.h"
#include "deltatron/core/tensor.h"
#include "deltatron/ops/basic.h"
#include "deltatron/ops/varlen.h"
#include "core/env_knob.h"
#include "test_util.h"

using namespace dt;

TEST(Tensor, ViewsSliceSelectReshapeTranspose) {
  Tensor t = Tensor::empty(Shape{4, 6, 8}, DType::f32);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = float(i);
  TensorView v = t.view();
  EXPECT_TRUE(v.is_contiguous());
  TensorView s = v.slice(1, 2, 5);  // [4, 3, 8]
  EXPECT_EQ(s.shape, (Shape{4, 3, 8}));
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_EQ(s.ptr<float>()[0], 16.f);
  TensorView r = v.select(0, 2);  // [6, 8]
  EXPECT_EQ(r.shape, (Shape{6, 8}));
  EXPECT_EQ(r.ptr<float>()[0], 96.f);
  TensorView tr = v.reshape(Shape{24, 8}).transpose(0, 1);  // [8, 24]
  EXPECT_EQ(tr.stride[0], 1);
  EXPECT_EQ(tr.stride[1], 8);
  // A strided copy materialises the transpose.
  Tensor c = Tensor::empty(Shape{8, 24}, DType::f32);
  ops::copy(c, tr);
  for (int64_t i = 0; i < 8; ++i)
    for (int64_t j = 0; j < 24; ++j) ASSERT_EQ(c.ptr<float>()[i * 24 + j], float(j * 8 + i));
  EXPECT_NE(v.str().find("f32[4, 6, 8] cpu"), std::string::npos);
}

TEST(Tensor, ChecksShowBothSides) {
  Tensor a = Tensor::empty(Shape{2, 3}, DType::f32), b = Tensor::empty(Shape{3, 2}, DType::bf16);
  EXPECT_DEATH(check_same_shape(a, b, "probe"), "probe: shapes differ: f32\\[2, 3\\] cpu vs bf16\\[3, 2\\] cpu");
  EXPECT_DEATH(check_dtype(a, DType::bf16, "probe"), "probe: expected dtype bf16, got f32\\[2, 3\\]");
  EXPECT_DEATH((void)a.view().slice(0, 1, 3), "slice \\[1, 3\\) out of range");
}

TEST(DType, ParseAndNames) {
  DType t;
  EXPECT_TRUE(try_parse_dtype("bfloat16", &t));
  EXPECT_EQ(t, DType::bf16);
  EXPECT_TRUE(try_parse_dtype("fp32", &t));
  EXPECT_EQ(t, DType::f32);
  EXPECT_FALSE(try_parse_dtype("bf17", &t));
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_EXIT(parse_dtype("bf17"), ::testing::ExitedWithCode(1), "unknown dtype 'bf17' \\(valid: f32, bf16");
}

TEST(Numeric, Bf16RoundToNearestEven) {
  // Exhaustive over the bf16 grid neighbourhoods: halfway cases go to the even mantissa.
  EXPECT_EQ(f32_to_bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16_bits(bits_float(0x3f808000u)), 0x3f80);  // halfway, even below
  EXPECT_EQ(f32_to_bf16_bits(bits_float(0x3f818000u)), 0x3f82);  // halfway, even above
  EXPECT_EQ(f32_to_bf16_bits(bits_float(0x3f808001u)), 0x3f81);  // just above halfway
  EXPECT_EQ(f32_to_bf16_bits(bits_float(0x7f7fffffu)), 0x7f80);  // rounds up to inf
  EXPECT_TRUE(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(std::nanf("")))));
  EXPECT_EQ(f32_to_bf16_bits(-0.0f), 0x8000);
  // Against a double-precision oracle on a sweep of values.
  for (uint32_t u = 0x00800000u; u < 0x7f000000u; u += 0x00012345u) {
    float f = bits_float(u);
    float r = bf16_bits_to_f32(f32_to_bf16_bits(f));
    float lo = bits_float(u & 0xffff0000u), hi = bits_float((u & 0xffff0000u) + 0x10000u);
    double dlo = double(f) - lo, dhi = double(hi) - f;
    float want = dlo < dhi ? lo : dhi < dlo ? hi : ((u >> 16) & 1u ? hi : lo);
    ASSERT_EQ(r, want) << std::hex << u;
  }
}

TEST(Numeric, F16RoundTripAndRounding) {
  for (uint32_t h = 0; h < 0x7c00u; ++h) {  // every finite positive half round-trips exactly
    float f = f16_bits_to_f32(uint16_t(h));
    ASSERT_EQ(f32_to_f16_bits(f), h) << h;
    ASSERT_EQ(f32_to_f16_bits(-f), h | 0x8000u) << h;
  }
  EXPECT_EQ(f32_to_f16_bits(65520.f), 0x7c00);  // overflow by rounding
  EXPECT_EQ(f32_to_f16_bits(65519.f), 0x7bff);
  EXPECT_EQ(f32_to_f16_bits(1.0f + 1.0f / 2048), 0x3c00);  // halfway -> even
  EXPECT_EQ(f32_to_f16_bits(1.0f + 3.0f / 2048), 0x3c02);
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1.0f, -25)), 0x0000);        // half of the min subnormal -> 0 (even)
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1.5f, -25)), 0x0001);        // above half -> min subnormal
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(3.0f, -25)), 0x0002);        // 1.5 subnormal units, halfway -> even (2)
}

TEST(Rng, PhiloxKnownAnswers) {
  // Known-answer vectors of Philox4x32-10 (Random123's kat_vectors).
  Philox4 a = philox4x32_10(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(a.v[0], 0x6627e8d5u);
  EXPECT_EQ(a.v[1], 0xe169c58du);
  EXPECT_EQ(a.v[2], 0xbc57ac4cu);
  EXPECT_EQ(a.v[3], 0x9b00dbd8u);
  Philox4 b = philox4x32_10(~0u, ~0u, ~0u, ~0u, ~0u, ~0u);
  EXPECT_EQ(b.v[0], 0x408f276du);
  EXPECT_EQ(b.v[1], 0x41c83b0eu);
  EXPECT_EQ(b.v[2], 0xa20bc7c6u);
  EXPECT_EQ(b.v[3], 0x6d5451fdu);
  Philox4 c = philox4x32_10(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(c.v[0], 0xd16cfe09u);
  EXPECT_EQ(c.v[1], 0x94fdccebu);
  EXPECT_EQ(c.v[2], 0x5001e420u);
  EXPECT_EQ(c.v[3], 0x24126ea1u);
}

TEST(Rng, ShardedInitEqualsWhole) {
  // A parameter's values never depend on how it is sharded: each element draws from its
  // global index.
  uint64_t seed = dt::testing::test_seed();
  Tensor whole = Tensor::empty(Shape{12, 10}, DType::f32);
  ops::rng_normal(whole, seed, 7, 0.f, 0.02f, ops::RngSlice::whole(whole));
  for (int64_t r0 : {0, 4, 8}) {  // row shards (column-parallel)
    Tensor part = Tensor::empty(Shape{4, 10}, DType::f32);
    ops::RngSlice w{whole.shape(), {r0, 0}};
    ops::rng_normal(part, seed, 7, 0.f, 0.02f, w);
    ASSERT_EQ(std::memcmp(part.data(), whole.ptr<float>() + r0 * 10, 40 * sizeof(float)), 0);
  }
  for (int64_t c0 : {0, 5}) {  // column shards (row-parallel)
    Tensor part = Tensor::empty(Shape{12, 5}, DType::f32);
    ops::rng_normal(part, seed, 7, 0.f, 0.02f, ops::RngSlice{whole.shape(), {0, c0}});
    for (int64_t i = 0; i < 12; ++i)
      for (int64_t j = 0; j < 5; ++j) ASSERT_EQ(part.ptr<float>()[i * 5 + j], whole.ptr<float>()[i * 10 + c0 + j]);
  }
  // Moments of a large draw: mean ~ 0, std ~ 1 (loose, 6-sigma bounds).
  Tensor big = Tensor::empty(Shape{1 << 18}, DType::f32);
  ops::rng_normal(big, seed, 8, 0.f, 1.f, ops::RngSlice::whole(big));
  double s = 0, s2 = 0;
  for (int64_t i = 0; i < big.numel(); ++i) {
    s += big.ptr<float>()[i];
    s2 += double(big.ptr<float>()[i]) * big.ptr<float>()[i];
  }
  double n = double(big.numel()), mean = s / n, var = s2 / n - mean * mean;
  EXPECT_LT(std::fabs(mean), 6.0 / std::sqrt(n));
  EXPECT_LT(std::fabs(var - 1.0), 6.0 * std::sqrt(2.0 / n));
  Tensor u = Tensor::empty(Shape{1 << 16}, DType::f32);
  ops::rng_uniform(u, seed, 9, -2.f, 3.f, ops::RngSlice::whole(u));
  for (int64_t i = 0; i < u.numel(); ++i) ASSERT_TRUE(u.ptr<float>()[i] >= -2.f && u.ptr<float>()[i] < 3.f);
}

TEST(Allocator, HostStatsTrackPeak) {
  Allocator& a = host_allocator();
  a.reset_peak();
  AllocatorStats s0 = a.stats();
  {
    Tensor t = Tensor::empty(Shape{1000}, DType::f32);
    AllocatorStats s1 = a.stats();
    EXPECT_EQ(s1.allocated_bytes - s0.allocated_bytes, 4032);  // 4000 rounded to 64
    EXPECT_GE(s1.peak_bytes, s1.allocated_bytes);
  }
  EXPECT_EQ(a.stats().allocated_bytes, s0.allocated_bytes);
}

TEST(Varlen, ChunkTableAndValidation) {
  ops::VarlenBatch b({0, 1, 65, 65, 193});
  const ops::VarlenMeta& m = b.meta();
  EXPECT_EQ(m.num_seqs, 4);
  EXPECT_EQ(m.total, 193);
  EXPECT_EQ(m.num_chunks, 1 + 1 + 0 + 2);
  EXPECT_EQ(m.max_seqlen, 128);
  EXPECT_EQ(m.chunk_offsets_host[4], 4);
  EXPECT_EQ(m.chunk_start_host[3], 129);
  EXPECT_EQ(m.chunk_seq_host[3], 3);
  EXPECT_EQ(m.seq_idx_host[64], 1);
  EXPECT_EQ(m.seq_idx_host[65], 3);
  // Longest first by chunk count (2, 1, 1, 0), ties in index order.
  EXPECT_EQ(std::vector<int32_t>(m.seq_order_host, m.seq_order_host + 4), (std::vector<int32_t>{3, 0, 1, 2}));
  EXPECT_EQ(ops::validate_cu_seqlens({1, 4}), "cu_seqlens[0] = 1, but the boundaries must start at 0");
  EXPECT_EQ(ops::validate_cu_seqlens({0, 4, 3}),
            "cu_seqlens[2] = 3 < cu_seqlens[1] = 4: the boundaries must be non-decreasing");
}

TEST(Logging, RankPrefixAndOnlyRankZeroByDefault) {
  init_logging(3);
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::off) << "rank 3 prints nothing by default";
  init_logging(4, /*all_ranks=*/true);
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::info);
  init_logging(0);
  init_logging(0);  // idempotent
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::info);
  EXPECT_EQ(spdlog::default_logger()->name(), "dt0");
}

// The kernels' environment knobs (src/core/env_knob.h): unset or empty is the default; a listed
// value gives its index; anything else fails naming the variable, the value and every choice.
TEST(EnvKnob, ChoicesAndWholeNumbers) {
  const char* var = "DT_TEST_ENV_KNOB";
  unsetenv(var);
  const auto pick = [&] { return env::choice(var, {{"tile", "CTA-tiled"}, {"warp4", "four warps"}}); };
  EXPECT_EQ(pick(), -1);
  setenv(var, "", 1);
  EXPECT_EQ(pick(), -1);
  setenv(var, "warp4", 1);
  EXPECT_EQ(pick(), 1);
  setenv(var, "tile", 1);
  EXPECT_EQ(pick(), 0);
  setenv(var, "warp", 1);
  EXPECT_DEATH(pick(), "DT_TEST_ENV_KNOB='warp' is not one of: tile .CTA-tiled., warp4 .four warps.; unset it for the "
                       "default");
  const auto num = [&] { return env::whole_number(var, 1, 1 << 20, 7, "blocks"); };
  unsetenv(var);
  EXPECT_EQ(num(), 7);
  setenv(var, "512", 1);
  EXPECT_EQ(num(), 512);
  for (const char* bad : {"0", "2000000", "12x", "x", "99999999999999999999"}) {
    setenv(var, bad, 1);
    EXPECT_DEATH(num(), std::string(var) + "='" + bad + "' is not a whole number in .1, 1048576. .blocks.");
  }
  // Per-shape indices (DT_GEMM_ALGO's form): the matching entry's index, -1 for none.
  const auto idx = [&] { return env::shape_index(var, 32768, 2048, 12352, 7, "candidate"); };
  unsetenv(var);
  EXPECT_EQ(idx(), -1);
  setenv(var, "32768x2048x12352:3", 1);
  EXPECT_EQ(idx(), 3);
  setenv(var, "2048x4096x32768:1,32768x2048x12352:0", 1);
  EXPECT_EQ(idx(), 0);
  setenv(var, "2048x4096x32768:1", 1);
  EXPECT_EQ(idx(), -1);
  for (const char* bad : {"32768x2048x12352:8", "32768x2048x12352", "32768x2048:1", "32768x2048x12352:1,",
                          "0x1x1:1", "32768x2048x12352:1x", "32768x2048x12352:-1"}) {
    setenv(var, bad, 1);
    EXPECT_DEATH(idx(), std::string(var) + "='" + bad + "': entry '.*' is not MxNxK:i with i in .0, 7. .candidate.");
  }
  // Per-shape tuples (DT_GEMM_CONFIG's form): the matching entry's numbers, none for no match.
  const auto tup = [&] { return env::shape_tuple(var, 32768, 2048, 12352, 4, "t.s.c.o", "a configuration"); };
  unsetenv(var);
  EXPECT_TRUE(tup().empty());
  setenv(var, "32768x2048x12352:29.35.3.0", 1);
  EXPECT_EQ(tup(), (std::vector<int64_t>{29, 35, 3, 0}));
  setenv(var, "2048x4096x32768:24.35.3.0,32768x2048x12352:197.1.5.12", 1);
  EXPECT_EQ(tup(), (std::vector<int64_t>{197, 1, 5, 12}));
  setenv(var, "2048x4096x32768:24.35.3.0", 1);
  EXPECT_TRUE(tup().empty());
  for (const char* bad : {"32768x2048x12352:29.35.3", "32768x2048x12352:29.35.3.0.1", "32768x2048x12352:29.35.3.",
                          "32768x2048x12352:", "32768x2048x12352", "32768x2048x12352:29.35.3.0,", "0x1x1:1.1.1.1",
                          "32768x2048x12352:29.-35.3.0", "32768x2048x12352:29.35.3.x", "32768x2048x12352:2147483648.0.0.0",
                          "2048x4096x32768:24.35.3.0,bad"}) {
    setenv(var, bad, 1);
    EXPECT_DEATH(tup(), std::string(var) + "='" + bad + "': entry '.*' is not MxNxK:t.s.c.o .4 whole numbers; a "
                                                          "configuration.");
  }
  unsetenv(var);
}
