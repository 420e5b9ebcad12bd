// VocabEmbedding and LmHeadLoss (untied and tied) on CUDA (NCCL between GPUs), one process per
// GPU, against the same layers on the CPU backend (MPI) under the same (tp, sp, cp) layout, on
// the packed batch of the GDN tests with alignment padding. The CPU layers are themselves checked
// against the direct global math in test_embedding_layer.cpp / test_lm_head_layer.cpp, so this
// is parallel-vs-serial on the GPU by transitivity. Both sides initialise the weights from the
// same seed (bit-identical Philox) and see the same inputs (rounded through the GPU dtype first).
// Compared: embedding y and dW (after reduce_grads); LM head loss sum, predicted count, dh and dW,
// the GPU head in both modes (two-pass, and fused: forward given the backward scale) against the
// CPU head's two-pass (which test_lm_head_layer.cpp shows bitwise equal to its fused mode).
// f32 rel. L2 < 1e-4 (different summation orders); bf16 < 2e-2 (bf16 weights and activations).
// 1 GPU: (1,F,1); 2 GPUs: (2,F,1), (2,T,1), (1,F,2); 4 GPUs: (2,T,2), (4,T,1), (1,F,4).
#include "dense_layer_harness.h"
#include "deltatron/layers/embedding.h"
#include "deltatron/layers/lm_head.h"

using namespace dt;
using namespace dt::testing;

namespace {
constexpr int64_t kV = 64, kH = 32;

std::vector<GdnLayout> gpu_layouts(int world) {
  if (world == 2) return {{2, 1, false}, {2, 1, true}, {1, 2, false}};
  if (world == 4) return {{2, 2, true}, {4, 1, true}, {1, 4, false}};
  return {{1, 1, false}};
}

// One side (CPU/MPI/f32 or GPU/NCCL/dt) of a layout: groups, packed params, context.
struct Side {
  dist::ProcessGroups pg;
  std::unique_ptr<data::PackedSeqParams> psp;
  layers::RunCtx ctx;
};
std::unique_ptr<Side> make_side(const GdnLayout& L, const PaddedBatch& b, uint64_t seed, dist::Backend be, Device dev,
                                DType act) {
  auto S = std::make_unique<Side>();
  dist::ParallelDims dims{L.tp, L.cp, -1};
  EXPECT_EQ(dims.resolve(dist::world_size()), "");
  S->pg = dist::ProcessGroups::build(dims, be);
  const int sp = L.sp ? L.tp : 1;
  S->psp = std::make_unique<data::PackedSeqParams>(data::PackedSeqParams::build(
      {b.cu_act, b.cu_pad, 1, b.T / (int64_t(L.cp) * sp), sp, L.cp, S->pg.coord.cp}, dev, {}, true));
  S->ctx.pg = &S->pg;
  S->ctx.sp = L.sp;
  S->ctx.seed = seed;
  S->ctx.device = dev;
  S->ctx.act_dtype = act;
  return S;
}

std::vector<int32_t> token_ids(int64_t T, uint64_t seed) {
  std::vector<int32_t> ids(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) ids[size_t(t)] = int32_t((t * t * 7 + 5 * t + int64_t(seed % 11)) % kV);
  return ids;
}
}  // namespace

TEST(VocabLayersCuda, EmbeddingMatchesCpu) {
  const uint64_t seed = test_seed();
  const Device gpu = Device::cuda(dist::select_cuda_device());
  const layers::EmbeddingConfig cfg{kV, kH, 0.5f};
  for (const GdnLayout& L : gpu_layouts(dist::world_size()))
    for (DType dt : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(fmt::format("tp {} sp {} cp {} {}", L.tp, L.sp, L.cp, dtype_name(dt)));
      PaddedBatch b = padded_batch(kGdnRealLens, L.cp, L.sp ? L.tp : 1);
      const std::vector<int32_t> ids = token_ids(b.T, seed);
      auto C = make_side(L, b, seed, dist::Backend::mpi, Device::cpu(), DType::f32);
      auto G = make_side(L, b, seed, dist::cuda_backend(), gpu, dt);
      const int64_t rows = C->psp->tokens_local();
      Tensor dy = rand_host(Shape{rows, kH});
      dy = download_f32(upload(dy, gpu, dt));  // the values both sides see
      layers::VocabEmbedding ec(cfg, C->ctx), eg(cfg, G->ctx);
      Tensor yc = Tensor::empty(Shape{rows, kH}, DType::f32), yg = Tensor::empty(Shape{rows, kH}, dt, gpu);
      poison(yg);
      ec.forward(yc, layers::local_token_ids(ids, *C->psp, Device::cpu()));
      eg.forward(yg, layers::local_token_ids(ids, *G->psp, gpu));
      ec.backward(dy);
      eg.backward(upload(dy, gpu, dt));
      std::vector<model::Param*> pc = {&ec.weight()}, pgs = {&eg.weight()};
      model::reduce_grads(pc, C->pg);
      model::reduce_grads(pgs, G->pg);
      const double tol = dt == DType::bf16 ? 2e-2 : 1e-4;
      EXPECT_TRUE(close_rel(download_f32(yg), yc, tol)) << "y";
      EXPECT_TRUE(close_rel(download_f32(eg.weight().grad), ec.weight().grad, tol)) << "dW";
    }
}

TEST(VocabLayersCuda, LmHeadMatchesCpu) {
  const uint64_t seed = test_seed();
  const Device gpu = Device::cuda(dist::select_cuda_device());
  for (bool tied : {false, true})
    for (const GdnLayout& L : gpu_layouts(dist::world_size()))
      for (DType dt : {DType::f32, DType::bf16})
        for (bool fused : {false, true}) {
          SCOPED_TRACE(fmt::format("tied {} tp {} sp {} cp {} {} {}", tied, L.tp, L.sp, L.cp, dtype_name(dt),
                                   fused ? "fused" : "two-pass"));
          PaddedBatch b = padded_batch(kGdnRealLens, L.cp, L.sp ? L.tp : 1);
          const std::vector<int32_t> ids = token_ids(b.T, seed);
          auto C = make_side(L, b, seed, dist::Backend::mpi, Device::cpu(), DType::f32);
          auto G = make_side(L, b, seed, dist::cuda_backend(), gpu, dt);
          const int64_t rows = C->psp->tokens_local();
          Tensor h = download_f32(upload(rand_host(Shape{rows, kH}, -2.f, 2.f), gpu, dt));
          layers::LmHeadConfig cfg{kV, kH, 0.3f, tied, 16};  // 16-row chunks: the chunked path
          // Tied: the embedding owns the weight (same spec and init), the head adds to its grad.
          layers::VocabEmbedding ec({kV, kH, 0.3f}, C->ctx), eg({kV, kH, 0.3f}, G->ctx);
          layers::LmHeadLoss hc(cfg, C->ctx, tied ? &ec.weight() : nullptr);
          layers::LmHeadLoss hg(cfg, G->ctx, tied ? &eg.weight() : nullptr);
          const layers::LmTargets tc = layers::next_token_targets(ids, *C->psp, Device::cpu());
          const layers::LmTargets tg = layers::next_token_targets(ids, *G->psp, gpu);
          ASSERT_EQ(tc.count, tg.count);
          const float scale = 1.f / float(std::max<int64_t>(tc.count, 1));
          layers::LmHeadLoss::Result rc = hc.forward(h, tc);
          layers::LmHeadLoss::Result rg = fused ? hg.forward(upload(h, gpu, dt), tg, scale)
                                                : hg.forward(upload(h, gpu, dt), tg);
          EXPECT_EQ(rc.count, rg.count);
          Tensor dhc = Tensor::empty(Shape{rows, kH}, DType::f32), dhg = Tensor::empty(Shape{rows, kH}, dt, gpu);
          poison(dhg);
          hc.backward(dhc, scale);
          hg.backward(dhg, scale);
          std::vector<model::Param*> pc = {&hc.weight()}, pgs = {&hg.weight()};
          model::reduce_grads(pc, C->pg);
          model::reduce_grads(pgs, G->pg);
          const double tol = dt == DType::bf16 ? 2e-2 : 1e-4;
          EXPECT_TRUE(close_rel(download_f32(rg.loss_sum), download_f32(rc.loss_sum), dt == DType::bf16 ? 1e-2 : 1e-5))
              << "loss sum";
          EXPECT_TRUE(close_rel(download_f32(dhg), dhc, tol)) << "dh";
          EXPECT_TRUE(close_rel(download_f32(hg.weight().grad), hc.weight().grad, tol)) << "dW";
        }
}
