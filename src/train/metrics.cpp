// Per-step metrics (include/deltatron/train/metrics.h).
#include "deltatron/train/metrics.h"

#include <fmt/format.h>
#include <algorithm>
#include <cmath>
#include <sys/resource.h>

#include "deltatron/core/allocator.h"
#include "deltatron/core/check.h"
#if DELTATRON_HAVE_CUDA
#include "core/cuda_check.h"
#endif

namespace dt::train {

double StepMetrics::tokens_per_s() const { return step_ms > 0 ? double(tokens) / (step_ms * 1e-3) : 0.0; }

double StepMetrics::tflops_per_gpu() const {
  return step_ms > 0 ? model_flops / (step_ms * 1e-3) / double(std::max(world, 1)) / 1e12 : 0.0;
}

double StepMetrics::mfu() const { return peak_tflops > 0 ? tflops_per_gpu() / peak_tflops : 0.0; }

std::string format_step_line(const StepMetrics& m) {
  std::string mfu = m.has_mfu() ? fmt::format("MFU {:.1f}% | ", 100 * m.mfu()) : "";
  return fmt::format(
      "step {:5d}/{} | loss {:.4f} | grad_norm {:.3f} | lr {:.3e} | {:.0f} ms | {:.0f} tok/s | {:.3g} TFLOP/s/GPU | "
      "{}peak {:.2f} GiB | skipped {} | ETA {:.0f} s",
      m.step, m.total_steps, m.loss, m.grad_norm, m.lr, m.step_ms, m.tokens_per_s(), m.tflops_per_gpu(), mfu,
      double(m.peak_mem_bytes) / double(int64_t(1) << 30), m.skipped, m.eta_s);
}

// JSON has no NaN or Infinity: a non-finite value (a skipped step's loss or grad norm) is null,
// so every line stays valid JSON for json.loads, jq and plot_metrics.py.
static std::string json_num(double x, const char* spec) {
  return std::isfinite(x) ? fmt::format(fmt::runtime(spec), x) : std::string("null");
}

std::string format_step_json(const StepMetrics& m) {
  std::string mfu = m.has_mfu() ? json_num(m.mfu(), "{:.5f}") : "null";
  return fmt::format(
      "{{\"step\": {}, \"loss\": {}, \"grad_norm\": {}, \"lr\": {}, \"step_ms\": {:.3f}, "
      "\"tokens\": {}, \"tokens_per_s\": {:.1f}, \"tflops_per_gpu\": {}, \"mfu\": {}, \"peak_mem_bytes\": {}, "
      "\"skipped\": {}, \"eta_s\": {:.1f}}}",
      m.step, json_num(m.loss, "{:.6f}"), json_num(m.grad_norm, "{:.6f}"), json_num(m.lr, "{:.6e}"), m.step_ms,
      m.tokens, m.tokens_per_s(), json_num(m.tflops_per_gpu(), "{:.6g}"), mfu, m.peak_mem_bytes, m.skipped, m.eta_s);
}

int64_t peak_memory_bytes(Device dev) {
  if (dev.is_cuda()) return cuda_allocator(dev.index).stats().peak_bytes;
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return int64_t(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

std::string device_name(Device dev) {
  if (dev.is_cpu()) return "cpu";
#if DELTATRON_HAVE_CUDA
  cudaDeviceProp p{};
  DT_CUDA_CHECK(cudaGetDeviceProperties(&p, dev.index));
  return p.name;
#else
  DT_FAIL("device_name: {} in a build without CUDA", dev.str());
#endif
}

}  // namespace dt::train
