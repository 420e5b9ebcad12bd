// ParamSpec sharding and layout-independent init: the TP shards of every rank, put back
// together section by section, equal the tp=1 tensor bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "deltatron/model/param.h"
#include "deltatron/ops/basic.h"
#include "test_util.h"

using namespace dt;
using model::ParamSpec;

TEST(Param, ShardsOfEveryLayoutReassembleTheWholeTensor) {
  uint64_t seed = dt::testing::test_seed();
  ParamSpec col{"layers.0.linear_attn.in_proj_qkv.weight", Shape{8 + 8 + 16, 6}, model::InitRule::normal(0.02f), 0,
                {8, 8, 16}};
  ParamSpec row{"layers.0.linear_attn.out_proj.weight", Shape{6, 16}, model::InitRule::normal(0.02f), 1};
  ParamSpec alog{"layers.0.linear_attn.A_log", Shape{8}, model::InitRule::log_uniform(1.f, 16.f), 0, {}, true};
  for (const ParamSpec& s : {col, row, alog}) {
    model::Param whole = model::make_param(s, 1, 0, seed, Device::cpu(), DType::f32);
    for (int tp : {2, 4}) {
      ASSERT_EQ(model::check_splittable(s, tp), "");
      for (int r = 0; r < tp; ++r) {
        model::Param p = model::make_param(s, tp, r, seed, Device::cpu(), DType::f32);
        Tensor want = Tensor::empty(model::local_shape(s, tp), DType::f32);
        model::shard_from_global(want, whole.master, s, tp, r);
        ASSERT_EQ(std::memcmp(p.master.data(), want.data(), want.nbytes()), 0) << s.name << " tp " << tp << " rank " << r;
        for (int64_t i = 0; i < p.grad.numel(); ++i) ASSERT_EQ(p.grad.ptr<float>()[i], 0.f);
      }
    }
  }
  // Column-parallel sections: rank 1 of 2 holds q rows 4..7, k rows 12..15, v rows 24..31.
  auto pieces = model::shard_pieces(col, 2, 1);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].global_off, 4);
  EXPECT_EQ(pieces[1].global_off, 12);
  EXPECT_EQ(pieces[2].global_off, 24);
  EXPECT_EQ(pieces[2].local_off, 8);
  // A_log = log(U(1, 16)): never -inf, always in [0, log 16).
  model::Param a = model::make_param(alog, 1, 0, seed, Device::cpu(), DType::f32);
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(a.master.ptr<float>()[i] >= 0.f && a.master.ptr<float>()[i] < std::log(16.f));
  EXPECT_NE(model::check_splittable(col, 3).find("section 0 of dim 0 has 8 rows, not divisible by tp=3"),
            std::string::npos);
}

// make_params_rows: the same values as make_param (every TP rank), laid out as consecutive rows
// of one allocation each, which rows_joined finds; anything else is refused.
TEST(Param, RowsOfOneAllocationEqualSeparateParams) {
  uint64_t seed = dt::testing::test_seed();
  const std::vector<ParamSpec> specs = {
      {"layers.0.linear_attn.in_proj_qkv.weight", Shape{8 + 8 + 16, 6}, model::InitRule::normal(0.02f), 0, {8, 8, 16}},
      {"layers.0.linear_attn.in_proj_z.weight", Shape{16, 6}, model::InitRule::normal(0.02f), 0},
      {"layers.0.linear_attn.in_proj_b.weight", Shape{4, 6}, model::InitRule::normal(0.02f), 0}};
  for (int tp : {1, 2})
    for (int r = 0; r < tp; ++r) {
      SCOPED_TRACE(::testing::Message() << "tp " << tp << " rank " << r);
      std::vector<model::Param> joint = model::make_params_rows(specs, tp, r, seed, Device::cpu(), DType::f32);
      ASSERT_EQ(joint.size(), specs.size());
      const char* next = static_cast<const char*>(joint[0].master.data());
      for (size_t i = 0; i < specs.size(); ++i) {
        model::Param one = model::make_param(specs[i], tp, r, seed, Device::cpu(), DType::f32);
        ASSERT_EQ(joint[i].spec.name, specs[i].name);
        ASSERT_EQ(joint[i].master.shape(), one.master.shape());
        EXPECT_EQ(std::memcmp(joint[i].master.data(), one.master.data(), one.master.nbytes()), 0) << specs[i].name;
        for (int64_t k = 0; k < joint[i].grad.numel(); ++k) ASSERT_EQ(joint[i].grad.ptr<float>()[k], 0.f);
        EXPECT_EQ(joint[i].master.data(), next) << specs[i].name << " follows the previous rows";
        next += one.master.nbytes();
      }
      const model::JoinedRows j = model::rows_joined(joint.data(), joint.size());
      EXPECT_EQ(j.w.shape, (Shape{(8 + 8 + 16 + 16 + 4) / tp, 6}));
      EXPECT_EQ(j.grad.shape, j.w.shape);
      EXPECT_EQ(j.w.data, joint[0].master.data());
      EXPECT_EQ(j.grad.data, joint[0].grad.data());
      const model::JoinedRows tail = model::rows_joined(&joint[1], 2);  // any consecutive run joins
      EXPECT_EQ(tail.w.data, joint[1].master.data());
    }
  // Separately allocated params, or joint ones out of order, do not join: a check names them.
  std::vector<model::Param> sep;
  for (const ParamSpec& s : specs) sep.push_back(model::make_param(s, 1, 0, seed, Device::cpu(), DType::f32));
  EXPECT_DEATH(model::rows_joined(sep.data(), sep.size()),
               "in_proj_qkv.weight and the 2 params after it are not consecutive rows of one allocation");
  std::vector<model::Param> joint = model::make_params_rows(specs, 1, 0, seed, Device::cpu(), DType::f32);
  std::swap(joint[0], joint[1]);
  EXPECT_DEATH(model::rows_joined(joint.data(), 2),
               "in_proj_z.weight and the 1 params after it are not consecutive rows of one allocation");
  // Different widths are refused, naming the parameter.
  ParamSpec wide{"layers.0.linear_attn.in_proj_a.weight", Shape{4, 7}, model::InitRule::normal(0.02f), 0};
  EXPECT_DEATH(model::make_params_rows({specs[0], wide}, 1, 0, seed, Device::cpu(), DType::f32),
               "in_proj_a.weight has local shape \\[4, 7\\]");
  // Tensor::rows shares the storage: the rows outlive the tensor they came from.
  Tensor part;
  {
    Tensor t = Tensor::zeros(Shape{4, 3}, DType::f32);
    t.ptr<float>()[6] = 5.f;
    part = t.rows(2, 4);
  }
  EXPECT_EQ(part.shape(), (Shape{2, 3}));
  EXPECT_EQ(part.ptr<float>()[0], 5.f);
  EXPECT_DEATH(part.rows(1, 3), "is not inside dim 0");
}
