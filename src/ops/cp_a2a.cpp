// cp2hp / hp2cp (include/deltatron/ops/cp_a2a.h): the head permutation, the argument checks,
// both implementations (per_sequence, fused) composed from the backend primitives of
// ops/cp_a2a_backends.h and the CP communicator's all_to_all, and the routing by device.
//
// Both directions reduce to two data paths (R = T/cp local rows, B = C/cp columns per rank):
//   to_hp  natural [T, B] <- local [R, C]:  cp2hp_fwd (column map perm), hp2cp_bwd (identity)
//   to_cp  local [R, C] <- natural [T, B]:  cp2hp_bwd (column map inv),  hp2cp_fwd (identity)
// Each is the adjoint (= the inverse: every step is a bijection) of the other with the
// inverse column map, so the backward ops are gathers too.
#include "deltatron/ops/cp_a2a.h"

#include <climits>
#include <numeric>
#include <cstdint>
#include <utility>

#include "deltatron/dist/comm.h"
#include "deltatron/ops/basic.h"
#include "ops/cp_a2a_backends.h"
#include "ops/route.h"

namespace dt::ops {
namespace {

void gather_rows(const TensorView& dst, const TensorView& src, const TensorView& idx, Stream s) {
  DT_ROUTE(cp_gather_rows, dst, dst, src, idx, s);
}
void pack_blocks(const TensorView& send, const TensorView& src, const TensorView& col, int64_t g, Stream s) {
  DT_ROUTE(cp_pack_blocks, send, send, src, col, g, s);
}
void unpack_blocks(const TensorView& dst, const TensorView& recv, const TensorView& inv, int64_t g, Stream s) {
  DT_ROUTE(cp_unpack_blocks, dst, dst, recv, inv, g, s);
}

// A [rows, cols] view with a unit inner stride (rows may be strided).
void check_rows(const TensorView& v, int64_t rows, int64_t cols, const char* op, const char* what) {
  DT_CHECK(v.ndim() == 2 && v.shape[0] == rows && v.shape[1] == cols,
           "{}: {} must be [{}, {}], got {}", op, what, rows, cols, v.str());
  DT_CHECK(cols <= 1 || v.stride[1] == 1, "{}: {} needs a unit inner stride, got {}", op, what, v.str());
  DT_CHECK(rows <= 1 || v.stride[0] >= cols, "{}: {} rows overlap (row stride {} < {} columns)", op, what,
           v.stride[0], cols);
  DT_CHECK(v.data != nullptr || v.numel() == 0, "{}: {} has no data", op, what);
}

void check_map(const TensorView& m, int64_t n, const TensorView& like, const char* op, const char* what) {
  DT_CHECK(m.dtype == DType::i32 && m.ndim() == 1 && m.shape[0] == n && m.is_contiguous(),
           "{}: {} must be a contiguous int32 [{}] map, got {}", op, what, n, m.str());
  DT_CHECK(m.device == like.device, "{}: {} is on {}, but the data is on {}", op, what, m.device.str(),
           like.device.str());
}

// True when the memory spans of two 2-D row views cannot overlap.
bool disjoint(const TensorView& a, const TensorView& b) {
  auto span = [](const TensorView& v) {
    const auto lo = reinterpret_cast<uintptr_t>(v.data);
    const int64_t n = v.numel() ? (v.shape[0] - 1) * v.stride[0] + v.shape[1] : 0;
    return std::pair<uintptr_t, uintptr_t>{lo, lo + uintptr_t(n) * dtype_size(v.dtype)};
  };
  const auto [a0, a1] = span(a);
  const auto [b0, b1] = span(b);
  return a0 == a1 || b0 == b1 || a1 <= b0 || b1 <= a0;
}

// Shapes and maps shared by the four ops. `local` is [T/cp, C], `natural` [T, C/cp].
struct Dims {
  int cp;
  int64_t T, R, C, B;
};

Dims check_args(const TensorView& local, const TensorView& natural, int64_t width, const CpTokenMap& map,
                dist::Communicator& comm, CpA2aImpl impl, const char* op) {
  const int cp = comm.size();
  DT_CHECK(map.cp == cp, "{}: the token map is for cp={}, but the CP communicator has {} ranks", op, map.cp, cp);
  DT_CHECK(cp >= 1 && width % cp == 0, "{}: width {} is not a multiple of cp={}", op, width, cp);
  DT_CHECK(map.tokens >= 0 && map.tokens % cp == 0, "{}: T={} is not a multiple of cp={}", op, map.tokens, cp);
  DT_CHECK(impl == CpA2aImpl::fused || impl == CpA2aImpl::per_sequence, "{}: unknown CpA2aImpl {}", op, int(impl));
  const Dims d{cp, map.tokens, map.tokens / cp, width, width / cp};
  check_rows(local, d.R, d.C, op, "the zig-zag [T/cp, C] operand");
  check_rows(natural, d.T, d.B, op, "the natural-order [T, C/cp] operand");
  DT_CHECK(local.dtype == natural.dtype, "{}: dtypes differ: {} vs {}", op, local.str(), natural.str());
  check_device(local, natural, op);
  DT_CHECK(disjoint(local, natural), "{}: input and output overlap ({} and {}); use separate buffers", op,
           local.str(), natural.str());
  const size_t es = dtype_size(local.dtype);
  DT_CHECK(es == 1 || es == 2 || es == 4 || es == 8, "{}: unsupported element size {} ({})", op, es,
           dtype_name(local.dtype));
  if (cp > 1) {
    if (impl == CpA2aImpl::fused) {
      check_map(map.cp_idx, d.T, local, op, "cp_idx");
      check_map(map.cp_inv, d.T, local, op, "cp_inv");
    } else {
      DT_CHECK(!map.cu_padded.empty() && map.cu_padded.front() == 0 && map.cu_padded.back() == d.T,
               "{}: per_sequence needs the host cu_seqlens_padded [N+1] ending at T={}", op, d.T);
    }
  }
  return d;
}

// The sub-view of rows [r0, r0 + n) of a 2-D view.
TensorView rows_of(const TensorView& v, int64_t r0, int64_t n) { return v.slice(0, r0, r0 + n); }

// Natural [T, B] <- local [R, C] (column map `col` in runs of g columns, or TensorView{}
// for the identity).
void to_hp(const TensorView& natural, const TensorView& local, const TensorView& col, int64_t g,
           const TensorView& cp_idx, const CpTokenMap& map, const Dims& d, dist::Communicator& comm,
           CpA2aImpl impl, Stream s) {
  if (d.cp == 1) {  // one block, identity token map: a row copy (the permutation is the identity too)
    gather_rows(natural, local, TensorView{}, s);
    return;
  }
  const Device dev = local.device;
  if (impl == CpA2aImpl::fused) {
    Tensor send = Tensor::empty(Shape{d.cp, d.R, d.B}, local.dtype, dev);  // [cp][T/cp][B]
    Tensor recv = Tensor::empty(Shape{d.cp, d.R, d.B}, local.dtype, dev);  // rank-major [T, B]
    pack_blocks(send, local, col, g, s);
    comm.all_to_all(recv, send, s);
    gather_rows(natural, recv.view().reshape(Shape{d.T, d.B}), cp_idx, s);
    return;
  }
  // per_sequence: sequence i is local rows [c_i/cp, c_{i+1}/cp) on every rank; its all-to-all
  // moves [cp][p_i/cp][B], block j = rank j's pieces j and 2cp-1-j of it (h_i rows each).
  Tensor send = Tensor::empty(Shape{d.T * d.B}, local.dtype, dev);  // sequence i at offset c_i * B
  Tensor recv = Tensor::empty(Shape{d.T * d.B}, local.dtype, dev);
  const std::span<const int32_t> cu = map.cu_padded;
  for (size_t i = 0; i + 1 < cu.size(); ++i) {
    const int64_t c = cu[i], p = int64_t(cu[i + 1]) - c, ri = p / d.cp, h = p / (2 * d.cp);
    if (p == 0) continue;  // placeholders own no tokens (every rank skips the same ones)
    DT_CHECK(p % (2 * d.cp) == 0, "cp a2a per_sequence: padded length {} of sequence {} is not a multiple of 2*cp={}",
             p, i, 2 * d.cp);
    const Shape blocks{d.cp, ri, d.B};
    TensorView send_i = send.view().slice(0, c * d.B, (c + p) * d.B).reshape(blocks);  // [cp, p/cp, B]
    TensorView recv_i = recv.view().slice(0, c * d.B, (c + p) * d.B).reshape(blocks);
    pack_blocks(send_i, rows_of(local, c / d.cp, ri), col, g, s);
    comm.all_to_all(recv_i, send_i, s);
    for (int64_t j = 0; j < d.cp; ++j) {
      TensorView from_j = recv_i.select(0, j);  // [p/cp, B]: natural pieces j, 2cp-1-j
      copy(rows_of(natural, c + j * h, h), rows_of(from_j, 0, h), s);
      copy(rows_of(natural, c + (2 * d.cp - 1 - j) * h, h), rows_of(from_j, h, h), s);
    }
  }
}

// Local [R, C] <- natural [T, B] (inverse column map `inv` in runs of g columns, or
// TensorView{} for the identity).
void to_cp(const TensorView& local, const TensorView& natural, const TensorView& inv, int64_t g,
           const TensorView& cp_inv, const CpTokenMap& map, const Dims& d, dist::Communicator& comm,
           CpA2aImpl impl, Stream s) {
  if (d.cp == 1) {
    gather_rows(local, natural, TensorView{}, s);
    return;
  }
  const Device dev = local.device;
  if (impl == CpA2aImpl::fused) {
    Tensor send = Tensor::empty(Shape{d.cp, d.R, d.B}, local.dtype, dev);  // rank-major [T, B]
    Tensor recv = Tensor::empty(Shape{d.cp, d.R, d.B}, local.dtype, dev);  // [cp][T/cp][B] by source rank
    gather_rows(send.view().reshape(Shape{d.T, d.B}), natural, cp_inv, s);
    comm.all_to_all(recv, send, s);
    unpack_blocks(local, recv, inv, g, s);
    return;
  }
  Tensor send = Tensor::empty(Shape{d.T * d.B}, local.dtype, dev);
  Tensor recv = Tensor::empty(Shape{d.T * d.B}, local.dtype, dev);
  const std::span<const int32_t> cu = map.cu_padded;
  for (size_t i = 0; i + 1 < cu.size(); ++i) {
    const int64_t c = cu[i], p = int64_t(cu[i + 1]) - c, ri = p / d.cp, h = p / (2 * d.cp);
    if (p == 0) continue;
    DT_CHECK(p % (2 * d.cp) == 0, "cp a2a per_sequence: padded length {} of sequence {} is not a multiple of 2*cp={}",
             p, i, 2 * d.cp);
    const Shape blocks{d.cp, ri, d.B};
    TensorView send_i = send.view().slice(0, c * d.B, (c + p) * d.B).reshape(blocks);  // [cp, p/cp, B]
    TensorView recv_i = recv.view().slice(0, c * d.B, (c + p) * d.B).reshape(blocks);
    for (int64_t j = 0; j < d.cp; ++j) {  // block j: the pieces rank j holds, in its local order
      TensorView to_j = send_i.select(0, j);
      copy(rows_of(to_j, 0, h), rows_of(natural, c + j * h, h), s);
      copy(rows_of(to_j, h, h), rows_of(natural, c + (2 * d.cp - 1 - j) * h, h), s);
    }
    comm.all_to_all(recv_i, send_i, s);
    unpack_blocks(rows_of(local, c / d.cp, ri), recv_i, inv, g, s);
  }
}

}  // namespace

const char* cp_a2a_impl_name(CpA2aImpl impl) {
  switch (impl) {
    case CpA2aImpl::per_sequence: return "per_sequence";
    case CpA2aImpl::fused: return "fused";
  }
  return "?";
}

std::vector<int32_t> cp_head_perm(std::span<const int64_t> sections, int cp) {
  DT_CHECK(cp >= 1, "cp_head_perm: cp={} must be >= 1", cp);
  int64_t C = 0;
  for (size_t x = 0; x < sections.size(); ++x) {
    DT_CHECK(sections[x] >= 0 && sections[x] % cp == 0,
             "cp_head_perm: section {} has width {}, not a non-negative multiple of cp={}", x, sections[x], cp);
    C += sections[x];
  }
  DT_CHECK(C <= INT32_MAX, "cp_head_perm: total width {} exceeds the int32 range", C);
  // Output block r = [x_r for every section x]: walk the blocks, then the sections in order.
  std::vector<int32_t> perm;
  perm.reserve(size_t(C));
  for (int64_t r = 0; r < cp; ++r) {
    int64_t O = 0;  // O_x: offset of section x in the input
    for (int64_t S : sections) {
      const int64_t w = S / cp;
      for (int64_t j = 0; j < w; ++j) perm.push_back(int32_t(O + r * w + j));
      O += S;
    }
  }
  return perm;
}

CpHeadLayout::CpHeadLayout(std::vector<int64_t> sections, int cp, Device device, Stream s)
    : cp_(cp), sections_(std::move(sections)) {
  perm_ = cp_head_perm(sections_, cp);
  width_ = int64_t(perm_.size());
  inv_.assign(perm_.size(), 0);
  for (size_t m = 0; m < perm_.size(); ++m) inv_[size_t(perm_[m])] = int32_t(m);
  // Runs of g columns move together: g divides every per-rank section width (hence every
  // section offset and the block width C/cp).
  group_ = 0;
  for (int64_t S : sections_) group_ = std::gcd(group_, S / cp);
  if (group_ == 0) group_ = 1;
  const int64_t C = width_, Cg = width_ / group_;
  maps_.resize(size_t(2 * C + 2 * Cg));
  std::copy(perm_.begin(), perm_.end(), maps_.begin());
  std::copy(inv_.begin(), inv_.end(), maps_.begin() + C);
  for (int64_t u = 0; u < Cg; ++u) {
    maps_[size_t(2 * C + u)] = perm_[size_t(u * group_)] / int32_t(group_);
    maps_[size_t(2 * C + Cg + u)] = inv_[size_t(u * group_)] / int32_t(group_);
  }
  const int32_t* base = maps_.data();
  if (device.is_cuda()) {  // one upload of the four maps
    Tensor host = Tensor::empty(Shape{int64_t(maps_.size())}, DType::i32);
    std::copy(maps_.begin(), maps_.end(), host.ptr<int32_t>());
    dev_ = Tensor::empty(host.shape(), DType::i32, device);
    copy(dev_, host, s);
    host_staging_ = host;  // the upload may still read it
    base = dev_.ptr<int32_t>();
  }
  const Device where = device.is_cuda() ? device : Device::cpu();
  auto view = [&](int64_t off, int64_t n) {
    return TensorView(const_cast<int32_t*>(base) + off, DType::i32, where, Shape{n});
  };
  perm_view_ = view(0, C);
  inv_view_ = view(C, C);
  perm_g_view_ = view(2 * C, Cg);
  inv_g_view_ = view(2 * C + Cg, Cg);
}

void cp2hp_fwd(const TensorView& y, const TensorView& x, const CpHeadLayout& heads, const CpTokenMap& map,
               dist::Communicator& cp, CpA2aImpl impl, Stream s) {
  const Dims d = check_args(x, y, heads.width(), map, cp, impl, "cp2hp_fwd");
  DT_CHECK(heads.cp() == d.cp, "cp2hp_fwd: the head layout is for cp={}, the communicator has {} ranks",
           heads.cp(), d.cp);
  if (d.cp > 1) check_map(heads.perm_grouped(), d.C / heads.group(), x, "cp2hp_fwd", "the head permutation");
  if (d.T == 0 || d.B == 0) return;
  to_hp(y, x, heads.perm_grouped(), heads.group(), map.cp_idx, map, d, cp, impl, s);
}

void cp2hp_bwd(const TensorView& dx, const TensorView& dy, const CpHeadLayout& heads, const CpTokenMap& map,
               dist::Communicator& cp, CpA2aImpl impl, Stream s) {
  const Dims d = check_args(dx, dy, heads.width(), map, cp, impl, "cp2hp_bwd");
  DT_CHECK(heads.cp() == d.cp, "cp2hp_bwd: the head layout is for cp={}, the communicator has {} ranks",
           heads.cp(), d.cp);
  if (d.cp > 1) check_map(heads.inv_grouped(), d.C / heads.group(), dx, "cp2hp_bwd", "the inverse head permutation");
  if (d.T == 0 || d.B == 0) return;
  to_cp(dx, dy, heads.inv_grouped(), heads.group(), map.cp_inv, map, d, cp, impl, s);
}

void hp2cp_fwd(const TensorView& out, const TensorView& o, const CpTokenMap& map, dist::Communicator& cp,
               CpA2aImpl impl, Stream s) {
  DT_CHECK(out.ndim() == 2, "hp2cp_fwd: out must be [T/cp, Cv], got {}", out.str());
  const Dims d = check_args(out, o, out.shape[1], map, cp, impl, "hp2cp_fwd");
  if (d.T == 0 || d.B == 0) return;
  to_cp(out, o, TensorView{}, 1, map.cp_inv, map, d, cp, impl, s);
}

void hp2cp_bwd(const TensorView& d_o, const TensorView& d_out, const CpTokenMap& map, dist::Communicator& cp,
               CpA2aImpl impl, Stream s) {
  DT_CHECK(d_out.ndim() == 2, "hp2cp_bwd: d_out must be [T/cp, Cv], got {}", d_out.str());
  const Dims d = check_args(d_out, d_o, d_out.shape[1], map, cp, impl, "hp2cp_bwd");
  if (d.T == 0 || d.B == 0) return;
  to_hp(d_o, d_out, TensorView{}, 1, map.cp_idx, map, d, cp, impl, s);
}

}  // namespace dt::ops
