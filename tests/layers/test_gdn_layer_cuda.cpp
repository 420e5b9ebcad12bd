// GatedDeltaNet layer on CUDA (NCCL between GPUs) against the serial fp32 CPU reference:
// one process per GPU. 1 GPU: (1,F,1) in f32 (rel. L2 < 1e-4: fp32 GEMMs without TF32, fp32
// kernels) and bf16 (< 2e-2). 2 GPUs (mpirun -np 2): (2,F,1), (2,T,1), (1,F,2) in bf16
// (< 2e-2) and f32. See gdn_layer_harness.h.
#include "gdn_layer_harness.h"

using namespace dt;
using namespace dt::testing;

TEST(GdnLayerCuda, MatchesSerialCpu) {
  const layers::GdnConfig cfg = gdn_small_config();
  const uint64_t seed = test_seed();
  GdnReference R = gdn_reference(cfg, seed);
  Device dev = Device::cuda(dist::select_cuda_device());
  std::vector<GdnLayout> layouts = {{1, 1, false}};
  if (dist::world_size() == 2) layouts = {{2, 1, false}, {2, 1, true}, {1, 2, false}};
  for (const GdnLayout& L : layouts) {
    check_gdn_layout(L, cfg, R, seed, dist::Backend::nccl, dev, DType::f32, 1e-4);
    check_gdn_layout(L, cfg, R, seed, dist::Backend::nccl, dev, DType::bf16, 2e-2);
  }
}
