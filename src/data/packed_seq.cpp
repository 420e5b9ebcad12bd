// Packed THD metadata: validation (V1-V8, C1-C3), zig-zag maps and PackedSeqParams
// (include/deltatron/data/packed_seq.h; shared/docs/thd-context-parallel.md sections 1-4).
// Everything here runs on the host, once per micro-batch (config checks once per run).
#include "deltatron/data/packed_seq.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include <fmt/ranges.h>

#include "deltatron/core/check.h"
#include "deltatron/ops/basic.h"

namespace dt::data {

// ---- validation ---------------------------------------------------------------------------

std::string validate_packed_batch(const PackedBatchDesc& d) {
  const std::vector<int64_t>& cu = d.cu_seqlens;
  const std::vector<int64_t>& cp_ = d.cu_seqlens_padded;
  if (d.batch != 1) return fmt::format("packed batch: batch dimension must be 1, got batch={}", d.batch);
  // The parallel sizes come from the config; a bad one here is a caller error, still reported.
  if (d.sp < 1 || d.cp < 1) return fmt::format("packed batch: sp={} and cp={} must both be >= 1", d.sp, d.cp);
  if (d.cp_rank < 0 || d.cp_rank >= d.cp)
    return fmt::format("packed batch: cp_rank={} is outside [0, cp={})", d.cp_rank, d.cp);
  if (d.tokens_local < 0) return fmt::format("packed batch: local tokens {} must be >= 0", d.tokens_local);
  // V2
  if (cu.size() != cp_.size() || cp_.size() < 2)
    return fmt::format(
        "packed batch: cu_seqlens has {} entries and cu_seqlens_padded has {}; both must be N+1 with N >= 1",
        cu.size(), cp_.size());
  const size_t N = cp_.size() - 1;
  const std::pair<const char*, const std::vector<int64_t>*> fields[] = {{"cu_seqlens", &cu},
                                                                       {"cu_seqlens_padded", &cp_}};
  // V3
  for (auto [name, f] : fields)
    if ((*f)[0] != 0) return fmt::format("packed batch: {}[0]={}, must be 0", name, (*f)[0]);
  // V4
  for (auto [name, f] : fields)
    for (size_t i = 0; i < N; ++i)
      if ((*f)[i + 1] < (*f)[i])
        return fmt::format("packed batch: {0} decreases at i={1}: {0}[{1}]={2}, {0}[{3}]={4}", name, i, (*f)[i],
                           i + 1, (*f)[i + 1]);
  // V8 (before V5-V7: once the array is non-decreasing its last entry bounds every value)
  const int64_t x = cp_[N];
  if (x > INT32_MAX) return fmt::format("packed batch: {} tokens exceed the int32 range of cu_seqlens_padded", x);
  // V5
  for (size_t i = 0; i < N; ++i) {
    const int64_t a = cu[i + 1] - cu[i], p = cp_[i + 1] - cp_[i];
    if (a > p)
      return fmt::format(
          "packed batch: sequence {0} has actual length {2} > padded length {3} (cu_seqlens[{0}..{1}]={4}..{5}, "
          "cu_seqlens_padded[{0}..{1}]={6}..{7})",
          i, i + 1, a, p, cu[i], cu[i + 1], cp_[i], cp_[i + 1]);
  }
  // V6
  int64_t y = 0;
  if (__builtin_mul_overflow(d.tokens_local, int64_t(d.sp) * d.cp, &y))
    return fmt::format("packed batch: local tokens {} × sp {} × cp {} overflows int64", d.tokens_local, d.sp, d.cp);
  if (x != y)
    return fmt::format(
        "packed batch: cu_seqlens_padded[{}]={} but local tokens {} × sp {} × cp {} = {}; whole-pack padding must "
        "be an explicit last segment",
        N, x, d.tokens_local, d.sp, d.cp, y);
  // V7: the zig-zag split needs 2*cp equal pieces per sequence (requirement R2)
  if (d.cp > 1) {
    const int64_t D = 2 * int64_t(d.cp);
    for (size_t i = 0; i < N; ++i) {
      const int64_t p = cp_[i + 1] - cp_[i];
      if (p % D != 0)
        return fmt::format(
            "packed batch: padded length of sequence {} is {}, not a multiple of 2*cp={} (next valid length {}); "
            "set data.pad_multiple to {}",
            i, p, D, (p + D - 1) / D * D, D);
    }
  }
  return "";
}

void validate_packed_batch_or_die(const PackedBatchDesc& d, bool every_rank_knows) {
  const std::string err = validate_packed_batch(d);
  if (!err.empty()) user_error(err, every_rank_knows);
}

std::string validate_gdn_cp_config(int64_t Hk, int64_t Hv, int tp, int cp, int64_t pad_multiple) {
  if (Hk < 1 || Hv < 1)
    return fmt::format("config: model.linear_num_key_heads={} and model.linear_num_value_heads={} must be >= 1", Hk,
                       Hv);
  if (tp < 1 || cp < 1) return fmt::format("config: parallel.tp={} and parallel.cp={} must be >= 1", tp, cp);
  // C1
  if (Hv % Hk != 0)
    return fmt::format("config: model.linear_num_value_heads={} is not a multiple of model.linear_num_key_heads={}",
                       Hv, Hk);
  // C2
  const int64_t tc = int64_t(tp) * cp;
  if (Hk % tc != 0 || Hv % tc != 0)
    return fmt::format(
        "config: GDN head-parallel CP needs tp*cp={} to divide linear_num_key_heads={} and linear_num_value_heads={}",
        tc, Hk, Hv);
  // C3
  if (pad_multiple < 1) return fmt::format("config: data.pad_multiple={} must be >= 1", pad_multiple);
  if (cp > 1 && pad_multiple % (2 * int64_t(cp)) != 0)
    return fmt::format("config: data.pad_multiple={} must be a multiple of 2*parallel.cp={}", pad_multiple, 2 * cp);
  return "";
}

void validate_gdn_cp_config_or_die(int64_t Hk, int64_t Hv, int tp, int cp, int64_t pad_multiple) {
  const std::string err = validate_gdn_cp_config(Hk, Hv, tp, cp, pad_multiple);
  if (!err.empty()) user_error(err, /*every_rank_knows=*/true);
}

std::string metadata_mismatch(dist::Communicator& world, uint64_t checksum, const std::vector<int>& group_of,
                              const std::string& where) {
  const int P = world.size();
  DT_CHECK(int(group_of.size()) == P, "metadata_mismatch: group_of has {} entries for {} ranks", group_of.size(), P);
  if (P == 1) return "";
  Tensor mine = Tensor::empty(Shape{1}, DType::i64), all = Tensor::empty(Shape{P}, DType::i64);
  std::memcpy(mine.data(), &checksum, sizeof(checksum));
  world.all_gather(all, mine);
  const auto* cs = reinterpret_cast<const uint64_t*>(all.data());
  const std::vector<int>& m = world.members();
  for (int first = 0; first < P; ++first) {  // each group from its first rank, in rank order
    if (std::find(group_of.begin(), group_of.begin() + first, group_of[first]) != group_of.begin() + first) continue;
    std::vector<int> members, differ;
    for (int r = first; r < P; ++r) {
      if (group_of[r] != group_of[first]) continue;
      members.push_back(m[r]);
      if (cs[r] != cs[first]) differ.push_back(r);
    }
    if (differ.empty()) continue;
    std::vector<int> differ_world;
    for (int r : differ) differ_world.push_back(m[r]);
    return fmt::format(
        "packed batch ({}): cu_seqlens / cu_seqlens_padded differ across the TP x CP group of world ranks [{}]: "
        "world rank(s) {} hold other metadata than world rank {} (checksum {:#018x} against {:#018x}); every rank "
        "of a TP x CP group must pack the same micro-batches (the same data config and loader position)",
        where, fmt::join(members, ", "), fmt::join(differ_world, ", "), m[first], cs[differ[0]], cs[first]);
  }
  return "";
}

// ---- zig-zag maps -------------------------------------------------------------------------

namespace {

void check_cu(std::span<const int32_t> cu, int cp, const char* op) {
  DT_CHECK(cp >= 1, "{}: cp={} must be >= 1", op, cp);
  DT_CHECK(!cu.empty() && cu[0] == 0, "{}: cu_seqlens_padded must be [N+1] starting at 0", op);
  DT_CHECK(cu.back() % cp == 0, "{}: T={} is not a multiple of cp={}", op, cu.back(), cp);
}

// Padded length and piece size h = p/(2cp) of sequence i, with the V7 precondition checked.
std::pair<int64_t, int64_t> seq_len_piece(std::span<const int32_t> cu, int cp, size_t i, const char* op) {
  const int64_t p = int64_t(cu[i + 1]) - cu[i];
  DT_CHECK(p >= 0 && p % (2 * cp) == 0, "{}: padded length {} of sequence {} is not a multiple of 2*cp={} (V7)", op,
           p, i, 2 * cp);
  return {p, p / (2 * cp)};
}

// Row size in bytes of a [rows, ...] contiguous host view.
size_t row_bytes(const TensorView& v) {
  const int64_t rows = v.shape[0];
  return rows ? v.nbytes() / size_t(rows) : 0;
}

void check_rows_pair(const TensorView& local, const TensorView& global, int64_t T, int cp, const char* op) {
  DT_CHECK(local.device.is_cpu() && global.device.is_cpu(), "{}: host views expected, got {} and {}", op,
           local.str(), global.str());
  check_contiguous(local, op);
  check_contiguous(global, op);
  DT_CHECK(local.dtype == global.dtype, "{}: dtypes differ: {} vs {}", op, local.str(), global.str());
  DT_CHECK(global.ndim() >= 1 && global.shape[0] == T, "{}: global must be [T={}, ...], got {}", op, T,
           global.str());
  Shape want = global.shape;
  want[0] = T / cp;
  DT_CHECK(local.shape == want, "{}: local must be {}, got {}", op, want.str(), local.str());
}

// Calls f(local_first_row, global_first_row, rows) for every run of rows that rank r holds.
template <typename F>
void for_each_piece(std::span<const int32_t> cu, int cp, int r, const char* op, F f) {
  if (cp == 1) {
    f(int64_t(0), int64_t(0), int64_t(cu.back()));
    return;
  }
  for (size_t i = 0; i + 1 < cu.size(); ++i) {
    const auto [p, h] = seq_len_piece(cu, cp, i, op);
    if (p == 0) continue;
    const int64_t c = cu[i], base = c / cp;
    f(base, c + r * h, h);
    f(base + h, c + (2 * int64_t(cp) - 1 - r) * h, h);
  }
}

}  // namespace

int64_t zigzag_local_to_global(std::span<const int32_t> cu, int cp, int cp_rank, int64_t row) {
  constexpr const char* op = "zigzag_local_to_global";
  check_cu(cu, cp, op);
  DT_CHECK(cp_rank >= 0 && cp_rank < cp, "{}: cp_rank={} is outside [0, cp={})", op, cp_rank, cp);
  const int64_t T = cu.back();
  DT_CHECK(row >= 0 && row < T / cp, "{}: local row {} is outside [0, T/cp={})", op, row, T / cp);
  if (cp == 1) return row;
  // Sequence i with c_i/cp <= row < c_{i+1}/cp (placeholders are skipped by the search).
  const auto it = std::upper_bound(cu.begin(), cu.end(), row, [cp](int64_t v, int32_t c) { return v < c / cp; });
  const size_t i = size_t(it - cu.begin()) - 1;
  const auto [p, h] = seq_len_piece(cu, cp, i, op);
  const int64_t c = cu[i], o = row - c / cp;
  const int64_t n = o < h ? cp_rank : 2 * int64_t(cp) - 1 - cp_rank;  // natural piece
  const int64_t off = o < h ? o : o - h;
  return c + n * h + off;
}

ZigzagSlot zigzag_global_to_local(std::span<const int32_t> cu, int cp, int64_t x) {
  constexpr const char* op = "zigzag_global_to_local";
  check_cu(cu, cp, op);
  const int64_t T = cu.back();
  DT_CHECK(x >= 0 && x < T, "{}: position {} is outside [0, T={})", op, x, T);
  if (cp == 1) return {0, x};
  const auto it = std::upper_bound(cu.begin(), cu.end(), x, [](int64_t v, int32_t c) { return v < c; });
  const size_t i = size_t(it - cu.begin()) - 1;  // c_i <= x < c_{i+1}
  const auto [p, h] = seq_len_piece(cu, cp, i, op);
  const int64_t c = cu[i], o = x - c, n = o / h, off = o - n * h;
  const bool first = n < cp;
  return {int(first ? n : 2 * int64_t(cp) - 1 - n), c / cp + (first ? 0 : h) + off};
}

void zigzag_slice_rows(const TensorView& local, const TensorView& global, std::span<const int32_t> cu, int cp,
                       int cp_rank) {
  constexpr const char* op = "zigzag_slice_rows";
  check_cu(cu, cp, op);
  DT_CHECK(cp_rank >= 0 && cp_rank < cp, "{}: cp_rank={} is outside [0, cp={})", op, cp_rank, cp);
  check_rows_pair(local, global, cu.back(), cp, op);
  const size_t rb = row_bytes(global);
  auto* dst = static_cast<char*>(local.data);
  const auto* src = static_cast<const char*>(global.data);
  for_each_piece(cu, cp, cp_rank, op, [&](int64_t l, int64_t g, int64_t n) {
    if (n) std::memcpy(dst + size_t(l) * rb, src + size_t(g) * rb, size_t(n) * rb);
  });
}

Tensor zigzag_slice_rows(const TensorView& global, std::span<const int32_t> cu, int cp, int cp_rank) {
  check_cu(cu, cp, "zigzag_slice_rows");
  Shape s = global.shape;
  DT_CHECK(s.ndim >= 1, "zigzag_slice_rows: global must be [T, ...], got {}", global.str());
  s[0] = s[0] / cp;
  Tensor local = Tensor::empty(s, global.dtype);
  zigzag_slice_rows(local, global, cu, cp, cp_rank);
  return local;
}

void zigzag_gather_rows(const TensorView& global, const std::vector<TensorView>& locals, std::span<const int32_t> cu,
                        int cp) {
  constexpr const char* op = "zigzag_gather_rows";
  check_cu(cu, cp, op);
  DT_CHECK(int64_t(locals.size()) == cp, "{}: {} local views given for cp={}", op, locals.size(), cp);
  const size_t rb = row_bytes(global);
  auto* dst = static_cast<char*>(global.data);
  for (int r = 0; r < cp; ++r) {
    check_rows_pair(locals[size_t(r)], global, cu.back(), cp, op);
    const auto* src = static_cast<const char*>(locals[size_t(r)].data);
    for_each_piece(cu, cp, r, op, [&](int64_t l, int64_t g, int64_t n) {
      if (n) std::memcpy(dst + size_t(g) * rb, src + size_t(l) * rb, size_t(n) * rb);
    });
  }
}

Tensor zigzag_gather_rows(const std::vector<TensorView>& locals, std::span<const int32_t> cu, int cp) {
  check_cu(cu, cp, "zigzag_gather_rows");
  DT_CHECK(!locals.empty() && locals[0].ndim() >= 1, "zigzag_gather_rows: no local views");
  Shape s = locals[0].shape;
  s[0] = cu.back();
  Tensor global = Tensor::empty(s, locals[0].dtype);
  zigzag_gather_rows(global, locals, cu, cp);
  return global;
}

// ---- PackedSeqParams ----------------------------------------------------------------------

PackedSeqParams PackedSeqParams::build(const PackedBatchDesc& d, Device device, Stream s, bool every_rank_knows) {
  validate_packed_batch_or_die(d, every_rank_knows);
  PackedSeqParams P;
  const size_t N = d.cu_seqlens_padded.size() - 1;
  const int cp = d.cp, r = d.cp_rank;
  std::vector<int32_t> cu_pad(d.cu_seqlens_padded.begin(), d.cu_seqlens_padded.end());  // V8: fits
  P.cu_.assign(d.cu_seqlens.begin(), d.cu_seqlens.end());
  P.T_ = cu_pad[N];
  P.sp_ = d.sp;
  P.cp_ = cp;
  P.cp_rank_ = r;
  P.device_ = device;
  const int64_t T = P.T_, Tcp = T / cp;

  // Local rows of this rank: mask and position of each (section 3.2, local -> global).
  P.loss_mask_.assign(size_t(Tcp), 0);
  P.pos_ids_.assign(size_t(Tcp), 0);
  for (size_t i = 0; i < N; ++i) {
    const int64_t c = cu_pad[i], p = int64_t(cu_pad[i + 1]) - c, a = int64_t(P.cu_[i + 1]) - P.cu_[i];
    P.max_seqlen_ = std::max(P.max_seqlen_, p);
    const int64_t base = c / cp, h = cp > 1 ? p / (2 * cp) : p;
    for (int64_t o = 0; o < p / cp; ++o) {
      int64_t pos = o;  // cp = 1: the identity
      if (cp > 1) pos = (o < h ? r : 2 * int64_t(cp) - 1 - r) * h + (o < h ? o : o - h);
      P.pos_ids_[size_t(base + o)] = int32_t(pos);
      P.loss_mask_[size_t(base + o)] = pos < a ? 1 : 0;
      P.real_cp_ += pos < a ? 1 : 0;
    }
  }

  // Token index maps (section 4.4, global -> owner rank and row).
  if (cp > 1) {
    P.cp_idx_.assign(size_t(T), 0);
    P.cp_inv_.assign(size_t(T), 0);
    for (size_t i = 0; i < N; ++i) {
      const int64_t c = cu_pad[i], p = int64_t(cu_pad[i + 1]) - c, h = p / (2 * cp);
      for (int64_t o = 0; o < p; ++o) {
        const int64_t n = o / h, off = o - n * h;
        const bool first = n < cp;
        const int64_t owner = first ? n : 2 * int64_t(cp) - 1 - n;
        const int64_t row = c / cp + (first ? 0 : h) + off;
        const int64_t q = owner * Tcp + row;
        P.cp_idx_[size_t(c + o)] = int32_t(q);
        P.cp_inv_[size_t(q)] = int32_t(c + o);
      }
    }
  }

  P.varlen_ = ops::VarlenBatch(cu_pad, device, s);

  // Device copies: one int32 buffer [cu (N+1) | loss_mask (T/cp) | position_ids (T/cp) |
  // cp_idx (T) | cp_inv (T)], uploaded with one copy. On the CPU the views are the arrays.
  std::vector<int32_t>* arrays[] = {&P.cu_, &P.loss_mask_, &P.pos_ids_, &P.cp_idx_, &P.cp_inv_};
  TensorView* views[] = {&P.cu_dev_, &P.loss_mask_dev_, &P.pos_ids_dev_, &P.cp_idx_dev_, &P.cp_inv_dev_};
  int64_t total = 0;
  for (const auto* a : arrays) total += int64_t(a->size());
  int32_t* base = nullptr;
  if (device.is_cuda()) {
    Tensor host = Tensor::empty(Shape{total}, DType::i32);
    int64_t off = 0;
    for (const auto* a : arrays) {
      std::copy(a->begin(), a->end(), host.ptr<int32_t>() + off);
      off += int64_t(a->size());
    }
    P.dev_ = Tensor::empty(Shape{total}, DType::i32, device);
    ops::copy(P.dev_, host, s);
    P.host_staging_ = host;
    base = P.dev_.ptr<int32_t>();
  }
  int64_t off = 0;
  for (size_t k = 0; k < 5; ++k) {
    const int64_t n = int64_t(arrays[k]->size());
    const bool is_map = k >= 3;
    if (is_map && cp == 1) continue;  // no maps: TensorView{} (the identity)
    int32_t* p = device.is_cuda() ? base + off : arrays[k]->data();
    *views[k] = TensorView(p, DType::i32, device.is_cuda() ? device : Device::cpu(), Shape{n});
    off += n;
  }
  return P;
}

TensorView PackedSeqParams::cu_seqlens_padded_dev() const {
  const ops::VarlenMeta& m = varlen_.meta();
  const int64_t n = m.num_seqs + 1;
  if (device_.is_cuda()) return TensorView(const_cast<int32_t*>(m.cu_dev), DType::i32, device_, Shape{n});
  return TensorView(const_cast<int32_t*>(m.cu_host), DType::i32, Device::cpu(), Shape{n});
}

std::pair<int64_t, int64_t> PackedSeqParams::sp_rows(int sp_rank) const {
  DT_CHECK(sp_rank >= 0 && sp_rank < sp_, "sp_rows: sp_rank={} is outside [0, sp={})", sp_rank, sp_);
  const int64_t n = tokens_local();
  return {sp_rank * n, (sp_rank + 1) * n};
}

ops::CpTokenMap PackedSeqParams::cp_map() const {
  ops::CpTokenMap m;
  m.cp = cp_;
  m.tokens = T_;
  m.cu_padded = std::span<const int32_t>(varlen_.cu_seqlens());
  m.cp_idx = cp_idx_dev_;
  m.cp_inv = cp_inv_dev_;
  return m;
}

std::string PackedSeqParams::revalidate() const {
  if (cu_.empty()) return "packed batch: PackedSeqParams was never built";
  PackedBatchDesc d;
  d.cu_seqlens.assign(cu_.begin(), cu_.end());
  d.cu_seqlens_padded.assign(varlen_.cu_seqlens().begin(), varlen_.cu_seqlens().end());
  d.tokens_local = tokens_local();
  d.sp = sp_;
  d.cp = cp_;
  d.cp_rank = cp_rank_;
  return validate_packed_batch(d);
}

uint64_t PackedSeqParams::checksum() const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a offset basis
  auto mix = [&h](uint64_t v) {
    for (int b = 0; b < 8; ++b) {
      h ^= (v >> (8 * b)) & 0xffu;
      h *= 1099511628211ull;  // FNV prime
    }
  };
  mix(uint64_t(sp_));
  mix(uint64_t(cp_));
  mix(uint64_t(T_));
  for (const std::vector<int32_t>* a : {&cu_, &varlen_.cu_seqlens()}) {
    mix(a->size());
    for (int32_t v : *a) mix(uint64_t(uint32_t(v)));
  }
  return h;
}

}  // namespace dt::data
