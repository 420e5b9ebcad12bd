// GatedAttention on CUDA (NCCL between GPUs), one process per GPU, with the same packed batch as
// the CPU test (lengths 1, 2, odd, > 64, 129 and a pure-padding sequence; alignment padding).
// f32: every layout against the serial fp32 CPU oracle (rel. L2 < 1e-4). bf16: the single-GPU
// run against the fp32 oracle (< 3e-2: bf16 activations through two norms, RoPE and a softmax),
// and every layout against the single-GPU bf16 run (< 2e-2).
// 1 GPU: (1,F,1); 2 GPUs: (2,F,1), (2,T,1), (1,F,2); 4 GPUs: (2,T,2), (4,T,1), (1,F,4).
#include "deltatron/layers/attention.h"
#include "layer_test_util.h"

using namespace dt;
using namespace dt::testing;

namespace {

// 8 query heads over 4 KV heads (GQA 2), d = 64 (a tensor-core tile) with rotary dim 16.
layers::AttentionConfig attn_cfg() {
  layers::AttentionConfig c;
  c.hidden = 64;
  c.num_heads = 8;
  c.num_kv_heads = 4;
  c.head_dim = 64;
  c.partial_rotary_factor = 0.25;
  c.rope_theta = 1e4;
  c.norm_eps = 1e-6f;
  c.init_std = 0.1f;
  return c;
}
const std::vector<int64_t> kLens = {5, 1, 13, 8, 0, 70, 3, 129, 2};

SeqLayerFn attn_fn() {
  return [](const layers::RunCtx& ctx, const TensorView& x, const TensorView& dy, const data::PackedSeqParams& psp,
            bool reduce) {
    layers::GatedAttention attn(attn_cfg(), "model.layers.3", ctx);
    for (const char* n : {"q_norm.weight", "k_norm.weight"}) {  // random (1 + w) so that w matters
      model::Param& p = attn.param(n);
      ops::rng_normal(p.master, ctx.seed, model::rng_stream_of(p.spec.name) + 1, 0.f, 0.5f,
                      ops::RngSlice::whole(p.master), ctx.stream);
      model::refresh_compute(p, ctx.stream);
    }
    return run_seq_layer(attn, ctx, x, dy, psp, reduce);
  };
}

std::vector<GdnLayout> gpu_layouts(int world) {
  if (world == 2) return {{2, 1, false}, {2, 1, true}, {1, 2, false}};
  if (world == 4) return {{2, 2, true}, {4, 1, true}, {1, 4, false}};
  return {{1, 1, false}};
}

}  // namespace

TEST(AttentionLayerCuda, MatchesSerial) {
  const uint64_t seed = test_seed();
  const Device dev = Device::cuda(dist::select_cuda_device());
  const SeqLayerFn fn = attn_fn();
  const int64_t H = attn_cfg().hidden;
  SeqReference R32 = seq_reference(H, kLens, fn, seed);
  SeqReference R16 = seq_reference(H, kLens, fn, seed, dist::cuda_backend(), dev, DType::bf16);
  EXPECT_TRUE(close_rel(R16.out.y, R32.out.y, 3e-2)) << "bf16 y vs fp32";
  EXPECT_TRUE(close_rel(R16.out.dx, R32.out.dx, 3e-2)) << "bf16 dx vs fp32";
  for (size_t k = 0; k < R32.out.grads.size(); ++k)
    EXPECT_TRUE(close_rel(R16.out.grads[k], R32.out.grads[k], 3e-2)) << "bf16 vs fp32 " << R32.out.specs[k].name;
  for (const GdnLayout& L : gpu_layouts(dist::world_size())) {
    check_seq_layout(L, H, fn, R32, seed, 1e-4, dist::cuda_backend(), dev, DType::f32);
    check_seq_layout(L, H, fn, R16, seed, 2e-2, dist::cuda_backend(), dev, DType::bf16);
  }
}
