// Checkpoints on the CPU backend (fp32), under mpirun np 1, 2 and 4, with the quickstart model
// on the synthetic corpus:
//   - bit-exact resume: N steps straight == k steps + save + a new run that loads (checkpoint.load,
//     and checkpoint.resume through `latest` after a simulated crash mid-save) + N-k steps:
//     losses and the final weights and AdamW state equal in every bit;
//   - resharding: a checkpoint saved under one (tp, cp, dp, sp) layout loads under another; the
//     next step's loss matches the saving layout's own next step (rel 1e-5), and so do the
//     weights after it (rel L2 1e-5, the global tensors reassembled from each layout's shards);
//   - errors (the same string on every rank): a flipped byte (SHA-256 mismatch naming the file
//     and both digests), a truncated or missing file, a missing metadata.json, a model key that
//     changes shapes, a data key that changes the data order, a dp that cannot continue the
//     global micro-batch stream;
//   - crash safety (a .tmp directory is never taken for a checkpoint; `latest` keeps naming the
//     previous complete one; with no `latest` at all, as a crash in the first save leaves it, resume
//     takes the newest complete step directory instead of starting fresh over it) and
//     checkpoint.keep_last;
//   - an unusable checkpoint.dir is an error on every rank at startup, not at the first save.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <functional>
#include <memory>

#include "deltatron/core/sha256.h"
#include "deltatron/data/synthetic.h"
#include "deltatron/dist/comm.h"
#include "deltatron/io/config.h"
#include "deltatron/io/safetensors.h"
#include "deltatron/model/qwen35.h"
#include "deltatron/train/checkpoint.h"
#include "deltatron/train/trainer.h"
#include "test_util.h"

using namespace dt;
namespace fs = std::filesystem;

namespace {

// Temporary paths unique per checkout and world size: other checkouts and the np entries may
// run at the same time on one machine.
std::string tmp_path(const std::string& name) {
  return ::testing::TempDir() + fmt::format("dt_ckpt_{:08x}_np{}_{}", uint32_t(std::hash<std::string>{}(DT_SOURCE_DIR)),
                                            dist::world_size(), name);
}

dist::Communicator& world() {
  static std::unique_ptr<dist::Communicator> w = dist::make_world(dist::Backend::mpi);
  return *w;
}

std::string corpus() {
  static const std::string prefix = [] {
    std::string p = tmp_path("corpus");
    if (dist::world_rank() == 0) {
      std::string e = data::write_synthetic_corpus(p, 400, 99, 64);
      EXPECT_EQ(e, "");
    }
    world().barrier();
    return p;
  }();
  return prefix;
}

// A fresh directory for one test.
std::string fresh_dir(const std::string& name) {
  const std::string d = tmp_path(name);
  if (dist::world_rank() == 0) {
    fs::remove_all(d);
    fs::create_directories(d);
  }
  world().barrier();
  return d;
}

struct Layout {
  int tp, cp, dp;
  bool sp;
  std::string str() const { return fmt::format("tp {} cp {} dp {} sp {}", tp, cp, dp, sp); }
};

// The quickstart model; the global batch (grad_accum x dp micro-batches) and the packing
// (data.pad_multiple 8) are the same under every layout of the world size.
io::Config quickstart(const Layout& L, std::vector<std::string> sets) {
  const int global_micro = dist::world_size() == 4 ? 4 : 2;
  std::vector<std::string> all = {"data.prefix=" + corpus(),
                                  "logging.metrics_jsonl=",
                                  "logging.log_interval=100",
                                  "train.device=cpu",
                                  "data.pad_multiple=8",
                                  "parallel.tp=" + std::to_string(L.tp),
                                  "parallel.cp=" + std::to_string(L.cp),
                                  "parallel.dp=" + std::to_string(L.dp),
                                  std::string("parallel.sp=") + (L.sp ? "true" : "false"),
                                  "train.grad_accum=" + std::to_string(global_micro / L.dp)};
  all.insert(all.end(), sets.begin(), sets.end());
  io::Config c;
  EXPECT_EQ(io::load_config(DT_SOURCE_DIR "/configs/quickstart.yaml", all, &c), "");
  return c;
}

Layout plain(int world) { return {1, 1, world, false}; }

// The full set of tensors of every shard file of a checkpoint, by file and tensor name.
std::map<std::string, std::map<std::string, Tensor>> shard_tensors(const std::string& step_dir) {
  train::CheckpointInfo ck;
  EXPECT_EQ(train::read_checkpoint_info(step_dir, &ck), "");
  std::map<std::string, std::map<std::string, Tensor>> out;
  for (const auto& f : ck.files) {
    io::SafetensorsFile sf;
    EXPECT_EQ(io::read_safetensors((fs::path(step_dir) / f.name).string(), &sf), "");
    out[f.name] = sf.tensors;
  }
  return out;
}

// The global fp32 weights of a checkpoint: every tp shard put in place with model::shard_pieces.
std::map<std::string, Tensor> global_weights(const std::string& step_dir) {
  train::CheckpointInfo ck;
  EXPECT_EQ(train::read_checkpoint_info(step_dir, &ck), "");
  std::map<std::string, Tensor> out;
  for (int q = 0; q < ck.tp; ++q) {
    io::SafetensorsFile sf;
    EXPECT_EQ(io::read_safetensors((fs::path(step_dir) / train::shard_file_name(q, ck.tp)).string(), &sf), "");
    for (const model::ParamSpec& s : model::Qwen35Model::param_specs(ck.config.model, ck.sp)) {
      if (!out.count(s.name)) out[s.name] = Tensor::empty(s.shape, DType::f32);
      const Tensor& local = sf.at(s.name);
      if (s.tp_dim < 0) {
        if (q == 0) ops::copy(out[s.name], local);
        continue;
      }
      for (const model::ShardPiece& p : model::shard_pieces(s, ck.tp, q))
        ops::copy(out[s.name].view().slice(s.tp_dim, p.global_off, p.global_off + p.len),
                  local.view().slice(s.tp_dim, p.local_off, p.local_off + p.len));
    }
  }
  return out;
}

std::string read_latest_name(const std::string& dir) {
  std::ifstream f(fs::path(dir) / "latest");
  std::string s;
  std::getline(f, s);
  return s;
}

// What the trainer builds before its loop (train/trainer.cpp), for the collective load and
// check functions.
struct Rig {
  io::Config cfg;
  dist::ProcessGroups pg;
  data::IndexedDataset ds;
  data::PackerConfig pc;
  std::unique_ptr<data::PackedLoader> loader;
  std::unique_ptr<model::Qwen35Model> net;
  std::vector<model::Param*> params;
  std::unique_ptr<train::Optimizer> opt;
  std::unique_ptr<train::StepGuard> guard;

  explicit Rig(const io::Config& c) : cfg(c) {
    dist::ParallelDims dims{int(c.parallel.tp), int(c.parallel.cp), int(c.parallel.dp)};
    EXPECT_EQ(dims.resolve(dist::world_size()), "");
    pg = dist::ProcessGroups::build(dims, dist::Backend::mpi);
    pc = train::packer_config(c, dims);
    ds = data::IndexedDataset::open_or_die(c.data.prefix);
    loader = std::make_unique<data::PackedLoader>(ds, pc, pg.coord.dp);
    layers::RunCtx ctx;
    ctx.pg = &pg;
    ctx.sp = c.parallel.sp;
    ctx.device = Device::cpu();
    ctx.act_dtype = DType::f32;
    ctx.seed = uint64_t(c.train.seed);
    net = std::make_unique<model::Qwen35Model>(c.model, ctx);
    params = net->params();
    opt = std::make_unique<train::Optimizer>(c.optimizer, params);
    guard = std::make_unique<train::StepGuard>(c.train.max_nonfinite_in_a_row);
  }
  train::TrainState st() { return {&cfg, &pg, params, opt.get(), guard.get(), loader.get(), &ds, pc, {}}; }
};

// Expects the same non-empty error on every rank, containing each of `parts`.
void expect_error_everywhere(const std::string& err, std::vector<std::string> parts) {
  EXPECT_FALSE(err.empty());
  for (const std::string& p : parts) EXPECT_NE(err.find(p), std::string::npos) << "'" << p << "' not in: " << err;
  // Every rank holds the same text: compare lengths and a digest over the world.
  const std::string h = sha256_hex(err.data(), err.size());
  Tensor mine = Tensor::zeros(Shape{64}, DType::u8), all = Tensor::empty(Shape{64 * dist::world_size()}, DType::u8);
  std::memcpy(mine.data(), h.data(), 64);
  world().all_gather(all, mine);
  for (int r = 0; r < dist::world_size(); ++r)
    EXPECT_EQ(std::memcmp(static_cast<const char*>(all.data()) + 64 * r, h.data(), 64), 0) << "rank " << r << " differs";
}

}  // namespace

TEST(Checkpoint, ResumeIsBitExact) {
  const int W = dist::world_size();
  const Layout L = W == 1 ? Layout{1, 1, 1, false} : W == 2 ? Layout{2, 1, 1, true} : Layout{2, 1, 2, false};
  SCOPED_TRACE(L.str());
  const std::string a = fresh_dir("resume_a"), c = fresh_dir("resume_c"), d = fresh_dir("resume_d");
  constexpr int N = 4, k = 2;
  // A: N steps straight, saving after step k and at the end.
  std::vector<double> la = train::run_training(quickstart(
      L, {"train.steps=4", "checkpoint.dir=" + a, "checkpoint.interval=" + std::to_string(k)})).losses;
  ASSERT_EQ(la.size(), size_t(N));
  EXPECT_EQ(read_latest_name(a), train::step_dir_name(N));
  ASSERT_EQ(train::list_checkpoints(a).size(), 2u);

  // C: a new run from A's step-k checkpoint (checkpoint.load), N-k steps.
  std::vector<double> lc = train::run_training(quickstart(
      L, {"train.steps=4", "checkpoint.dir=" + c, "checkpoint.load=" + a + "/" + train::step_dir_name(k)})).losses;
  ASSERT_EQ(lc.size(), size_t(N - k));
  for (int i = 0; i < N - k; ++i) EXPECT_EQ(lc[size_t(i)], la[size_t(k + i)]) << "step " << k + i + 1;  // bitwise

  // D: A's directory as a crash mid-save of step N left it: `latest` still names step k, the
  // step-N save is a .tmp directory without metadata, plus a half-written latest.tmp.
  if (dist::world_rank() == 0) {
    fs::copy(a + "/" + train::step_dir_name(k), d + "/" + train::step_dir_name(k), fs::copy_options::recursive);
    fs::copy(a + "/" + train::step_dir_name(N), d + "/" + train::tmp_dir_name(N), fs::copy_options::recursive);
    fs::remove(d + "/" + train::tmp_dir_name(N) + "/metadata.json");
    fs::resize_file(d + "/" + train::tmp_dir_name(N) + "/" + train::shard_file_name(0, L.tp), 100);
    std::ofstream(d + "/latest") << train::step_dir_name(k) << "\n";
    std::ofstream(d + "/latest.tmp") << "step_00";
  }
  world().barrier();
  ASSERT_EQ(train::list_checkpoints(d).size(), 1u) << "a .tmp directory was listed as a checkpoint";
  std::string latest;
  EXPECT_EQ(train::read_latest(d, &latest), "");
  EXPECT_EQ(fs::path(latest).filename().string(), train::step_dir_name(k));
  std::vector<double> ld = train::run_training(quickstart(L, {"train.steps=4", "checkpoint.dir=" + d})).losses;  // resume: true
  ASSERT_EQ(ld.size(), size_t(N - k));
  for (int i = 0; i < N - k; ++i) EXPECT_EQ(ld[size_t(i)], la[size_t(k + i)]) << "step " << k + i + 1;
  EXPECT_EQ(read_latest_name(d), train::step_dir_name(N));
  EXPECT_FALSE(fs::exists(d + "/" + train::tmp_dir_name(N)));

  // Final weights and AdamW state: every tensor of every shard equal in bits, and so the files.
  auto ta = shard_tensors(a + "/" + train::step_dir_name(N));
  for (const std::string& other : {c, d}) {
    auto tb = shard_tensors(other + "/" + train::step_dir_name(N));
    ASSERT_EQ(ta.size(), tb.size());
    for (const auto& [file, tensors] : ta)
      for (const auto& [name, t] : tensors) {
        ASSERT_TRUE(tb[file].count(name)) << file << " " << name;
        const Tensor& u = tb[file].at(name);
        ASSERT_EQ(t.nbytes(), u.nbytes()) << name;
        EXPECT_EQ(std::memcmp(t.data(), u.data(), t.nbytes()), 0) << other << ": " << file << " " << name << " differs";
      }
    train::CheckpointInfo ia, ib;
    ASSERT_EQ(train::read_checkpoint_info(a + "/" + train::step_dir_name(N), &ia), "");
    ASSERT_EQ(train::read_checkpoint_info(other + "/" + train::step_dir_name(N), &ib), "");
    for (size_t i = 0; i < ia.files.size(); ++i) EXPECT_EQ(ia.files[i].sha256, ib.files[i].sha256);
    EXPECT_EQ(ia.num_updates, ib.num_updates);
    EXPECT_EQ(ia.loader[0], ib.loader[0]);
  }
}

// A crash in the first save between its rename and the write of `latest` leaves complete step
// directories and no `latest`: resume takes the newest of them (starting fresh would replace them).
TEST(Checkpoint, ResumeWithoutLatestTakesTheNewestStep) {
  const Layout L = plain(dist::world_size());
  const std::string a = fresh_dir("nolatest_a"), e = fresh_dir("nolatest_e"), f = fresh_dir("nolatest_f");
  std::vector<double> la =
      train::run_training(quickstart(L, {"train.steps=4", "checkpoint.dir=" + a, "checkpoint.interval=2"})).losses;
  ASSERT_EQ(la.size(), 4u);
  // A marker file in a copied step directory: a save that replaced the directory drops it.
  auto copy_step = [&](const std::string& dir, int64_t step) {
    if (dist::world_rank() == 0) {
      const std::string to = dir + "/" + train::step_dir_name(step);
      fs::copy(a + "/" + train::step_dir_name(step), to, fs::copy_options::recursive);
      std::ofstream(to + "/marker") << "kept";
    }
  };
  auto kept = [&](const std::string& dir, int64_t step) {
    return fs::exists(dir + "/" + train::step_dir_name(step) + "/marker");
  };

  // E: only step 2, no `latest` (the first save's crash): the run continues bit-exactly from it.
  copy_step(e, 2);
  world().barrier();
  std::string s = "unset", note;
  EXPECT_EQ(train::resume_step_dir(e, &s, &note), "");
  EXPECT_EQ(fs::path(s).filename().string(), train::step_dir_name(2));
  EXPECT_NE(note.find("no `latest`"), std::string::npos) << note;
  EXPECT_NE(note.find(train::step_dir_name(2)), std::string::npos) << note;
  std::vector<double> le = train::run_training(quickstart(L, {"train.steps=4", "checkpoint.dir=" + e})).losses;
  ASSERT_EQ(le.size(), 2u) << "started fresh instead of resuming from step 2";
  for (int i = 0; i < 2; ++i) EXPECT_EQ(le[size_t(i)], la[size_t(2 + i)]) << "step " << 3 + i;
  EXPECT_TRUE(kept(e, 2)) << "the step-2 checkpoint was replaced";
  EXPECT_EQ(read_latest_name(e), train::step_dir_name(4));
  train::CheckpointInfo ia, ie;
  ASSERT_EQ(train::read_checkpoint_info(a + "/" + train::step_dir_name(4), &ia), "");
  ASSERT_EQ(train::read_checkpoint_info(e + "/" + train::step_dir_name(4), &ie), "");
  for (size_t i = 0; i < ia.files.size(); ++i) EXPECT_EQ(ia.files[i].sha256, ie.files[i].sha256);
  // With `latest` present, it is what resume takes, and there is nothing to warn about.
  EXPECT_EQ(train::resume_step_dir(e, &s, &note), "");
  EXPECT_EQ(fs::path(s).filename().string(), train::step_dir_name(4));
  EXPECT_EQ(note, "");

  // F: steps 2 and 4, no `latest`: the newest (4) is taken; 4 steps asked, none left to run, and
  // neither directory is touched.
  copy_step(f, 2);
  copy_step(f, 4);
  world().barrier();
  EXPECT_EQ(train::resume_step_dir(f, &s, &note), "");
  EXPECT_EQ(fs::path(s).filename().string(), train::step_dir_name(4));
  std::vector<double> lf = train::run_training(quickstart(L, {"train.steps=4", "checkpoint.dir=" + f})).losses;
  EXPECT_TRUE(lf.empty()) << "ran " << lf.size() << " steps; expected to resume at step 4";
  EXPECT_TRUE(kept(f, 2));
  EXPECT_TRUE(kept(f, 4));

  // The newest step directory unreadable: an error naming it, never a silent fallback to step 2.
  if (dist::world_rank() == 0) std::ofstream(f + "/" + train::step_dir_name(4) + "/metadata.json") << "{";
  world().barrier();
  const std::string err = train::resume_step_dir(f, &s, &note);
  EXPECT_NE(err.find("no `latest`"), std::string::npos) << err;
  EXPECT_NE(err.find(train::step_dir_name(4)), std::string::npos) << err;
  EXPECT_NE(err.find("checkpoint.load=" + f + "/" + train::step_dir_name(2)), std::string::npos) << err;
}

// An unusable checkpoint.dir is found at startup (resume_if_asked calls prepare_checkpoint_dir
// before the first step; cli_checkpoint_dir_unusable runs the program), not at the first save.
TEST(Checkpoint, UnusableDirIsAnErrorAtStartup) {
  const std::string dir = fresh_dir("startup");
  const std::string blocker = dir + "/not_a_dir";
  if (dist::world_rank() == 0) std::ofstream(blocker) << "a file";
  world().barrier();
  expect_error_everywhere(train::prepare_checkpoint_dir(blocker + "/sub"),
                          {"checkpoint.dir = '" + blocker + "/sub': cannot create the directory (", ")"});
  expect_error_everywhere(train::prepare_checkpoint_dir(blocker),
                          {"checkpoint.dir = '" + blocker + "'", "exists and is not a directory"});
  // A usable one is made, and the probe leaves nothing behind.
  const std::string made = dir + "/a/b";
  EXPECT_EQ(train::prepare_checkpoint_dir(made), "");
  EXPECT_TRUE(fs::is_directory(made));
  EXPECT_TRUE(fs::is_empty(made));
  EXPECT_EQ(train::prepare_checkpoint_dir(made), "");  // and again, once it exists
  world().barrier();
}

TEST(Checkpoint, ReshardingAtLoad) {
  const int W = dist::world_size();
  if (W == 1) GTEST_SKIP() << "needs mpirun -np 2 or 4";
  std::vector<std::pair<Layout, Layout>> pairs;
  if (W == 2)
    pairs = {{{2, 1, 1, false}, {1, 1, 2, false}},   // tp2 -> tp1 (dp2)
             {{1, 1, 2, false}, {2, 1, 1, true}},    // tp1 (dp2) -> tp2 + sp
             {{1, 2, 1, false}, {1, 1, 2, false}}};  // cp2 -> dp2
  else
    pairs = {{{2, 2, 1, true}, {1, 1, 4, false}},    // tp2 cp2 sp -> dp4
             {{1, 1, 4, false}, {4, 1, 1, true}},    // dp4 -> tp4 sp
             {{1, 2, 2, false}, {2, 1, 2, false}}};  // cp2 dp2 -> tp2 dp2
  int n = 0;
  for (const auto& [from, to] : pairs) {
    SCOPED_TRACE(from.str() + " -> " + to.str());
    const std::string src = fresh_dir(fmt::format("reshard{}_src", n)), dst = fresh_dir(fmt::format("reshard{}_dst", n));
    ++n;
    // The saving layout: 3 steps, saving after 2 and 3.
    std::vector<double> ls = train::run_training(
        quickstart(from, {"train.steps=3", "checkpoint.dir=" + src, "checkpoint.interval=2"})).losses;
    ASSERT_EQ(ls.size(), 3u);
    // The other layout: from step 2, one step.
    std::vector<double> ld = train::run_training(quickstart(
        to, {"train.steps=3", "checkpoint.dir=" + dst, "checkpoint.load=" + src + "/" + train::step_dir_name(2)})).losses;
    ASSERT_EQ(ld.size(), 1u);
    EXPECT_NEAR(ld[0], ls[2], 1e-5 * std::fabs(ls[2]));
    auto ws = global_weights(src + "/" + train::step_dir_name(3)), wd = global_weights(dst + "/" + train::step_dir_name(3));
    ASSERT_EQ(ws.size(), wd.size());
    for (const auto& [name, t] : ws) EXPECT_TRUE(dt::testing::close_rel(wd.at(name), t, 1e-5)) << name;
  }
}

TEST(Checkpoint, KeepLastAndCrashLeftovers) {
  const int W = dist::world_size();
  const Layout L = plain(W);
  const std::string dir = fresh_dir("keep");
  // Leftovers of a crashed save of step 2 and a half-written `latest.tmp`.
  if (dist::world_rank() == 0) {
    fs::create_directories(dir + "/" + train::tmp_dir_name(2));
    std::ofstream(dir + "/" + train::tmp_dir_name(2) + "/" + train::shard_file_name(0, 1)) << "partial";
    std::ofstream(dir + "/latest.tmp") << "step_0";
  }
  world().barrier();
  std::string latest = "unset";
  EXPECT_EQ(train::read_latest(dir, &latest), "");
  EXPECT_EQ(latest, "") << "no `latest` yet: nothing to resume";
  EXPECT_TRUE(train::list_checkpoints(dir).empty());
  train::run_training(quickstart(L, {"train.steps=5", "checkpoint.dir=" + dir, "checkpoint.interval=1",
                                     "checkpoint.keep_last=2"}));
  auto left = train::list_checkpoints(dir);
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(left[0].first, 4);
  EXPECT_EQ(left[1].first, 5);
  EXPECT_EQ(read_latest_name(dir), train::step_dir_name(5));
  EXPECT_FALSE(fs::exists(dir + "/" + train::tmp_dir_name(2)));
  EXPECT_FALSE(fs::exists(dir + "/latest.tmp"));
  // Every saved file is intact.
  train::CheckpointInfo ck;
  ASSERT_EQ(train::read_checkpoint_info(left[1].second, &ck), "");
  EXPECT_EQ(ck.step, 5);
  EXPECT_EQ(ck.num_updates, 5);
  for (const auto& f : ck.files) EXPECT_EQ(train::verify_checkpoint_file(ck, f), "") << f.name;
}

TEST(Checkpoint, LoadErrorsAreClearOnEveryRank) {
  const int W = dist::world_size();
  const Layout L = W == 1 ? Layout{1, 1, 1, false} : Layout{2, 1, W / 2, false};
  const std::string dir = fresh_dir("errors");
  train::run_training(quickstart(L, {"train.steps=1", "checkpoint.dir=" + dir}));
  const std::string good = dir + "/" + train::step_dir_name(1);
  const std::string shard0 = train::shard_file_name(0, L.tp);
  Rig rig(quickstart(L, {}));
  train::CheckpointInfo ck;
  ASSERT_EQ(train::check_checkpoint(good, rig.st(), &ck), "");
  ASSERT_EQ(ck.files[0].name, shard0);

  // One copy of the good checkpoint per case, damaged by rank 0.
  auto damaged = [&](const std::string& name, auto damage) {
    const std::string d = dir + "/" + name;
    if (dist::world_rank() == 0) {
      fs::copy(good, d, fs::copy_options::recursive);
      damage(d);
    }
    world().barrier();
    return d;
  };
  {  // a flipped byte in the middle of the tensor data
    std::string actual;
    const std::string d = damaged("flipped", [&](const std::string& p) {
      std::fstream f(p + "/" + shard0, std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(std::streamoff(ck.files[0].bytes / 2));
      char b;
      f.get(b);
      f.seekp(std::streamoff(ck.files[0].bytes / 2));
      f.put(char(b ^ 0x10));
    });
    uint64_t bytes;
    ASSERT_EQ(sha256_file(d + "/" + shard0, &actual, &bytes), "");
    ASSERT_NE(actual, ck.files[0].sha256);
    int64_t step = -1;
    expect_error_everywhere(train::load_checkpoint(d, rig.st(), &step),
                            {"SHA-256 mismatch", shard0, ck.files[0].sha256, actual});
    EXPECT_EQ(step, -1);
  }
  {  // truncated
    const std::string d = damaged("truncated", [&](const std::string& p) { fs::resize_file(p + "/" + shard0, 1000); });
    expect_error_everywhere(train::check_checkpoint(d, rig.st(), nullptr),
                            {shard0, "has 1000 bytes", std::to_string(ck.files[0].bytes), "truncated"});
  }
  {  // a missing shard
    const std::string d = damaged("missing", [&](const std::string& p) { fs::remove(p + "/" + shard0); });
    expect_error_everywhere(train::check_checkpoint(d, rig.st(), nullptr), {shard0, "is missing"});
  }
  {  // no metadata.json: an unfinished save
    const std::string d = damaged("nometa", [&](const std::string& p) { fs::remove(p + "/metadata.json"); });
    expect_error_everywhere(train::check_checkpoint(d, rig.st(), nullptr), {"no metadata.json"});
  }  {  // a loader position past its epoch (an edited metadata.json): refused before any state changes
    const std::string d = damaged("farstep", [&](const std::string& p) {
      std::ifstream in(p + "/metadata.json");
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      in.close();
      text = std::regex_replace(text, std::regex(" step=[0-9]+ "), " step=992 ");
      std::ofstream(p + "/metadata.json", std::ios::trunc) << text;
    });
    expect_error_everywhere(train::check_checkpoint(d, rig.st(), nullptr),
                            {"the saved data position", "step=992", "cannot be continued here", "is past the"});
    if (W >= 2) {  // under another layout (dp differs) the same position is refused too
      Rig other(quickstart(Layout{1, 1, W, false}, {}));
      expect_error_everywhere(train::check_checkpoint(d, other.st(), nullptr), {"step=992", "is past the"});
    }
  }

  // checkpoint.load given the checkpoint.dir instead of a step directory
  expect_error_everywhere(train::check_checkpoint(dir, rig.st(), nullptr), {"not a step directory", "step_NNNNNNN"});
  {  // a save that cannot write: an error on every rank, nothing left behind
    const std::string blocker = dir + "/not_a_dir";
    if (dist::world_rank() == 0) std::ofstream(blocker) << "a file";
    world().barrier();
    Rig r(quickstart(L, {"checkpoint.dir=" + blocker + "/sub"}));
    expect_error_everywhere(train::save_checkpoint(r.st(), 1), {"checkpoint.dir: cannot create", blocker});
    EXPECT_FALSE(fs::exists(blocker + "/sub"));
  }
  {  // `latest` naming a directory that is gone
    const std::string d = dir + "/badlatest";
    if (dist::world_rank() == 0) {
      fs::create_directories(d);
      std::ofstream(d + "/latest") << "step_0000007\n";
    }
    world().barrier();
    std::string s;
    std::string err = train::read_latest(d, &s);
    EXPECT_NE(err.find("step_0000007"), std::string::npos) << err;
    EXPECT_NE(err.find("not a complete checkpoint"), std::string::npos) << err;
  }
  {  // a model key that changes the parameter shapes
    Rig other(quickstart(L, {"model.intermediate_size=96"}));
    expect_error_everywhere(train::check_checkpoint(good, other.st(), nullptr),
                            {"model.intermediate_size = 128", "model.intermediate_size = 96"});
    io::Config a = quickstart(L, {}), b = quickstart(L, {"model.num_hidden_layers=8"});
    EXPECT_NE(train::check_model_compatible(a, b).find("model.num_hidden_layers"), std::string::npos);
    std::vector<std::string> warn;
    io::Config e = quickstart(L, {"model.rope_theta=500000"});
    EXPECT_EQ(train::check_model_compatible(a, e, &warn), "");  // not a shape: a warning
    ASSERT_EQ(warn.size(), 1u);
    EXPECT_NE(warn[0].find("model.rope_theta"), std::string::npos);
  }
  {  // a data key that changes the data order
    Rig other(quickstart(L, {"train.seed=7"}));
    expect_error_everywhere(train::check_checkpoint(good, other.st(), nullptr), {"train.seed = 1234", "7"});
    Rig mt(quickstart(L, {"data.max_tokens=512"}));
    expect_error_everywhere(train::check_checkpoint(good, mt.st(), nullptr), {"data.max_tokens = 1024"});
  }
  {  // AdamW run from an SGD checkpoint: no moments to load
    const std::string sd = fresh_dir("errors_sgd");
    train::run_training(quickstart(L, {"train.steps=1", "checkpoint.dir=" + sd, "optimizer.name=sgd"}));
    expect_error_everywhere(train::check_checkpoint(sd + "/" + train::step_dir_name(1), rig.st(), nullptr),
                            {"optimizer.name = sgd", "optimizer.name = adamw"});
  }
  {  // another pad multiple packs the epoch differently: the hint names the saved one, which works here
    Rig pm(quickstart(L, {"data.pad_multiple=16"}));
    expect_error_everywhere(train::check_checkpoint(good, pm.st(), nullptr),
                            {"packs into other micro-batches", "data.pad_multiple 8", "16", "--set data.pad_multiple=8"});
  }
  if (W >= 2) {  // saved at pad multiple 1, loaded under cp 2 (multiples of 4): no value to hint
    const std::string sd = fresh_dir("errors_pm");
    train::run_training(quickstart(L, {"train.steps=1", "checkpoint.dir=" + sd, "data.pad_multiple=1"}));
    Rig cp2(quickstart(Layout{1, 2, W / 2, false}, {}));
    const std::string err = train::check_checkpoint(sd + "/" + train::step_dir_name(1), cp2.st(), nullptr);
    expect_error_everywhere(err, {"packs into other micro-batches", "data.pad_multiple 1", "does not accept"});
    EXPECT_EQ(err.find("--set data.pad_multiple=1"), std::string::npos) << err;
  }
  if (W >= 2) {  // dp that cannot continue the global stream: 1 micro-batch consumed, dp 2 now
    const std::string sd = fresh_dir("errors_dp");
    const Layout one{W, 1, 1, false};
    train::run_training(quickstart(one, {"train.steps=1", "checkpoint.dir=" + sd, "train.grad_accum=1"}));
    Rig r2(quickstart(Layout{W / 2, 1, 2, false}, {}));
    expect_error_everywhere(train::check_checkpoint(sd + "/" + train::step_dir_name(1), r2.st(), nullptr),
                            {"not a multiple of this run's dp 2", "train.grad_accum"});
  }
}
