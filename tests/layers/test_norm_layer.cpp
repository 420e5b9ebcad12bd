// RmsNorm1p layer on the CPU backend: parallel vs serial under every (tp, sp, cp) layout of the
// world size (mpirun -np 1, 2, 4) on packed batches of unequal lengths with alignment padding
// (fp32, rel. L2 < 1e-5 for y, dX and the weight gradient after reduce_grads: grad_sum_tp under
// SP, none without); packed vs per-sequence. See dense_layer_harness.h.
#include "dense_layer_harness.h"
#include "deltatron/layers/norm.h"

using namespace dt;
using namespace dt::testing;

namespace {
constexpr int64_t kH = 48;
// The weight is zeros-initialised (HF); tests overwrite it with N(0, 0.5) so that (1 + w) matters.
DenseFn norm_fn(uint64_t seed) {
  return [seed](const layers::RunCtx& ctx, const TensorView& x, const TensorView& dy, bool reduce) {
    layers::RmsNorm1p norm(kH, 1e-6f, "model.layers.0.input_layernorm.weight", ctx);
    model::Param& w = norm.weight();
    Tensor wh = Tensor::empty(Shape{kH}, DType::f32);
    ops::rng_normal(wh, seed, 301, 0.f, 0.5f, ops::RngSlice::whole(wh));
    ops::copy(w.master, ctx.device.is_cpu() ? wh : ops::to_device(wh, ctx.device));
    return run_dense(norm, ctx, x, dy, reduce);
  };
}
}  // namespace

TEST(NormLayer, SpecFollowsHfAndSp) {
  model::ParamSpec s = layers::RmsNorm1p::param_spec(kH, "model.norm.weight", true);
  EXPECT_EQ(s.name, "model.norm.weight");
  EXPECT_EQ(s.shape, Shape{kH});
  EXPECT_EQ(s.init.kind, model::Init::zeros);
  EXPECT_TRUE(s.keep_fp32);
  EXPECT_EQ(s.tp_dim, -1);
  EXPECT_TRUE(s.grad_sum_tp);
  EXPECT_FALSE(layers::RmsNorm1p::param_spec(kH, "model.norm.weight", false).grad_sum_tp);
}

TEST(NormLayer, MatchesSerialUnderEveryLayout) {
  const uint64_t seed = test_seed();
  DenseFn fn = norm_fn(seed);
  DenseReference R = dense_reference(kH, fn, seed);
  for (const GdnLayout& L : dense_layouts_for(dist::world_size()))
    check_dense_layout(L, kH, fn, R, seed, dist::Backend::mpi, Device::cpu(), DType::f32, 1e-5);
}

TEST(NormLayer, PackedEqualsPerSequence) {
  if (dist::world_size() != 1) GTEST_SKIP() << "single-process test";
  const uint64_t seed = test_seed();
  DenseFn fn = norm_fn(seed);
  DenseReference R = dense_reference(kH, fn, seed);
  dist::ParallelDims dims{1, 1, 1};
  ASSERT_EQ(dims.resolve(1), "");
  dist::ProcessGroups pg = dist::ProcessGroups::build(dims, dist::Backend::mpi);
  layers::RunCtx ctx;
  ctx.pg = &pg;
  ctx.seed = seed;
  std::vector<double> gsum(kH, 0.0);
  for (size_t i = 0; i < kGdnRealLens.size(); ++i) {
    int64_t b = R.cu[i], n = kGdnRealLens[i];
    DenseRun o = fn(ctx, rows_of(R.x, b, n), rows_of(R.dy, b, n), false);
    EXPECT_TRUE(close_rel(o.y, rows_of(R.out.y, b, n), 1e-6)) << "seq " << i;
    EXPECT_TRUE(close_rel(o.dx, rows_of(R.out.dx, b, n), 1e-6)) << "seq " << i;
    for (int64_t h = 0; h < kH; ++h) gsum[size_t(h)] += o.grads[0].ptr<float>()[h];
  }
  std::vector<double> want(R.out.grads[0].ptr<float>(), R.out.grads[0].ptr<float>() + kH);
  EXPECT_TRUE(close_rel(gsum, want, 1e-6));
}
