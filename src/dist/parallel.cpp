// ParallelDims validation, the rank <-> (tp, cp, dp) map, and ProcessGroups.
// One mixed-radix map, tp fastest: rank = tp_r + tp * (cp_r + cp * dp_r). Every group
// function and every split color below derives from it.
#include "deltatron/dist/parallel.h"

#include <cstdint>
#include <iterator>
#include <utility>

#include <fmt/ranges.h>

#include "deltatron/core/check.h"

namespace dt::dist {

std::string ParallelDims::resolve(int world_size) {
  for (auto [name, v] : {std::pair{"tp", tp}, std::pair{"cp", cp}})
    if (v < 1) return fmt::format("parallel: {} must be >= 1, got {}", name, v);
  if (dp != -1 && dp < 1) return fmt::format("parallel: dp must be >= 1 (or -1 to infer it), got {}", dp);
  if (world_size < 1) return fmt::format("parallel: the world size must be >= 1, got {}", world_size);
  const int64_t tc = int64_t(tp) * cp;
  if (dp == -1) {
    if (world_size % tc != 0)
      return fmt::format(
          "parallel: tp {} x cp {} = {} does not divide the world size {}, so dp (inferred as world / (tp*cp)) "
          "is not an integer ---> hint: launch a multiple of {} ranks, or change tp/cp",
          tp, cp, tc, world_size, tc);
    dp = int(world_size / tc);
    return "";
  }
  const int64_t prod = tc * dp;
  if (prod != world_size)
    return fmt::format(
        "parallel: tp {} x cp {} x dp {} = {}, but the world size is {} ---> hint: launch {} ranks, or set dp "
        "to -1 to infer it",
        tp, cp, dp, prod, world_size, prod);
  return "";
}

RankCoord coord_of(const ParallelDims& d, int rank) {
  DT_CHECK(d.tp >= 1 && d.cp >= 1 && d.dp >= 1, "coord_of: dims tp {} cp {} dp {} are not resolved", d.tp, d.cp,
           d.dp);
  DT_CHECK(rank >= 0 && rank < d.world(), "coord_of: rank {} is outside the world of {} ranks", rank, d.world());
  return {rank % d.tp, (rank / d.tp) % d.cp, rank / (d.tp * d.cp)};
}

int rank_of(const ParallelDims& d, RankCoord c) {
  DT_CHECK(c.tp >= 0 && c.tp < d.tp && c.cp >= 0 && c.cp < d.cp && c.dp >= 0 && c.dp < d.dp,
           "rank_of: coords (tp {}, cp {}, dp {}) are outside dims (tp {}, cp {}, dp {})", c.tp, c.cp, c.dp, d.tp,
           d.cp, d.dp);
  return c.tp + d.tp * (c.cp + d.cp * c.dp);
}

namespace {

// Ranks sharing `rank`'s coordinates except along the varying axes, in rank order (the
// first varying axis is the fastest, as in the global order).
std::vector<int> ranks_varying(const ParallelDims& d, int rank, bool vary_tp, bool vary_cp, bool vary_dp) {
  const RankCoord me = coord_of(d, rank);
  std::vector<int> out;
  for (int dp = 0; dp < d.dp; ++dp)
    for (int cp = 0; cp < d.cp; ++cp)
      for (int tp = 0; tp < d.tp; ++tp) {
        if ((!vary_tp && tp != me.tp) || (!vary_cp && cp != me.cp) || (!vary_dp && dp != me.dp)) continue;
        out.push_back(rank_of(d, {tp, cp, dp}));
      }
  return out;
}

struct GroupKind {
  const char* name;
  bool tp, cp, dp;  // which axes vary inside one group
};
constexpr GroupKind kGroups[] = {
    {"tp", true, false, false},  {"cp", false, true, false},   {"dp", false, false, true},
    {"tp_cp", true, true, false}, {"dp_cp", false, true, true},
};

// MPI_Comm_split arguments for one group kind: color = index of the group (the fixed
// coordinates, mixed radix), key = position inside it (the varying ones, tp fastest).
std::pair<int, int> color_key(const ParallelDims& d, const RankCoord& c, const GroupKind& g) {
  int color = 0, key = 0, cstride = 1, kstride = 1;
  auto axis = [&](bool varies, int coord, int extent) {
    if (varies) {
      key += coord * kstride;
      kstride *= extent;
    } else {
      color += coord * cstride;
      cstride *= extent;
    }
  };
  axis(g.tp, c.tp, d.tp);
  axis(g.cp, c.cp, d.cp);
  axis(g.dp, c.dp, d.dp);
  return {color, key};
}

}  // namespace

std::vector<int> tp_group_ranks(const ParallelDims& d, int rank) { return ranks_varying(d, rank, true, false, false); }
std::vector<int> cp_group_ranks(const ParallelDims& d, int rank) { return ranks_varying(d, rank, false, true, false); }
std::vector<int> dp_group_ranks(const ParallelDims& d, int rank) { return ranks_varying(d, rank, false, false, true); }
std::vector<int> tp_cp_group_ranks(const ParallelDims& d, int rank) {
  return ranks_varying(d, rank, true, true, false);
}
std::vector<int> dp_cp_group_ranks(const ParallelDims& d, int rank) {
  return ranks_varying(d, rank, false, true, true);
}

ProcessGroups ProcessGroups::build(const ParallelDims& dims, Backend b) {
  DT_CHECK(initialized(), "ProcessGroups::build: call dist::init() first");
  DT_CHECK(dims.tp >= 1 && dims.cp >= 1 && dims.dp >= 1 && dims.world() == world_size(),
           "ProcessGroups::build: dims tp {} x cp {} x dp {} are not resolved against the world size {}; call "
           "ParallelDims::resolve first",
           dims.tp, dims.cp, dims.dp, world_size());
  ProcessGroups g;
  g.dims = dims;
  const int rank = world_rank();
  g.coord = coord_of(dims, rank);
  g.world = make_world(b);
  // Every rank creates the groups in this same order (NCCL inits block until the group joins).
  std::unique_ptr<Communicator>* slots[] = {&g.tp, &g.cp, &g.dp, &g.tp_cp, &g.dp_cp};
  for (size_t i = 0; i < std::size(kGroups); ++i) {
    auto [color, key] = color_key(dims, g.coord, kGroups[i]);
    *slots[i] = split(b, color, key);
    const std::vector<int> want = ranks_varying(dims, rank, kGroups[i].tp, kGroups[i].cp, kGroups[i].dp);
    DT_CHECK((*slots[i])->members() == want, "ProcessGroups::build: {} group of rank {} has members {}, expected {}",
             kGroups[i].name, rank, fmt::join((*slots[i])->members(), ","), fmt::join(want, ","));
  }
  return g;
}

std::string describe_layout(const ParallelDims& d) {
  DT_CHECK(d.tp >= 1 && d.cp >= 1 && d.dp >= 1, "describe_layout: dims tp {} cp {} dp {} are not resolved", d.tp,
           d.cp, d.dp);
  std::string s = fmt::format("layout: tp {} x cp {} x dp {} = {} ranks; rank = tp + {}*(cp + {}*dp)\n\n", d.tp, d.cp,
                              d.dp, d.world(), d.tp, d.cp);
  s += "rank | tp | cp | dp\n";
  for (int r = 0; r < d.world(); ++r) {
    RankCoord c = coord_of(d, r);
    s += fmt::format("{:>4} | {:>2} | {:>2} | {:>2}\n", r, c.tp, c.cp, c.dp);
  }
  for (const GroupKind& g : kGroups) {
    std::string groups;
    int count = 0;
    size_t per = 0;
    for (int r = 0; r < d.world(); ++r) {
      std::vector<int> m = ranks_varying(d, r, g.tp, g.cp, g.dp);
      if (m.front() != r) continue;  // list each group once, from its lowest rank
      groups += fmt::format(" [{}]", fmt::join(m, ", "));
      per = m.size();
      ++count;
    }
    s += fmt::format("\n{:<5} groups ({} of {} ranks):{}", g.name, count, per, groups);
  }
  s += "\n";
  return s;
}

}  // namespace dt::dist
