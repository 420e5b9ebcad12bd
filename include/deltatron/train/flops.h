// The FLOP model of a training step (docs/training.md, "FLOPs and MFU"): MODEL FLOPs of
// forward + backward over the REAL tokens of the documents (pads and recomputation are not
// useful work), the PaLM / Megatron convention for MFU.
//
//   GEMMs      2*m*n*k forward, x3 for forward + backward (dgrad + wgrad): every projection
//              of GDN (in_proj_qkv/z/b/a, out_proj), attention (q_proj incl. its gate half,
//              k/v/o_proj), the SwiGLU MLP and the LM head (tied or not). The embedding is a
//              lookup (0). m = real tokens.
//   GDN core   gdn-math.md 9.1, triangle-aware minimum, per token and v-head:
//              forward 3*c*dk + 2*c*dv + 6*dk*dv, backward 8*c*dk + 4*c*dv + 12*dk*dv + (2/3)*c^2,
//              where c is the real size of the token's chunk (C = 64; a sequence's last chunk
//              may be shorter).
//   attention  per sequence of real length L: forward 4 * L(L+1)/2 * head_dim * Hq (QK^T and
//              PV over the causal pairs), backward 2.5x forward.
// Not counted: norms, gates, conv1d, RoPE, softmax / cross entropy and other elementwise work.
#pragma once
#include <cstdint>
#include <span>

#include "deltatron/io/config.h"

namespace dt::train {

struct FlopCount {
  double gemm = 0;       // projections, MLP, LM head: fwd + bwd
  double gdn = 0;        // chunked gated delta rule core: fwd + bwd
  double attention = 0;  // causal QK^T and PV: fwd + bwd
  double model() const { return gemm + gdn + attention; }  // what TFLOP/s and MFU count
  FlopCount& operator+=(const FlopCount& o);
};

// FLOPs of one forward + backward of the whole model (every layer of `m`, summed over the TP and
// CP ranks that share the work) over sequences of real lengths `seq_lens` (zeros allowed: an
// alignment segment).
FlopCount step_flops(const io::ModelConfig& m, std::span<const int64_t> seq_lens);
// The same from cumulative actual boundaries cu_seqlens [N+1] (a packed micro-batch).
FlopCount micro_batch_flops(const io::ModelConfig& m, std::span<const int64_t> cu_seqlens);

// Dense peak of one device for MFU in TFLOP/s, 0 when unknown (then no MFU is shown):
// H100 / H200 SXM 989 (bf16) and 67 (fp32, no TF32: deltatron's fp32 GEMMs are true fp32);
// H100 PCIe 756 / 51. `device_name` as cudaGetDeviceProperties gives it; bf16: the run's
// train.precision. CPUs: 0.
double peak_tflops(const std::string& device_name, bool bf16);

}  // namespace dt::train
