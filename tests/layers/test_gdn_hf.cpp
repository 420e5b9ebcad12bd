// The packed GatedDeltaNet layer against HF transformers' Qwen3_5GatedDeltaNet, run by HF one
// sequence at a time in fp32 (fixture: scripts/fixtures/make_gdn_layer_fixture.py ->
// tests/fixtures/gdn_layer_hf.safetensors). Weights are loaded by HF name; output, dX and
// every parameter gradient must match (fp32, rel. L2 < 1e-4).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "deltatron/data/packed_seq.h"
#include "deltatron/io/safetensors.h"
#include "deltatron/layers/gdn.h"
#include "deltatron/ops/basic.h"
#include "hf_fixture.h"
#include "test_util.h"

using namespace dt;

TEST(GdnLayerHf, MatchesTransformersQwen3_5GatedDeltaNet) {
  io::SafetensorsFile f = io::read_safetensors_or_die(DT_FIXTURE_DIR "/gdn_layer_hf.safetensors");
  nlohmann::json c = nlohmann::json::parse(f.metadata.at("config"));
  layers::GdnConfig cfg;
  cfg.hidden = c["hidden_size"];
  cfg.num_k_heads = c["linear_num_key_heads"];
  cfg.num_v_heads = c["linear_num_value_heads"];
  cfg.head_k_dim = c["linear_key_head_dim"];
  cfg.head_v_dim = c["linear_value_head_dim"];
  cfg.conv_kernel = c["linear_conv_kernel_dim"];
  cfg.norm_eps = c["rms_norm_eps"];

  dist::ParallelDims dims{1, 1, 1};
  ASSERT_EQ(dims.resolve(1), "");
  dist::ProcessGroups pg = dist::ProcessGroups::build(dims, dist::Backend::mpi);
  layers::RunCtx ctx;
  ctx.pg = &pg;
  layers::GatedDeltaNet layer(cfg, "model.layers.0", ctx);
  dt::testing::check_against_hf_fixture(layer, f, "model.layers.0.linear_attn.", cfg.hidden, 1e-4);
}
