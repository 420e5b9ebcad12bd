// GatedDeltaNet layer: parallel vs serial under every (tp, sp, cp) layout of the world size
// (mpirun -np 1, 2, 4 on the CPU backend), packed with unequal lengths and alignment
// padding; packed vs per-sequence; the fused and per-sequence CP all-to-alls bitwise equal;
// layout validation messages. The serial reference is the same layer at tp = cp = 1 on the
// UNPADDED batch, on every rank: outputs at real tokens, dX and every weight gradient
// (sliced to the rank's shard) must match it (fp32, rel. L2 < 1e-5).
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "deltatron/data/packed_seq.h"
#include "deltatron/layers/gdn.h"
#include "deltatron/model/grad_reduce.h"
#include "deltatron/ops/basic.h"
#include "test_util.h"

using namespace dt;
using dt::testing::close_rel;

namespace {

struct Layout {
  int tp, cp;
  bool sp;
};
std::vector<Layout> layouts_for(int world) {
  if (world == 1) return {{1, 1, false}};
  if (world == 2) return {{2, 1, false}, {2, 1, true}, {1, 2, false}};
  if (world == 4) return {{1, 4, false}, {2, 2, false}, {2, 2, true}, {4, 1, true}};
  return {};
}

layers::GdnConfig small_config() {
  layers::GdnConfig c;
  c.hidden = 24;
  c.num_k_heads = 4;
  c.num_v_heads = 8;
  c.head_k_dim = 8;
  c.head_v_dim = 6;
  c.conv_kernel = 4;
  c.norm_eps = 1e-6f;
  c.init_std = 0.2f;  // large enough that every path matters
  return c;
}

// Real lengths mixing 1, 2*cp-ish, odd, and a few longer than a chunk (64).
const std::vector<int64_t> kRealLens = {5, 1, 13, 8, 70, 3, 129, 2};

std::vector<int64_t> cumsum(const std::vector<int64_t>& lens) {
  std::vector<int64_t> cu(1, 0);
  for (int64_t l : lens) cu.push_back(cu.back() + l);
  return cu;
}

// Rows [r0, r0 + n) of a [T, H] tensor as a new tensor.
Tensor rows_of(const TensorView& t, int64_t r0, int64_t n) {
  Tensor o = Tensor::empty(Shape{n, t.shape[1]}, t.dtype);
  ops::copy(o, t.slice(0, r0, r0 + n));
  return o;
}

struct RunOut {
  Tensor y, dx;
  std::vector<Tensor> grads;
};

RunOut run_layer(layers::GatedDeltaNet& layer, const TensorView& x, const TensorView& dy,
                 const data::PackedSeqParams& psp) {
  RunOut o;
  o.y = Tensor::empty(x.shape, DType::f32);
  o.dx = Tensor::empty(x.shape, DType::f32);
  dt::testing::poison(o.y);
  dt::testing::poison(o.dx);
  layer.forward(o.y, x, psp);
  layer.backward(o.dx, dy, psp);
  return o;
}

}  // namespace

class GdnLayerParallel : public ::testing::Test {};

TEST(GdnLayerParallel, MatchesSerialUnderEveryLayout) {
  const int world = dist::world_size();
  const layers::GdnConfig cfg = small_config();
  const uint64_t seed = dt::testing::test_seed();
  const int64_t T_real = std::accumulate(kRealLens.begin(), kRealLens.end(), int64_t(0));
  const int64_t H = cfg.hidden;

  // Serial data: the unpadded packed batch, identical on every rank.
  Tensor x_real = Tensor::empty(Shape{T_real, H}, DType::f32), dy_real = Tensor::empty(Shape{T_real, H}, DType::f32);
  ops::rng_normal(x_real, seed, 101, 0.f, 1.f, ops::RngSlice::whole(x_real));
  ops::rng_normal(dy_real, seed, 102, 0.f, 1.f, ops::RngSlice::whole(dy_real));
  std::vector<int64_t> cu_real = cumsum(kRealLens);

  dist::ParallelDims serial_dims{1, 1, world};
  ASSERT_EQ(serial_dims.resolve(world), "");
  dist::ProcessGroups serial_pg = dist::ProcessGroups::build(serial_dims, dist::Backend::mpi);
  layers::RunCtx sctx;
  sctx.pg = &serial_pg;
  sctx.seed = seed;
  layers::GatedDeltaNet serial(cfg, "model.layers.0", sctx);
  data::PackedSeqParams spsp =
      data::PackedSeqParams::build({cu_real, cu_real, 1, T_real, 1, 1, 0}, Device::cpu(), {}, true);
  RunOut ref = run_layer(serial, x_real, dy_real, spsp);

  for (const Layout& L : layouts_for(world)) {
    SCOPED_TRACE(fmt::format("tp {} sp {} cp {}", L.tp, L.sp, L.cp));
    dist::ParallelDims dims{L.tp, L.cp, -1};
    ASSERT_EQ(dims.resolve(world), "");
    dist::ProcessGroups pg = dist::ProcessGroups::build(dims, dist::Backend::mpi);
    const int sp = L.sp ? L.tp : 1, cp = L.cp;

    // Alignment padding: every sequence to a multiple of 2*cp (plus 2*cp more on some, so
    // real < padded even when it divides), and an explicit trailing segment of actual
    // length 0 that makes T a multiple of 2*cp*sp.
    std::vector<int64_t> plens;
    for (size_t i = 0; i < kRealLens.size(); ++i) {
      int64_t D = 2 * cp, p = (kRealLens[i] + D - 1) / D * D;
      plens.push_back(i % 3 == 0 ? p + D : p);
    }
    std::vector<int64_t> alens = kRealLens;
    int64_t T = std::accumulate(plens.begin(), plens.end(), int64_t(0)), M = 2 * int64_t(cp) * sp;
    if (T % M) {
      plens.push_back(M - T % M);
      alens.push_back(0);
      T += plens.back();
    }
    std::vector<int64_t> cu_pad = cumsum(plens), cu_act = cumsum(alens);
    const int64_t T_local = T / (int64_t(cp) * sp);
    data::PackedSeqParams psp = data::PackedSeqParams::build(
        {cu_act, cu_pad, 1, T_local, sp, cp, pg.coord.cp}, Device::cpu(), {}, true);

    // Global padded inputs: real rows copied from the serial batch, pad rows random (they
    // must be inert), dy zero at pads (the loss masks them).
    Tensor xg = Tensor::empty(Shape{T, H}, DType::f32), dyg = Tensor::zeros(Shape{T, H}, DType::f32);
    ops::rng_normal(xg, seed, 103, 0.f, 3.f, ops::RngSlice::whole(xg));
    Tensor ref_y = Tensor::zeros(Shape{T, H}, DType::f32), ref_dx = Tensor::zeros(Shape{T, H}, DType::f32);
    for (size_t i = 0; i < kRealLens.size(); ++i) {
      int64_t src = cu_real[i], dst = cu_pad[i], n = kRealLens[i];
      ops::copy(xg.view().slice(0, dst, dst + n), x_real.view().slice(0, src, src + n));
      ops::copy(dyg.view().slice(0, dst, dst + n), dy_real.view().slice(0, src, src + n));
      ops::copy(ref_y.view().slice(0, dst, dst + n), ref.y.view().slice(0, src, src + n));
      ops::copy(ref_dx.view().slice(0, dst, dst + n), ref.dx.view().slice(0, src, src + n));
    }
    std::span<const int32_t> cu32(psp.cu_seqlens_padded());
    auto local = [&](const TensorView& g) {
      Tensor z = data::zigzag_slice_rows(g, cu32, cp, pg.coord.cp);
      auto [r0, r1] = psp.sp_rows(L.sp ? pg.coord.tp : 0);
      return rows_of(z, r0, r1 - r0);
    };
    Tensor x_loc = local(xg), dy_loc = local(dyg), y_want = local(ref_y), dx_want = local(ref_dx);
    // Mask of real rows of this rank (pads' outputs are garbage by definition).
    auto [r0, r1] = psp.sp_rows(L.sp ? pg.coord.tp : 0);
    std::vector<int32_t> mask(psp.loss_mask_local().begin() + r0, psp.loss_mask_local().begin() + r1);

    layers::RunCtx ctx;
    ctx.pg = &pg;
    ctx.sp = L.sp;
    ctx.seed = seed;
    std::vector<RunOut> outs;
    for (ops::CpA2aImpl impl : {ops::CpA2aImpl::fused, ops::CpA2aImpl::per_sequence}) {
      ctx.cp_a2a = impl;
      layers::GatedDeltaNet layer(cfg, "model.layers.0", ctx);
      RunOut o = run_layer(layer, x_loc, dy_loc, psp);
      std::vector<model::Param*> ps;
      for (model::Param& p : layer.params()) ps.push_back(&p);
      model::reduce_grads(ps, pg);
      for (model::Param& p : layer.params()) o.grads.push_back(p.grad);
      outs.push_back(std::move(o));
      if (cp == 1) break;  // no all-to-all to compare
    }
    const RunOut& o = outs[0];
    // Outputs at real rows.
    std::vector<double> got_y, want_y;
    for (int64_t i = 0; i < int64_t(mask.size()); ++i)
      if (mask[size_t(i)])
        for (int64_t h = 0; h < H; ++h) {
          got_y.push_back(o.y.ptr<float>()[i * H + h]);
          want_y.push_back(y_want.ptr<float>()[i * H + h]);
        }
    EXPECT_TRUE(close_rel(got_y, want_y, 1e-5)) << "y";
    // dX everywhere: exactly zero at pads (dy is zero there and pads feed nothing real).
    EXPECT_TRUE(close_rel(o.dx, dx_want, 1e-5)) << "dx";
    for (int64_t i = 0; i < int64_t(mask.size()); ++i)
      if (!mask[size_t(i)])
        for (int64_t h = 0; h < H; ++h) ASSERT_EQ(o.dx.ptr<float>()[i * H + h], 0.f) << "pad row " << i;
    // Every weight gradient, sliced to this rank's shard.
    for (size_t k = 0; k < serial.params().size(); ++k) {
      const model::Param& sp_ = serial.params()[k];
      Tensor want = Tensor::empty(model::local_shape(sp_.spec, L.tp), DType::f32);
      model::shard_from_global(want, sp_.grad, sp_.spec, L.tp, pg.coord.tp);
      EXPECT_TRUE(close_rel(o.grads[k], want, 1e-5)) << sp_.spec.name;
    }
    // fused and per_sequence all-to-alls: bitwise equal.
    if (outs.size() == 2) {
      EXPECT_EQ(std::memcmp(outs[0].y.data(), outs[1].y.data(), outs[0].y.nbytes()), 0) << "y fused vs per_sequence";
      EXPECT_EQ(std::memcmp(outs[0].dx.data(), outs[1].dx.data(), outs[0].dx.nbytes()), 0);
      for (size_t k = 0; k < outs[0].grads.size(); ++k)
        EXPECT_EQ(std::memcmp(outs[0].grads[k].data(), outs[1].grads[k].data(), outs[0].grads[k].nbytes()), 0)
            << serial.params()[k].spec.name;
    }
  }
}

TEST(GdnLayerPacked, PackedEqualsPerSequence) {
  if (dist::world_size() != 1) GTEST_SKIP() << "single-process test";
  const layers::GdnConfig cfg = small_config();
  const uint64_t seed = dt::testing::test_seed();
  const int64_t H = cfg.hidden, T = std::accumulate(kRealLens.begin(), kRealLens.end(), int64_t(0));
  dist::ParallelDims dims{1, 1, 1};
  ASSERT_EQ(dims.resolve(1), "");
  dist::ProcessGroups pg = dist::ProcessGroups::build(dims, dist::Backend::mpi);
  layers::RunCtx ctx;
  ctx.pg = &pg;
  ctx.seed = seed;
  Tensor x = Tensor::empty(Shape{T, H}, DType::f32), dy = Tensor::empty(Shape{T, H}, DType::f32);
  ops::rng_normal(x, seed, 201, 0.f, 1.f, ops::RngSlice::whole(x));
  ops::rng_normal(dy, seed, 202, 0.f, 1.f, ops::RngSlice::whole(dy));
  std::vector<int64_t> cu = cumsum(kRealLens);
  layers::GatedDeltaNet packed(cfg, "model.layers.0", ctx);
  RunOut po = run_layer(packed, x, dy, data::PackedSeqParams::build({cu, cu, 1, T, 1, 1, 0}));
  layers::GatedDeltaNet single(cfg, "model.layers.0", ctx);  // grads accumulate over the sequences
  Tensor y = Tensor::empty(Shape{T, H}, DType::f32), dx = Tensor::empty(Shape{T, H}, DType::f32);
  for (size_t i = 0; i < kRealLens.size(); ++i) {
    int64_t b = cu[i], n = kRealLens[i];
    Tensor xi = rows_of(x, b, n), dyi = rows_of(dy, b, n);
    RunOut oi = run_layer(single, xi, dyi, data::PackedSeqParams::build({{0, n}, {0, n}, 1, n, 1, 1, 0}));
    ops::copy(y.view().slice(0, b, b + n), oi.y);
    ops::copy(dx.view().slice(0, b, b + n), oi.dx);
  }
  EXPECT_TRUE(close_rel(po.y, y, 1e-6));
  EXPECT_TRUE(close_rel(po.dx, dx, 1e-6));
  for (size_t k = 0; k < packed.params().size(); ++k)
    EXPECT_TRUE(close_rel(packed.params()[k].grad, single.params()[k].grad, 1e-6)) << packed.params()[k].spec.name;
}

TEST(GdnLayerConfig, LayoutRulesNameTheValues) {
  layers::GdnConfig c = small_config();
  EXPECT_EQ(layers::GatedDeltaNet::check_layout(c, 2, 2), "");
  EXPECT_EQ(layers::GatedDeltaNet::check_layout(c, 2, 4),
            "config: GDN head-parallel CP needs tp*cp=8 to divide linear_num_key_heads=4 and linear_num_value_heads=8");
  c.num_v_heads = 6;
  EXPECT_EQ(layers::GatedDeltaNet::check_layout(c, 1, 1),
            "config: model.linear_num_value_heads=6 is not a multiple of model.linear_num_key_heads=4");
}
