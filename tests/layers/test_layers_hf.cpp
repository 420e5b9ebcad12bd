// RmsNorm1p and SwiGluMlp against HF transformers' Qwen3_5RMSNorm and Qwen3_5MLP (fp32 CPU
// fixture tests/fixtures/layers_hf.safetensors from scripts/fixtures/make_layers_fixture.py):
// y, dX and every weight gradient, rel. L2 < 1e-5. The fixture was made with transformers 5.17 on
// the GPU machine's CPU (fp32).
#include <nlohmann/json.hpp>

#include "deltatron/io/safetensors.h"
#include "deltatron/layers/mlp.h"
#include "deltatron/layers/norm.h"
#include "deltatron/ops/basic.h"
#include "test_util.h"

using namespace dt;
using dt::testing::close_rel;

TEST(LayersHf, MatchTransformersQwen3_5RmsNormAndMlp) {
  io::SafetensorsFile f = io::read_safetensors_or_die(DT_FIXTURE_DIR "/layers_hf.safetensors");
  nlohmann::json c = nlohmann::json::parse(f.metadata.at("config"));
  const int64_t T = c["T"], H = c["hidden"], F = c["intermediate"];
  dist::ParallelDims dims{1, 1, 1};
  ASSERT_EQ(dims.resolve(1), "");
  dist::ProcessGroups pg = dist::ProcessGroups::build(dims, dist::Backend::mpi);
  layers::RunCtx ctx;
  ctx.pg = &pg;

  layers::RmsNorm1p norm(H, float(c["eps"]), "model.norm.weight", ctx);
  ops::copy(norm.weight().master, f.at("norm.weight"));
  Tensor y = Tensor::empty(Shape{T, H}, DType::f32), dx = Tensor::empty(Shape{T, H}, DType::f32);
  norm.forward(y, f.at("norm.x"));
  norm.backward(dx, f.at("norm.dy"));
  EXPECT_TRUE(close_rel(y, f.at("norm.y"), 1e-5)) << "norm y";
  EXPECT_TRUE(close_rel(dx, f.at("norm.dx"), 1e-5)) << "norm dx";
  EXPECT_TRUE(close_rel(norm.weight().grad, f.at("norm.dweight"), 1e-5)) << "norm dweight";

  layers::SwiGluMlp mlp({H, F, 0.02f}, "model.layers.0", ctx);
  const char* names[3] = {"gate_proj", "up_proj", "down_proj"};
  for (int i = 0; i < 3; ++i) ops::copy(mlp.params()[size_t(i)].master, f.at(fmt::format("mlp.{}.weight", names[i])));
  mlp.forward(y, f.at("mlp.x"));
  mlp.backward(dx, f.at("mlp.dy"));
  EXPECT_TRUE(close_rel(y, f.at("mlp.y"), 1e-5)) << "mlp y";
  EXPECT_TRUE(close_rel(dx, f.at("mlp.dx"), 1e-5)) << "mlp dx";
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(close_rel(mlp.params()[size_t(i)].grad, f.at(fmt::format("mlp.{}.grad", names[i])), 1e-5)) << names[i];
}
