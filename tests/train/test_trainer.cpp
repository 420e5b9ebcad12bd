// The training loop on the CPU backend (fp32):
//  * 20-step loss curves of the quickstart model agree under every (tp, cp, dp, sp) layout of the
//    world size -- np 1: (1,1,1); np 2: (1,1,2), (2,1,1) +-SP, (1,2,1); np 4: (1,1,4), (2,2,1) +-SP,
//    (2,1,2) +-SP, (1,2,2), (4,1,1) SP -- with the same global batch (grad_accum * dp = 4 and one
//    data.pad_multiple, so every step packs and sees the same micro-batches): each within fp32
//    summation-order noise (rel. 1e-4) of tests/golden/trainer_quickstart_20.txt, the losses and
//    grad norms of the serial layout (torchtitan's "step loss" lines; regenerate it with
//    DT_WRITE_GOLDEN=1 build/tests/test_trainer after a change that moves the losses on purpose).
//  * On one rank the quickstart model's loss falls on the synthetic corpus.
//  * The step metrics: tokens and model FLOPs of a step equal the packer's counts and the FLOP
//    model over the same micro-batches, computed here independently; the JSONL record of every
//    step carries every field, consistent with each other (docs/training.md).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <cstring>

#include "deltatron/core/allocator.h"
#include "deltatron/data/packer.h"
#include "deltatron/data/synthetic.h"
#include "deltatron/dist/comm.h"
#include "deltatron/io/config.h"
#include "deltatron/train/flops.h"
#include "deltatron/train/trainer.h"
#include "test_util.h"
#include "trainer_test_util.h"

using namespace dt;

namespace {
const char* kGolden = DT_SOURCE_DIR "/tests/golden/trainer_quickstart_20.txt";

std::string corpus() {
  // 2000 documents (~110k tokens): the 20 curve steps (~41k tokens) stay inside the first epoch,
  // whose end pads the micro-batch count to a multiple of dp (docs/data.md), so that the global
  // batch would differ between dp sizes there.
  static const std::string prefix = dt::testing::trainer_corpus("dt_trainer_corpus", 2000);
  return prefix;
}

io::Config quickstart(std::vector<std::string> sets) {
  io::Config c;
  sets.insert(sets.begin(), {"data.prefix=" + corpus(), "logging.metrics_jsonl=", "train.device=cpu"});
  EXPECT_EQ(io::load_config(DT_SOURCE_DIR "/configs/quickstart.yaml", sets, &c), "");
  return c;
}

struct Layout {
  int tp, cp, dp;
  bool sp;
};
std::vector<Layout> layouts(int world) {
  if (world == 1) return {{1, 1, 1, false}};
  if (world == 2) return {{1, 1, 2, false}, {2, 1, 1, false}, {2, 1, 1, true}, {1, 2, 1, false}};
  if (world == 4)
    return {{1, 1, 4, false}, {2, 2, 1, false}, {2, 2, 1, true}, {2, 1, 2, false},
            {2, 1, 2, true},  {1, 2, 2, false}, {4, 1, 1, true}, {1, 4, 1, false}};
  if (world == 8) return {{2, 2, 2, true}};  // issue 8's TP=2 x CP=2 x DP=2, on the CPU backend
  return {};
}

// The golden run's settings under a layout: 4 micro-batches of 512 tokens per step.
io::Config curve_config(const Layout& L) {
  return quickstart({"parallel.tp=" + std::to_string(L.tp), "parallel.cp=" + std::to_string(L.cp),
                     "parallel.dp=" + std::to_string(L.dp), std::string("parallel.sp=") + (L.sp ? "true" : "false"),
                     "train.grad_accum=" + std::to_string(4 / L.dp), "train.steps=20", "data.max_tokens=512",
                     "data.pad_multiple=8", "logging.log_interval=100"});
}

// `steps` steps of t: loss, grad norm, loss, grad norm, ...
std::vector<double> loss_and_norm_per_step(train::Trainer& t, int steps) {
  std::vector<double> v;
  for (int s = 0; s < steps; ++s) {
    const train::StepResult r = t.step();
    v.push_back(r.loss);
    v.push_back(r.grad_norm);
  }
  return v;
}

// The golden curve: "step loss grad_norm" per line.
struct Golden {
  std::vector<double> loss, grad_norm;
};
Golden read_golden() {
  Golden g;
  std::ifstream f(kGolden);
  int64_t step = 0;
  double loss = 0, norm = 0;
  while (f >> step >> loss >> norm) {
    EXPECT_EQ(step, int64_t(g.loss.size()) + 1) << kGolden;
    g.loss.push_back(loss);
    g.grad_norm.push_back(norm);
  }
  return g;
}
}  // namespace

TEST(Trainer, LossCurvesMatchGoldenUnderEveryLayout) {
  const int world = dist::world_size();
  if (layouts(world).empty()) GTEST_SKIP() << "runs at np 1, 2, 4 or 8";
  if (world == 1 && std::getenv("DT_WRITE_GOLDEN")) {
    const train::TrainResult r = train::run_training(curve_config({1, 1, 1, false}));
    std::ofstream f(kGolden, std::ios::trunc);
    for (size_t i = 0; i < r.losses.size(); ++i) f << fmt::format("{} {:.9g} {:.9g}\n", i + 1, r.losses[i], r.grad_norms[i]);
    GTEST_SKIP() << "wrote " << kGolden;
  }
  const Golden golden = read_golden();
  ASSERT_EQ(golden.loss.size(), 20u) << kGolden;
  for (const Layout& L : layouts(world)) {
    SCOPED_TRACE(fmt::format("tp {} cp {} dp {} sp {}", L.tp, L.cp, L.dp, L.sp));
    const train::TrainResult r = train::run_training(curve_config(L));
    ASSERT_EQ(r.losses.size(), golden.loss.size());
    ASSERT_EQ(r.grad_norms.size(), golden.grad_norm.size());
    // The grad norm too: AdamW and clipping are blind to a gradient's scale, so the loss curve
    // alone would not see a gradient summed twice over a group (or missing a 1/dp).
    for (size_t i = 0; i < r.losses.size(); ++i) {
      EXPECT_NEAR(r.losses[i], golden.loss[i], 1e-4 * std::fabs(golden.loss[i])) << "step " << i + 1;
      EXPECT_NEAR(r.grad_norms[i], golden.grad_norm[i], 1e-4 * std::fabs(golden.grad_norm[i])) << "step " << i + 1;
    }
  }
}

// gdn.cp_comm = auto: all_gather exactly when it moves fewer bytes (docs/parallelism.md's table).
TEST(Trainer, GdnCpCommAutoPicksFewerBytes) {
  io::ModelConfig bench;  // bench-0.8b's GDN: hidden 1024, Hk = Hv = 16, dk = dv = 128
  bench.hidden_size = 1024;
  bench.linear_num_key_heads = bench.linear_num_value_heads = 16;
  bench.linear_key_head_dim = bench.linear_value_head_dim = 128;
  io::ModelConfig layer = bench;  // bench/gdn_layer: hidden 2048, Hv 32
  layer.hidden_size = 2048;
  layer.linear_num_value_heads = 32;
  using layers::GdnCpComm;
  EXPECT_EQ(train::gdn_cp_comm("auto", bench, 1, 1), GdnCpComm::all_to_all);  // no CP: nothing to move
  EXPECT_EQ(train::gdn_cp_comm("auto", bench, 1, 2), GdnCpComm::all_gather);  // 10272 > 4096 (ratio 2.5)
  EXPECT_EQ(train::gdn_cp_comm("auto", bench, 1, 4), GdnCpComm::all_gather);  // 10272 > 8192 (1.25)
  EXPECT_EQ(train::gdn_cp_comm("auto", bench, 2, 4), GdnCpComm::all_to_all);  // 5136 < 8192
  EXPECT_EQ(train::gdn_cp_comm("auto", layer, 1, 2), GdnCpComm::all_gather);  // 16448 > 8192 (2.0)
  EXPECT_EQ(train::gdn_cp_comm("auto", layer, 4, 2), GdnCpComm::all_to_all);  // 4112 < 8192
  EXPECT_EQ(train::gdn_cp_comm("auto", layer, 1, 4), GdnCpComm::all_gather);  // 16448 > 16384: just over
  io::ModelConfig tie = bench;  // Hk = Hv = 8, dk = dv = 102: 2*816 + 2*816 + 16 + 816 = 4096 = 2*2*1024
  tie.linear_num_key_heads = tie.linear_num_value_heads = 8;
  tie.linear_key_head_dim = tie.linear_value_head_dim = 102;
  EXPECT_EQ(train::gdn_cp_comm("auto", tie, 1, 2), GdnCpComm::all_to_all);  // a tie keeps the smaller saved input
  EXPECT_EQ(train::gdn_cp_comm("all_to_all", bench, 1, 2), GdnCpComm::all_to_all);
  EXPECT_EQ(train::gdn_cp_comm("all_gather", bench, 2, 4), GdnCpComm::all_gather);
}

// A non-finite step is skipped: the weights (fp32 masters) stay as they were, the gradients are
// zeroed for the next step (the fused optimizer pass that would zero them did not run), and it is
// counted. Poisoned with a NaN weight, the loss of the next step is NaN.
TEST(Trainer, SkippedStepLeavesWeightsAndZeroesGrads) {
  if (dist::world_size() != 1) GTEST_SKIP() << "single-rank test";
  io::Config c = curve_config({1, 1, 1, false});
  c.train.steps = 3;
  train::Trainer t(c);
  ASSERT_TRUE(t.step().applied);
  model::Param& p0 = *t.params()[0];
  p0.master.ptr<float>()[0] = std::nanf("");
  model::refresh_compute(p0, t.stream());
  std::vector<std::vector<float>> before;
  for (const model::Param* p : t.params())
    before.emplace_back(p->master.ptr<float>(), p->master.ptr<float>() + p->master.numel());
  const train::StepResult r = t.step();
  EXPECT_FALSE(r.applied);
  EXPECT_FALSE(std::isfinite(r.loss));
  for (size_t i = 0; i < t.params().size(); ++i) {
    const model::Param& p = *t.params()[i];
    EXPECT_EQ(std::memcmp(before[i].data(), p.master.ptr<float>(), before[i].size() * 4), 0) << p.spec.name;
    for (int64_t k = 0; k < p.grad.numel(); ++k)
      ASSERT_EQ(p.grad.ptr<float>()[k], 0.f) << p.spec.name << " element " << k;
  }
}

// The GDN CP settings reach the layers (RunCtx) and train alike under CP = 2: the per-sequence
// all-to-all gives the fused one's losses and grad norms bit for bit; the all-gather scheme gives
// them up to fp32 summation order, within 1e-6 relative (measured: losses bitwise, grad norms
// 4e-8 apart). The layer tests compare the schemes directly.
TEST(Trainer, GdnCpSchemesTrainAlike) {
  if (dist::world_size() != 2) GTEST_SKIP() << "runs at np 2 (cp 2)";
  struct Run {
    const char* a2a;
    const char* comm;
  };
  const Run runs[3] = {{"fused", "all_to_all"}, {"per_sequence", "all_to_all"}, {"fused", "all_gather"}};
  std::vector<double> values[3];  // loss, grad norm per step
  for (int i = 0; i < 3; ++i) {
    io::Config c = curve_config({1, 2, 1, false});
    c.train.steps = 3;
    c.gdn.cp_a2a = runs[i].a2a;
    c.gdn.cp_comm = runs[i].comm;
    train::Trainer t(c);
    EXPECT_EQ(t.run_ctx().cp_a2a, i == 1 ? ops::CpA2aImpl::per_sequence : ops::CpA2aImpl::fused);
    EXPECT_EQ(t.run_ctx().gdn_cp_comm, i == 2 ? layers::GdnCpComm::all_gather : layers::GdnCpComm::all_to_all);
    values[i] = loss_and_norm_per_step(t, 3);
  }
  EXPECT_EQ(values[0], values[1]) << "per_sequence vs fused all-to-all";
  for (size_t k = 0; k < values[0].size(); ++k)
    EXPECT_NEAR(values[2][k], values[0][k], 1e-6 * std::fabs(values[0][k]))
        << "all_gather: " << (k % 2 ? "grad norm" : "loss") << " at step " << k / 2 + 1;
}

// train.overlap_grad_reduce changes when the gradient sums run, not what they compute: 3 steps
// with and without it give the same losses and grad norms bit for bit, under dp 2 with
// gradient accumulation (only the last micro-batch starts the reductions) and tp 2 + SP (the
// TP sums of the replicated norms come first).
TEST(Trainer, OverlappedGradReductionIsBitwiseTheSame) {
  if (dist::world_size() != 2) GTEST_SKIP() << "runs at np 2";
  for (const Layout& L : {Layout{1, 1, 2, false}, Layout{2, 1, 1, true}}) {
    SCOPED_TRACE(fmt::format("tp {} cp {} dp {} sp {}", L.tp, L.cp, L.dp, L.sp));
    std::vector<double> values[2];  // loss, grad norm per step
    for (int i = 0; i < 2; ++i) {
      io::Config c = curve_config(L);
      c.train.steps = 3;
      c.train.overlap_grad_reduce = i == 1;
      train::Trainer t(c);
      values[i] = loss_and_norm_per_step(t, 3);
    }
    EXPECT_EQ(values[0], values[1]);
  }
}

// gdn.recompute_elementwise and gdn.recompute_v, through the config: recomputing all, all but v,
// or nothing trains the same curve, bit for bit (the layer harness checks each layer's bits),
// and each keeps more at its peak than the one before, so the keys reach the layers. A layout
// with CP, where the rebuild runs on each rank's channel slices, at np 2.
TEST(Trainer, GdnRecomputeSettingsTrainTheSameBits) {
  if (dist::world_size() != 2) GTEST_SKIP() << "runs at np 2";
  std::vector<double> values[3];  // loss, grad norm per step
  int64_t peak[3];                // host bytes in use at the steps' peak
  for (int i = 0; i < 3; ++i) {
    io::Config c = curve_config({1, 2, 1, false});
    c.train.steps = 3;
    c.gdn.recompute_elementwise = i < 2;
    c.gdn.recompute_v = i == 0;
    train::Trainer t(c);
    host_allocator().reset_peak();
    values[i] = loss_and_norm_per_step(t, 3);
    peak[i] = host_allocator().stats().peak_bytes;
  }
  EXPECT_EQ(values[1], values[0]) << "gdn.recompute_v=false";
  EXPECT_EQ(values[2], values[0]) << "gdn.recompute_elementwise=false";
  EXPECT_LT(peak[0], peak[1]) << "gdn.recompute_v=false keeps v";
  EXPECT_LT(peak[1], peak[2]) << "gdn.recompute_elementwise=false keeps q, k too";
}

// train.overlap_embedding_reduce: the embedding's dp x cp sum starts after the last forward and
// the last backward's rows are gathered and added after it. The same sums in another order:
// losses and grad norms within 1e-6 of the in-order run over 3 steps (dp with accumulation, cp,
// tp + SP with dp), and the embedding replicas bitwise equal on every rank afterwards (tp 1:
// every rank holds the whole table).
TEST(Trainer, OverlappedEmbeddingReductionMatches) {
  const int world = dist::world_size();
  std::vector<Layout> ls;
  if (world == 2) ls = {{1, 1, 2, false}, {1, 2, 1, false}};
  if (world == 4) ls = {{1, 2, 2, false}, {2, 1, 2, true}};
  if (ls.empty()) GTEST_SKIP() << "runs at np 2 and 4";
  auto world_comm = dist::make_world(dist::Backend::mpi);
  for (const Layout& L : ls) {
    SCOPED_TRACE(fmt::format("tp {} cp {} dp {} sp {}", L.tp, L.cp, L.dp, L.sp));
    std::vector<double> values[2];  // loss, grad norm per step
    for (int i = 0; i < 2; ++i) {
      io::Config c = curve_config(L);
      c.train.steps = 3;
      c.train.overlap_grad_reduce = true;
      c.train.overlap_embedding_reduce = i == 1;
      train::Trainer t(c);
      values[i] = loss_and_norm_per_step(t, 3);
      if (i == 1 && L.tp == 1) {
        // An FNV-1a hash of the table's bits, its min and max over the ranks: equal replicas.
        const TensorView w = t.model().embedding().weight().master.view();
        uint64_t h = 1469598103934665603ull;
        const auto* b = static_cast<const unsigned char*>(w.data);
        for (size_t k = 0; k < size_t(w.numel()) * sizeof(float); ++k) h = (h ^ b[k]) * 1099511628211ull;
        Tensor mm = Tensor::empty(Shape{2}, DType::i64);
        mm.ptr<int64_t>()[0] = int64_t(h >> 1), mm.ptr<int64_t>()[1] = -int64_t(h >> 1);
        world_comm->all_reduce(mm, dist::ReduceOp::max);
        EXPECT_EQ(mm.ptr<int64_t>()[0], -mm.ptr<int64_t>()[1]) << "embedding replicas differ across ranks";
      }
    }
    ASSERT_EQ(values[0].size(), values[1].size());
    for (size_t k = 0; k < values[0].size(); ++k)
      EXPECT_NEAR(values[1][k], values[0][k], 1e-6 * std::fabs(values[0][k]))
          << (k % 2 ? "grad norm" : "loss") << " at step " << k / 2 + 1;
  }
}

TEST(Trainer, QuickstartLossFalls) {
  if (dist::world_size() != 1) GTEST_SKIP() << "single-process test";
  io::Config c = quickstart({"train.steps=60", "logging.log_interval=100"});
  std::vector<double> l = train::run_training(c).losses;
  ASSERT_EQ(l.size(), 60u);
  double first = (l[0] + l[1] + l[2]) / 3, last = (l[57] + l[58] + l[59]) / 3;
  EXPECT_LT(last, first - 0.05) << "first " << first << " last " << last;
  for (double x : l) EXPECT_TRUE(std::isfinite(x));
}

TEST(Trainer, StepCountsTokensAndFlopsOfTheGlobalBatch) {
  // Whatever the layout, a step's tokens and FLOPs are those of the grad_accum * dp micro-batches
  // of the global batch: here recounted from a loader of the same config at dp = 1.
  const int world = dist::world_size();
  const Layout L = world == 1 ? Layout{1, 1, 1, false} : world == 2 ? Layout{1, 2, 1, false} : Layout{2, 1, 2, true};
  io::Config c = curve_config(L);
  c.train.steps = 2;
  train::Trainer t(c);
  data::PackerConfig pc;
  pc.max_tokens = c.data.max_tokens;
  pc.pad_multiple = 8;
  pc.shuffle = c.data.shuffle;
  pc.seed = uint64_t(c.train.seed);
  pc.sp = L.sp ? L.tp : 1;
  pc.cp = L.cp;
  pc.dp = 1;
  data::IndexedDataset ds = data::IndexedDataset::open_or_die(corpus());
  data::PackedLoader serial(ds, pc, 0);
  for (int s = 0; s < 2; ++s) {
    int64_t tokens = 0;
    train::FlopCount want;
    // dp = 1 takes global micro-batches in order; a step of the layout covers the next 4 of them.
    for (int i = 0; i < 4; ++i) {
      data::MicroBatch mb = serial.next();
      tokens += mb.real_tokens();
      want += train::micro_batch_flops(c.model, mb.cu_seqlens);
    }
    train::StepResult r = t.step();
    EXPECT_EQ(r.step, s + 1);
    EXPECT_EQ(r.tokens, tokens);
    EXPECT_NEAR(r.flops.model(), want.model(), 8.0) << "rounded to whole FLOPs per part and micro-batch";
    EXPECT_GT(r.flops.gdn, 0);
    EXPECT_GT(r.flops.attention, 0);
    EXPECT_TRUE(std::isfinite(r.loss) && std::isfinite(r.grad_norm));
  }
}

TEST(Trainer, MetricsJsonlRecordsEveryStep) {
  const int world = dist::world_size();
  const std::string path = ::testing::TempDir() + fmt::format("dt_trainer_metrics_{}.jsonl", world);
  io::Config c = curve_config(layouts(world).empty() ? Layout{1, 1, world, false} : layouts(world).back());
  c.train.steps = 3;
  c.logging.metrics_jsonl = path;
  train::TrainResult res = train::run_training(c);
  if (dist::world_rank() != 0) return;  // rank 0 writes
  std::ifstream f(path);
  std::string line;
  int64_t n = 0;
  while (std::getline(f, line)) {
    SCOPED_TRACE(line);
    nlohmann::json j = nlohmann::json::parse(line);
    EXPECT_EQ(j["step"].get<int64_t>(), n + 1);
    EXPECT_NEAR(j["loss"].get<double>(), res.losses[size_t(n)], 1e-6);
    EXPECT_NEAR(j["grad_norm"].get<double>(), res.grad_norms[size_t(n)], 1e-6);
    const double ms = j["step_ms"].get<double>(), tokens = double(j["tokens"].get<int64_t>());
    EXPECT_GT(tokens, 0);
    EXPECT_NEAR(j["tokens_per_s"].get<double>(), tokens / (ms * 1e-3), 0.05 + 1e-3 * tokens / (ms * 1e-3));
    EXPECT_GT(j["tflops_per_gpu"].get<double>(), 0);
    EXPECT_TRUE(j["mfu"].is_null()) << "no MFU on the CPU";
    EXPECT_GT(j["peak_mem_bytes"].get<int64_t>(), 0);
    EXPECT_EQ(j["skipped"].get<int64_t>(), 0);
    EXPECT_GE(j["eta_s"].get<double>(), 0);
    ++n;
  }
  EXPECT_EQ(n, 3);
  std::remove(path.c_str());
}

// A run resumed from an earlier checkpoint appends to the JSONL: the records past that step (the
// first run went on after it) and a line a crash cut short are dropped first, so each step is
// recorded once, in order, with the resumed run's values (bit-exact resume: the same losses).
TEST(Trainer, MetricsJsonlOnResumeKeepsEachStepOnce) {
  const int world = dist::world_size();
  const std::string tag = fmt::format("dt_trainer_resume_jsonl_{}", world);
  const std::string path = ::testing::TempDir() + tag + ".jsonl", dir = ::testing::TempDir() + tag + "_ckpt";
  if (dist::world_rank() == 0) {
    std::filesystem::remove_all(dir);
    std::remove(path.c_str());
  }
  io::Config c = curve_config(layouts(world).empty() ? Layout{1, 1, world, false} : layouts(world).back());
  c.logging.metrics_jsonl = path;
  c.checkpoint.dir = dir;
  c.checkpoint.interval = 2;
  c.train.steps = 3;
  const train::TrainResult first = train::run_training(c);  // records 1..3, checkpoints 2 and 3
  if (dist::world_rank() == 0) std::ofstream(path, std::ios::app) << "{\"step\": 4, \"loss\": 3.9";  // torn
  c.checkpoint.load = dir + "/step_0000002";
  c.train.steps = 4;
  const train::TrainResult second = train::run_training(c);  // steps 3, 4
  ASSERT_EQ(second.losses.size(), 2u);
  EXPECT_EQ(second.losses[0], first.losses[2]);
  if (dist::world_rank() != 0) return;
  std::ifstream f(path);
  std::string line;
  std::vector<double> loss;
  while (std::getline(f, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);  // throws on a torn line
    EXPECT_EQ(j["step"].get<int64_t>(), int64_t(loss.size()) + 1) << line;
    loss.push_back(j["loss"].get<double>());
  }
  ASSERT_EQ(loss.size(), 4u);
  EXPECT_NEAR(loss[0], first.losses[0], 1e-6);
  EXPECT_NEAR(loss[2], second.losses[0], 1e-6);
  EXPECT_NEAR(loss[3], second.losses[1], 1e-6);
  std::remove(path.c_str());
  std::filesystem::remove_all(dir);
}
