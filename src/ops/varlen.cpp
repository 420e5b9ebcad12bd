#include "deltatron/ops/varlen.h"

#include <algorithm>
#include <climits>
#include <numeric>

#include "deltatron/ops/basic.h"

namespace dt::ops {

std::string validate_cu_seqlens(const std::vector<int32_t>& cu, const char* name) {
  if (cu.empty()) return fmt::format("{}: empty, expected N+1 >= 1 boundaries starting at 0", name);
  if (cu[0] != 0) return fmt::format("{}[0] = {}, but the boundaries must start at 0", name, cu[0]);
  for (size_t i = 1; i < cu.size(); ++i)
    if (cu[i] < cu[i - 1])
      return fmt::format("{}[{}] = {} < {}[{}] = {}: the boundaries must be non-decreasing", name, i, cu[i], name,
                         i - 1, cu[i - 1]);
  return "";
}

VarlenBatch::VarlenBatch(const std::vector<int32_t>& cu, Device device, Stream s) : cu_(cu) {
  std::string err = validate_cu_seqlens(cu_);
  DT_CHECK(err.empty(), "{}", err);
  int64_t N = int64_t(cu_.size()) - 1, T = cu_.back();
  chunk_offsets_.assign(N + 1, 0);
  seq_idx_.resize(T);
  int64_t max_len = 0;
  for (int64_t n = 0; n < N; ++n) {
    int32_t L = cu_[n + 1] - cu_[n];
    max_len = std::max<int64_t>(max_len, L);
    int32_t nt = (L + kGdnChunk - 1) / kGdnChunk;
    chunk_offsets_[n + 1] = chunk_offsets_[n] + nt;
    for (int32_t c = 0; c < nt; ++c) {
      chunk_seq_.push_back(int32_t(n));
      chunk_start_.push_back(cu_[n] + c * kGdnChunk);
    }
    for (int32_t t = cu_[n]; t < cu_[n + 1]; ++t) seq_idx_[t] = int32_t(n);
  }
  seq_order_.resize(size_t(N));
  std::iota(seq_order_.begin(), seq_order_.end(), 0);
  std::stable_sort(seq_order_.begin(), seq_order_.end(), [&](int32_t a, int32_t b) {
    return chunk_offsets_[a + 1] - chunk_offsets_[a] > chunk_offsets_[b + 1] - chunk_offsets_[b];
  });
  meta_.num_seqs = N;
  meta_.total = T;
  meta_.num_chunks = int64_t(chunk_seq_.size());
  meta_.max_seqlen = max_len;
  meta_.cu_host = cu_.data();
  meta_.chunk_seq_host = chunk_seq_.data();
  meta_.chunk_start_host = chunk_start_.data();
  meta_.chunk_offsets_host = chunk_offsets_.data();
  meta_.seq_idx_host = seq_idx_.data();
  meta_.seq_order_host = seq_order_.data();
  meta_.device = device;
  if (device.is_cpu()) return;
  // One upload of the six arrays, packed back to back.
  int64_t NT = meta_.num_chunks, total = (N + 1) + NT + NT + (N + 1) + T + N;
  Tensor host = Tensor::empty(Shape{total}, DType::i32);
  int32_t* h = host.ptr<int32_t>();
  int64_t off = 0;
  for (const auto* v : {&cu_, &chunk_seq_, &chunk_start_, &chunk_offsets_, &seq_idx_, &seq_order_}) {
    std::copy(v->begin(), v->end(), h + off);
    off += int64_t(v->size());
  }
  dev_ = Tensor::empty(Shape{total}, DType::i32, device);
  copy(dev_, host, s);
  const int32_t* d = dev_.ptr<int32_t>();
  meta_.cu_dev = d;
  meta_.chunk_seq_dev = d + (N + 1);
  meta_.chunk_start_dev = d + (N + 1) + NT;
  meta_.chunk_offsets_dev = d + (N + 1) + 2 * NT;
  meta_.seq_idx_dev = d + (N + 1) + 2 * NT + (N + 1);
  meta_.seq_order_dev = meta_.seq_idx_dev + T;
  host_staging_ = host;  // the async upload reads `host`; keep it alive with the batch
}

}  // namespace dt::ops
