// Timing for the bench harnesses: CUDA events around a callable on one stream, warm-up
// first, median of the repetitions (METHOD.md: warm up, repeat, take the median).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "core/cuda_check.h"

namespace dt::bench {

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
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace dt::bench
