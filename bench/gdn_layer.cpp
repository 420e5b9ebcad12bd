// Benchmark of the whole GatedDeltaNet layer (GEMMs, conv, norms, gates, chunked delta rule,
// and the TP/SP/CP communication), bf16, at H = 2048, Hk = 16, Hv = 32, dk = dv = 128, W = 4,
// T = 32768 tokens per GPU... (global T = 32768 * cp for CP runs: the per-GPU count held
// fixed), packed from lengths drawn in [256, 8192]. The input is lent to the layer for the
// backward as the decoder layer lends it (since v0.16.0; before, the layer copied it [T, H] each
// forward, a copy the model never makes; the trace showed ~0.35 ms of idle GPU with it).
//   1 GPU:           gdn_layer
//   2 GPUs, TP = 2:  mpirun -np 2 gdn_layer --tp 2 [--sp]
//   2 GPUs, CP = 2:  mpirun -np 2 gdn_layer --cp 2 [--cp-comm all_to_all | all_gather]
//   --keep-elementwise: gdn.recompute_elementwise=false (the forward keeps conv output, l2norm(q, k)
//                       and z instead of the backward recomputing them), for the time it costs
//   --keep-v:           gdn.recompute_v=false (the forward keeps the conv output's v; the backward
//                       rebuilds only l2norm(q, k), from hp's q|k columns: half the rebuild's bytes)
//   --graph:            also times fwd+bwd as one CUDA graph (captured after the warm-up): the time
//                       without host launch gaps (v0.10.0: the same as eager, so there are none)
//   --energy-kernels:   then each kernel of one fwd+bwd (a CUDA graph captured with
//                       DT_GDN_SERIAL_PDL=0) alone, back to back for 1 s after 0.2 s of warm-up:
//                       time, energy and power per launch, and net of an empty launch
//                       (bench/graph_energy.h), to rank kernels by the joules that set the step's
//                       time at the power cap; 1 GPU only, ~40 s
//   --trace:            then 10 fwd+bwd with every kernel's start and end recorded through CUPTI
//                       (bench/kernel_trace.h): per-kernel times inside a real, unserialised run,
//                       to set beside --profile's one-kernel-at-a-time times
//   --ab VAR[=A,B]:     then an A/B of the environment knob VAR (values A and B, default 0 and 1; it must be one
//                       read at every call, as the kernels' knobs are, not one read once such as
//                       DT_GEMM_AUTOTUNE): 40 rounds of one fwd+bwd each way, the order alternating
//                       (ABBA), so that clock and thermal drift falls on both; prints each side's
//                       median and the median of the paired differences, with how many rounds 1 won
//                       (for changes of ~0.1 ms, under the ~0.2-0.4 ms the eager layer varies by
//                       between runs)
//                       (DT_GEMM_ALGO=1x1x1:0,MxNxK:i A/Bs a GEMM shape's pinned candidate against the
//                       default: scripts/gemm_tune.sh)
//   --ab-block N:       each side of a round is the median of N fwd+bwd after N warm-ups (default 1
//                       and 1): with N ~10 each side runs long enough for the power cap to settle
//                       on its own draw, as a steady run does (v0.29.0: one-iteration sides
//                       alternate too fast for that and can rank changes the steady run does not)
//   --ab-rounds R:      rounds of the A/B (default 40)
//   --profile:          then one more fwd+bwd between cudaProfilerStart/Stop, for per-kernel times
//                       under `ncu --profile-from-start off --metrics gpu__time_duration.sum --csv
//                       --page raw` (scripts/ncu_summary.py makes the table)
// Prints median fwd and fwd+bwd ms (CUDA events, 3 warm-ups, 20 reps), tokens/s per GPU, the
// energy per fwd+bwd over 30 back-to-back steps with their average power and time (NVML's
// counter, bench/energy_meter.h; --ab prints each side's too), and for cp > 1 the time of the
// scheme's CP data movement alone (fwd and bwd, same shapes) as a share of fwd+bwd: cp2hp + hp2cp (all_to_all), or the all-gathers, reduce-scatters and
// row permutations of x, y and their gradients (all_gather). Reference on one H200 (issue 4):
// a Megatron-style layer of PyTorch GEMMs + FLA kernels takes 6.9 ms fwd and 22.4 ms fwd+bwd;
// target fwd+bwd <= 15 ms.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include <cuda_profiler_api.h>

#include "bench_util.h"
#include "energy_meter.h"
#include "graph_energy.h"
#include "kernel_trace.h"
#include "deltatron/data/packed_seq.h"
#include "deltatron/dist/comm.h"
#include "deltatron/layers/gdn.h"
#include "deltatron/ops/attention.h"
#include "deltatron/ops/basic.h"
#include "deltatron/ops/cp_a2a.h"

using namespace dt;

int main(int argc, char** argv) {
  dist::init(&argc, &argv);
  int tp = 1, cp = 1;
  bool sp = false, recompute = true, recompute_v = true, profile = false, graph = false, trace = false;
  bool energy_kernels = false;
  layers::GdnCpComm cp_comm = layers::GdnCpComm::all_to_all;
  int64_t tokens_per_gpu = 32768;
  std::string ab, ab_val[2] = {"0", "1"};  // --ab VAR[=A,B]
  int ab_block = 1, ab_rounds = 40;        // --ab-block N, --ab-rounds R
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--tp") && i + 1 < argc) tp = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--cp") && i + 1 < argc) cp = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--sp")) sp = true;
    else if (!std::strcmp(argv[i], "--keep-elementwise")) recompute = false;
    else if (!std::strcmp(argv[i], "--keep-v")) recompute_v = false;
    else if (!std::strcmp(argv[i], "--profile")) profile = true;
    else if (!std::strcmp(argv[i], "--graph")) graph = true;
    else if (!std::strcmp(argv[i], "--trace")) trace = true;
    else if (!std::strcmp(argv[i], "--energy-kernels")) energy_kernels = true;
    else if (!std::strcmp(argv[i], "--ab")) {
      if (i + 1 >= argc) user_error("gdn_layer: --ab needs the name of an environment knob, e.g. --ab DT_GDN_OUT_NORM");
      ab = argv[++i];
      if (const auto eq = ab.find('='); eq != std::string::npos) {
        const auto comma = ab.find(',', eq);
        if (comma == std::string::npos || comma == eq + 1 || comma + 1 == ab.size())
          user_error("gdn_layer: --ab " + ab + ": expected VAR=A,B (two values), e.g. --ab DT_GDN_GQA_PAIR=1,2");
        ab_val[0] = ab.substr(eq + 1, comma - eq - 1);
        ab_val[1] = ab.substr(comma + 1);
        ab.resize(eq);
      }
    }
    else if (!std::strcmp(argv[i], "--ab-block") && i + 1 < argc) ab_block = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--ab-rounds") && i + 1 < argc) ab_rounds = std::max(2, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) tokens_per_gpu = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--cp-comm") && i + 1 < argc) {
      const std::string v = argv[++i];
      if (v != "all_to_all" && v != "all_gather")
        user_error(fmt::format("gdn_layer: --cp-comm '{}' is not one of: all_to_all, all_gather", v));
      cp_comm = v == "all_gather" ? layers::GdnCpComm::all_gather : layers::GdnCpComm::all_to_all;
    }
  }
  dist::ParallelDims dims{tp, cp, -1};
  if (std::string e = dims.resolve(dist::world_size()); !e.empty()) user_error(e);
  if (energy_kernels && dist::world_size() > 1)
    user_error(fmt::format("gdn_layer: --energy-kernels runs on one GPU (world size {}): a kernel alone "
                           "cannot be replayed beside collectives", dist::world_size()));
  Device dev = Device::cuda(dist::select_cuda_device());
  dist::ProcessGroups pg = dist::ProcessGroups::build(dims, dist::cuda_backend());
  cudaStream_t st;
  DT_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  Stream s{st};

  layers::GdnConfig cfg;
  cfg.hidden = 2048;
  cfg.num_k_heads = 16;
  cfg.num_v_heads = 32;
  layers::RunCtx ctx;
  ctx.pg = &pg;
  ctx.sp = sp;
  ctx.device = dev;
  ctx.act_dtype = DType::bf16;
  ctx.stream = s;
  ctx.seed = 1234;
  ctx.gdn_cp_comm = cp_comm;
  ctx.gdn_recompute = recompute;
  ctx.gdn_recompute_v = recompute_v;
  layers::GatedDeltaNet layer(cfg, "model.layers.0", ctx);

  // Packed lengths in [256, 8192], each a multiple of 2*cp; T_global = tokens_per_gpu * cp * (tp if SP).
  const int spn = sp ? tp : 1;
  const int64_t T = tokens_per_gpu * cp;
  std::mt19937_64 gen(42);
  std::uniform_int_distribution<int64_t> len(256, 8192);
  std::vector<int64_t> cu{0};
  while (cu.back() < T) {
    int64_t l = std::min<int64_t>(len(gen) / (2 * cp) * (2 * cp), T - cu.back());
    cu.push_back(cu.back() + l);
  }
  const int64_t T_local = T / (int64_t(cp) * spn);
  data::PackedSeqParams psp = data::PackedSeqParams::build({cu, cu, 1, T_local, spn, cp, pg.coord.cp}, dev, s, true);

  const int64_t H = cfg.hidden;
  Tensor x = Tensor::empty(Shape{T_local, H}, DType::bf16, dev), dy = Tensor::empty(Shape{T_local, H}, DType::bf16, dev);
  Tensor y = Tensor::empty(Shape{T_local, H}, DType::bf16, dev), dx = Tensor::empty(Shape{T_local, H}, DType::bf16, dev);
  ops::rng_normal(x, 1, 1, 0.f, 1.f, ops::RngSlice::whole(x), s);
  ops::rng_normal(dy, 1, 2, 0.f, 1.f, ops::RngSlice::whole(dy), s);

  // As the decoder layer runs it (model/qwen35.cpp): the input lent for the backward, not copied.
  auto forward = [&] {
    layer.lend_input(x);
    layer.forward(y, x, psp);
  };
  float fwd = bench::median_ms([&] { forward(); }, st);
  float fb = bench::median_ms([&] { forward(); layer.backward(dx, dy, psp); }, st);

  // Energy per fwd+bwd (NVML), over back-to-back steps as training runs them: at the power cap the
  // steady time follows it (v0.29.0). Every rank runs the steps (they hold collectives at tp, cp
  // > 1), whether or not its NVML answers.
  bench::EnergyMeter em(dev.index);
  double energy_j = -1, energy_w = 0, b2b_ms = 0;
  {
    constexpr int kSteps = 30;
    cudaEvent_t e0, e1;
    DT_CUDA_CHECK(cudaEventCreate(&e0));
    DT_CUDA_CHECK(cudaEventCreate(&e1));
    DT_CUDA_CHECK(cudaStreamSynchronize(st));
    const long long mj = em.measure([&] {
      DT_CUDA_CHECK(cudaEventRecord(e0, st));
      for (int i = 0; i < kSteps; ++i) {
        forward();
        layer.backward(dx, dy, psp);
      }
      DT_CUDA_CHECK(cudaEventRecord(e1, st));
      DT_CUDA_CHECK(cudaEventSynchronize(e1));
    });
    float ms = 0;
    DT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    DT_CUDA_CHECK(cudaEventDestroy(e0));
    DT_CUDA_CHECK(cudaEventDestroy(e1));
    b2b_ms = ms / kSteps;
    if (mj >= 0) {
      energy_j = 1e-3 * double(mj) / kSteps;
      energy_w = double(mj) / ms;  // mJ / ms
    }
  }

  // One fwd+bwd captured as a CUDA graph, after warm-ups (the allocator holds every block the step needs).
  auto capture_step = [&](cudaGraph_t* g, cudaGraphExec_t* ge) {
    DT_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    forward();
    layer.backward(dx, dy, psp);
    DT_CUDA_CHECK(cudaStreamEndCapture(st, g));
    DT_CUDA_CHECK(cudaGraphInstantiate(ge, *g, 0));
  };
  float fb_graph = 0.f;
  if (graph) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    capture_step(&g, &ge);
    fb_graph = bench::median_ms([&] { DT_CUDA_CHECK(cudaGraphLaunch(ge, st)); }, st);
    DT_CUDA_CHECK(cudaGraphExecDestroy(ge));
    DT_CUDA_CHECK(cudaGraphDestroy(g));
  }
  bench::GraphEnergy kernel_energy;
  if (energy_kernels) {  // after the timing; serial -> per-chunk flag waits off (graph_energy.h)
    const bench::EnvRestore restore("DT_GDN_SERIAL_PDL");
    setenv("DT_GDN_SERIAL_PDL", "0", 1);
    forward();  // the allocator's blocks for this setting, before the capture
    layer.backward(dx, dy, psp);
    DT_CUDA_CHECK(cudaStreamSynchronize(st));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    capture_step(&g, &ge);
    kernel_energy = bench::graph_kernel_energy(g, ge, st, em);
    DT_CUDA_CHECK(cudaGraphExecDestroy(ge));
    DT_CUDA_CHECK(cudaGraphDestroy(g));
  }
  if (trace) {  // after the timing: the trace's own cost stays out of the medians above
    DT_CUDA_CHECK(cudaStreamSynchronize(st));
    bench::KernelTrace tr;
    constexpr int kReps = 10;
    if (tr.start()) {
      for (int i = 0; i < kReps; ++i) {
        forward();
        layer.backward(dx, dy, psp);
      }
      DT_CUDA_CHECK(cudaStreamSynchronize(st));
      tr.stop_and_print(kReps, dist::world_rank() == 0);
    }
  }
  if (!ab.empty()) {
    const int kRounds = ab_rounds;
    const bench::EnvRestore restore(ab);  // as it was, for what runs after
    std::vector<float> ms[2], diff;
    long long mj[2] = {0, 0};  // each side's energy over all its steps (warm-ups included)
    bool mj_ok = em.ok();
    for (int r = 0; r < kRounds; ++r) {
      float t[2];
      for (int k = 0; k < 2; ++k) {
        const int v = (r & 1) ? 1 - k : k;  // ABBA
        setenv(ab.c_str(), ab_val[v].c_str(), 1);
        DT_CUDA_CHECK(cudaStreamSynchronize(st));
        const long long e = em.measure([&] {  // median_ms ends synchronised
          t[v] = bench::median_ms([&] { forward(); layer.backward(dx, dy, psp); }, st, ab_block, ab_block);
        });
        mj_ok = mj_ok && e >= 0;
        mj[v] += e;
        ms[v].push_back(t[v]);
      }
      diff.push_back(t[1] - t[0]);
    }
    const int wins = int(std::count_if(diff.begin(), diff.end(), [](float d) { return d < 0.f; }));
    if (dist::world_rank() == 0)
      std::printf("A/B %s (fwd+bwd, %d rounds ABBA, blocks of %d + %d): %s: %.3f ms | %s: %.3f ms | median of (%s - %s) "
                  "%+.3f ms | %s faster in %d of %d\n",
                  ab.c_str(), kRounds, ab_block, ab_block, ab_val[0].c_str(), bench::median(ms[0]), ab_val[1].c_str(),
                  bench::median(ms[1]), ab_val[1].c_str(), ab_val[0].c_str(), bench::median(diff), ab_val[1].c_str(), wins,
                  kRounds);
    // With the host's sync after every step inside (median_ms), so not comparable with the
    // back-to-back figure; ABBA puts any lag of the counter's updates on both sides alike.
    if (dist::world_rank() == 0 && mj_ok)
      std::printf("A/B %s energy per fwd+bwd (NVML, warm-ups and syncs included): %s: %.3f J | %s: %.3f J\n",
                  ab.c_str(), ab_val[0].c_str(), 1e-3 * double(mj[0]) / (2.0 * ab_block * kRounds), ab_val[1].c_str(),
                  1e-3 * double(mj[1]) / (2.0 * ab_block * kRounds));
  }
  if (profile) {
    DT_CUDA_CHECK(cudaStreamSynchronize(st));
    DT_CUDA_CHECK(cudaProfilerStart());
    forward();
    layer.backward(dx, dy, psp);
    DT_CUDA_CHECK(cudaStreamSynchronize(st));
    DT_CUDA_CHECK(cudaProfilerStop());
  }

  float a2a = 0.f;
  const bool gather = cp_comm == layers::GdnCpComm::all_gather;
  if (cp > 1 && gather) {  // the same data movement alone: x and dy gathered, y and dx scattered
    Tensor loc = Tensor::zeros(Shape{T / cp, H}, DType::bf16, dev, s);
    Tensor full = Tensor::empty(Shape{T, H}, DType::bf16, dev), nat = Tensor::empty(Shape{T, H}, DType::bf16, dev);
    a2a = bench::median_ms([&] {
      for (int dir = 0; dir < 2; ++dir) {  // forward, backward: the same collectives
        pg.cp->all_gather(full, loc, s);
        ops::gather_rows(nat, full, psp.cp_idx_dev(), s);
        ops::gather_rows(full, nat, psp.cp_inv_dev(), s);
        pg.cp->reduce_scatter(loc, full, dist::ReduceOp::sum, s);
      }
    }, st);
  } else if (cp > 1) {  // the same data movement alone: cp2hp + hp2cp forward and backward
    const int64_t qk_t = 16 * 128 / tp, v_t = 32 * 128 / tp, h_t = 32 / tp, C = 2 * qk_t + 2 * v_t + 2 * h_t;
    ops::CpHeadLayout heads({qk_t, qk_t, v_t, v_t, h_t, h_t}, cp, dev, s);
    Tensor in = Tensor::zeros(Shape{T / cp, C}, DType::bf16, dev, s), hp = Tensor::empty(Shape{T, C / cp}, DType::bf16, dev);
    Tensor o = Tensor::zeros(Shape{T, v_t / cp}, DType::bf16, dev, s), out = Tensor::empty(Shape{T / cp, v_t}, DType::bf16, dev);
    a2a = bench::median_ms([&] {
      ops::cp2hp_fwd(hp, in, heads, psp.cp_map(), *pg.cp, ops::CpA2aImpl::fused, s);
      ops::hp2cp_fwd(out, o, psp.cp_map(), *pg.cp, ops::CpA2aImpl::fused, s);
      ops::hp2cp_bwd(o, out, psp.cp_map(), *pg.cp, ops::CpA2aImpl::fused, s);
      ops::cp2hp_bwd(in, hp, heads, psp.cp_map(), *pg.cp, ops::CpA2aImpl::fused, s);
    }, st);
  }
  if (dist::world_rank() == 0) {
    const char* pins = std::getenv("DT_GEMM_ALGO");  // tuned GEMM candidates, named so a log says so
    std::printf("gdn_layer tp %d sp %d cp %d: %lld tokens/GPU (global T %lld, %zu seqs), bf16, recompute %d%s%s\n", tp,
                int(sp), cp, static_cast<long long>(T / (int64_t(cp) * tp)), static_cast<long long>(T), cu.size() - 1,
                int(recompute), pins && *pins ? ", DT_GEMM_ALGO=" : "", pins && *pins ? pins : "");
    std::printf("  fwd %.2f ms | fwd+bwd %.2f ms | %.0f tokens/s per GPU (fwd+bwd)", fwd, fb,
                double(T) / (cp * tp) / (fb * 1e-3));
    if (graph) std::printf(" | fwd+bwd as one CUDA graph %.2f ms", fb_graph);
    if (cp > 1 && gather)
      std::printf(" | all_gather (x, dy gathered; y, dx reduce-scattered; fwd+bwd) %.2f ms = %.0f%%", a2a,
                  100.0 * a2a / fb);
    else if (cp > 1)
      std::printf(" | all-to-all (cp2hp+hp2cp, fwd+bwd) %.2f ms = %.0f%%", a2a, 100.0 * a2a / fb);
    if (energy_j >= 0)
      std::printf("\n  30 fwd+bwd back to back: %.2f ms each, %.2f J each, %.0f W average (NVML)", b2b_ms, energy_j,
                  energy_w);
    else
      std::printf("\n  30 fwd+bwd back to back: %.2f ms each; energy n/a (%s)", b2b_ms,
                  em.ok() ? "an NVML read failed" : em.why().c_str());
    std::printf("\n  reference (1 H200, Megatron-style PyTorch + FLA): fwd 6.9 ms, fwd+bwd 22.4 ms; target fwd+bwd <= 15 ms\n");
    if (energy_kernels) {
      // net: less an empty launch (the base row), for the short kernels
      const bench::KernelEnergy& b = kernel_energy.base;
      const bench::KernelEnergy& w = kernel_energy.whole;
      const bool nvml = b.mj >= 0 && w.mj >= 0 &&
                        std::all_of(kernel_energy.kernels.begin(), kernel_energy.kernels.end(),
                                    [](const bench::KernelEnergy& k) { return k.mj >= 0; });
      std::printf("  each kernel alone, back to back (--energy-kernels; launch order)%s:\n",
                  nvml ? "" : "; energy n/a (NVML)");
      std::printf("  %4s %9s %9s %7s %9s %9s  %s\n", "#", "ms", "mJ", "W", "net ms", "net mJ", "kernel");
      auto row = [&](const char* idx, const bench::KernelEnergy& k) {
        const std::string name = (k.setup ? fmt::format("(+{} memset/memcpy) ", k.setup) : "") + k.name;
        if (nvml)
          std::printf("  %4s %9.3f %9.2f %7.0f %9.3f %9.2f  %.110s\n", idx, k.ms, k.mj, k.watts, k.ms - b.ms, k.mj - b.mj,
                      name.c_str());
        else
          std::printf("  %4s %9.3f %9s %7s %9.3f %9s  %.110s\n", idx, k.ms, "-", "-", k.ms - b.ms, "-", name.c_str());
      };
      row("base", b);
      double sum_ms = 0, sum_mj = 0;
      for (size_t i = 0; i < kernel_energy.kernels.size(); ++i) {
        const bench::KernelEnergy& k = kernel_energy.kernels[i];
        sum_ms += k.ms - b.ms;
        sum_mj += k.mj - b.mj;
        row(std::to_string(i).c_str(), k);
      }
      if (nvml)
        std::printf("  kernels alone, net, summed: %.3f ms, %.1f mJ | the step as one graph: %.3f ms, %.1f mJ, %.0f W\n",
                    sum_ms, sum_mj, w.ms, w.mj, w.watts);
      else
        std::printf("  kernels alone, net, summed: %.3f ms | the step as one graph: %.3f ms\n", sum_ms, w.ms);
      std::printf("  (%d memset / memcpy nodes in the graph, each run with the kernel after it)\n",
                  kernel_energy.setup_nodes);
      if (kernel_energy.other_nodes > 0)
        std::printf("  (%d child-graph or conditional nodes not covered)\n", kernel_energy.other_nodes);
    }
  }
  dist::finalize();
  return 0;
}
