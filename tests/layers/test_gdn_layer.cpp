// GatedDeltaNet layer on the CPU backend: parallel vs serial under every (tp, sp, cp) layout
// of the world size (mpirun -np 1, 2, 4, 8), packed with unequal lengths and alignment padding
// (fp32, rel. L2 < 1e-5 for y, dX and every weight gradient, or 4x the gradient's own rounding
// noise where that is larger: A_log and dt_bias up to ~3.5e-4, a few others ~1.2e-5, on some seeds;
// see gdn_reference), each CP layout under both
// gdn.cp_comm schemes (all_to_all, all_gather; compared with each other too), each bitwise
// equal with gdn.recompute_elementwise on and off and gdn.recompute_v off; packed vs per-sequence;
// what the forward keeps under recompute_elementwise and recompute_v; layout validation messages.
// See gdn_layer_harness.h.
#include "gdn_layer_harness.h"

#include "deltatron/core/allocator.h"

using namespace dt;
using namespace dt::testing;

namespace {
std::vector<GdnLayout> layouts_for(int world) {
  if (world == 1) return {{1, 1, false}};
  if (world == 2) return {{2, 1, false}, {2, 1, true}, {1, 2, false}};
  if (world == 4) return {{1, 4, false}, {2, 2, false}, {2, 2, true}, {4, 1, true}};
  if (world == 8) return {{2, 2, true}};  // dp 2 beside it (issue 8's 8-GPU layout, on the CPU backend)
  return {};
}
}  // namespace

TEST(GdnLayerParallel, MatchesSerialUnderEveryLayout) {
  const layers::GdnConfig cfg = gdn_small_config();
  const uint64_t seed = test_seed();
  GdnReference R = gdn_reference(cfg, seed, dist::Backend::mpi, Device::cpu(), DType::f32, /*gentle_a_log=*/true,
                                 /*noise_floor=*/true);
  for (const GdnLayout& L : layouts_for(dist::world_size()))
    check_gdn_layout(L, cfg, R, seed, dist::Backend::mpi, Device::cpu(), DType::f32, 1e-5, /*gentle_a_log=*/true);
}

TEST(GdnLayerPacked, PackedEqualsPerSequence) {
  if (dist::world_size() != 1) GTEST_SKIP() << "single-process test";
  const layers::GdnConfig cfg = gdn_small_config();
  const uint64_t seed = test_seed();
  GdnReference R = gdn_reference(cfg, seed);  // the packed run
  dist::ParallelDims dims{1, 1, 1};
  ASSERT_EQ(dims.resolve(1), "");
  dist::ProcessGroups pg = dist::ProcessGroups::build(dims, dist::Backend::mpi);
  layers::RunCtx ctx;
  ctx.pg = &pg;
  ctx.seed = seed;
  layers::GatedDeltaNet single(cfg, "model.layers.0", ctx);  // grads accumulate over the sequences
  const int64_t T = R.x.shape()[0], H = cfg.hidden;
  Tensor y = Tensor::empty(Shape{T, H}, DType::f32), dx = Tensor::empty(Shape{T, H}, DType::f32);
  GdnRun last;
  for (size_t i = 0; i < kGdnRealLens.size(); ++i) {
    int64_t b = R.cu[i], n = kGdnRealLens[i];
    Tensor xi = rows_of(R.x, b, n), dyi = rows_of(R.dy, b, n);
    last = run_gdn(single, xi, dyi, data::PackedSeqParams::build({{0, n}, {0, n}, 1, n, 1, 1, 0}));
    ops::copy(y.view().slice(0, b, b + n), last.y);
    ops::copy(dx.view().slice(0, b, b + n), last.dx);
  }
  // The kernels are bitwise packed == separate (test_gdn_cpu); here the GEMMs sum over other
  // token blocks and the per-sequence gradients accumulate in fp32 one sequence at a time,
  // so the bound is fp32 summation-order noise (measured up to 1.1e-6 on weight gradients).
  EXPECT_TRUE(close_rel(R.out.y, y, 1e-5));
  EXPECT_TRUE(close_rel(R.out.dx, dx, 1e-5));
  for (size_t k = 0; k < R.specs.size(); ++k)
    EXPECT_TRUE(close_rel(R.out.grads[k], last.grads[k], 1e-5)) << R.specs[k].name;
}

// Bytes the layer holds after its forward (saved for the backward): recompute_elementwise drops
// exactly the conv output's v columns [T, v], l2norm(q, k) and their rstd (64-byte host blocks;
// the conv output's q|k columns are never stored), and with recompute_v=false all of that but v;
// z stays in place in the projection output.
TEST(GdnLayerMemory, RecomputeKeepsLessAfterForward) {
  if (dist::world_size() != 1) GTEST_SKIP() << "single-process test";
  const layers::GdnConfig c = gdn_small_config();
  dist::ParallelDims dims{1, 1, 1};
  ASSERT_EQ(dims.resolve(1), "");
  dist::ProcessGroups pg = dist::ProcessGroups::build(dims, dist::Backend::mpi);
  Tensor x, dy;
  std::vector<int64_t> cu;
  serial_inputs(c.hidden, test_seed(), 101, &x, &dy, &cu);
  const int64_t T = cu.back();
  data::PackedSeqParams psp = data::PackedSeqParams::build({cu, cu, 1, T, 1, 1, 0});
  Tensor y = Tensor::empty(x.shape(), DType::f32);
  auto kept_after_forward = [&](bool recompute, bool recompute_v = true) {
    layers::RunCtx ctx;
    ctx.pg = &pg;
    ctx.gdn_recompute = recompute;
    ctx.gdn_recompute_v = recompute_v;
    layers::GatedDeltaNet layer(c, "model.layers.0", ctx);
    const int64_t before = host_allocator().stats().allocated_bytes;
    layer.forward(y, x, psp);
    return host_allocator().stats().allocated_bytes - before;
  };
  auto block = [](int64_t n) { return (n * 4 + 63) / 64 * 64; };  // f32 elements -> host block bytes
  const int64_t qk = c.num_k_heads * c.head_k_dim, v = c.num_v_heads * c.head_v_dim;
  const int64_t dropped = block(T * v) + 2 * block(T * qk) + 2 * block(T * c.num_k_heads);
  EXPECT_EQ(kept_after_forward(false) - kept_after_forward(true), dropped);
  // gdn.recompute_v=false keeps v: the forward drops l2norm(q, k) and rstd only
  EXPECT_EQ(kept_after_forward(false) - kept_after_forward(true, false), dropped - block(T * v));
  EXPECT_EQ(kept_after_forward(false, false), kept_after_forward(false));  // without recompute it means nothing
}

TEST(GdnLayerConfig, LayoutRulesNameTheValues) {
  layers::GdnConfig c = gdn_small_config();
  EXPECT_EQ(layers::GatedDeltaNet::check_layout(c, 2, 2), "");
  EXPECT_EQ(layers::GatedDeltaNet::check_layout(c, 2, 4),
            "config: GDN head-parallel CP needs tp*cp=8 to divide linear_num_key_heads=4 and linear_num_value_heads=8");
  c.num_v_heads = 6;
  EXPECT_EQ(layers::GatedDeltaNet::check_layout(c, 1, 1),
            "config: model.linear_num_value_heads=6 is not a multiple of model.linear_num_key_heads=4");
}

// The layer's own checks of what the caller hands it (program errors: they abort with the
// message): packed params built for another layout, an input of the wrong shape, a backward
// with no forward before it.
TEST(GdnLayerDeathTest, CallerErrorsNameTheProblem) {
  if (dist::world_size() != 1) GTEST_SKIP() << "single-process test";
  const layers::GdnConfig c = gdn_small_config();
  auto S = serial_setting(test_seed(), dist::Backend::mpi, Device::cpu(), DType::f32);
  layers::GatedDeltaNet layer(c, "model.layers.0", S->ctx);
  const int64_t T = 8, H = c.hidden;
  Tensor x = Tensor::zeros(Shape{T, H}, DType::f32), y = Tensor::empty(Shape{T, H}, DType::f32);
  data::PackedSeqParams psp = data::PackedSeqParams::build({{0, T}, {0, T}, 1, T, 1, 1, 0});
  data::PackedSeqParams cp2 = data::PackedSeqParams::build({{0, T}, {0, T}, 1, T / 2, 1, 2, 0});
  EXPECT_DEATH(layer.forward(y, x, cp2), "packed params built for cp 2 sp 1, layer runs cp 1 sp 1");
  Tensor x_wide = Tensor::zeros(Shape{T, H + 1}, DType::f32);
  EXPECT_DEATH(layer.forward(y, x_wide, psp), "GatedDeltaNet input x \\[T_local, hidden\\]");
  EXPECT_DEATH(layer.backward(x, y, psp), "backward without forward");
}
