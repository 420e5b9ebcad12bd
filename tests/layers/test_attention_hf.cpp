// The packed GatedAttention layer against HF transformers' Qwen3_5Attention, run by HF one sequence
// at a time in fp32 with eager attention, each sequence with positions from 0 (fixture:
// scripts/fixtures/make_attention_fixture.py -> tests/fixtures/attention_hf.safetensors). Weights
// are loaded by HF name; y, dX and every parameter gradient must match (fp32, rel. L2 < 1e-4: HF
// computes the RoPE angles in fp32, we in double, which differ by ~1e-5 at position 130).
// The fixture was made with transformers 5.17 (eager attention, fp32, CPU) on the GPU machine.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "deltatron/data/packed_seq.h"
#include "deltatron/io/safetensors.h"
#include "deltatron/layers/attention.h"
#include "deltatron/ops/basic.h"
#include "hf_fixture.h"
#include "test_util.h"

using namespace dt;

TEST(AttentionLayerHf, MatchesTransformersQwen3_5Attention) {
  io::SafetensorsFile f = io::read_safetensors_or_die(DT_FIXTURE_DIR "/attention_hf.safetensors");
  nlohmann::json c = nlohmann::json::parse(f.metadata.at("config"));
  layers::AttentionConfig cfg;
  cfg.hidden = c["hidden_size"];
  cfg.num_heads = c["num_attention_heads"];
  cfg.num_kv_heads = c["num_key_value_heads"];
  cfg.head_dim = c["head_dim"];
  cfg.norm_eps = c["rms_norm_eps"];
  cfg.rope_theta = c["rope_parameters"]["rope_theta"];
  cfg.partial_rotary_factor = c["rope_parameters"]["partial_rotary_factor"];

  dist::ParallelDims dims{1, 1, 1};
  ASSERT_EQ(dims.resolve(1), "");
  dist::ProcessGroups pg = dist::ProcessGroups::build(dims, dist::Backend::mpi);
  layers::RunCtx ctx;
  ctx.pg = &pg;
  layers::GatedAttention layer(cfg, "model.layers.0", ctx);
  dt::testing::check_against_hf_fixture(layer, f, "model.layers.0.self_attn.", cfg.hidden, 1e-4);
}
