// RmsNorm1p and SwiGluMlp on CUDA (NCCL between GPUs), one process per GPU. See
// dense_layer_harness.h. f32: every layout against the serial fp32 CPU oracle (rel. L2 < 1e-4).
// bf16: every layout against the single-GPU bf16 run (< 2e-2), and the single-GPU bf16 run
// against the fp32 oracle (< 2e-2: these per-token layers have no cancellation-prone path).
// 1 GPU: (1,F,1); 2 GPUs: (2,F,1), (2,T,1), (1,F,2); 4 GPUs: (2,T,2), (4,T,1), (1,F,4).
#include "dense_layer_harness.h"
#include "deltatron/layers/mlp.h"
#include "deltatron/layers/norm.h"

using namespace dt;
using namespace dt::testing;

namespace {
std::vector<GdnLayout> gpu_layouts(int world) {
  if (world == 2) return {{2, 1, false}, {2, 1, true}, {1, 2, false}};
  if (world == 4) return {{2, 2, true}, {4, 1, true}, {1, 4, false}};
  return {{1, 1, false}};
}

void check_all(int64_t H, const DenseFn& fn) {
  const uint64_t seed = test_seed();
  Device dev = Device::cuda(dist::select_cuda_device());
  DenseReference R32 = dense_reference(H, fn, seed);
  DenseReference R16 = dense_reference(H, fn, seed, dist::cuda_backend(), dev, DType::bf16);
  EXPECT_TRUE(close_rel(R16.out.y, R32.out.y, 2e-2)) << "bf16 y vs fp32";
  EXPECT_TRUE(close_rel(R16.out.dx, R32.out.dx, 2e-2)) << "bf16 dx vs fp32";
  for (size_t k = 0; k < R32.out.grads.size(); ++k)
    EXPECT_TRUE(close_rel(R16.out.grads[k], R32.out.grads[k], 2e-2)) << "bf16 vs fp32 " << R32.out.specs[k].name;
  for (const GdnLayout& L : gpu_layouts(dist::world_size())) {
    check_dense_layout(L, H, fn, R32, seed, dist::cuda_backend(), dev, DType::f32, 1e-4);
    check_dense_layout(L, H, fn, R16, seed, dist::cuda_backend(), dev, DType::bf16, 2e-2);
  }
}
}  // namespace

TEST(DenseLayersCuda, RmsNorm1pMatchesSerial) {
  constexpr int64_t H = 48;
  const uint64_t seed = test_seed();
  check_all(H, [seed](const layers::RunCtx& ctx, const TensorView& x, const TensorView& dy, bool reduce) {
    layers::RmsNorm1p norm(H, 1e-6f, "model.layers.0.input_layernorm.weight", ctx);
    Tensor wh = Tensor::empty(Shape{H}, DType::f32);  // random, so that (1 + w) matters
    ops::rng_normal(wh, seed, 301, 0.f, 0.5f, ops::RngSlice::whole(wh));
    ops::copy(norm.weight().master, ops::to_device(wh, ctx.device));
    return run_dense(norm, ctx, x, dy, reduce);
  });
}

TEST(DenseLayersCuda, SwiGluMlpMatchesSerial) {
  layers::MlpConfig c;
  c.hidden = 40;
  c.intermediate = 72;
  c.init_std = 0.2f;
  check_all(c.hidden, [c](const layers::RunCtx& ctx, const TensorView& x, const TensorView& dy, bool reduce) {
    layers::SwiGluMlp mlp(c, "model.layers.3", ctx);
    return run_dense(mlp, ctx, x, dy, reduce);
  });
}
