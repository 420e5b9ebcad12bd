// SHA-256 (FIPS 180-4, section 6.2), written here so checkpoints need no crypto library.
// Checkpoints record the digest of every file they write and verify it on load; a
// mismatch names the file, the expected and the actual digest.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace dt {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  // The digest of everything passed to update; the object must not be updated afterwards.
  std::array<uint8_t, 32> finish();

 private:
  void block(const uint8_t* p);  // one 64-byte block into h_
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;  // bytes
  bool done_ = false;
};

std::string to_hex(const std::array<uint8_t, 32>& digest);  // 64 lower-case hex digits
std::string sha256_hex(const void* data, size_t n);
// Streams a file through SHA-256. "" on success (hex digest and byte count in the outputs),
// else a message naming the path and the OS error.
std::string sha256_file(const std::string& path, std::string* hex, uint64_t* size);

}  // namespace dt
