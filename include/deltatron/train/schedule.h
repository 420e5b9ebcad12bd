// Learning-rate schedule: a pure function of the step (no state, so resuming at step k gives
// the same lr as running through k).
//
// `step` is 0-based: lr(step) is used by the (step + 1)-th optimizer update. With
// W = warmup_steps, N = total_steps and lr_min = min_lr_ratio * base_lr:
//   warm-up   (step < W):  lr = base_lr * (step + 1) / W               (linear, reaches base_lr at W - 1)
//   constant  (step >= W): lr = base_lr
//   cosine    (step >= W): lr = lr_min + (base_lr - lr_min) * (1 + cos(pi * q)) / 2,
//                          q = min(1, (step - W) / max(1, N - W))      (lr_min from step N on)
#pragma once
#include <cstdint>
#include <string>

#include "deltatron/io/config.h"

namespace dt::train {

class LrSchedule {
 public:
  enum class Kind { constant, cosine };
  LrSchedule(Kind kind, double base_lr, int64_t warmup_steps, int64_t total_steps, double min_lr_ratio);
  // From the config sections (schedule.name must be constant | cosine; checked here too).
  LrSchedule(const io::ScheduleConfig& s, double base_lr, int64_t total_steps);

  double lr(int64_t step) const;
  Kind kind() const { return kind_; }

  // "" when valid, else a message naming the field and its value.
  static std::string validate(const io::ScheduleConfig& s, int64_t total_steps);

 private:
  Kind kind_;
  double base_, min_;
  int64_t warmup_, total_;
};

}  // namespace dt::train
