// CUDA kernels of the gated-attention ops (math in include/deltatron/ops/attention.h): partial
// RoPE, varlen causal softmax attention with GQA (flash-attention style: forward with an online
// softmax, backward as two deterministic kernels), the sigmoid output gate and the row gather.
//
// Varlen without host syncs: a prep kernel turns (cu_seqlens_padded, cu_seqlens, q_pos, q_div)
// into one key interval per query row l,
//   kstart_l = c_s,  kend_l = c_s + q_pos_l   (s: the sequence of row l; empty when not live)
// and one interval per 64-row query tile (the union over its live rows). Every kernel masks a
// score (l, j) by kstart_l <= j <= kend_l only, so tiles may straddle sequences and CP zig-zag
// chunks (q_div > 1: positions are not monotonic in l) without special cases, and no tile reads
// keys outside its interval.
//
// Kernels (4 or 8 warps per CTA, kNW; one CTA per (16*warps-row query tile, query head) or
// (key block, query head)):
//   fwd   : S = Q K^T -> mask -> online softmax (exp2, fp32 m, l) -> P (tile dtype) -> O += P V;
//           o = O / l, lse = m + log l (natural log, fp32); rows that are not live: o = 0, lse = 0.
//   bwd   : dsum (D_l = do_l . o_l) -> dq (per query tile: P, dP = dO V^T, dS = P (dP - D),
//           dQ += dS K) -> dkv (per key block and query head, over the query tiles that can see
//           it in ascending order: P^T, dP^T, dV += P^T dO, dK += dS^T Q) -> head_group_sum
//           (G > 1 only: dk, dv of a KV head = its G query heads' f32 partials added in head
//           order; G == 1: dkv writes dk, dv itself). No atomics: every sum has a fixed order,
//           two runs give the same bits. K/V of a KV head are never repeated.
// Precision: bf16 tiles -> mma.sync bf16 with fp32 accumulation, P and dS rounded to bf16 for
// the second product (as flash-attention does); f32 tiles -> the same kernels with exact fp32
// FFMA products (mma_common.cuh). Head dim D: a multiple of 8 up to 256; tiles are padded to
// DP in {64, 128, 256} columns with zeros, which leaves every dot product unchanged.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/cuda_check.h"
#include "deltatron/core/tensor.h"
#include "ops/attention_backends.h"
#include "ops/cp_a2a_backends.h"
#include "ops/cuda/gdn_elementwise_common.cuh"
#include "ops/cuda/layers_common.cuh"
#include "ops/cuda/mma_common.cuh"

namespace dt::ops::cuda {
namespace {
namespace attn {

using namespace mma;

constexpr int kBM = 64;  // rows of a prep tile and of the dk/dv kernel's query tiles
// Warps per CTA (16 query rows each in fwd and dq): 8 for bf16 tiles with DP >= 128, which
// halves the K/V (fwd, dq) and Q/dO (dk/dv) tile loads per FLOP; 4 otherwise (f32 tiles need
// the shared memory, DP = 64 the even warp split).
template <class T, int DP> constexpr int kNW = (sizeof(T) == 2 && DP >= 128) ? 8 : 4;
// The forward measured faster with 4 warps (more CTAs per sequence, better balance).
constexpr int kNWf = 4;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ---- prep: per-row key intervals and per-tile unions ----------------------------------------
__global__ void rows_kernel(const int32_t* cu_pad, const int32_t* cu, const int32_t* q_pos, int N, int Tq, int q_div,
                            int32_t* kstart, int32_t* kend, int32_t* tile_lo, int32_t* tile_hi) {
  __shared__ int s_lo[kBM], s_hi[kBM];
  const int l = blockIdx.x * kBM + threadIdx.x;
  int lo = INT_MAX, hi = -1;
  if (l < Tq) {
    int a = 0, b = N - 1;  // the largest s with c_s / q_div <= l (an empty sequence owns no row)
    while (a < b) {
      const int m = (a + b + 1) >> 1;
      if (cu_pad[m] / q_div <= l) a = m;
      else b = m - 1;
    }
    const int ks = cu_pad[a], p = q_pos[l];
    const int ke = p < cu[a + 1] - cu[a] ? ks + p : ks - 1;
    kstart[l] = ks;
    kend[l] = ke;
    if (ke >= ks) lo = ks, hi = ke;
  }
  s_lo[threadIdx.x] = lo;
  s_hi[threadIdx.x] = hi;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 1; i < kBM; ++i) lo = min(lo, s_lo[i]), hi = max(hi, s_hi[i]);
    tile_lo[blockIdx.x] = lo;
    tile_hi[blockIdx.x] = hi;
  }
}

struct Params {
  const void *q, *k, *v, *o, *d_o;
  void *out_o, *dq, *dk, *dv;
  float* lse;         // [Tq, Hq]
  const float* dsum;  // [Tq, Hq]
  float *dk_part, *dv_part;  // [Tk, Hq, D] f32 per-query-head dK (unscaled), dV when G > 1; else null
  int64_t q_rs, k_rs, v_rs, o_rs, do_rs, dq_rs, dk_rs, dv_rs;  // row strides (elements)
  int Tq, Tk, Hq, Hkv, G, D, N, q_div;
  float scale, scale_log2;
  const int32_t *kstart, *kend, *tile_lo, *tile_hi, *cu_pad;
};

template <class T, int DP> constexpr int LD = DP + kPad<T>;

// Grid order of fwd, dq and dkv: blockIdx.x = query head, so the heads of one tile (the G heads of
// a KV head read the same K/V) start together; blockIdx.y = query tile or key block. fwd and dq
// walk their query tiles last-first (blockIdx.y = 0 is the last tile): under the causal mask the
// later rows of a sequence see more keys, so the long CTAs start in the first waves. dkv keeps its
// key blocks ascending: the first block of a sequence is seen by all its query tiles, the longest
// chain, and already comes first. Launchers size grid.y with the same num_tiles().
constexpr int64_t kMaxGridY = 65535;
template <int BM> __host__ __device__ constexpr int num_tiles(int rows) { return (rows + BM - 1) / BM; }
// First query row of this CTA's BM-row tile, last tile first.
template <int BM> __device__ __forceinline__ int tile_row0_last_first(int Tq) {
  return (num_tiles<BM>(Tq) - 1 - int(blockIdx.y)) * BM;
}

// ---- forward ---------------------------------------------------------------------------------
// The key interval of query rows [r0, r0 + BM): the union of its prep tiles.
template <int BM>
__device__ __forceinline__ void tile_range(const Params& p, int r0, int& lo, int& hi) {
  lo = INT_MAX;
  hi = -1;
#pragma unroll
  for (int s = 0; s < BM / kBM; ++s) {
    const int t = r0 / kBM + s;
    if (t * kBM < p.Tq) lo = min(lo, p.tile_lo[t]), hi = max(hi, p.tile_hi[t]);
  }
}

// acc[16 x 8*WN] += A B with A = [16 x 16*KS] held in the registers of m16n8 accumulator tiles
// c[0][0 .. 2*KS) (the C fragment of keys 16kk..16kk+15 is the A fragment of k-step kk once
// packed to bf16) and B = sB[k][n] row-major. bf16 only: P (fwd) and dS (dq) never touch
// shared memory.
template <int KS, int WN>
__device__ __forceinline__ void warp_gemm_regA(float (&acc)[1][WN][4], const float (&c)[1][2 * KS][4],
                                               const bf16* sB, int ldb) {
  const int lane = threadIdx.x & 31, mi = lane >> 3, r8 = lane & 7;
  auto pack = [](float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  };
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) {
    const uint32_t a[4] = {pack(c[0][2 * kk][0], c[0][2 * kk][1]), pack(c[0][2 * kk][2], c[0][2 * kk][3]),
                           pack(c[0][2 * kk + 1][0], c[0][2 * kk + 1][1]),
                           pack(c[0][2 * kk + 1][2], c[0][2 * kk + 1][3])};
#pragma unroll
    for (int j = 0; j < WN; j += 2) {
      uint32_t b[4];
      ldsm_x4_t(b, sB + (16 * kk + r8 + (mi & 1) * 8) * ldb + 8 * j + (mi >> 1) * 8);
      mma_bf16(acc[0][j], a, b[0], b[1]);
      mma_bf16(acc[0][j + 1], a, b[2], b[3]);
    }
  }
}

template <class T, int DP, int BN>
constexpr size_t fwd_smem() {
  constexpr int BM = 16 * kNWf;
  return size_t(BM + 2 * BN) * LD<T, DP> * sizeof(T) + size_t(BM) * (BN + kPad<T>) * sizeof(T);
}

template <class T, int DP, int BN>
__global__ void __launch_bounds__(32 * kNWf) fwd_kernel(Params p) {
  constexpr int L = LD<T, DP>, LP = BN + kPad<T>, BM = 16 * kNWf, kThreads = 32 * kNWf;
  constexpr bool kRegA = std::is_same_v<T, bf16>;  // P stays in registers
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + BM * L;
  T* sV = sK + BN * L;
  T* sP = sV + BN * L;
  const int h = blockIdx.x, hk = h / p.G;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int r0 = tile_row0_last_first<BM>(p.Tq), m0 = warp * 16;
  int lo, hi;
  tile_range<BM>(p, r0, lo, hi);
  const T* Q = static_cast<const T*>(p.q) + h * p.D;
  const T* K = static_cast<const T*>(p.k) + hk * p.D;
  const T* V = static_cast<const T*>(p.v) + hk * p.D;

  int ks[2], ke[2];
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    const int l = r0 + m0 + g + 8 * h2;
    ks[h2] = l < p.Tq ? p.kstart[l] : 0;
    ke[h2] = l < p.Tq ? p.kend[l] : -1;
  }
  float acc[1][DP / 8][4];
  zero(acc);
  float m[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.f, 0.f};

  if (lo <= hi) {
    load_tile(sQ, L, Q + int64_t(r0) * p.q_rs, p.q_rs, BM, min(BM, p.Tq - r0), p.D, DP, tid, kThreads);
    load_tile(sK, L, K + int64_t(lo) * p.k_rs, p.k_rs, BN, min(BN, p.Tk - lo), p.D, DP, tid, kThreads);
    cp_commit();
    for (int j0 = lo; j0 <= hi; j0 += BN) {
      cp_wait<0>();
      __syncthreads();  // Q, K_j landed; every warp is done with the previous V
      load_tile(sV, L, V + int64_t(j0) * p.v_rs, p.v_rs, BN, min(BN, p.Tk - j0), p.D, DP, tid, kThreads);
      cp_commit();
      float s[1][BN / 8][4];
      zero(s);
      warp_gemm<1, BN / 8, false, true>(s, sQ, L, sK, L, m0, 0, DP);
      // Mask, online softmax in the exp2 domain; P goes to this warp's rows of sP.
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h2 = e >> 1, col = j0 + 8 * j + 2 * t4 + (e & 1);
          const bool ok = col >= ks[h2] && col <= ke[h2];
          s[0][j][e] = ok ? s[0][j][e] * p.scale_log2 : -INFINITY;
          mx[h2] = fmaxf(mx[h2], s[0][j][e]);
        }
      float alpha[2], base[2];
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        mx[h2] = fmaxf(mx[h2], __shfl_xor_sync(0xffffffffu, mx[h2], 1));
        mx[h2] = fmaxf(mx[h2], __shfl_xor_sync(0xffffffffu, mx[h2], 2));
        const float mn = fmaxf(m[h2], mx[h2]);
        base[h2] = mn == -INFINITY ? 0.f : mn;  // a row with nothing visible yet stays at 0
        alpha[h2] = exp2f(m[h2] - base[h2]);    // m = -inf -> 0
        m[h2] = mn;
        lsum[h2] *= alpha[h2];
      }
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        float pv[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          pv[e] = exp2f(s[0][j][e] - base[e >> 1]);
          lsum[e >> 1] += pv[e];
          s[0][j][e] = pv[e];
        }
        if constexpr (!kRegA) {
          store2(sP + (m0 + g) * LP + 8 * j + 2 * t4, pv[0], pv[1]);
          store2(sP + (m0 + g + 8) * LP + 8 * j + 2 * t4, pv[2], pv[3]);
        }
      }
#pragma unroll
      for (int j = 0; j < DP / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[0][j][e] *= alpha[e >> 1];
      cp_wait<0>();
      __syncthreads();  // V_j landed, sP written; every warp is done with K_j
      if (j0 + BN <= hi) {
        load_tile(sK, L, K + int64_t(j0 + BN) * p.k_rs, p.k_rs, BN, min(BN, p.Tk - j0 - BN), p.D, DP, tid, kThreads);
        cp_commit();
      }
      if constexpr (kRegA) warp_gemm_regA<BN / 16, DP / 8>(acc, s, sV, L);
      else warp_gemm<1, DP / 8, false, false>(acc, sP, LP, sV, L, m0, 0, BN);
    }
  }
  // Epilogue: the row sums are spread over the 4 lanes of a quad.
  T* O = static_cast<T*>(p.out_o) + h * p.D;
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    lsum[h2] += __shfl_xor_sync(0xffffffffu, lsum[h2], 1);
    lsum[h2] += __shfl_xor_sync(0xffffffffu, lsum[h2], 2);
  }
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    const int l = r0 + m0 + g + 8 * h2;
    if (l >= p.Tq) continue;
    const float inv = ke[h2] >= ks[h2] ? 1.f / lsum[h2] : 0.f;  // not live: o = 0
#pragma unroll
    for (int j = 0; j < DP / 8; ++j) {
      const int c = 8 * j + 2 * t4;
      if (c < p.D) store2(O + int64_t(l) * p.o_rs + c, acc[0][j][2 * h2] * inv, acc[0][j][2 * h2 + 1] * inv);
    }
  }
  if (t4 == 0)
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const int l = r0 + m0 + g + 8 * h2;
      if (l < p.Tq) p.lse[int64_t(l) * p.Hq + h] = ke[h2] >= ks[h2] ? (m[h2] + log2f(lsum[h2])) * kLn2 : 0.f;
    }
}

// ---- backward: D_l = do_l . o_l per (row, head), fp32 -------------------------------------------
template <class T>
__global__ void dsum_kernel(Params p, float* dsum) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);  // (l, h)
  if (row >= int64_t(p.Tq) * p.Hq) return;
  const int64_t l = row / p.Hq, h = row - l * p.Hq;
  const T* d_o = static_cast<const T*>(p.d_o) + l * p.do_rs + h * p.D;
  const T* o = static_cast<const T*>(p.o) + l * p.o_rs + h * p.D;
  float s = 0.f;
  for (int e = threadIdx.x & 31; e < p.D; e += 32) s = fmaf(to_f(d_o[e]), to_f(o[e]), s);
  for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  if ((threadIdx.x & 31) == 0) dsum[row] = s;
}

// ---- backward: dq per (query tile, query head) --------------------------------------------------
template <class T, int DP> constexpr int kBNq = (sizeof(T) == 4 && DP == 256) ? 32 : 64;
template <class T, int DP>
constexpr size_t dq_smem() {
  constexpr int BN = kBNq<T, DP>, BM = 16 * kNW<T, DP>;
  return size_t(2 * BM + 2 * BN) * LD<T, DP> * sizeof(T) + size_t(BM) * (BN + kPad<T>) * sizeof(T);
}

template <class T, int DP>
__global__ void __launch_bounds__(32 * kNW<T, DP>) dq_kernel(Params p) {
  constexpr int BN = kBNq<T, DP>, L = LD<T, DP>, LP = BN + kPad<T>, BM = 16 * kNW<T, DP>, kThreads = 32 * kNW<T, DP>;
  constexpr bool kRegA = std::is_same_v<T, bf16>;  // dS stays in registers
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sdO = sQ + BM * L;
  T* sK = sdO + BM * L;
  T* sV = sK + BN * L;
  T* sdS = sV + BN * L;
  const int h = blockIdx.x, hk = h / p.G;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int r0 = tile_row0_last_first<BM>(p.Tq), m0 = warp * 16;
  int lo, hi;
  tile_range<BM>(p, r0, lo, hi);
  const T* K = static_cast<const T*>(p.k) + hk * p.D;
  const T* V = static_cast<const T*>(p.v) + hk * p.D;

  int ks[2], ke[2];
  float lse2[2], dl[2];
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    const int l = r0 + m0 + g + 8 * h2;
    const bool in = l < p.Tq;
    ks[h2] = in ? p.kstart[l] : 0;
    ke[h2] = in ? p.kend[l] : -1;
    lse2[h2] = in ? p.lse[int64_t(l) * p.Hq + h] * kLog2e : 0.f;
    dl[h2] = in ? p.dsum[int64_t(l) * p.Hq + h] : 0.f;
  }
  float acc[1][DP / 8][4];
  zero(acc);
  if (lo <= hi) {
    const int nq = min(BM, p.Tq - r0);
    load_tile(sQ, L, static_cast<const T*>(p.q) + int64_t(r0) * p.q_rs + h * p.D, p.q_rs, BM, nq, p.D, DP, tid,
              kThreads);
    load_tile(sdO, L, static_cast<const T*>(p.d_o) + int64_t(r0) * p.do_rs + h * p.D, p.do_rs, BM, nq, p.D, DP, tid,
              kThreads);
    for (int j0 = lo; j0 <= hi; j0 += BN) {
      load_tile(sK, L, K + int64_t(j0) * p.k_rs, p.k_rs, BN, min(BN, p.Tk - j0), p.D, DP, tid, kThreads);
      load_tile(sV, L, V + int64_t(j0) * p.v_rs, p.v_rs, BN, min(BN, p.Tk - j0), p.D, DP, tid, kThreads);
      cp_commit();
      cp_wait<0>();
      __syncthreads();
      float s[1][BN / 8][4], dp[1][BN / 8][4];
      zero(s);
      zero(dp);
      warp_gemm<1, BN / 8, false, true>(s, sQ, L, sK, L, m0, 0, DP);
      warp_gemm<1, BN / 8, false, true>(dp, sdO, L, sV, L, m0, 0, DP);
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        float ds[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h2 = e >> 1, col = j0 + 8 * j + 2 * t4 + (e & 1);
          const bool ok = col >= ks[h2] && col <= ke[h2];
          const float pr = ok ? exp2f(s[0][j][e] * p.scale_log2 - lse2[h2]) : 0.f;
          ds[e] = pr * (dp[0][j][e] - dl[h2]);
          s[0][j][e] = ds[e];
        }
        if constexpr (!kRegA) {
          store2(sdS + (m0 + g) * LP + 8 * j + 2 * t4, ds[0], ds[1]);
          store2(sdS + (m0 + g + 8) * LP + 8 * j + 2 * t4, ds[2], ds[3]);
        }
      }
      if constexpr (kRegA) {
        warp_gemm_regA<BN / 16, DP / 8>(acc, s, sK, L);
      } else {
        __syncwarp();  // dS rows are this warp's own
        warp_gemm<1, DP / 8, false, false>(acc, sdS, LP, sK, L, m0, 0, BN);
      }
      __syncthreads();  // before the next K/V overwrite the tiles
    }
  }
  T* dQ = static_cast<T*>(p.dq) + h * p.D;
  frag_pairs(acc, m0, 0, [&](int r, int c, float v0, float v1) {
    const int l = r0 + r;
    if (l >= p.Tq || c >= p.D) return;
    store2(dQ + int64_t(l) * p.dq_rs + c, v0 * p.scale, v1 * p.scale);  // not live: acc = 0
  });
}

// ---- backward: dk, dv per (key block, query head) -----------------------------------------------
// One CTA per (key block, query head h), so the longest chain is one head's query tiles, not G
// heads'. kSplit false (G == 1): dK, dV go straight to dk, dv. kSplit (G > 1): the head's f32
// partials go to dk_part, dv_part (dK unscaled) and head_group_sum_kernel adds the G heads of
// each KV head in head order.
// Query-side stages: 2 (tile t+1's Q, dO and row data load while tile t computes) where the
// second stage still fits one CTA per SM, bf16 DP 256 (already one CTA per SM by its registers);
// 1 elsewhere (bf16 DP <= 128 would drop from 2 CTAs per SM to 1, f32 DP 256 does not fit).
template <class T, int DP> constexpr int kBNk = (sizeof(T) == 4 && DP == 256) ? 32 : 64;
template <class T, int DP> constexpr int kStagesK = (sizeof(T) == 2 && DP == 256) ? 2 : 1;
template <class T, int DP>
constexpr size_t dkv_smem() {
  constexpr int BN = kBNk<T, DP>, S = kStagesK<T, DP>;
  return size_t(2 * BN + 2 * S * kBM) * LD<T, DP> * sizeof(T) + size_t(2 * BN) * (kBM + kPad<T>) * sizeof(T) +
         size_t(S) * 4 * kBM * sizeof(float);
}
constexpr size_t kMaxSmem = 227 * 1024;  // per block on sm_90
static_assert(dkv_smem<bf16, 256>() <= kMaxSmem && dkv_smem<bf16, 128>() <= kMaxSmem &&
                  dkv_smem<bf16, 64>() <= kMaxSmem && dkv_smem<float, 256>() <= kMaxSmem &&
                  dkv_smem<float, 128>() <= kMaxSmem && dkv_smem<float, 64>() <= kMaxSmem,
              "dkv_kernel shared memory over the sm_90 limit");
// bf16 DP 256: K, V and 2 stages of Q, dO (264-element rows), P^T, dS^T (72), 2 stages of row data.
static_assert(dkv_smem<bf16, 256>() == (128 + 256) * 264 * 2 + 128 * 72 * 2 + 2 * 4 * 64 * 4 &&
                  dkv_smem<bf16, 256>() == 223232,
              "bf16 DP 256 dkv_kernel: 218 KB, one CTA per SM");

template <class T, int DP, bool kSplit>
__global__ void __launch_bounds__(32 * kNW<T, DP>) dkv_kernel(Params p) {
  constexpr int NW = kNW<T, DP>, kThreads = 32 * NW;
  constexpr int BN = kBNk<T, DP>, L = LD<T, DP>, LQ = kBM + kPad<T>;
  // S^T [BN][kBM] over the NW warps: WMR row groups of 16 keys x WNC column groups of queries.
  constexpr int WMR = BN / 16, WNC = NW / WMR, SW = kBM / 8 / WNC;
  // dK, dV [BN][DP]: every warp all BN rows, DP/NW columns.
  constexpr int AM = BN / 16, AN = DP / (8 * NW);
  constexpr int S = kStagesK<T, DP>;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);  // [BN][L]
  T* sV = sK + BN * L;                 // [BN][L]
  T* sQ0 = sV + BN * L;                // [S][kBM][L]
  T* sdO0 = sQ0 + S * kBM * L;         // [S][kBM][L]
  T* sPt = sdO0 + S * kBM * L;         // [BN][LQ]
  T* sdSt = sPt + BN * LQ;             // [BN][LQ]
  int* s_rows0 = reinterpret_cast<int*>(sdSt + BN * LQ);  // [S][4][kBM]: kstart, kend, lse log2(e), dsum

  const int j0 = blockIdx.y * BN, h = blockIdx.x;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int sm0 = (warp % WMR) * 16, sn0 = (warp / WMR) * (kBM / WNC);
  const int an0 = warp * (DP / NW);
  const int nk = min(BN, p.Tk - j0);
  // The sequences this key block touches and so the query rows that may see it.
  auto seq_of = [&](int j) {
    int a = 0, b = p.N - 1;
    while (a < b) {
      const int m = (a + b + 1) >> 1;
      if (p.cu_pad[m] <= j) a = m;
      else b = m - 1;
    }
    return a;
  };
  const int qlo = p.cu_pad[seq_of(j0)] / p.q_div, qhi = p.cu_pad[seq_of(j0 + nk - 1) + 1] / p.q_div;

  {
    const int hk = h / p.G;
    load_tile(sK, L, static_cast<const T*>(p.k) + int64_t(j0) * p.k_rs + hk * p.D, p.k_rs, BN, nk, p.D, DP, tid,
              kThreads);
    load_tile(sV, L, static_cast<const T*>(p.v) + int64_t(j0) * p.v_rs + hk * p.D, p.v_rs, BN, nk, p.D, DP, tid,
              kThreads);
  }
  cp_commit();
  // The query tiles that see this block, ascending: t in [qlo / kBM, tend) with the tile's key
  // interval meeting [j0, j0 + nk). next_tile(t): the first such tile >= t (tend: none), 32
  // candidates per step (one per lane; the ballot makes it warp-uniform).
  const int tend = num_tiles<kBM>(qhi);
  auto next_tile = [&](int t) {
    for (; t < tend; t += 32) {
      const int u = t + lane;
      const unsigned m = __ballot_sync(0xffffffffu, u < tend && p.tile_hi[u] >= j0 && p.tile_lo[u] <= j0 + nk - 1);
      if (m) return t + __ffs(m) - 1;
    }
    return tend;
  };
  // Tile t's Q, dO rows and per-row data into stage st (one cp.async group). The row data of thread
  // tid < kBM: kstart, kend, lse, dsum of row r0 + tid, zero-filled past Tq (fixed in fix_rows).
  auto issue = [&](int t, int st) {
    const int r0 = t * kBM, nq = min(kBM, p.Tq - r0);
    load_tile(sQ0 + st * kBM * L, L, static_cast<const T*>(p.q) + int64_t(r0) * p.q_rs + h * p.D, p.q_rs, kBM, nq,
              p.D, DP, tid, kThreads);
    load_tile(sdO0 + st * kBM * L, L, static_cast<const T*>(p.d_o) + int64_t(r0) * p.do_rs + h * p.D, p.do_rs, kBM,
              nq, p.D, DP, tid, kThreads);
    if (tid < kBM) {
      int* r = s_rows0 + st * 4 * kBM + tid;
      const int l = r0 + tid;
      const bool in = l < p.Tq;
      const int64_t lh = in ? int64_t(l) * p.Hq + h : 0;
      cp_async4(r, p.kstart + (in ? l : 0), in);
      cp_async4(r + kBM, p.kend + (in ? l : 0), in);
      cp_async4(r + 2 * kBM, p.lse + lh, in);
      cp_async4(r + 3 * kBM, p.dsum + lh, in);
    }
    cp_commit();
  };
  // Once this thread's copies of tile t landed: lse to the exp2 domain, and a row past Tq gets the
  // empty key interval [0, -1] (lse = dsum = 0 from the zero fill), so it contributes nothing.
  auto fix_rows = [&](int t, int st) {
    if (tid < kBM) {
      int* r = s_rows0 + st * 4 * kBM + tid;
      float* lse2 = reinterpret_cast<float*>(r + 2 * kBM);
      *lse2 *= kLog2e;
      if (t * kBM + tid >= p.Tq) r[kBM] = -1;
    }
  };

  float dk[AM][AN][4], dv[AM][AN][4];
  zero(dk);
  zero(dv);
  int t = next_tile(qlo / kBM);
  if constexpr (S == 2)
    if (t < tend) issue(t, 0);
  for (int it = 0; t < tend; ++it) {
    const int st = S == 2 ? (it & 1) : 0, tn = next_tile(t + 1);
    __syncthreads();  // every warp is done with the previous tile's stage and sPt, sdSt
    if constexpr (S == 2) {
      if (tn < tend) {
        issue(tn, st ^ 1);  // the stage the previous tile used
        cp_wait<1>();       // all but tile tn's group: K, V and tile t landed
      } else {
        cp_wait<0>();
      }
    } else {
      issue(t, 0);
      cp_wait<0>();
    }
    fix_rows(t, st);
    __syncthreads();
    const T* sQ = sQ0 + st * kBM * L;
    const T* sdO = sdO0 + st * kBM * L;
    const int* s_ks = s_rows0 + st * 4 * kBM;
    const int* s_ke = s_ks + kBM;
    const float* s_lse = reinterpret_cast<const float*>(s_ke + kBM);
    const float* s_d = s_lse + kBM;
    float s[1][SW][4], dp[1][SW][4];
    zero(s);
    zero(dp);
    warp_gemm<1, SW, false, true>(s, sK, L, sQ, L, sm0, sn0, DP);    // S^T = K Q^T
    warp_gemm<1, SW, false, true>(dp, sV, L, sdO, L, sm0, sn0, DP);  // dP^T = V dO^T
#pragma unroll
    for (int j = 0; j < SW; ++j) {
      float pr[4], ds[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = j0 + sm0 + g + 8 * (e >> 1), c = sn0 + 8 * j + 2 * t4 + (e & 1);
        const bool ok = key >= s_ks[c] && key <= s_ke[c];
        pr[e] = ok ? exp2f(s[0][j][e] * p.scale_log2 - s_lse[c]) : 0.f;
        ds[e] = pr[e] * (dp[0][j][e] - s_d[c]);
      }
      const int cc = sn0 + 8 * j + 2 * t4;
      store2(sPt + (sm0 + g) * LQ + cc, pr[0], pr[1]);
      store2(sPt + (sm0 + g + 8) * LQ + cc, pr[2], pr[3]);
      store2(sdSt + (sm0 + g) * LQ + cc, ds[0], ds[1]);
      store2(sdSt + (sm0 + g + 8) * LQ + cc, ds[2], ds[3]);
    }
    __syncthreads();
    warp_gemm<AM, AN, false, false>(dv, sPt, LQ, sdO, L, 0, an0, kBM);   // dV += P^T dO
    warp_gemm<AM, AN, false, false>(dk, sdSt, LQ, sQ, L, 0, an0, kBM);  // dK += dS^T Q
    t = tn;
  }
  cp_wait<0>();  // K/V of a block no query sees were never waited for
  // Every row r < nk and column c < D is written (zeros where no query sees the key).
  if constexpr (!kSplit) {
    T* dK = static_cast<T*>(p.dk) + h * p.D;  // G == 1: KV head h
    T* dV = static_cast<T*>(p.dv) + h * p.D;
    frag_pairs(dk, 0, an0, [&](int r, int c, float v0, float v1) {
      if (r < nk && c < p.D) store2(dK + int64_t(j0 + r) * p.dk_rs + c, v0 * p.scale, v1 * p.scale);
    });
    frag_pairs(dv, 0, an0, [&](int r, int c, float v0, float v1) {
      if (r < nk && c < p.D) store2(dV + int64_t(j0 + r) * p.dv_rs + c, v0, v1);
    });
  } else {
    const int64_t prs = int64_t(p.Hq) * p.D;  // row stride of the [Tk, Hq, D] partials
    float* dKp = p.dk_part + int64_t(h) * p.D;
    float* dVp = p.dv_part + int64_t(h) * p.D;
    frag_pairs(dk, 0, an0, [&](int r, int c, float v0, float v1) {
      if (r < nk && c < p.D) store2(dKp + int64_t(j0 + r) * prs + c, v0, v1);
    });
    frag_pairs(dv, 0, an0, [&](int r, int c, float v0, float v1) {
      if (r < nk && c < p.D) store2(dVp + int64_t(j0 + r) * prs + c, v0, v1);
    });
  }
}

// ---- backward: dk, dv = the sum of the G query heads' partials of each KV head -------------------
// out[j, hk, :] = mul * sum_{gi < G} part[j, hk G + gi, :], gi ascending then one multiply: a fixed
// order, so the same bits every run and on either path. part: [rows, Hkv G, D] f32 contiguous;
// out: [rows, Hkv, D] in T, head stride D, row stride out_rs. V output elements per item: kVec<T>
// (float4 loads, one 16-byte store; needs D % kVec<T> == 0 and 16-byte aligned bases and row
// stride) or 1 (the element fallback). blockIdx.y picks the sum (0: dk, 1: dv).
template <class T>
struct GroupSum {
  T* out;
  int64_t out_rs;
  const float* part;
  float mul;
};
template <class T, int V>
__global__ void __launch_bounds__(256) head_group_sum_kernel(GroupSum<T> s0, GroupSum<T> s1, int64_t rows, int Hkv,
                                                             int G, int D) {
  static_assert(V == 1 || V == ew::kVec<T>, "one element or one 16-byte vector of T");
  const GroupSum<T> s = blockIdx.y == 0 ? s0 : s1;
  const int64_t nv = D / V, n = rows * Hkv * nv;  // items
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t rh = i / nv, c = (i - rh * nv) * V;  // rh = j Hkv + hk
    const int64_t j = rh / Hkv, hk = rh - j * Hkv;
    const float* g_src = s.part + rh * G * D + c;  // part[j, hk G, c]
    float r_acc[V];
    if constexpr (V == 1) {
      r_acc[0] = __ldg(g_src);
      for (int gi = 1; gi < G; ++gi) r_acc[0] += __ldg(g_src + int64_t(gi) * D);
      r_acc[0] *= s.mul;
      s.out[j * s.out_rs + hk * D + c] = from_f<T>(r_acc[0]);
    } else {
#pragma unroll
      for (int v = 0; v < V; v += 4) {
        const float4 x = __ldg(reinterpret_cast<const float4*>(g_src + v));
        r_acc[v] = x.x, r_acc[v + 1] = x.y, r_acc[v + 2] = x.z, r_acc[v + 3] = x.w;
      }
      for (int gi = 1; gi < G; ++gi)
#pragma unroll
        for (int v = 0; v < V; v += 4) {
          const float4 x = __ldg(reinterpret_cast<const float4*>(g_src + int64_t(gi) * D + v));
          r_acc[v] += x.x, r_acc[v + 1] += x.y, r_acc[v + 2] += x.z, r_acc[v + 3] += x.w;
        }
#pragma unroll
      for (int v = 0; v < V; ++v) r_acc[v] *= s.mul;
      ew::store16<T>(s.out + j * s.out_rs + hk * D + c, r_acc);
    }
  }
}

// ---- launchers ---------------------------------------------------------------------------------
template <class K>
void set_smem(K kernel, size_t bytes) {
  DT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

// The tiles or key blocks of `rows` go on grid.y, which holds at most 65535.
void check_grid_y(int64_t n, int per, const char* op, const char* what, const char* rows_name, int64_t rows) {
  DT_CHECK(n <= kMaxGridY,
           "{}: {} = {} needs {} {} of {} rows, more than the grid's y limit {} ---> hint: at most {} rows per call "
           "(fewer tokens per micro-batch)",
           op, rows_name, rows, n, what, per, kMaxGridY, kMaxGridY * per);
}

// Calls f.template operator()<T, DP>() for the dtype and padded head dim.
template <class F>
void dispatch(DType dt, int D, F&& f) {
  auto by_dim = [&]<class T>() {
    if (D <= 64) f.template operator()<T, 64>();
    else if (D <= 128) f.template operator()<T, 128>();
    else f.template operator()<T, 256>();
  };
  if (dt == DType::bf16) by_dim.template operator()<bf16>();
  else by_dim.template operator()<float>();
}

struct Rows {
  Tensor kstart, kend, tile_lo, tile_hi;
};
Rows make_rows(const AttnVarlen& m, int Tq, cudaStream_t st) {
  const Device dev = m.cu_seqlens_padded.device;
  const int tiles = (Tq + kBM - 1) / kBM;
  Rows r{Tensor::empty(Shape{Tq}, DType::i32, dev), Tensor::empty(Shape{Tq}, DType::i32, dev),
         Tensor::empty(Shape{tiles}, DType::i32, dev), Tensor::empty(Shape{tiles}, DType::i32, dev)};
  const int N = int(m.cu_seqlens_padded.shape[0] - 1);
  rows_kernel<<<tiles, kBM, 0, st>>>(m.cu_seqlens_padded.ptr<int32_t>(), m.cu_seqlens.ptr<int32_t>(),
                                      m.q_pos.ptr<int32_t>(), N, Tq, m.q_div, r.kstart.ptr<int32_t>(),
                                      r.kend.ptr<int32_t>(), r.tile_lo.ptr<int32_t>(), r.tile_hi.ptr<int32_t>());
  DT_CUDA_LAUNCH_CHECK();
  return r;
}

Params make_params(const TensorView& q, const TensorView& k, const TensorView& v, const AttnVarlen& m, const Rows& r,
                   float scale) {
  Params p{};
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.q_rs = q.stride[0];
  p.k_rs = k.stride[0];
  p.v_rs = v.stride[0];
  p.Tq = int(q.shape[0]);
  p.Tk = int(k.shape[0]);
  p.Hq = int(q.shape[1]);
  p.Hkv = int(k.shape[1]);
  p.G = p.Hq / p.Hkv;
  p.D = int(q.shape[2]);
  p.N = int(m.cu_seqlens_padded.shape[0] - 1);
  p.q_div = m.q_div;
  p.scale = scale;
  p.scale_log2 = scale * kLog2e;
  p.kstart = r.kstart.ptr<int32_t>();
  p.kend = r.kend.ptr<int32_t>();
  p.tile_lo = r.tile_lo.ptr<int32_t>();
  p.tile_hi = r.tile_hi.ptr<int32_t>();
  p.cu_pad = m.cu_seqlens_padded.ptr<int32_t>();
  return p;
}

// ---- rope, sigmoid gate, gather -----------------------------------------------------------------
// RoPE: the angle of (t, j) is the same for every head, so one thread per (t, j < rd/2) computes
// its sincos once (in double, as before: the same bits) and rotates that pair of columns in all
// H heads, with the loads of up to kRopeHeads heads issued before the stores. inv_freq_j =
// theta^(-2j/rd) is computed once per block into shared memory (same expression, same bits).
// The pass-through dims d >= rd are copied by rope_pass_kernel only when y is not x (in place
// they are already there).
constexpr int kRopeHeads = 8;
template <class T>
__global__ void rope_kernel(T* y, int64_t ys, const T* x, int64_t xs, const int32_t* pos, int64_t T_, int H, int D,
                            int rd, double theta, double sign) {
  extern __shared__ double s_inv[];  // [rd / 2]
  const int half = rd / 2;
  for (int j = threadIdx.x; j < half; j += blockDim.x) s_inv[j] = pow(theta, -double(2 * j) / double(rd));
  __syncthreads();
  const int64_t n = T_ * half;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / half;
    const int j = int(i - t * half);
    // angles in double: positions up to 2^31 keep full fp32 accuracy
    const double a = double(pos[t]) * s_inv[j];
    double sn, cs;
    sincos(a, &sn, &cs);
    sn *= sign;
    const T* xr = x + t * xs + j;
    T* yr = y + t * ys + j;
    for (int h0 = 0; h0 < H; h0 += kRopeHeads) {
      float u[kRopeHeads], w[kRopeHeads];
#pragma unroll
      for (int k = 0; k < kRopeHeads; ++k)  // both halves of every head read before any write
        if (h0 + k < H) u[k] = to_f(xr[int64_t(h0 + k) * D]), w[k] = to_f(xr[int64_t(h0 + k) * D + half]);
#pragma unroll
      for (int k = 0; k < kRopeHeads; ++k)
        if (h0 + k < H) {
          const double du = u[k], dw = w[k];
          yr[int64_t(h0 + k) * D] = from_f<T>(float(du * cs - dw * sn));
          yr[int64_t(h0 + k) * D + half] = from_f<T>(float(dw * cs + du * sn));
        }
    }
  }
}
// y[t, h, rd:D] = x[t, h, rd:D] in words W (16 bytes when every offset allows, else one element).
template <class W>
__global__ void rope_pass_kernel(char* y, int64_t ys, const char* x, int64_t xs, int64_t T_, int H, int64_t D,
                                 int64_t rd, int64_t nw) {  // strides and D, rd in bytes; nw words per row
  const int64_t n = T_ * H * nw;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t th = i / nw, c = i - th * nw, t = th / H, h = th - t * H;
    const int64_t off = h * D + rd + c * int64_t(sizeof(W));
    *reinterpret_cast<W*>(y + t * ys + off) = *reinterpret_cast<const W*>(x + t * xs + off);
  }
}

// Sigmoid gate y = o * sigmoid(g), backward do = dy * sg, dg = dy * o * sg * (1 - sg), on [R, D]
// views with any row stride. sigmoid = ew::sigmoid_f (ex2.approx / rcp.approx): within
// ~(3 + |g|) * 1e-7 relative of 1 / (1 + expf(-g)) (exactly 0 / 1 when saturated), far below
// bf16 storage and the f32 tests' 1e-4; both paths use it and the same expressions. Fast path
// when D is a whole number of 16-byte vectors and every base and row stride is 16-byte aligned:
// kGateU vectors per thread, all loads before the math.
template <class T>
__global__ void gate_fwd_kernel(T* y, int64_t ys, const T* o, int64_t os, const T* g, int64_t gs, int64_t R, int D) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < R * D; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / D, j = i - r * D;
    y[r * ys + j] = from_f<T>(to_f(o[r * os + j]) * ew::sigmoid_f(to_f(g[r * gs + j])));
  }
}
template <class T>
__global__ void gate_bwd_kernel(T* d_o, int64_t dos, T* dg, int64_t dgs, const T* dy, int64_t dys, const T* o,
                                int64_t os, const T* g, int64_t gs, int64_t R, int D) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < R * D; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / D, j = i - r * D;
    const float sg = ew::sigmoid_f(to_f(g[r * gs + j])), d = to_f(dy[r * dys + j]);
    dg[r * dgs + j] = from_f<T>(d * to_f(o[r * os + j]) * sg * (1.f - sg));
    d_o[r * dos + j] = from_f<T>(d * sg);
  }
}

constexpr int kGateU = 2;
// Vector k of [R, D / V] -> element offset (row * ld + column) for each of the row strides.
__device__ __forceinline__ int64_t gate_row(int64_t k, int64_t dv, bool narrow) {
  return narrow ? int64_t(uint32_t(k) / uint32_t(dv)) : k / dv;
}
template <class T>
__global__ __launch_bounds__(256) void gate_fwd_vec_kernel(T* y, int64_t ys, const T* o, int64_t os, const T* g,
                                                            int64_t gs, int64_t dv, int64_t nv, bool narrow) {
  constexpr int V = ew::kVec<T>, U = kGateU;
  const int64_t step = int64_t(gridDim.x) * U * blockDim.x;
  for (int64_t base = int64_t(blockIdx.x) * U * blockDim.x + threadIdx.x; base < nv; base += step) {
    uint4 r_o[U], r_g[U];
    int64_t r[U], j[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = base + int64_t(u) * blockDim.x;
      if (k < nv) {
        r[u] = gate_row(k, dv, narrow), j[u] = (k - r[u] * dv) * V;
        r_o[u] = *reinterpret_cast<const uint4*>(o + r[u] * os + j[u]);
        r_g[u] = *reinterpret_cast<const uint4*>(g + r[u] * gs + j[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (base + int64_t(u) * blockDim.x < nv) {
        float fo[V], fg[V], fy[V];
        ew::unpack16<T>(r_o[u], fo);
        ew::unpack16<T>(r_g[u], fg);
#pragma unroll
        for (int e = 0; e < V; ++e) fy[e] = fo[e] * ew::sigmoid_f(fg[e]);
        ew::store16<T>(y + r[u] * ys + j[u], fy);
      }
  }
}
template <class T>
__global__ __launch_bounds__(256) void gate_bwd_vec_kernel(T* d_o, int64_t dos, T* dg, int64_t dgs, const T* dy,
                                                            int64_t dys, const T* o, int64_t os, const T* g,
                                                            int64_t gs, int64_t dv, int64_t nv, bool narrow) {
  constexpr int V = ew::kVec<T>, U = kGateU;
  const int64_t step = int64_t(gridDim.x) * U * blockDim.x;
  for (int64_t base = int64_t(blockIdx.x) * U * blockDim.x + threadIdx.x; base < nv; base += step) {
    uint4 r_d[U], r_o[U], r_g[U];
    int64_t r[U], j[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = base + int64_t(u) * blockDim.x;
      if (k < nv) {
        r[u] = gate_row(k, dv, narrow), j[u] = (k - r[u] * dv) * V;
        r_d[u] = *reinterpret_cast<const uint4*>(dy + r[u] * dys + j[u]);
        r_o[u] = *reinterpret_cast<const uint4*>(o + r[u] * os + j[u]);
        r_g[u] = *reinterpret_cast<const uint4*>(g + r[u] * gs + j[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (base + int64_t(u) * blockDim.x < nv) {
        float fd[V], fo[V], fg[V], f_do[V], f_dg[V];
        ew::unpack16<T>(r_d[u], fd);
        ew::unpack16<T>(r_o[u], fo);
        ew::unpack16<T>(r_g[u], fg);
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const float sg = ew::sigmoid_f(fg[e]);
          f_dg[e] = fd[e] * fo[e] * sg * (1.f - sg);
          f_do[e] = fd[e] * sg;
        }
        ew::store16<T>(dg + r[u] * dgs + j[u], f_dg);
        ew::store16<T>(d_o + r[u] * dos + j[u], f_do);
      }
  }
}

// True when D is a whole number of 16-byte vectors and every view's base and row stride are
// 16-byte aligned.
bool gate_vec_ok(int64_t D, std::initializer_list<const TensorView*> vs) {
  const int64_t sz = int64_t(dtype_size(vs.begin()[0]->dtype));
  if ((D * sz) % 16 != 0) return false;
  for (const TensorView* v : vs)
    if (!ew::aligned16(v->data) || (v->stride[0] * sz) % 16 != 0) return false;
  return true;
}

unsigned blocks(int64_t n) { return lc::grid_for((n + 255) / 256, 65535 * 16); }

template <class F>
void by_dtype(DType dt, F&& f) {
  if (dt == DType::bf16) f.template operator()<bf16>();
  else f.template operator()<float>();
}

}  // namespace attn
}  // namespace

using namespace attn;

// y = rope(x, sign * a): the rotation kernel, then the pass-through copy when not in place.
void rope_launch(const TensorView& y, const TensorView& x, const TensorView& pos, int64_t rd, double theta,
                 double sign, cudaStream_t st) {
  const int64_t T = x.shape[0], H = x.shape[1], D = x.shape[2];
  if (T == 0 || H == 0) return;
  by_dtype(x.dtype, [&]<class E>() {
    if (rd > 0)
      rope_kernel<E><<<blocks(T * (rd / 2)), 256, size_t(rd / 2) * sizeof(double), st>>>(
          y.ptr<E>(), y.stride[0], x.ptr<E>(), x.stride[0], pos.ptr<int32_t>(), T, int(H), int(D), int(rd), theta,
          sign);
  });
  DT_CUDA_LAUNCH_CHECK();
  if (D == rd || (y.data == x.data && y.stride[0] == x.stride[0])) return;
  const int64_t sz = int64_t(dtype_size(x.dtype));
  const bool v16 = ew::aligned16(x.data) && ew::aligned16(y.data) && (x.stride[0] * sz) % 16 == 0 &&
                   (y.stride[0] * sz) % 16 == 0 && (D * sz) % 16 == 0 && (rd * sz) % 16 == 0;
  auto pass = [&]<class W>() {
    const int64_t nw = (D - rd) * sz / int64_t(sizeof(W));
    rope_pass_kernel<W><<<blocks(T * H * nw), 256, 0, st>>>(static_cast<char*>(y.data), y.stride[0] * sz,
                                                            static_cast<const char*>(x.data), x.stride[0] * sz, T,
                                                            int(H), D * sz, rd * sz, nw);
  };
  if (v16) pass.template operator()<uint4>();
  else if (sz == 2) pass.template operator()<uint16_t>();
  else pass.template operator()<uint32_t>();
  DT_CUDA_LAUNCH_CHECK();
}

void rope_fwd(const TensorView& y, const TensorView& x, const TensorView& pos, int64_t rotary_dim, double theta,
              Stream s) {
  lc::Nvtx nv("rope_fwd");
  rope_launch(y, x, pos, rotary_dim, theta, 1.0, static_cast<cudaStream_t>(s.handle));
}
void rope_bwd(const TensorView& dx, const TensorView& dy, const TensorView& pos, int64_t rotary_dim, double theta,
              Stream s) {
  lc::Nvtx nv("rope_bwd");
  rope_launch(dx, dy, pos, rotary_dim, theta, -1.0, static_cast<cudaStream_t>(s.handle));
}

void attention_fwd(const TensorView& o, const TensorView& lse, const TensorView& q, const TensorView& k,
                   const TensorView& v, const AttnVarlen& meta, float scale, Stream s) {
  const int Tq = int(q.shape[0]);
  check_grid_y(num_tiles<16 * kNWf>(Tq), 16 * kNWf, "attention_fwd", "query tiles", "Tq", Tq);
  lc::Nvtx nv("attention_fwd");
  auto st = static_cast<cudaStream_t>(s.handle);
  const Rows rows = make_rows(meta, Tq, st);
  Params p = make_params(q, k, v, meta, rows, scale);
  p.out_o = o.data;
  p.o_rs = o.stride[0];
  p.lse = lse.ptr<float>();
  dispatch(q.dtype, p.D, [&]<class T, int DP>() {
    constexpr int BN = 64, NW = kNWf;
    constexpr size_t bytes = fwd_smem<T, DP, BN>();
    set_smem(fwd_kernel<T, DP, BN>, bytes);
    constexpr int BM = 16 * NW;
    const dim3 grid(unsigned(p.Hq), unsigned(num_tiles<BM>(Tq)));  // (query head, query tile last-first)
    fwd_kernel<T, DP, BN><<<grid, 32 * NW, bytes, st>>>(p);
  });
  DT_CUDA_LAUNCH_CHECK();
}

void attention_bwd(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& d_o,
                   const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                   const TensorView& lse, const AttnVarlen& meta, float scale, Stream s) {
  const int Tq = int(q.shape[0]), Tk = int(k.shape[0]);
  dispatch(q.dtype, int(q.shape[2]), [&]<class T, int DP>() {
    constexpr int BM = 16 * kNW<T, DP>, BN = kBNk<T, DP>;
    check_grid_y(num_tiles<BM>(Tq), BM, "attention_bwd", "query tiles", "Tq", Tq);
    check_grid_y(num_tiles<BN>(Tk), BN, "attention_bwd", "key blocks", "Tk", Tk);
  });
  lc::Nvtx nv("attention_bwd");
  auto st = static_cast<cudaStream_t>(s.handle);
  const Rows rows = make_rows(meta, Tq, st);
  Params p = make_params(q, k, v, meta, rows, scale);
  p.o = o.data;
  p.o_rs = o.stride[0];
  p.d_o = d_o.data;
  p.do_rs = d_o.stride[0];
  p.dq = dq.data;
  p.dq_rs = dq.stride[0];
  p.dk = dk.data;
  p.dk_rs = dk.stride[0];
  p.dv = dv.data;
  p.dv_rs = dv.stride[0];
  p.lse = lse.ptr<float>();
  Tensor dsum = Tensor::empty(Shape{int64_t(Tq) * p.Hq}, DType::f32, q.device);
  p.dsum = dsum.ptr<float>();
  // GQA (G > 1): the per-query-head dK, dV partials of dkv_kernel, summed by head_group_sum_kernel.
  // Transient, like dsum: freed here, reused only by later work on this stream.
  Tensor dk_part, dv_part;  // [Tk, Hq, D] f32
  if (p.G > 1) {
    dk_part = Tensor::empty(Shape{p.Tk, p.Hq, p.D}, DType::f32, q.device);
    dv_part = Tensor::empty(Shape{p.Tk, p.Hq, p.D}, DType::f32, q.device);
    p.dk_part = dk_part.ptr<float>();
    p.dv_part = dv_part.ptr<float>();
  }
  dispatch(q.dtype, p.D, [&]<class T, int DP>() {
    dsum_kernel<T><<<unsigned((int64_t(Tq) * p.Hq + 7) / 8), 256, 0, st>>>(p, dsum.ptr<float>());
    DT_CUDA_LAUNCH_CHECK();
    constexpr int NW = kNW<T, DP>, BM = 16 * NW, BN = kBNk<T, DP>;
    constexpr size_t qb = dq_smem<T, DP>(), kb = dkv_smem<T, DP>();
    set_smem(dq_kernel<T, DP>, qb);
    const dim3 qgrid(unsigned(p.Hq), unsigned(num_tiles<BM>(Tq)));  // (query head, query tile last-first)
    dq_kernel<T, DP><<<qgrid, 32 * NW, qb, st>>>(p);
    DT_CUDA_LAUNCH_CHECK();
    const dim3 kgrid(unsigned(p.Hq), unsigned(num_tiles<BN>(p.Tk)));  // (query head, key block ascending)
    if (p.G == 1) {
      set_smem(dkv_kernel<T, DP, false>, kb);
      dkv_kernel<T, DP, false><<<kgrid, 32 * NW, kb, st>>>(p);
      DT_CUDA_LAUNCH_CHECK();
    } else {
      set_smem(dkv_kernel<T, DP, true>, kb);
      dkv_kernel<T, DP, true><<<kgrid, 32 * NW, kb, st>>>(p);
      DT_CUDA_LAUNCH_CHECK();
      const GroupSum<T> gk{static_cast<T*>(p.dk), p.dk_rs, p.dk_part, p.scale};
      const GroupSum<T> gv{static_cast<T*>(p.dv), p.dv_rs, p.dv_part, 1.f};
      const int64_t sz = int64_t(sizeof(T));
      const bool v16 = (p.D * sz) % 16 == 0 && ew::aligned16(p.dk) && ew::aligned16(p.dv) && (p.dk_rs * sz) % 16 == 0 &&
                       (p.dv_rs * sz) % 16 == 0 && ew::aligned16(p.dk_part) && ew::aligned16(p.dv_part);
      auto launch = [&]<int V>() {
        const int64_t n = int64_t(p.Tk) * p.Hkv * (p.D / V);
        head_group_sum_kernel<T, V><<<dim3(blocks(n), 2), 256, 0, st>>>(gk, gv, p.Tk, p.Hkv, p.G, p.D);
      };
      if (v16) launch.template operator()<ew::kVec<T>>();
      else launch.template operator()<1>();
    }
  });
  DT_CUDA_LAUNCH_CHECK();
}

void sigmoid_gate_fwd(const TensorView& y, const TensorView& o, const TensorView& g, Stream s) {
  lc::Nvtx nv("sigmoid_gate_fwd");
  const int64_t R = o.shape[0], D = o.shape[1];
  if (R * D == 0) return;
  auto st = static_cast<cudaStream_t>(s.handle);
  by_dtype(o.dtype, [&]<class T>() {
    if (gate_vec_ok(D, {&y, &o, &g})) {
      const int64_t dv = D / ew::kVec<T>, nv = R * dv;
      gate_fwd_vec_kernel<T><<<blocks((nv + kGateU - 1) / kGateU), 256, 0, st>>>(
          y.ptr<T>(), y.stride[0], o.ptr<T>(), o.stride[0], g.ptr<T>(), g.stride[0], dv, nv, nv < (int64_t(1) << 32));
    } else {
      gate_fwd_kernel<T><<<blocks(R * D), 256, 0, st>>>(y.ptr<T>(), y.stride[0], o.ptr<T>(), o.stride[0], g.ptr<T>(),
                                                        g.stride[0], R, int(D));
    }
  });
  DT_CUDA_LAUNCH_CHECK();
}
void sigmoid_gate_bwd(const TensorView& d_o, const TensorView& dg, const TensorView& dy, const TensorView& o,
                      const TensorView& g, Stream s) {
  lc::Nvtx nv("sigmoid_gate_bwd");
  const int64_t R = o.shape[0], D = o.shape[1];
  if (R * D == 0) return;
  auto st = static_cast<cudaStream_t>(s.handle);
  by_dtype(o.dtype, [&]<class T>() {
    if (gate_vec_ok(D, {&d_o, &dg, &dy, &o, &g})) {
      const int64_t dv = D / ew::kVec<T>, nv = R * dv;
      gate_bwd_vec_kernel<T><<<blocks((nv + kGateU - 1) / kGateU), 256, 0, st>>>(
          d_o.ptr<T>(), d_o.stride[0], dg.ptr<T>(), dg.stride[0], dy.ptr<T>(), dy.stride[0], o.ptr<T>(), o.stride[0],
          g.ptr<T>(), g.stride[0], dv, nv, nv < (int64_t(1) << 32));
    } else {
      gate_bwd_kernel<T><<<blocks(R * D), 256, 0, st>>>(d_o.ptr<T>(), d_o.stride[0], dg.ptr<T>(), dg.stride[0],
                                                        dy.ptr<T>(), dy.stride[0], o.ptr<T>(), o.stride[0],
                                                        g.ptr<T>(), g.stride[0], R, int(D));
    }
  });
  DT_CUDA_LAUNCH_CHECK();
}

// The same row gather as the CP all-to-all's (out[i] = in[idx[i]]), which moves the widest word
// the row widths, pitches and addresses allow (16 B for most bf16 rows) instead of one element.
void gather_rows(const TensorView& out, const TensorView& in, const TensorView& idx, Stream s) {
  cp_gather_rows(out, in, idx, s);
}

}  // namespace dt::ops::cuda
