// Deterministic packing of documents into THD micro-batches (docs/data.md, "Packing";
// shared/docs/thd-context-parallel.md sections 1-3 and rule C4).
//
//   1. Document order: a Philox Fisher-Yates shuffle keyed by (seed, epoch), or dataset
//      order when data.shuffle is off. Empty documents are skipped.
//   2. Pieces: a document longer than data.max_tokens is split into a first piece of
//      len % max_tokens tokens (when non-zero) and then pieces of exactly max_tokens. Each
//      piece is one sequence (the recurrence restarts at its start).
//   3. First-fit: pieces, in order, go into the first micro-batch whose padded size still has
//      room (capacity max_tokens physical tokens). Full pieces fill a new micro-batch, so the
//      pieces of a document appear in increasing micro-batch order.
//   4. Padding: each piece is padded to a multiple of pad_multiple (data.pad_multiple; default
//      2*cp when cp > 1, else 1); the pack total to a multiple of the alignment
//      A = cp*lcm(2, sp) (cp > 1) or sp (cp = 1) with an explicit last segment of actual
//      length 0 (C4). max_tokens must be a multiple of lcm(pad_multiple, A), so T <= max_tokens.
//   5. DP: rank r takes global micro-batches r, r+dp, r+2dp, ... of the epoch. The epoch is
//      rounded up to a multiple of dp with empty micro-batches (one segment of A pad tokens,
//      no real token), so every DP rank runs the same number of steps.
// Labels: label[x] is the next token of the same document (across piece boundaries), and
// kIgnoreLabel on pads and on the last token of a document.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "deltatron/data/indexed_dataset.h"
#include "deltatron/data/packed_seq.h"

namespace dt::data {

inline constexpr int32_t kIgnoreLabel = -1;

struct PackerConfig {
  int64_t max_tokens = 4096;  // data.max_tokens: physical tokens per micro-batch, every pad included
  int64_t pad_multiple = 0;   // data.pad_multiple; 0 = default (2*cp when cp > 1, else 1)
  bool shuffle = true;        // data.shuffle
  uint64_t seed = 1234;       // train.seed (docs/config.md: data.shuffle is seeded by it)
  int32_t pad_id = 0;         // token id written on pads
  int sp = 1;                 // tp when sequence parallelism is on, else 1
  int cp = 1;
  int dp = 1;
};

// "" when valid, else the field, its value and the rule.
std::string validate_packer_config(const PackerConfig& c);
int64_t packer_pad_multiple(const PackerConfig& c);  // the effective data.pad_multiple
int64_t packer_alignment(const PackerConfig& c);     // A of rule C4

// One real sequence of a micro-batch: tokens [begin, begin+length) of document `doc`.
struct DocPiece {
  int64_t doc = 0, begin = 0, length = 0;
  bool operator==(const DocPiece&) const = default;
};

// The document order of an epoch: [num_docs] document ids.
std::vector<int64_t> document_order(int64_t num_docs, const PackerConfig& c, int64_t epoch);
// The packing plan of an epoch from the document lengths alone: global micro-batches, each
// its pieces in layout order (before the dp rounding: no empty micro-batches).
std::vector<std::vector<DocPiece>> plan_epoch(std::span<const int64_t> doc_lengths, const PackerConfig& c,
                                              int64_t epoch);

struct MicroBatch {
  int64_t epoch = 0, index = 0;       // global micro-batch index within the epoch
  std::vector<DocPiece> pieces;       // the real sequences, in layout order (empty: a dp filler)
  std::vector<int32_t> tokens;        // [T] token ids, pad_id on pads
  std::vector<int32_t> labels;        // [T] next token of the document, or kIgnoreLabel
  std::vector<int64_t> cu_seqlens;         // [N+1] actual; N = pieces (+1 alignment segment)
  std::vector<int64_t> cu_seqlens_padded;  // [N+1] physical; [N] == T
  int sp = 1, cp = 1;

  int64_t tokens_total() const { return cu_seqlens_padded.empty() ? 0 : cu_seqlens_padded.back(); }  // T
  int64_t real_tokens() const { return cu_seqlens.empty() ? 0 : cu_seqlens.back(); }
  int64_t label_tokens() const;  // positions with a label (>= 0): the loss denominator
  // The description PackedSeqParams::build takes for CP rank `cp_rank`.
  PackedBatchDesc desc(int cp_rank = 0) const;
};

// Builds one micro-batch: reads the pieces' tokens, pads, builds both cu_seqlens.
MicroBatch build_micro_batch(const IndexedDataset& ds, const PackerConfig& c, std::span<const DocPiece> pieces,
                             int64_t epoch, int64_t index);

// What one (sp_rank, cp_rank) of a micro-batch holds.
struct RankBatch {
  PackedBatchDesc desc;                             // for PackedSeqParams::build
  std::vector<int32_t> tokens_cp, labels_cp;        // [T/cp] this CP rank's zig-zag rows
  std::vector<int32_t> tokens_local, labels_local;  // [T/(cp*sp)] rows [sp_rank*T_local, (sp_rank+1)*T_local) of those
};
RankBatch rank_view(const MicroBatch& mb, int sp_rank, int cp_rank);

// Resumable loader position; the same on every DP rank.
struct LoaderPosition {
  int64_t epoch = 0;
  int64_t step = 0;          // micro-batches each DP rank has taken in this epoch
  uint64_t fingerprint = 0;  // of the data config and the dataset; checked by seek()
  bool operator==(const LoaderPosition&) const = default;
  // "deltatron-loader v1 epoch=<e> step=<s> fingerprint=<hex>"
  std::string to_string() const;
  // "" on success, else what is wrong with `s`.
  static std::string parse(const std::string& s, LoaderPosition* out);
};

// This DP rank's stream of micro-batches, epoch after epoch.
class PackedLoader {
 public:
  // Validates the config (dt::user_error on a violation; every rank holds the same config).
  // `ds` must outlive the loader.
  PackedLoader(const IndexedDataset& ds, const PackerConfig& c, int dp_rank);

  MicroBatch next();
  LoaderPosition position() const;
  // "" on success; a position from another config, dataset or dp size is refused.
  std::string seek(const LoaderPosition& p);
  // Steps each DP rank takes in the current epoch: ceil(micro-batches / dp).
  int64_t steps_in_epoch();
  int64_t micro_batches_in_epoch();  // before the dp rounding
  uint64_t fingerprint() const { return fingerprint_; }

 private:
  void ensure_plan();
  const IndexedDataset* ds_;
  PackerConfig c_;
  int dp_rank_;
  std::vector<int64_t> lengths_;
  uint64_t fingerprint_ = 0;
  int64_t epoch_ = 0, step_ = 0, plan_epoch_ = -1;
  std::vector<std::vector<DocPiece>> plan_;
};

}  // namespace dt::data
