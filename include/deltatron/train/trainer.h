// The training loop (issue 6), CPU backend for now: config -> process groups -> dataset ->
// packed loader -> Qwen35Model -> per step: grad_accum micro-batches (forward, backward with
// 1 / global predicted-token count), gradient reduction per ParamSpec, global grad norm,
// non-finite guard, clip, optimizer step; a rank-0 log line and a JSONL record per step.
#pragma once
#include <string>
#include <vector>

#include "deltatron/io/config.h"

namespace dt::train {

struct TrainResult {
  std::vector<double> losses;  // mean loss of every step, in order
  int64_t skipped = 0;
};

// Runs the whole loop. Input errors (config, layout, data) end every rank through
// dt::user_error; the returned losses are the same on every rank.
TrainResult run_training(const io::Config& cfg);

}  // namespace dt::train
