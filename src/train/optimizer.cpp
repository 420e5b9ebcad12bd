#include "deltatron/train/optimizer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "deltatron/ops/basic.h"
#include "deltatron/ops/optim.h"

namespace dt::train {

bool decays(const model::ParamSpec& s) { return s.shape.ndim >= 2; }

double global_grad_norm(const std::vector<model::Param*>& params, const dist::ProcessGroups& pg, Stream s) {
  if (params.empty()) return 0.0;
  const Device dev = params[0]->grad.device();
  const bool count_replicated = pg.coord.tp == 0;
  std::vector<TensorView> grads;  // the gradients this rank counts, summed in one launch
  grads.reserve(params.size());
  for (const model::Param* p : params) {
    DT_CHECK(p->grad.device() == dev, "global_grad_norm: {} has its gradient on {}, the first parameter on {}",
             p->spec.name, p->grad.view().str(), params[0]->grad.view().str());
    if (p->grad.numel() == 0 || (p->spec.tp_dim < 0 && !count_replicated)) continue;
    grads.push_back(p->grad.view());
  }
  Tensor total = Tensor::empty(Shape{1}, DType::f32, dev);  // [1] f32
  ops::sum_squares_list(total, grads, s);
  if (pg.dims.tp > 1) pg.tp->all_reduce(total, dist::ReduceOp::sum, s);
  return std::sqrt(double(ops::item(total, s)));
}

float clip_coefficient(double grad_norm, double max_norm) {
  if (max_norm <= 0.0) return 1.f;
  return float(std::min(1.0, max_norm / (grad_norm + 1e-6)));
}

void zero_grads(const std::vector<model::Param*>& params, Stream s) {
  for (model::Param* p : params) ops::fill(p->grad, 0.0, s);
}

std::string Optimizer::validate(const io::OptimizerConfig& c) {
  if (c.name != "adamw" && c.name != "sgd") return fmt::format("optimizer.name '{}' is not one of adamw | sgd", c.name);
  if (!(c.lr >= 0.0) || !std::isfinite(c.lr)) return fmt::format("optimizer.lr must be finite and >= 0, got {}", c.lr);
  if (!(c.weight_decay >= 0.0)) return fmt::format("optimizer.weight_decay must be >= 0, got {}", c.weight_decay);
  if (!(c.beta1 >= 0.0 && c.beta1 < 1.0)) return fmt::format("optimizer.beta1 must be in [0, 1), got {}", c.beta1);
  if (!(c.beta2 >= 0.0 && c.beta2 < 1.0)) return fmt::format("optimizer.beta2 must be in [0, 1), got {}", c.beta2);
  if (!(c.eps > 0.0)) return fmt::format("optimizer.eps must be > 0, got {}", c.eps);
  if (!(c.clip_grad >= 0.0)) return fmt::format("optimizer.clip_grad must be >= 0 (0 = off), got {}", c.clip_grad);
  return "";
}

Optimizer::Optimizer(const io::OptimizerConfig& cfg, const std::vector<model::Param*>& params, Stream s)
    : cfg_(cfg) {
  std::string err = validate(cfg);
  DT_CHECK(err.empty(), "{}", err);
  kind_ = cfg.name == "adamw" ? Kind::adamw : Kind::sgd;
  state_.reserve(params.size());
  for (const model::Param* p : params) {
    State st;
    if (kind_ == Kind::adamw) {
      st.m = Tensor::zeros(p->master.shape(), DType::f32, p->master.device(), s);
      st.v = Tensor::zeros(p->master.shape(), DType::f32, p->master.device(), s);
    }
    state_.push_back(std::move(st));
  }
}

void Optimizer::step(const std::vector<model::Param*>& params, float lr, float clip_coef, Stream s) {
  DT_CHECK(params.size() == state_.size(), "Optimizer::step: {} parameters, but the state was built for {}",
           params.size(), state_.size());
  ++t_;
  // The compute-copy refresh and the gradient reset ride in the update's pass.
  auto writes = [](const model::Param& p) {
    ops::UpdateWrites w;
    if (p.compute.defined()) w.compute = p.compute;
    w.zero_grad = true;
    return w;
  };
  if (kind_ == Kind::adamw) {  // one call for every parameter (batched launches on CUDA)
    std::vector<ops::AdamWItem> items;
    items.reserve(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      model::Param& p = *params[i];
      items.push_back({p.master, state_[i].m, state_[i].v, p.grad, writes(p),
                       decays(p.spec) ? float(cfg_.weight_decay) : 0.f});
    }
    ops::AdamWArgs a;
    a.lr = lr;
    a.beta1 = float(cfg_.beta1);
    a.beta2 = float(cfg_.beta2);
    a.eps = float(cfg_.eps);
    a.step = t_;
    a.grad_scale = clip_coef;
    ops::adamw_update_multi(items, a, s);
    return;
  }
  for (model::Param* p : params) {
    const float wd = decays(p->spec) ? float(cfg_.weight_decay) : 0.f;
    ops::sgd_update(p->master, p->grad, ops::SgdArgs{lr, wd, clip_coef}, writes(*p), s);
  }
}

StepGuard::StepGuard(int64_t max_in_a_row) : max_in_a_row_(max_in_a_row) {
  DT_CHECK(max_in_a_row >= 1, "train.max_nonfinite_in_a_row must be >= 1, got {}", max_in_a_row);
}

StepVerdict StepGuard::check(int64_t step, double loss, double grad_norm) {
  if (std::isfinite(loss) && std::isfinite(grad_norm)) {
    in_a_row_ = 0;
    return {};
  }
  ++skipped_;
  ++in_a_row_;
  spdlog::warn("step {}: non-finite loss {} or grad norm {}: update skipped ({} in a row, {} skipped in total)", step,
               loss, grad_norm, in_a_row_, skipped_);
  StepVerdict v;
  v.apply = false;
  if (in_a_row_ >= max_in_a_row_)
    v.error = fmt::format(
        "step {}: {} non-finite steps in a row (last loss {}, grad norm {}); stopping, as "
        "train.max_nonfinite_in_a_row={}\n---> hint: lower optimizer.lr, raise schedule.warmup_steps, keep "
        "optimizer.clip_grad on, or check the data",
        step, in_a_row_, loss, grad_norm, max_in_a_row_);
  return v;
}

}  // namespace dt::train
