// Parallel layout: ParallelDims {tp, cp, dp} and the ProcessGroups built from it.
// Rank order: tp fastest, then cp, then dp:  rank = tp_r + tp * (cp_r + cp * dp_r).
// No globals: a ProcessGroups value is built once and passed explicitly.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "deltatron/dist/comm.h"

namespace dt::dist {

struct ParallelDims {
  int tp = 1;
  int cp = 1;
  int dp = -1;  // -1: inferred as world / (tp * cp)

  // Fills dp when inferred; returns "" when valid, else one line listing every factor, e.g.
  // "parallel: tp 4 x cp 2 x dp 2 = 16, but the world size is 8".
  std::string resolve(int world_size);
  int world() const { return tp * cp * dp; }
};

struct RankCoord {
  int tp, cp, dp;
};
RankCoord coord_of(const ParallelDims& d, int rank);
int rank_of(const ParallelDims& d, RankCoord c);

// Global ranks of each group that `rank` belongs to.
std::vector<int> tp_group_ranks(const ParallelDims& d, int rank);     // same (cp, dp)
std::vector<int> cp_group_ranks(const ParallelDims& d, int rank);     // same (tp, dp)
std::vector<int> dp_group_ranks(const ParallelDims& d, int rank);     // same (tp, cp)
std::vector<int> tp_cp_group_ranks(const ParallelDims& d, int rank);  // same dp
std::vector<int> dp_cp_group_ranks(const ParallelDims& d, int rank);  // same tp

struct ProcessGroups {
  ParallelDims dims;
  RankCoord coord{};
  std::unique_ptr<Communicator> world, tp, cp, dp, tp_cp, dp_cp;

  // dims must already be resolved against the world size.
  static ProcessGroups build(const ParallelDims& dims, Backend b);
};

// The rank -> (tp, cp, dp) table and every group, as docs/parallelism.md shows it.
std::string describe_layout(const ParallelDims& d);

}  // namespace dt::dist
