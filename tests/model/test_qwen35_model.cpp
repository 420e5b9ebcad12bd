// The Qwen3.5 hybrid model (3 GDN : 1 gated attention, 4 layers) on the CPU backend, fp32.
//  * One full step (forward + backward + reduce_grads) under every (tp, cp, dp) layout of the world
//    size (mpirun -np 1, 2, 4: (1,1,1); (2,1,1) +-SP, (1,2,1), (1,1,2); (2,2,1) +-SP, (1,2,2),
//    (2,1,2) +-SP, (1,4,1)), tied and untied embeddings, against the serial model (tp = cp = 1) on the
//    unpadded concatenation of ALL documents: each dp rank packs a different subset of the
//    documents with alignment padding (random pad tokens); the global mean loss (sum and count
//    all-reduced over dp x cp) and every parameter gradient, sliced to the rank's shard, agree to
//    fp32 rel. L2 < 1e-5.
//  * Packed vs unpacked: the loss of a padded packed batch equals the token-weighted mean of the
//    documents run one by one.
//  * Init: every parameter shard of every layout equals the serial model's, bit for bit.
//  * Pad tokens change nothing (bitwise); two micro-batches accumulate one step's gradients.
//  * The registry: param_specs() = params() names/shapes in HF order; config errors name the field.
#include <cmath>
#include <cstring>

#include "deltatron/model/grad_reduce.h"
#include "deltatron/model/qwen35.h"
#include "layers/dense_layer_harness.h"  // GdnLayout, PaddedBatch, padded_batch, cumsum, rows_of

using namespace dt;
using namespace dt::testing;

namespace {

// configs/quickstart.yaml, smaller: heads divide every layout with tp*cp <= 4.
io::ModelConfig tiny_config(bool tied) {
  io::ModelConfig m;
  m.vocab_size = 64;
  m.hidden_size = 32;
  m.intermediate_size = 64;
  m.num_hidden_layers = 4;  // layer_types empty: 3 linear_attention, 1 full_attention
  m.linear_num_key_heads = 4;
  m.linear_num_value_heads = 8;
  m.linear_key_head_dim = 16;
  m.linear_value_head_dim = 16;
  m.linear_conv_kernel_dim = 4;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.head_dim = 8;
  m.partial_rotary_factor = 0.5;
  m.rope_theta = 1e4;
  m.tie_word_embeddings = tied;
  // HF's default. Larger weights (0.1-0.2) make the 4-layer fp32 gradients ill-conditioned: a mere
  // change of summation order (the documents packed in another order) then moves them by up to
  // 1e-4 relative, above the 1e-5 the layouts are held to.
  m.initializer_range = 0.02;
  return m;
}

// Unequal documents: length 1 (predicts nothing), 2, odd, one longer than a GDN chunk (64).
const std::vector<int64_t> kDocLens = {5, 1, 13, 8, 70, 3, 22, 2, 9};

// Token ids of every document, concatenated (layout-free: drawn by global index).
std::vector<int32_t> doc_tokens(uint64_t seed, int64_t vocab) {
  const int64_t n = std::accumulate(kDocLens.begin(), kDocLens.end(), int64_t(0));
  Tensor t = Tensor::empty(Shape{n}, DType::f32);
  ops::rng_uniform(t, seed, 501, 0.f, float(vocab), ops::RngSlice::whole(t));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = std::min<int32_t>(int32_t(t.ptr<float>()[i]), int32_t(vocab) - 1);
  return ids;
}

// Test-only weights, drawn by global index (the same on every layout): the zero-initialised
// replicated weights (the (1 + w) norms) get N(0, 0.5) so that their paths and gradients matter;
// A_log gets log U(0.01, 1): decays g in about [-1.3, -0.01] per token (HF's log U(1, 16) forgets
// almost everything after one token, which leaves dA_log and ddt_bias as tiny sums of cancelling
// terms whose fp32 rounding alone reaches ~1e-5 relative).
void perturb_weights(model::Qwen35Model& m, uint64_t seed, const dist::ProcessGroups& pg) {
  for (model::Param* p : m.params()) {
    if (p->spec.init.kind == model::Init::zeros && p->spec.tp_dim < 0)
      ops::rng_normal(p->master, seed, model::rng_stream_of(p->spec.name) + 1, 0.f, 0.5f,
                      ops::RngSlice::whole(p->master));
    if (p->spec.name.ends_with(".A_log")) {
      Tensor g = Tensor::empty(p->spec.shape, DType::f32);
      ops::rng_uniform(g, seed, model::rng_stream_of(p->spec.name) + 1, 0.01f, 1.f,
                       ops::RngSlice::whole(g));
      for (int64_t i = 0; i < g.numel(); ++i) g.ptr<float>()[i] = std::log(g.ptr<float>()[i]);
      model::shard_from_global(p->master, g, p->spec, pg.dims.tp, pg.coord.tp);
    }
  }
}

dist::ProcessGroups make_groups(int tp, int cp) {
  dist::ParallelDims dims{tp, cp, -1};
  EXPECT_EQ(dims.resolve(dist::world_size()), "");
  return dist::ProcessGroups::build(dims, dist::Backend::mpi);
}

// One micro-batch: the documents `docs` (indices into kDocLens) packed for (cp, sp), padded for
// (pad_cp, sp) with random pad tokens (pad_seed); pad_cp = 0 packs them without any padding.
struct Batch {
  std::vector<int32_t> ids;  // [T] global packed ids
  data::PackedSeqParams psp;
};
Batch make_batch(const std::vector<int32_t>& tokens, const std::vector<size_t>& docs, int cp, int sp, int cp_rank,
                 int pad_cp, uint64_t pad_seed) {
  const std::vector<int64_t> cu_all = cumsum(kDocLens);
  std::vector<int64_t> lens;
  for (size_t d : docs) lens.push_back(kDocLens[d]);
  std::vector<int64_t> cu_act = cumsum(lens), cu_pad = cu_act;
  int64_t T = cu_act.back();
  if (pad_cp > 0) {
    PaddedBatch b = padded_batch(lens, pad_cp, sp);
    cu_act = b.cu_act;
    cu_pad = b.cu_pad;
    T = b.T;
  }
  Batch B;
  Tensor r = Tensor::empty(Shape{std::max<int64_t>(T, 1)}, DType::f32);
  ops::rng_uniform(r, pad_seed, 502, 0.f, 64.f, ops::RngSlice::whole(r));
  B.ids.resize(size_t(T));
  for (int64_t t = 0; t < T; ++t) B.ids[size_t(t)] = int32_t(r.ptr<float>()[t]) % 64;  // pads: random
  for (size_t i = 0; i < docs.size(); ++i)
    for (int64_t j = 0; j < lens[i]; ++j) B.ids[size_t(cu_pad[i] + j)] = tokens[size_t(cu_all[docs[i]] + j)];
  B.psp = data::PackedSeqParams::build({cu_act, cu_pad, 1, T / (int64_t(cp) * sp), sp, cp, cp_rank}, Device::cpu());
  return B;
}

struct StepOut {
  model::GlobalLoss loss;
  std::vector<Tensor> grads, masters;  // host f32, reduced; in params() order
  std::vector<model::ParamSpec> specs;
};

// One step of `m` on this rank's batch: forward, global loss, backward(1 / count), reduce_grads.
StepOut run_step(model::Qwen35Model& m, const Batch& B, const dist::ProcessGroups& pg) {
  layers::LmTargets tg = layers::next_token_targets(B.ids, B.psp, Device::cpu());
  Tensor ids = layers::local_token_ids(B.ids, B.psp, Device::cpu());
  layers::LmHeadLoss::Result r = m.forward(ids, B.psp, tg);
  StepOut o;
  o.loss = model::global_loss(r, pg);
  m.backward(float(1.0 / double(std::max<int64_t>(o.loss.count, 1))));
  model::reduce_grads(m.params(), pg);
  for (model::Param* p : m.params()) {
    o.grads.push_back(download_f32(p->grad));
    o.masters.push_back(download_f32(p->master));
    o.specs.push_back(p->spec);
  }
  return o;
}

// The serial model on every rank (tp = cp = 1), all documents, unpadded.
StepOut serial_step(const io::ModelConfig& cfg, const std::vector<int32_t>& tokens, uint64_t seed) {
  dist::ProcessGroups pg = make_groups(1, 1);  // dp = world: the model never uses it
  layers::RunCtx ctx;
  ctx.pg = &pg;
  ctx.seed = seed;
  model::Qwen35Model m(cfg, ctx);
  perturb_weights(m, seed, pg);
  std::vector<size_t> all(kDocLens.size());
  std::iota(all.begin(), all.end(), size_t(0));
  Batch B = make_batch(tokens, all, 1, 1, 0, /*pad_cp=*/0, seed);
  // Serial: no reduction needed; a 1-rank view of the groups keeps the sums local.
  layers::LmTargets tg = layers::next_token_targets(B.ids, B.psp, Device::cpu());
  layers::LmHeadLoss::Result r = m.forward(layers::local_token_ids(B.ids, B.psp, Device::cpu()), B.psp, tg);
  StepOut o;
  o.loss.sum = ops::item(r.loss_sum);
  o.loss.count = r.count;
  m.backward(float(1.0 / double(o.loss.count)));
  for (model::Param* p : m.params()) {
    o.grads.push_back(download_f32(p->grad));
    o.masters.push_back(download_f32(p->master));
    o.specs.push_back(p->spec);
  }
  return o;
}

struct Layout {
  int tp, cp;
  bool sp;
};
std::vector<Layout> layouts_for(int world) {
  if (world == 1) return {{1, 1, false}};
  if (world == 2) return {{2, 1, false}, {2, 1, true}, {1, 2, false}, {1, 1, false}};
  if (world == 4) return {{2, 2, false}, {2, 2, true}, {1, 2, false}, {2, 1, false}, {2, 1, true}, {1, 4, false}};
  return {};
}

Tensor shard_of(const TensorView& global, const model::ParamSpec& s, int tp, int tp_rank) {
  Tensor t = Tensor::empty(model::local_shape(s, tp), DType::f32);
  model::shard_from_global(t, global, s, tp, tp_rank);
  return t;
}

void check_step_layout(const Layout& L, const io::ModelConfig& cfg, const std::vector<int32_t>& tokens,
                       const StepOut& R, uint64_t seed) {
  dist::ProcessGroups pg = make_groups(L.tp, L.cp);
  const int dp = pg.dims.dp, sp = L.sp ? L.tp : 1;
  SCOPED_TRACE(fmt::format("tp {} cp {} dp {} sp {} tied {}", L.tp, L.cp, dp, L.sp, cfg.tie_word_embeddings));
  std::vector<size_t> docs;  // this dp rank's documents: every dp-th one
  for (size_t d = size_t(pg.coord.dp); d < kDocLens.size(); d += size_t(dp)) docs.push_back(d);
  Batch B = make_batch(tokens, docs, L.cp, sp, pg.coord.cp, /*pad_cp=*/L.cp, seed + 17 * uint64_t(pg.coord.dp));
  layers::RunCtx ctx;
  ctx.pg = &pg;
  ctx.sp = L.sp;
  ctx.seed = seed;
  model::Qwen35Model m(cfg, ctx);
  perturb_weights(m, seed, pg);
  StepOut o = run_step(m, B, pg);

  EXPECT_EQ(o.loss.count, R.loss.count);
  const double want = R.loss.sum / double(R.loss.count);
  EXPECT_LT(std::abs(o.loss.mean() - want) / std::abs(want), 1e-5) << "loss " << o.loss.mean() << " vs " << want;
  ASSERT_EQ(o.specs.size(), R.specs.size());
  for (size_t k = 0; k < R.specs.size(); ++k) {
    ASSERT_EQ(o.specs[k].name, R.specs[k].name);
    EXPECT_TRUE(close_rel(o.grads[k], shard_of(R.grads[k], o.specs[k], L.tp, pg.coord.tp), 1e-5)) << o.specs[k].name;
  }
}

}  // namespace

TEST(Qwen35Model, OneStepMatchesSerialUnderEveryLayout) {
  const uint64_t seed = test_seed();
  for (bool tied : {true, false}) {
    const io::ModelConfig cfg = tiny_config(tied);
    const std::vector<int32_t> tokens = doc_tokens(seed, cfg.vocab_size);
    const StepOut R = serial_step(cfg, tokens, seed);
    ASSERT_GT(R.loss.count, 0);
    ASSERT_TRUE(std::isfinite(R.loss.sum));
    for (const Layout& L : layouts_for(dist::world_size())) check_step_layout(L, cfg, tokens, R, seed);
  }
}

TEST(Qwen35Model, PackedEqualsDocumentsOneByOne) {
  if (dist::world_size() != 1) GTEST_SKIP() << "single-process test";
  const uint64_t seed = test_seed();
  const io::ModelConfig cfg = tiny_config(true);
  const std::vector<int32_t> tokens = doc_tokens(seed, cfg.vocab_size);
  dist::ProcessGroups pg = make_groups(1, 1);
  layers::RunCtx ctx;
  ctx.pg = &pg;
  ctx.seed = seed;
  model::Qwen35Model m(cfg, ctx);
  perturb_weights(m, seed, pg);
  auto loss_of = [&](const Batch& B) {
    layers::LmTargets tg = layers::next_token_targets(B.ids, B.psp, Device::cpu());
    layers::LmHeadLoss::Result r = m.forward(layers::local_token_ids(B.ids, B.psp, Device::cpu()), B.psp, tg);
    return std::pair{double(ops::item(r.loss_sum)), r.count};
  };
  std::vector<size_t> all(kDocLens.size());
  std::iota(all.begin(), all.end(), size_t(0));
  // Packed with alignment padding (cp = 2's multiples, random pad tokens) and without, at cp = 1.
  auto [packed, n_packed] = loss_of(make_batch(tokens, all, 1, 1, 0, 2, seed));
  auto [packed0, n_packed0] = loss_of(make_batch(tokens, all, 1, 1, 0, 0, seed));
  double sum = 0;
  int64_t n = 0;
  for (size_t d = 0; d < kDocLens.size(); ++d) {
    auto [s_d, n_d] = loss_of(make_batch(tokens, {d}, 1, 1, 0, 0, seed));
    sum += s_d;
    n += n_d;
  }
  ASSERT_GT(n, 0);
  EXPECT_EQ(n_packed, n);
  EXPECT_EQ(n_packed0, n);
  EXPECT_LT(std::abs(packed / double(n_packed) - sum / double(n)) / (sum / double(n)), 1e-5);
  EXPECT_LT(std::abs(packed0 / double(n_packed0) - sum / double(n)) / (sum / double(n)), 1e-5);
}

TEST(Qwen35Model, InitIsLayoutIndependent) {
  const uint64_t seed = test_seed();
  for (bool tied : {true, false}) {
    const io::ModelConfig cfg = tiny_config(tied);
    std::vector<Tensor> serial;
    {
      dist::ProcessGroups pg = make_groups(1, 1);
      layers::RunCtx ctx;
      ctx.pg = &pg;
      ctx.seed = seed;
      model::Qwen35Model m(cfg, ctx);
      for (model::Param* p : m.params()) serial.push_back(download_f32(p->master));
    }
    for (const Layout& L : layouts_for(dist::world_size())) {
      SCOPED_TRACE(fmt::format("tp {} cp {} sp {} tied {}", L.tp, L.cp, L.sp, tied));
      dist::ProcessGroups pg = make_groups(L.tp, L.cp);
      layers::RunCtx ctx;
      ctx.pg = &pg;
      ctx.sp = L.sp;
      ctx.seed = seed;
      model::Qwen35Model m(cfg, ctx);
      std::vector<model::Param*> ps = m.params();
      ASSERT_EQ(ps.size(), serial.size());
      for (size_t k = 0; k < ps.size(); ++k) {
        Tensor want = shard_of(serial[k], ps[k]->spec, L.tp, pg.coord.tp);
        ASSERT_EQ(want.nbytes(), ps[k]->master.nbytes()) << ps[k]->spec.name;
        EXPECT_EQ(std::memcmp(want.data(), ps[k]->master.data(), want.nbytes()), 0) << ps[k]->spec.name;
      }
    }
  }
}

TEST(Qwen35Model, ParamTableFollowsHfAndRegistry) {
  for (bool tied : {true, false}) {
    const io::ModelConfig cfg = tiny_config(tied);
    dist::ProcessGroups pg = make_groups(1, 1);
    layers::RunCtx ctx;
    ctx.pg = &pg;
    model::Qwen35Model m(cfg, ctx);
    std::vector<model::ParamSpec> specs = model::Qwen35Model::param_specs(cfg, false);
    std::vector<model::Param*> ps = m.params();
    ASSERT_EQ(specs.size(), ps.size());
    for (size_t k = 0; k < ps.size(); ++k) {
      EXPECT_EQ(specs[k].name, ps[k]->spec.name);
      EXPECT_EQ(specs[k].shape, ps[k]->spec.shape) << specs[k].name;
    }
    EXPECT_EQ(specs.front().name, "model.embed_tokens.weight");
    EXPECT_EQ(specs.back().name, tied ? "model.norm.weight" : "lm_head.weight");
    EXPECT_NE(m.find_param("model.layers.0.input_layernorm.weight"), nullptr);
    EXPECT_NE(m.find_param("model.layers.0.post_attention_layernorm.weight"), nullptr);
    EXPECT_NE(m.find_param("model.layers.2.linear_attn.A_log"), nullptr);
    EXPECT_NE(m.find_param("model.layers.3.self_attn.q_norm.weight"), nullptr);
    EXPECT_NE(m.find_param("model.layers.3.mlp.down_proj.weight"), nullptr);
    EXPECT_EQ(m.find_param("model.layers.3.linear_attn.A_log"), nullptr);
    EXPECT_EQ(m.find_param("lm_head.weight") == nullptr, tied);
    int64_t n = 0;
    for (model::Param* p : ps) n += p->master.numel();
    EXPECT_GT(n, 0);
  }
  ASSERT_NE(model::find_mixer("linear_attention"), nullptr);
  EXPECT_EQ(model::find_mixer("linear_attention")->module, "linear_attn");
  EXPECT_EQ(model::find_mixer("full_attention")->module, "self_attn");
  EXPECT_EQ(model::find_mixer("sliding_attention"), nullptr);
  io::ModelConfig bad = tiny_config(true);
  bad.layer_types = {"linear_attention", "linear_attention", "sliding_attention", "full_attention"};
  EXPECT_NE(model::Qwen35Model::check_layout(bad, 1, 1).find("model.layer_types[2]='sliding_attention'"),
            std::string::npos);
  bad.layer_types = {"linear_attention"};
  EXPECT_NE(model::Qwen35Model::check_layout(bad, 1, 1).find("num_hidden_layers=4"), std::string::npos);
  EXPECT_NE(model::Qwen35Model::check_layout(tiny_config(true), 8, 1).find("tp*cp=8"), std::string::npos);
  EXPECT_EQ(model::Qwen35Model::check_layout(tiny_config(true), 2, 2), "");
}

TEST(Qwen35Model, PadContentsChangeNothing) {
  // Two packs of the same documents that differ only in the pad tokens: the loss and every
  // gradient agree bit for bit (CPU, deterministic).
  const uint64_t seed = test_seed();
  const io::ModelConfig cfg = tiny_config(true);
  const std::vector<int32_t> tokens = doc_tokens(seed, cfg.vocab_size);
  std::vector<size_t> all(kDocLens.size());
  std::iota(all.begin(), all.end(), size_t(0));
  std::vector<StepOut> outs;
  for (uint64_t pad_seed : {seed, seed + 5}) {
    dist::ProcessGroups pg = make_groups(1, 1);
    layers::RunCtx ctx;
    ctx.pg = &pg;
    ctx.seed = seed;
    model::Qwen35Model m(cfg, ctx);
    perturb_weights(m, seed, pg);
    outs.push_back(run_step(m, make_batch(tokens, all, 1, 1, 0, 2, pad_seed), pg));
  }
  EXPECT_EQ(outs[0].loss.sum, outs[1].loss.sum);
  for (size_t k = 0; k < outs[0].grads.size(); ++k)
    EXPECT_EQ(std::memcmp(outs[0].grads[k].data(), outs[1].grads[k].data(), outs[0].grads[k].nbytes()), 0)
        << outs[0].specs[k].name;
}

TEST(Qwen35Model, MicroBatchesAccumulateGradients) {
  // Gradient accumulation on one rank: two micro-batches (even / odd documents), each backward
  // scaled by 1 / (total count), accumulate (+=) the gradients of one step over all documents.
  const uint64_t seed = test_seed();
  const io::ModelConfig cfg = tiny_config(false);
  const std::vector<int32_t> tokens = doc_tokens(seed, cfg.vocab_size);
  const StepOut R = serial_step(cfg, tokens, seed);
  dist::ProcessGroups pg = make_groups(1, 1);
  layers::RunCtx ctx;
  ctx.pg = &pg;
  ctx.seed = seed;
  model::Qwen35Model m(cfg, ctx);
  perturb_weights(m, seed, pg);
  std::vector<Batch> mbs;
  for (size_t first : {size_t(0), size_t(1)}) {
    std::vector<size_t> docs;
    for (size_t d = first; d < kDocLens.size(); d += 2) docs.push_back(d);
    mbs.push_back(make_batch(tokens, docs, 1, 1, 0, 2, seed + first));
  }
  double sum = 0;
  for (const Batch& B : mbs) {
    layers::LmTargets tg = layers::next_token_targets(B.ids, B.psp, Device::cpu());
    sum += ops::item(m.forward(layers::local_token_ids(B.ids, B.psp, Device::cpu()), B.psp, tg).loss_sum);
    m.backward(float(1.0 / double(R.loss.count)));
  }
  EXPECT_LT(std::abs(sum - R.loss.sum) / std::abs(R.loss.sum), 1e-5);
  std::vector<model::Param*> ps = m.params();
  ASSERT_EQ(ps.size(), R.grads.size());
  for (size_t k = 0; k < ps.size(); ++k) EXPECT_TRUE(close_rel(ps[k]->grad, R.grads[k], 1e-5)) << ps[k]->spec.name;
}
