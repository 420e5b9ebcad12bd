// GatedDeltaNet layer on CUDA (NCCL between GPUs), one process per GPU. See gdn_layer_harness.h.
//  * f32: every layout against the serial fp32 CPU oracle, rel. L2 < 1e-4 (fp32 GEMMs without
//    TF32 and fp32 kernels), with the CPU check's gentle A_log (the test says why).
//  * bf16, parallel vs serial: every layout against the single-GPU bf16 run of the same layer,
//    rel. L2 < 2e-2 (issue 4's bf16 bound).
//  * bf16 accuracy: the single-GPU bf16 layer against the fp32 CPU oracle at a realistic
//    config (HF init std 0.02, dk = dv = 32), rel. L2 < 3e-2 for y, dX and every gradient but the
//    [Hv] token sums dt_bias, A_log (printed: ill-conditioned, see the test). The
//    large-magnitude test config above (init std 0.2) amplifies bf16 storage errors through the
//    l2norm and dbeta backward (4-10e-2 measured on an H200), so it only bounds bf16 vs bf16.
//  * every layout and scheme with gdn.recompute_elementwise off vs on (the default): bitwise
//    equal y, dX and gradients (the same deterministic kernels on the same inputs; harness).
// 1 GPU: (1,F,1). 2 GPUs (mpirun -np 2): (2,F,1), (2,T,1), (1,F,2). 4 GPUs (mpirun -np 4):
// (2,T,2), (4,T,1), (1,F,4). 8 GPUs: (2,T,2) with dp 2.
#include <cuda_runtime.h>

#include "deltatron/core/allocator.h"
#include "gdn_layer_harness.h"

using namespace dt;
using namespace dt::testing;

TEST(GdnLayerCuda, MatchesSerial) {
  const layers::GdnConfig cfg = gdn_small_config();
  const uint64_t seed = test_seed();
  Device dev = Device::cuda(dist::select_cuda_device());
  // Gentle A_log, as the CPU parallel check (set_gentle_a_log). Under the HF init's strong decays the
  // [Hv] token sums A_log and dt_bias cancel heavily, so one rounding of the inputs moves them by up
  // to ~1e-4 (the CPU harness's noise floor), and one draw put them past 1e-4
  // (DT_TEST_SEED=1796585997751722926, H100, np 4: 1.5e-4 and 1.8e-4 in one head at tp 2 x cp 2
  // all_gather and at tp 4, while all_to_all read 5e-7 from the CPU on the same draw). With the
  // gentle decays that draw passes (H200, docs/perf.md v0.42.0).
  GdnReference R32 = gdn_reference(cfg, seed, dist::Backend::mpi, Device::cpu(), DType::f32, /*gentle_a_log=*/true);
  GdnReference R16 = gdn_reference(cfg, seed, dist::cuda_backend(), dev, DType::bf16, /*gentle_a_log=*/true);
  std::vector<GdnLayout> layouts = {{1, 1, false}};
  if (dist::world_size() == 2) layouts = {{2, 1, false}, {2, 1, true}, {1, 2, false}};
  if (dist::world_size() == 4) layouts = {{2, 2, true}, {4, 1, true}, {1, 4, false}};  // issue 8's 4-GPU set
  if (dist::world_size() == 8) layouts = {{2, 2, true}};  // dp 2 beside it (issue 8's 8-GPU layout)
  for (const GdnLayout& L : layouts) {
    check_gdn_layout(L, cfg, R32, seed, dist::cuda_backend(), dev, DType::f32, 1e-4, /*gentle_a_log=*/true);
    check_gdn_layout(L, cfg, R16, seed, dist::cuda_backend(), dev, DType::bf16, 2e-2, /*gentle_a_log=*/true);
  }
}

TEST(GdnLayerCuda, Bf16AccuracyAgainstFp32Oracle) {
  layers::GdnConfig cfg = gdn_small_config();
  cfg.hidden = 64;
  cfg.num_k_heads = 2;
  cfg.num_v_heads = 4;
  cfg.head_k_dim = 32;
  cfg.head_v_dim = 32;
  cfg.init_std = 0.02f;
  const uint64_t seed = test_seed();
  Device dev = Device::cuda(dist::select_cuda_device());
  GdnReference R32 = gdn_reference(cfg, seed);
  GdnReference R16 = gdn_reference(cfg, seed, dist::cuda_backend(), dev, DType::bf16);
  auto report = [](const char* what, const TensorView& got, const TensorView& ref) {
    std::printf("[gdn-layer bf16 vs fp32] %-45s %s\n", what, compare(got, ref).str().c_str());
    return bool(close_rel(got, ref, 3e-2));
  };
  EXPECT_TRUE(report("y", R16.out.y, R32.out.y));
  EXPECT_TRUE(report("dx", R16.out.dx, R32.out.dx));
  // dt_bias and A_log are [Hv] = 4 sums over every token of terms of both signs: with cancellation
  // their relative error is the per-token bf16 error times sum|term| / |sum|, which depends on the
  // draw (H200, 8 seeds: 0.7% to 24%; a 4.6% seed gave the same to 3 digits with libm and MUFU
  // gate math), so they are printed, not bounded, here. Their math is bounded where it is well conditioned: CUDA fp32
  // vs the CPU oracle at 1e-4 and bf16 parallel vs serial in MatchesSerial, the gate kernels
  // element by element in test_gdn_small_cuda.
  for (size_t k = 0; k < R32.specs.size(); ++k) {
    const std::string& name = R32.specs[k].name;
    const bool token_sum = name.ends_with(".dt_bias") || name.ends_with(".A_log");
    const bool ok = report(name.c_str(), R16.out.grads[k], R32.out.grads[k]);
    if (!token_sum) EXPECT_TRUE(ok) << name;
  }
  // The large-magnitude config too, reported (not bounded: see the file header).
  GdnReference S32 = gdn_reference(gdn_small_config(), seed);
  GdnReference S16 = gdn_reference(gdn_small_config(), seed, dist::cuda_backend(), dev, DType::bf16);
  std::printf("[gdn-layer bf16 vs fp32, init std 0.2] y %s | dx %s\n", compare(S16.out.y, S32.out.y).str().c_str(),
              compare(S16.out.dx, S32.out.dx).str().c_str());
  for (size_t k = 0; k < S32.specs.size(); ++k)
    std::printf("[gdn-layer bf16 vs fp32, init std 0.2] %-45s %s\n", S32.specs[k].name.c_str(),
                compare(S16.out.grads[k], S32.out.grads[k]).str().c_str());
}

// No device->host synchronisation inside the layer (thd-context-parallel.md R3): forward and
// backward are captured into a CUDA graph in global capture mode, where any synchronous copy,
// stream/device synchronisation or cudaMalloc fails the capture. The replay must give the
// eager run's bits (deterministic kernels). Eager runs first until the caching allocator makes
// no new segment (best fit may need a second or third repeat to settle) and the GEMM
// heuristics are warm, as in a steady-state step: a cudaMalloc inside the capture would abort.
TEST(GdnLayerCuda, ForwardBackwardCaptureIntoAGraph) {
  if (dist::world_size() != 1) GTEST_SKIP() << "single-GPU test";
  const layers::GdnConfig cfg = gdn_small_config();
  const uint64_t seed = test_seed();
  Device dev = Device::cuda(dist::select_cuda_device());
  cudaStream_t st;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  Stream s{st};
  dist::ParallelDims dims{1, 1, 1};
  ASSERT_EQ(dims.resolve(1), "");
  dist::ProcessGroups pg = dist::ProcessGroups::build(dims, dist::cuda_backend());
  layers::RunCtx ctx;
  ctx.pg = &pg;
  ctx.seed = seed;
  ctx.device = dev;
  ctx.act_dtype = DType::bf16;
  ctx.stream = s;
  layers::GatedDeltaNet layer(cfg, "model.layers.0", ctx);
  std::vector<int64_t> cu = cumsum(kGdnRealLens);
  const int64_t T = cu.back(), H = cfg.hidden;
  data::PackedSeqParams psp = data::PackedSeqParams::build({cu, cu, 1, T, 1, 1, 0}, dev, s, true);
  Tensor xh = Tensor::empty(Shape{T, H}, DType::f32), dyh = Tensor::empty(Shape{T, H}, DType::f32);
  ops::rng_normal(xh, seed, 301, 0.f, 1.f, ops::RngSlice::whole(xh));
  ops::rng_normal(dyh, seed, 302, 0.f, 1.f, ops::RngSlice::whole(dyh));
  Tensor x = upload(xh, dev, DType::bf16), dy = upload(dyh, dev, DType::bf16);
  Tensor y = Tensor::empty(Shape{T, H}, DType::bf16, dev), dx = Tensor::empty(Shape{T, H}, DType::bf16, dev);

  Allocator& al = cuda_allocator(dev.index);
  int64_t raw = 0;
  for (int i = 0; i < 3; ++i) {  // eager; the last run's gradients are the reference
    raw = al.stats().num_raw_allocs;
    for (model::Param& p : layer.params()) ops::fill(p.grad, 0.0, s);
    layer.forward(y, x, psp);
    layer.backward(dx, dy, psp);
  }
  ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  ASSERT_EQ(al.stats().num_raw_allocs, raw) << "the caching allocator still took new segments in the third eager run";
  Tensor y_ref = download_f32(y), dx_ref = download_f32(dx);
  std::vector<Tensor> g_ref;
  for (model::Param& p : layer.params()) {
    g_ref.push_back(download_f32(p.grad));
    ops::fill(p.grad, 0.0, s);
  }
  poison(y, s);
  poison(dx, s);

  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), cudaSuccess);
  layer.forward(y, x, psp);
  layer.backward(dx, dy, psp);
  ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess) << "the layer synchronised inside the step";
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  Tensor y_g = download_f32(y), dx_g = download_f32(dx);
  EXPECT_EQ(std::memcmp(y_g.data(), y_ref.data(), y_ref.nbytes()), 0) << "graph replay y differs";
  EXPECT_EQ(std::memcmp(dx_g.data(), dx_ref.data(), dx_ref.nbytes()), 0) << "graph replay dx differs";
  for (size_t k = 0; k < g_ref.size(); ++k) {
    Tensor g = download_f32(layer.params()[k].grad);
    EXPECT_EQ(std::memcmp(g.data(), g_ref[k].data(), g.nbytes()), 0) << layer.params()[k].spec.name;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
}
