// The FLOP model (train/flops.h) against numbers computed by hand, the GDN per-token counts of
// gdn-math.md 9.1's table, and the GEMM count against the ParamSpec table (6 x matmul weights x
// tokens, Megatron's 6*N*tokens); the step metrics' derived fields (tokens/s, TFLOP/s per GPU,
// MFU) and their JSON record. Exact up to double rounding (rel. 1e-12) unless stated.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <cmath>
#include <limits>

#include <vector>

#include "deltatron/io/config.h"
#include "deltatron/model/qwen35.h"
#include "deltatron/train/flops.h"
#include "deltatron/train/metrics.h"

using namespace dt;

namespace {

// Small enough to count by hand: H 8, I 16, V 64; one GDN layer (Hk 1, Hv 2, dk = dv = 4) and one
// attention layer (Hq 2, Hkv 1, head_dim 4).
io::ModelConfig hand_config() {
  io::ModelConfig m;
  m.vocab_size = 64;
  m.hidden_size = 8;
  m.intermediate_size = 16;
  m.num_hidden_layers = 2;
  m.layer_types = {"linear_attention", "full_attention"};
  m.linear_num_key_heads = 1;
  m.linear_num_value_heads = 2;
  m.linear_key_head_dim = 4;
  m.linear_value_head_dim = 4;
  m.num_attention_heads = 2;
  m.num_key_value_heads = 1;
  m.head_dim = 4;
  return m;
}

void expect_rel(double got, double want, double tol, const char* what) {
  EXPECT_NEAR(got, want, tol * std::max(1.0, std::fabs(want))) << what;
}

}  // namespace

TEST(Flops, HandCountedSmallModel) {
  // Sequences of real length 3, 0 (an alignment segment) and 70 (a full GDN chunk of 64 + 6).
  const std::vector<int64_t> lens = {3, 0, 70};
  train::FlopCount f = train::step_flops(hand_config(), lens);
  // Weights per token: GDN 8*(8+8) + 8*8 + 2*8*2 + 8*8 = 288; attention 8*16 + 2*8*4 + 8*8 = 256;
  // MLP 3*8*16 = 384 per layer; LM head 64*8 = 512. 73 tokens, 6 FLOPs per weight (fwd + bwd).
  expect_rel(f.gemm, 6.0 * 73 * (288 + 256 + 2 * 384 + 512), 1e-12, "gemm");  // 798912
  // Causal pairs 3*4/2 + 70*71/2 = 2491; forward 4 * 2491 * 4 * 2, backward 2.5x that.
  expect_rel(f.attention, 3.5 * 4 * 2491 * 4 * 2, 1e-12, "attention");  // 278992
  // Per token and v-head with chunk size c: fwd 20c + 96, bwd 48c + 192 + (2/3)c^2.
  // c=3 (3 tokens): 498 each; c=64 (64 tokens): 4352 + 288 + 8192/3; c=6 (6 tokens): 720 each.
  const double per_head = 3 * 498.0 + 64 * (4352 + 288 + 8192.0 / 3) + 6 * 720.0;
  expect_rel(f.gdn, 2 * per_head, 1e-12, "gdn");  // Hv = 2, one GDN layer: 955073.33
  expect_rel(f.model(), f.gemm + f.gdn + f.attention, 1e-15, "model");

  // The packed form (cumulative boundaries) gives the same.
  const std::vector<int64_t> cu = {0, 3, 3, 73};
  train::FlopCount g = train::micro_batch_flops(hand_config(), cu);
  EXPECT_EQ(g.gemm, f.gemm);
  EXPECT_EQ(g.gdn, f.gdn);
  EXPECT_EQ(g.attention, f.attention);
}

TEST(Flops, GdnPerTokenMatchesGdnMathTable) {
  // gdn-math.md 9.1, dk = dv = 128, C = 64, triangle-aware minimum: fwd 1.39e5, bwd 2.98e5 per token
  // and v-head (exactly 139264 and 297642.67). One GDN layer of Hv = 1, a sequence of 128 tokens.
  io::ModelConfig m = hand_config();
  m.num_hidden_layers = 1;
  m.layer_types = {"linear_attention"};
  m.linear_num_key_heads = m.linear_num_value_heads = 1;
  m.linear_key_head_dim = m.linear_value_head_dim = 128;
  const std::vector<int64_t> lens = {128};
  train::FlopCount f = train::step_flops(m, lens);
  expect_rel(f.gdn / 128, 139264.0 + 297642.0 + 2.0 / 3.0, 1e-12, "per token");
}

TEST(Flops, GemmCountIsSixTimesMatmulWeightsTimesTokens) {
  // Megatron's 6*N*tokens with N = every 2-D weight except the embedding lookup, plus the LM head
  // (which a tied model shares with the embedding): summed from the ParamSpec table, independently
  // of the per-layer formulas.
  for (const char* file : {"/configs/quickstart.yaml", "/configs/bench-0.8b.yaml"}) {
    SCOPED_TRACE(file);
    io::Config c;
    ASSERT_EQ(io::load_config(std::string(DT_SOURCE_DIR) + file, {}, &c), "");
    double n = 0;
    for (const model::ParamSpec& s : model::Qwen35Model::param_specs(c.model, false))
      if (s.shape.ndim == 2 && s.name != "model.embed_tokens.weight") n += double(s.shape.numel());
    if (c.model.tie_word_embeddings) n += double(c.model.vocab_size * c.model.hidden_size);
    const std::vector<int64_t> lens = {1000, 24, 7};
    EXPECT_DOUBLE_EQ(train::step_flops(c.model, lens).gemm, 6.0 * n * 1031);
  }
}

TEST(Flops, PeakOfKnownDevices) {
  EXPECT_EQ(train::peak_tflops("NVIDIA H200", true), 989);
  EXPECT_EQ(train::peak_tflops("NVIDIA H100 80GB HBM3", true), 989);
  EXPECT_EQ(train::peak_tflops("NVIDIA H100 80GB HBM3", false), 67);
  EXPECT_EQ(train::peak_tflops("NVIDIA H100 PCIe", true), 756);
  EXPECT_EQ(train::peak_tflops("NVIDIA A100-SXM4-80GB", true), 0);
  EXPECT_EQ(train::peak_tflops("cpu", true), 0);
}

TEST(StepMetrics, DerivedFieldsAndJson) {
  train::StepMetrics m;
  m.step = 3;
  m.total_steps = 10;
  m.loss = 2.5;
  m.grad_norm = 0.75;
  m.lr = 1e-3;
  m.step_ms = 500;
  m.tokens = 16384;
  m.model_flops = 494.5e12;  // in 0.5 s on 2 GPUs: 494.5 TFLOP/s per GPU = 50% of 989
  m.world = 2;
  m.peak_tflops = 989;
  m.peak_mem_bytes = int64_t(3) << 30;
  EXPECT_DOUBLE_EQ(m.tokens_per_s(), 32768);
  EXPECT_DOUBLE_EQ(m.tflops_per_gpu(), 494.5);
  EXPECT_DOUBLE_EQ(m.mfu(), 0.5);
  nlohmann::json j = nlohmann::json::parse(train::format_step_json(m));
  EXPECT_EQ(j["step"], 3);
  EXPECT_DOUBLE_EQ(j["loss"].get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(j["tokens_per_s"].get<double>(), 32768);
  EXPECT_DOUBLE_EQ(j["tflops_per_gpu"].get<double>(), 494.5);
  EXPECT_DOUBLE_EQ(j["mfu"].get<double>(), 0.5);
  EXPECT_EQ(j["peak_mem_bytes"].get<int64_t>(), int64_t(3) << 30);
  const std::string line = train::format_step_line(m);
  EXPECT_NE(line.find("MFU 50.0%"), std::string::npos) << line;
  EXPECT_NE(line.find("peak 3.00 GiB"), std::string::npos) << line;

  m.peak_tflops = 0;  // the CPU: TFLOP/s only
  EXPECT_TRUE(nlohmann::json::parse(train::format_step_json(m))["mfu"].is_null());
  EXPECT_EQ(train::format_step_line(m).find("MFU"), std::string::npos);

  // A skipped step's non-finite loss and grad norm: the line stays JSON (null, not nan).
  m.loss = std::nan("");
  m.grad_norm = std::numeric_limits<double>::infinity();
  j = nlohmann::json::parse(train::format_step_json(m));
  EXPECT_TRUE(j["loss"].is_null());
  EXPECT_TRUE(j["grad_norm"].is_null());
  EXPECT_DOUBLE_EQ(j["lr"].get<double>(), 1e-3);
}
