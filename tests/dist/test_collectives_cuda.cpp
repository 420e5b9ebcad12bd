// Every collective of the NCCL backend (CUDA tensors, a non-default stream) on every group
// of every layout exercised at this world size (1 and 2 GPUs in tests/dist/CMakeLists.txt),
// for f32, bf16, f16, i32 and i64, checked exactly. Exits 77 (skipped) without a GPU (the
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
    // A non-default stream: NCCL work must be ordered on the stream it is given.
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
    dist::ProcessGroups pg = dist::ProcessGroups::build(dims, dist::Backend::nccl);
    for (auto [name, comm] : all_groups(pg)) {
      ASSERT_EQ(comm->backend(), dist::Backend::nccl);
      for (DType t : kCollectiveDtypes)
        for (int64_t n : kCounts) check_collectives(*comm, t, n, where_, layout_name(dims) + " " + name);
    }
  }
}

}  // namespace
}  // namespace dt::testing
