// Every collective of the MPI backend on every group of every layout exercised at this world
// size (tests/dist/CMakeLists.txt runs it with 1, 2, 4 and 8 ranks), for f32, bf16, f16,
// i32 and i64, checked exactly.
#include <cstdlib>
#include <optional>
#include <string>

#include "deltatron/dist/comm.h"
#include "deltatron/dist/parallel.h"
#include "dist_test_util.h"

namespace dt::testing {
namespace {

// Odd sizes, so that block boundaries never align by accident.
constexpr int64_t kCounts[] = {1, 37, 300};

TEST(MpiCollectives, EveryGroupEveryDtype) {
  for (const dist::ParallelDims& dims : layouts_for(dist::world_size())) {
    dist::ProcessGroups pg = dist::ProcessGroups::build(dims, dist::Backend::mpi);
    for (auto [name, comm] : all_groups(pg)) {
      ASSERT_EQ(comm->backend(), dist::Backend::mpi);
      for (DType t : kCollectiveDtypes)
        for (int64_t n : kCounts) check_collectives(*comm, t, n, Where{}, layout_name(dims) + " " + name);
    }
  }
}

TEST(MpiCollectives, EmptyTensorsAreNoOps) {
  std::unique_ptr<dist::Communicator> w = dist::make_world(dist::Backend::mpi);
  Tensor x = Tensor::empty(Shape{0}, DType::f32);
  Tensor big = Tensor::empty(Shape{0}, DType::f32);
  w->all_reduce(x, dist::ReduceOp::sum);
  w->all_gather(big, x);
  w->reduce_scatter(x, big, dist::ReduceOp::max);
  w->all_to_all(big, x);
  w->broadcast(x, 0);
  w->barrier();
}

TEST(MpiCollectives, MembersAreGroupOrderedWorldRanks) {
  // split with reversed keys: group rank order follows the key, not the world rank.
  const int world = dist::world_size(), me = dist::world_rank();
  std::unique_ptr<dist::Communicator> c = dist::split(dist::Backend::mpi, me % 2, world - me);
  std::vector<int> want;
  for (int r = world - 1; r >= 0; --r)
    if (r % 2 == me % 2) want.push_back(r);
  EXPECT_EQ(c->members(), want);
  EXPECT_EQ(c->members()[c->rank()], me);
  EXPECT_EQ(c->size(), int(want.size()));
  check_collectives(*c, DType::bf16, 5, Where{}, "reversed split");
}

// The backend for CUDA tensors follows DT_COMM_STAGED, read at every call (the _shared ctest
// entries set it; tests/dist/test_collectives_cuda.cpp checks the staged collectives on a GPU).
TEST(CudaBackend, FollowsDtCommStaged) {
  const char* was = std::getenv("DT_COMM_STAGED");
  const std::optional<std::string> saved = was ? std::optional<std::string>(was) : std::nullopt;
  unsetenv("DT_COMM_STAGED");
  EXPECT_EQ(dist::cuda_backend(), dist::Backend::nccl);
  setenv("DT_COMM_STAGED", "", 1);
  EXPECT_EQ(dist::cuda_backend(), dist::Backend::nccl);
  setenv("DT_COMM_STAGED", "1", 1);
  EXPECT_EQ(dist::cuda_backend(), dist::Backend::staged);
  setenv("DT_COMM_STAGED", "0", 1);
  EXPECT_EQ(dist::cuda_backend(), dist::Backend::nccl);
  if (saved) setenv("DT_COMM_STAGED", saved->c_str(), 1);
  else unsetenv("DT_COMM_STAGED");
  EXPECT_STREQ(dist::backend_name(dist::Backend::staged), "staged");
}

TEST(CudaBackend, NamesRoundTrip) {  // what selfcheck's and layout_probe's --backend parse
  for (dist::Backend b : {dist::Backend::mpi, dist::Backend::nccl, dist::Backend::staged})
    EXPECT_EQ(dist::backend_from_name(dist::backend_name(b)), b);
  EXPECT_EQ(dist::backend_from_name("gloo"), std::nullopt);
  EXPECT_EQ(dist::backend_from_name(""), std::nullopt);
}

}  // namespace
}  // namespace dt::testing
