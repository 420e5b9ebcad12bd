// Timing for the bench harnesses: CUDA events around a callable on one stream, warm-up
// first, median of the repetitions (METHOD.md: warm up, repeat, take the median).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda_check.h"
#include "deltatron/core/tensor.h"
#include "deltatron/ops/basic.h"

namespace dt::bench {

// An environment variable put back as it was at construction (its value, or unset) when this goes
// out of scope: a bench that sets a knob for one measurement leaves it for what runs after.
class EnvRestore {
 public:
  explicit EnvRestore(std::string name) : name_(std::move(name)) {
    const char* v = std::getenv(name_.c_str());
    had_ = v != nullptr;
    if (had_) value_ = v;
  }
  ~EnvRestore() {
    if (had_) setenv(name_.c_str(), value_.c_str(), 1);
    else unsetenv(name_.c_str());
  }
  EnvRestore(const EnvRestore&) = delete;
  EnvRestore& operator=(const EnvRestore&) = delete;

 private:
  std::string name_, value_;
  bool had_ = false;
};

// The median (upper middle for an even count) of a sample, taken by value.
template <class X>
X median(std::vector<X> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class F>
float median_ms(F&& f, cudaStream_t st = nullptr, int warmup = 3, int reps = 20) {
  cudaEvent_t e0, e1;
  DT_CUDA_CHECK(cudaEventCreate(&e0));
  DT_CUDA_CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < warmup; ++i) f();
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    DT_CUDA_CHECK(cudaEventRecord(e0, st));
    f();
    DT_CUDA_CHECK(cudaEventRecord(e1, st));
    DT_CUDA_CHECK(cudaEventSynchronize(e1));
    float x = 0;
    DT_CUDA_CHECK(cudaEventElapsedTime(&x, e0, e1));
    ms.push_back(x);
  }
  DT_CUDA_CHECK(cudaEventDestroy(e0));
  DT_CUDA_CHECK(cudaEventDestroy(e1));
  return median(std::move(ms));
}

// cu_seqlens [N+1] of a T-token pack of lengths drawn uniformly in [lo, hi] (the last one cut
// at T): the mixed-length packs of the issues' shapes.
inline std::vector<int32_t> draw_cu(std::mt19937_64& gen, int64_t T, int lo, int hi) {
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<int32_t> cu{0};
  while (cu.back() < T) cu.push_back(int32_t(std::min<int64_t>(cu.back() + d(gen), T)));
  return cu;
}

// A host vector as an i32 device tensor.
inline Tensor i32_dev(const std::vector<int32_t>& v) {
  Tensor h = Tensor::empty(Shape{int64_t(v.size())}, DType::i32);
  std::copy(v.begin(), v.end(), h.ptr<int32_t>());
  return ops::to_device(h, Device::cuda());
}

}  // namespace dt::bench
