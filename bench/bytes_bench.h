// The memory-bound kernel harness shared by bench/gdn_elementwise.cu and
// bench/dense_elementwise.cu: bytes-based timing (median and min of g_reps calls between CUDA
// events, queued behind a 2 GiB fill so that host launch latency never shows, input sets rotated
// past the 60 MB L2, plus the mean per call of the same calls back to back between one pair of
// events), the ratio to bytes / 4.3 TB/s (the project's measured H200 copy bandwidth,
// gdn-math.md 9.3), a finiteness check, the launch floor, and the summary table.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/cuda_check.h"
#include "deltatron/core/tensor.h"
#include "deltatron/ops/basic.h"

namespace dt::bench {

inline constexpr double kCopyBytesPerS = 4.3e12;
inline constexpr double kL2Bytes = 60.0 * (1 << 20);
inline constexpr double kTarget = 1.5;  // the memory-bound issues' target ratio

inline const Device kGpu = Device::cuda(0);
inline int g_reps = 30;

struct Result {
  std::string name;
  double med_ms = 0, min_ms = 0, bytes = 0;
  double b2b_ms = 0;  // mean per call, back to back
  int sets = 0;
};
inline std::vector<Result> g_results;

// Enough input sets that the previous call's data has left the L2 (at least 2).
inline int sets_for(double bytes_per_set) {
  return int(std::clamp(std::ceil(3.0 * kL2Bytes / bytes_per_set), 2.0, 32.0));
}

inline void rand_fill(const TensorView& x, uint64_t stream, float lo, float hi, cudaStream_t st) {
  dt::ops::rng_uniform(x, 1234, stream, lo, hi, dt::ops::RngSlice::whole(x), Stream{st});
}

inline TensorView cols(const Tensor& buf, int64_t c0, int64_t n) { return buf.view().slice(1, c0, c0 + n); }

// Times launch(set) over g_reps calls, rotating sets; median and min in ms.
inline void time_kernel(const std::string& name, double bytes, int nsets, cudaStream_t st, const Tensor& busy,
                 const std::function<void(int)>& launch) {
  for (int i = 0; i < 3; ++i) launch(i % nsets);
  dt::ops::fill(busy, 0.0, Stream{st});  // queue the timed calls behind ~0.5 ms of GPU work
  std::vector<cudaEvent_t> ev(size_t(2 * g_reps));
  for (auto& e : ev) DT_CUDA_CHECK(cudaEventCreate(&e));
  for (int r = 0; r < g_reps; ++r) {
    DT_CUDA_CHECK(cudaEventRecord(ev[size_t(2 * r)], st));
    launch(r % nsets);
    DT_CUDA_CHECK(cudaEventRecord(ev[size_t(2 * r + 1)], st));
  }
  DT_CUDA_CHECK(cudaStreamSynchronize(st));
  std::vector<float> ms;
  for (int r = 0; r < g_reps; ++r) {
    float x = 0.f;
    DT_CUDA_CHECK(cudaEventElapsedTime(&x, ev[size_t(2 * r)], ev[size_t(2 * r + 1)]));
    ms.push_back(x);
  }
  // Back to back: all calls between one pair of events.
  dt::ops::fill(busy, 0.0, Stream{st});
  DT_CUDA_CHECK(cudaEventRecord(ev[0], st));
  for (int r = 0; r < g_reps; ++r) launch(r % nsets);
  DT_CUDA_CHECK(cudaEventRecord(ev[1], st));
  // The fill must still be running when the last call is queued, else the GPU waited on the host.
  const bool covered = cudaEventQuery(ev[0]) == cudaErrorNotReady;
  (void)cudaGetLastError();  // "not ready" is an answer, not a fault: clear it for the launch checks
  DT_CUDA_CHECK(cudaEventSynchronize(ev[1]));
  if (!covered)
    std::printf("!! %s: the GPU drained before the back-to-back calls were queued (host-bound; fewer reps)\n",
                name.c_str());
  float all = 0.f;
  DT_CUDA_CHECK(cudaEventElapsedTime(&all, ev[0], ev[1]));
  for (auto& e : ev) DT_CUDA_CHECK(cudaEventDestroy(e));
  Result res{name, bench::median(ms), *std::min_element(ms.begin(), ms.end()), bytes, double(all) / g_reps, nsets};
  const double ideal_ms = bytes / kCopyBytesPerS * 1e3;
  if (bytes < 1024) {  // the floor: no bytes to speak of
    std::printf("%-22s median %8.4f ms  min %8.4f ms  back to back %8.4f ms  (launch + event floor of a timed call)\n",
                name.c_str(), res.med_ms, res.min_ms, res.b2b_ms);
    g_results.push_back(res);
    return;
  }
  std::printf("%-22s median %8.4f ms  min %8.4f ms  %9.2f MB  %7.0f GB/s  ideal %8.4f ms  ratio %5.2f  (%d sets)"
              "  back to back %8.4f ms ratio %5.2f\n",
              name.c_str(), res.med_ms, res.min_ms, bytes / 1e6, bytes / (res.med_ms * 1e-3) / 1e9, ideal_ms,
              res.med_ms / ideal_ms, nsets, res.b2b_ms, res.b2b_ms / ideal_ms);
  std::fflush(stdout);
  g_results.push_back(res);
}

// Sanity: a broken kernel must not print a plausible time. Sum of squares must be finite.
inline void check_finite(const char* what, const TensorView& x, cudaStream_t st) {
  Tensor s = Tensor::empty(Shape{1}, DType::f32, kGpu);
  Tensor c = Tensor::empty(x.shape, x.dtype, kGpu);
  dt::ops::copy(c, x, Stream{st});
  dt::ops::sum_squares(s, c, Stream{st});
  const float v = dt::ops::item(s, Stream{st});
  if (!std::isfinite(v)) {
    std::printf("!! %s is not finite (sum of squares %g): the timing above is meaningless\n", what, double(v));
    std::fflush(stdout);
  }
}

// Median time of a one-element fill in the same harness (not a table row).
inline void bench_floor(cudaStream_t st, const Tensor& busy) {
  Tensor one = Tensor::empty(Shape{1}, DType::f32, kGpu);
  time_kernel("floor (1-elem fill)", 4, 2, st, busy, [&](int) { dt::ops::fill(one, 0.0, Stream{st}); });
  g_results.pop_back();
}

// The markdown summary of every row timed so far.
inline void print_table() {
  std::printf("\n| kernel | median ms | min ms | MB moved | GB/s | ideal ms @4.3TB/s | ratio | <= %.1f | back to back ms | ratio |\n",
              kTarget);
  std::printf("|---|---:|---:|---:|---:|---:|---:|:---:|---:|---:|\n");
  for (const Result& r : g_results) {
    const double ideal = r.bytes / kCopyBytesPerS * 1e3;
    std::printf("| %s | %.4f | %.4f | %.2f | %.0f | %.4f | %.2f | %s | %.4f | %.2f |\n", r.name.c_str(), r.med_ms,
                r.min_ms, r.bytes / 1e6, r.bytes / (r.med_ms * 1e-3) / 1e9, ideal, r.med_ms / ideal,
                r.med_ms / ideal <= kTarget ? "yes" : "NO", r.b2b_ms, r.b2b_ms / ideal);
  }
}

}  // namespace dt::bench
