// The training loop on the CPU backend: the same global batch gives the same loss curve under
// every (tp, cp, dp, sp) layout of the world size (grad_accum * dp held fixed and one
// data.pad_multiple for all, so every step packs and sees the same micro-batches), within fp32
// summation-order noise (rel. 1e-4); and on one rank
// the quickstart model's loss falls on the synthetic corpus.
#include <gtest/gtest.h>

#include <cmath>

#include "deltatron/data/synthetic.h"
#include "deltatron/dist/comm.h"
#include "deltatron/io/config.h"
#include "deltatron/train/trainer.h"
#include "test_util.h"

using namespace dt;

namespace {
std::string corpus() {
  static const std::string prefix = [] {
    std::string p = ::testing::TempDir() + "dt_trainer_corpus";
    auto world = dist::make_world(dist::Backend::mpi);
    if (world->rank() == 0) {
      std::string e = data::write_synthetic_corpus(p, 400, 99, 64);
      EXPECT_EQ(e, "");
    }
    world->barrier();
    return p;
  }();
  return prefix;
}

io::Config quickstart(std::vector<std::string> sets) {
  io::Config c;
  sets.push_back("data.prefix=" + corpus());
  sets.push_back("logging.metrics_jsonl=");
  sets.push_back("train.device=cpu");
  EXPECT_EQ(io::load_config(DT_SOURCE_DIR "/configs/quickstart.yaml", sets, &c), "");
  return c;
}

struct Layout {
  int tp, cp, dp;
  bool sp;
};
std::vector<Layout> layouts(int world) {
  if (world == 2) return {{1, 1, 2, false}, {2, 1, 1, false}, {2, 1, 1, true}, {1, 2, 1, false}};
  if (world == 4) return {{1, 1, 4, false}, {2, 2, 1, true}, {2, 1, 2, false}, {1, 2, 2, false}, {4, 1, 1, true}};
  return {};
}
}  // namespace

TEST(Trainer, LossCurvesAgreeAcrossLayouts) {
  const int world = dist::world_size();
  if (world == 1) GTEST_SKIP() << "needs mpirun -np 2 or 4";
  std::vector<double> ref;
  for (const Layout& L : layouts(world)) {
    SCOPED_TRACE(fmt::format("tp {} cp {} dp {} sp {}", L.tp, L.cp, L.dp, L.sp));
    io::Config c = quickstart({"parallel.tp=" + std::to_string(L.tp), "parallel.cp=" + std::to_string(L.cp),
                               "parallel.dp=" + std::to_string(L.dp), std::string("parallel.sp=") + (L.sp ? "true" : "false"),
                               "train.grad_accum=" + std::to_string(4 / L.dp), "train.steps=5", "data.pad_multiple=8",
                               "logging.log_interval=100"});
    std::vector<double> losses = train::run_training(c).losses;
    ASSERT_EQ(losses.size(), 5u);
    if (ref.empty()) {
      ref = losses;
      continue;
    }
    for (size_t i = 0; i < losses.size(); ++i)
      EXPECT_NEAR(losses[i], ref[i], 1e-4 * std::fabs(ref[i])) << "step " << i + 1;
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
