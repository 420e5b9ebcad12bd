// CUDA basic ops against the CPU backend on fresh random data; RNG bit equality; the
// caching allocator performs no cudaMalloc in a repeated step and splits/merges its segments;
// cuBLASLt GEMM in bf16/fp32, a pinned heuristic candidate, and the tuned table's candidates
// (where the GPU has entries) against the heuristic's first.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "deltatron/core/allocator.h"
#include "deltatron/core/numeric.h"
#include "deltatron/ops/basic.h"
#include "deltatron/ops/gemm.h"
#include "ops/gemm_tuned.h"
#include "test_util.h"

using namespace dt;
using dt::testing::close_rel;
using dt::testing::rand_host;

namespace {
const Device kGpu = Device::cuda(0);
Tensor dev(const TensorView& h) { return ops::to_device(h, kGpu); }
Tensor host(const TensorView& d) { return ops::to_host(d); }
Tensor as(const TensorView& x, DType t) {
  Tensor o = Tensor::empty(x.shape, t, x.device);
  ops::copy(o, x);
  return o;
}
}  // namespace

TEST(BasicCuda, FillCopyCastAreBitExact) {
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    Tensor a = rand_host(Shape{3, 517}, -50.f, 50.f);
    Tensor ref = as(a, t);                 // CPU cast
    Tensor got = host(as(dev(a), t));      // CUDA cast
    ASSERT_EQ(std::memcmp(ref.data(), got.data(), ref.nbytes()), 0) << dtype_name(t);
    Tensor back_ref = as(ref, DType::f32), back_got = host(as(dev(ref), DType::f32));
    ASSERT_EQ(std::memcmp(back_ref.data(), back_got.data(), back_ref.nbytes()), 0) << dtype_name(t);
  }
  // Contiguous casts starting off a 16-byte boundary (the vectorised f32 -> bf16 path's fallback)
  // and every n % 4 tail.
  Tensor flat = rand_host(Shape{4099}, -50.f, 50.f), dflat = dev(flat);
  for (int64_t off = 0; off < 4; ++off) {
    TensorView src = flat.view().slice(0, off, 4099), dsrc = dflat.view().slice(0, off, 4099);
    Tensor ref = Tensor::empty(src.shape, DType::bf16), got = Tensor::empty(src.shape, DType::bf16, kGpu);
    ops::copy(ref, src);
    dt::testing::poison(got);
    ops::copy(got, dsrc);
    Tensor h = host(got);
    ASSERT_EQ(std::memcmp(ref.data(), h.data(), ref.nbytes()), 0) << "offset " << off;
  }
  // Strided copy: the transpose of a [64, 96] matrix.
  Tensor a = rand_host(Shape{64, 96});
  Tensor want = Tensor::empty(Shape{96, 64}, DType::f32);
  ops::copy(want, a.view().transpose(0, 1));
  Tensor d = dev(a), dt_ = Tensor::empty(Shape{96, 64}, DType::f32, kGpu);
  dt::testing::poison(dt_);
  ops::copy(dt_, d.view().transpose(0, 1));
  Tensor got = host(dt_);
  ASSERT_EQ(std::memcmp(want.data(), got.data(), want.nbytes()), 0);
  // Row-strided copies (column slices, [T, H, d] head slices) take the 2-D pitched path.
  Tensor wide = rand_host(Shape{33, 40}, -1.f, 1.f, DType::bf16);
  Tensor want2 = Tensor::empty(Shape{33, 3, 4}, DType::bf16);
  ops::copy(want2.view().reshape(Shape{33, 12}), wide.view().slice(1, 5, 17));
  Tensor dwide = dev(wide), got2 = Tensor::empty(Shape{33, 3, 4}, DType::bf16, kGpu);
  dt::testing::poison(got2);
  TensorView src3 = dwide.view().slice(1, 5, 17);  // [33, 12] pitch 40, viewed as [33, 3, 4]
  src3.shape = Shape{33, 3, 4};
  src3.stride = {40, 4, 1};
  ops::copy(got2, src3);
  Tensor h2 = host(got2);
  ASSERT_EQ(std::memcmp(h2.data(), want2.data(), want2.nbytes()), 0) << "pitched 2-D copy";
  for (DType t : {DType::f32, DType::bf16, DType::i32, DType::i64, DType::u8}) {
    Tensor x = Tensor::empty(Shape{1001}, t, kGpu), xr = Tensor::empty(Shape{1001}, t);
    ops::fill(x, 7.0);
    ops::fill(xr, 7.0);
    Tensor xh = host(x);
    ASSERT_EQ(std::memcmp(xh.data(), xr.data(), xr.nbytes()), 0) << dtype_name(t);
  }
}

TEST(BasicCuda, ElementwiseMatchCpu) {
  for (DType t : {DType::f32, DType::bf16}) {
    Tensor a = as(rand_host(Shape{100003}), t), b = as(rand_host(Shape{100003}), t);
    Tensor da = dev(a), db = dev(b);
    Tensor out = Tensor::empty(a.shape(), t), dout = Tensor::empty(a.shape(), t, kGpu);
    ops::add(out, a, b);
    ops::add(dout, da, db);
    EXPECT_TRUE(close_rel(dout, out, 1e-7)) << "add " << dtype_name(t);
    ops::mul(out, a, b);
    ops::mul(dout, da, db);
    EXPECT_TRUE(close_rel(dout, out, 1e-7)) << "mul " << dtype_name(t);
    ops::axpy(out, 0.3f, a);
    ops::axpy(dout, 0.3f, da);
    EXPECT_TRUE(close_rel(dout, out, 1e-6)) << "axpy " << dtype_name(t);
    ops::scale(out, -1.7f);
    ops::scale(dout, -1.7f);
    EXPECT_TRUE(close_rel(dout, out, 1e-6)) << "scale " << dtype_name(t);
  }
}

// add/mul/axpy/scale take a 16-byte path when all views share an f32 | bf16 dtype and are
// 16-byte aligned (n % 8 | 4 tail included), the generic path otherwise. The same values placed
// one element off 16 bytes go through the generic kernel: the bits must agree with the fast
// path's, and both with the CPU.
TEST(BasicCuda, ElementwiseFastPathMatchesGenericBits) {
  for (DType t : {DType::f32, DType::bf16}) {
    for (const int64_t n : {int64_t(5), int64_t(8), int64_t(4096 + 7)}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " n " + std::to_string(n));
      Tensor a = as(rand_host(Shape{n}), t), b = as(rand_host(Shape{n}), t), o0 = as(rand_host(Shape{n}), t);
      Tensor a2 = Tensor::empty(Shape{n + 1}, t), b2 = Tensor::empty(Shape{n + 1}, t), o2 = Tensor::empty(Shape{n + 1}, t);
      ops::copy(a2.view().slice(0, 1, n + 1), a);
      ops::copy(b2.view().slice(0, 1, n + 1), b);
      ops::copy(o2.view().slice(0, 1, n + 1), o0);
      Tensor ga = dev(a), gb = dev(b), go = dev(o0);  // aligned: fast path
      Tensor ga2 = dev(a2), gb2 = dev(b2), go2 = dev(o2);
      const TensorView ua = ga2.view().slice(0, 1, n + 1), ub = gb2.view().slice(0, 1, n + 1),
                       uo = go2.view().slice(0, 1, n + 1);  // 2 or 4 bytes off 16: generic path
      Tensor co = as(o0, t);
      auto same_bits = [&](const char* what) {
        Tensor f = host(go), g = host(go2);
        EXPECT_EQ(std::memcmp(f.data(), static_cast<char*>(g.data()) + dtype_size(t), size_t(n) * dtype_size(t)), 0)
            << what << ": fast and generic paths differ";
        EXPECT_TRUE(close_rel(go, co, 1e-6)) << what << " vs CPU";
      };
      ops::add(go, ga, gb), ops::add(uo, ua, ub), ops::add(co, a, b);
      same_bits("add");
      ops::mul(go, ga, gb), ops::mul(uo, ua, ub), ops::mul(co, a, b);
      same_bits("mul");
      ops::axpy(go, -0.7f, ga), ops::axpy(uo, -0.7f, ua), ops::axpy(co, -0.7f, a);
      same_bits("axpy");
      ops::scale(go, 1.3f), ops::scale(uo, 1.3f), ops::scale(co, 1.3f);
      same_bits("scale");
      ops::add(go, go, gb), ops::add(uo, uo, ub), ops::add(co, co, b);  // in place (out aliases a)
      same_bits("add in place");
    }
  }
}

TEST(BasicCuda, ReductionsMatchCpuAndAreDeterministic) {
  for (int64_t n : {1, 1000, 1 << 22}) {
    Tensor a = rand_host(Shape{n}, -1.f, 2.f);
    Tensor da = dev(a);
    Tensor s = Tensor::empty(Shape{1}, DType::f32), ds = Tensor::empty(Shape{1}, DType::f32, kGpu);
    for (bool sq : {false, true}) {
      sq ? ops::sum_squares(s, a) : ops::sum(s, a);
      sq ? ops::sum_squares(ds, da) : ops::sum(ds, da);
      float g1 = ops::item(ds);
      sq ? ops::sum_squares(ds, da) : ops::sum(ds, da);
      float g2 = ops::item(ds);
      EXPECT_EQ(float_bits(g1), float_bits(g2)) << "run-to-run bits differ, n " << n;
      EXPECT_NEAR(g1, *s.ptr<float>(), 2e-6 * std::fabs(*s.ptr<float>()) + 1e-6) << "n " << n << " squares " << sq;
    }
  }
}

// sum_squares_list against the CPU over views of mixed sizes (empty, 1, 3, one 64K chunk, a chunk
// plus one, chunks plus a tail, then 300 small views: more segments than threads in a block).
// The same bits run to run and with every view one element off 16 bytes (the scalar path adds in
// the vector path's order).
TEST(BasicCuda, SumSquaresListMatchesCpuAndIgnoresAlignment) {
  std::vector<int64_t> sizes{0, 1, 3, 65536, 65537, 200003, 0, 4 * 65536 + 5};
  for (int i = 0; i < 300; ++i) sizes.push_back((i * 7919) % 3001);
  std::vector<Tensor> keep;
  std::vector<TensorView> h, d, d_off;
  for (const int64_t n : sizes) {
    Tensor x = rand_host(Shape{n}, -1.f, 2.f), dx = dev(x), buf = Tensor::empty(Shape{n + 1}, DType::f32, kGpu);
    const TensorView off = buf.view().slice(0, 1, n + 1);
    ops::copy(off, dx);
    h.push_back(x), d.push_back(dx), d_off.push_back(off);
    keep.insert(keep.end(), {x, dx, buf});
  }
  Tensor ref = Tensor::empty(Shape{1}, DType::f32), g = Tensor::empty(Shape{1}, DType::f32, kGpu);
  ops::sum_squares_list(ref, h);
  ops::sum_squares_list(g, d);
  const float g1 = ops::item(g);
  ops::sum_squares_list(g, d);
  const float g2 = ops::item(g);
  ops::sum_squares_list(g, d_off);
  const float g3 = ops::item(g);
  EXPECT_EQ(float_bits(g1), float_bits(g2)) << "run-to-run bits differ";
  EXPECT_EQ(float_bits(g1), float_bits(g3)) << "aligned and unaligned views differ";
  EXPECT_NEAR(g1, *ref.ptr<float>(), 2e-6 * *ref.ptr<float>());
  ops::fill(g, 7.0);
  ops::sum_squares_list(g, std::vector<TensorView>{d[0], d[6]});
  EXPECT_EQ(float_bits(ops::item(g)), 0u) << "empty views sum to +0";
}

TEST(BasicCuda, RngMatchesCpu) {
  uint64_t seed = dt::testing::test_seed();
  Tensor hu = Tensor::empty(Shape{257, 33}, DType::f32), du = Tensor::empty(Shape{257, 33}, DType::f32, kGpu);
  ops::RngSlice w{Shape{1000, 40}, {100, 5}};
  ops::rng_uniform(hu, seed, 3, -1.f, 1.f, w);
  ops::rng_uniform(du, seed, 3, -1.f, 1.f, w);
  Tensor gu = host(du);
  EXPECT_EQ(std::memcmp(hu.data(), gu.data(), hu.nbytes()), 0) << "uniform must be bit-identical";
  Tensor hn = Tensor::empty(Shape{1 << 16}, DType::f32), dn = Tensor::empty(Shape{1 << 16}, DType::f32, kGpu);
  ops::rng_normal(hn, seed, 4, 0.f, 1.f, ops::RngSlice::whole(hn));
  ops::rng_normal(dn, seed, 4, 0.f, 1.f, ops::RngSlice::whole(dn));
  Tensor gn = host(dn);
  int64_t differ = 0;
  for (int64_t i = 0; i < hn.numel(); ++i) {
    float x = hn.ptr<float>()[i], y = gn.ptr<float>()[i];
    if (x != y) {
      ++differ;
      // Within 2 ulp: double-precision libm results can differ in the last bit.
      ASSERT_LE(std::abs(int64_t(float_bits(x)) - int64_t(float_bits(y))), 2) << i;
    }
  }
  EXPECT_LT(differ, hn.numel() / 1000) << "normal draws should almost always be bit-identical";
}

TEST(BasicCuda, GemmMatchesCpu) {
  const int64_t M = 193, N = 131, K = 257;
  for (DType t : {DType::f32, DType::bf16})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        ops::GemmOpts o{bool(ta), bool(tb), 1.25f, 0.5f};
        Tensor a = as(as(rand_host(ta ? Shape{K, M} : Shape{M, K}), t), DType::f32);  // values exact in t
        Tensor b = as(as(rand_host(tb ? Shape{N, K} : Shape{K, N}), t), DType::f32);
        Tensor c = rand_host(Shape{M, N});
        Tensor dc = dev(c);
        ops::gemm(c, a, b, o);
        ops::gemm(dc, dev(as(a, t)), dev(as(b, t)), o);
        // fp32 accumulation either way; fp32 inputs use true fp32 math (no TF32).
        EXPECT_TRUE(close_rel(dc, c, 1e-6)) << dtype_name(t) << " ta " << ta << " tb " << tb;
      }
  // bf16 output: within bf16 rounding of the fp32 result.
  Tensor a = as(rand_host(Shape{64, 96}), DType::bf16), b = as(rand_host(Shape{96, 80}), DType::bf16);
  Tensor c32 = Tensor::empty(Shape{64, 80}, DType::f32, kGpu), c16 = Tensor::empty(Shape{64, 80}, DType::bf16, kGpu);
  ops::gemm(c32, dev(a), dev(b));
  ops::gemm(c16, dev(a), dev(b));
  EXPECT_TRUE(close_rel(c16, c32, 4e-3));
}

// DT_GEMM_AUTOTUNE=1 times several cuBLASLt candidates on a scratch C on the first call of a
// shape: C (beta != 0 here) must see exactly one product, whichever candidate wins.
TEST(BasicCuda, GemmAutotuneMatchesCpu) {
  ::setenv("DT_GEMM_AUTOTUNE", "1", 1);
  const int64_t M = 517, N = 389, K = 1031;  // a shape no other test uses, so the cache misses
  for (DType t : {DType::f32, DType::bf16}) {
    ops::GemmOpts o{false, true, 0.75f, 1.f};
    Tensor a = as(as(rand_host(Shape{M, K}), t), DType::f32), b = as(as(rand_host(Shape{N, K}), t), DType::f32);
    Tensor c = rand_host(Shape{M, N});
    Tensor dc = dev(c);
    ops::gemm(c, a, b, o);
    ops::gemm(dc, dev(as(a, t)), dev(as(b, t)), o);
    EXPECT_TRUE(close_rel(dc, c, 1e-6)) << dtype_name(t);
  }
  ::unsetenv("DT_GEMM_AUTOTUNE");
}

// C = 0.5 A B^T + C with bf16-exact operands: the CPU's product (ref), and the GPU's from the
// same C (dc), which must agree within fp32 summation order (rel. 1e-6) whatever the algorithm.
struct GemmVsCpu {
  static constexpr ops::GemmOpts o{false, true, 0.5f, 1.f};
  Tensor c, ref, da, db;
  GemmVsCpu(int64_t M, int64_t N, int64_t K) {
    Tensor a = as(as(rand_host(Shape{M, K}), DType::bf16), DType::f32);
    Tensor b = as(as(rand_host(Shape{N, K}), DType::bf16), DType::f32);
    c = rand_host(Shape{M, N});
    ref = as(c, DType::f32);  // C's copy, then the CPU's product into it
    ops::gemm(ref, a, b, o);
    da = dev(as(a, DType::bf16)), db = dev(as(b, DType::bf16));
  }
  bool gpu_matches() const {
    Tensor dc = dev(c);
    ops::gemm(dc, da, db, o);
    return close_rel(dc, ref, 1e-6);
  }
};

// DT_GEMM_ALGO pins a shape's cuBLASLt candidate (flipped between calls here): each gives C one
// product, the CPU's within fp32 summation order. (The parser's errors: test_core.)
TEST(BasicCuda, GemmPinnedCandidateMatchesCpu) {
  const GemmVsCpu g(263, 411, 777);  // a shape no other test uses
  for (int i = 0; i < 2; ++i) {
    ::setenv("DT_GEMM_ALGO", ("263x411x777:" + std::to_string(i)).c_str(), 1);
    EXPECT_TRUE(g.gpu_matches()) << "candidate " << i;
  }
  ::unsetenv("DT_GEMM_ALGO");
}

// DT_GEMM_AUTOTUNE=2 searches every configuration of the heuristic's first algorithm (tile x
// stages x cluster x custom option) and ranks them at the power cap; whichever wins must compute
// the same product as the CPU (bf16 operands exact in fp32, fp32 accumulation: rel. 1e-6).
TEST(BasicCuda, GemmSustainedAutotuneMatchesCpu) {
  const GemmVsCpu g(301, 203, 509);  // a shape no other test uses
  ::setenv("DT_GEMM_AUTOTUNE", "2", 1);
  EXPECT_TRUE(g.gpu_matches());
  ::unsetenv("DT_GEMM_AUTOTUNE");
}
// A configuration cuBLASLt does not accept (tile id 1 is 8x8) fails naming the knob and the shape.
TEST(BasicCudaDeathTest, GemmConfigNotAcceptedFails) {
  const int64_t M = 96, N = 80, K = 64;
  Tensor a = Tensor::empty(Shape{M, K}, DType::bf16, kGpu), b = Tensor::empty(Shape{K, N}, DType::bf16, kGpu);
  Tensor c = Tensor::empty(Shape{M, N}, DType::bf16, kGpu);
  ::setenv("DT_GEMM_CONFIG", "96x80x64:1.1.2.0", 1);
  EXPECT_DEATH(ops::gemm(c, a, b, ops::GemmOpts{}),
               "DT_GEMM_CONFIG names 1.1.2.0 for M 96 N 80 K 64, but cuBLASLt does not accept that configuration");
  ::setenv("DT_GEMM_CONFIG", "96x80x64:29.35", 1);
  EXPECT_DEATH(ops::gemm(c, a, b, ops::GemmOpts{}), "DT_GEMM_CONFIG='96x80x64:29.35': entry .* is not "
                                                    "MxNxK:tile.stages.cluster.custom");
  ::unsetenv("DT_GEMM_CONFIG");
}

// The tuned table's entries for this GPU (src/ops/gemm_tuned.cpp; none: skipped): each tuned
// candidate's product equals the heuristic's first within bf16 output rounding (rel. L2 < 1e-2;
// the same accumulation in fp32, rounded once). On random bf16 operands at the entry's shape.
TEST(BasicCuda, TunedGemmCandidatesAgreeWithTheFirst) {
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  int n = 0;
  for (const ops::TunedGemm& e : ops::tuned_gemm_table()) {
    if (std::string(prop.name) != e.device) continue;
    ++n;
    const bool ta = e.trans & 1, tb = e.trans & 2;
    Tensor a = Tensor::empty(ta ? Shape{e.k, e.m} : Shape{e.m, e.k}, DType::bf16, kGpu);
    Tensor b = Tensor::empty(tb ? Shape{e.n, e.k} : Shape{e.k, e.n}, DType::bf16, kGpu);
    ops::rng_normal(a, 7, 1, 0.f, 1.f, ops::RngSlice::whole(a));
    ops::rng_normal(b, 7, 2, 0.f, 1.f, ops::RngSlice::whole(b));
    Tensor c[2] = {Tensor::empty(Shape{e.m, e.n}, DType::bf16, kGpu),
                   Tensor::empty(Shape{e.m, e.n}, DType::bf16, kGpu)};
    for (int tuned = 0; tuned < 2; ++tuned) {
      ::setenv("DT_GEMM_TUNED", tuned ? "1" : "0", 1);
      ops::gemm(c[tuned], a, b, ops::GemmOpts{ta, tb});
    }
    ::unsetenv("DT_GEMM_TUNED");
    EXPECT_TRUE(close_rel(as(host(c[1]), DType::f32), as(host(c[0]), DType::f32), 1e-2))
        << e.m << "x" << e.n << "x" << e.k << " candidate " << e.candidate;
  }
  if (n == 0) GTEST_SKIP() << "no tuned GEMM entries for " << prop.name;
}

TEST(BasicCuda, CachingAllocatorHasNoRawAllocsInSteadyState) {
  Allocator& al = cuda_allocator(0);
  auto step = [&] {  // a "training step": the same pattern of temporaries every time
    Tensor x = Tensor::empty(Shape{1 << 20}, DType::bf16, kGpu);
    Tensor y = Tensor::empty(Shape{3, 1000}, DType::f32, kGpu);
    Tensor z = Tensor::empty(Shape{7 << 20}, DType::u8, kGpu);
    ops::fill(x, 1.0);
    ops::fill(y, 2.0);
    Tensor s = Tensor::empty(Shape{1}, DType::f32, kGpu);
    ops::sum(s, x);
    return ops::item(s);
  };
  EXPECT_EQ(step(), float(1 << 20));
  int64_t raw = al.stats().num_raw_allocs, reserved = al.stats().reserved_bytes;
  al.reset_peak();
  for (int i = 0; i < 5; ++i) step();
  EXPECT_EQ(al.stats().num_raw_allocs, raw) << "cudaMalloc inside a steady-state step";
  EXPECT_EQ(al.stats().reserved_bytes, reserved);
  EXPECT_GE(al.stats().peak_bytes, (2 << 20) + (7 << 20));
}

// Splitting and merging with cudaMalloc'd segments (the logic itself: tests/core/test_allocator.cpp):
// a free 64 MiB segment is carved into disjoint 1 MiB tensors without a cudaMalloc, they merge
// back so that 64 MiB fit again, and release_cached returns every segment the test added.
TEST(BasicCuda, CachingAllocatorSplitsAndMergesSegments) {
  Allocator& al = cuda_allocator(0);
  auto sum = [](const Tensor& x) {
    Tensor s = Tensor::empty(Shape{1}, DType::f32, kGpu);
    ops::sum(s, x);
    return ops::item(s);
  };
  al.release_cached();
  const AllocatorStats s0 = al.stats();  // only segments with blocks in use are left, none over 64 MiB
  {  // caches what a sum of 1 MiB allocates, so that the sums below need no new segment
    Tensor w = Tensor::empty(Shape{1 << 18}, DType::f32, kGpu);
    ops::fill(w, 1.0);
    EXPECT_EQ(sum(w), float(1 << 18));
  }
  const AllocatorStats s1 = al.stats();
  { Tensor big = Tensor::empty(Shape{64 << 20}, DType::u8, kGpu); }  // needs a new 64 MiB segment
  AllocatorStats s2 = al.stats();
  EXPECT_EQ(s2.num_raw_allocs, s1.num_raw_allocs + 1);
  EXPECT_EQ(s2.reserved_bytes, s1.reserved_bytes + (64 << 20));
  {
    std::vector<Tensor> parts;
    for (int i = 0; i < 64; ++i) {
      parts.push_back(Tensor::empty(Shape{1 << 18}, DType::f32, kGpu));  // 1 MiB
      ops::fill(parts.back(), double(i));
    }
    std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
    for (auto& t : parts) ranges.emplace_back(uintptr_t(t.data()), uintptr_t(t.data()) + (1 << 20));
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i) EXPECT_LE(ranges[i - 1].second, ranges[i].first) << "overlapping blocks";
    // Each sum is exact (integers below 2^24): an overlapping fill would change one.
    for (int i = 0; i < 64; ++i) EXPECT_EQ(sum(parts[i]), float(i) * float(1 << 18)) << "part " << i;
    EXPECT_EQ(al.stats().num_raw_allocs, s2.num_raw_allocs) << "cudaMalloc although the 64 MiB segment was free";
  }
  { Tensor big = Tensor::empty(Shape{64 << 20}, DType::u8, kGpu); }  // the merged segment again
  EXPECT_EQ(al.stats().num_raw_allocs, s2.num_raw_allocs);
  al.release_cached();
  EXPECT_EQ(al.stats().reserved_bytes, s0.reserved_bytes);
  EXPECT_EQ(al.stats().allocated_bytes, s0.allocated_bytes);
  EXPECT_GE(al.stats().num_raw_frees, s0.num_raw_frees + 1);
}
