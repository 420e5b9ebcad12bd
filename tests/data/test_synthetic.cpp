// Synthetic corpus (include/deltatron/data/synthetic.h): deterministic for a seed, different
// for another, order-independent; every document has the stated copy / sort / add structure;
// the written indexed dataset holds exactly the generated documents.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "deltatron/data/indexed_dataset.h"
#include "deltatron/data/synthetic.h"
#include "test_util.h"

namespace dt::data {
namespace {

TEST(Synthetic, DeterministicAndOrderIndependent) {
  SyntheticConfig c;
  c.num_docs = 200;
  c.seed = dt::testing::test_seed();
  SyntheticConfig big = c;
  big.num_docs = 1000;
  SyntheticConfig other = c;
  other.seed = c.seed + 1;
  int differ = 0;
  for (int64_t d = 0; d < c.num_docs; ++d) {
    const std::vector<int32_t> a = synthetic_document(c, d);
    EXPECT_EQ(a, synthetic_document(c, d));
    EXPECT_EQ(a, synthetic_document(big, d)) << "document " << d << " depends on num_docs";
    differ += a != synthetic_document(other, d);
  }
  EXPECT_GT(differ, 190);
}

TEST(Synthetic, DocumentsHaveTheStatedStructure) {
  for (int64_t V : {10, 32, 300}) {
    SyntheticConfig c;
    c.num_docs = 600;
    c.vocab_size = V;
    c.min_len = 1;
    c.max_len = 20;
    c.seed = dt::testing::test_seed();
    std::set<int32_t> tasks;
    std::set<size_t> lengths;
    for (int64_t d = 0; d < c.num_docs; ++d) {
      const std::vector<int32_t> doc = synthetic_document(c, d);
      ASSERT_EQ(check_synthetic_document(doc, V), "") << "V=" << V << " document " << d;
      for (int32_t t : doc) ASSERT_TRUE(t >= 1 && t < V) << t;
      tasks.insert(doc[1]);
      lengths.insert(doc.size());
      if (doc[1] == synth::kCopy) {  // BOS COPY x SEP x EOS with n in [1, 20]
        const size_t n = (doc.size() - 4) / 2;
        EXPECT_TRUE(n >= 1 && n <= 20 && doc.size() == 2 * n + 4);
      }
    }
    EXPECT_EQ(tasks, (std::set<int32_t>{synth::kCopy, synth::kSort, synth::kAdd}));
    EXPECT_GT(lengths.size(), 15u) << "lengths should vary";
  }
  // Worked examples in base 2 (V = 10: symbols 8, 9 are the digits 0, 1).
  using V = std::vector<int32_t>;
  EXPECT_EQ(check_synthetic_document(V{1, 4, 8, 9, 9, 3, 8, 9, 9, 2}, 10), "");  // copy 011
  EXPECT_EQ(check_synthetic_document(V{1, 5, 9, 8, 9, 3, 8, 9, 9, 2}, 10), "");  // sort 101 -> 011
  EXPECT_EQ(check_synthetic_document(V{1, 6, 9, 9, 7, 9, 3, 8, 8, 9, 2}, 10), "");  // 3 + 1 = 4 (LSD first)
  EXPECT_NE(check_synthetic_document(V{1, 6, 9, 9, 7, 9, 3, 8, 9, 2}, 10), "");     // wrong sum
  EXPECT_NE(check_synthetic_document(V{1, 4, 8, 9, 3, 9, 8, 2}, 10), "");           // not a copy
  EXPECT_NE(check_synthetic_document(V{1, 5, 9, 8, 3, 9, 8, 2}, 10), "");           // not sorted
  EXPECT_NE(check_synthetic_document(V{1, 7, 8, 3, 8, 2}, 10), "");                 // no task token
}

TEST(Synthetic, WrittenCorpusReadsBack) {
  const std::string dir = ::testing::TempDir() + "dt_synth_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::string prefix = dir + "/corpus";
  ASSERT_EQ(write_synthetic_corpus(prefix, 300, 7, 32), "");
  IndexedDataset ds;
  ASSERT_EQ(IndexedDataset::open(prefix, &ds), "");
  EXPECT_EQ(ds.dtype(), TokenDType::u16);
  ASSERT_EQ(ds.num_documents(), 300);
  SyntheticConfig c;
  c.num_docs = 300;
  c.seed = 7;
  c.vocab_size = 32;
  for (int64_t d = 0; d < 300; ++d) EXPECT_EQ(ds.document(d), synthetic_document(c, d));
  // Same seed, same bytes.
  ASSERT_EQ(write_synthetic_corpus(prefix + "2", 300, 7, 32), "");
  for (const char* ext : {".bin", ".idx"})
    EXPECT_EQ(std::filesystem::file_size(prefix + ext), std::filesystem::file_size(prefix + "2" + ext));
}

TEST(Synthetic, ConfigErrorsNameTheField) {
  SyntheticConfig c;
  c.vocab_size = 9;
  EXPECT_NE(validate_synthetic_config(c).find("vocab_size=9 must be in [10"), std::string::npos);
  c = {};
  c.min_len = 5;
  c.max_len = 3;
  EXPECT_NE(validate_synthetic_config(c).find("min_len=5 max_len=3"), std::string::npos);
  c = {};
  c.tasks = 0;
  EXPECT_NE(validate_synthetic_config(c).find("tasks=0x0 must be"), std::string::npos);
  // The prefix's directory is made as needed; under a regular file it cannot be (even as root).
  const std::string file = ::testing::TempDir() + "synthetic_not_a_dir";
  std::ofstream(file) << "a file";
  EXPECT_NE(write_synthetic_corpus(file + "/sub/x", 3, 1, 32)
                .find("indexed dataset writer: cannot create directory " + file + "/sub"),
            std::string::npos);
  const std::string made = ::testing::TempDir() + "synthetic_new_dir/sub";
  std::filesystem::remove_all(::testing::TempDir() + "synthetic_new_dir");
  EXPECT_EQ(write_synthetic_corpus(made + "/x", 3, 1, 32), "");
  EXPECT_TRUE(std::filesystem::exists(made + "/x.idx"));
}

}  // namespace
}  // namespace dt::data
