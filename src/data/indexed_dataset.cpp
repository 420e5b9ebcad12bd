// Megatron indexed datasets (MMIDIDX v1) and the plain token + offsets format, read through
// read-only mmaps and written with stdio (include/deltatron/data/indexed_dataset.h,
// docs/data.md). The whole index is validated once at open time, so later reads only check
// the request and the token values.
#include "deltatron/data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <type_traits>

#include "deltatron/core/check.h"

namespace dt::data {

static_assert(std::endian::native == std::endian::little, "the on-disk formats are little-endian");

// ---- dtype codes --------------------------------------------------------------------------

bool token_dtype_valid(uint8_t code) { return code >= 1 && code <= 8; }

size_t token_dtype_size(TokenDType t) {
  switch (t) {
    case TokenDType::u8: case TokenDType::i8: return 1;
    case TokenDType::i16: case TokenDType::u16: return 2;
    case TokenDType::i32: case TokenDType::f32: return 4;
    case TokenDType::i64: case TokenDType::f64: return 8;
  }
  return 0;
}

const char* token_dtype_name(TokenDType t) {
  switch (t) {
    case TokenDType::u8: return "uint8";
    case TokenDType::i8: return "int8";
    case TokenDType::i16: return "int16";
    case TokenDType::i32: return "int32";
    case TokenDType::i64: return "int64";
    case TokenDType::f64: return "float64";
    case TokenDType::f32: return "float32";
    case TokenDType::u16: return "uint16";
  }
  return "?";
}

bool parse_token_dtype(const std::string& name, TokenDType* out) {
  for (uint8_t c = 1; c <= 8; ++c)
    if (name == token_dtype_name(TokenDType(c))) {
      *out = TokenDType(c);
      return true;
    }
  return false;
}

namespace {

const char* kCodeList = "1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16";

// A read-only mapping of a whole file (nullptr for an empty file).
struct Mapping {
  const char* data = nullptr;
  size_t size = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (data) munmap(const_cast<char*>(data), size);
  }
  std::string open(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fmt::format("cannot open {}: {}", path, std::strerror(errno));
    struct stat st{};
    if (fstat(fd, &st) != 0) {
      const int e = errno;
      ::close(fd);
      return fmt::format("cannot stat {}: {}", path, std::strerror(e));
    }
    size = size_t(st.st_size);
    if (size > 0) {
      void* p = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) {
        const int e = errno;
        ::close(fd);
        return fmt::format("cannot mmap {} ({} bytes): {}", path, size, std::strerror(e));
      }
      data = static_cast<const char*>(p);
    }
    ::close(fd);  // the mapping stays valid
    return "";
  }
};

// Unaligned little-endian load (the .idx arrays start at byte 34).
template <typename T>
T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

std::string hex_bytes(const char* p, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += fmt::format("{}{:02x}", i ? " " : "", uint8_t(p[i]));
  return s;
}

// Converts `count` tokens of dtype t at src to int32, failing on values outside [0, 2^31).
void convert_tokens(TokenDType t, const char* src, int64_t count, int32_t* out, const std::string& file,
                    int64_t seq) {
  auto bad = [&](int64_t j, double v) {
    user_error(fmt::format("data: {}: token {} of sequence {} has value {} ({}), not a token id in [0, 2^31)", file,
                           j, seq, v, token_dtype_name(t)),
               false);
  };
  auto run = [&](auto tag) {
    using T = decltype(tag);
    for (int64_t j = 0; j < count; ++j) {
      const T v = load<T>(src + size_t(j) * sizeof(T));
      if constexpr (std::is_floating_point_v<T>) {
        // < 2^31 exactly: T(INT32_MAX) rounds up to 2^31 in float32, which int32 cannot hold.
        if (!(v >= 0 && double(v) < 2147483648.0) || std::floor(v) != v) bad(j, double(v));
      } else if constexpr (std::is_signed_v<T>) {
        if (v < 0 || int64_t(v) > INT32_MAX) bad(j, double(v));
      } else {
        if (uint64_t(v) > uint64_t(INT32_MAX)) bad(j, double(v));
      }
      out[j] = int32_t(v);
    }
  };
  switch (t) {
    case TokenDType::u8: run(uint8_t{}); break;
    case TokenDType::i8: run(int8_t{}); break;
    case TokenDType::i16: run(int16_t{}); break;
    case TokenDType::i32: run(int32_t{}); break;
    case TokenDType::i64: run(int64_t{}); break;
    case TokenDType::f64: run(double{}); break;
    case TokenDType::f32: run(float{}); break;
    case TokenDType::u16: run(uint16_t{}); break;
  }
}

}  // namespace

// ---- IndexedDataset -----------------------------------------------------------------------

struct IndexedDataset::Impl {
  bool plain = false;
  std::string name, data_path, index_path;
  TokenDType dtype = TokenDType::i32;
  Mapping data, index;
  int64_t S = 0, D = 0, tokens = 0;  // sequences, documents (D = document_count - 1)
  size_t len_off = 0, ptr_off = 0, doc_off = 0;  // byte offsets of the .idx arrays

  int64_t seq_len(int64_t i) const {
    if (plain) return load<int64_t>(index.data + size_t(i + 1) * 8) - load<int64_t>(index.data + size_t(i) * 8);
    return load<int32_t>(index.data + len_off + size_t(i) * 4);
  }
  int64_t seq_ptr(int64_t i) const {
    if (plain) return load<int64_t>(index.data + size_t(i) * 8) * int64_t(token_dtype_size(dtype));
    return load<int64_t>(index.data + ptr_off + size_t(i) * 8);
  }
  int64_t doc_idx(int64_t d) const { return plain ? d : load<int64_t>(index.data + doc_off + size_t(d) * 8); }
};

IndexedDataset::IndexedDataset() = default;
IndexedDataset::~IndexedDataset() = default;
IndexedDataset::IndexedDataset(IndexedDataset&&) noexcept = default;
IndexedDataset& IndexedDataset::operator=(IndexedDataset&&) noexcept = default;

std::string IndexedDataset::open(const std::string& prefix, IndexedDataset* out) {
  auto p = std::make_unique<Impl>();
  p->name = prefix;
  p->index_path = prefix + ".idx";
  p->data_path = prefix + ".bin";
  const std::string& ip = p->index_path;
  std::string err = p->index.open(ip);
  if (!err.empty()) return "indexed dataset: " + err;
  err = p->data.open(p->data_path);
  if (!err.empty()) return "indexed dataset: " + err;

  const char* x = p->index.data;
  const size_t n = p->index.size;
  if (n < kMmidIdxHeaderBytes)
    return fmt::format("indexed dataset: {}: truncated header: the file has {} bytes, the MMIDIDX header needs {}", ip,
                       n, kMmidIdxHeaderBytes);
  if (std::memcmp(x, kMmidIdxMagic, 9) != 0)
    return fmt::format(
        "indexed dataset: {}: bad magic: bytes 0-8 are {}, expected 'MMIDIDX\\x00\\x00' ({}); not a Megatron .idx file",
        ip, hex_bytes(x, 9), hex_bytes(kMmidIdxMagic, 9));
  const uint64_t version = load<uint64_t>(x + 9);
  if (version != kMmidIdxVersion)
    return fmt::format("indexed dataset: {}: version is {}, only version {} is supported", ip, version,
                       kMmidIdxVersion);
  const uint8_t code = uint8_t(x[17]);
  if (!token_dtype_valid(code))
    return fmt::format("indexed dataset: {}: unknown dtype code {} (known codes: {})", ip, code, kCodeList);
  p->dtype = TokenDType(code);
  const uint64_t S = load<uint64_t>(x + 18), Dc = load<uint64_t>(x + 26);
  if (Dc < 1)
    return fmt::format("indexed dataset: {}: document count is 0; the document indices hold at least the leading 0",
                       ip);
  // 20 bytes per sequence + 8 per document index; bounded first so the products cannot overflow.
  const uint64_t limit = uint64_t(1) << 58;
  const uint64_t need = S < limit && Dc < limit ? kMmidIdxHeaderBytes + 12 * S + 8 * Dc : UINT64_MAX;
  if (n < need)
    return fmt::format(
        "indexed dataset: {}: truncated: sequence count {} and document count {} need {} bytes, the file has {}", ip, S,
        Dc, need, n);
  // Multimodal Megatron datasets append one int8 mode per sequence; those are accepted and ignored.
  if (n != need && n != need + S)
    return fmt::format(
        "indexed dataset: {}: the file has {} bytes, but sequence count {} and document count {} need exactly {} (or {} "
        "with sequence modes)",
        ip, n, S, Dc, need, need + S);
  p->S = int64_t(S);
  p->D = int64_t(Dc) - 1;
  p->len_off = kMmidIdxHeaderBytes;
  p->ptr_off = p->len_off + 4 * S;
  p->doc_off = p->ptr_off + 8 * S;

  const int64_t isz = int64_t(token_dtype_size(p->dtype)), bin_size = int64_t(p->data.size);
  for (int64_t i = 0; i < p->S; ++i) {
    const int64_t L = p->seq_len(i), P = p->seq_ptr(i);
    if (L < 0) return fmt::format("indexed dataset: {}: sequence_lengths[{}]={} is negative", ip, i, L);
    if (P < 0 || P > bin_size || L > (bin_size - P) / isz)
      return fmt::format(
          "indexed dataset: {}: sequence {} (sequence_pointers[{}]={}, sequence_lengths[{}]={}, {} bytes per {} token) "
          "ends at byte {}, past the end of {} ({} bytes)",
          ip, i, i, P, i, L, isz, token_dtype_name(p->dtype), P + L * isz, p->data_path, bin_size);
    p->tokens += L;
  }
  if (p->doc_idx(0) != 0)
    return fmt::format("indexed dataset: {}: document_indices[0]={}, must be 0", ip, p->doc_idx(0));
  for (int64_t d = 0; d < p->D; ++d)
    if (p->doc_idx(d + 1) < p->doc_idx(d))
      return fmt::format(
          "indexed dataset: {}: document_indices are not monotonic at d={}: document_indices[{}]={}, "
          "document_indices[{}]={}",
          ip, d, d, p->doc_idx(d), d + 1, p->doc_idx(d + 1));
  if (p->doc_idx(p->D) != p->S)
    return fmt::format("indexed dataset: {}: document_indices[{}]={} (the last), must equal the sequence count {}", ip,
                       p->D, p->doc_idx(p->D), p->S);
  out->p_ = std::move(p);
  return "";
}

std::string IndexedDataset::open_plain(const std::string& tokens_path, const std::string& offsets_path,
                                       TokenDType dtype, IndexedDataset* out) {
  if (dtype != TokenDType::u16 && dtype != TokenDType::i32)
    return fmt::format("plain dataset: {}: token dtype {} is not supported; use uint16 or int32", tokens_path,
                       token_dtype_name(dtype));
  auto p = std::make_unique<Impl>();
  p->plain = true;
  p->name = tokens_path;
  p->data_path = tokens_path;
  p->index_path = offsets_path;
  p->dtype = dtype;
  std::string err = p->data.open(tokens_path);
  if (!err.empty()) return "plain dataset: " + err;
  err = p->index.open(offsets_path);
  if (!err.empty()) return "plain dataset: " + err;
  const int64_t isz = int64_t(token_dtype_size(dtype));
  if (p->data.size % size_t(isz) != 0)
    return fmt::format("plain dataset: {}: {} bytes is not a whole number of {} tokens ({} bytes each)", tokens_path,
                       p->data.size, token_dtype_name(dtype), isz);
  const int64_t ntok = int64_t(p->data.size) / isz;
  if (p->index.size < 8 || p->index.size % 8 != 0)
    return fmt::format(
        "plain dataset: {}: {} bytes; the offsets file must hold int64 [D+1] offsets (a multiple of 8 bytes, at least 8)",
        offsets_path, p->index.size);
  p->D = int64_t(p->index.size / 8) - 1;
  p->S = p->D;
  auto off = [&](int64_t d) { return load<int64_t>(p->index.data + size_t(d) * 8); };
  if (off(0) != 0) return fmt::format("plain dataset: {}: offsets[0]={}, must be 0", offsets_path, off(0));
  for (int64_t d = 0; d < p->D; ++d)
    if (off(d + 1) < off(d))
      return fmt::format("plain dataset: {}: offsets are not monotonic at d={}: offsets[{}]={}, offsets[{}]={}",
                         offsets_path, d, d, off(d), d + 1, off(d + 1));
  if (off(p->D) != ntok)
    return fmt::format("plain dataset: {}: offsets[{}]={} (the last), but {} holds {} {} tokens", offsets_path, p->D,
                       off(p->D), tokens_path, ntok, token_dtype_name(dtype));
  p->tokens = ntok;
  out->p_ = std::move(p);
  return "";
}

IndexedDataset IndexedDataset::open_or_die(const std::string& prefix) {
  IndexedDataset ds;
  const std::string err = open(prefix, &ds);
  if (!err.empty()) user_error(err, true);
  return ds;
}

IndexedDataset IndexedDataset::open_plain_or_die(const std::string& tokens_path, const std::string& offsets_path,
                                                 TokenDType dtype) {
  IndexedDataset ds;
  const std::string err = open_plain(tokens_path, offsets_path, dtype, &ds);
  if (!err.empty()) user_error(err, true);
  return ds;
}

const std::string& IndexedDataset::name() const {
  static const std::string none = "(no dataset)";
  return p_ ? p_->name : none;
}
TokenDType IndexedDataset::dtype() const {
  DT_CHECK(p_, "IndexedDataset::dtype: no dataset is open");
  return p_->dtype;
}
int64_t IndexedDataset::num_sequences() const { return p_ ? p_->S : 0; }
int64_t IndexedDataset::num_documents() const { return p_ ? p_->D : 0; }
int64_t IndexedDataset::num_tokens() const { return p_ ? p_->tokens : 0; }

int64_t IndexedDataset::sequence_length(int64_t i) const {
  DT_CHECK(p_ && i >= 0 && i < p_->S, "sequence {} is outside [0, {})", i, num_sequences());
  return p_->seq_len(i);
}
int64_t IndexedDataset::sequence_pointer(int64_t i) const {
  DT_CHECK(p_ && i >= 0 && i < p_->S, "sequence {} is outside [0, {})", i, num_sequences());
  return p_->seq_ptr(i);
}
int64_t IndexedDataset::document_index(int64_t d) const {
  DT_CHECK(p_ && d >= 0 && d <= p_->D, "document index {} is outside [0, {}]", d, num_documents());
  return p_->doc_idx(d);
}
int64_t IndexedDataset::document_length(int64_t d) const {
  DT_CHECK(p_ && d >= 0 && d < p_->D, "document {} is outside [0, {})", d, num_documents());
  int64_t n = 0;
  for (int64_t i = p_->doc_idx(d); i < p_->doc_idx(d + 1); ++i) n += p_->seq_len(i);
  return n;
}

void IndexedDataset::read_document(int64_t d, int64_t begin, int64_t count, int32_t* out) const {
  const int64_t len = document_length(d);
  DT_CHECK(begin >= 0 && count >= 0 && begin + count <= len, "{}: tokens [{}, {}) of document {} are outside [0, {})",
           name(), begin, begin + count, d, len);
  const int64_t isz = int64_t(token_dtype_size(p_->dtype));
  int64_t pos = 0;  // document position of the current sequence's first token
  for (int64_t i = p_->doc_idx(d); i < p_->doc_idx(d + 1) && count > 0; ++i) {
    const int64_t L = p_->seq_len(i);
    if (begin < pos + L) {
      const int64_t o = begin - pos, n = std::min(count, L - o);
      convert_tokens(p_->dtype, p_->data.data + p_->seq_ptr(i) + o * isz, n, out, p_->data_path, i);
      out += n;
      begin += n;
      count -= n;
    }
    pos += L;
  }
}

std::vector<int32_t> IndexedDataset::document(int64_t d) const {
  std::vector<int32_t> v(size_t(document_length(d)));
  read_document(d, 0, int64_t(v.size()), v.data());
  return v;
}

std::vector<int32_t> IndexedDataset::sequence(int64_t i) const {
  const int64_t L = sequence_length(i);
  std::vector<int32_t> v(static_cast<size_t>(L));
  if (L) convert_tokens(p_->dtype, p_->data.data + p_->seq_ptr(i), L, v.data(), p_->data_path, i);
  return v;
}

// ---- writers ------------------------------------------------------------------------------

namespace {

// Appends `tokens` in dtype t to buf; "" or the first value that does not fit.
std::string encode_tokens(TokenDType t, std::span<const int64_t> tokens, std::vector<char>* buf) {
  const size_t isz = token_dtype_size(t);
  buf->resize(tokens.size() * isz);
  auto run = [&](auto tag) -> std::string {
    using T = decltype(tag);
    for (size_t j = 0; j < tokens.size(); ++j) {
      const int64_t v = tokens[j];
      bool fits;
      if constexpr (std::is_floating_point_v<T>)
        fits = std::abs(double(v)) <= double(int64_t(1) << std::numeric_limits<T>::digits);  // exact
      else
        fits = v >= int64_t(std::numeric_limits<T>::min()) &&
               (std::is_same_v<T, int64_t> || v <= int64_t(std::numeric_limits<T>::max()));
      if (!fits) return fmt::format("token {} has value {}, which {} cannot hold", j, v, token_dtype_name(t));
      const T x = T(v);
      std::memcpy(buf->data() + j * sizeof(T), &x, sizeof(T));
    }
    return "";
  };
  switch (t) {
    case TokenDType::u8: return run(uint8_t{});
    case TokenDType::i8: return run(int8_t{});
    case TokenDType::i16: return run(int16_t{});
    case TokenDType::i32: return run(int32_t{});
    case TokenDType::i64: return run(int64_t{});
    case TokenDType::f64: return run(double{});
    case TokenDType::f32: return run(float{});
    case TokenDType::u16: return run(uint16_t{});
  }
  return "unknown dtype";
}

std::string write_all(std::FILE* f, const void* p, size_t n, const std::string& path) {
  if (n && std::fwrite(p, 1, n, f) != n) return fmt::format("cannot write {}: {}", path, std::strerror(errno));
  return "";
}

}  // namespace

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (bin_) std::fclose(bin_);
}

std::string IndexedDatasetWriter::open(const std::string& prefix, TokenDType dtype) {
  DT_CHECK(!bin_, "IndexedDatasetWriter::open: {} is already open", prefix_);
  if (!token_dtype_valid(uint8_t(dtype))) return fmt::format("indexed dataset writer: unknown dtype code {}", int(dtype));
  prefix_ = prefix;
  dtype_ = dtype;
  // The prefix's directory is made as needed (mkdir -p), as the checkpoint and metrics writers do.
  const std::filesystem::path dir = std::filesystem::path(prefix).parent_path();
  std::error_code ec;
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  if (ec) return fmt::format("indexed dataset writer: cannot create directory {}: {}", dir.string(), ec.message());
  bin_ = std::fopen((prefix + ".bin").c_str(), "wb");
  if (!bin_) return fmt::format("indexed dataset writer: cannot create {}.bin: {}", prefix, std::strerror(errno));
  bytes_ = 0;
  lengths_.clear();
  pointers_.clear();
  doc_idx_.assign(1, 0);
  return "";
}

std::string IndexedDatasetWriter::add_sequence(std::span<const int64_t> tokens) {
  DT_CHECK(bin_, "IndexedDatasetWriter::add_sequence before open");
  DT_CHECK(tokens.size() <= size_t(INT32_MAX), "{}.bin: a sequence of {} tokens exceeds the int32 length field",
           prefix_, tokens.size());
  std::string err = encode_tokens(dtype_, tokens, &buf_);
  if (!err.empty()) return fmt::format("indexed dataset writer: {}.bin, sequence {}: {}", prefix_, lengths_.size(), err);
  err = write_all(bin_, buf_.data(), buf_.size(), prefix_ + ".bin");
  if (!err.empty()) return "indexed dataset writer: " + err;
  pointers_.push_back(bytes_);
  lengths_.push_back(int32_t(tokens.size()));
  bytes_ += int64_t(buf_.size());
  return "";
}

void IndexedDatasetWriter::end_document() { doc_idx_.push_back(int64_t(lengths_.size())); }

std::string IndexedDatasetWriter::add_document(std::span<const int64_t> tokens) {
  std::string err = add_sequence(tokens);
  if (err.empty()) end_document();
  return err;
}

std::string IndexedDatasetWriter::finish() {
  DT_CHECK(bin_, "IndexedDatasetWriter::finish before open");
  const bool closed_ok = std::fclose(bin_) == 0;
  bin_ = nullptr;
  if (!closed_ok) return fmt::format("indexed dataset writer: cannot close {}.bin: {}", prefix_, std::strerror(errno));
  if (doc_idx_.back() != int64_t(lengths_.size())) end_document();  // sequences after the last end_document
  const std::string ip = prefix_ + ".idx";
  std::FILE* f = std::fopen(ip.c_str(), "wb");
  if (!f) return fmt::format("indexed dataset writer: cannot create {}: {}", ip, std::strerror(errno));
  const uint64_t version = kMmidIdxVersion, S = lengths_.size(), Dc = doc_idx_.size();
  const uint8_t code = uint8_t(dtype_);
  std::string err = write_all(f, kMmidIdxMagic, 9, ip);
  if (err.empty()) err = write_all(f, &version, 8, ip);
  if (err.empty()) err = write_all(f, &code, 1, ip);
  if (err.empty()) err = write_all(f, &S, 8, ip);
  if (err.empty()) err = write_all(f, &Dc, 8, ip);
  if (err.empty()) err = write_all(f, lengths_.data(), lengths_.size() * 4, ip);
  if (err.empty()) err = write_all(f, pointers_.data(), pointers_.size() * 8, ip);
  if (err.empty()) err = write_all(f, doc_idx_.data(), doc_idx_.size() * 8, ip);
  if (std::fclose(f) != 0 && err.empty()) err = fmt::format("cannot close {}: {}", ip, std::strerror(errno));
  return err.empty() ? "" : "indexed dataset writer: " + err;
}

std::string write_plain_dataset(const std::string& tokens_path, const std::string& offsets_path, TokenDType dtype,
                                const std::vector<std::vector<int64_t>>& docs) {
  if (dtype != TokenDType::u16 && dtype != TokenDType::i32)
    return fmt::format("plain dataset writer: dtype {} is not supported; use uint16 or int32", token_dtype_name(dtype));
  std::FILE* f = std::fopen(tokens_path.c_str(), "wb");
  if (!f) return fmt::format("plain dataset writer: cannot create {}: {}", tokens_path, std::strerror(errno));
  std::vector<int64_t> offsets{0};
  std::vector<char> buf;
  std::string err;
  for (size_t d = 0; d < docs.size() && err.empty(); ++d) {
    err = encode_tokens(dtype, docs[d], &buf);
    if (!err.empty()) err = fmt::format("{}, document {}: {}", tokens_path, d, err);
    if (err.empty()) err = write_all(f, buf.data(), buf.size(), tokens_path);
    offsets.push_back(offsets.back() + int64_t(docs[d].size()));
  }
  if (std::fclose(f) != 0 && err.empty()) err = fmt::format("cannot close {}: {}", tokens_path, std::strerror(errno));
  if (!err.empty()) return "plain dataset writer: " + err;
  f = std::fopen(offsets_path.c_str(), "wb");
  if (!f) return fmt::format("plain dataset writer: cannot create {}: {}", offsets_path, std::strerror(errno));
  err = write_all(f, offsets.data(), offsets.size() * 8, offsets_path);
  if (std::fclose(f) != 0 && err.empty()) err = fmt::format("cannot close {}: {}", offsets_path, std::strerror(errno));
  return err.empty() ? "" : "plain dataset writer: " + err;
}

}  // namespace dt::data
