#include "deltatron/train/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "deltatron/core/check.h"

namespace dt::train {

LrSchedule::LrSchedule(Kind kind, double base_lr, int64_t warmup_steps, int64_t total_steps, double min_lr_ratio)
    : kind_(kind), base_(base_lr), min_(base_lr * min_lr_ratio), warmup_(warmup_steps), total_(total_steps) {
  DT_CHECK(warmup_steps >= 0, "schedule.warmup_steps must be >= 0, got {}", warmup_steps);
  DT_CHECK(min_lr_ratio >= 0.0 && min_lr_ratio <= 1.0, "schedule.min_lr_ratio must be in [0, 1], got {}",
           min_lr_ratio);
}

static LrSchedule::Kind kind_of(const io::ScheduleConfig& s) {
  std::string err = LrSchedule::validate(s, 0);
  DT_CHECK(err.empty(), "{}", err);
  return s.name == "constant" ? LrSchedule::Kind::constant : LrSchedule::Kind::cosine;
}

LrSchedule::LrSchedule(const io::ScheduleConfig& s, double base_lr, int64_t total_steps)
    : LrSchedule(kind_of(s), base_lr, s.warmup_steps, total_steps, s.min_lr_ratio) {}

std::string LrSchedule::validate(const io::ScheduleConfig& s, int64_t total_steps) {
  if (s.name != "constant" && s.name != "cosine")
    return fmt::format("schedule.name '{}' is not one of constant | cosine", s.name);
  if (s.warmup_steps < 0) return fmt::format("schedule.warmup_steps must be >= 0, got {}", s.warmup_steps);
  if (!(s.min_lr_ratio >= 0.0 && s.min_lr_ratio <= 1.0))
    return fmt::format("schedule.min_lr_ratio must be in [0, 1], got {}", s.min_lr_ratio);
  if (total_steps > 0 && s.warmup_steps > total_steps)
    return fmt::format("schedule.warmup_steps={} exceeds train.steps={}", s.warmup_steps, total_steps);
  return "";
}

double LrSchedule::lr(int64_t step) const {
  if (step < warmup_) return base_ * double(step + 1) / double(warmup_);
  if (kind_ == Kind::constant) return base_;
  const double q = std::min(1.0, double(step - warmup_) / double(std::max<int64_t>(1, total_ - warmup_)));
  return min_ + (base_ - min_) * 0.5 * (1.0 + std::cos(std::numbers::pi * q));
}

}  // namespace dt::train
