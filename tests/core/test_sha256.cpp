// SHA-256 against FIPS 180-4 / NIST example vectors ("", "abc", the 448- and 896-bit messages,
// one million 'a'), messages whose lengths straddle the padding boundaries (55, 56, 63, 64, 65,
// 119, 120, 128 bytes; digests from Python's hashlib), split updates, and a file.
// Exact: every digest must match in all 64 hex digits.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "deltatron/core/sha256.h"

using namespace dt;

TEST(Sha256, Fips180Vectors) {
  EXPECT_EQ(sha256_hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  EXPECT_EQ(sha256_hex(m448.data(), m448.size()), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const std::string m896 =
      "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
  EXPECT_EQ(sha256_hex(m896.data(), m896.size()), "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  const std::string million(1000000, 'a');
  EXPECT_EQ(sha256_hex(million.data(), million.size()),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

namespace {
std::vector<uint8_t> pattern(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t((i * 7 + 3) % 256);
  return v;
}
}  // namespace

TEST(Sha256, PaddingBoundariesAndSplitUpdates) {
  const std::vector<std::pair<size_t, std::string>> want = {
      {55, "e7313d333c272e639f790978283f9eb392e843d0f29b7016828bb1daa4aac70b"},
      {56, "4324d65f3c103567f5589c710bc08f8523f929a9272e3af36fc968e52abc6c27"},
      {63, "81c80242132f230c3bd41b3e63bbcff16107339549214a99614ff26664625055"},
      {64, "39e3d7b6b5d075d37d053ad89b24b41bef4f3c29760c84447cab3f3be1882241"},
      {65, "aacca6ff74fdbb296d165a45cecfa04e5127bc008770fbbdd48006f2d2fae95e"},
      {119, "9ce7368e4daf32341631b492e80359dc9f594b48453cd0dd5bf0b19279cc177e"},
      {120, "7836b787757e95e58b3ca5aec90b1b004e8deba1e50e9675af9cabf1a13a04b5"},
      {128, "d2742f1f4ac6bb7ca2b239ee18402ba8b3f9f8e652d2a72973c2b9ba11c08cf6"}};
  for (const auto& [n, hex] : want) {
    std::vector<uint8_t> m = pattern(n);
    EXPECT_EQ(sha256_hex(m.data(), n), hex) << n << " bytes";
    for (size_t cut = 0; cut <= n; ++cut) {  // every two-piece split
      Sha256 h;
      h.update(m.data(), cut);
      h.update(m.data() + cut, n - cut);
      ASSERT_EQ(to_hex(h.finish()), hex) << n << " bytes split at " << cut;
    }
    Sha256 h;  // byte by byte
    for (size_t i = 0; i < n; ++i) h.update(&m[i], 1);
    EXPECT_EQ(to_hex(h.finish()), hex) << n << " bytes, one at a time";
  }
}

TEST(Sha256, File) {
  const std::string path = ::testing::TempDir() + "dt_sha256_file.bin";
  const std::string million(1000000, 'a');
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fwrite(million.data(), 1, million.size(), f);
  std::fclose(f);
  std::string hex;
  uint64_t size = 0;
  EXPECT_EQ(sha256_file(path, &hex, &size), "");
  EXPECT_EQ(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  EXPECT_EQ(size, 1000000u);
  std::remove(path.c_str());
  std::string err = sha256_file(path, &hex, &size);
  EXPECT_NE(err.find(path), std::string::npos) << err;
}
