// Shared test helpers: fresh random inputs, error metrics, NaN poisoning.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "deltatron/core/tensor.h"
#include "deltatron/ops/basic.h"

namespace dt::testing {

// A seed that differs every run (fresh data each run, as the issues ask), printed so a
// failure can be replayed with DT_TEST_SEED=<n>.
uint64_t test_seed();

// Host tensor filled from a fresh uniform(lo, hi) stream.
Tensor rand_host(Shape s, float lo = -1.f, float hi = 1.f, DType dt = DType::f32);
Tensor randn_host(Shape s, float std = 1.f, DType dt = DType::f32);

// NaN-poisons a view (float dtypes), so that unwritten output elements fail the checks.
void poison(const TensorView& x, Stream s = {});

struct ErrStats {
  double rel_l2 = 0;     // ||a - b|| / ||b||
  double max_abs = 0;    // max |a - b|
  int64_t worst = -1;    // index of max |a - b|
  int64_t non_finite = 0;
  std::string str() const;
};
// Compares any-device float views (copied to host as f32).
ErrStats compare(const TensorView& got, const TensorView& ref);
ErrStats compare(const std::vector<double>& got, const std::vector<double>& ref);

// Asserts no NaN/Inf in `got`, then rel_l2 < tol; prints the worst element on failure.
::testing::AssertionResult close_rel(const TensorView& got, const TensorView& ref, double tol);
::testing::AssertionResult close_rel(const std::vector<double>& got, const std::vector<double>& ref, double tol);

// True when a CUDA device is usable in this process (false in CPU-only builds).
bool have_gpu();

}  // namespace dt::testing
