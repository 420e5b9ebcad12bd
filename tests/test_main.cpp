// Shared GoogleTest main: starts MPI through dist::init (so the same binary runs alone or
// under mpirun) and, for *_cuda tests (DT_TEST_NEEDS_GPU), exits 77 -- reported by CTest as
// skipped, never as passed -- when no CUDA device is usable.
#include <gtest/gtest.h>

#include <cstdio>

#include "deltatron/dist/comm.h"
#include "test_util.h"

namespace {
// Ranks other than 0 print only their failures, prefixed with the rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] FAILED at %s:%d\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.summary());
  }

 private:
  int rank_;
};
}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // Death tests re-execute the binary instead of forking a process that holds MPI state.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  dt::dist::init(&argc, &argv);
#ifdef DT_TEST_NEEDS_GPU
  if (!dt::testing::have_gpu()) {
    std::printf("SKIPPED: no CUDA device (this test needs a GPU)\n");
    dt::dist::finalize();
    return 77;
  }
#endif
  // Only rank 0 reports through the default printer; other ranks still fail the run.
  if (dt::dist::world_rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(dt::dist::world_rank()));
  }
  int rc = RUN_ALL_TESTS();
  dt::dist::finalize();
  return rc;
}
