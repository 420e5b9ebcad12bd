// GatedAttention layer on the CPU backend: parallel vs serial under every (tp, sp, cp) layout of
// the world size (mpirun -np 1, 2, 4: (2,F,1) (2,T,1) (1,F,2) (1,F,4) (2,F,2) (2,T,2) (4,T,1)) on a
// packed batch of unequal lengths (1, 2, odd, > 64, and a pure-padding sequence of actual length
// 0) with alignment padding: y at real rows, dX, every weight gradient after reduce_grads sliced
// to the shard, fp32 rel. L2 < 1e-5. Packed vs per-sequence; HF names and TP split dims; config
// messages. See layer_test_util.h.
#include "deltatron/layers/attention.h"
#include "layer_test_util.h"

using namespace dt;
using namespace dt::testing;

namespace {

// 8 query heads over 4 kv heads (GQA 2), d = 32 with rotary dim 8 (Qwen3.5's factor 0.25);
// theta 1e4 so that positions up to ~130 turn every rotary frequency noticeably.
layers::AttentionConfig attn_cfg() {
  layers::AttentionConfig c;
  c.hidden = 48;
  c.num_heads = 8;
  c.num_kv_heads = 4;
  c.head_dim = 32;
  c.partial_rotary_factor = 0.25;
  c.rope_theta = 1e4;
  c.norm_eps = 1e-6f;
  c.init_std = 0.2f;  // large enough that the softmax is far from uniform
  return c;
}
const std::vector<int64_t> kAttnLens = {5, 1, 13, 8, 0, 70, 3, 129, 2};

SeqLayerFn attn_fn() {
  return [](const layers::RunCtx& ctx, const TensorView& x, const TensorView& dy, const data::PackedSeqParams& psp,
            bool reduce) {
    layers::GatedAttention attn(attn_cfg(), "model.layers.3", ctx);
    // HF initialises q_norm/k_norm to 0 ((1 + w) convention); random values make w matter. The
    // weights are replicated: the same draw (by global index) on every rank.
    for (const char* n : {"q_norm.weight", "k_norm.weight"}) {
      model::Param& p = attn.param(n);
      ops::rng_normal(p.master, ctx.seed, model::rng_stream_of(p.spec.name) + 1, 0.f, 0.5f,
                      ops::RngSlice::whole(p.master));
    }
    return run_seq_layer(attn, ctx, x, dy, psp, reduce);
  };
}

std::vector<GdnLayout> layouts_for(int world) {
  if (world == 1) return {{1, 1, false}};
  if (world == 2) return {{2, 1, false}, {2, 1, true}, {1, 2, false}};
  if (world == 4) return {{1, 4, false}, {2, 2, false}, {2, 2, true}, {4, 1, true}};
  return {};
}

}  // namespace

TEST(AttentionLayer, SpecsFollowHf) {
  auto specs = layers::GatedAttention::param_specs(attn_cfg(), "model.layers.3");
  ASSERT_EQ(specs.size(), 6u);
  const char* names[] = {"q_proj.weight", "k_proj.weight", "v_proj.weight",
                         "o_proj.weight", "q_norm.weight", "k_norm.weight"};
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(specs[i].name, std::string("model.layers.3.self_attn.") + names[i]);
  EXPECT_EQ(specs[0].shape, (Shape{8 * 32 * 2, 48}));
  EXPECT_EQ(specs[1].shape, (Shape{4 * 32, 48}));
  EXPECT_EQ(specs[2].shape, (Shape{4 * 32, 48}));
  EXPECT_EQ(specs[3].shape, (Shape{48, 8 * 32}));
  EXPECT_EQ(specs[4].shape, (Shape{32}));
  const int dims[] = {0, 0, 0, 1, -1, -1};
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(specs[i].tp_dim, dims[i]) << names[i];
  for (size_t i = 4; i < 6; ++i) {
    EXPECT_TRUE(specs[i].keep_fp32 && specs[i].grad_sum_tp) << names[i];
    EXPECT_EQ(specs[i].init.kind, model::Init::zeros) << names[i];
  }
  // tp = 2: rank 1 owns q_proj rows of heads 4..7, i.e. [4*64, 8*64) (query and gate together).
  auto pieces = model::shard_pieces(specs[0], 2, 1);
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_EQ(pieces[0].global_off, 4 * 64);
  EXPECT_EQ(pieces[0].len, 4 * 64);
}

TEST(AttentionLayer, ConfigMessagesNameTheValues) {
  layers::AttentionConfig c = attn_cfg();
  EXPECT_EQ(layers::GatedAttention::check_layout(c, 4), "");
  EXPECT_EQ(layers::GatedAttention::check_layout(c, 8),
            "config: attention TP needs tp=8 to divide num_attention_heads=8 and num_key_value_heads=4 (kv heads are "
            "not replicated)");
  c.num_kv_heads = 3;
  EXPECT_EQ(layers::GatedAttention::check_layout(c, 1),
            "config: model.num_attention_heads=8 is not a multiple of model.num_key_value_heads=3");
  c = attn_cfg();
  c.partial_rotary_factor = 0.2;  // int(32 * 0.2) = 6 is fine; 0.1 gives 3, odd
  EXPECT_EQ(layers::GatedAttention::check_layout(c, 1), "");
  c.partial_rotary_factor = 0.1;
  EXPECT_EQ(layers::GatedAttention::check_layout(c, 1),
            "config: rotary dim int(head_dim=32 * partial_rotary_factor=0.1) = 3 must be even and <= head_dim");
}

TEST(AttentionLayer, MatchesSerialUnderEveryLayout) {
  const uint64_t seed = test_seed();
  SeqLayerFn fn = attn_fn();
  const int64_t H = attn_cfg().hidden;
  SeqReference R = seq_reference(H, kAttnLens, fn, seed);
  for (const GdnLayout& L : layouts_for(dist::world_size())) check_seq_layout(L, H, fn, R, seed, 1e-5);
}

TEST(AttentionLayer, PackedEqualsPerSequence) {
  if (dist::world_size() != 1) GTEST_SKIP() << "single-process test";
  const uint64_t seed = test_seed();
  SeqLayerFn fn = attn_fn();
  const int64_t H = attn_cfg().hidden;
  SeqReference R = seq_reference(H, kAttnLens, fn, seed);
  auto S = serial_setting(seed, dist::Backend::mpi, Device::cpu(), DType::f32);
  const layers::RunCtx& ctx = S->ctx;
  std::vector<std::vector<double>> gsum(R.out.grads.size());
  for (size_t i = 0; i < kAttnLens.size(); ++i) {
    const int64_t b = R.cu[i], n = kAttnLens[i];
    if (n == 0) continue;
    DenseRun o = fn(ctx, rows_of(R.x, b, n), rows_of(R.dy, b, n),
                    data::PackedSeqParams::build({{0, n}, {0, n}, 1, n, 1, 1, 0}), false);
    EXPECT_TRUE(close_rel(o.y, rows_of(R.out.y, b, n), 1e-5)) << "seq " << i;  // GEMM blocking differs
    EXPECT_TRUE(close_rel(o.dx, rows_of(R.out.dx, b, n), 1e-5)) << "seq " << i;
    for (size_t k = 0; k < gsum.size(); ++k) {
      gsum[k].resize(size_t(o.grads[k].numel()), 0.0);
      for (int64_t e = 0; e < o.grads[k].numel(); ++e) gsum[k][size_t(e)] += o.grads[k].ptr<float>()[e];
    }
  }
  for (size_t k = 0; k < gsum.size(); ++k) {
    std::vector<double> want(R.out.grads[k].ptr<float>(), R.out.grads[k].ptr<float>() + R.out.grads[k].numel());
    EXPECT_TRUE(close_rel(gsum[k], want, 1e-5)) << R.out.specs[k].name;
  }
}

// A micro-batch whose sequences are all padding (actual length 0) gives exact zeros, never NaN:
// no row attends anything, so y = o_proj(0) = 0 and no gradient flows.
TEST(AttentionLayer, PurePaddingBatchIsFinite) {
  auto S = serial_setting(test_seed(), dist::Backend::mpi, Device::cpu(), DType::f32);
  const layers::RunCtx& ctx = S->ctx;
  const int64_t H = attn_cfg().hidden, T = 12;
  data::PackedSeqParams psp = data::PackedSeqParams::build({{0, 0, 0}, {0, 4, 12}, 1, T, 1, 1, 0});
  DenseRun o = attn_fn()(ctx, rand_host(Shape{T, H}), rand_host(Shape{T, H}), psp, false);
  for (const Tensor* t : {&o.y, &o.dx}) {
    for (int64_t i = 0; i < t->numel(); ++i) ASSERT_EQ(t->ptr<float>()[i], 0.f);
  }
  for (size_t k = 0; k < o.grads.size(); ++k)
    for (int64_t i = 0; i < o.grads[k].numel(); ++i) ASSERT_TRUE(std::isfinite(o.grads[k].ptr<float>()[i])) << k;
}
