// SwiGluMlp layer on the CPU backend: parallel vs serial under every (tp, sp, cp) layout of the
// world size (mpirun -np 1, 2, 4) on packed batches of unequal lengths with alignment padding
// (fp32, rel. L2 < 1e-5 for y, dX and gate/up/down gradients sliced to the shard); packed vs
// per-sequence; HF names and TP split dims. See dense_layer_harness.h.
#include "dense_layer_harness.h"
#include "deltatron/layers/mlp.h"

using namespace dt;
using namespace dt::testing;

namespace {
layers::MlpConfig mlp_cfg() {
  layers::MlpConfig c;
  c.hidden = 40;
  c.intermediate = 72;
  c.init_std = 0.2f;
  return c;
}
DenseFn mlp_fn() {
  return [](const layers::RunCtx& ctx, const TensorView& x, const TensorView& dy, bool reduce) {
    layers::SwiGluMlp mlp(mlp_cfg(), "model.layers.3", ctx);
    return run_dense(mlp, ctx, x, dy, reduce);
  };
}
}  // namespace

TEST(MlpLayer, SpecsFollowHf) {
  auto specs = layers::SwiGluMlp::param_specs(mlp_cfg(), "model.layers.3");
  ASSERT_EQ(specs.size(), 3u);
  EXPECT_EQ(specs[0].name, "model.layers.3.mlp.gate_proj.weight");
  EXPECT_EQ(specs[1].name, "model.layers.3.mlp.up_proj.weight");
  EXPECT_EQ(specs[2].name, "model.layers.3.mlp.down_proj.weight");
  EXPECT_EQ(specs[0].shape, (Shape{72, 40}));
  EXPECT_EQ(specs[2].shape, (Shape{40, 72}));
  EXPECT_EQ(specs[0].tp_dim, 0);
  EXPECT_EQ(specs[1].tp_dim, 0);
  EXPECT_EQ(specs[2].tp_dim, 1);
  layers::MlpConfig c = mlp_cfg();
  c.intermediate = 70;
  EXPECT_EQ(layers::SwiGluMlp::check_layout(c, 4),
            "config: the column-parallel MLP needs tp=4 to divide intermediate_size=70");
}

TEST(MlpLayer, MatchesSerialUnderEveryLayout) {
  const uint64_t seed = test_seed();
  DenseFn fn = mlp_fn();
  const int64_t H = mlp_cfg().hidden;
  DenseReference R = dense_reference(H, fn, seed);
  for (const GdnLayout& L : dense_layouts_for(dist::world_size()))
    check_dense_layout(L, H, fn, R, seed, dist::Backend::mpi, Device::cpu(), DType::f32, 1e-5);
}

TEST(MlpLayer, PackedEqualsPerSequence) {
  if (dist::world_size() != 1) GTEST_SKIP() << "single-process test";
  const uint64_t seed = test_seed();
  DenseFn fn = mlp_fn();
  const int64_t H = mlp_cfg().hidden;
  DenseReference R = dense_reference(H, fn, seed);
  dist::ParallelDims dims{1, 1, 1};
  ASSERT_EQ(dims.resolve(1), "");
  dist::ProcessGroups pg = dist::ProcessGroups::build(dims, dist::Backend::mpi);
  layers::RunCtx ctx;
  ctx.pg = &pg;
  ctx.seed = seed;
  std::vector<std::vector<double>> gsum(3);
  for (size_t i = 0; i < kGdnRealLens.size(); ++i) {
    int64_t b = R.cu[i], n = kGdnRealLens[i];
    DenseRun o = fn(ctx, rows_of(R.x, b, n), rows_of(R.dy, b, n), false);
    EXPECT_TRUE(close_rel(o.y, rows_of(R.out.y, b, n), 1e-5)) << "seq " << i;  // GEMM blocking differs
    EXPECT_TRUE(close_rel(o.dx, rows_of(R.out.dx, b, n), 1e-5)) << "seq " << i;
    for (size_t k = 0; k < 3; ++k) {
      gsum[k].resize(size_t(o.grads[k].numel()), 0.0);
      for (int64_t e = 0; e < o.grads[k].numel(); ++e) gsum[k][size_t(e)] += o.grads[k].ptr<float>()[e];
    }
  }
  for (size_t k = 0; k < 3; ++k) {
    std::vector<double> want(R.out.grads[k].ptr<float>(), R.out.grads[k].ptr<float>() + R.out.grads[k].numel());
    EXPECT_TRUE(close_rel(gsum[k], want, 1e-5)) << R.out.specs[k].name;
  }
}

// A lent input is kept by reference (the backward reads the caller's tensor: writing it between
// forward and backward, which the contract forbids, changes the gradients), a plain view is
// copied (the same write changes nothing), and a lent tensor that is not the forward's x is
// ignored. With the contract kept, lent and copied runs are bitwise equal.
TEST(MlpLayer, LentInputIsKeptNotCopied) {
  if (dist::world_size() != 1) GTEST_SKIP() << "single-process test";
  dist::ParallelDims dims{1, 1, 1};
  ASSERT_EQ(dims.resolve(1), "");
  dist::ProcessGroups pg = dist::ProcessGroups::build(dims, dist::Backend::mpi);
  layers::RunCtx ctx;
  ctx.pg = &pg;
  ctx.seed = test_seed();
  const int64_t T = 37, H = mlp_cfg().hidden;
  Tensor x0 = Tensor::empty(Shape{T, H}, DType::f32), dy = Tensor::empty(Shape{T, H}, DType::f32);
  ops::rng_normal(x0, ctx.seed, 1, 0.f, 1.f, ops::RngSlice::whole(x0));
  ops::rng_normal(dy, ctx.seed, 2, 0.f, 1.f, ops::RngSlice::whole(dy));
  // mode 0: plain view; 1: lent; 2: another tensor lent. `clobber`: x zeroed after the forward.
  auto run = [&](int mode, bool clobber) {
    layers::SwiGluMlp mlp(mlp_cfg(), "model.layers.3", ctx);
    Tensor x = Tensor::empty(x0.shape(), DType::f32), y = Tensor::empty(x0.shape(), DType::f32),
           dx = Tensor::empty(x0.shape(), DType::f32);
    ops::copy(x, x0);
    if (mode == 1) mlp.lend_input(x);
    if (mode == 2) mlp.lend_input(Tensor::zeros(x0.shape(), DType::f32));
    mlp.forward(y, x);
    if (clobber) ops::fill(x.view(), 0.0);
    mlp.backward(dx, dy);
    std::vector<float> out(dx.ptr<float>(), dx.ptr<float>() + dx.numel());
    for (const model::Param& p : mlp.params()) out.insert(out.end(), p.grad.ptr<float>(), p.grad.ptr<float>() + p.grad.numel());
    return out;
  };
  const std::vector<float> copied = run(0, false);
  EXPECT_EQ(run(1, false), copied) << "lent, contract kept: bitwise the copied run";
  EXPECT_EQ(run(0, true), copied) << "a plain view is copied";
  EXPECT_EQ(run(2, true), copied) << "a lent tensor other than x is ignored";
  EXPECT_NE(run(1, true), copied) << "a lent x is kept by reference";
}
