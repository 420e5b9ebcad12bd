// Shared by the per-token layer tests (RmsNorm1p, SwiGluMlp; CPU under mpirun, CUDA later): one
// (tp, sp, cp) layout checked against the serial reference, as gdn_layer_harness.h does for the
// GDN layer. The reference is the same layer at tp = cp = 1 on the UNPADDED batch (every rank
// runs it); the parallel run gets the padded batch (pads random, dy zero there), zig-zag split
// over CP and SP-split over TP. Compared: y at real rows, dX everywhere (exactly 0 at pads on the
// CPU), every weight gradient after reduce_grads, sliced to the rank's shard.
#pragma once
#include <functional>

#include "gdn_layer_harness.h"  // GdnLayout, kGdnRealLens, cumsum, rows_of, upload, download_f32

namespace dt::testing {

using DenseRun = LayerRun;
// Builds the layer from ctx, runs forward + backward on (x, dy); reduce_grads over *pg when
// `reduce` (the harness passes false for the serial reference).
using DenseFn = std::function<DenseRun(const layers::RunCtx& ctx, const TensorView& x, const TensorView& dy,
                                       bool reduce)>;

template <typename Layer>
DenseRun run_dense(Layer& layer, const layers::RunCtx& ctx, const TensorView& x, const TensorView& dy, bool reduce) {
  return run_layer(layer, x, dy, reduce ? ctx.pg : nullptr, ctx.stream);
}

struct DenseReference {
  Tensor x, dy;  // [T_real, H] host f32
  std::vector<int64_t> cu;
  DenseRun out;
};

inline DenseReference dense_reference(int64_t H, const DenseFn& fn, uint64_t seed,
                                      dist::Backend backend = dist::Backend::mpi, Device dev = Device::cpu(),
                                      DType act = DType::f32) {
  DenseReference R;
  serial_inputs(H, seed, 201, &R.x, &R.dy, &R.cu);
  auto S = serial_setting(seed, backend, dev, act);
  R.out = fn(S->ctx, upload(R.x, dev, act), upload(R.dy, dev, act), false);
  return R;
}

// The padded global layout of kGdnRealLens for (cp, sp), as the GDN harness builds it.
struct PaddedBatch {
  std::vector<int64_t> cu_pad, cu_act, real_lens;
  int64_t T = 0;
};
inline PaddedBatch padded_batch(const std::vector<int64_t>& real_lens, int cp, int sp) {
  PaddedBatch b;
  b.real_lens = real_lens;
  std::vector<int64_t> plens, alens = real_lens;
  for (size_t i = 0; i < real_lens.size(); ++i) {
    int64_t D = 2 * cp, p = (real_lens[i] + D - 1) / D * D;
    plens.push_back(p == 0 ? D : (i % 3 == 0 ? p + D : p));
  }
  int64_t T = std::accumulate(plens.begin(), plens.end(), int64_t(0)), M = 2 * int64_t(cp) * sp;
  if (T % M) {
    plens.push_back(M - T % M);
    alens.push_back(0);
    T += plens.back();
  }
  b.cu_pad = cumsum(plens);
  b.cu_act = cumsum(alens);
  b.T = T;
  return b;
}

inline void check_dense_layout(const GdnLayout& L, int64_t H, const DenseFn& fn, const DenseReference& R,
                               uint64_t seed, dist::Backend backend, Device dev, DType act, double tol) {
  SCOPED_TRACE(fmt::format("tp {} sp {} cp {} {} {}", L.tp, L.sp, L.cp, dev.str(), dtype_name(act)));
  const int world = dist::world_size();
  dist::ParallelDims dims{L.tp, L.cp, -1};
  ASSERT_EQ(dims.resolve(world), "");
  dist::ProcessGroups pg = dist::ProcessGroups::build(dims, backend);
  const int sp = L.sp ? L.tp : 1, cp = L.cp;
  PaddedBatch b = padded_batch(kGdnRealLens, cp, sp);
  const int64_t T = b.T, T_local = T / (int64_t(cp) * sp);
  data::PackedSeqParams psp =
      data::PackedSeqParams::build({b.cu_act, b.cu_pad, 1, T_local, sp, cp, pg.coord.cp}, Device::cpu(), {}, true);

  Tensor xg = Tensor::empty(Shape{T, H}, DType::f32), dyg = Tensor::zeros(Shape{T, H}, DType::f32);
  ops::rng_normal(xg, seed, 203, 0.f, 3.f, ops::RngSlice::whole(xg));
  Tensor ref_y = Tensor::zeros(Shape{T, H}, DType::f32), ref_dx = Tensor::zeros(Shape{T, H}, DType::f32);
  for (size_t i = 0; i < kGdnRealLens.size(); ++i) {
    int64_t src = R.cu[i], dst = b.cu_pad[i], n = kGdnRealLens[i];
    ops::copy(xg.view().slice(0, dst, dst + n), R.x.view().slice(0, src, src + n));
    ops::copy(dyg.view().slice(0, dst, dst + n), R.dy.view().slice(0, src, src + n));
    ops::copy(ref_y.view().slice(0, dst, dst + n), R.out.y.view().slice(0, src, src + n));
    ops::copy(ref_dx.view().slice(0, dst, dst + n), R.out.dx.view().slice(0, src, src + n));
  }
  std::span<const int32_t> cu32(psp.cu_seqlens_padded());
  auto [r0, r1] = psp.sp_rows(L.sp ? pg.coord.tp : 0);
  auto local = [&](const TensorView& g) {
    return rows_of(data::zigzag_slice_rows(g, cu32, cp, pg.coord.cp), r0, r1 - r0);
  };
  Tensor x_loc = upload(local(xg), dev, act), dy_loc = upload(local(dyg), dev, act);
  Tensor y_want = local(ref_y), dx_want = local(ref_dx);
  std::vector<int32_t> mask(psp.loss_mask_local().begin() + r0, psp.loss_mask_local().begin() + r1);

  layers::RunCtx ctx;
  ctx.pg = &pg;
  ctx.sp = L.sp;
  ctx.seed = seed;
  ctx.device = dev;
  ctx.act_dtype = act;
  DenseRun o = fn(ctx, x_loc, dy_loc, true);
  expect_matches_serial(o.y, o.dx, o.grads, y_want, dx_want, R.out.grads, R.out.specs, mask, L.tp, pg.coord.tp, tol,
                        dev.is_cpu());
}

inline std::vector<GdnLayout> dense_layouts_for(int world) {
  if (world == 1) return {{1, 1, false}};
  if (world == 2) return {{2, 1, false}, {2, 1, true}, {1, 2, false}};
  if (world == 4) return {{1, 4, false}, {2, 2, false}, {2, 2, true}, {4, 1, false}, {4, 1, true}};
  return {};
}

}  // namespace dt::testing
