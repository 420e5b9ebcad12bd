// LmHeadLoss (vocab-parallel logits + cross entropy) on the CPU backend under every (tp, sp, cp)
// layout of the world size (mpirun -np 1, 2, 4), untied and tied to the embedding, against a
// direct full-vocab float64 reference on the unpadded documents: the mean loss over the global
// predicted tokens (sum and count all-reduced over dp x cp, divided once), dh at every local row
// (0 at pads and at the last token of each document) and dW after reduce_grads, sliced to the
// shard; fp32 rel. L2 < 1e-5. Batches: unequal lengths with length-1 documents; {1, 2, 1} (at cp
// = 2 one CP rank predicts nothing); {1, 1, 1} (nothing predicted anywhere: loss 0, grads 0, no
// NaN). chunk_tokens = 7 forces the chunked path. Packed vs per-sequence for the loss sum.
// Fused mode (forward given the backward scale: gradient computed per chunk during the forward)
// against the two-pass mode under every layout of the same batches: loss sum, dh and the local
// dW shard bitwise equal (the same ops on the same values, in the same order); then a two-pass
// run on the head that ran fused equals, bitwise, a head that ran two-pass twice (the fused
// state is released and dW accumulates).
#include <unistd.h>

#include <cmath>
#include <cstring>

#include "dense_layer_harness.h"
#include "deltatron/layers/embedding.h"
#include "deltatron/data/indexed_dataset.h"
#include "deltatron/data/packer.h"
#include "deltatron/layers/lm_head.h"

using namespace dt;
using namespace dt::testing;

namespace {
constexpr int64_t kV = 64, kH = 24;

layers::LmHeadConfig head_cfg(bool tied) {
  layers::LmHeadConfig c;
  c.vocab = kV;
  c.hidden = kH;
  c.init_std = 0.3f;
  c.tie_word_embeddings = tied;
  c.chunk_tokens = 7;
  return c;
}

// Same shape and bits (contiguous f32 views).
::testing::AssertionResult bitwise_equal(const TensorView& got, const TensorView& want) {
  if (got.shape != want.shape || !got.is_contiguous() || !want.is_contiguous()) return ::testing::AssertionFailure() << got.str() << " vs " << want.str();
  for (int64_t e = 0; e < got.numel(); ++e)
    if (std::memcmp(got.ptr<float>() + e, want.ptr<float>() + e, sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "element " << e << ": " << got.ptr<float>()[e] << " vs "
                                           << want.ptr<float>()[e];
  return ::testing::AssertionSuccess();
}

// Direct float64 reference on the real tokens of each document.
struct CeRef {
  double loss_sum = 0;
  int64_t count = 0;
  std::vector<double> dh, dw;  // [T_real, H], [V, H] (d loss_sum * scale)
};
CeRef ce_reference(const std::vector<int32_t>& ids, const std::vector<int64_t>& cu, const TensorView& h,
                   const TensorView& w, double scale) {
  CeRef r;
  const int64_t T = h.shape[0];
  r.dh.assign(size_t(T * kH), 0.0);
  r.dw.assign(size_t(kV * kH), 0.0);
  const float *hp = h.ptr<float>(), *wp = w.ptr<float>();
  for (size_t d = 0; d + 1 < cu.size(); ++d)
    for (int64_t t = cu[d]; t + 1 < cu[d + 1]; ++t) {
      const int32_t tgt = ids[size_t(t + 1)];
      std::vector<double> l(kV);
      double mx = -1e300;
      for (int64_t v = 0; v < kV; ++v) {
        double a = 0;
        for (int64_t k = 0; k < kH; ++k) a += double(hp[t * kH + k]) * wp[v * kH + k];
        l[size_t(v)] = a;
        mx = std::max(mx, a);
      }
      double se = 0;
      for (double a : l) se += std::exp(a - mx);
      r.loss_sum += std::log(se) + mx - l[size_t(tgt)];
      ++r.count;
      for (int64_t v = 0; v < kV; ++v) {
        const double g = scale * (std::exp(l[size_t(v)] - mx) / se - (v == tgt ? 1.0 : 0.0));
        for (int64_t k = 0; k < kH; ++k) {
          r.dh[size_t(t * kH + k)] += g * wp[v * kH + k];
          r.dw[size_t(v * kH + k)] += g * hp[t * kH + k];
        }
      }
    }
  return r;
}

// The global [V, H] weight the layers use (initialised from the global index: layout-free).
Tensor global_weight(bool tied, uint64_t seed) {
  dist::ParallelDims dims{1, 1, dist::world_size()};
  EXPECT_EQ(dims.resolve(dist::world_size()), "");
  dist::ProcessGroups pg = dist::ProcessGroups::build(dims, dist::Backend::mpi);
  layers::RunCtx ctx;
  ctx.pg = &pg;
  ctx.seed = seed;
  if (tied) {
    layers::VocabEmbedding e({kV, kH, 0.3f}, ctx);
    return e.weight().master;
  }
  layers::LmHeadLoss l(head_cfg(false), ctx);
  return l.weight().master;
}

void check_layout(const GdnLayout& L, const std::vector<int64_t>& lens, bool tied, uint64_t seed) {
  SCOPED_TRACE(fmt::format("tp {} sp {} cp {} tied {} lens {}", L.tp, L.sp, L.cp, tied, fmt::join(lens, ",")));
  const int64_t T_real = std::accumulate(lens.begin(), lens.end(), int64_t(0));
  std::vector<int64_t> cu_real = cumsum(lens);
  Tensor h_real = Tensor::empty(Shape{T_real, kH}, DType::f32);
  ops::rng_normal(h_real, seed, 401, 0.f, 1.f, ops::RngSlice::whole(h_real));
  Tensor ids_t = Tensor::empty(Shape{T_real}, DType::f32);
  ops::rng_uniform(ids_t, seed, 402, 0.f, float(kV), ops::RngSlice::whole(ids_t));
  std::vector<int32_t> ids_real(static_cast<size_t>(T_real));
  for (int64_t t = 0; t < T_real; ++t) ids_real[size_t(t)] = std::min<int32_t>(int32_t(ids_t.ptr<float>()[t]), kV - 1);
  Tensor W = global_weight(tied, seed);
  CeRef probe = ce_reference(ids_real, cu_real, h_real, W, 1.0);
  const double scale = 1.0 / double(std::max<int64_t>(probe.count, 1));
  CeRef R = ce_reference(ids_real, cu_real, h_real, W, scale);

  dist::ParallelDims dims{L.tp, L.cp, -1};
  ASSERT_EQ(dims.resolve(dist::world_size()), "");
  dist::ProcessGroups pg = dist::ProcessGroups::build(dims, dist::Backend::mpi);
  const int sp = L.sp ? L.tp : 1, cp = L.cp;
  PaddedBatch b = padded_batch(lens, cp, sp);
  const int64_t T = b.T;
  data::PackedSeqParams psp = data::PackedSeqParams::build(
      {b.cu_act, b.cu_pad, 1, T / (int64_t(cp) * sp), sp, cp, pg.coord.cp}, Device::cpu(), {}, true);
  // Padded global h (random pads), ids (random pads) and the reference dh (0 at pads).
  Tensor hg = Tensor::empty(Shape{T, kH}, DType::f32), dh_ref = Tensor::zeros(Shape{T, kH}, DType::f32);
  ops::rng_normal(hg, seed, 403, 0.f, 1.f, ops::RngSlice::whole(hg));
  std::vector<int32_t> ids(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) ids[size_t(t)] = int32_t((t * 7 + 3) % kV);
  for (size_t i = 0; i < lens.size(); ++i)
    for (int64_t j = 0; j < lens[i]; ++j) {
      const int64_t src = cu_real[i] + j, dst = b.cu_pad[i] + j;
      ids[size_t(dst)] = ids_real[size_t(src)];
      for (int64_t k = 0; k < kH; ++k) {
        hg.ptr<float>()[dst * kH + k] = h_real.ptr<float>()[src * kH + k];
        dh_ref.ptr<float>()[dst * kH + k] = float(R.dh[size_t(src * kH + k)]);
      }
    }
  std::span<const int32_t> cu32(psp.cu_seqlens_padded());
  auto [r0, r1] = psp.sp_rows(L.sp ? pg.coord.tp : 0);
  auto local = [&](const TensorView& g) { return rows_of(data::zigzag_slice_rows(g, cu32, cp, pg.coord.cp), r0, r1 - r0); };

  layers::RunCtx ctx;
  ctx.pg = &pg;
  ctx.sp = L.sp;
  ctx.seed = seed;
  layers::VocabEmbedding emb({kV, kH, 0.3f}, ctx), emb_f({kV, kH, 0.3f}, ctx);
  layers::LmHeadLoss head(head_cfg(tied), ctx, tied ? &emb.weight() : nullptr);
  layers::LmHeadLoss head_f(head_cfg(tied), ctx, tied ? &emb_f.weight() : nullptr);  // fused mode
  layers::LmTargets tg = layers::next_token_targets(ids, psp, Device::cpu());
  Tensor h_loc = local(hg), dh = Tensor::empty(h_loc.shape(), DType::f32), dh_f = Tensor::empty(h_loc.shape(), DType::f32);
  poison(dh);
  poison(dh_f);
  layers::LmHeadLoss::Result res = head.forward(h_loc, tg);
  head.backward(dh, float(scale));
  {
    SCOPED_TRACE("fused vs two-pass");
    layers::LmHeadLoss::Result res_f = head_f.forward(h_loc, tg, float(scale));
    head_f.backward(dh_f, float(scale));
    EXPECT_EQ(res_f.count, res.count);
    EXPECT_TRUE(bitwise_equal(res_f.loss_sum, res.loss_sum)) << "loss sum";
    EXPECT_TRUE(bitwise_equal(dh_f, dh)) << "dh";
    EXPECT_TRUE(bitwise_equal(head_f.weight().grad, head.weight().grad)) << "dW";
    // The fused head again, two-pass (its fused state is gone, dW accumulates on top), against
    // a third head run two-pass twice.
    layers::VocabEmbedding emb_2({kV, kH, 0.3f}, ctx);
    layers::LmHeadLoss head_2(head_cfg(tied), ctx, tied ? &emb_2.weight() : nullptr);
    Tensor dh_2 = Tensor::empty(h_loc.shape(), DType::f32);
    for (int run = 0; run < 2; ++run) {
      head_2.forward(h_loc, tg);
      head_2.backward(dh_2, float(scale));
    }
    poison(dh_f);
    head_f.forward(h_loc, tg);
    head_f.backward(dh_f, float(scale));
    EXPECT_TRUE(bitwise_equal(dh_f, dh_2)) << "dh, second run";
    EXPECT_TRUE(bitwise_equal(head_f.weight().grad, head_2.weight().grad)) << "dW, accumulated";
  }
  Tensor sc = Tensor::empty(Shape{2}, DType::f32);
  sc.ptr<float>()[0] = ops::item(res.loss_sum);
  sc.ptr<float>()[1] = float(res.count);
  ASSERT_TRUE(std::isfinite(sc.ptr<float>()[0]));
  if (pg.dims.dp * pg.dims.cp > 1) pg.dp_cp->all_reduce(sc, dist::ReduceOp::sum);
  EXPECT_EQ(int64_t(sc.ptr<float>()[1]), R.count);
  std::vector<model::Param*> ps = {&head.weight()};
  model::reduce_grads(ps, pg);
  if (R.count == 0) {
    EXPECT_EQ(sc.ptr<float>()[0], 0.f);
    for (int64_t e = 0; e < dh.numel(); ++e) ASSERT_EQ(dh.ptr<float>()[e], 0.f) << "dh " << e;
    for (int64_t e = 0; e < head.weight().grad.numel(); ++e) ASSERT_EQ(head.weight().grad.ptr<float>()[e], 0.f);
    return;
  }
  const double mean = double(sc.ptr<float>()[0]) / double(sc.ptr<float>()[1]), want = R.loss_sum / double(R.count);
  EXPECT_LT(std::abs(mean - want) / std::abs(want), 1e-5) << "loss " << mean << " vs " << want;
  EXPECT_TRUE(close_rel(dh, local(dh_ref), 1e-5)) << "dh";
  Tensor dw_ref = Tensor::empty(Shape{kV, kH}, DType::f32);
  for (int64_t e = 0; e < kV * kH; ++e) dw_ref.ptr<float>()[e] = float(R.dw[size_t(e)]);
  Tensor want_w = Tensor::empty(Shape{kV / L.tp, kH}, DType::f32);
  model::shard_from_global(want_w, dw_ref, head.weight().spec, L.tp, pg.coord.tp);
  EXPECT_TRUE(close_rel(head.weight().grad, want_w, 1e-5)) << "dW";
}
}  // namespace

TEST(LmHeadLayer, MatchesFloat64ReferenceUnderEveryLayout) {
  const uint64_t seed = test_seed();
  for (bool tied : {false, true})
    for (const std::vector<int64_t>& lens :
         {kGdnRealLens, std::vector<int64_t>{1, 2, 1}, std::vector<int64_t>{1, 1, 1}})
      for (const GdnLayout& L : dense_layouts_for(dist::world_size())) check_layout(L, lens, tied, seed);
}

TEST(LmHeadLayer, TargetsStayInsideDocuments) {
  // Two documents of 3 and 1 real tokens, padded to 4 and 4 (cp = 1): targets of doc 0 are its
  // next tokens, its last token and every pad predict nothing.
  data::PackedSeqParams psp = data::PackedSeqParams::build({{0, 3, 4}, {0, 4, 8}, 1, 8, 1, 1, 0}, Device::cpu(), {}, true);
  std::vector<int32_t> ids = {10, 11, 12, 99, 20, 98, 97, 96};
  layers::LmTargets t = layers::next_token_targets(ids, psp, Device::cpu());
  std::vector<int32_t> got(t.labels.ptr<int32_t>(), t.labels.ptr<int32_t>() + 8);
  EXPECT_EQ(got, (std::vector<int32_t>{11, 12, -1, -1, -1, -1, -1, -1}));
  EXPECT_EQ(t.count, 2);
}

// The packer's labels cross a split document's piece boundary: a document of 300 tokens in
// micro-batches of 128 keeps all 299 targets (next_token_targets loses one per boundary), under
// cp 1 and, summed over the ranks, cp 2; each CP rank's targets are the zig-zag rows of the labels.
TEST(LmHeadLayer, SplitDocumentsKeepEveryTarget) {
  // One file per rank: the ctest entries run this binary under mpirun (np 2, 4), and a rank must
  // not rewrite a file another one has mapped.
  const std::string prefix = ::testing::TempDir() + "lm_head_split_" + std::to_string(getpid()) + "_r" +
                             std::to_string(dist::world_rank());
  data::IndexedDatasetWriter w;
  ASSERT_EQ(w.open(prefix, data::TokenDType::i32), "");
  std::vector<int64_t> doc(300);
  for (size_t i = 0; i < doc.size(); ++i) doc[i] = int64_t(i % 50);
  ASSERT_EQ(w.add_document(doc), "");
  ASSERT_EQ(w.add_document(std::vector<int64_t>(7, 3)), "");
  ASSERT_EQ(w.finish(), "");
  data::IndexedDataset ds = data::IndexedDataset::open_or_die(prefix);
  for (int cp : {1, 2}) {
    SCOPED_TRACE(fmt::format("cp {}", cp));
    data::PackerConfig pc;
    pc.max_tokens = 128;
    pc.shuffle = false;
    pc.cp = cp;
    std::vector<int64_t> lengths = {300, 7};
    int64_t targets = 0, inside = 0;
    for (const auto& pieces : data::plan_epoch(lengths, pc, 0)) {
      const data::MicroBatch mb = data::build_micro_batch(ds, pc, pieces, 0, 0);
      for (int r = 0; r < cp; ++r) {
        data::PackedSeqParams psp = data::PackedSeqParams::build(mb.desc(r));
        const layers::LmTargets t = layers::targets_from_labels(mb.labels, psp, Device::cpu());
        const Tensor want = data::zigzag_slice_rows(
            TensorView(const_cast<int32_t*>(mb.labels.data()), DType::i32, Device::cpu(), Shape{int64_t(mb.labels.size())}),
            psp.cu_seqlens_padded(), cp, r);
        EXPECT_EQ(std::memcmp(t.labels.data(), want.data(), size_t(want.numel()) * 4), 0) << "rank " << r;
        targets += t.count;
        inside += layers::next_token_targets(mb.tokens, psp, Device::cpu()).count;
      }
    }
    EXPECT_EQ(targets, 299 + 6);
    EXPECT_EQ(inside, 299 + 6 - 2);  // 300 = 44 + 128 + 128: two piece boundaries
  }
}

TEST(LmHeadLayer, PackedEqualsPerSequence) {
  if (dist::world_size() != 1) GTEST_SKIP() << "single-process test";
  const uint64_t seed = test_seed();
  dist::ParallelDims dims{1, 1, 1};
  ASSERT_EQ(dims.resolve(1), "");
  dist::ProcessGroups pg = dist::ProcessGroups::build(dims, dist::Backend::mpi);
  layers::RunCtx ctx;
  ctx.pg = &pg;
  ctx.seed = seed;
  layers::LmHeadLoss head(head_cfg(false), ctx);
  const std::vector<int64_t>& lens = kGdnRealLens;
  std::vector<int64_t> cu = cumsum(lens);
  const int64_t T = cu.back();
  Tensor h = Tensor::empty(Shape{T, kH}, DType::f32);
  ops::rng_normal(h, seed, 404, 0.f, 1.f, ops::RngSlice::whole(h));
  std::vector<int32_t> ids(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) ids[size_t(t)] = int32_t((t * 13 + 5) % kV);
  auto run = [&](const std::vector<int64_t>& c, std::span<const int32_t> id, const TensorView& hv) {
    data::PackedSeqParams psp = data::PackedSeqParams::build({c, c, 1, c.back(), 1, 1, 0}, Device::cpu(), {}, true);
    layers::LmHeadLoss::Result r = head.forward(hv, layers::next_token_targets(id, psp, Device::cpu()));
    return std::pair{double(ops::item(r.loss_sum)), r.count};
  };
  auto [packed, n_packed] = run(cu, ids, h);
  double sum = 0;
  int64_t n = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    auto [s_i, n_i] = run({0, lens[i]}, std::span<const int32_t>(ids).subspan(size_t(cu[i]), size_t(lens[i])),
                          rows_of(h, cu[i], lens[i]));
    sum += s_i;
    n += n_i;
  }
  EXPECT_EQ(n_packed, n);
  EXPECT_LT(std::abs(packed - sum) / std::abs(sum), 1e-6);
}

// The automatic chunk: as many rows of logits (f32: 4 bytes, bf16: 2) as fit 1 GiB, a multiple of
// 64 in [64, 4096].
TEST(LmHeadLayer, AutomaticChunkRows) {
  layers::LmHeadConfig c;
  c.vocab = 248320;
  EXPECT_EQ(c.chunk_rows(1, 4), 1024);  // 2^30 / (4 * 248320) = 1081
  EXPECT_EQ(c.chunk_rows(2, 4), 2112);  // V/tp = 124160: 2162
  EXPECT_EQ(c.chunk_rows(1, 2), 2112);  // bf16 logits: 2^30 / (2 * 248320) = 2162
  EXPECT_EQ(c.chunk_rows(2, 2), 4096);  // 4324, capped
  c.vocab = 64;
  EXPECT_EQ(c.chunk_rows(1, 4), 4096);
  c.vocab = 1 << 24;
  EXPECT_EQ(c.chunk_rows(1, 4), 64);
  c.chunk_tokens = 7;
  EXPECT_EQ(c.chunk_rows(4, 2), 7);
}
