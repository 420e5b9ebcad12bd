// What every layer needs to know about how it runs: explicit process groups (no globals),
// device, precision, stream, the CP all-to-all implementation and the init seed.
#pragma once
#include <cstdint>

#include "deltatron/core/tensor.h"
#include "deltatron/dist/parallel.h"
#include "deltatron/ops/attention.h"
#include "deltatron/ops/cp_a2a.h"

namespace dt::layers {

// How the GDN layer moves data under CP (docs/parallelism.md, "GDN under CP"):
//   all_to_all  input projections on the zig-zag rows for all heads, then cp2hp / hp2cp
//   all_gather  all-gather x over cp, projections for this rank's heads on all tokens;
//               out_proj partials reduce-scattered over cp (fewer bytes when C_tp > cp*H)
enum class GdnCpComm { all_to_all, all_gather };

// How a layer runs: explicit groups (no globals), device, precision, stream.
struct RunCtx {
  const dist::ProcessGroups* pg = nullptr;
  bool sp = false;                 // sequence parallelism over the tp group
  Device device = Device::cpu();
  DType act_dtype = DType::f32;    // activations and GEMM inputs (bf16 on CUDA under bf16)
  Stream stream{};
  ops::CpA2aImpl cp_a2a = ops::CpA2aImpl::fused;
  GdnCpComm gdn_cp_comm = GdnCpComm::all_to_all;  // gdn.cp_comm; cp_a2a picks the all-to-all's implementation
  bool gdn_save_chunk = true;  // CUDA: GDN chunk forward intermediates kept for the backward (GdnChunkSaved)
  bool gdn_recompute = true;   // GDN backward recomputes the element-wise activations (conv, l2norm, z) from hp
  bool gdn_recompute_v = true;  // with gdn_recompute: the conv output's v too (false: kept from the forward)
  ops::AttnBackend attn_backend = ops::AttnBackend::native;  // gated attention kernels on CUDA
  uint64_t seed = 0;
};

// An input its caller does not write until the layer's backward (the decoder layer's normed
// inputs, model::DecoderLayer): the layer keeps a reference to it for the backward instead of a
// copy. take(x) returns the lent tensor when x is exactly its view (same data, shape, dtype,
// contiguous), else an undefined one (then the layer copies as before); either way the loan ends.
class LentInput {
 public:
  void lend(Tensor x) { t_ = std::move(x); }
  Tensor take(const TensorView& x) {
    Tensor t = std::move(t_);
    t_ = Tensor();
    if (t.defined() && t.data() == x.data && t.shape() == x.shape && t.dtype() == x.dtype && x.is_contiguous() &&
        t.view().is_contiguous())
      return t;
    return Tensor();
  }

 private:
  Tensor t_;
};

// What a layer keeps of its input x [rows / sp, H] for the backward, [rows, H]: under SP the
// all-gather over the TP group, else `lent` (LentInput::take(x)) when defined, else a copy.
Tensor kept_input(Tensor lent, const TensorView& x, int64_t rows, bool sp, const RunCtx& ctx);

// Column range [off, off + n) of a row-major [rows, C] view (row-strided result).
inline TensorView cols(const TensorView& x, int64_t off, int64_t n) { return x.slice(1, off, off + n); }
// A row-strided [T, H*D] view seen as [T, H, D] (head stride D, unit inner stride).
inline TensorView heads(const TensorView& x, int64_t H, int64_t D) {
  TensorView v = x;
  v.shape = Shape{x.shape[0], H, D};
  v.stride = {x.stride[0], D, 1};
  return v;
}

}  // namespace dt::layers
