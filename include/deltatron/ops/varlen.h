// Packed variable-length (THD) metadata as the kernels read it. Built once per micro-batch
// on the host (from cu_seqlens_padded: the physical boundaries) and uploaded once; kernels
// never read it back. See docs and ../shared/docs/gdn-math.md section 5 for the chunk table.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "deltatron/core/tensor.h"

namespace dt::ops {

inline constexpr int kGdnChunk = 64;

// Raw pointers, host and (when on CUDA) device copies of the same arrays.
struct VarlenMeta {
  int64_t num_seqs = 0;    // N
  int64_t total = 0;       // T = cu[N]
  int64_t num_chunks = 0;  // NT = sum_n ceil(L_n / 64)
  int64_t max_seqlen = 0;
  const int32_t* cu_host = nullptr;             // [N+1]
  const int32_t* chunk_seq_host = nullptr;      // [NT] sequence of each chunk
  const int32_t* chunk_start_host = nullptr;    // [NT] first token of each chunk
  const int32_t* chunk_offsets_host = nullptr;  // [N+1] first chunk of each sequence
  const int32_t* seq_idx_host = nullptr;        // [T] sequence of each token
  // [N] the sequences by chunk count, longest first (ties: lower index first). Kernels that walk
  // a sequence serially launch its CTAs in this order, so a partial last wave holds short chains.
  const int32_t* seq_order_host = nullptr;
  const int32_t* cu_dev = nullptr;
  const int32_t* chunk_seq_dev = nullptr;
  const int32_t* chunk_start_dev = nullptr;
  const int32_t* chunk_offsets_dev = nullptr;
  const int32_t* seq_idx_dev = nullptr;
  const int32_t* seq_order_dev = nullptr;
  Device device{};
};

// Owns the arrays of a VarlenMeta. Validates cu_seqlens (starts at 0, non-decreasing,
// int32 range) and aborts with the index and values on violation.
class VarlenBatch {
 public:
  VarlenBatch() = default;
  explicit VarlenBatch(const std::vector<int32_t>& cu_seqlens, Device device = Device::cpu(), Stream s = {});
  VarlenBatch(const VarlenBatch&) = delete;  // meta() points into this object's arrays
  VarlenBatch& operator=(const VarlenBatch&) = delete;
  VarlenBatch(VarlenBatch&&) = default;      // vector moves keep their buffers
  VarlenBatch& operator=(VarlenBatch&&) = default;
  const VarlenMeta& meta() const { return meta_; }
  const std::vector<int32_t>& cu_seqlens() const { return cu_; }

 private:
  std::vector<int32_t> cu_, chunk_seq_, chunk_start_, chunk_offsets_, seq_idx_, seq_order_;
  Tensor dev_;                // one int32 buffer holding the five arrays on the device
  Tensor host_staging_;    // its host staging copy, alive while an async upload may read it
  VarlenMeta meta_;
};

// "" when valid, else a message naming the index, the values and the rule.
std::string validate_cu_seqlens(const std::vector<int32_t>& cu, const char* name = "cu_seqlens");

}  // namespace dt::ops
