// Token datasets on disk (docs/data.md):
//   * Megatron's indexed dataset, PREFIX.bin + PREFIX.idx ("MMIDIDX", version 1), as written by
//     Megatron-LM's tools/preprocess_data.py: the .bin holds the token ids of every sequence,
//     back to back, in one dtype; the .idx holds the header, the sequence lengths (int32), the
//     byte pointers of the sequences into the .bin (int64) and the document indices (int64,
//     [D+1], the sequence range [doc[d], doc[d+1]) of document d). Any of the 8 dtype codes.
//   * A plain format: a raw little-endian token file (uint16 or int32, stated by the caller)
//     and a document offsets file of int64 [D+1] token offsets.
// Both are memory-mapped read-only; a document is the concatenation of its sequences. Token
// ids come out as int32. Every open error names the file, the field and the values.
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace dt::data {

// Megatron's dtype codes (megatron/core/datasets/indexed_dataset.py, class DType).
enum class TokenDType : uint8_t { u8 = 1, i8 = 2, i16 = 3, i32 = 4, i64 = 5, f64 = 6, f32 = 7, u16 = 8 };
bool token_dtype_valid(uint8_t code);    // 1..8
size_t token_dtype_size(TokenDType t);   // bytes per token
const char* token_dtype_name(TokenDType t);  // "uint8", "int8", ..., "uint16" (numpy names)
// "uint16" / "int32" / ... -> dtype; false when unknown.
bool parse_token_dtype(const std::string& name, TokenDType* out);

inline constexpr char kMmidIdxMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr uint64_t kMmidIdxVersion = 1;
inline constexpr size_t kMmidIdxHeaderBytes = 9 + 8 + 1 + 8 + 8;  // magic, version, code, #seq, #doc

class IndexedDataset {
 public:
  IndexedDataset();
  ~IndexedDataset();
  IndexedDataset(IndexedDataset&&) noexcept;
  IndexedDataset& operator=(IndexedDataset&&) noexcept;
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  // Megatron PREFIX.bin + PREFIX.idx. "" on success, else the error (file, field, values).
  static std::string open(const std::string& prefix, IndexedDataset* out);
  // Plain format: `tokens_path` raw tokens of dtype `dtype` (u16 or i32), `offsets_path`
  // int64 [D+1] token offsets (0 first, non-decreasing, last = number of tokens).
  static std::string open_plain(const std::string& tokens_path, const std::string& offsets_path, TokenDType dtype,
                                IndexedDataset* out);
  // The same, aborting through dt::user_error (every rank opens the same files).
  static IndexedDataset open_or_die(const std::string& prefix);
  static IndexedDataset open_plain_or_die(const std::string& tokens_path, const std::string& offsets_path,
                                          TokenDType dtype);

  const std::string& name() const;  // the prefix, or the token file of a plain dataset
  TokenDType dtype() const;
  int64_t num_sequences() const;
  int64_t num_documents() const;
  int64_t num_tokens() const;  // sum of every sequence length

  int64_t sequence_length(int64_t i) const;
  int64_t sequence_pointer(int64_t i) const;  // byte offset into the token file
  int64_t document_index(int64_t d) const;    // d in [0, D]: first sequence of document d
  int64_t document_length(int64_t d) const;   // tokens of document d (all its sequences)

  // out[0, count) (=) tokens [begin, begin+count) of document d, as int32. Aborts (DT_CHECK)
  // on an out-of-range request; a token value that is not an integer in [0, 2^31) aborts with
  // a user error naming the file, the sequence and the value.
  void read_document(int64_t d, int64_t begin, int64_t count, int32_t* out) const;
  std::vector<int32_t> document(int64_t d) const;
  std::vector<int32_t> sequence(int64_t i) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
};

// Writes PREFIX.bin and PREFIX.idx in Megatron's layout (one dtype for every token).
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter() = default;
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // "" on success; the .bin is created (truncated) here, the .idx in finish().
  std::string open(const std::string& prefix, TokenDType dtype);
  // Appends one sequence to the current document. "" on success; a value not representable in
  // the dtype is an error naming it.
  std::string add_sequence(std::span<const int64_t> tokens);
  // Closes the current document (its sequences since the last end_document).
  void end_document();
  // A one-sequence document: add_sequence + end_document.
  std::string add_document(std::span<const int64_t> tokens);
  // Writes the .idx and closes the .bin. "" on success.
  std::string finish();

 private:
  std::string prefix_;
  TokenDType dtype_ = TokenDType::i32;
  std::FILE* bin_ = nullptr;
  int64_t bytes_ = 0;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> pointers_;
  std::vector<int64_t> doc_idx_{0};
  std::vector<char> buf_;
};

// Writes the plain format: tokens of every document back to back (dtype u16 or i32) and the
// int64 [D+1] offsets. "" on success.
std::string write_plain_dataset(const std::string& tokens_path, const std::string& offsets_path, TokenDType dtype,
                                const std::vector<std::vector<int64_t>>& docs);

}  // namespace dt::data
