// Benchmark of a full training step (forward, backward, gradient reduction, grad norm, AdamW) of
// the whole model through the trainer (train::Trainer, the code `deltatron train` runs), on
// micro-batches of data.max_tokens tokens packed from synthetic documents of lengths drawn
// uniformly in [256, 4096] (fixed seed; random token ids, written once as an indexed dataset in
// the temp directory).
//   1 GPU:           train_step [--config configs/bench-0.8b.yaml] [--steps 10] [--warmup 3] [--set k=v]...
//   2 GPUs, CP = 2:  mpirun -np 2 -x NCCL_NVLS_ENABLE=0 train_step --set parallel.cp=2 --set data.max_tokens=16384
//   --phases N:      then N more micro-batches timed phase by phase (time_phases), and one
//                    decoder layer of each type with its mixer and MLP alone (time_layers)
//   --profile:       with --phases: the last LM head + CE alone and the last timed fwd+bwd of each
//                    decoder layer type run between cudaProfilerStart/Stop, for per-kernel times
//                    of the head and of one layer of each type (~130 kernels) under
//                    `ncu --profile-from-start off --metrics gpu__time_duration.sum --csv --page raw`
// Prints the median step ms, tokens/s (real tokens over the timed steps' total time), TFLOP/s per
// GPU and MFU by the model-FLOP count of docs/training.md, and the peak of the caching allocator
// (max over ranks), and rank 0's GPU energy per step and average power (NVML's counter,
// bench/energy_meter.h). Each timed step ends with a device synchronisation.
// Issue 6 reference on one H200, this config: HF transformers Qwen3_5ForCausalLM (FLA GDN kernels,
// sdpa, fused AdamW, bf16) trains 33.3k tokens/s at 8192 tokens per step with a 52 GiB peak;
// target >= 67k tokens/s and <= 26 GiB; CP = 2 on two GPUs >= 1.8x one GPU.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include "bench_util.h"
#include "energy_meter.h"
#include "core/cuda_check.h"
#include "deltatron/core/allocator.h"
#include "deltatron/data/indexed_dataset.h"
#include "deltatron/dist/comm.h"
#include "deltatron/io/config.h"
#include "deltatron/layers/embedding.h"
#include "deltatron/layers/lm_head.h"
#include "deltatron/model/grad_reduce.h"
#include "deltatron/ops/basic.h"
#include "deltatron/train/metrics.h"
#include "deltatron/train/trainer.h"

using namespace dt;

namespace {

// Documents of lengths in [256, 4096], enough for `tokens` tokens; rank 0 writes, the others wait.
// The files are unlinked once every rank has opened them (run()).
std::string write_documents(int64_t vocab, int64_t tokens) {
  auto world = dist::make_world(dist::Backend::mpi);
  Tensor pid = Tensor::empty(Shape{1}, DType::i64);  // [1] rank 0's pid names the files
  *pid.ptr<int64_t>() = int64_t(getpid());
  world->broadcast(pid, 0);
  const std::string prefix =
      (std::filesystem::temp_directory_path() / fmt::format("dt_train_step_{}", *pid.ptr<int64_t>())).string();
  if (world->rank() == 0) {
    std::mt19937_64 gen(42);
    std::uniform_int_distribution<int64_t> len(256, 4096), tok(0, vocab - 1);
    data::IndexedDatasetWriter w;
    std::string e = w.open(prefix, vocab <= 65536 ? data::TokenDType::u16 : data::TokenDType::i32);
    std::vector<int64_t> doc;
    for (int64_t n = 0; e.empty() && n < tokens; n += int64_t(doc.size())) {
      doc.resize(size_t(len(gen)));
      for (int64_t& t : doc) t = tok(gen);
      e = w.add_document(doc);
    }
    if (e.empty()) e = w.finish();
    if (!e.empty()) user_error(e, false);
  }
  world->barrier();
  return prefix;
}

// --phases: where a step's time goes, each phase timed with CUDA events on the compute stream over
// fresh micro-batches (after the timed steps: the extra updates change the weights), median of
// `reps`: forward (embedding, layers, final norm, LM head + loss), backward, gradient reduction +
// grad norm (with its readback), AdamW + zero grads; and the LM head with its cross entropy alone
// (fused fwd + bwd as the trainer runs it, an untied copy on random activations of the same micro-batch).
void time_phases(train::Trainer& t, int reps, bool profile) {
  const Stream s = t.stream();
  const auto st = static_cast<cudaStream_t>(s.handle);
  const Device dev = t.device();
  const dist::ProcessGroups& pg = t.groups();
  io::ModelConfig untied = t.config().model;
  untied.tie_word_embeddings = false;
  layers::LmHeadLoss head(model::lm_head_config(untied), t.run_ctx());
  const char* names[] = {"forward", "backward", "grad reduce + norm", "AdamW + zero grads", "LM head + CE alone"};
  constexpr int kPhases = 5;
  cudaEvent_t ev[kPhases + 1];
  for (cudaEvent_t& e : ev) DT_CUDA_CHECK(cudaEventCreate(&e));
  std::vector<std::vector<float>> ms(kPhases);
  std::vector<double> host_ms;  // host time to enqueue forward + backward (no sync inside)
  for (int r = 0; r < reps; ++r) {
    const data::MicroBatch mb = t.loader().next();
    const data::PackedSeqParams psp = data::PackedSeqParams::build(mb.desc(pg.coord.cp), dev, s);
    const layers::LmTargets tg = layers::targets_from_labels(mb.labels, psp, dev, s);  // as the trainer
    const Tensor ids = layers::local_token_ids(mb.tokens, psp, dev, s);
    const float scale = 1.f / float(std::max<int64_t>(tg.count, 1));
    const Shape hs{psp.tokens_local(), untied.hidden_size};
    Tensor h = Tensor::empty(hs, t.act_dtype(), dev), dh = Tensor::empty(hs, t.act_dtype(), dev);  // [T_local, H]
    ops::rng_normal(h, 1, 7, 0.f, 1.f, ops::RngSlice::whole(h), s);
    DT_CUDA_CHECK(cudaEventRecord(ev[0], st));
    const auto h0 = std::chrono::steady_clock::now();
    t.model().forward(ids, psp, tg, scale);  // the trainer's fused LM head
    DT_CUDA_CHECK(cudaEventRecord(ev[1], st));
    t.model().backward(scale);
    host_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - h0).count());
    DT_CUDA_CHECK(cudaEventRecord(ev[2], st));
    model::reduce_grads(t.params(), pg, s);
    train::global_grad_norm(t.params(), pg, s);
    DT_CUDA_CHECK(cudaEventRecord(ev[3], st));
    t.optimizer().step(t.params(), 1e-5f, 1.f, s);  // also refreshes bf16 copies and zeroes grads, as in the trainer
    DT_CUDA_CHECK(cudaEventRecord(ev[4], st));
    const bool window = profile && r == reps - 1;
    if (window) DT_CUDA_CHECK(cudaProfilerStart());
    head.forward(h, tg, scale);  // fused, as the trainer runs it
    head.backward(dh, scale);
    DT_CUDA_CHECK(cudaEventRecord(ev[5], st));
    if (window) DT_CUDA_CHECK(cudaProfilerStop());
    DT_CUDA_CHECK(cudaEventSynchronize(ev[kPhases]));
    for (int i = 0; i < kPhases; ++i) {
      float x = 0;
      DT_CUDA_CHECK(cudaEventElapsedTime(&x, ev[i], ev[i + 1]));
      ms[size_t(i)].push_back(x);
    }
  }
  for (cudaEvent_t e : ev) DT_CUDA_CHECK(cudaEventDestroy(e));
  if (dist::world_rank() != 0) return;
  std::printf("phases of one micro-batch (rank 0, median of %d):", reps);
  for (int i = 0; i < kPhases; ++i) std::printf("%s %s %.2f ms", i ? " |" : "", names[i], bench::median(ms[size_t(i)]));
  std::printf("\n  host time to enqueue forward + backward: %.2f ms (the GPU is starved where this nears their sum)\n",
              bench::median(host_ms));
}

// --phases, continued: one decoder layer of each type on a fresh micro-batch, its sub-blocks
// timed alone (forward, then backward) on random activations; median of `reps`.
void time_layers(train::Trainer& t, int reps, bool profile) {
  const Stream s = t.stream();
  const auto st = static_cast<cudaStream_t>(s.handle);
  const Device dev = t.device();
  const data::MicroBatch mb = t.loader().next();
  const data::PackedSeqParams psp = data::PackedSeqParams::build(mb.desc(t.groups().coord.cp), dev, s);
  const Shape hs{psp.tokens_local(), t.config().model.hidden_size};
  Tensor x = Tensor::empty(hs, t.act_dtype(), dev), y = Tensor::empty(hs, t.act_dtype(), dev);  // [T_local, H]
  Tensor dx = Tensor::empty(hs, t.act_dtype(), dev), dy = Tensor::empty(hs, t.act_dtype(), dev);
  ops::rng_normal(x, 1, 11, 0.f, 1.f, ops::RngSlice::whole(x), s);
  ops::rng_normal(dy, 1, 12, 0.f, 1e-3f, ops::RngSlice::whole(dy), s);
  cudaEvent_t ev[3];
  for (cudaEvent_t& e : ev) DT_CUDA_CHECK(cudaEventCreate(&e));
  auto time = [&](const char* what, auto&& fwd, auto&& bwd) {
    std::vector<float> f, b;
    for (int r = 0; r < reps + 1; ++r) {  // the first is a warm-up (allocator, plans)
      const bool window = profile && r == reps && !std::strcmp(what, "decoder layer");
      if (window) DT_CUDA_CHECK(cudaProfilerStart());
      DT_CUDA_CHECK(cudaEventRecord(ev[0], st));
      fwd();
      DT_CUDA_CHECK(cudaEventRecord(ev[1], st));
      bwd();
      DT_CUDA_CHECK(cudaEventRecord(ev[2], st));
      DT_CUDA_CHECK(cudaEventSynchronize(ev[2]));
      if (window) DT_CUDA_CHECK(cudaProfilerStop());
      float a = 0, c = 0;
      DT_CUDA_CHECK(cudaEventElapsedTime(&a, ev[0], ev[1]));
      DT_CUDA_CHECK(cudaEventElapsedTime(&c, ev[1], ev[2]));
      if (r) f.push_back(a), b.push_back(c);
    }
    if (dist::world_rank() == 0)
      std::printf("  %-28s fwd %7.2f ms | bwd %7.2f ms\n", what, bench::median(f), bench::median(b));
  };
  std::vector<std::string> seen;
  for (int64_t i = 0; i < t.model().num_layers(); ++i) {
    model::DecoderLayer& l = t.model().layer(i);
    if (std::find(seen.begin(), seen.end(), l.layer_type()) != seen.end()) continue;
    seen.push_back(l.layer_type());
    if (dist::world_rank() == 0) std::printf("layer %lld (%s), rank 0, median of %d:\n", (long long)i,
                                             l.layer_type().c_str(), reps);
    time("decoder layer", [&] { ops::copy(y, x, s); l.forward(y, psp); },
         [&] { ops::copy(dx, dy, s); l.backward(dx, psp); });
    time("  mixer", [&] { l.mixer().forward(y, x, psp); }, [&] { l.mixer().backward(dx, dy, psp); });
    if (seen.size() == 1) time("  MLP", [&] { l.mlp().forward(y, x); }, [&] { l.mlp().backward(dx, dy); });
  }
  for (cudaEvent_t e : ev) DT_CUDA_CHECK(cudaEventDestroy(e));
}

// Everything that holds device memory or communicators lives in here, gone before finalize.
void run(int argc, char** argv) {
  // The source tree's config, wherever the binary runs from (scripts/gpu_test.sh runs it in the build dir).
  std::string config =
      (std::filesystem::path(__FILE__).parent_path().parent_path() / "configs/bench-0.8b.yaml").string();
  int64_t steps = 10, warmup = 3, phases = 0;
  bool profile = false;
  std::vector<std::string> sets = {"train.device=cuda", "logging.metrics_jsonl=", "checkpoint.dir="};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--config") && i + 1 < argc) config = argv[++i];
    else if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--warmup") && i + 1 < argc) warmup = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--set") && i + 1 < argc) sets.push_back(argv[++i]);
    else if (!std::strcmp(argv[i], "--phases") && i + 1 < argc) phases = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--profile")) profile = true;
    else user_error(fmt::format("train_step: unknown argument '{}' (flags: --config FILE, --steps N, --warmup N, "
                                "--set section.key=value, --phases N, --profile)", argv[i]));
  }
  if (steps < 1 || warmup < 0 || phases < 0)
    user_error(fmt::format("train_step: --steps {} must be >= 1, --warmup {} and --phases {} >= 0", steps, warmup,
                           phases));
  io::Config cfg;
  if (std::string e = io::load_config(config, sets, &cfg); !e.empty()) user_error(e);
  if (profile && phases == 0) phases = 1;
  cfg.train.steps = warmup + steps;
  const int64_t dp = cfg.parallel.dp > 0 ? cfg.parallel.dp
                                         : dist::world_size() / std::max<int64_t>(cfg.parallel.tp * cfg.parallel.cp, 1);
  // Twice the tokens the run consumes: the packer never reaches the end of the epoch.
  cfg.data.prefix = write_documents(cfg.model.vocab_size, 2 * (cfg.train.steps * cfg.train.grad_accum + phases) *
                                                              std::max<int64_t>(dp, 1) * cfg.data.max_tokens);

  train::Trainer t(cfg);
  const bool rank0 = dist::world_rank() == 0;
  dist::make_world(dist::Backend::mpi)->barrier();  // every rank has mapped the dataset
  if (rank0) {
    std::filesystem::remove(cfg.data.prefix + ".bin");
    std::filesystem::remove(cfg.data.prefix + ".idx");
  }
  if (rank0) std::printf("%s", t.banner().c_str());
  for (int64_t i = 0; i < warmup; ++i) {
    t.step();
    t.synchronize();
  }
  std::vector<double> ms;
  double total_s = 0, flops = 0;
  int64_t tokens = 0;
  bench::EnergyMeter em(t.device().index);  // this rank's GPU; at the power cap time follows energy
  long long step_mj = 0;
  bool mj_ok = em.ok();
  for (int64_t i = 0; i < steps; ++i) {
    train::StepResult r;
    const long long e = em.measure([&] {
      const auto t0 = std::chrono::steady_clock::now();
      r = t.step();
      t.synchronize();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    });
    mj_ok = mj_ok && e >= 0;
    step_mj += e;
    total_s += ms.back() * 1e-3;
    tokens += r.tokens;
    flops += r.flops.model();
    if (rank0)
      std::printf("step %lld: %.1f ms, loss %.4f, %lld tokens\n", static_cast<long long>(i + 1), ms.back(), r.loss,
                  static_cast<long long>(r.tokens));
  }
  Tensor peak = Tensor::empty(Shape{2}, DType::i64);  // [2] max over ranks: in use, reserved from the device
  peak.ptr<int64_t>()[0] = train::peak_memory_bytes(t.device());
  peak.ptr<int64_t>()[1] = cuda_allocator(t.device().index).stats().peak_reserved_bytes;
  dist::make_world(dist::Backend::mpi)->all_reduce(peak, dist::ReduceOp::max);
  if (rank0) {
    const int world = t.groups().dims.world();
    const double tflops = flops / total_s / world / 1e12;
    std::printf("train_step %s, %s, tp %d cp %d dp %d, %lld tokens per micro-batch x grad_accum %lld: median %.1f ms | "
                "%.0f tokens/s (%.0f per GPU) | %.1f TFLOP/s per GPU",
                config.c_str(), dtype_name(t.act_dtype()), t.groups().dims.tp, t.groups().dims.cp, t.groups().dims.dp,
                static_cast<long long>(cfg.data.max_tokens), static_cast<long long>(cfg.train.grad_accum),
                bench::median(ms), double(tokens) / total_s, double(tokens) / total_s / world, tflops);
    if (t.peak_tflops() > 0) std::printf(" | MFU %.1f%%", 100 * tflops / t.peak_tflops());
    std::printf(" | peak %.2f GiB (reserved %.2f GiB)", double(peak.ptr<int64_t>()[0]) / double(int64_t(1) << 30),
                double(peak.ptr<int64_t>()[1]) / double(int64_t(1) << 30));
    if (mj_ok)
      std::printf(" | rank 0's GPU %.2f J per step, %.0f W (NVML)", 1e-3 * double(step_mj) / double(steps),
                  double(step_mj) / (total_s * 1e3));
    else
      std::printf(" | energy n/a (%s)", em.ok() ? "an NVML read failed" : em.why().c_str());
    std::printf("\n");
    std::printf("  issue 6 (bench-0.8b, one H200, 8192 tokens): HF transformers 33.3k tokens/s, 52 GiB; target >= 67k "
                "tokens/s, <= 26 GiB; CP = 2 on two GPUs >= 1.8x one GPU\n");
  }
  if (phases > 0) {
    time_phases(t, int(phases), profile);
    time_layers(t, int(phases), profile);
  }
}

}  // namespace

int main(int argc, char** argv) {
  dist::init(&argc, &argv);
  run(argc, argv);
  dist::finalize();
  return 0;
}
