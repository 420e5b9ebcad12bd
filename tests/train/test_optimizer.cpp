// The optimizer on the CPU backend, one process: AdamW and SGD against double-precision
// loops over several steps, the weight-decay rule per parameter kind, bias correction in
// closed form, the lr schedule against its closed form, clipping, and the non-finite guard.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>
#include <numbers>
#include <algorithm>

#include "deltatron/ops/basic.h"
#include "deltatron/ops/optim.h"
#include "deltatron/train/optimizer.h"
#include "deltatron/train/schedule.h"
#include "optim_test_util.h"
#include "test_util.h"

using namespace dt;
using dt::testing::close_rel;

namespace {

// Single-process groups: tp = cp = dp = 1 (the norm and the optimizer touch no communicator).
dist::ProcessGroups serial_groups() {
  dist::ProcessGroups pg;
  pg.dims = {1, 1, 1};
  return pg;
}

struct Model {
  std::vector<model::Param> params;
  std::vector<model::Param*> ptrs() {
    std::vector<model::Param*> out;
    for (auto& p : params) out.push_back(&p);
    return out;
  }
};
Model make_model(DType compute) {
  Model m;
  for (const auto& s : dt::testing::small_model_specs())
    m.params.push_back(model::make_param(s, 1, 0, dt::testing::test_seed(), Device::cpu(), compute));
  return m;
}

// compute == bf16(master), bit for bit, wherever a compute copy exists.
void expect_compute_refreshed(const model::Param& p) {
  if (!p.compute.defined()) return;
  Tensor want = Tensor::empty(p.master.shape(), p.compute.dtype());
  ops::copy(want, p.master);
  EXPECT_EQ(std::memcmp(want.data(), p.compute.data(), want.nbytes()), 0) << p.spec.name;
}

// Optimizer::step leaves every gradient at 0 (its pass zeroes them).
void expect_grad_zeroed(const model::Param& p) {
  for (int64_t i = 0; i < p.grad.numel(); ++i)
    ASSERT_EQ(p.grad.ptr<float>()[i], 0.f) << p.spec.name << " grad[" << i << "]";
}

io::OptimizerConfig adamw_cfg() {
  io::OptimizerConfig c;
  c.name = "adamw";
  c.lr = 3e-3;
  c.weight_decay = 0.1;
  c.beta1 = 0.9;
  c.beta2 = 0.95;
  c.eps = 1e-8;
  return c;
}

}  // namespace

TEST(Optimizer, AdamWMatchesDoublePrecisionReference) {
  Model md = make_model(DType::bf16);
  auto params = md.ptrs();
  io::OptimizerConfig c = adamw_cfg();
  train::Optimizer opt(c, params);
  std::vector<dt::testing::RefAdamW> ref;
  for (auto* p : params) {
    auto v = dt::testing::to_doubles(p->master);
    ref.push_back({v, std::vector<double>(v.size()), std::vector<double>(v.size())});
  }
  train::LrSchedule sched(train::LrSchedule::Kind::cosine, c.lr, 2, 8, 0.1);
  const float clips[] = {1.f, 0.5f, 1.f, 0.25f, 1.f, 0.8f};
  for (int step = 0; step < 6; ++step) {
    const float lr = float(sched.lr(step));
    for (size_t i = 0; i < params.size(); ++i) {
      // Gradients of mixed scales, so that m/sqrt(v) is not just sign(g).
      Tensor g = dt::testing::randn_host(params[i]->grad.shape(), step % 2 ? 1e-3f : 1.f);
      ops::copy(params[i]->grad, g);
      const double wd = train::decays(params[i]->spec) ? c.weight_decay : 0.0;
      dt::testing::ref_adamw_step(ref[i], dt::testing::to_doubles(g), lr, float(c.beta1), float(c.beta2),
                                  float(c.eps), wd, step + 1, clips[step]);
    }
    opt.step(params, lr, clips[step]);
    EXPECT_EQ(opt.num_updates(), step + 1);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    SCOPED_TRACE(params[i]->spec.name);
    EXPECT_TRUE(close_rel(dt::testing::to_doubles(params[i]->master), ref[i].p, 1e-6));
    EXPECT_TRUE(close_rel(dt::testing::to_doubles(opt.state()[i].m), ref[i].m, 1e-6));
    EXPECT_TRUE(close_rel(dt::testing::to_doubles(opt.state()[i].v), ref[i].v, 1e-6));
    expect_compute_refreshed(*params[i]);
    expect_grad_zeroed(*params[i]);
  }
}

TEST(Optimizer, SgdMatchesDoublePrecisionReference) {
  Model md = make_model(DType::bf16);
  auto params = md.ptrs();
  io::OptimizerConfig c;
  c.name = "sgd";
  c.lr = 0.05;
  c.weight_decay = 0.01;
  train::Optimizer opt(c, params);
  std::vector<std::vector<double>> ref;
  for (auto* p : params) ref.push_back(dt::testing::to_doubles(p->master));
  for (int step = 0; step < 5; ++step) {
    const float clip = step == 2 ? 0.3f : 1.f;
    for (size_t i = 0; i < params.size(); ++i) {
      Tensor g = dt::testing::randn_host(params[i]->grad.shape(), 0.1f);
      ops::copy(params[i]->grad, g);
      dt::testing::ref_sgd_step(ref[i], dt::testing::to_doubles(g), float(c.lr),
                                train::decays(params[i]->spec) ? float(c.weight_decay) : 0.f, clip);
    }
    opt.step(params, float(c.lr), clip);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    SCOPED_TRACE(params[i]->spec.name);
    EXPECT_TRUE(close_rel(dt::testing::to_doubles(params[i]->master), ref[i], 1e-6));
    expect_compute_refreshed(*params[i]);
    expect_grad_zeroed(*params[i]);
  }
}

TEST(Optimizer, WeightDecayRulePerParameterKind) {
  const std::pair<const char*, bool> want[] = {
      {"model.layers.0.linear_attn.in_proj_qkv.weight", true}, {"model.layers.0.linear_attn.in_proj_z.weight", true},
      {"model.layers.0.linear_attn.in_proj_b.weight", true},   {"model.layers.0.linear_attn.in_proj_a.weight", true},
      {"model.layers.0.linear_attn.conv1d.weight", true},      {"model.layers.0.linear_attn.dt_bias", false},
      {"model.layers.0.linear_attn.A_log", false},             {"model.layers.0.linear_attn.norm.weight", false},
      {"model.layers.0.linear_attn.out_proj.weight", true},    {"model.layers.1.self_attn.q_proj.weight", true},
      {"model.layers.1.self_attn.o_proj.weight", true},        {"model.layers.1.self_attn.q_norm.weight", false},
      {"model.layers.1.self_attn.k_norm.weight", false},       {"model.layers.0.input_layernorm.weight", false},
      {"model.norm.weight", false}};
  auto specs = dt::testing::small_model_specs();
  for (const auto& [name, decayed] : want) {
    auto it = std::find_if(specs.begin(), specs.end(), [&](const model::ParamSpec& s) { return s.name == name; });
    ASSERT_NE(it, specs.end()) << name;
    EXPECT_EQ(train::decays(*it), decayed) << name;
  }
  // Behaviour: zero gradients, so the Adam term is 0 / (0 + eps) = 0 and only decay moves p.
  for (const char* kind : {"adamw", "sgd"}) {
    SCOPED_TRACE(kind);
    Model md = make_model(DType::f32);
    auto params = md.ptrs();
    io::OptimizerConfig c = adamw_cfg();
    c.name = kind;
    c.weight_decay = 0.5;
    std::vector<Tensor> before;
    for (auto* p : params) before.push_back(ops::to_host(p->master));
    train::Optimizer opt(c, params);
    opt.step(params, 0.1f, 1.f);
    for (size_t i = 0; i < params.size(); ++i) {
      const float f = train::decays(params[i]->spec) ? 1.f - 0.1f * 0.5f : 1.f;
      for (int64_t j = 0; j < before[i].numel(); ++j) {
        const float b = before[i].ptr<float>()[j], a = params[i]->master.ptr<float>()[j];
        if (f == 1.f) ASSERT_EQ(a, b) << params[i]->spec.name << " changed without decay";
        else ASSERT_NEAR(a, b * f, 3e-7f * std::fabs(b) + 1e-12f) << params[i]->spec.name;
      }
    }
  }
}

TEST(Optimizer, BiasCorrectionMakesEarlyStepsLrSized) {
  // With a constant gradient g and no decay, the bias-corrected moments are exactly g and g^2
  // at every step, so each update is -lr * g / (|g| + eps): lr * sign(g) up to eps.
  const int64_t n = 257;
  Tensor p = dt::testing::rand_host(Shape{n});
  Tensor g = dt::testing::rand_host(Shape{n}, 0.01f, 2.f);
  for (int64_t i = 0; i < n; i += 2) g.ptr<float>()[i] = -g.ptr<float>()[i];
  Tensor m = Tensor::zeros(Shape{n}, DType::f32), v = Tensor::zeros(Shape{n}, DType::f32);
  const float lr = 1e-2f;
  for (int64_t t = 1; t <= 3; ++t) {
    Tensor before = ops::to_host(p);
    ops::adamw_update(p, m, v, g, ops::AdamWArgs{lr, 0.9f, 0.999f, 1e-8f, 0.f, t, 1.f});
    for (int64_t i = 0; i < n; ++i) {
      const double want = -lr * std::copysign(1.0, double(g.ptr<float>()[i]));
      ASSERT_NEAR(double(p.ptr<float>()[i]) - before.ptr<float>()[i], want, 1e-6) << "t " << t << " i " << i;
    }
  }
  // Without bias correction the first step would be lr * (1 - beta1) / sqrt(1 - beta2) ~ 3.2 lr.
}

// The fused writes (compute copy, gradient reset) leave p, m, v as the plain update makes them
// and give the bits of the separate passes (ops::copy's cast, a zero fill). Sizes with n % 4
// tails and a single element; views at offset 0, all at 1 (off the 16-byte boundary together)
// and at mixed offsets (the CUDA kernel's vector path cannot run; here the CPU reference is the
// same loop, the cases are shared with the CUDA test).
TEST(Optimizer, FusedWritesMatchSeparatePasses) {
  const std::array<int64_t, 5> offsets[] = {{0, 0, 0, 0, 0}, {1, 1, 1, 1, 1}, {1, 0, 2, 3, 1}};
  for (dt::testing::UpdateKind k : {dt::testing::UpdateKind::adamw, dt::testing::UpdateKind::sgd})
    for (int64_t n : {int64_t(1), int64_t(3), int64_t(1003), int64_t(1000003)})
      for (const auto& off : offsets)
        for (DType cdt : {DType::bf16, DType::f16, DType::f32}) {
          if (n > 1003 && cdt != DType::bf16) continue;  // the large size with the copy the trainer keeps
          SCOPED_TRACE(fmt::format("{} n {} offsets {} {} {} {} {} compute {}", dt::testing::kind_name(k), n, off[0],
                                   off[1], off[2], off[3], off[4], dtype_name(cdt)));
          dt::testing::UpdateCase fused = dt::testing::make_update_case(n, cdt, off);
          dt::testing::UpdateCase sep = dt::testing::clone_to(fused, Device::cpu());
          dt::testing::apply_update(k, fused, true);
          dt::testing::apply_update(k, sep, false);
          // Whole buffers: the views agree, and nothing outside them was written.
          for (size_t j = 0; j < 5; ++j)
            EXPECT_TRUE(dt::testing::same_bits(fused.buf[j], sep.buf[j])) << "buffer of operand " << j;
          for (int64_t i = 0; i < n; ++i) ASSERT_EQ(fused.g().ptr<float>()[i], 0.f) << "g[" << i << "]";
        }
}

TEST(Optimizer, FusedWritesChecks) {
  const int64_t n = 8;
  Tensor p = Tensor::zeros(Shape{n}, DType::f32), m = Tensor::zeros(Shape{n}, DType::f32);
  Tensor v = Tensor::zeros(Shape{n}, DType::f32), g = Tensor::zeros(Shape{n}, DType::f32);
  Tensor c = Tensor::zeros(Shape{n - 1}, DType::bf16), ci = Tensor::zeros(Shape{n}, DType::i32);
  const ops::AdamWArgs a{1e-3f, 0.9f, 0.95f, 1e-8f, 0.f, 1, 1.f};
  EXPECT_DEATH(ops::adamw_update(p, m, v, g, a, ops::UpdateWrites{c, true}), "adamw_update: compute must have p's shape");
  EXPECT_DEATH(ops::sgd_update(p, g, ops::SgdArgs{}, ops::UpdateWrites{ci, false}),
               "sgd_update: compute must be bf16, f16 or f32");
  EXPECT_DEATH(ops::adamw_update(p, m, v, g, a, ops::UpdateWrites{g.view().as_dtype(DType::f32), true}),
               "adamw_update: compute must not overlap p, m, v or g");
  Tensor v7 = Tensor::zeros(Shape{n - 1}, DType::f32);
  EXPECT_DEATH(ops::adamw_update(p, m, v7, g, a), "adamw_update v: shapes differ");
}

// adamw_update_multi on the CPU: each item gets its own weight decay (a.weight_decay is not used)
// and the bits of adamw_update with it; an empty item is skipped; each item is checked, and the
// message names it.
TEST(Optimizer, AdamWMultiEqualsPerItemAndChecksEachItem) {
  const int64_t sizes[] = {5, 0, 1000, 3};
  const float wds[] = {0.f, 0.1f, 0.3f, 0.05f};
  std::vector<dt::testing::UpdateCase> per, multi;
  for (int64_t n : sizes) {
    per.push_back(dt::testing::make_update_case(n, DType::bf16, {0, 0, 0, 0, 0}));
    multi.push_back(per.back());
    for (size_t k = 0; k < 5; ++k) {  // a copy of the same bytes
      multi.back().buf[k] = Tensor::empty(per.back().buf[k].shape(), per.back().buf[k].dtype());
      ops::copy(multi.back().buf[k], per.back().buf[k]);
    }
    dt::testing::set_views(multi.back());
  }
  const ops::AdamWArgs a{2e-3f, 0.9f, 0.95f, 1e-8f, 0.7f /* not used */, 2, 0.5f};
  std::vector<ops::AdamWItem> items;
  for (size_t i = 0; i < per.size(); ++i) {
    ops::AdamWArgs ai = a;
    ai.weight_decay = wds[i];
    ops::adamw_update(per[i].p(), per[i].m(), per[i].v(), per[i].g(), ai, ops::UpdateWrites{per[i].c(), true});
    items.push_back({multi[i].p(), multi[i].m(), multi[i].v(), multi[i].g(), ops::UpdateWrites{multi[i].c(), true},
                     wds[i]});
  }
  ops::adamw_update_multi(items, a);
  for (size_t i = 0; i < per.size(); ++i)
    for (size_t j = 0; j < 5; ++j)
      EXPECT_TRUE(dt::testing::same_bits(multi[i].buf[j], per[i].buf[j])) << "item " << i << " operand " << j;
  Tensor v7 = Tensor::zeros(Shape{sizes[2] - 1}, DType::f32);
  std::vector<ops::AdamWItem> bad = items;
  bad[2].v = v7;
  EXPECT_DEATH(ops::adamw_update_multi(bad, a), "adamw_update_multi item 2 v: shapes differ");
  ops::AdamWArgs a0 = a;
  a0.step = 0;
  EXPECT_DEATH(ops::adamw_update_multi(items, a0), "adamw_update_multi item 0: step is the 1-based update count");
}

TEST(Optimizer, GradNormAndClipSerial) {
  Model md = make_model(DType::f32);
  auto params = md.ptrs();
  double ref = 0;
  for (auto* p : params) {
    Tensor g = dt::testing::randn_host(p->grad.shape(), 0.5f);
    ops::copy(p->grad, g);
    for (double x : dt::testing::to_doubles(g)) ref += x * x;
  }
  ref = std::sqrt(ref);
  dist::ProcessGroups pg = serial_groups();
  const double norm = train::global_grad_norm(params, pg);
  EXPECT_NEAR(norm, ref, 1e-6 * ref);

  EXPECT_EQ(train::clip_coefficient(norm, 0.0), 1.f);         // clipping off
  EXPECT_EQ(train::clip_coefficient(norm, 10 * norm), 1.f);   // under the limit
  const float coef = train::clip_coefficient(norm, 0.25 * ref);
  EXPECT_NEAR(coef, 0.25, 1e-5);
  // SGD with lr 1 from p = 0 leaves p = -coef * g: its norm is the clip limit.
  io::OptimizerConfig c;
  c.name = "sgd";
  c.weight_decay = 0;
  for (auto* p : params) ops::fill(p->master, 0.0);
  train::Optimizer opt(c, params);
  opt.step(params, 1.f, coef);
  for (auto* p : params) ops::copy(p->grad, p->master);
  EXPECT_NEAR(train::global_grad_norm(params, pg), 0.25 * ref, 1e-5 * ref);
  train::zero_grads(params);
  EXPECT_EQ(train::global_grad_norm(params, pg), 0.0);
}

TEST(Optimizer, ConfigValidation) {
  io::OptimizerConfig c = adamw_cfg();
  EXPECT_EQ(train::Optimizer::validate(c), "");
  c.name = "adam";
  EXPECT_NE(train::Optimizer::validate(c).find("optimizer.name 'adam' is not one of adamw | sgd"), std::string::npos);
  c = adamw_cfg();
  c.beta2 = 1.0;
  EXPECT_NE(train::Optimizer::validate(c).find("optimizer.beta2"), std::string::npos);
  c = adamw_cfg();
  c.clip_grad = -1;
  EXPECT_NE(train::Optimizer::validate(c).find("optimizer.clip_grad"), std::string::npos);
}

TEST(LrSchedule, MatchesClosedForm) {
  const double base = 1e-3, ratio = 0.1, lo = base * ratio;
  const int64_t W = 10, N = 110;
  train::LrSchedule cos(train::LrSchedule::Kind::cosine, base, W, N, ratio);
  train::LrSchedule cst(train::LrSchedule::Kind::constant, base, W, N, ratio);
  for (int64_t s = 0; s < W; ++s) {
    EXPECT_DOUBLE_EQ(cos.lr(s), base * double(s + 1) / W) << s;
    EXPECT_DOUBLE_EQ(cst.lr(s), base * double(s + 1) / W) << s;
  }
  for (int64_t s = W; s < N + 20; ++s) {
    const double q = std::min(1.0, double(s - W) / double(N - W));
    EXPECT_NEAR(cos.lr(s), lo + (base - lo) * 0.5 * (1 + std::cos(std::numbers::pi * q)), 1e-15) << s;
    EXPECT_EQ(cst.lr(s), base) << s;
    if (s > W) EXPECT_LE(cos.lr(s), cos.lr(s - 1)) << s;
  }
  EXPECT_DOUBLE_EQ(cos.lr(W), base);
  EXPECT_NEAR(cos.lr(W + (N - W) / 2), 0.5 * (base + lo), 1e-15);
  EXPECT_DOUBLE_EQ(cos.lr(N), lo);
  EXPECT_DOUBLE_EQ(cos.lr(N + 1000), lo);
  // No warm-up: the first step uses the full lr.
  train::LrSchedule now(train::LrSchedule::Kind::cosine, base, 0, N, ratio);
  EXPECT_DOUBLE_EQ(now.lr(0), base);
  // From the config; and its checks.
  io::ScheduleConfig sc;
  sc.name = "constant";
  sc.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(train::LrSchedule(sc, 2.0, 100).lr(1), 1.0);
  sc.name = "linear";
  EXPECT_NE(train::LrSchedule::validate(sc, 100).find("schedule.name 'linear' is not one of constant | cosine"),
            std::string::npos);
  sc.name = "cosine";
  sc.warmup_steps = 200;
  EXPECT_NE(train::LrSchedule::validate(sc, 100).find("schedule.warmup_steps=200 exceeds train.steps=100"),
            std::string::npos);
}

TEST(StepGuard, SkipsNonFiniteAndStopsAfterKInARow) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  train::StepGuard g(3);
  EXPECT_TRUE(g.check(0, 2.5, 1.0).apply);
  auto v = g.check(1, nan, 1.0);  // NaN loss
  EXPECT_FALSE(v.apply);
  EXPECT_EQ(v.error, "");
  v = g.check(2, 2.4, inf);  // Inf grad norm
  EXPECT_FALSE(v.apply);
  EXPECT_EQ(g.in_a_row(), 2);
  EXPECT_TRUE(g.check(3, 2.3, 0.9).apply);  // a finite step resets the run
  EXPECT_EQ(g.in_a_row(), 0);
  EXPECT_EQ(g.skipped(), 2);
  EXPECT_FALSE(g.check(4, 2.3, nan).apply);
  EXPECT_EQ(g.check(5, -inf, 1.0).error, "");
  v = g.check(6, nan, nan);
  EXPECT_FALSE(v.apply);
  EXPECT_NE(v.error.find("step 6: 3 non-finite steps in a row"), std::string::npos) << v.error;
  EXPECT_NE(v.error.find("train.max_nonfinite_in_a_row=3"), std::string::npos) << v.error;
  EXPECT_EQ(g.skipped(), 5);
}
