// The optimizer step and what decides it: the global gradient norm, the clip coefficient,
// AdamW / SGD over fp32 master weights with fp32 state, and the non-finite step guard.
//
// One step, after backward and model::reduce_grads:
//   norm = global_grad_norm(params, pg)          // identical on every rank
//   verdict = guard.check(step, loss, norm)      // NaN/Inf: skip (counted, logged); K in a row: error
//   if (verdict.apply) opt.step(params, schedule.lr(step), clip_coefficient(norm, clip_grad))
//   else zero_grads(params)                      // step() already zeroed them in its pass
//
// Weight decay rule (ParamSpec-driven, `decays`): a parameter is decayed iff its GLOBAL shape
// has ndim >= 2. Decayed: every projection / embedding matrix and the depthwise conv1d weight
// [C, 1, W] (a real filter, 3-D). Not decayed: 1-D tensors -- RMSNorm weights, q/k norms, the
// gated-norm weight, A_log and dt_bias (gate parameters whose scale carries meaning).
// AdamW decays decoupled (p *= 1 - lr * wd); SGD decays as L2 (g += wd * p); both use the rule.
//
// Mixed precision: Param::master, Param::grad and the optimizer state (AdamW m, v) are fp32 on
// the parameter's device; each update also refreshes the bf16 compute copy from the master (the
// bits model::refresh_compute gives) and zeroes the gradient, in the same pass over the
// parameter (ops::UpdateWrites: one launch per parameter). Deterministic: per-element updates,
// fixed-order reductions.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "deltatron/dist/parallel.h"
#include "deltatron/io/config.h"
#include "deltatron/model/param.h"

namespace dt::train {

// True when weight decay applies to the parameter (the rule above).
bool decays(const model::ParamSpec& s);

// L2 norm of all gradients of the model, each element counted once, the same value on every
// rank. Call after model::reduce_grads. Counting rule, per ParamSpec:
//   - TP-sharded (tp_dim >= 0): the tp ranks hold disjoint shards -> summed over tp;
//   - TP-replicated (tp_dim < 0): identical on every tp rank after reduce_grads (grad_sum_tp
//     all-reduced it, or every rank computed it in full) -> counted on tp rank 0 only;
//   - dp x cp: after the dp x cp all-reduce every dp/cp rank holds the same gradient (CP
//     head slices were summed into the full shard) -> never summed over dp or cp.
// Per parameter, sum_squares writes one fp32 partial on the device (no host sync); the
// partials are summed in a fixed order, all-reduced over tp (one element), and read back once.
double global_grad_norm(const std::vector<model::Param*>& params, const dist::ProcessGroups& pg, Stream s = {});

// Clip coefficient for the global norm: min(1, max_norm / (norm + 1e-6)); 1 when max_norm <= 0
// (clipping off). Passed to Optimizer::step, which scales every gradient by it.
float clip_coefficient(double grad_norm, double max_norm);

// grad = 0 for every parameter (before the next accumulation).
void zero_grads(const std::vector<model::Param*>& params, Stream s = {});

class Optimizer {
 public:
  enum class Kind { adamw, sgd };
  struct State {   // per parameter, same shape and device as the master shard
    Tensor m;      // AdamW first moment, fp32 (undefined for SGD)
    Tensor v;      // AdamW second moment, fp32 (undefined for SGD)
  };

  // Allocates zeroed state for `params` (in this order) on each parameter's device.
  // optimizer.name must be adamw | sgd (see validate).
  Optimizer(const io::OptimizerConfig& cfg, const std::vector<model::Param*>& params, Stream s = {});

  // One update of every parameter with learning rate `lr`, gradients scaled by `clip_coef`
  // first; in the same pass it refreshes each compute copy and sets each gradient to 0 (no
  // zero_grads needed after it). `params` must be the constructor's list. The update count
  // (AdamW bias correction t) advances by one.
  void step(const std::vector<model::Param*>& params, float lr, float clip_coef, Stream s = {});

  Kind kind() const { return kind_; }
  int64_t num_updates() const { return t_; }
  void set_num_updates(int64_t t) { t_ = t; }  // after loading state from a checkpoint
  const std::vector<State>& state() const { return state_; }

  // "" when valid, else one message naming the field and its value.
  static std::string validate(const io::OptimizerConfig& c);

 private:
  io::OptimizerConfig cfg_;
  Kind kind_;
  int64_t t_ = 0;
  std::vector<State> state_;
};

// Non-finite handling. check() is called once per step with the loss and the global grad
// norm: both finite -> apply (and the run of skips resets); otherwise -> skip, counted and
// logged as a warning. After `max_in_a_row` skips in a row the verdict carries an error
// naming K and the step; the caller stops the run with it.
struct StepVerdict {
  bool apply = true;
  std::string error;  // non-empty: stop the run
};
class StepGuard {
 public:
  explicit StepGuard(int64_t max_in_a_row);
  StepVerdict check(int64_t step, double loss, double grad_norm);  // step: 1-based, as logged
  int64_t skipped() const { return skipped_; }     // total skipped steps
  int64_t in_a_row() const { return in_a_row_; }   // current run of skipped steps
  void restore(int64_t skipped, int64_t in_a_row) {  // the counters saved in a checkpoint
    skipped_ = skipped;
    in_a_row_ = in_a_row;
  }

 private:
  int64_t max_in_a_row_;
  int64_t skipped_ = 0, in_a_row_ = 0;
};

}  // namespace dt::train
