// Synthetic quickstart corpus (docs/data.md, "Synthetic corpus"): variable-length documents
// with learnable structure over a small vocabulary, deterministic for a seed. Document d
// depends only on (seed, d, config): its draws come from the Philox stream of d, so any
// document can be regenerated alone and the corpus does not depend on generation order.
//
// Vocabulary (vocab_size V >= 10): 0 PAD, 1 BOS, 2 EOS, 3 SEP, 4 COPY, 5 SORT, 6 ADD, 7 PLUS,
// symbols 8 .. V-1 (B = V - 8 of them; symbol s stands for the digit s - 8 in base B).
//   copy: BOS COPY x_1 .. x_n SEP x_1 .. x_n EOS
//   sort: BOS SORT x_1 .. x_n SEP sorted(x) EOS                    (ascending)
//   add : BOS ADD a PLUS b SEP (a + b) EOS                          (base-B numbers, least
//         significant digit first; a and b have 1..n digits each; the sum has no extra 0 digit)
// n is uniform in [min_len, max_len]; the task is uniform over the enabled ones.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dt::data {

namespace synth {
inline constexpr int32_t kPad = 0, kBos = 1, kEos = 2, kSep = 3, kCopy = 4, kSort = 5, kAdd = 6, kPlus = 7;
inline constexpr int32_t kFirstSymbol = 8;
inline constexpr unsigned kTaskCopy = 1, kTaskSort = 2, kTaskAdd = 4, kAllTasks = 7;
}  // namespace synth

struct SyntheticConfig {
  int64_t num_docs = 1000;
  uint64_t seed = 1234;
  int64_t vocab_size = 32;  // V >= 10
  int64_t min_len = 1;      // n: the length of the random string (copy, sort) or the digit count bound (add)
  int64_t max_len = 48;
  unsigned tasks = synth::kAllTasks;  // bitmask of synth::kTask*
};

// "" when valid, else the field, its value and the rule.
std::string validate_synthetic_config(const SyntheticConfig& c);

// Document d (0 <= d < num_docs) as token ids.
std::vector<int32_t> synthetic_document(const SyntheticConfig& c, int64_t d);

// Writes PREFIX.bin/.idx (uint16 tokens when V <= 65536, else int32), one sequence per
// document. "" on success.
std::string write_synthetic_corpus(const SyntheticConfig& c, const std::string& prefix);
// The CLI form: defaults for everything else.
std::string write_synthetic_corpus(const std::string& prefix, int64_t num_docs, uint64_t seed, int64_t vocab_size);

// "" when `doc` is a well-formed synthetic document of vocabulary V (the answer after SEP is
// correct for its task), else what is wrong and where.
std::string check_synthetic_document(std::span<const int32_t> doc, int64_t vocab_size);

}  // namespace dt::data
