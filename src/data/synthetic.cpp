// Synthetic copy / sort / add corpus (include/deltatron/data/synthetic.h, docs/data.md).
// Each document draws from its own Philox stream, so generation is order-independent.
#include "deltatron/data/synthetic.h"

#include <algorithm>

#include "deltatron/core/check.h"
#include "deltatron/core/rng.h"
#include "deltatron/data/indexed_dataset.h"

namespace dt::data {

namespace {

// Keeps synthetic draws apart from every other Philox user of the same seed.
constexpr uint64_t kSynthStreamTag = 0x53594e5400000000ull;  // "SYNT"

// Sequential integer draws from the stream of one document.
struct DocRng {
  uint64_t seed, stream, counter = 0;
  // Uniform in [0, n), n >= 1 (multiply-shift; the bias is below 2^-32 * n).
  int64_t below(int64_t n) {
    const uint32_t x = rng_draw(seed, stream, counter++).v[0];
    return int64_t((uint64_t(x) * uint64_t(n)) >> 32);
  }
  int64_t in(int64_t lo, int64_t hi) { return lo + below(hi - lo + 1); }  // [lo, hi]
};

// Digit strings, least significant first, base B: out = a + b.
std::vector<int32_t> add_digits(const std::vector<int32_t>& a, const std::vector<int32_t>& b, int32_t B) {
  std::vector<int32_t> s;
  int32_t carry = 0;
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const int32_t v = (i < a.size() ? a[i] : 0) + (i < b.size() ? b[i] : 0) + carry;
    s.push_back(v % B);
    carry = v / B;
  }
  if (carry) s.push_back(carry);
  return s;
}

}  // namespace

std::string validate_synthetic_config(const SyntheticConfig& c) {
  if (c.num_docs < 0) return fmt::format("synthetic: num_docs={} must be >= 0", c.num_docs);
  if (c.vocab_size < 10 || c.vocab_size > INT32_MAX)
    return fmt::format("synthetic: vocab_size={} must be in [10, 2^31) (8 special tokens and at least 2 symbols)",
                       c.vocab_size);
  if (c.min_len < 1 || c.max_len < c.min_len)
    return fmt::format("synthetic: need 1 <= min_len <= max_len, got min_len={} max_len={}", c.min_len, c.max_len);
  if (c.max_len > (int64_t(1) << 28)) return fmt::format("synthetic: max_len={} is too large", c.max_len);
  if ((c.tasks & synth::kAllTasks) == 0 || (c.tasks & ~synth::kAllTasks) != 0)
    return fmt::format("synthetic: tasks={:#x} must be a non-empty subset of copy 1 | sort 2 | add 4", c.tasks);
  return "";
}

std::vector<int32_t> synthetic_document(const SyntheticConfig& c, int64_t d) {
  const std::string err = validate_synthetic_config(c);
  DT_CHECK(err.empty(), "{}", err);
  DT_CHECK(d >= 0 && d < c.num_docs, "synthetic_document: document {} is outside [0, num_docs={})", d, c.num_docs);
  DocRng rng{c.seed, kSynthStreamTag | uint64_t(d)};
  const int32_t B = int32_t(c.vocab_size - synth::kFirstSymbol);
  unsigned enabled[3];
  int ne = 0;
  for (unsigned t : {synth::kTaskCopy, synth::kTaskSort, synth::kTaskAdd})
    if (c.tasks & t) enabled[ne++] = t;
  const unsigned task = enabled[rng.below(ne)];
  auto digits = [&](int64_t n) {
    std::vector<int32_t> x(static_cast<size_t>(n));
    for (auto& v : x) v = int32_t(rng.below(B));
    return x;
  };
  auto emit = [](std::vector<int32_t>& out, const std::vector<int32_t>& x) {
    for (int32_t v : x) out.push_back(synth::kFirstSymbol + v);
  };
  std::vector<int32_t> doc{synth::kBos};
  if (task == synth::kTaskAdd) {
    const std::vector<int32_t> a = digits(rng.in(c.min_len, c.max_len)), b = digits(rng.in(c.min_len, c.max_len));
    doc.push_back(synth::kAdd);
    emit(doc, a);
    doc.push_back(synth::kPlus);
    emit(doc, b);
    doc.push_back(synth::kSep);
    emit(doc, add_digits(a, b, B));
  } else {
    std::vector<int32_t> x = digits(rng.in(c.min_len, c.max_len));
    doc.push_back(task == synth::kTaskCopy ? synth::kCopy : synth::kSort);
    emit(doc, x);
    doc.push_back(synth::kSep);
    if (task == synth::kTaskSort) std::sort(x.begin(), x.end());
    emit(doc, x);
  }
  doc.push_back(synth::kEos);
  return doc;
}

std::string write_synthetic_corpus(const SyntheticConfig& c, const std::string& prefix) {
  std::string err = validate_synthetic_config(c);
  if (!err.empty()) return err;
  IndexedDatasetWriter w;
  err = w.open(prefix, c.vocab_size <= 65536 ? TokenDType::u16 : TokenDType::i32);
  std::vector<int64_t> doc64;
  for (int64_t d = 0; d < c.num_docs && err.empty(); ++d) {
    const std::vector<int32_t> doc = synthetic_document(c, d);
    doc64.assign(doc.begin(), doc.end());
    err = w.add_document(doc64);
  }
  if (err.empty()) err = w.finish();
  return err;
}

std::string write_synthetic_corpus(const std::string& prefix, int64_t num_docs, uint64_t seed, int64_t vocab_size) {
  SyntheticConfig c;
  c.num_docs = num_docs;
  c.seed = seed;
  c.vocab_size = vocab_size;
  return write_synthetic_corpus(c, prefix);
}

std::string check_synthetic_document(std::span<const int32_t> doc, int64_t V) {
  const int64_t n = int64_t(doc.size());
  if (n < 5) return fmt::format("document has {} tokens, fewer than the 5 of the shortest form", n);
  if (doc[0] != synth::kBos) return fmt::format("token 0 is {}, expected BOS={}", doc[0], synth::kBos);
  if (doc[size_t(n - 1)] != synth::kEos) return fmt::format("last token is {}, expected EOS={}", doc[size_t(n - 1)], synth::kEos);
  const int32_t task = doc[1];
  const int32_t B = int32_t(V - synth::kFirstSymbol);
  auto is_sym = [&](int32_t t) { return t >= synth::kFirstSymbol && t < V; };
  // Symbol runs: [begin, end) positions up to the next non-symbol.
  auto run_end = [&](int64_t i) {
    while (i < n && is_sym(doc[size_t(i)])) ++i;
    return i;
  };
  auto vals = [&](int64_t b, int64_t e) {
    std::vector<int32_t> x;
    for (int64_t i = b; i < e; ++i) x.push_back(doc[size_t(i)] - synth::kFirstSymbol);
    return x;
  };
  if (task == synth::kCopy || task == synth::kSort) {
    const int64_t e1 = run_end(2);
    if (e1 == 2 || e1 >= n || doc[size_t(e1)] != synth::kSep)
      return fmt::format("expected a non-empty symbol string then SEP={} after the task token, got token {} at {}",
                         synth::kSep, e1 < n ? doc[size_t(e1)] : -1, e1);
    const int64_t e2 = run_end(e1 + 1);
    if (e2 != n - 1) return fmt::format("unexpected token {} at {} in the answer", doc[size_t(e2)], e2);
    std::vector<int32_t> want = vals(2, e1);
    if (task == synth::kSort) std::sort(want.begin(), want.end());
    if (vals(e1 + 1, e2) != want) return fmt::format("the answer at [{}, {}) is not the {} of the input", e1 + 1, e2,
                                                     task == synth::kCopy ? "copy" : "sorted copy");
    return "";
  }
  if (task == synth::kAdd) {
    const int64_t e1 = run_end(2);
    if (e1 == 2 || e1 >= n || doc[size_t(e1)] != synth::kPlus)
      return fmt::format("add: expected digits then PLUS={} at {}", synth::kPlus, e1);
    const int64_t e2 = run_end(e1 + 1);
    if (e2 == e1 + 1 || e2 >= n || doc[size_t(e2)] != synth::kSep)
      return fmt::format("add: expected digits then SEP={} at {}", synth::kSep, e2);
    const int64_t e3 = run_end(e2 + 1);
    if (e3 != n - 1) return fmt::format("add: unexpected token {} at {} in the answer", doc[size_t(e3)], e3);
    if (vals(e2 + 1, e3) != add_digits(vals(2, e1), vals(e1 + 1, e2), B))
      return fmt::format("add: the answer at [{}, {}) is not the sum", e2 + 1, e3);
    return "";
  }
  return fmt::format("token 1 is {}, not a task token (COPY={}, SORT={}, ADD={})", task, synth::kCopy, synth::kSort,
                     synth::kAdd);
}

}  // namespace dt::data
