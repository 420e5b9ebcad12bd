// CPU basic ops against independent double-precision loops.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "deltatron/core/numeric.h"
#include "deltatron/ops/basic.h"
#include "deltatron/ops/gemm.h"
#include "ops/gemm_tuned.h"
#include "test_util.h"

using namespace dt;
using dt::testing::close_rel;
using dt::testing::rand_host;

namespace {
std::vector<double> gemm_ref(const TensorView& a, const TensorView& b, const TensorView& c0, const ops::GemmOpts& o) {
  int64_t M = c0.shape[0], N = c0.shape[1], K = o.trans_a ? a.shape[0] : a.shape[1];
  auto A = [&](int64_t i, int64_t k) { return double(a.ptr<float>()[o.trans_a ? k * a.stride[0] + i : i * a.stride[0] + k]); };
  auto B = [&](int64_t k, int64_t j) { return double(b.ptr<float>()[o.trans_b ? j * b.stride[0] + k : k * b.stride[0] + j]); };
  std::vector<double> out(size_t(M * N));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += A(i, k) * B(k, j);
      out[size_t(i * N + j)] = o.alpha * acc + o.beta * double(c0.ptr<float>()[i * c0.stride[0] + j]);
    }
  return out;
}
std::vector<double> rows(const TensorView& c) {
  std::vector<double> out;
  for (int64_t i = 0; i < c.shape[0]; ++i)
    for (int64_t j = 0; j < c.shape[1]; ++j) out.push_back(c.ptr<float>()[i * c.stride[0] + j]);
  return out;
}
}  // namespace

TEST(BasicCpu, GemmAllTransposesAndStridedRows) {
  const int64_t M = 37, N = 29, K = 53;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      ops::GemmOpts o{bool(ta), bool(tb), 0.75f, 0.5f};
      // Operands are column slices of wider buffers, so rows are strided.
      Tensor abuf = rand_host(ta ? Shape{K, M + 3} : Shape{M, K + 3});
      Tensor bbuf = rand_host(tb ? Shape{N, K + 5} : Shape{K, N + 5});
      Tensor cbuf = rand_host(Shape{M, N + 2});
      TensorView a = abuf.view().slice(1, 0, ta ? M : K), b = bbuf.view().slice(1, 0, tb ? K : N);
      TensorView c = cbuf.view().slice(1, 1, N + 1);
      std::vector<double> want = gemm_ref(a, b, c, o);
      ops::gemm(c, a, b, o);
      EXPECT_TRUE(close_rel(rows(c), want, 1e-6)) << "trans_a " << ta << " trans_b " << tb;
    }
}

TEST(BasicCpu, ElementwiseReductionsAndCasts) {
  Tensor a = rand_host(Shape{1000}), b = rand_host(Shape{1000});
  Tensor out = Tensor::empty(Shape{1000}, DType::f32);
  ops::add(out, a, b);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(out.ptr<float>()[i], a.ptr<float>()[i] + b.ptr<float>()[i]);
  ops::mul(out, a, b);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(out.ptr<float>()[i], a.ptr<float>()[i] * b.ptr<float>()[i]);
  ops::copy(out, a);
  ops::axpy(out, -2.f, b);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(out.ptr<float>()[i], a.ptr<float>()[i] + -2.f * b.ptr<float>()[i]);
  ops::scale(out, 0.5f);
  Tensor s = Tensor::empty(Shape{1}, DType::f32), s2 = Tensor::empty(Shape{1}, DType::f32);
  ops::sum(s, a);
  ops::sum_squares(s2, a);
  double ref = 0, ref2 = 0;
  for (int i = 0; i < 1000; ++i) {
    ref += a.ptr<float>()[i];
    ref2 += double(a.ptr<float>()[i]) * a.ptr<float>()[i];
  }
  EXPECT_NEAR(*s.ptr<float>(), ref, 1e-5 * (1 + std::fabs(ref)));
  EXPECT_NEAR(*s2.ptr<float>(), ref2, 1e-5 * ref2);
  // f32 -> bf16 -> f32 rounds each element to nearest even (checked against numeric.h).
  Tensor h = Tensor::empty(Shape{1000}, DType::bf16), back = Tensor::empty(Shape{1000}, DType::f32);
  ops::copy(h, a);
  ops::copy(back, h);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(back.ptr<float>()[i], bf16_bits_to_f32(f32_to_bf16_bits(a.ptr<float>()[i])));
  ops::fill(h, 3.0);
  ops::copy(back, h);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(back.ptr<float>()[i], 3.0f);
}

// sum_squares_list: one sum over views of mixed sizes (empty ones, 1, 3, a chunk plus one, a
// 2-D view, a slice starting 4 bytes into its buffer) against a double loop; the same bits twice.
TEST(BasicCpu, SumSquaresList) {
  Tensor a = rand_host(Shape{200003 + 1}), b = rand_host(Shape{65537}), c = rand_host(Shape{3}), d = rand_host(Shape{1});
  Tensor m = rand_host(Shape{7, 9}), e = Tensor::empty(Shape{0}, DType::f32);
  const std::vector<TensorView> xs{e, d, c, b, e, m, a.view().slice(0, 1, 200004)};
  double ref = 0;
  for (const TensorView& x : xs)
    for (int64_t i = 0; i < x.numel(); ++i) ref += double(x.ptr<float>()[i]) * x.ptr<float>()[i];
  Tensor out = Tensor::empty(Shape{1}, DType::f32);
  ops::sum_squares_list(out, xs);
  const float got = *out.ptr<float>();
  EXPECT_LT(std::fabs(got - ref) / ref, 1e-6) << got << " vs " << ref;
  ops::sum_squares_list(out, xs);
  EXPECT_EQ(float_bits(*out.ptr<float>()), float_bits(got)) << "run-to-run bits differ";
  ops::fill(out, 7.0);
  ops::sum_squares_list(out, {});
  EXPECT_EQ(float_bits(*out.ptr<float>()), 0u) << "an empty list sums to +0";
  ops::fill(out, 7.0);
  ops::sum_squares_list(out, std::vector<TensorView>{e, e});
  EXPECT_EQ(float_bits(*out.ptr<float>()), 0u) << "empty views sum to +0";

  Tensor h = Tensor::empty(Shape{4}, DType::bf16), o16 = Tensor::empty(Shape{1}, DType::bf16);
  EXPECT_DEATH(ops::sum_squares_list(out, std::vector<TensorView>{d, c, h}),
               "sum_squares_list: xs\\[2\\] must be f32, got bf16\\[4\\]");
  EXPECT_DEATH(ops::sum_squares_list(out, std::vector<TensorView>{m.view().transpose(0, 1)}),
               "sum_squares_list: xs\\[0\\] must be contiguous, got f32\\[9, 7\\]");
  EXPECT_DEATH(ops::sum_squares_list(o16, xs), "sum_squares_list out: expected dtype f32, got bf16\\[1\\]");
  EXPECT_DEATH(ops::sum_squares_list(b, xs), "sum_squares_list: out must hold 1 element, got f32\\[65537\\]");
}

// The tuned GEMM table (ops/gemm_tuned.h): well-formed, one entry per (device, shape, transposes),
// found only on an exact match, and off with DT_GEMM_TUNED=0.
TEST(BasicCpu, TunedGemmTableMatchesExactly) {
  const auto table = ops::tuned_gemm_table();
  ASSERT_FALSE(table.empty());
  ::unsetenv("DT_GEMM_TUNED");
  for (size_t i = 0; i < table.size(); ++i) {
    const ops::TunedGemm& e = table[i];
    EXPECT_TRUE(e.candidate >= 1 && e.candidate <= 31) << "entry " << i << ": candidate " << e.candidate;
    EXPECT_TRUE(e.trans >= 0 && e.trans <= 3) << "entry " << i;
    EXPECT_TRUE(e.m > 0 && e.n > 0 && e.k > 0 && e.tile > 0 && e.stages > 0 && e.cluster > 0 && e.custom >= -1)
        << "entry " << i;
    EXPECT_EQ(ops::tuned_gemm(e.device, e.m, e.n, e.k, e.trans), &e) << "entry " << i << " (a duplicate before it?)";
  }
  const ops::TunedGemm& e = table[0];
  EXPECT_EQ(ops::tuned_gemm("NVIDIA H100 PCIe", e.m, e.n, e.k, e.trans), nullptr);
  EXPECT_EQ(ops::tuned_gemm(e.device, e.m + 1, e.n, e.k, e.trans), nullptr);
  EXPECT_EQ(ops::tuned_gemm(e.device, e.m, e.n, e.k + 1, e.trans), nullptr);
  EXPECT_EQ(ops::tuned_gemm(e.device, e.m, e.n, e.k, e.trans ^ 1), nullptr);
  ::setenv("DT_GEMM_TUNED", "0", 1);
  EXPECT_EQ(ops::tuned_gemm(e.device, e.m, e.n, e.k, e.trans), nullptr);
  ::setenv("DT_GEMM_TUNED", "1", 1);
  EXPECT_EQ(ops::tuned_gemm(e.device, e.m, e.n, e.k, e.trans), &e);
  ::unsetenv("DT_GEMM_TUNED");
}

TEST(BasicCpuDeathTest, TunedGemmKnobNamesItsChoices) {
  ::setenv("DT_GEMM_TUNED", "yes", 1);
  const ops::TunedGemm& e = ops::tuned_gemm_table()[0];
  EXPECT_DEATH(ops::tuned_gemm(e.device, e.m, e.n, e.k, e.trans), "DT_GEMM_TUNED='yes' is not one of: 0 .*, 1 ");
  ::unsetenv("DT_GEMM_TUNED");
}
