// The training loop on the CUDA backend (gpu label; skipped without a GPU) against the fp32 CPU
// backend computed in the same test, on the quickstart model and on its GDN-only variant (every
// layer linear_attention: runs without the attention kernels).
//  * 1 GPU: 50 bf16 steps within 2% (rel., every step) of the fp32 CPU losses; the GDN-only model
//    in fp32 on the GPU within 1e-3 of the CPU over 20 steps (fp32 GEMMs are true fp32: only the
//    summation order differs); the JSONL record carries tokens/s, TFLOP/s, peak memory and, on a
//    GPU with a known peak, MFU.
//  * mpirun -np 2 (2 GPUs): TP = 2 (with and without SP) and CP = 2 (both gdn.cp_comm schemes),
//    bf16, 50 steps, within 2% of DP = 2 on the same GPUs -- each GPU running whole micro-batches
//    exactly as one GPU does (only the fp32 gradient sum's order differs from 1 GPU with
//    grad_accum 2) -- and of the fp32 CPU.
//  * mpirun -np 4 / -np 8 (issue 8): TP = 2 x CP = 2 (+ SP), TP = 4 + SP and CP = 4 on 4 GPUs,
//    TP = 2 + SP x CP = 2 x DP = 2 on 8, bf16, 50 steps, within 2% of DP = world on the same GPUs
//    (one GPU per micro-batch, the same global batch through grad_accum).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <fstream>

#include "deltatron/data/synthetic.h"
#include "deltatron/dist/comm.h"
#include "deltatron/io/config.h"
#include "deltatron/train/flops.h"
#include "deltatron/train/metrics.h"
#include "deltatron/train/trainer.h"
#include "test_util.h"
#include "trainer_test_util.h"

using namespace dt;

namespace {
std::string corpus() {
  static const std::string prefix = dt::testing::trainer_corpus("dt_trainer_cuda_corpus", 1000);
  return prefix;
}

io::Config quickstart(bool gdn_only, std::vector<std::string> sets) {
  io::Config c;
  sets.insert(sets.begin(), {"data.prefix=" + corpus(), "logging.metrics_jsonl=", "logging.log_interval=10"});
  EXPECT_EQ(io::load_config(DT_SOURCE_DIR "/configs/quickstart.yaml", sets, &c), "");
  if (gdn_only) c.model.layer_types.assign(size_t(c.model.num_hidden_layers), "linear_attention");
  return c;
}

std::vector<double> losses(bool gdn_only, std::vector<std::string> sets) {
  return train::run_training(quickstart(gdn_only, std::move(sets))).losses;
}

// 50 bf16 steps under one layout, `micro` micro-batches per step (grad_accum = micro / dp), so
// every layout of a comparison sees the same global batch.
std::vector<double> layout_losses(bool gdn_only, const std::string& device, int micro, int tp, int cp, int dp,
                                  bool sp, const char* comm = "auto") {
  return losses(gdn_only, {"train.device=" + device, "train.precision=bf16", "train.steps=50",
                           "parallel.tp=" + std::to_string(tp), "parallel.cp=" + std::to_string(cp),
                           "parallel.dp=" + std::to_string(dp), std::string("parallel.sp=") + (sp ? "true" : "false"),
                           "train.grad_accum=" + std::to_string(micro / dp), "data.pad_multiple=8",
                           std::string("gdn.cp_comm=") + comm});
}

void expect_curves_close(const std::vector<double>& got, const std::vector<double>& ref, double rel,
                         const char* what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " step " << i + 1;
    EXPECT_NEAR(got[i], ref[i], rel * std::fabs(ref[i])) << what << " step " << i + 1;
  }
}
}  // namespace

class TrainerCuda : public ::testing::TestWithParam<bool> {};  // param: GDN-only model

TEST_P(TrainerCuda, Bf16Within2PercentOfCpuFp32) {
  if (dist::world_size() != 1) GTEST_SKIP() << "single-GPU test";
  const bool gdn_only = GetParam();
  const std::string jsonl = ::testing::TempDir() + "dt_trainer_cuda.jsonl";
  std::vector<double> cpu = losses(gdn_only, {"train.device=cpu", "train.steps=50"});
  std::vector<double> gpu = losses(gdn_only, {"train.device=cuda", "train.precision=bf16", "train.steps=50",
                                              "logging.metrics_jsonl=" + jsonl});
  expect_curves_close(gpu, cpu, 0.02, "bf16 GPU vs fp32 CPU");
  EXPECT_LT(gpu.back(), gpu.front() - 0.05) << "the loss falls";

  std::ifstream f(jsonl);
  std::string line, last;
  int n = 0;
  while (std::getline(f, line)) last = line, ++n;
  ASSERT_EQ(n, 50);
  nlohmann::json j = nlohmann::json::parse(last);
  EXPECT_EQ(j["step"], 50);
  EXPECT_GT(j["tokens_per_s"].get<double>(), 0);
  EXPECT_GT(j["tflops_per_gpu"].get<double>(), 0);
  EXPECT_GT(j["peak_mem_bytes"].get<int64_t>(), 0);
  const bool known_peak = train::peak_tflops(train::device_name(Device::cuda(0)), true) > 0;
  EXPECT_EQ(!j["mfu"].is_null(), known_peak) << last;
}

TEST_P(TrainerCuda, Fp32MatchesCpu) {
  if (dist::world_size() != 1) GTEST_SKIP() << "single-GPU test";
  const bool gdn_only = GetParam();
  std::vector<double> cpu = losses(gdn_only, {"train.device=cpu", "train.steps=20"});
  std::vector<double> gpu = losses(gdn_only, {"train.device=cuda", "train.precision=fp32", "train.steps=20"});
  expect_curves_close(gpu, cpu, 1e-3, "fp32 GPU vs fp32 CPU");
}

TEST_P(TrainerCuda, TwoGpuLayoutsMatchOneGpuPerMicroBatch) {
  if (dist::world_size() != 2) GTEST_SKIP() << "runs under mpirun -np 2 (2 GPUs)";
  const bool gdn_only = GetParam();
  auto run = [&](const std::string& device, int tp, int cp, int dp, bool sp, const char* comm = "auto") {
    return layout_losses(gdn_only, device, 2, tp, cp, dp, sp, comm);
  };
  const std::vector<double> cpu = run("cpu", 1, 1, 2, false);
  const std::vector<double> one = run("cuda", 1, 1, 2, false);
  expect_curves_close(one, cpu, 0.02, "dp 2 bf16 vs fp32 CPU");
  struct L {
    int tp, cp;
    bool sp;
    const char* name;
    const char* comm = "auto";  // the quickstart's auto is all_gather under every CP layout
  };
  for (const L& l : {L{2, 1, false, "tp 2"}, L{2, 1, true, "tp 2 + sp"}, L{1, 2, false, "cp 2"},
                     L{1, 2, false, "cp 2 all_to_all", "all_to_all"}}) {
    SCOPED_TRACE(l.name);
    const std::vector<double> got = run("cuda", l.tp, l.cp, 1, l.sp, l.comm);
    expect_curves_close(got, one, 0.02, "vs one GPU per micro-batch");
    expect_curves_close(got, cpu, 0.02, "vs fp32 CPU");
  }
}

TEST_P(TrainerCuda, FourAndEightGpuLayoutsMatchOneGpuPerMicroBatch) {
  const int world = dist::world_size();
  if (world != 4 && world != 8) GTEST_SKIP() << "runs under mpirun -np 4 or -np 8 (one GPU per rank)";
  const bool gdn_only = GetParam();
  auto run = [&](int tp, int cp, int dp, bool sp) { return layout_losses(gdn_only, "cuda", world, tp, cp, dp, sp); };
  const std::vector<double> one = run(1, 1, world, false);
  struct L {
    int tp, cp, dp;
    bool sp;
    const char* name;
  };
  std::vector<L> layouts = {{2, 2, 1, true, "tp 2 + sp x cp 2"}, {4, 1, 1, true, "tp 4 + sp"}, {1, 4, 1, false, "cp 4"}};
  if (world == 8) layouts = {{2, 2, 2, true, "tp 2 + sp x cp 2 x dp 2"}};
  for (const L& l : layouts) {
    SCOPED_TRACE(l.name);
    expect_curves_close(run(l.tp, l.cp, l.dp, l.sp), one, 0.02, "vs one GPU per micro-batch");
  }
}

// train.overlap_grad_reduce on two GPUs: the dp x cp sums on the second stream give the curve of
// the in-order sums (NCCL sums the same tensors; rel. 1e-6 allows for a different algorithm
// choice), under dp 2 with accumulation and cp 2 (the backward's CP collectives overlap them).
TEST_P(TrainerCuda, OverlappedGradReductionMatches) {
  if (dist::world_size() != 2) GTEST_SKIP() << "runs under mpirun -np 2 (2 GPUs)";
  const bool gdn_only = GetParam();
  for (const char* layout : {"parallel.dp=2", "parallel.cp=2"}) {
    SCOPED_TRACE(layout);
    auto run = [&](bool overlap, bool embed = false) {
      return losses(gdn_only, {"train.device=cuda", "train.precision=bf16", "train.steps=10", layout,
                               "train.grad_accum=2", "data.pad_multiple=8",
                               std::string("train.overlap_grad_reduce=") + (overlap ? "true" : "false"),
                               std::string("train.overlap_embedding_reduce=") + (embed ? "true" : "false")});
    };
    const std::vector<double> in_order = run(false);
    expect_curves_close(run(true), in_order, 1e-6, "overlapped vs in-order gradient sums");
    // The embedding's sum in another order (fp32, ~1e-7 relative) may move a bf16 weight copy by
    // one ulp now and then: 1e-3 over 10 steps (not yet run on GPUs).
    expect_curves_close(run(true, true), in_order, 1e-3, "embedding sum under the backward vs in-order sums");
  }
}

INSTANTIATE_TEST_SUITE_P(Model, TrainerCuda, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "GdnOnly" : "Quickstart"; });
