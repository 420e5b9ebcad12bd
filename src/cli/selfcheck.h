#pragma once
#include <string>

namespace dt::cli {
struct SelfcheckOptions {
  int tp = 1, cp = 1, dp = -1;
  std::string backend = "mpi";
  std::string dtype = "f32";
};
int print_env();
// Builds ProcessGroups for the layout and checks all_reduce (sum, max), all_gather,
// reduce_scatter, all_to_all and broadcast on every group with exactly checkable data.
// Returns 0 when every element is right; prints the count of wrong elements otherwise.
int selfcheck(const SelfcheckOptions& o);
}  // namespace dt::cli
