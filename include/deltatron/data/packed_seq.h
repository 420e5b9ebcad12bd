// Packed THD micro-batch metadata (shared/docs/thd-context-parallel.md sections 1-4): the
// validation rules V1-V8 and C1-C3, the zig-zag context-parallel layout, and PackedSeqParams,
// built once per micro-batch on the host and shared read-only by every layer.
//
// Conventions
//   * cu_seqlens (actual, real tokens) and cu_seqlens_padded (physical layout) are always both
//     present; kernels and the CP layout use the padded boundaries, loss and token counts the
//     actual ones. Whole-pack alignment padding is an explicit last segment of actual length 0.
//   * T = cu_seqlens_padded[N] is the global padded token count of the micro-batch (all CP
//     ranks together); every CP rank holds T/cp zig-zag rows; with sequence parallelism the
//     layer input holds T_local = T/(cp*sp) of them.
//   * Zig-zag (section 3): sequence i (padded length p_i, a multiple of 2*cp) is cut into 2*cp
//     pieces of h_i = p_i/(2*cp) tokens; CP rank r holds pieces r and 2cp-1-r of every
//     sequence, in that order, sequences concatenated. With cp = 1 the layout is the identity.
//   * SP split of the per-CP-rank arrays: the rows of a CP rank are split contiguously over
//     the TP group, TP rank t holding rows [t*T_local, (t+1)*T_local) (sp_rows()), exactly as
//     the SP scatter of the hidden states splits its first dim.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "deltatron/core/tensor.h"
#include "deltatron/dist/comm.h"
#include "deltatron/ops/cp_a2a.h"
#include "deltatron/ops/varlen.h"

namespace dt::data {

// ---- validation (section 2) --------------------------------------------------------------

// One micro-batch as the packer hands it over. The cumulative arrays are int64 here so that
// V8 (the int32 range) can be checked; PackedSeqParams keeps int32 copies.
struct PackedBatchDesc {
  std::vector<int64_t> cu_seqlens;         // [N+1] cumulative actual lengths
  std::vector<int64_t> cu_seqlens_padded;  // [N+1] cumulative physical lengths; [N] == T
  int64_t batch = 1;                       // batch dimension of the packed row (V1: must be 1)
  int64_t tokens_local = 0;                // T_local = T / (cp * sp): layer-input rows per rank
  int sp = 1;                              // tp when sequence parallelism is on, else 1
  int cp = 1;
  int cp_rank = 0;
};

// "" when valid; otherwise the first violation, with the message templates of section 2.2,
// checked in the order V1, (sp, cp, cp_rank, tokens_local >= 0), V2, V3, V4, V8, V5, V6, V7.
// Indices in the templates are filled in: "cu_seqlens decreases at i=2: cu_seqlens[2]=9,
// cu_seqlens[3]=4"; "cu_seqlens_padded[3]=24 but local tokens 10 × sp 1 × cp 2 = 20; ...".
std::string validate_packed_batch(const PackedBatchDesc& d);
// Aborts on a violation through dt::user_error. every_rank_knows = false (default): the
// batch may differ between DP ranks, so the detecting rank prints and MPI_Abort ends every
// rank; true: every rank holds the same batch, rank 0 prints and all ranks exit 1.
void validate_packed_batch_or_die(const PackedBatchDesc& d, bool every_rank_knows = false);

// Config-time rules C1-C3 (Hk, Hv: linear_num_key_heads / linear_num_value_heads; tp, cp:
// parallel sizes; pad_multiple: data.pad_multiple). "" when valid.
std::string validate_gdn_cp_config(int64_t num_key_heads, int64_t num_value_heads, int tp, int cp,
                                   int64_t pad_multiple);
// Aborts every rank (dt::user_error; the config is the same on every rank) on a violation.
void validate_gdn_cp_config_or_die(int64_t num_key_heads, int64_t num_value_heads, int tp, int cp,
                                   int64_t pad_multiple);

// Section 2.1: every rank of a TP x CP group holds the same metadata. Collective over `world`, a
// host (MPI) communicator of all ranks; group_of[r]: the TP x CP group of group rank r of `world`
// (e.g. its dp coordinate). "" when every rank's `checksum` (PackedSeqParams::checksum, or a
// combination of them over a step's micro-batches) equals that of the first rank of its group,
// else one message, the same on every rank (so that all can stop through user_error), naming the
// group, the ranks that differ and `where`.
std::string metadata_mismatch(dist::Communicator& world, uint64_t checksum, const std::vector<int>& group_of,
                              const std::string& where);

// ---- zig-zag maps (section 3.2), host only ------------------------------------------------
// cu_padded: [N+1] physical boundaries satisfying V3, V4 and V7. The row maps over a whole batch
// (slice, gather) check all three and abort otherwise; the per-position maps below check V3 and
// the V7 of the sequence they land in, but assume V4 (non-decreasing, O(N) to check per call),
// which PackedSeqParams::build validated for every array it hands out.

// Local row `row` of CP rank `cp_rank` -> its global position x in [0, T).
int64_t zigzag_local_to_global(std::span<const int32_t> cu_padded, int cp, int cp_rank, int64_t row);

struct ZigzagSlot {
  int rank = 0;     // owning CP rank
  int64_t row = 0;  // local row on that rank, in [0, T/cp)
};
// Global position x -> (owning rank, local row).
ZigzagSlot zigzag_global_to_local(std::span<const int32_t> cu_padded, int cp, int64_t x);

// local [T/cp, ...] (=) <- the zig-zag rows of `cp_rank` of global [T, ...]. Host views, one
// dtype, contiguous; any trailing dims. For tests and the data pipeline.
void zigzag_slice_rows(const TensorView& local, const TensorView& global, std::span<const int32_t> cu_padded,
                       int cp, int cp_rank);
Tensor zigzag_slice_rows(const TensorView& global, std::span<const int32_t> cu_padded, int cp, int cp_rank);
// The inverse: global [T, ...] (=) <- locals[r] [T/cp, ...] of every CP rank r (cp views).
void zigzag_gather_rows(const TensorView& global, const std::vector<TensorView>& locals,
                        std::span<const int32_t> cu_padded, int cp);
Tensor zigzag_gather_rows(const std::vector<TensorView>& locals, std::span<const int32_t> cu_padded, int cp);

// ---- PackedSeqParams ----------------------------------------------------------------------

class PackedSeqParams {
 public:
  PackedSeqParams() = default;
  // Validates `d` (validate_packed_batch_or_die with every_rank_knows), then builds every
  // table on the host and uploads the device copies to `device` with one copy on `s`.
  // With device = cpu the "device" views are the host arrays.
  static PackedSeqParams build(const PackedBatchDesc& d, Device device = Device::cpu(), Stream s = {},
                               bool every_rank_knows = false);

  PackedSeqParams(const PackedSeqParams&) = delete;  // views point into this object's arrays
  PackedSeqParams& operator=(const PackedSeqParams&) = delete;
  PackedSeqParams(PackedSeqParams&&) = default;  // vector moves keep their buffers
  PackedSeqParams& operator=(PackedSeqParams&&) = default;

  int64_t num_seqs() const { return int64_t(cu_.size()) - 1; }  // N (placeholders included)
  int64_t tokens() const { return T_; }                           // T = cu_seqlens_padded[N]
  int64_t tokens_cp() const { return T_ / cp_; }                  // zig-zag rows of a CP rank
  int64_t tokens_local() const { return T_ / (int64_t(cp_) * sp_); }  // T_local (after the SP split)
  int64_t real_tokens() const { return cu_.empty() ? 0 : cu_.back(); }  // cu_seqlens[N]
  int64_t real_tokens_cp() const { return real_cp_; }             // ones in loss_mask_local
  int64_t max_seqlen() const { return max_seqlen_; }              // max padded length p_i
  int sp() const { return sp_; }
  int cp() const { return cp_; }
  int cp_rank() const { return cp_rank_; }
  Device device() const { return device_; }

  // Boundaries, host [N+1] and device views [N+1] int32.
  const std::vector<int32_t>& cu_seqlens() const { return cu_; }
  const std::vector<int32_t>& cu_seqlens_padded() const { return varlen_.cu_seqlens(); }
  TensorView cu_seqlens_dev() const { return cu_dev_; }
  TensorView cu_seqlens_padded_dev() const;

  // The GLOBAL padded boundaries as the GDN kernels read them after cp2hp (chunk table,
  // seq_idx), on device().
  const ops::VarlenBatch& varlen() const { return varlen_; }
  const ops::VarlenMeta& varlen_meta() const { return varlen_.meta(); }

  // This CP rank's zig-zag rows, [T/cp] int32 (before the SP split; see sp_rows):
  // loss_mask 1 on real tokens, 0 on pads; position_ids = position inside its sequence.
  const std::vector<int32_t>& loss_mask_local() const { return loss_mask_; }
  const std::vector<int32_t>& position_ids_local() const { return pos_ids_; }
  TensorView loss_mask_local_dev() const { return loss_mask_dev_; }
  TensorView position_ids_local_dev() const { return pos_ids_dev_; }
  // Rows [first, second) of the per-CP-rank arrays held by TP rank `sp_rank` under SP.
  std::pair<int64_t, int64_t> sp_rows(int sp_rank) const;

  // Token index maps (section 4.4), [T] int32; empty / TensorView{} when cp == 1.
  //   cp_idx[x] = r*(T/cp) + l  (row of the rank-major receive buffer holding position x)
  //   cp_inv[cp_idx[x]] = x
  const std::vector<int32_t>& cp_idx() const { return cp_idx_; }
  const std::vector<int32_t>& cp_inv() const { return cp_inv_; }
  TensorView cp_idx_dev() const { return cp_idx_dev_; }
  TensorView cp_inv_dev() const { return cp_inv_dev_; }

  // What ops::cp2hp_* / hp2cp_* read (views on device(), host cu_seqlens_padded).
  ops::CpTokenMap cp_map() const;

  // The host rules V1-V8 re-run on the host copies ("" when valid), e.g. by a layer in a
  // debug build; never reads the device.
  std::string revalidate() const;
  // FNV-1a over (sp, cp, T, cu_seqlens, cu_seqlens_padded): equal on every rank of a TP x CP
  // group when the metadata agree (section 2.1: compared across the group at the first step).
  uint64_t checksum() const;

 private:
  int64_t T_ = 0, real_cp_ = 0, max_seqlen_ = 0;
  int sp_ = 1, cp_ = 1, cp_rank_ = 0;
  Device device_{};
  std::vector<int32_t> cu_, loss_mask_, pos_ids_, cp_idx_, cp_inv_;
  ops::VarlenBatch varlen_;
  Tensor dev_;           // one int32 buffer: cu_seqlens, loss_mask, position_ids, cp_idx, cp_inv
  Tensor host_staging_;  // its host staging copy, alive while the upload may read it
  TensorView cu_dev_, loss_mask_dev_, pos_ids_dev_, cp_idx_dev_, cp_inv_dev_;
};

}  // namespace dt::data
