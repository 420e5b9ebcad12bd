// GatedDeltaNet layer on CUDA (NCCL between GPUs), one process per GPU. See gdn_layer_harness.h.
//  * f32: every layout against the serial fp32 CPU oracle, rel. L2 < 1e-4 (fp32 GEMMs without
//    TF32 and fp32 kernels).
//  * bf16, parallel vs serial: every layout against the single-GPU bf16 run of the same layer,
//    rel. L2 < 2e-2 (issue 4's bf16 bound).
//  * bf16 accuracy: the single-GPU bf16 layer against the fp32 CPU oracle at a realistic
//    config (HF init std 0.02, dk = dv = 32), rel. L2 < 3e-2 for y, dX and every gradient. The
//    large-magnitude test config above (init std 0.2) amplifies bf16 storage errors through the
//    l2norm and dbeta backward (4-10e-2 measured on an H200), so it only bounds bf16 vs bf16.
// 1 GPU: (1,F,1). 2 GPUs (mpirun -np 2): (2,F,1), (2,T,1), (1,F,2).
#include "gdn_layer_harness.h"

using namespace dt;
using namespace dt::testing;

TEST(GdnLayerCuda, MatchesSerial) {
  const layers::GdnConfig cfg = gdn_small_config();
  const uint64_t seed = test_seed();
  Device dev = Device::cuda(dist::select_cuda_device());
  GdnReference R32 = gdn_reference(cfg, seed);
  GdnReference R16 = gdn_reference(cfg, seed, dist::Backend::nccl, dev, DType::bf16);
  std::vector<GdnLayout> layouts = {{1, 1, false}};
  if (dist::world_size() == 2) layouts = {{2, 1, false}, {2, 1, true}, {1, 2, false}};
  for (const GdnLayout& L : layouts) {
    check_gdn_layout(L, cfg, R32, seed, dist::Backend::nccl, dev, DType::f32, 1e-4);
    check_gdn_layout(L, cfg, R16, seed, dist::Backend::nccl, dev, DType::bf16, 2e-2);
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
  GdnReference R16 = gdn_reference(cfg, seed, dist::Backend::nccl, dev, DType::bf16);
  auto report = [](const char* what, const TensorView& got, const TensorView& ref) {
    std::printf("[gdn-layer bf16 vs fp32] %-45s %s\n", what, compare(got, ref).str().c_str());
    return close_rel(got, ref, 3e-2);
  };
  EXPECT_TRUE(report("y", R16.out.y, R32.out.y));
  EXPECT_TRUE(report("dx", R16.out.dx, R32.out.dx));
  for (size_t k = 0; k < R32.specs.size(); ++k)
    EXPECT_TRUE(report(R32.specs[k].name.c_str(), R16.out.grads[k], R32.out.grads[k]));
  // The large-magnitude config too, reported (not bounded: see the file header).
  GdnReference S32 = gdn_reference(gdn_small_config(), seed);
  GdnReference S16 = gdn_reference(gdn_small_config(), seed, dist::Backend::nccl, dev, DType::bf16);
  std::printf("[gdn-layer bf16 vs fp32, init std 0.2] y %s | dx %s\n", compare(S16.out.y, S32.out.y).str().c_str(),
              compare(S16.out.dx, S32.out.dx).str().c_str());
  for (size_t k = 0; k < S32.specs.size(); ++k)
    std::printf("[gdn-layer bf16 vs fp32, init std 0.2] %-45s %s\n", S32.specs[k].name.c_str(),
                compare(S16.out.grads[k], S32.out.grads[k]).str().c_str());
}
