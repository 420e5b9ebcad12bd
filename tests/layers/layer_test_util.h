// Parallel-vs-serial harness for token-mixing layers that read the packed-sequence metadata
// (forward(y, x, psp) / backward(dx, dy, psp): GatedAttention now; the dense harness's per-token
// layers do not need psp). Same protocol as dense_layer_harness.h: the reference is the layer at
// tp = cp = 1 on the UNPADDED batch (every rank runs it); the parallel run gets the padded batch
// (pads random, dy zero there), zig-zag split over CP and SP-split over TP. Compared: y at real
// rows, dX everywhere (exactly 0 at pad rows on the CPU), every weight gradient after
// reduce_grads, sliced to the rank's shard. Lengths may include 0 (a pure-padding sequence).
#pragma once
#include <functional>

#include "dense_layer_harness.h"  // DenseRun, padded_batch, GdnLayout, cumsum, rows_of, upload, download_f32

namespace dt::testing {

// Builds the layer from ctx, runs forward + backward on (x, dy) with `psp`; reduce_grads over
// *ctx.pg when `reduce`.
using SeqLayerFn = std::function<DenseRun(const layers::RunCtx& ctx, const TensorView& x, const TensorView& dy,
                                          const data::PackedSeqParams& psp, bool reduce)>;

template <typename Layer>
DenseRun run_seq_layer(Layer& layer, const layers::RunCtx& ctx, const TensorView& x, const TensorView& dy,
                       const data::PackedSeqParams& psp, bool reduce) {
  return run_layer(layer, x, dy, reduce ? ctx.pg : nullptr, ctx.stream, psp);
}

struct SeqReference {
  Tensor x, dy;  // [T_real, H] host f32
  std::vector<int64_t> lens, cu;
  DenseRun out;
};

inline SeqReference seq_reference(int64_t H, const std::vector<int64_t>& lens, const SeqLayerFn& fn, uint64_t seed,
                                  dist::Backend backend = dist::Backend::mpi, Device dev = Device::cpu(),
                                  DType act = DType::f32) {
  SeqReference R;
  R.lens = lens;
  R.cu = cumsum(lens);
  const int64_t T = R.cu.back();
  R.x = Tensor::empty(Shape{T, H}, DType::f32);
  R.dy = Tensor::empty(Shape{T, H}, DType::f32);
  ops::rng_normal(R.x, seed, 301, 0.f, 1.f, ops::RngSlice::whole(R.x));
  ops::rng_normal(R.dy, seed, 302, 0.f, 1.f, ops::RngSlice::whole(R.dy));
  auto S = serial_setting(seed, backend, dev, act);
  data::PackedSeqParams psp = data::PackedSeqParams::build({R.cu, R.cu, 1, T, 1, 1, 0}, dev, {}, true);
  R.out = fn(S->ctx, upload(R.x, dev, act), upload(R.dy, dev, act), psp, false);
  return R;
}

// Real rows of `src` [T_real, H] (sequence i at rows cu[i]..) scattered into a zeroed padded
// [T, H] tensor (sequence i at cu_pad[i]..).
inline Tensor scatter_to_padded(const TensorView& src, const std::vector<int64_t>& lens, const std::vector<int64_t>& cu,
                                const std::vector<int64_t>& cu_pad, int64_t T) {
  Tensor out = Tensor::zeros(Shape{T, src.shape[1]}, DType::f32);
  for (size_t i = 0; i < lens.size(); ++i)
    ops::copy(out.view().slice(0, cu_pad[i], cu_pad[i] + lens[i]), src.slice(0, cu[i], cu[i] + lens[i]));
  return out;
}

inline void check_seq_layout(const GdnLayout& L, int64_t H, const SeqLayerFn& fn, const SeqReference& R,
                             uint64_t seed, double tol, dist::Backend backend = dist::Backend::mpi,
                             Device dev = Device::cpu(), DType act = DType::f32) {
  SCOPED_TRACE(fmt::format("tp {} sp {} cp {} {} {}", L.tp, L.sp, L.cp, dev.str(), dtype_name(act)));
  const int world = dist::world_size();
  dist::ParallelDims dims{L.tp, L.cp, -1};
  ASSERT_EQ(dims.resolve(world), "");
  dist::ProcessGroups pg = dist::ProcessGroups::build(dims, backend);
  const int sp = L.sp ? L.tp : 1, cp = L.cp;
  PaddedBatch b = padded_batch(R.lens, cp, sp);
  const int64_t T = b.T, T_local = T / (int64_t(cp) * sp);
  data::PackedSeqParams psp =
      data::PackedSeqParams::build({b.cu_act, b.cu_pad, 1, T_local, sp, cp, pg.coord.cp}, dev, {}, true);

  Tensor xg = Tensor::empty(Shape{T, H}, DType::f32);
  ops::rng_normal(xg, seed, 303, 0.f, 3.f, ops::RngSlice::whole(xg));  // random pads
  for (size_t i = 0; i < R.lens.size(); ++i)
    ops::copy(xg.view().slice(0, b.cu_pad[i], b.cu_pad[i] + R.lens[i]),
              R.x.view().slice(0, R.cu[i], R.cu[i] + R.lens[i]));
  Tensor dyg = scatter_to_padded(R.dy, R.lens, R.cu, b.cu_pad, T);  // zero at pads
  Tensor ref_y = scatter_to_padded(R.out.y, R.lens, R.cu, b.cu_pad, T);
  Tensor ref_dx = scatter_to_padded(R.out.dx, R.lens, R.cu, b.cu_pad, T);

  std::span<const int32_t> cu32(psp.cu_seqlens_padded());
  auto [r0, r1] = psp.sp_rows(L.sp ? pg.coord.tp : 0);
  auto local = [&](const TensorView& g) {
    return rows_of(data::zigzag_slice_rows(g, cu32, cp, pg.coord.cp), r0, r1 - r0);
  };
  std::vector<int32_t> mask(psp.loss_mask_local().begin() + r0, psp.loss_mask_local().begin() + r1);

  layers::RunCtx ctx;
  ctx.pg = &pg;
  ctx.sp = L.sp;
  ctx.seed = seed;
  ctx.device = dev;
  ctx.act_dtype = act;
  DenseRun o = fn(ctx, upload(local(xg), dev, act), upload(local(dyg), dev, act), psp, true);
  expect_matches_serial(o.y, o.dx, o.grads, local(ref_y), local(ref_dx), R.out.grads, R.out.specs, mask, L.tp,
                        pg.coord.tp, tol, /*pads_exact=*/dev.is_cpu());
}

}  // namespace dt::testing
