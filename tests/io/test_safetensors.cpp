// safetensors round trip, a file written by hand byte by byte (independent of our writer),
// and every corruption class named in the error.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "deltatron/io/safetensors.h"
#include "test_util.h"

using namespace dt;

namespace {
std::string tmp(const char* name) { return ::testing::TempDir() + name; }
void write_raw(const std::string& path, const std::string& header, const std::string& data) {
  std::ofstream f(path, std::ios::binary);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) f.put(char((n >> (8 * i)) & 0xff));
  f << header << data;
}
}  // namespace

TEST(Safetensors, RoundTrip) {
  Tensor a = dt::testing::rand_host(Shape{3, 5});
  Tensor b = Tensor::empty(Shape{4}, DType::i64);
  for (int i = 0; i < 4; ++i) b.ptr<int64_t>()[i] = int64_t(i) * 1000000007;
  std::string p = tmp("rt.safetensors");
  ASSERT_EQ(io::write_safetensors(p, {{"w.a", a}, {"w.b", b}}, {{"format", "pt"}}), "");
  io::SafetensorsFile f;
  ASSERT_EQ(io::read_safetensors(p, &f), "");
  EXPECT_EQ(f.metadata.at("format"), "pt");
  ASSERT_EQ(f.at("w.a").shape(), a.shape());
  EXPECT_EQ(std::memcmp(f.at("w.a").data(), a.data(), a.nbytes()), 0);
  EXPECT_EQ(std::memcmp(f.at("w.b").data(), b.data(), b.nbytes()), 0);
}

TEST(Safetensors, ReadsAHandWrittenFile) {
  // Two bf16 values 1.0 (0x3f80) and -2.0 (0xc000), little-endian.
  std::string p = tmp("hand.safetensors");
  write_raw(p, R"({"x":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})", std::string("\x80\x3f\x00\xc0", 4));
  io::SafetensorsFile f;
  ASSERT_EQ(io::read_safetensors(p, &f), "");
  const uint16_t* x = f.at("x").ptr<uint16_t>();
  EXPECT_EQ(x[0], 0x3f80);
  EXPECT_EQ(x[1], 0xc000);
}

TEST(Safetensors, CorruptFilesAreClearErrors) {
  io::SafetensorsFile f;
  std::string p = tmp("bad.safetensors");
  write_raw(p, R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(8, '\0'));
  EXPECT_NE(io::read_safetensors(p, &f).find("outside the 8 data bytes (truncated file?)"), std::string::npos);
  write_raw(p, R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", std::string(16, '\0'));
  EXPECT_NE(io::read_safetensors(p, &f).find("16 bytes for shape [3] f32 needs 12"), std::string::npos);
  write_raw(p, R"({"x":{"dtype":"Q4","shape":[3],"data_offsets":[0,3]}})", std::string(3, '\0'));
  EXPECT_NE(io::read_safetensors(p, &f).find("unsupported dtype \"Q4\""), std::string::npos);
  write_raw(p, R"({"x":{"dtype":)", "");
  EXPECT_NE(io::read_safetensors(p, &f).find("header is not valid JSON"), std::string::npos);
  write_raw(p, R"({"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"y":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
            std::string(6, '\0'));
  EXPECT_NE(io::read_safetensors(p, &f).find("overlap"), std::string::npos);
  {
    std::ofstream t(p, std::ios::binary);
    t << "abc";
  }
  EXPECT_NE(io::read_safetensors(p, &f).find("truncated: 3 bytes"), std::string::npos);
  EXPECT_NE(io::read_safetensors(tmp("missing.safetensors"), &f).find("cannot open"), std::string::npos);
}
