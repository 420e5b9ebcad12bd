// Every collective of the CUDA backend (dist::cuda_backend(): NCCL, or the staged backend with
// DT_COMM_STAGED=1, the _shared entries where ranks share one GPU; CUDA tensors, a non-default
// stream) on every group of every layout exercised at this world size (1, 2 and 4 ranks in
// tests/dist/CMakeLists.txt), for f32, bf16, f16, i32 and i64, checked exactly. Exits 77 (skipped) without a GPU (the
// shared test main); it also compiles in a CPU-only build, where it always skips.
#if DELTATRON_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "deltatron/core/check.h"
#include "deltatron/dist/comm.h"
#include "deltatron/dist/parallel.h"
#include "dist_test_util.h"

namespace dt::testing {
namespace {

constexpr int64_t kCounts[] = {1, 37, 300};

class NcclCollectives : public ::testing::Test {
 protected:
  void SetUp() override {
    if (process_info().gpu < 0) dist::select_cuda_device();
#if DELTATRON_HAVE_CUDA
    // A non-default stream: the collectives must be ordered on the stream they are given.
    cudaStream_t st = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    stream_ = st;
#endif
    where_ = Where{Device::cuda(process_info().gpu), Stream{stream_}};
  }
  void TearDown() override {
#if DELTATRON_HAVE_CUDA
    if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
#endif
  }
  void* stream_ = nullptr;
  Where where_;
};

TEST_F(NcclCollectives, EveryGroupEveryDtype) {
  for (const dist::ParallelDims& dims : layouts_for(dist::world_size())) {
    dist::ProcessGroups pg = dist::ProcessGroups::build(dims, dist::cuda_backend());
    for (auto [name, comm] : all_groups(pg)) {
      ASSERT_EQ(comm->backend(), dist::cuda_backend());
      for (DType t : kCollectiveDtypes)
        for (int64_t n : kCounts) check_collectives(*comm, t, n, where_, layout_name(dims) + " " + name);
    }
  }
}

TEST_F(NcclCollectives, EmptyTensorsAreNoOps) {
  std::unique_ptr<dist::Communicator> w = dist::make_world(dist::cuda_backend());
  Tensor x = Tensor::empty(Shape{0}, DType::f32, where_.device), big = Tensor::empty(Shape{0}, DType::f32, where_.device);
  w->all_reduce(x, dist::ReduceOp::sum, where_.stream);
  w->all_gather(big, x, where_.stream);
  w->reduce_scatter(x, big, dist::ReduceOp::max, where_.stream);
  w->all_to_all(big, x, where_.stream);
  w->broadcast(x, 0, where_.stream);
  w->barrier(where_.stream);
}

}  // namespace
}  // namespace dt::testing
