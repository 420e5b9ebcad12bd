// Deterministic first-fit packer, per-rank views and the resumable loader
// (include/deltatron/data/packer.h, docs/data.md). Plans are computed from document lengths
// only; tokens are read when a micro-batch is built.
#include "deltatron/data/packer.h"

#include <algorithm>
#include <numeric>

#include "deltatron/core/check.h"
#include "deltatron/core/rng.h"
#include "deltatron/core/tensor.h"

namespace dt::data {

namespace {

constexpr uint64_t kShuffleStreamTag = 0x5348554600000000ull;  // "SHUF": keeps shuffle draws apart

uint64_t fnv1a(uint64_t h, uint64_t v) {
  for (int b = 0; b < 8; ++b) {
    h ^= (v >> (8 * b)) & 0xffu;
    h *= 1099511628211ull;
  }
  return h;
}

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Leftmost-fit over bins: a max segment tree of remaining capacities. Bins not yet opened hold
// the full capacity, so "the leftmost bin with room" is first-fit, opening a new bin when no
// open one fits.
class FirstFit {
 public:
  FirstFit(int64_t max_bins, int64_t capacity) {
    n_ = 1;
    while (n_ < std::max<int64_t>(max_bins, 1)) n_ *= 2;
    t_.assign(size_t(2 * n_), capacity);
  }
  // Index of the leftmost bin with capacity >= need; takes `need` from it.
  int64_t place(int64_t need) {
    DT_CHECK(t_[1] >= need, "first-fit: no bin has room for {} tokens (internal: too few bins)", need);
    int64_t i = 1;
    while (i < n_) i = t_[size_t(2 * i)] >= need ? 2 * i : 2 * i + 1;
    const int64_t bin = i - n_;
    t_[size_t(i)] -= need;
    for (i /= 2; i >= 1; i /= 2) t_[size_t(i)] = std::max(t_[size_t(2 * i)], t_[size_t(2 * i + 1)]);
    return bin;
  }

 private:
  int64_t n_;
  std::vector<int64_t> t_;
};

}  // namespace

int64_t packer_pad_multiple(const PackerConfig& c) {
  if (c.pad_multiple > 0) return c.pad_multiple;
  return c.cp > 1 ? 2 * int64_t(c.cp) : 1;
}

int64_t packer_alignment(const PackerConfig& c) {
  if (c.cp > 1) return int64_t(c.cp) * std::lcm(int64_t(2), int64_t(c.sp));
  return c.sp;
}

std::string validate_packer_config(const PackerConfig& c) {
  if (c.sp < 1 || c.cp < 1 || c.dp < 1)
    return fmt::format("data: packer needs sp={}, cp={} and dp={} all >= 1", c.sp, c.cp, c.dp);
  if (c.max_tokens < 1) return fmt::format("data: data.max_tokens={} must be >= 1", c.max_tokens);
  if (c.pad_multiple < 0) return fmt::format("data: data.pad_multiple={} must be >= 0 (0: the default)", c.pad_multiple);
  if (c.max_tokens > INT32_MAX) return fmt::format("data: data.max_tokens={} exceeds the int32 range", c.max_tokens);
  if (c.pad_multiple > c.max_tokens)  // (and keeps the lcm below in range)
    return fmt::format("data: data.pad_multiple={} exceeds data.max_tokens={}: a padded piece must fit a micro-batch",
                       c.pad_multiple, c.max_tokens);
  const int64_t pm = packer_pad_multiple(c), A = packer_alignment(c);
  if (c.cp > 1 && pm % (2 * int64_t(c.cp)) != 0)  // C3
    return fmt::format("config: data.pad_multiple={} must be a multiple of 2*parallel.cp={}", pm, 2 * c.cp);
  const int64_t m = std::lcm(pm, A);
  if (c.max_tokens % m != 0)
    return fmt::format(
        "data: data.max_tokens={} must be a multiple of lcm(data.pad_multiple={}, pack alignment {})={} (alignment: "
        "{}); next valid value {}",
        c.max_tokens, pm, A, m, c.cp > 1 ? fmt::format("cp*lcm(2, sp) with cp={} sp={}", c.cp, c.sp)
                                          : fmt::format("sp={}", c.sp),
        round_up(c.max_tokens, m));
  return "";
}

std::vector<int64_t> document_order(int64_t num_docs, const PackerConfig& c, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(num_docs));
  std::iota(order.begin(), order.end(), int64_t(0));
  if (!c.shuffle) return order;
  // Fisher-Yates from the back; draw i is uniform in [0, i] from a 64-bit Philox value.
  const uint64_t stream = kShuffleStreamTag | uint64_t(epoch);
  for (int64_t i = num_docs - 1; i > 0; --i) {
    const Philox4 r = rng_draw(c.seed, stream, uint64_t(i));
    const uint64_t x = (uint64_t(r.v[0]) << 32) | r.v[1];
    const int64_t j = int64_t((unsigned __int128)x * uint64_t(i + 1) >> 64);
    std::swap(order[size_t(i)], order[size_t(j)]);
  }
  return order;
}

std::vector<std::vector<DocPiece>> plan_epoch(std::span<const int64_t> lengths, const PackerConfig& c, int64_t epoch) {
  const std::string err = validate_packer_config(c);
  DT_CHECK(err.empty(), "{}", err);
  const int64_t M = c.max_tokens, pm = packer_pad_multiple(c);
  std::vector<DocPiece> items;
  for (int64_t d : document_order(int64_t(lengths.size()), c, epoch)) {
    const int64_t L = lengths[size_t(d)];
    if (L <= 0) continue;
    int64_t b = L % M;  // the short piece first, so later full pieces land in later micro-batches
    if (b) items.push_back({d, 0, b});
    for (; b < L; b += M) items.push_back({d, b, M});
  }
  FirstFit ff(int64_t(items.size()), M);
  std::vector<std::vector<DocPiece>> bins;
  for (const DocPiece& p : items) {
    const int64_t bin = ff.place(round_up(p.length, pm));
    if (bin >= int64_t(bins.size())) bins.resize(size_t(bin + 1));
    bins[size_t(bin)].push_back(p);
  }
  return bins;
}

int64_t MicroBatch::label_tokens() const {
  return int64_t(std::count_if(labels.begin(), labels.end(), [](int32_t l) { return l >= 0; }));
}

PackedBatchDesc MicroBatch::desc(int cp_rank) const {
  PackedBatchDesc d;
  d.cu_seqlens = cu_seqlens;
  d.cu_seqlens_padded = cu_seqlens_padded;
  d.sp = sp;
  d.cp = cp;
  d.cp_rank = cp_rank;
  d.tokens_local = tokens_total() / (int64_t(cp) * sp);
  return d;
}

MicroBatch build_micro_batch(const IndexedDataset& ds, const PackerConfig& c, std::span<const DocPiece> pieces,
                             int64_t epoch, int64_t index) {
  const int64_t pm = packer_pad_multiple(c), A = packer_alignment(c);
  MicroBatch mb;
  mb.epoch = epoch;
  mb.index = index;
  mb.sp = c.sp;
  mb.cp = c.cp;
  mb.pieces.assign(pieces.begin(), pieces.end());
  mb.cu_seqlens = {0};
  mb.cu_seqlens_padded = {0};
  for (const DocPiece& p : pieces) {
    mb.cu_seqlens.push_back(mb.cu_seqlens.back() + p.length);
    mb.cu_seqlens_padded.push_back(mb.cu_seqlens_padded.back() + round_up(p.length, pm));
  }
  const int64_t S = mb.cu_seqlens_padded.back();
  // C4: whole-pack alignment as an explicit zero-length segment (also the only one of a filler).
  const int64_t T = std::max(round_up(S, A), A);
  if (T > S || pieces.empty()) {
    mb.cu_seqlens.push_back(mb.cu_seqlens.back());
    mb.cu_seqlens_padded.push_back(T);
  }
  DT_CHECK(T <= c.max_tokens || pieces.empty(), "packer: micro-batch {} has {} tokens > data.max_tokens={}", index, T,
           c.max_tokens);
  mb.tokens.assign(size_t(T), c.pad_id);
  mb.labels.assign(size_t(T), kIgnoreLabel);
  std::vector<int32_t> buf;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const DocPiece& p = pieces[i];
    const int64_t doc_len = ds.document_length(p.doc);
    const int64_t n = std::min(p.length + 1, doc_len - p.begin);  // one more token for the last label
    buf.resize(size_t(n));
    ds.read_document(p.doc, p.begin, n, buf.data());
    const int64_t x0 = mb.cu_seqlens_padded[i];
    std::copy(buf.begin(), buf.begin() + p.length, mb.tokens.begin() + x0);
    std::copy(buf.begin() + 1, buf.end(), mb.labels.begin() + x0);
  }
  return mb;
}

RankBatch rank_view(const MicroBatch& mb, int sp_rank, int cp_rank) {
  const int sp = mb.sp, cp = mb.cp;
  DT_CHECK(sp_rank >= 0 && sp_rank < sp && cp_rank >= 0 && cp_rank < cp,
           "rank_view: sp_rank={} / cp_rank={} outside sp={} / cp={}", sp_rank, cp_rank, sp, cp);
  RankBatch rb;
  rb.desc = mb.desc(cp_rank);
  const int64_t T = mb.tokens_total(), Tcp = T / cp, Tl = Tcp / sp;
  const std::vector<int32_t> cu(mb.cu_seqlens_padded.begin(), mb.cu_seqlens_padded.end());
  auto slice = [&](const std::vector<int32_t>& g, std::vector<int32_t>* out) {
    out->assign(size_t(Tcp), 0);
    const TensorView gv(const_cast<int32_t*>(g.data()), DType::i32, Device::cpu(), Shape{T});
    const TensorView lv(out->data(), DType::i32, Device::cpu(), Shape{Tcp});
    zigzag_slice_rows(lv, gv, cu, cp, cp_rank);
  };
  slice(mb.tokens, &rb.tokens_cp);
  slice(mb.labels, &rb.labels_cp);
  rb.tokens_local.assign(rb.tokens_cp.begin() + sp_rank * Tl, rb.tokens_cp.begin() + (sp_rank + 1) * Tl);
  rb.labels_local.assign(rb.labels_cp.begin() + sp_rank * Tl, rb.labels_cp.begin() + (sp_rank + 1) * Tl);
  return rb;
}

// ---- loader position ----------------------------------------------------------------------

std::string LoaderPosition::to_string() const {
  return fmt::format("deltatron-loader v1 epoch={} step={} fingerprint={:016x}", epoch, step, fingerprint);
}

std::string LoaderPosition::parse(const std::string& s, LoaderPosition* out) {
  long long e = -1, st = -1;
  unsigned long long fp = 0;
  int used = 0;
  if (std::sscanf(s.c_str(), "deltatron-loader v1 epoch=%lld step=%lld fingerprint=%16llx%n", &e, &st, &fp, &used) !=
          3 ||
      used != int(s.size()) || e < 0 || st < 0)
    return fmt::format(
        "loader position: cannot parse '{}'; expected 'deltatron-loader v1 epoch=<e> step=<s> fingerprint=<16 hex>'",
        s);
  *out = LoaderPosition{int64_t(e), int64_t(st), uint64_t(fp)};
  return "";
}

// ---- loader -------------------------------------------------------------------------------

PackedLoader::PackedLoader(const IndexedDataset& ds, const PackerConfig& c, int dp_rank)
    : ds_(&ds), c_(c), dp_rank_(dp_rank) {
  std::string err = validate_packer_config(c);
  if (err.empty() && (dp_rank < 0 || dp_rank >= c.dp))
    err = fmt::format("data: dp_rank={} is outside [0, dp={})", dp_rank, c.dp);
  if (err.empty() && ds.num_tokens() == 0) err = fmt::format("data: dataset {} has no tokens", ds.name());
  if (!err.empty()) user_error(err, true);
  lengths_.resize(size_t(ds.num_documents()));
  for (int64_t d = 0; d < ds.num_documents(); ++d) lengths_[size_t(d)] = ds.document_length(d);
  if (*std::max_element(lengths_.begin(), lengths_.end()) < 2)  // (num_tokens > 0: not empty)
    user_error(fmt::format("data: dataset {} has no document of 2 or more tokens, so no token has a next-token "
                           "target (nothing to train on or evaluate)",
                           ds.name()),
               true);
  uint64_t h = 1469598103934665603ull;  // FNV-1a over everything the plan depends on
  for (uint64_t v : {uint64_t(c.max_tokens), uint64_t(packer_pad_multiple(c)), uint64_t(c.shuffle), c.seed,
                     uint64_t(uint32_t(c.pad_id)), uint64_t(c.sp), uint64_t(c.cp), uint64_t(c.dp),
                     uint64_t(ds.num_documents()), uint64_t(ds.num_tokens())})
    h = fnv1a(h, v);
  for (int64_t L : lengths_) h = fnv1a(h, uint64_t(L));
  fingerprint_ = h;
}

void PackedLoader::ensure_plan() {
  if (plan_epoch_ == epoch_) return;
  plan_ = plan_epoch(lengths_, c_, epoch_);
  plan_epoch_ = epoch_;
}

int64_t PackedLoader::micro_batches_in_epoch() {
  ensure_plan();
  return int64_t(plan_.size());
}

int64_t PackedLoader::steps_in_epoch() {
  ensure_plan();
  return (int64_t(plan_.size()) + c_.dp - 1) / c_.dp;
}

MicroBatch PackedLoader::next() {
  if (step_ >= steps_in_epoch()) {
    ++epoch_;
    step_ = 0;
    ensure_plan();
  }
  const int64_t g = step_ * c_.dp + dp_rank_;
  ++step_;
  if (g < int64_t(plan_.size())) return build_micro_batch(*ds_, c_, plan_[size_t(g)], epoch_, g);
  return build_micro_batch(*ds_, c_, {}, epoch_, g);  // dp filler: no real token
}

LoaderPosition PackedLoader::position() const { return {epoch_, step_, fingerprint_}; }

std::string PackedLoader::seek(const LoaderPosition& p) {
  if (p.fingerprint != fingerprint_)
    return fmt::format(
        "loader position: fingerprint {:016x} does not match this loader's {:016x}: the data config (max_tokens, "
        "pad_multiple, shuffle, seed, pad_id, sp, cp, dp) or the dataset {} changed since it was saved",
        p.fingerprint, fingerprint_, ds_->name());
  if (p.epoch < 0 || p.step < 0) return fmt::format("loader position: epoch={} step={} must be >= 0", p.epoch, p.step);
  const int64_t old_epoch = epoch_;
  epoch_ = p.epoch;
  const int64_t steps = steps_in_epoch();
  if (p.step > steps) {
    epoch_ = old_epoch;
    return fmt::format("loader position: step={} is past the {} steps of epoch {}", p.step, steps, p.epoch);
  }
  step_ = p.step;
  return "";
}

}  // namespace dt::data
