// ParallelDims validation, the rank <-> (tp, cp, dp) map, group membership, and the
// ProcessGroups actually built (run with 1, 2, 4 and 8 ranks by tests/dist/CMakeLists.txt).
#include <fstream>
#include <set>
#include <sstream>

#include "deltatron/dist/comm.h"
#include "deltatron/dist/parallel.h"
#include "dist_test_util.h"

namespace dt::testing {
namespace {

using dist::ParallelDims;
using V = std::vector<int>;

TEST(ParallelDims, InfersDp) {
  ParallelDims d{2, 2, -1};
  EXPECT_EQ(d.resolve(8), "");
  EXPECT_EQ(d.dp, 2);
  ParallelDims e{1, 1, -1};
  EXPECT_EQ(e.resolve(1), "");
  EXPECT_EQ(e.dp, 1);
}

TEST(ParallelDims, MessagesListEveryFactor) {
  ParallelDims a{4, 1, 1};
  EXPECT_EQ(a.resolve(2),
            "parallel: tp 4 x cp 1 x dp 1 = 4, but the world size is 2 ---> hint: launch 4 ranks, or set dp to -1 to "
            "infer it");
  ParallelDims b{4, 2, 2};
  EXPECT_NE(b.resolve(8).find("tp 4 x cp 2 x dp 2 = 16, but the world size is 8"), std::string::npos);
  ParallelDims c{4, 1, -1};
  EXPECT_NE(c.resolve(6).find("tp 4 x cp 1 = 4 does not divide the world size 6"), std::string::npos);
  EXPECT_EQ(c.dp, -1);  // untouched on failure
  ParallelDims z{0, 1, -1};
  EXPECT_EQ(z.resolve(2), "parallel: tp must be >= 1, got 0");
  ParallelDims n{1, -2, -1};
  EXPECT_EQ(n.resolve(2), "parallel: cp must be >= 1, got -2");
  ParallelDims q{1, 1, 0};
  EXPECT_EQ(q.resolve(2), "parallel: dp must be >= 1 (or -1 to infer it), got 0");
}

TEST(ParallelDims, CoordsRoundTripTpFastest) {
  for (ParallelDims d : {ParallelDims{2, 2, 2}, ParallelDims{4, 1, 2}, ParallelDims{1, 4, 2}, ParallelDims{2, 1, 4},
                         ParallelDims{3, 5, 2}}) {
    for (int r = 0; r < d.world(); ++r) {
      dist::RankCoord c = dist::coord_of(d, r);
      EXPECT_EQ(r, c.tp + d.tp * (c.cp + d.cp * c.dp));
      EXPECT_EQ(dist::rank_of(d, c), r);
    }
  }
  dist::RankCoord c = dist::coord_of({2, 2, 2}, 5);  // 5 = 1 + 2*(0 + 2*1)
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.cp, 0);
  EXPECT_EQ(c.dp, 1);
}

TEST(ParallelDims, Groups222) {
  const ParallelDims d{2, 2, 2};
  EXPECT_EQ(dist::tp_group_ranks(d, 5), (V{4, 5}));
  EXPECT_EQ(dist::cp_group_ranks(d, 5), (V{5, 7}));
  EXPECT_EQ(dist::dp_group_ranks(d, 5), (V{1, 5}));
  EXPECT_EQ(dist::tp_cp_group_ranks(d, 5), (V{4, 5, 6, 7}));
  EXPECT_EQ(dist::dp_cp_group_ranks(d, 5), (V{1, 3, 5, 7}));
  EXPECT_EQ(dist::cp_group_ranks(d, 2), (V{0, 2}));
  EXPECT_EQ(dist::dp_cp_group_ranks(d, 2), (V{0, 2, 4, 6}));
}

TEST(ParallelDims, GroupsOtherLayouts) {
  EXPECT_EQ(dist::tp_group_ranks({4, 1, 2}, 6), (V{4, 5, 6, 7}));
  EXPECT_EQ(dist::dp_group_ranks({4, 1, 2}, 6), (V{2, 6}));
  EXPECT_EQ(dist::cp_group_ranks({4, 1, 2}, 6), (V{6}));
  EXPECT_EQ(dist::cp_group_ranks({1, 4, 2}, 6), (V{4, 5, 6, 7}));
  EXPECT_EQ(dist::dp_cp_group_ranks({1, 4, 2}, 6), (V{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(dist::tp_group_ranks({1, 4, 2}, 6), (V{6}));
  EXPECT_EQ(dist::dp_group_ranks({2, 1, 4}, 3), (V{1, 3, 5, 7}));
  EXPECT_EQ(dist::tp_cp_group_ranks({2, 1, 4}, 3), (V{2, 3}));
  EXPECT_EQ(dist::dp_cp_group_ranks({2, 1, 4}, 3), (V{1, 3, 5, 7}));
}

// Each group kind partitions the world; sizes and coordinates follow from the dims.
TEST(ParallelDims, GroupsPartitionTheWorld) {
  for (int world : {1, 2, 4, 8}) {
    for (const ParallelDims& d : layouts_for(world)) {
      SCOPED_TRACE(layout_name(d));
      struct Kind {
        std::vector<int> (*f)(const ParallelDims&, int);
        int size;
      };
      for (Kind k : {Kind{dist::tp_group_ranks, d.tp}, Kind{dist::cp_group_ranks, d.cp},
                     Kind{dist::dp_group_ranks, d.dp}, Kind{dist::tp_cp_group_ranks, d.tp * d.cp},
                     Kind{dist::dp_cp_group_ranks, d.cp * d.dp}}) {
        std::set<int> covered;
        for (int r = 0; r < d.world(); ++r) {
          V g = k.f(d, r);
          ASSERT_EQ(int(g.size()), k.size);
          EXPECT_TRUE(std::is_sorted(g.begin(), g.end()));
          EXPECT_NE(std::find(g.begin(), g.end(), r), g.end());
          for (int q : g) EXPECT_EQ(k.f(d, q), g);  // every member agrees on the group
          covered.insert(g.begin(), g.end());
        }
        EXPECT_EQ(int(covered.size()), d.world());
      }
    }
  }
}

TEST(ParallelDims, DescribeLayoutIsInTheDocs) {
  const std::string text = dist::describe_layout({2, 2, 2});
  EXPECT_NE(text.find("   5 |  1 |  0 |  1"), std::string::npos) << text;
  EXPECT_NE(text.find("dp_cp groups (2 of 4 ranks): [0, 2, 4, 6] [1, 3, 5, 7]"), std::string::npos) << text;
  std::ifstream f(std::string(DT_SOURCE_DIR) + "/docs/parallelism.md");
  ASSERT_TRUE(f.good()) << "docs/parallelism.md not found under " << DT_SOURCE_DIR;
  std::stringstream doc;
  doc << f.rdbuf();
  EXPECT_NE(doc.str().find(text), std::string::npos)
      << "docs/parallelism.md is out of date; regenerate its table with `layout_probe --tp 2 --cp 2 --dp 2 "
         "--dry-run`:\n"
      << text;
}

// The groups actually built: coordinates, members, and that traffic reaches exactly them.
TEST(ProcessGroups, MembershipEveryLayout) {
  const int world = dist::world_size(), me = dist::world_rank();
  for (const ParallelDims& dims : layouts_for(world)) {
    SCOPED_TRACE(layout_name(dims));
    dist::ProcessGroups pg = dist::ProcessGroups::build(dims, dist::Backend::mpi);
    dist::RankCoord c = dist::coord_of(dims, me);
    EXPECT_EQ(pg.coord.tp, c.tp);
    EXPECT_EQ(pg.coord.cp, c.cp);
    EXPECT_EQ(pg.coord.dp, c.dp);
    EXPECT_EQ(pg.dims.world(), world);
    const std::pair<dist::Communicator*, V> want[] = {
        {pg.world.get(), [&] { V all(world); for (int r = 0; r < world; ++r) all[r] = r; return all; }()},
        {pg.tp.get(), dist::tp_group_ranks(dims, me)},
        {pg.cp.get(), dist::cp_group_ranks(dims, me)},
        {pg.dp.get(), dist::dp_group_ranks(dims, me)},
        {pg.tp_cp.get(), dist::tp_cp_group_ranks(dims, me)},
        {pg.dp_cp.get(), dist::dp_cp_group_ranks(dims, me)},
    };
    for (const auto& [comm, members] : want) {
      EXPECT_EQ(comm->members(), members);
      EXPECT_EQ(comm->size(), int(members.size()));
      EXPECT_EQ(members[comm->rank()], me);
      // Who really answers: gather every member's world rank over the group itself.
      Tensor mine = Tensor::empty(Shape{1}, DType::i32);
      mine.ptr<int32_t>()[0] = me;
      Tensor got = Tensor::empty(Shape{int64_t(members.size())}, DType::i32);
      comm->all_gather(got, mine);
      EXPECT_EQ(V(got.ptr<int32_t>(), got.ptr<int32_t>() + got.numel()), members);
    }
    // Coordinates along each axis are the group ranks of the matching group.
    EXPECT_EQ(pg.tp->rank(), c.tp);
    EXPECT_EQ(pg.cp->rank(), c.cp);
    EXPECT_EQ(pg.dp->rank(), c.dp);
    EXPECT_EQ(pg.tp_cp->rank(), c.tp + dims.tp * c.cp);
    EXPECT_EQ(pg.dp_cp->rank(), c.cp + dims.cp * c.dp);
  }
}

TEST(ProcessGroups, ResolveAgainstTheRealWorld) {
  ParallelDims d{1, 1, -1};
  EXPECT_EQ(d.resolve(dist::world_size()), "");
  EXPECT_EQ(d.dp, dist::world_size());
  ParallelDims too_big{dist::world_size() + 1, 1, -1};
  EXPECT_NE(too_big.resolve(dist::world_size()), "");
}

}  // namespace
}  // namespace dt::testing
