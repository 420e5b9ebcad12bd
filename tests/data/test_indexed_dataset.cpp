// Indexed datasets (include/deltatron/data/indexed_dataset.h):
//   * write -> read round trip for every Megatron dtype code, multi-sequence and empty documents;
//   * a .bin/.idx pair written byte by byte here (independent of the writer) reads correctly;
//   * every corruption class gives its message naming the file, the field and the values;
//   * the plain token + offsets format round-trips and reports its own errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "deltatron/data/indexed_dataset.h"
#include "test_util.h"

namespace dt::data {
namespace {

std::string tmp_prefix(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "dt_idx_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  return dir + "/" + name;
}

std::vector<char> slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void spit(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

template <typename T>
void put(std::vector<char>* b, T v) {
  const char* p = reinterpret_cast<const char*>(&v);
  b->insert(b->end(), p, p + sizeof(T));
}

template <typename T>
void poke(std::vector<char>* b, size_t off, T v) {
  std::memcpy(b->data() + off, &v, sizeof(T));
}

::testing::AssertionResult has_all(const std::string& err, std::initializer_list<const char*> parts) {
  if (err.empty()) return ::testing::AssertionFailure() << "expected an error, got success";
  for (const char* p : parts)
    if (err.find(p) == std::string::npos) return ::testing::AssertionFailure() << "'" << p << "' not in: " << err;
  return ::testing::AssertionSuccess() << err;
}

// Documents of a few sequences each (some empty), values in [0, vmax].
struct Corpus {
  std::vector<std::vector<std::vector<int64_t>>> docs;  // doc -> sequences -> tokens
};

Corpus random_corpus(uint64_t seed, int64_t vmax) {
  std::mt19937_64 g(seed);
  Corpus c;
  for (int d = 0; d < 13; ++d) {
    std::vector<std::vector<int64_t>> seqs(size_t(g() % 3 + (d == 4 ? 0 : 1)));  // document 4: no sequence
    for (auto& s : seqs) {
      s.resize(size_t(g() % 20));  // empty sequences too
      for (auto& v : s) v = int64_t(g() % uint64_t(vmax + 1));
    }
    c.docs.push_back(seqs);
  }
  return c;
}

TEST(IndexedDataset, RoundTripEveryDtype) {
  for (uint8_t code = 1; code <= 8; ++code) {
    const TokenDType t = TokenDType(code);
    SCOPED_TRACE(token_dtype_name(t));
    const int64_t vmax = code == 1 ? 255 : code == 2 ? 127 : code == 3 ? 32767 : code == 8 ? 65535 : 5000000;
    const Corpus c = random_corpus(dt::testing::test_seed() + code, vmax);
    const std::string prefix = tmp_prefix(std::string("rt_") + token_dtype_name(t));
    IndexedDatasetWriter w;
    ASSERT_EQ(w.open(prefix, t), "");
    int64_t nseq = 0, ntok = 0;
    for (const auto& doc : c.docs) {
      for (const auto& s : doc) {
        ASSERT_EQ(w.add_sequence(s), "");
        ++nseq;
        ntok += int64_t(s.size());
      }
      w.end_document();
    }
    ASSERT_EQ(w.finish(), "");
    // Megatron's layout: header, then 4+8 bytes per sequence and 8 per document index.
    EXPECT_EQ(std::filesystem::file_size(prefix + ".idx"), kMmidIdxHeaderBytes + 12 * nseq + 8 * (c.docs.size() + 1));
    EXPECT_EQ(std::filesystem::file_size(prefix + ".bin"), size_t(ntok) * token_dtype_size(t));

    IndexedDataset ds;
    ASSERT_EQ(IndexedDataset::open(prefix, &ds), "");
    EXPECT_EQ(ds.dtype(), t);
    EXPECT_EQ(ds.num_documents(), int64_t(c.docs.size()));
    EXPECT_EQ(ds.num_sequences(), nseq);
    EXPECT_EQ(ds.num_tokens(), ntok);
    int64_t i = 0;
    for (size_t d = 0; d < c.docs.size(); ++d) {
      EXPECT_EQ(ds.document_index(int64_t(d)), i);
      std::vector<int32_t> want;
      for (const auto& s : c.docs[d]) {
        EXPECT_EQ(ds.sequence(i), std::vector<int32_t>(s.begin(), s.end()));
        want.insert(want.end(), s.begin(), s.end());
        ++i;
      }
      EXPECT_EQ(ds.document(int64_t(d)), want) << "document " << d;
      if (want.size() > 3) {  // a sub-range that crosses sequence boundaries
        std::vector<int32_t> part(want.size() - 2);
        ds.read_document(int64_t(d), 1, int64_t(part.size()), part.data());
        EXPECT_EQ(part, std::vector<int32_t>(want.begin() + 1, want.end() - 1));
      }
    }
  }
}

// The files of a tiny uint16 dataset, built byte by byte: 2 documents, 3 sequences.
//   doc 0 = seq 0 [10, 11] + seq 1 [12];  doc 1 = seq 2 [13, 14, 15]
struct HandMade {
  std::vector<char> idx, bin;
  HandMade() {
    idx.insert(idx.end(), {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'});
    put<uint64_t>(&idx, 1);  // version
    put<uint8_t>(&idx, 8);   // uint16
    put<uint64_t>(&idx, 3);  // sequences
    put<uint64_t>(&idx, 3);  // document indices (2 documents + 1)
    for (int32_t L : {2, 1, 3}) put(&idx, L);
    for (int64_t P : {0, 4, 6}) put(&idx, P);
    for (int64_t D : {0, 2, 3}) put(&idx, D);
    for (uint16_t v : {10, 11, 12, 13, 14, 15}) put(&bin, v);
  }
  std::string write(const std::string& name) const {
    const std::string p = tmp_prefix(name);
    spit(p + ".idx", idx);
    spit(p + ".bin", bin);
    return p;
  }
  // Byte offsets of the fields.
  static constexpr size_t kVersion = 9, kCode = 17, kLens = 34, kPtrs = 34 + 12, kDocs = 34 + 12 + 24;
};

TEST(IndexedDataset, ReadsAHandWrittenFile) {
  const HandMade h;
  ASSERT_EQ(h.idx.size(), 34u + 12 + 24 + 24);
  IndexedDataset ds;
  ASSERT_EQ(IndexedDataset::open(h.write("hand"), &ds), "");
  EXPECT_EQ(ds.dtype(), TokenDType::u16);
  EXPECT_EQ(ds.num_sequences(), 3);
  EXPECT_EQ(ds.num_documents(), 2);
  EXPECT_EQ(ds.num_tokens(), 6);
  EXPECT_EQ(ds.document(0), (std::vector<int32_t>{10, 11, 12}));
  EXPECT_EQ(ds.document(1), (std::vector<int32_t>{13, 14, 15}));
  EXPECT_EQ(ds.sequence_pointer(2), 6);
  EXPECT_EQ(ds.document_length(0), 3);

  // The writer produces exactly these bytes.
  const std::string p = tmp_prefix("hand_w");
  IndexedDatasetWriter w;
  ASSERT_EQ(w.open(p, TokenDType::u16), "");
  ASSERT_EQ(w.add_sequence(std::vector<int64_t>{10, 11}), "");
  ASSERT_EQ(w.add_sequence(std::vector<int64_t>{12}), "");
  w.end_document();
  ASSERT_EQ(w.add_document(std::vector<int64_t>{13, 14, 15}), "");
  ASSERT_EQ(w.finish(), "");
  EXPECT_EQ(slurp(p + ".idx"), h.idx);
  EXPECT_EQ(slurp(p + ".bin"), h.bin);

  // Multimodal files append one int8 mode per sequence; accepted and ignored.
  HandMade mm;
  for (int k = 0; k < 3; ++k) mm.idx.push_back(0);
  ASSERT_EQ(IndexedDataset::open(mm.write("hand_mm"), &ds), "");
  EXPECT_EQ(ds.document(1), (std::vector<int32_t>{13, 14, 15}));
}

TEST(IndexedDataset, EachCorruptionHasItsMessage) {
  IndexedDataset ds;
  const std::string missing = tmp_prefix("nope");
  EXPECT_TRUE(has_all(IndexedDataset::open(missing, &ds), {"cannot open", "nope.idx", "No such file"}));
  {  // .bin missing
    const std::string p = HandMade().write("nobin");
    std::filesystem::remove(p + ".bin");
    EXPECT_TRUE(has_all(IndexedDataset::open(p, &ds), {"cannot open", "nobin.bin"}));
  }
  {
    HandMade h;
    h.idx[0] = 'X';
    EXPECT_TRUE(has_all(IndexedDataset::open(h.write("magic"), &ds),
                        {"magic.idx", "bad magic", "58 4d 49 44 49 44 58 00 00", "MMIDIDX"}));
  }
  {
    HandMade h;
    poke<uint64_t>(&h.idx, HandMade::kVersion, 2);
    EXPECT_TRUE(has_all(IndexedDataset::open(h.write("version"), &ds),
                        {"version.idx", "version is 2, only version 1 is supported"}));
  }
  {
    HandMade h;
    h.idx[HandMade::kCode] = 9;
    EXPECT_TRUE(has_all(IndexedDataset::open(h.write("code"), &ds), {"code.idx", "unknown dtype code 9", "8 uint16"}));
    h.idx[HandMade::kCode] = 0;
    EXPECT_TRUE(has_all(IndexedDataset::open(h.write("code0"), &ds), {"unknown dtype code 0"}));
  }
  {
    HandMade h;
    h.idx.resize(20);
    EXPECT_TRUE(has_all(IndexedDataset::open(h.write("hdr"), &ds),
                        {"hdr.idx", "truncated header", "has 20 bytes", "needs 34"}));
  }
  {
    HandMade h;
    h.idx.resize(h.idx.size() - 5);
    EXPECT_TRUE(has_all(IndexedDataset::open(h.write("trunc"), &ds),
                        {"trunc.idx", "truncated", "sequence count 3 and document count 3 need 94 bytes", "has 89"}));
  }
  {
    HandMade h;
    h.idx.push_back(0);
    EXPECT_TRUE(has_all(IndexedDataset::open(h.write("trail"), &ds), {"trail.idx", "95 bytes", "exactly 94"}));
  }
  {  // the .bin is shorter than the last sequence needs
    HandMade h;
    h.bin.resize(10);
    EXPECT_TRUE(has_all(IndexedDataset::open(h.write("short"), &ds),
                        {"short.idx", "sequence 2 (sequence_pointers[2]=6, sequence_lengths[2]=3", "ends at byte 12",
                         "past the end of", "short.bin (10 bytes)"}));
  }
  {
    HandMade h;
    poke<int64_t>(&h.idx, HandMade::kPtrs + 8, 1000);
    EXPECT_TRUE(has_all(IndexedDataset::open(h.write("ptr"), &ds), {"sequence_pointers[1]=1000", "past the end"}));
  }
  {
    HandMade h;
    poke<int32_t>(&h.idx, HandMade::kLens, -4);
    EXPECT_TRUE(has_all(IndexedDataset::open(h.write("neg"), &ds), {"neg.idx", "sequence_lengths[0]=-4 is negative"}));
  }
  {
    HandMade h;
    poke<int64_t>(&h.idx, HandMade::kDocs + 8, 4);  // [0, 4, 3]
    EXPECT_TRUE(has_all(IndexedDataset::open(h.write("mono"), &ds),
                        {"mono.idx", "document_indices are not monotonic at d=1", "document_indices[1]=4",
                         "document_indices[2]=3"}));
  }
  {
    HandMade h;
    poke<int64_t>(&h.idx, HandMade::kDocs, 1);
    EXPECT_TRUE(has_all(IndexedDataset::open(h.write("first"), &ds), {"document_indices[0]=1, must be 0"}));
  }
  {
    HandMade h;
    poke<int64_t>(&h.idx, HandMade::kDocs + 16, 2);  // [0, 2, 2]: sequence 2 in no document
    EXPECT_TRUE(has_all(IndexedDataset::open(h.write("last"), &ds),
                        {"document_indices[2]=2 (the last), must equal the sequence count 3"}));
  }
  {
    HandMade h;
    poke<uint64_t>(&h.idx, 26, 0);  // document count 0
    EXPECT_TRUE(has_all(IndexedDataset::open(h.write("nodocs"), &ds), {"nodocs.idx", "document count is 0"}));
  }
}

TEST(IndexedDataset, WriterRejectsValuesTheDtypeCannotHold) {
  IndexedDatasetWriter w;
  ASSERT_EQ(w.open(tmp_prefix("range"), TokenDType::u16), "");
  EXPECT_TRUE(has_all(w.add_document(std::vector<int64_t>{1, 70000}),
                      {"range.bin", "sequence 0", "token 1 has value 70000", "uint16 cannot hold"}));
  EXPECT_TRUE(has_all(w.add_document(std::vector<int64_t>{-1}), {"value -1"}));
  ASSERT_EQ(w.finish(), "");
}

TEST(IndexedDataset, TokenValuesOutsideTheIdRangeAbortOnRead) {
  const std::string p = tmp_prefix("f32");
  IndexedDatasetWriter w;
  ASSERT_EQ(w.open(p, TokenDType::f32), "");
  ASSERT_EQ(w.add_document(std::vector<int64_t>{3, 4}), "");
  ASSERT_EQ(w.finish(), "");
  std::vector<char> bin = slurp(p + ".bin");
  poke<float>(&bin, 4, 1.5f);  // a non-integral "token id"
  spit(p + ".bin", bin);
  IndexedDataset ds;
  ASSERT_EQ(IndexedDataset::open(p, &ds), "");
  EXPECT_DEATH((void)ds.document(0), "f32.bin: token 1 of sequence 0 has value 1.5 \\(float32\\), not a token id");
  poke<float>(&bin, 4, 2147483648.f);  // 2^31: float32(INT32_MAX) rounds up to it, which int32 cannot hold
  spit(p + ".bin", bin);
  ASSERT_EQ(IndexedDataset::open(p, &ds), "");
  EXPECT_DEATH((void)ds.document(0), "f32.bin: token 1 of sequence 0 has value 2147483648 \\(float32\\), not a token id");
  const std::string q = tmp_prefix("i8");
  ASSERT_EQ(w.open(q, TokenDType::i8), "");
  ASSERT_EQ(w.add_document(std::vector<int64_t>{5, -2}), "");
  ASSERT_EQ(w.finish(), "");
  ASSERT_EQ(IndexedDataset::open(q, &ds), "");
  EXPECT_DEATH((void)ds.sequence(0), "token 1 of sequence 0 has value -2 \\(int8\\)");
}

TEST(PlainDataset, RoundTripAndErrors) {
  const std::vector<std::vector<int64_t>> docs = {{1, 2, 3}, {}, {65535}, {7, 8}};
  for (TokenDType t : {TokenDType::u16, TokenDType::i32}) {
    const std::string p = tmp_prefix(std::string("plain_") + token_dtype_name(t));
    ASSERT_EQ(write_plain_dataset(p + ".tokens", p + ".offsets", t, docs), "");
    EXPECT_EQ(std::filesystem::file_size(p + ".offsets"), 8u * 5);
    IndexedDataset ds;
    ASSERT_EQ(IndexedDataset::open_plain(p + ".tokens", p + ".offsets", t, &ds), "");
    ASSERT_EQ(ds.num_documents(), 4);
    EXPECT_EQ(ds.num_tokens(), 6);
    for (size_t d = 0; d < docs.size(); ++d)
      EXPECT_EQ(ds.document(int64_t(d)), std::vector<int32_t>(docs[d].begin(), docs[d].end()));
  }
  const std::string p = tmp_prefix("plain_bad");
  ASSERT_EQ(write_plain_dataset(p + ".tokens", p + ".offsets", TokenDType::u16, docs), "");
  IndexedDataset ds;
  EXPECT_TRUE(has_all(IndexedDataset::open_plain(p + ".tokens", p + ".offsets", TokenDType::i64, &ds),
                      {"token dtype int64 is not supported; use uint16 or int32"}));
  // The same bytes read as int32: 12 bytes = 3 tokens, but the offsets end at 6.
  EXPECT_TRUE(has_all(IndexedDataset::open_plain(p + ".tokens", p + ".offsets", TokenDType::i32, &ds),
                      {"plain_bad.offsets", "offsets[4]=6 (the last)", "holds 3 int32 tokens"}));
  std::vector<char> off = slurp(p + ".offsets");
  poke<int64_t>(&off, 16, 9);  // [0, 3, 9, 4, 6]
  spit(p + ".offsets", off);
  EXPECT_TRUE(has_all(IndexedDataset::open_plain(p + ".tokens", p + ".offsets", TokenDType::u16, &ds),
                      {"offsets are not monotonic at d=2", "offsets[2]=9", "offsets[3]=4"}));
  off.resize(off.size() - 3);
  spit(p + ".offsets", off);
  EXPECT_TRUE(has_all(IndexedDataset::open_plain(p + ".tokens", p + ".offsets", TokenDType::u16, &ds),
                      {"plain_bad.offsets", "37 bytes", "multiple of 8"}));
  std::vector<char> tok = slurp(p + ".tokens");
  tok.push_back(0);
  spit(p + ".tokens", tok);
  EXPECT_TRUE(has_all(IndexedDataset::open_plain(p + ".tokens", p + ".offsets", TokenDType::u16, &ds),
                      {"plain_bad.tokens", "13 bytes is not a whole number of uint16 tokens"}));
  EXPECT_TRUE(has_all(IndexedDataset::open_plain(p + ".none", p + ".offsets", TokenDType::u16, &ds),
                      {"cannot open", "plain_bad.none"}));
}

}  // namespace
}  // namespace dt::data
