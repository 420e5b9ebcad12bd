// cp2hp / hp2cp on the CPU (MPI backend): the suite of tests/data/cp_a2a_checks.h on every
// layout exercised at this world size. tests/data/CMakeLists.txt runs it under mpirun with
// 2 and 4 ranks (cp 2 and 4, tp 1 and 2, dp 2); the single-process entry covers cp = 1.
// Plus argument checks of the ops that need no communication partner.
#include "data/cp_a2a_checks.h"

namespace dt::testing {
namespace {

TEST(CpA2aCpu, EveryLayoutPackDtypeAndImpl) { cpa2a::run_suite(dist::Backend::mpi, Where{}); }

TEST(CpA2aCpu, HeadPermOfTheSpecExample) {
  // Qwen3.5-35B-A3B at tp = 1, cp = 2 (section 4.2): rank 0 receives q[0:1024], k[2048:3072],
  // v[4096:6144], z[8192:10240], b[12288:12304], a[12320:12336].
  const std::vector<int64_t> S = {2048, 2048, 4096, 4096, 32, 32};
  const std::vector<int32_t> perm = ops::cp_head_perm(S, 2);
  ASSERT_EQ(perm.size(), 12352u);
  std::vector<int32_t> want;
  for (auto [lo, hi] : {std::pair{0, 1024}, {2048, 3072}, {4096, 6144}, {8192, 10240}, {12288, 12304}, {12320, 12336}})
    for (int32_t c = lo; c < hi; ++c) want.push_back(c);
  for (auto [lo, hi] : {std::pair{1024, 2048}, {3072, 4096}, {6144, 8192}, {10240, 12288}, {12304, 12320}, {12336, 12352}})
    for (int32_t c = lo; c < hi; ++c) want.push_back(c);
  EXPECT_EQ(perm, want);
  // Runs of gcd(1024, 1024, 2048, 2048, 16, 16) = 16 columns move together.
  const ops::CpHeadLayout h(S, 2);
  EXPECT_EQ(h.group(), 16);
  EXPECT_EQ(h.perm_grouped().numel(), 12352 / 16);
}

TEST(CpA2aCpu, HeadPermIsABijectionAndIdentityAtCp1) {
  for (int cp : {1, 2, 3, 4, 8}) {
    const std::vector<int64_t> S = {4L * cp, 0, 2L * cp, 6L * cp, cp};
    const ops::CpHeadLayout h(S, cp);
    const int64_t C = h.width();
    ASSERT_EQ(C, 13L * cp);
    std::vector<int> seen(size_t(C), 0);
    for (int64_t m = 0; m < C; ++m) {
      ASSERT_GE(h.perm_host()[m], 0);
      ASSERT_LT(h.perm_host()[m], C);
      ++seen[size_t(h.perm_host()[m])];
      EXPECT_EQ(h.inv_host()[size_t(h.perm_host()[m])], m);
    }
    for (int v : seen) EXPECT_EQ(v, 1);
    // The grouped maps describe the same permutation in runs of g columns.
    const int64_t g = h.group();
    ASSERT_EQ(g, 1);  // gcd(4, 0, 2, 6, 1)
    const ops::CpHeadLayout h2({4L * cp, 8L * cp, 0}, cp);
    ASSERT_EQ(h2.group(), 4);
    for (int64_t m = 0; m < h2.width(); ++m) {
      EXPECT_EQ(h2.perm_host()[m], h2.perm_grouped().ptr<int32_t>()[m / 4] * 4 + m % 4);
      EXPECT_EQ(h2.inv_host()[m], h2.inv_grouped().ptr<int32_t>()[m / 4] * 4 + m % 4);
    }
    if (cp == 1)
      for (int64_t m = 0; m < C; ++m) EXPECT_EQ(h.perm_host()[m], m);
    // Block r holds the r-th 1/cp slice of each section, in section order.
    for (int r = 0; r < cp; ++r) {
      int64_t m = r * (C / cp), O = 0;
      for (int64_t s : S) {
        for (int64_t j = 0; j < s / cp; ++j, ++m) EXPECT_EQ(h.perm_host()[m], O + r * (s / cp) + j) << "cp " << cp;
        O += s;
      }
    }
  }
}

TEST(CpA2aCpuDeathTest, SectionNotDivisibleByCp) {
  // A death test re-executes the binary, which cannot rejoin a running MPI job: the
  // single-process CTest entry runs it.
  if (dist::world_size() > 1) GTEST_SKIP() << "single-process only";
  const std::vector<int64_t> S = {8, 6, 8};
  EXPECT_DEATH(ops::cp_head_perm(S, 4), "section 1 has width 6, not a non-negative multiple of cp=4");
}

}  // namespace
}  // namespace dt::testing
