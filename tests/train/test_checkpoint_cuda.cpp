// Checkpoints of parameters on the GPU (bf16 compute copies, fp32 masters and AdamW state on
// the device): after two AdamW steps the state is saved (device -> host), then loaded into a
// model initialised from another seed on the GPU and into one on the CPU. Exact: the masters,
// m and v equal the saved ones in every bit on both, the bf16 compute copies equal a fresh cast
// of the loaded masters, the update count is restored. One rank (gpu label; exits 77 without a
// GPU).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>

#include "deltatron/data/synthetic.h"
#include "deltatron/dist/comm.h"
#include "deltatron/io/config.h"
#include "deltatron/model/qwen35.h"
#include "deltatron/ops/basic.h"
#include "deltatron/train/checkpoint.h"
#include "deltatron/train/trainer.h"
#include "test_util.h"

using namespace dt;
namespace fs = std::filesystem;

namespace {

std::string tmp_path(const std::string& name) {
  return ::testing::TempDir() +
         fmt::format("dt_ckpt_cuda_{:08x}_{}", uint32_t(std::hash<std::string>{}(DT_SOURCE_DIR)), name);
}

// Parameters, optimizer and the rest of a TrainState on one device (one rank: tp = cp = dp = 1).
struct Rig {
  io::Config cfg;
  dist::ProcessGroups pg;
  data::IndexedDataset ds;
  data::PackerConfig pc;
  std::unique_ptr<data::PackedLoader> loader;
  std::vector<model::Param> storage;
  std::vector<model::Param*> params;
  std::unique_ptr<train::Optimizer> opt;
  std::unique_ptr<train::StepGuard> guard;

  Rig(const io::Config& c, Device dev, DType compute, uint64_t seed) : cfg(c) {
    dist::ParallelDims dims{1, 1, 1};
    EXPECT_EQ(dims.resolve(1), "");
    pg = dist::ProcessGroups::build(dims, dist::Backend::mpi);
    pc = train::packer_config(c, dims);
    ds = data::IndexedDataset::open_or_die(c.data.prefix);
    loader = std::make_unique<data::PackedLoader>(ds, pc, 0);
    for (const model::ParamSpec& s : model::Qwen35Model::param_specs(c.model, false))
      storage.push_back(model::make_param(s, 1, 0, seed, dev, compute));
    for (model::Param& p : storage) params.push_back(&p);
    opt = std::make_unique<train::Optimizer>(c.optimizer, params);
    guard = std::make_unique<train::StepGuard>(c.train.max_nonfinite_in_a_row);
  }
  train::TrainState st() { return {&cfg, &pg, params, opt.get(), guard.get(), loader.get(), &ds, pc, {}}; }
};

void expect_same_bits(const TensorView& got, const TensorView& want, const std::string& what) {
  Tensor g = ops::to_host(got), w = ops::to_host(want);
  ASSERT_EQ(g.nbytes(), w.nbytes()) << what;
  EXPECT_EQ(std::memcmp(g.data(), w.data(), g.nbytes()), 0) << what << " differs";
}

}  // namespace

TEST(CheckpointCuda, DeviceStateRoundTrip) {
  ASSERT_EQ(dist::world_size(), 1);
  const std::string prefix = tmp_path("corpus"), dir = tmp_path("dir");
  ASSERT_EQ(data::write_synthetic_corpus(prefix, 200, 99, 64), "");
  fs::remove_all(dir);
  io::Config cfg;
  ASSERT_EQ(io::load_config(DT_SOURCE_DIR "/configs/quickstart.yaml",
                            {"data.prefix=" + prefix, "checkpoint.dir=" + dir, "logging.metrics_jsonl="}, &cfg),
            "");

  Rig a(cfg, Device::cuda(0), DType::bf16, 1);
  for (int step = 0; step < 2; ++step) {  // non-trivial masters, m and v
    for (size_t i = 0; i < a.params.size(); ++i)
      ops::rng_normal(a.params[i]->grad, 77 + uint64_t(step), i, 0.f, 1e-2f, ops::RngSlice::whole(a.params[i]->grad));
    a.opt->step(a.params, 1e-2f, 1.f);
  }
  a.guard->restore(3, 1);
  ASSERT_EQ(train::save_checkpoint(a.st(), 2), "");

  Rig gpu(cfg, Device::cuda(0), DType::bf16, 2), cpu(cfg, Device::cpu(), DType::f32, 3);
  for (Rig* r : {&gpu, &cpu}) {
    SCOPED_TRACE(r == &gpu ? "into the GPU" : "into the CPU");
    int64_t step = -1;
    ASSERT_EQ(train::load_checkpoint(dir + "/" + train::step_dir_name(2), r->st(), &step), "");
    EXPECT_EQ(step, 2);
    EXPECT_EQ(r->opt->num_updates(), 2);
    EXPECT_EQ(r->guard->skipped(), 3);
    EXPECT_EQ(r->guard->in_a_row(), 1);
    for (size_t i = 0; i < a.params.size(); ++i) {
      const std::string& name = a.params[i]->spec.name;
      expect_same_bits(r->params[i]->master, a.params[i]->master, name);
      expect_same_bits(r->opt->state()[i].m, a.opt->state()[i].m, "m of " + name);
      expect_same_bits(r->opt->state()[i].v, a.opt->state()[i].v, "v of " + name);
      if (r->params[i]->compute.defined()) {
        Tensor cast = Tensor::empty(r->params[i]->master.shape(), DType::bf16, r->params[i]->master.device());
        ops::copy(cast, r->params[i]->master);
        expect_same_bits(r->params[i]->compute, cast, "compute copy of " + name);
      }
    }
  }
}
