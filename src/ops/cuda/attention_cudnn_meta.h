// Internal: the device-side metadata and row fix-ups of the cuDNN attention path
// (src/ops/cuda/attention_cudnn.cpp), kernels in attention_cudnn_meta.cu. No host syncs.
//
// cuDNN batches. Sequence i (key rows [c_i, c_{i+1}), a_i real) is split into nchunk query
// chunks: nchunk = 1 when q_div = 1 (query rows [c_i, c_{i+1})), nchunk = 2 for CP zig-zag
// rows (q_div > 1: query rows [c_i/q_div, c_{i+1}/q_div) are two chunks of C = P_i/(2 q_div)
// rows, P_i = c_{i+1} - c_i). Chunk c starts at query row r0 = c_i/q_div + c C and position
// p0 = q_pos[r0], and is one cuDNN batch with
//   seq_q = clamp(a_i - p0, 0, C),  seq_kv = p0 + seq_q (0 when seq_q = 0),  key rows from c_i,
// under a bottom-right causal mask: its query m (position p0 + m) sees keys [0, p0 + m], which
// is the op's rule. This assumes the zig-zag layout of data/packed_seq.h (each chunk's positions
// are consecutive), which is what CP produces. Batches past the real ones (the count is rounded up so that few graphs are
// built) have length 0 and start at the end of the buffers.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace dt::ops::cuda::cudnn_meta {

constexpr int kMaxRagged = 9;  // Q, K, V, O, dO, Stats, dQ, dK, dV

struct Batches {
  const int32_t* cu_pad = nullptr;  // [N+1] key rows (natural order)
  const int32_t* cu = nullptr;      // [N+1] actual lengths
  const int32_t* q_pos = nullptr;   // [Tq] position of each query row
  int N = 0, q_div = 1;
  int chunk = -1;  // -1: every chunk of every sequence (batch i*nchunk + c); c >= 0: only chunk c (batch i)
  int B = 0;       // cuDNN batch count (>= real batches)
  int64_t Tq = 0, Tk = 0;
  int max_padded = 0;  // the graph's bound: a padded length above it traps (a broken max_seqlen hint)
};
int nchunk(int q_div);

// seq_q, seq_kv: [B] i32. off: ntensors x [B+1] ragged offsets in elements (i64 when `i64`,
// else i32): off[t][b] = first row of batch b on the side of tensor t (0 query, 1 key) * mult[t];
// off[t][B] = Tq (Tk) * mult[t].
void build(const Batches& p, int ntensors, const int* side, const int64_t* mult, bool i64, int32_t* seq_q,
           int32_t* seq_kv, void* off, cudaStream_t st);

// Query rows [Tq, W] bf16 (row stride rs): rows that are not live (q_pos >= a of their
// sequence) get 0. With src0/src1 (contiguous [Tq, W] scratch of the two chunk calls), live rows
// are copied from the scratch of their chunk.
void fix_q_rows(const Batches& p, void* x, int64_t rs, int64_t W, const void* src0, const void* src1,
                cudaStream_t st);
// lse [Tq, H] f32 contiguous: 0 on rows that are not live.
void fix_lse(const Batches& p, float* lse, int64_t H, cudaStream_t st);
// Key rows [Tk, W] bf16: without sources, rows j with j - c_s >= a_s get 0 (in place); with
// src0/src1 (contiguous [Tk, W] scratch), x = sum over chunks c of (j - c_s < seq_kv of chunk c
// ? src_c : 0): the dK/dV of the two chunk calls, which see overlapping keys.
void fix_k_rows(const Batches& p, void* x, int64_t rs, int64_t W, const void* src0, const void* src1,
                cudaStream_t st);

}  // namespace dt::ops::cuda::cudnn_meta
