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
