// Kernels behind attention_cudnn_meta.h: the cuDNN batch table (sequence lengths and ragged
// offsets, built on the device from cu_seqlens*, q_pos so no host sync is needed) and the row
// fix-ups that give the cuDNN results the op's contract (0 on rows that are not live, the two
// chunk calls of CP zig-zag rows merged). Deterministic: no atomics.
#include <cuda_bf16.h>

#include "core/cuda_check.h"
#include "ops/cuda/attention_cudnn_meta.h"

namespace dt::ops::cuda::cudnn_meta {
namespace {

struct Chunk {
  int64_t q0 = 0, k0 = 0;  // first query row, first key row
  int sq = 0, skv = 0;
};
// Chunk c of sequence i (attention_cudnn_meta.h).
__device__ Chunk chunk_of(const Batches& p, int i, int c) {
  const int c0 = p.cu_pad[i], P = p.cu_pad[i + 1] - c0, a = p.cu[i + 1] - p.cu[i];
  const int nc = p.q_div > 1 ? 2 : 1, C = P / (p.q_div * nc);
  Chunk r;
  r.q0 = c0 / p.q_div + int64_t(c) * C;
  r.k0 = c0;
  if (C > 0) {
    const int p0 = p.q_pos[r.q0];
    r.sq = min(max(a - p0, 0), C);
    r.skv = r.sq > 0 ? p0 + r.sq : 0;
  }
  return r;
}

// The sequence s with lo(s) <= x < lo(s+1), lo(s) = cu_pad[s] / div (binary search).
__device__ int seq_of(const int32_t* cu_pad, int N, int div, int64_t x) {
  int lo = 0, hi = N - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu_pad[mid] / div <= x) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

struct Ragged {
  int n;
  int side[kMaxRagged];
  int64_t mult[kMaxRagged];
};

__global__ void build_kernel(Batches p, Ragged rg, bool i64, int32_t* seq_q, int32_t* seq_kv, void* off) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b > p.B) return;
  const int nc = p.q_div > 1 ? 2 : 1, nreal = p.chunk < 0 ? p.N * nc : p.N;
  Chunk ch;
  ch.q0 = p.Tq;
  ch.k0 = p.Tk;
  if (b < nreal) {
    const int i = p.chunk < 0 ? b / nc : b, c = p.chunk < 0 ? b % nc : p.chunk;
    if (p.cu_pad[i + 1] - p.cu_pad[i] > p.max_padded) __trap();  // the graph would drop keys silently
    ch = chunk_of(p, i, c);
  }
  if (b < p.B) {
    seq_q[b] = ch.sq;
    seq_kv[b] = ch.skv;
  }
  for (int t = 0; t < rg.n; ++t) {
    const int64_t v = (rg.side[t] == 0 ? ch.q0 : ch.k0) * rg.mult[t];
    if (i64) static_cast<int64_t*>(off)[int64_t(t) * (p.B + 1) + b] = v;
    else static_cast<int32_t*>(off)[int64_t(t) * (p.B + 1) + b] = int32_t(v);
  }
}

// Query row l: its chunk (0/1) when live, -1 otherwise.
__device__ int q_row_chunk(const Batches& p, int64_t l) {
  const int s = seq_of(p.cu_pad, p.N, p.q_div, l);
  if (p.q_pos[l] >= p.cu[s + 1] - p.cu[s]) return -1;
  const int nc = p.q_div > 1 ? 2 : 1, C = (p.cu_pad[s + 1] - p.cu_pad[s]) / (p.q_div * nc);
  return (l - p.cu_pad[s] / p.q_div) >= C ? 1 : 0;
}

// One warp per row (the liveness search once per row), lanes over its 16-byte vectors of 8 bf16
// (row strides and widths are multiples of 8: checked by the op).
__global__ void fix_q_kernel(Batches p, uint4* x, int64_t rs8, int64_t W8, const uint4* s0, const uint4* s1) {
  const int64_t l = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  if (l >= p.Tq) return;
  const int c = q_row_chunk(p, l);
  if (c >= 0 && !s0) return;  // live and in place: nothing to do
  const uint4* src = c == 0 ? s0 : s1;
  for (int64_t v = threadIdx.x % 32; v < W8; v += 32)
    x[l * rs8 + v] = c < 0 ? make_uint4(0, 0, 0, 0) : src[l * W8 + v];
}

__global__ void fix_lse_kernel(Batches p, float* lse, int64_t H) {
  const int64_t l = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (l >= p.Tq || q_row_chunk(p, l) >= 0) return;
  for (int64_t h = 0; h < H; ++h) lse[l * H + h] = 0.f;
}

__device__ uint4 add_bf16x8(uint4 a, uint4 b) {
  const __nv_bfloat162* x = reinterpret_cast<const __nv_bfloat162*>(&a);
  const __nv_bfloat162* y = reinterpret_cast<const __nv_bfloat162*>(&b);
  uint4 r;
  __nv_bfloat162* z = reinterpret_cast<__nv_bfloat162*>(&r);
  for (int k = 0; k < 4; ++k) {
    const float2 u = __bfloat1622float2(x[k]), w = __bfloat1622float2(y[k]);
    z[k] = __floats2bfloat162_rn(u.x + w.x, u.y + w.y);
  }
  return r;
}

__global__ void fix_k_kernel(Batches p, uint4* x, int64_t rs8, int64_t W8, const uint4* s0, const uint4* s1) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  if (j >= p.Tk) return;
  const int s = seq_of(p.cu_pad, p.N, 1, j);
  const int64_t r = j - p.cu_pad[s];
  const uint4 zero = make_uint4(0, 0, 0, 0);
  if (!s0) {
    if (r < p.cu[s + 1] - p.cu[s]) return;  // a real key: cuDNN's value stays
    for (int64_t v = threadIdx.x % 32; v < W8; v += 32) x[j * rs8 + v] = zero;
    return;
  }
  const bool in0 = r < chunk_of(p, s, 0).skv, in1 = r < chunk_of(p, s, 1).skv;
  for (int64_t v = threadIdx.x % 32; v < W8; v += 32) {
    const uint4 a = in0 ? s0[j * W8 + v] : zero;
    x[j * rs8 + v] = in1 ? (in0 ? add_bf16x8(a, s1[j * W8 + v]) : s1[j * W8 + v]) : a;
  }
}

constexpr int kRowsPerBlock = 8;  // warps of 32 lanes, one row each
unsigned row_blocks(int64_t rows) { return unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

int nchunk(int q_div) { return q_div > 1 ? 2 : 1; }

void build(const Batches& p, int ntensors, const int* side, const int64_t* mult, bool i64, int32_t* seq_q,
           int32_t* seq_kv, void* off, cudaStream_t st) {
  DT_CHECK(ntensors <= kMaxRagged, "cudnn attention meta: {} ragged tensors > {}", ntensors, kMaxRagged);
  Ragged rg{ntensors, {}, {}};
  for (int t = 0; t < ntensors; ++t) {
    rg.side[t] = side[t];
    rg.mult[t] = mult[t];
  }
  build_kernel<<<unsigned((p.B + 1 + 127) / 128), 128, 0, st>>>(p, rg, i64, seq_q, seq_kv, off);
  DT_CUDA_LAUNCH_CHECK();
}

void fix_q_rows(const Batches& p, void* x, int64_t rs, int64_t W, const void* src0, const void* src1,
                cudaStream_t st) {
  const int64_t W8 = W / 8;
  fix_q_kernel<<<row_blocks(p.Tq), 32 * kRowsPerBlock, 0, st>>>(p, static_cast<uint4*>(x), rs / 8, W8,
                                                   static_cast<const uint4*>(src0), static_cast<const uint4*>(src1));
  DT_CUDA_LAUNCH_CHECK();
}

void fix_lse(const Batches& p, float* lse, int64_t H, cudaStream_t st) {
  fix_lse_kernel<<<unsigned((p.Tq + 255) / 256), 256, 0, st>>>(p, lse, H);
  DT_CUDA_LAUNCH_CHECK();
}

void fix_k_rows(const Batches& p, void* x, int64_t rs, int64_t W, const void* src0, const void* src1,
                cudaStream_t st) {
  const int64_t W8 = W / 8;
  fix_k_kernel<<<row_blocks(p.Tk), 32 * kRowsPerBlock, 0, st>>>(p, static_cast<uint4*>(x), rs / 8, W8,
                                                   static_cast<const uint4*>(src0), static_cast<const uint4*>(src1));
  DT_CUDA_LAUNCH_CHECK();
}

}  // namespace dt::ops::cuda::cudnn_meta
