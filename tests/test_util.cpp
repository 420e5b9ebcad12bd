#include "test_util.h"

#include <chrono>
#include <cstdlib>

#include "deltatron/core/rng.h"
#include "deltatron/dist/comm.h"
#if DELTATRON_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace dt::testing {

uint64_t test_seed() {
  static uint64_t seed = [] {
    uint64_t s;
    if (const char* e = std::getenv("DT_TEST_SEED")) {
      s = std::strtoull(e, nullptr, 10);
    } else {
      s = uint64_t(std::chrono::high_resolution_clock::now().time_since_epoch().count());
      // Every rank of a multi-rank test must draw the same data.
      if (dist::initialized() && dist::world_size() > 1) {
        Tensor t = Tensor::empty(Shape{1}, DType::i64);
        *t.ptr<int64_t>() = int64_t(s);
        auto w = dist::make_world(dist::Backend::mpi);
        w->broadcast(t, 0);
        s = uint64_t(*t.ptr<int64_t>());
      }
    }
    std::printf("[test] DT_TEST_SEED=%llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

static uint64_t next_stream() {
  static uint64_t n = 0;
  return ++n;
}

Tensor rand_host(Shape s, float lo, float hi, DType dt) {
  Tensor t = Tensor::empty(s, dt);
  ops::rng_uniform(t, test_seed(), next_stream(), lo, hi, ops::RngSlice::whole(t));
  return t;
}

Tensor randn_host(Shape s, float std, DType dt) {
  Tensor t = Tensor::empty(s, dt);
  ops::rng_normal(t, test_seed(), next_stream(), 0.f, std, ops::RngSlice::whole(t));
  return t;
}

void poison(const TensorView& x, Stream s) {
  if (x.numel()) ops::fill(x, std::nan(""), s);
}

std::string ErrStats::str() const {
  return fmt::format("rel_l2 {:.3e}, max_abs {:.3e} at {}, non-finite {}", rel_l2, max_abs, worst, non_finite);
}

static std::vector<double> as_doubles(const TensorView& x) {
  Tensor h = ops::to_host(x);
  Tensor f = Tensor::empty(x.shape, DType::f32);
  ops::copy(f, h);
  std::vector<double> out(size_t(f.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = f.ptr<float>()[i];
  return out;
}

ErrStats compare(const std::vector<double>& got, const std::vector<double>& ref) {
  ErrStats e;
  EXPECT_EQ(got.size(), ref.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(got.size(), ref.size()); ++i) {
    if (!std::isfinite(got[i])) {
      e.non_finite++;
      continue;
    }
    double d = got[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
    if (std::fabs(d) > e.max_abs) {
      e.max_abs = std::fabs(d);
      e.worst = int64_t(i);
    }
  }
  e.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return e;
}

ErrStats compare(const TensorView& got, const TensorView& ref) { return compare(as_doubles(got), as_doubles(ref)); }

::testing::AssertionResult close_rel(const std::vector<double>& got, const std::vector<double>& ref, double tol) {
  ErrStats e = compare(got, ref);
  if (e.non_finite == 0 && e.rel_l2 < tol && got.size() == ref.size())
    return ::testing::AssertionSuccess() << e.str();
  auto r = ::testing::AssertionFailure() << e.str() << " (tol " << tol << ")";
  if (e.worst >= 0) r << "; worst: got " << got[e.worst] << " ref " << ref[e.worst];
  int shown = 0;
  for (size_t i = 0; i < got.size() && shown < 5; ++i)
    if (!std::isfinite(got[i])) {
      r << "; non-finite at " << i;
      ++shown;
    }
  return r;
}

::testing::AssertionResult close_rel(const TensorView& got, const TensorView& ref, double tol) {
  return close_rel(as_doubles(got), as_doubles(ref), tol);
}

bool have_gpu() {
#if DELTATRON_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
#else
  return false;
#endif
}

}  // namespace dt::testing
