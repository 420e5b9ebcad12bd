// Per-step metrics of the training loop (docs/training.md, "Metrics"): the rank-0 log line and
// the JSONL record carry the same fields; peak memory of the device (CUDA: the caching
// allocator's peak bytes; CPU: the process's peak RSS) and the device's name for the MFU peak.
#pragma once
#include <cstdint>
#include <string>

#include "deltatron/core/dtype.h"

namespace dt::train {

struct StepMetrics {
  int64_t step = 0, total_steps = 0;  // step counts from 1
  double loss = 0, grad_norm = 0, lr = 0;
  double step_ms = 0;       // wall time of the step
  int64_t tokens = 0;       // real tokens of the global batch
  double model_flops = 0;   // model FLOPs of the global batch (flops.h)
  int world = 1;            // GPUs (ranks) sharing the step
  double peak_tflops = 0;   // device peak for MFU; 0: no MFU (CPU, unknown GPU)
  int64_t peak_mem_bytes = 0;
  int64_t skipped = 0;      // skipped (non-finite) steps so far
  double eta_s = 0;

  double tokens_per_s() const;
  double tflops_per_gpu() const;  // model FLOPs / step time / world
  double mfu() const;             // tflops_per_gpu / peak_tflops, in [0, 1]; 0 when peak_tflops is 0
  bool has_mfu() const { return peak_tflops > 0; }
};

// "step 12/200 | loss 3.9812 | grad_norm 0.812 | lr 1.800e-03 | 412 ms | 9943 tok/s | 0.05 TFLOP/s/GPU |
//  [MFU 41.2% | ]peak 1.23 GiB | skipped 0 | ETA 77 s"
std::string format_step_line(const StepMetrics& m);
// One JSON object, one line (no trailing newline); "mfu" is null without a peak.
std::string format_step_json(const StepMetrics& m);

// CUDA: peak bytes of the caching allocator of `dev` since the start (or the last reset);
// CPU: the peak resident set size of this process.
int64_t peak_memory_bytes(Device dev);
// cudaGetDeviceProperties' name of a CUDA device; "cpu" for the CPU.
std::string device_name(Device dev);

}  // namespace dt::train
