// The op families of the gated attention layer (HF Qwen3_5Attention, issue 5): partial RoPE,
// varlen causal softmax attention with GQA, and the sigmoid output gate, plus the row gather the
// layer uses to put CP-gathered keys into natural order. Every op checks its views here and
// routes by the device of its first view (src/ops/attention.cpp) to ops::cpu:: (the fp32
// reference in src/ops/cpu/attention.cpp, double accumulation) or ops::cuda:: (flash-attention
// style kernels in src/ops/cuda/attention.cu). Dtypes: f32 everywhere; on CUDA also bf16 (all
// tensor views of one call share the dtype; lse stays f32; pos, idx and the varlen arrays i32).
// CUDA attention: head dim a multiple of 8 (bf16; 4 for f32) up to 256, 16-byte aligned rows.
// Outputs marked (=) are overwritten; nothing here accumulates. All ops are deterministic.
#pragma once
#include <cstdint>
#include <string>

#include "deltatron/core/tensor.h"

namespace dt::ops {

// ---- rope: partial rotary embedding, HF rotate_half convention ----------------------------------
// Per row t with position p = pos[t], per head, over the first rd = rotary_dim dims (even, <= D):
//   inv_freq_j = theta^(-2j/rd),  a_j = p * inv_freq_j  (j < rd/2, angles in double)
//   y_j      = x_j cos a_j - x_{j+rd/2} sin a_j
//   y_{j+rd/2} = x_{j+rd/2} cos a_j + x_j sin a_j;    y_d = x_d for d >= rd (pass-through)
// This is x*cos + rotate_half(x)*sin with cos/sin = cat(cos a, cos a). The backward is the
// transpose, i.e. the same rotation by -a:  dx = rope(dy, -a).
// x, y (and dy, dx): [T, Hh, D], unit inner stride, head stride D, any row stride (a column
// block of a fused projection); y may alias x (in place). pos: [T] i32 contiguous.
void rope_fwd(const TensorView& y, const TensorView& x, const TensorView& pos, int64_t rotary_dim, double theta,
              Stream s = {});
void rope_bwd(const TensorView& dx, const TensorView& dy, const TensorView& pos, int64_t rotary_dim, double theta,
              Stream s = {});

// ---- varlen causal attention ------------------------------------------------------------------
// Packed sequences i = 0..N-1 in the KEY index space (natural order): sequence i owns key rows
// [c_i, c_{i+1}) with c = cu_seqlens_padded, of which the first a_i = cu_seqlens[i+1]-cu_seqlens[i]
// are real. Query rows need not be in natural order: sequence i owns query rows
// [c_i/q_div, c_{i+1}/q_div) (q_div = cp for this CP rank's zig-zag rows, 1 otherwise), and query
// row l sits at position p = q_pos[l] inside its sequence (position_ids_local). Then
//   row l is live iff p < a_i; it attends keys j in [c_i, c_i + p]   (causal, real keys only)
//   s_j = scale * q_l . k_j;  lse_l = log sum_j exp(s_j);  P_j = exp(s_j - lse_l);  o_l = sum_j P_j v_j
// per query head h, with key/value head h / (Hq/Hkv) (GQA without repeating K/V). A row that is
// not live (padding, or a sequence of actual length 0) gets o = 0 and lse = 0 and contributes no
// gradient: outputs stay finite for any packing.
// Backward (D_l = do_l . o_l;  dP_j = do_l . v_j;  dS_j = P_j (dP_j - D_l)):
//   dq_l = scale sum_j dS_j k_j;  dk_j = scale sum_l dS_j q_l;  dv_j = sum_l P_j do_l
// dq, dk, dv (=): every row is written (0 where nothing flows).
// Shapes: q, o, do, dq [Tq, Hq, D]; k, v, dk, dv [Tk, Hkv, D], Tk = c_N; one dtype, unit inner
// stride, head stride D, any row stride. lse [Tq, Hq] f32 contiguous (= in fwd, read in bwd).
// CUDA kernel family: the native flash-style kernels (src/ops/cuda/attention.cu) or cuDNN's SDPA
// with ragged (THD) offsets (src/ops/cuda/attention_cudnn.cpp), or cuDNN's forward with the
// native backward (cudnn_fwd: both deterministic; the two agree on o and lse, zeros included,
// so the native backward takes cuDNN's). The CPU ignores it.
enum class AttnBackend { native, cudnn, cudnn_fwd };
struct AttnVarlen {
  TensorView cu_seqlens_padded;  // [N+1] i32, key rows (natural order); c_N = Tk
  TensorView cu_seqlens;         // [N+1] i32, actual lengths
  TensorView q_pos;              // [Tq] i32, position of each query row inside its sequence
  int q_div = 1;                 // query rows of sequence i: [c_i/q_div, c_{i+1}/q_div)
  AttnBackend backend = AttnBackend::native;
  // Host-known bound on every padded length c_{i+1} - c_i (0: unknown). The cuDNN path sizes
  // its graph by it (a smaller value traps on the device); without it the cuDNN path reads
  // cu_seqlens_padded back, one host sync per call. The native kernels ignore it.
  int64_t max_seqlen = 0;
};
// The backend for the config value `attention.backend` (auto | native | cudnn | cudnn_fwd) on
// `dev`, or a user error naming the value and the rule: cudnn and cudnn_fwd need a CUDA build with
// cudnn_frontend and a cuDNN runtime >= 9.19 (earlier releases give NaN gradients for THD
// attention on Hopper), and bf16 (the caller checks). auto picks native: cuDNN's graph cache is
// keyed by the token total, so packs of varying size rebuild graphs in training (docs/perf.md
// v0.4.0). The CPU is always native.
struct AttnBackendChoice {
  AttnBackend backend = AttnBackend::native;
  std::string error;  // "" when usable
};
AttnBackendChoice choose_attention_backend(const std::string& requested, Device dev);
void attention_fwd(const TensorView& o, const TensorView& lse, const TensorView& q, const TensorView& k,
                   const TensorView& v, const AttnVarlen& meta, float scale, Stream s = {});
void attention_bwd(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& d_o,
                   const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                   const TensorView& lse, const AttnVarlen& meta, float scale, Stream s = {});

// ---- sigmoid output gate: y = o * sigmoid(g), elementwise ---------------------------------------
//   backward: sg = sigmoid(g);  do = dy * sg;  dg = dy * o * sg * (1 - sg)         y, do, dg (=)
// o, g, y, dy, do, dg: [R, D], one dtype, unit inner stride, any row stride (g may be the gate half of
// the q_proj output viewed per head).
void sigmoid_gate_fwd(const TensorView& y, const TensorView& o, const TensorView& g, Stream s = {});
void sigmoid_gate_bwd(const TensorView& d_o, const TensorView& dg, const TensorView& dy, const TensorView& o,
                      const TensorView& g, Stream s = {});

// ---- gather_rows: out[r] = in[idx[r]] (=) ---------------------------------------------------------
// out [R, C], in [Rin, C] of one dtype (unit inner stride, any row stride), idx [R] i32 contiguous with
// 0 <= idx < Rin (checked on the CPU). Bitwise exact: the CP key gather of the attention layer
// (cp_idx) and its adjoint (cp_inv), both permutations.
void gather_rows(const TensorView& out, const TensorView& in, const TensorView& idx, Stream s = {});

}  // namespace dt::ops
