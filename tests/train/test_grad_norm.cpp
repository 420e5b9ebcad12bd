// The global gradient norm under mpirun (CPU, MPI backend), for every (tp, cp, dp) layout of
// the world size: parameters built from the ParamSpec table (make_param), gradients filled so
// that after model::reduce_grads each rank holds its shard of a known global gradient, then
// global_grad_norm must equal the serial norm of the full gradients on every rank (TP shards
// summed, TP-replicated parameters counted once, dp x cp never summed), and clipping by it
// must bring the norm to the limit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "deltatron/model/grad_reduce.h"
#include "deltatron/ops/basic.h"
#include "deltatron/train/optimizer.h"
#include "dist/dist_test_util.h"
#include "optim_test_util.h"
#include "test_util.h"

using namespace dt;

namespace {

// The value of a world all-reduce of x with op (every rank gets it).
double world_reduce(const dist::ProcessGroups& pg, double x, dist::ReduceOp op) {
  Tensor t = Tensor::empty(Shape{1}, DType::f32);
  *t.ptr<float>() = float(x);
  pg.world->all_reduce(t, op);
  return *t.ptr<float>();
}

void check_layout(const dist::ParallelDims& dims) {
  SCOPED_TRACE(dt::testing::layout_name(dims));
  dist::ProcessGroups pg = dist::ProcessGroups::build(dims, dist::Backend::mpi);
  const int tp = dims.tp, tp_r = pg.coord.tp;
  const int dpcp = dims.dp * dims.cp, dpcp_r = pg.coord.cp + dims.cp * pg.coord.dp;

  std::vector<model::Param> params;
  std::vector<Tensor> want;  // this rank's shard of each global gradient
  double ref = 0;
  for (const model::ParamSpec& s : dt::testing::small_model_specs()) {
    ASSERT_EQ(model::check_splittable(s, tp), "");
    // The same global gradient on every rank (test_seed is broadcast, streams advance alike).
    Tensor G = dt::testing::randn_host(s.shape, 0.3f);
    for (double x : dt::testing::to_doubles(G)) ref += x * x;
    model::Param p = model::make_param(s, tp, tp_r, dt::testing::test_seed(), Device::cpu(), DType::f32);
    Tensor shard = Tensor::empty(model::local_shape(s, tp), DType::f32);
    model::shard_from_global(shard, G, s, tp, tp_r);
    // Split each element's value onto exactly one member of the reduction (dp x cp, and tp too
    // for grad_sum_tp), zero elsewhere: the sums in reduce_grads are then exact.
    const int members = s.grad_sum_tp ? dpcp * tp : dpcp;
    const int me = s.grad_sum_tp ? dpcp_r * tp + tp_r : dpcp_r;
    for (int64_t i = 0; i < shard.numel(); ++i)
      p.grad.ptr<float>()[i] = i % members == me ? shard.ptr<float>()[i] : 0.f;
    params.push_back(std::move(p));
    want.push_back(std::move(shard));
  }
  ref = std::sqrt(ref);
  std::vector<model::Param*> ptrs;
  for (auto& p : params) ptrs.push_back(&p);

  model::reduce_grads(ptrs, pg);
  for (size_t i = 0; i < params.size(); ++i)
    ASSERT_EQ(std::memcmp(params[i].grad.data(), want[i].data(), want[i].nbytes()), 0)
        << params[i].spec.name << ": reduce_grads did not give this rank's shard of the global gradient";

  const double norm = train::global_grad_norm(ptrs, pg);
  EXPECT_NEAR(norm, ref, 1e-5 * ref) << "serial norm " << ref;
  // Identical on every rank.
  EXPECT_EQ(world_reduce(pg, norm, dist::ReduceOp::max), float(norm));
  EXPECT_EQ(-world_reduce(pg, -norm, dist::ReduceOp::max), float(norm));

  // Clip to half the norm: the clipped gradients' global norm is the limit.
  const float coef = train::clip_coefficient(norm, 0.5 * ref);
  for (auto* p : ptrs) ops::scale(p->grad, coef);
  EXPECT_NEAR(train::global_grad_norm(ptrs, pg), 0.5 * ref, 1e-5 * ref);
}

}  // namespace

TEST(GlobalGradNorm, EqualsSerialNormInEveryLayout) {
  for (const dist::ParallelDims& d : dt::testing::layouts_for(dist::world_size())) check_layout(d);
}
