// Shared by the trainer tests: a synthetic corpus written once per test process (by rank 0, named
// by its pid so concurrent jobs on one machine never share files) and removed at exit.
#pragma once
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "deltatron/data/synthetic.h"
#include "deltatron/dist/comm.h"
#include "test_util.h"

namespace dt::testing {

// The prefix of a corpus of `docs` documents (seed 99, vocab 64) named `name`_<pid of rank 0>.
inline std::string trainer_corpus(const char* name, int64_t docs) {
  auto world = dist::make_world(dist::Backend::mpi);
  Tensor pid = Tensor::empty(Shape{1}, DType::i64);
  *pid.ptr<int64_t>() = int64_t(getpid());
  world->broadcast(pid, 0);
  std::string p = ::testing::TempDir() + fmt::format("{}_{}", name, *pid.ptr<int64_t>());
  if (world->rank() == 0) {
    static std::string written;  // removed at exit
    written = p;
    std::atexit([] {
      std::remove((written + ".bin").c_str());
      std::remove((written + ".idx").c_str());
    });
    std::string e = data::write_synthetic_corpus(p, docs, 99, 64);
    EXPECT_EQ(e, "");
  }
  world->barrier();
  return p;
}

}  // namespace dt::testing
