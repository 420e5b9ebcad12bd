// VocabEmbedding on the CPU backend under every (tp, sp, cp) layout of the world size (mpirun
// -np 1, 2, 4) against the direct global math: y = W[ids] at every local row (pads included: their
// ids are random), dW = scatter-add of dy (zero at pads) after reduce_grads, sliced to the vocab
// shard; fp32 rel. L2 < 1e-6 (sums of the same few rows). Repeated ids on purpose.
#include "dense_layer_harness.h"
#include "deltatron/layers/embedding.h"

using namespace dt;
using namespace dt::testing;

namespace {
constexpr int64_t kV = 32, kH = 20;
}

TEST(EmbeddingLayer, MatchesGlobalMathUnderEveryLayout) {
  const uint64_t seed = test_seed();
  layers::EmbeddingConfig cfg{kV, kH, 0.5f};
  Tensor W;  // global [V, H]
  {
    dist::ParallelDims d1{1, 1, dist::world_size()};
    ASSERT_EQ(d1.resolve(dist::world_size()), "");
    dist::ProcessGroups pg1 = dist::ProcessGroups::build(d1, dist::Backend::mpi);
    layers::RunCtx c1;
    c1.pg = &pg1;
    c1.seed = seed;
    layers::VocabEmbedding e(cfg, c1);
    W = e.weight().master;
    EXPECT_EQ(e.weight().spec.name, "model.embed_tokens.weight");
    EXPECT_EQ(e.weight().spec.tp_dim, 0);
  }
  for (const GdnLayout& L : dense_layouts_for(dist::world_size())) {
    SCOPED_TRACE(fmt::format("tp {} sp {} cp {}", L.tp, L.sp, L.cp));
    dist::ParallelDims dims{L.tp, L.cp, -1};
    ASSERT_EQ(dims.resolve(dist::world_size()), "");
    dist::ProcessGroups pg = dist::ProcessGroups::build(dims, dist::Backend::mpi);
    const int sp = L.sp ? L.tp : 1, cp = L.cp;
    PaddedBatch b = padded_batch(kGdnRealLens, cp, sp);
    const int64_t T = b.T;
    data::PackedSeqParams psp = data::PackedSeqParams::build(
        {b.cu_act, b.cu_pad, 1, T / (int64_t(cp) * sp), sp, cp, pg.coord.cp}, Device::cpu(), {}, true);
    std::vector<int32_t> ids(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) ids[size_t(t)] = int32_t((t * t * 5 + 3 * t + int64_t(seed % 7)) % kV);
    Tensor dyg = Tensor::zeros(Shape{T, kH}, DType::f32), yg = Tensor::empty(Shape{T, kH}, DType::f32);
    Tensor dw = Tensor::zeros(Shape{kV, kH}, DType::f32);
    ops::rng_normal(dyg, seed, 501, 0.f, 1.f, ops::RngSlice::whole(dyg));
    for (size_t i = 0; i + 1 < b.cu_pad.size(); ++i)  // dy zero at pads
      for (int64_t t = b.cu_pad[i] + (b.cu_act[i + 1] - b.cu_act[i]); t < b.cu_pad[i + 1]; ++t)
        for (int64_t h = 0; h < kH; ++h) dyg.ptr<float>()[t * kH + h] = 0.f;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < kH; ++h) {
        yg.ptr<float>()[t * kH + h] = W.ptr<float>()[ids[size_t(t)] * kH + h];
        dw.ptr<float>()[ids[size_t(t)] * kH + h] += dyg.ptr<float>()[t * kH + h];
      }
    std::span<const int32_t> cu32(psp.cu_seqlens_padded());
    auto [r0, r1] = psp.sp_rows(L.sp ? pg.coord.tp : 0);
    auto local = [&](const TensorView& g) { return rows_of(data::zigzag_slice_rows(g, cu32, cp, pg.coord.cp), r0, r1 - r0); };

    layers::RunCtx ctx;
    ctx.pg = &pg;
    ctx.sp = L.sp;
    ctx.seed = seed;
    layers::VocabEmbedding emb(cfg, ctx);
    Tensor ids_loc = layers::local_token_ids(ids, psp, Device::cpu());
    Tensor y = Tensor::empty(Shape{r1 - r0, kH}, DType::f32);
    poison(y);
    emb.forward(y, ids_loc);
    emb.backward(local(dyg));
    std::vector<model::Param*> ps = {&emb.weight()};
    model::reduce_grads(ps, pg);
    EXPECT_TRUE(close_rel(y, local(yg), 1e-6)) << "y";
    Tensor want = Tensor::empty(Shape{kV / L.tp, kH}, DType::f32);
    model::shard_from_global(want, dw, emb.weight().spec, L.tp, pg.coord.tp);
    EXPECT_TRUE(close_rel(emb.weight().grad, want, 1e-6)) << "dW";
  }
}

TEST(EmbeddingLayer, VocabMustDivide) {
  EXPECT_EQ(layers::VocabEmbedding::check_layout({30, 8, 0.02f}, 4),
            "config: the vocab-parallel embedding needs tp=4 to divide vocab_size=30 (pad the vocab to 32)");
}
