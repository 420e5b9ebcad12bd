// cp2hp / hp2cp: the head-parallel context-parallel conversions around the GDN kernels
// (shared/docs/thd-context-parallel.md section 4).
//
//   cp2hp: x [T/cp, C]  zig-zag rows, all TP-local columns  ->  y [T, C/cp]  natural order, column slice r
//   hp2cp: o [T, Cv/cp] natural order, column slice r        ->  out [T/cp, Cv] zig-zag rows, all columns
//
// C is block-ordered by sections [q | k | v | z | b | a] (sizes S_x, each a multiple of cp);
// rank r receives [q_r | k_r | v_r | z_r | b_r | a_r] through the head permutation (4.2).
// hp2cp has one section (v heads), so it needs no permutation.
//
// Pure data movement: any dtype (element size 1, 2, 4 or 8 bytes), bitwise exact. The
// backward ops are the exact adjoints (4.6): gathers with the same maps, no scatter-add, no
// atomics; outputs are OVERWRITTEN (=). Row-strided views (unit inner stride) are accepted
// for x, y, o, out and their gradients.
//
// Two implementations behind CpA2aImpl, bitwise equal:
//   per_sequence  the plain reference: each sequence of the THD batch is unpacked and moved
//                 with its own all-to-all (N collectives), zig-zag undone piece by piece;
//                 reads only the host cu_seqlens_padded.
//   fused         one all-to-all each way for the whole packed batch: the head permutation is
//                 fused into the kernel that packs the send buffer, the token maps cp_idx /
//                 cp_inv (4.4) into the gather that unpacks (or packs) it.
// Communication goes through the CP communicator's all_to_all (MPI for CPU tensors; NCCL,
// stream-ordered on `s`, for CUDA tensors). Nothing is read back from the device. Scratch
// (send and receive buffers, T * C/cp elements each) comes from Tensor::empty (the caching
// allocator on CUDA), stream-ordered on `s` like every other op.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "deltatron/core/tensor.h"

namespace dt::dist {
class Communicator;
}

namespace dt::ops {

enum class CpA2aImpl { per_sequence, fused };
const char* cp_a2a_impl_name(CpA2aImpl impl);  // "per_sequence" | "fused"

// Section 4.2: perm[m] = input column of output column m, for sections S_x (each a multiple
// of cp, >= 0) of total width C. Output column block r (width C/cp) is
// [x_r for every section x]. Aborts with the section index and size on a bad section.
std::vector<int32_t> cp_head_perm(std::span<const int64_t> sections, int cp);

// The column layout of a cp2hp input: sections, the permutation and its inverse, host and
// device copies. Depends only on the configuration: build once at startup.
class CpHeadLayout {
 public:
  CpHeadLayout() = default;
  CpHeadLayout(std::vector<int64_t> sections, int cp, Device device = Device::cpu(), Stream s = {});
  CpHeadLayout(const CpHeadLayout&) = delete;  // the views point into this object's storage
  CpHeadLayout& operator=(const CpHeadLayout&) = delete;
  CpHeadLayout(CpHeadLayout&&) = default;
  CpHeadLayout& operator=(CpHeadLayout&&) = default;

  int cp() const { return cp_; }
  int64_t width() const { return width_; }        // C
  int64_t block() const { return width_ / cp_; }  // C / cp
  const std::vector<int64_t>& sections() const { return sections_; }
  const std::vector<int32_t>& perm_host() const { return perm_; }  // [C]
  const std::vector<int32_t>& inv_host() const { return inv_; }    // [C], inv[perm[m]] = m
  TensorView perm() const { return perm_view_; }                   // [C] int32 on device()
  TensorView inv() const { return inv_view_; }                     // [C] int32 on device()
  // The permutation moves whole runs of g = gcd_x(S_x / cp) columns: the kernels read it at
  // that granularity (perm[m] = perm_grouped[m / g] * g + m % g), so they can move wide words.
  int64_t group() const { return group_; }
  TensorView perm_grouped() const { return perm_g_view_; }  // [C/g] int32 on device()
  TensorView inv_grouped() const { return inv_g_view_; }    // [C/g] int32 on device()
  Device device() const { return perm_view_.device; }

 private:
  int cp_ = 1;
  int64_t width_ = 0, group_ = 1;
  std::vector<int64_t> sections_;
  std::vector<int32_t> maps_;  // [perm C | inv C | perm_g C/g | inv_g C/g]
  std::vector<int32_t> perm_, inv_;
  Tensor dev_;           // maps_ on the device (CUDA only)
  Tensor host_staging_;  // its host staging copy, alive while the upload may read it
  TensorView perm_view_, inv_view_, perm_g_view_, inv_g_view_;
};

// The token side of the conversion for one micro-batch (data::PackedSeqParams::cp_map()).
struct CpTokenMap {
  int cp = 1;
  int64_t tokens = 0;                     // T: global padded token count (cu_seqlens_padded[N])
  std::span<const int32_t> cu_padded;     // [N+1] host; per_sequence only (never read on the device)
  TensorView cp_idx;                      // [T] int32 on the data's device; TensorView{} when cp == 1
  TensorView cp_inv;                      // [T] int32 on the data's device; TensorView{} when cp == 1
};

// y [T, C/cp] (=)  <-  x [T/cp, C].   Y[x] = R[cp_idx[x]], R = all_to_all(pack(x, perm)).
void cp2hp_fwd(const TensorView& y, const TensorView& x, const CpHeadLayout& heads, const CpTokenMap& map,
               dist::Communicator& cp, CpA2aImpl impl = CpA2aImpl::fused, Stream s = {});
// dx [T/cp, C] (=)  <-  dy [T, C/cp].   dR[q] = dy[cp_inv[q]]; dx[:, perm[m]] = all_to_all(dR)[:, m].
void cp2hp_bwd(const TensorView& dx, const TensorView& dy, const CpHeadLayout& heads, const CpTokenMap& map,
               dist::Communicator& cp, CpA2aImpl impl = CpA2aImpl::fused, Stream s = {});
// out [T/cp, Cv] (=)  <-  o [T, Cv/cp].  Z[q] = o[cp_inv[q]]; out = concat over source ranks.
void hp2cp_fwd(const TensorView& out, const TensorView& o, const CpTokenMap& map, dist::Communicator& cp,
               CpA2aImpl impl = CpA2aImpl::fused, Stream s = {});
// d_o [T, Cv/cp] (=)  <-  d_out [T/cp, Cv].  dO[x] = all_to_all(pack(d_out))[cp_idx[x]].
void hp2cp_bwd(const TensorView& d_o, const TensorView& d_out, const CpTokenMap& map, dist::Communicator& cp,
               CpA2aImpl impl = CpA2aImpl::fused, Stream s = {});

}  // namespace dt::ops
