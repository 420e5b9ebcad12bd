// CUDA chunked gated delta rule on packed sequences (THD + cu_seqlens), forward and backward.
//
// Math: ../shared/docs/gdn-math.md sections 3 (chunked forward, C = 64), 4 (chunked backward),
// 5 (varlen rules) and 10 (numerical pitfalls). Per sequence n and v-head h (key head h / G,
// G = Hv / Hk, read in place: repeats are never materialised):
//   S <- exp(g_t) S;  u_t = beta_t (v_t - S^T k_t);  S <- S + k_t u_t^T;  o_t = scale * S^T q_t
//
// Layouts (token-major, contiguous): q, k, dq, dk [T, Hk, dk]; v, o, dv, do [T, Hv, dv] (bf16 or
// f32, one dtype for all of them); g, beta, dg, dbeta [T, Hv] f32 (g: natural-log decay per
// token, NOT cumulated); h0, ht, dht, dh0 [N, Hv, dk, dv] f32 or absent. dk, dv: multiples of 16,
// at most 128.
//
// Kernels (one CTA per (chunk, v-head) on grid [Hv, chunks], heads on x (launch_chunk_kernel), unless
// "serial": one CTA per (sequence, v-head, 64-wide V tile) walking the sequence's chunks in order,
// launched longest sequence first (seq_cta) on gridDim.x):
//   forward : prep (K1+K2+K3: gamma cumsum, A = KK^T masked, Tm = (I+A)^-1 in fp32, W, U)
//             -> state (K4, serial: chunk-start states h, Delta, ht) -> out (K5: o)
//   backward: prep (+ Tm saved) -> state (h, Delta recomputed) -> dvl (B3: dDelta_local; P from the
//             forward's out kernel when the intermediates are saved; with wg4's rev kernel
//             (DT_GDN_REV_P, rev_p_knob) rev makes dDelta_local from P and dvl does not)
//   With GdnArgs.norm / norm_bwd (unless DT_GDN_OUT_NORM=0), out ends with the gated RMSNorm of its
//   rows and dvl begins with the norm's backward (dO made there); else they run as their own ops.
//             -> rev (B4, serial: dS1 per chunk, full dDelta, dh0) -> dqk (B5: dq, dk part, dW,
//             dgamma part) -> wy (B6-B8: dk2, dv, dbeta, dgamma2, reverse cumsum -> dg)
//             -> gsum (B12: dq, dk summed over the G v-heads of each key head, fixed order, dk as
//             (sum of wy's parts) + (sum of dqk's parts); with G == 1 dqk and wy store dq and dk
//             themselves, and with G == 2 they run as clusters of the key head's two v-heads: dqk
//             stores dq and its [T, Hk, dk] f32 pair sum of dk, wy adds its own pair sum to that
//             (pair_sum_push, or pair_sum); the same bits either way)
// Serial -> per-chunk overlap (DT_GDN_SERIAL_PDL, with_serial_pdl): out after state and dqk after rev
// start through Programmatic Dependent Launch while the serial grid's last CTAs run, each CTA
// waiting for its own sequence's serial CTAs (Params.done) before it reads their outputs.
// Tile loads of the serial kernels: rev uses two cp.async stages (chunk c-1's tiles load while
// chunk c computes) when its grid fits one CTA per SM and the inputs are bf16, else one stage;
// state always two (they cost it no occupancy). DT_GDN_REV_STAGES=1|2 and DT_GDN_STATE_STAGES=1|2
// force the counts (rev_stages, state_stages). Both forms do the same arithmetic in the same
// order: the same bits.
// Three forms of the serial kernels (DT_GDN_SERIAL=tile|warp4|warp8|split2|split4): the CTA-tiled
// state_kernel / rev_kernel below; gdn_serial_warp.cuh's warp-owned rows of the transposed state
// (bf16 only; no shared-memory state operand and no CTA barrier inside a chunk step), the same
// products in the same order, so the same bits (tested), and the bf16 default; and
// gdn_serial_split.cuh's 2 or 4 warps per 16 rows (bf16, dk = 128; product 1's dk sum split, so
// within a tolerance).
//
// Precision: bf16 inputs -> mma.sync m16n8k16 bf16 tensor-core products with fp32 accumulation;
// the staged intermediates (W, U, Tm, chunk states, Delta, dDelta, dS1, dW) are bf16 as in FLA
// (gdn-math.md 10.1). The exponent path (gamma, exp), the triangular solve, the running state,
// dgamma/dg, dbeta, ht, dh0 and the per-v-head dq/dk partials are fp32. f32 inputs -> the SAME
// kernels with fp32 tiles and plain fp32 FFMA products (no TF32, no bf16 staging anywhere).
// Exponentials: natural exp (expf) of chunk-local cumsums gamma; every exponent inside the
// causal triangle is gamma_i - gamma_j <= 0 (i >= j). Masked entries are SELECTED before any
// multiplication (where(mask, x * exp(..), 0)), invalid rows of a partial chunk load as 0 and
// get gamma = 0, e^gamma = 0 (gdn-math.md 5, 10.3).
//
// Determinism: no atomics; every reduction (cumsums, row sums, GQA sums) has a fixed order that
// depends only on the problem shape. Two runs give the same bits.
// Outputs: o, ht overwritten (=). Gradients: dq, dk, dv, dg, dbeta, dh0 all overwritten (=).
// Offsets are int64. Scratch comes from the caching allocator (Tensor::empty).
#include <cooperative_groups.h>
#include <cuda.h>  // CUtensorMap (the fused forward's TMA tiles; encoded through cudart's entry-point query)
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

#include "core/cuda_check.h"
#include "core/env_knob.h"
#include "deltatron/core/tensor.h"
#include "deltatron/ops/basic.h"
#include "ops/cuda/gdn_elementwise_common.cuh"  // ew:: row helpers of the out kernel's norm epilogue
#include "ops/cuda/mma_common.cuh"
#include "ops/cuda/wgmma.cuh"
#include "ops/gdn_backends.h"

namespace dt::ops::cuda {
namespace {
namespace gck {

using bf16 = __nv_bfloat16;
using namespace mma;  // tile loads, ldmatrix, mma.sync, warp_gemm (mma_common.cuh)

constexpr int C = 64;               // chunk size
constexpr int D = 128;              // largest head dim; tiles are padded to D columns / rows
constexpr int BV = 64;              // V tile of the serial kernels (8 warps: 4 x 32 state rows, 2 x 32 columns)
constexpr int kChunkThreads = 256;  // 8 warps per (chunk, head) CTA
constexpr int kSeqThreads = 256;    // 8 warps per (sequence, head, V tile) CTA
// bf16: two serial CTAs per SM (<= 128 registers, smem <= 113 KB); f32: one.
template <class T> constexpr int kSeqMinBlocks = sizeof(T) == 2 ? 2 : 1;
constexpr size_t kMaxSmem = 227 * 1024;           // dynamic shared memory a CTA may opt into on sm_90
constexpr size_t kSmemPerSm = 228 * 1024;         // shared memory of an sm_90 SM
constexpr size_t kSmemReservedPerCta = 1024;      // taken by the system per resident CTA

// Shared-memory row strides (elements): +16 bytes per row keeps ldmatrix conflict-free.
template <class T> constexpr int LDD = D + kPad<T>;
template <class T> constexpr int LDC = C + kPad<T>;
template <class T> constexpr int LDV = BV + kPad<T>;
#ifndef GDN_SOLVE_BLOCKED
#define GDN_SOLVE_BLOCKED 1  // 16x16 block solve + merges (0: column-parallel forward substitution)
#endif
// The chunk kernels' natural exp (always of a chunk-local cumsum or a difference of them, <= 0
// inside the causal triangle: gdn-math.md 10.3): ex2.approx of x log2(e), as Triton's exp (FLA)
// computes it, 2 instructions instead of expf's ~10, relative error ~1e-6 at |x| <= 20 (measured
// in docs/perf.md v0.24.0: out 620 -> 562 us; every test's tolerance holds).
__device__ __forceinline__ float gexp(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
  return y;
}
constexpr int LDA = C + 4;  // fp32 [C][C] matrices
// fp32 Tm during the solve: 68 keeps the blocked merges' row reads conflict-free and prep at four
// CTAs per SM (PrepSmem); the column-parallel substitution walks columns, conflict-free at 72.
constexpr int LDT = GDN_SOLVE_BLOCKED ? 68 : 72;

// Params.pair: G == 2's dq / dk sums through gsum (off), in clusters pulling the partner's
// fragments (pair_sum) or pushing them (pair_sum_push); DT_GDN_GQA_PAIR 0 | 1 | 2 (default).
enum PairMode : int { kPairOff = 0, kPairPull = 1, kPairPush = 2 };
struct Params {
  int64_t T;
  int64_t sv, sdv;             // token strides (elements) of v and dv: Hv * dv, or wider for in-place column views
  int N, NT, Hk, Hv, G, dk, dv, nvt;
  int pair;                    // PairMode: dqk and wy as clusters of G == 2 v-heads (pair_sum), or pushed
  int c0;                      // per-chunk kernels: the first chunk of this launch's slab (launch_chunk_kernel)
  float scale;
  const int32_t* cu;           // [N+1]
  const int32_t* chunk_start;  // [NT]
  const int32_t* chunk_off;    // [N+1]
  const int32_t* seq_order;    // [N] sequences by chunk count, longest first
  const int32_t* chunk_seq;    // [NT] the sequence of each chunk
  // Serial -> per-chunk overlap (with_serial_pdl): the serial kernel's CTAs count themselves done per
  // sequence here, and the per-chunk kernel after it (launched early through Programmatic
  // Dependent Launch) waits for done[n] == done_target before it reads the chunk's serial outputs.
  // Null: no counting, no waiting.
  int* done;                   // [N]
  int done_target;             // the serial grid's CTAs per sequence (Hv x its V tiles)
};

// Serial kernels: one CTA per (sequence, v-head, V tile) on gridDim.x, sequence slowest and
// longest first, so the CTAs that start first carry the longest chains and a partial last wave
// holds short ones (with the head on y, every wave held the longest sequence: ~2x the chain).
struct SeqCta {
  int n, h, vt;
};
__device__ __forceinline__ SeqCta seq_cta(const Params& p) {
  const int per_seq = p.Hv * p.nvt, r = blockIdx.x / per_seq, rem = blockIdx.x - r * per_seq;
  return {p.seq_order[r], rem / p.nvt, rem % p.nvt};
}
// Serial -> per-chunk overlap (Params.done; with_serial_pdl). The serial kernels' grids (state, rev)
// take two waves at the layer's shape: 512 CTAs over 264 slots, so their last ~quarter runs on few
// SMs while the per-chunk kernel after them (out, dqk) waits for the whole grid. Each serial CTA
// triggers the dependent launch at its start (all of them resident: the dependent's CTAs then
// cannot hold a slot a serial CTA needs) and counts itself into done[n] at its end, after its
// stores (the CTA barrier, then thread 0's gpu-scope fence and atomic: the release). A dependent
// CTA's thread 0 waits for done[n] == done_target with an acquire load before a barrier, ahead of
// its first read of the serial outputs; what it loads before that (inputs of earlier kernels)
// needs no wait. Launched without PDL (or replayed alone by ncu) the counts are complete already.
__device__ __forceinline__ void serial_pdl_trigger(const Params& p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (p.done) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// One thread, after a barrier over every thread that wrote the CTA's outputs: the release.
__device__ __forceinline__ void serial_count_done(const Params& p, int n) {
  if (!p.done) return;
  __threadfence();
  atomicAdd(p.done + n, 1);
}
__device__ __forceinline__ void serial_done(const Params& p, int n) {
  if (!p.done) return;
  __syncthreads();
  if (threadIdx.x == 0) serial_count_done(p, n);
}
// Thread 0 only; the caller's next barrier publishes the wait to the CTA. The grid's last CTA
// also waits for the whole serial grid (griddepcontrol.wait), so that this kernel ends only after
// it and the stream's next launch follows both: the serial CTAs of zero-length sequences, which no
// CTA here waits for, still write ht / dh0 and count into done.
__device__ __forceinline__ void serial_wait(const Params& p, int c) {
  const int* f = p.done + p.chunk_seq[c];
  for (;;) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(f) : "memory");
    if (v >= p.done_target) break;
    __nanosleep(200);
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (blockIdx.x == gridDim.x - 1 && blockIdx.y == gridDim.y - 1) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// A sequence's chunks c0 .. c1 - 1; chunk c starts at token bos0 + (c - c0) C (VarlenBatch's
// chunk_start, computed here instead of loaded). The state kernels use it: their per-step global
// load of chunk_start[c] fed the next tiles' addresses (ncu's source view: ~14% of the wg4 state
// kernel's stall samples waited on such index loads; 651 -> 621 us). The rev kernels keep the load:
// the same change measured rev +31 us (864 -> 895; 206 -> 212 registers). eos: the sequence's end.
struct SeqSpan {
  int c0, c1, bos0, eos;
  __device__ __forceinline__ int64_t bos(int c) const { return bos0 + int64_t(c - c0) * C; }
};
__device__ __forceinline__ SeqSpan seq_span(const Params& p, int n) {
  return {p.chunk_off[n], p.chunk_off[n + 1], p.cu[n], p.cu[n + 1]};
}

// One fragment row's sum of acc * x over the warp tile's columns (j in order), reduced over the
// 4 lanes of a quad.
template <int WM, int WN>
__device__ __forceinline__ float quad_rowdot(const float (&acc)[WM][WN][4], int i, int h2, const float2 (&x)[WN]) {
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < WN; ++j) {
    s = fmaf(acc[i][j][2 * h2], x[j].x, s);
    s = fmaf(acc[i][j][2 * h2 + 1], x[j].y, s);
  }
  s += __shfl_xor_sync(0xffffffffu, s, 1);
  s += __shfl_xor_sync(0xffffffffu, s, 2);
  return s;
}
// Row sums of a warp tile: rsum[i][h2] = sum over the warp tile's columns of (acc * X(row, col))
// where X comes from xf(row, col) -> float2 (shared memory: each row group's X just before its sum).
template <int WM, int WN, class F>
__device__ __forceinline__ void frag_rowdot(float (&acc)[WM][WN][4], int m0, int n0, float (&rsum)[WM][2], F&& xf) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < WM; ++i)
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      float2 x[WN];
#pragma unroll
      for (int j = 0; j < WN; ++j) x[j] = xf(m0 + 16 * i + g + 8 * h2, n0 + 8 * j + 2 * t);
      rsum[i][h2] = quad_rowdot(acc, i, h2, x);
    }
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ __forceinline__ int round16(int x) { return (x + 15) & ~15; }

// Chunk-local inclusive cumsum of g over the valid rows (warp 0, 2 rows per lane, fixed shuffle
// order), plus beta; invalid rows get gamma = 0, beta = 0, e^gamma = 0.
__device__ __forceinline__ void chunk_gates(const Params& p, const float* g_g, const float* g_beta, int64_t bos,
                                            int h, int L, float* s_gam, float* s_beta, float* s_eg, float* g_gam) {
  const int lane = threadIdx.x & 31;
  const int i0 = 2 * lane, i1 = i0 + 1;
  const float x0 = i0 < L ? g_g[(bos + i0) * p.Hv + h] : 0.f;
  const float x1 = i1 < L ? g_g[(bos + i1) * p.Hv + h] : 0.f;
  float incl = x0 + x1;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const float y = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += y;
  }
  float excl = __shfl_up_sync(0xffffffffu, incl, 1);
  if (lane == 0) excl = 0.f;
  const float ga0 = excl + x0, ga1 = ga0 + x1;
  s_gam[i0] = i0 < L ? ga0 : 0.f;
  s_gam[i1] = i1 < L ? ga1 : 0.f;
  if (s_beta) {
    s_beta[i0] = i0 < L ? g_beta[(bos + i0) * p.Hv + h] : 0.f;
    s_beta[i1] = i1 < L ? g_beta[(bos + i1) * p.Hv + h] : 0.f;
  }
  if (s_eg) {
    s_eg[i0] = i0 < L ? gexp(ga0) : 0.f;
    s_eg[i1] = i1 < L ? gexp(ga1) : 0.f;
  }
  if (g_gam) {
    if (i0 < L) g_gam[(bos + i0) * p.Hv + h] = ga0;
    if (i1 < L) g_gam[(bos + i1) * p.Hv + h] = ga1;
  }
}

struct ChunkIdx {
  int c, h, hk, L;
  int64_t bos;
};
// The per-chunk grid is [Hv, chunks of the slab]: the v-heads of a chunk are adjacent in launch
// order, so the G v-heads of a key head run together and its q / k rows come from DRAM once.
// Chunk c ends where chunk c + 1 starts (the same sequence's next chunk, or the next non-empty
// sequence's first, at cu[n + 1]), the last one at cu[N] = T (checked by the host): one load
// beside chunk_start[c], where cu[chunk_seq[c] + 1] was a chain of two ahead of every tile
// address (the same L).
__device__ __forceinline__ ChunkIdx chunk_idx(const Params& p) {
  ChunkIdx r;
  r.c = p.c0 + blockIdx.y;
  r.h = blockIdx.x;
  r.hk = r.h / p.G;
  r.bos = p.chunk_start[r.c];
  const int end = r.c + 1 < p.NT ? p.chunk_start[r.c + 1] : int(p.T);
  r.L = min(C, end - int(r.bos));
  return r;
}

// A per-chunk kernel's [ROWS][COLS] tile (kChunkThreads threads): load_tile_full when every element
// is valid (every chunk but a sequence's last, at dk = dv = D), else load_tile's zero-filling loop.
// The same copies either way; the full form spends one add per copy on addresses instead of
// load_tile's ~28 instructions (docs/perf.md v0.8.0, where the serial kernels got it).
template <int ROWS, int COLS, L2Hint H = kL2Normal, class T>
__device__ __forceinline__ void load_ctile(T* s, int lds, const T* g, int64_t gstride, int nvalid, int ncols, int tid) {
  if (nvalid == ROWS && ncols == COLS) load_tile_full<T, ROWS, COLS, kChunkThreads, H>(s, lds, g, gstride, tid);
  else load_tile<H>(s, lds, g, gstride, ROWS, nvalid, ncols, COLS, tid, kChunkThreads);
}
// dqk's and wy's tiles read for the last time (dO, S0, dDelta, dS1 and Delta's second load; wy's
// dDelta, V, Tm, dW) load with L2 evict_first, so that the lines read again (dS1 after state_dot,
// Delta, the cluster pair's K and Q, wy's prefetched phase II) stay: dqk read 2.42 GB against
// ~2.15 GB of distinct bytes, and ran 1357 -> 1306 us under ncu on an H100 (perf.md v0.37.0).
constexpr L2Hint kLastRead = kL2EvictFirst;

// A warp's fragment tile ([16 WM][8 WN] at m0, n0, warp_gemm's ownership) to global, element
// (r, c) at g + r * ld + c, each pair through f(r, x0, x1) first. A tile whose every element is
// valid (r < L, c < ncols: every chunk but a sequence's last) takes one row pointer per fragment
// row and immediate column offsets, unpredicated; the others the per-element predicated form.
// (The predicated per-element address arithmetic took ~7 instructions a store: prep 665 -> 634,
// dqk -> -24, wy -10 us under ncu on an H100, perf.md v0.35.0.)
struct KeepPair {  // store_frags' default f: the fragment values as they are
  __device__ void operator()(int, float&, float&) const {}
};
template <int WM, int WN, class T, class F = KeepPair>
__device__ __forceinline__ void store_frags(T* g, int64_t ld, const float (&acc)[WM][WN][4], int m0, int n0, int L,
                                            int ncols, F&& f = F{}) {
  const int lane = threadIdx.x & 31, gq = lane >> 2, t = lane & 3;
  auto tile = [&](auto full) {
#pragma unroll
    for (int i = 0; i < WM; ++i)
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const int r = m0 + 16 * i + gq + 8 * h2;
        T* row = g + r * ld + n0 + 2 * t;
#pragma unroll
        for (int j = 0; j < WN; ++j) {
          float x0 = acc[i][j][2 * h2], x1 = acc[i][j][2 * h2 + 1];
          f(r, x0, x1);
          if (decltype(full)::value || (r < L && n0 + 8 * j + 2 * t < ncols)) store2(row + 8 * j, x0, x1);
        }
      }
  };
  if (m0 + 16 * WM <= L && n0 + 8 * WN <= ncols) tile(std::true_type{});
  else tile(std::false_type{});
}
// =================================================================================== kernels
// ---- prep: gamma, A, Tm (fp32 solve), W = Tm diag(beta e^gamma) K, U = Tm diag(beta) V --------
// V is loaded once the solve is done, over A, and the rounded Tm is written over the fp32 one, so
// bf16 prep takes 55.5 KB: four CTAs per SM (three with V and the rounded Tm apart: 75.3 KB).
// The diagonal scales go on Tm's columns (each scaled Tm rounded once, K and V used as loaded), not
// on K's and V's rows: one rounding fewer per product, and the row scaling pass (14% of prep's
// executed instructions) gone: prep 630 -> 595 us under ncu on an H100 (perf.md v0.36.0).
template <class T>
struct PrepSmem {
  static constexpr size_t k = 0;                                         // T [C][LDD]
  static constexpr size_t a = k + sizeof(T) * C * LDD<T>;                // f32 [C][LDA] A, during the solve
  static constexpr size_t v = a;                                         // T [C][LDD] V, after it
  static constexpr size_t av = std::max(sizeof(float) * C * LDA, sizeof(T) * C * LDD<T>);
  static constexpr size_t tm = a + av;                                   // f32 [C][LDT] Tm
  static constexpr size_t tmt = tm;                                      // T [C][LDC] Tm rounded, over it
  static constexpr size_t gam = tm + sizeof(float) * C * LDT;            // f32 [C]
  static constexpr size_t beta = gam + sizeof(float) * C;
  static constexpr size_t eg = beta + sizeof(float) * C;
  static constexpr size_t y = eg + sizeof(float) * C;                    // f32 [3][16][LDY] merge scratch
  // U's operand Tm diag(beta) rounded, after W's (tmt) over the fp32 Tm's rest, gamma, beta, e^gamma
  // and the solve's scratch, all dead by then (bf16: inside the 55.5 KB; f32: beyond it)
  static constexpr size_t tmu = tmt + sizeof(T) * C * LDC<T>;
  static constexpr size_t bytes = std::max(y + sizeof(float) * 3 * 16 * 20, tmu + sizeof(T) * C * LDC<T>);
  static_assert(tm % 16 == 0 && y % 16 == 0 && beta % 16 == 0 && eg % 16 == 0, "float4 access");
  static_assert(gam % 8 == 0 && a % 8 == 0 && LDA % 2 == 0, "A's float2 reads and stores");
  static_assert(sizeof(T) * C * LDC<T> <= sizeof(float) * C * LDT, "rounded Tm over the fp32 one");
};
template <class T> constexpr int kPrepMinBlocks = sizeof(T) == 2 && GDN_SOLVE_BLOCKED ? 4 : 1;
static_assert(!GDN_SOLVE_BLOCKED || 4 * (PrepSmem<bf16>::bytes + kSmemReservedPerCta) <= kSmemPerSm,
              "bf16 prep_kernel: four CTAs per SM");

template <class T>
__global__ __launch_bounds__(kChunkThreads, kPrepMinBlocks<T>) void prep_kernel(Params p, const T* __restrict__ g_k,
                                                             const T* __restrict__ g_v, const float* __restrict__ g_g,
                                                             const float* __restrict__ g_beta,
                                                             float* __restrict__ g_gam,  // [T, Hv]
                                                             T* __restrict__ g_W,        // [T, Hv, dk]
                                                             T* __restrict__ g_U,        // [T, Hv, dv]
                                                             T* __restrict__ g_Tm) {     // [NT, Hv, C, C] or null
  extern __shared__ __align__(16) unsigned char smem[];
  using S = PrepSmem<T>;
  T* s_k = reinterpret_cast<T*>(smem + S::k);
  T* s_v = reinterpret_cast<T*>(smem + S::v);
  float* s_a = reinterpret_cast<float*>(smem + S::a);
  float* s_tm = reinterpret_cast<float*>(smem + S::tm);
  T* s_tmt = reinterpret_cast<T*>(smem + S::tmt);  // W's operand Tm diag(beta e^gamma)
  T* s_tmu = reinterpret_cast<T*>(smem + S::tmu);  // U's operand Tm diag(beta)
  float* s_gam = reinterpret_cast<float*>(smem + S::gam);
  float* s_beta = reinterpret_cast<float*>(smem + S::beta);
  float* s_eg = reinterpret_cast<float*>(smem + S::eg);
  const ChunkIdx ci = chunk_idx(p);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int L = ci.L;
  load_ctile<C, D>(s_k, LDD<T>, g_k + (ci.bos * p.Hk + ci.hk) * p.dk, int64_t(p.Hk) * p.dk, L, p.dk, tid);
  cp_commit();
  if (warp == 0) chunk_gates(p, g_g, g_beta, ci.bos, ci.h, L, s_gam, s_beta, s_eg, g_gam);
  // V (loaded after the solve, over A) into L2 now, two lines per row, beside K's load: its
  // DRAM latency hides behind A and the solve.
  if (sizeof(T) == 2 && warp >= 4)
    prefetch_l2_rows<2>(g_v + ci.bos * p.sv + int64_t(ci.h) * p.dv, p.sv * 2, L, p.dv * 2, tid - 128);
  cp_wait<0>();
  __syncthreads();

  // A = strict_lower(diag(beta) K K^T (.) Gamma), valid rows only        [C, C] fp32
  {
    const int m0 = 16 * (warp & 3), n0 = 32 * (warp >> 2);
    float r_acc[1][4][4];
    zero(r_acc);
    if (m0 < L && n0 < m0 + 16) warp_gemm<1, 4, false, true>(r_acc, s_k, LDD<T>, s_k, LDD<T>, m0, n0, p.dk);
    // Every factor first (shared-memory reads only, so they all issue before the first store),
    // then the selects and 8-byte stores. A branch per element around its own loads, gexp and
    // multiply compiled to 16 chains issued one after another (340 instructions a warp against
    // 160; prep 678 -> 656 us, perf.md v0.35.0). Masked lanes may compute inf or NaN; the select drops them.
    frag_pairs(r_acc, m0, n0, [&](int r, int c, float& x0, float& x1) {
      const float gr = s_gam[r], br = s_beta[r];
      const float2 gc = *reinterpret_cast<const float2*>(s_gam + c);
      x0 = x0 * br * gexp(gr - gc.x);
      x1 = x1 * br * gexp(gr - gc.y);
    });
    frag_pairs(r_acc, m0, n0, [&](int r, int c, float& y0, float& y1) {
      const bool rv = r < L;
      *reinterpret_cast<float2*>(s_a + r * LDA + c) = make_float2((rv && c < r) ? y0 : 0.f, (rv && c + 1 < r) ? y1 : 0.f);
    });
  }
  __syncthreads();

#if GDN_SOLVE_BLOCKED
  // Tm = (I + A)^-1 in fp32 (gdn-math.md 3.3 K2, reference block_inverse): the four 16x16 diagonal
  // blocks by forward substitution (warp d, one lane per column, registers only), then the exact
  // merge Tm_ij = -Tm_ii sum_{j<=m<i} A_im Tm_mj by distance from the diagonal (plain FFMA).
  {
    float* s_y = reinterpret_cast<float*>(smem + S::y);
    if (warp < 4 && lane < 16) {
      const int d0 = 16 * warp;
      float r_x[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        float r_s = (i == lane) ? 1.f : 0.f;
#pragma unroll
        for (int m = 0; m < i; ++m) r_s = fmaf(-s_a[(d0 + i) * LDA + d0 + m], r_x[m], r_s);
        r_x[i] = r_s;
      }
#pragma unroll
      for (int i = 0; i < 16; ++i) s_tm[(d0 + i) * LDT + d0 + lane] = r_x[i];
    }
    for (int idx = tid; idx < C * C / 4; idx += kChunkThreads) {  // upper blocks = 0 (float4 groups)
      const int r = idx >> 4, c = (idx & 15) * 4;
      if ((c >> 4) > (r >> 4)) *reinterpret_cast<float4*>(s_tm + r * LDT + c) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    __syncthreads();
    // Each thread owns 4 consecutive columns of one row (float4 operands); every element keeps
    // its own fixed summation order (m, kk ascending).
    // The loops have compile-time trip counts (lev unrolled; kk's bound r as a predicate), so the
    // compiler unrolls them and issues their shared-memory loads ahead of the FMA chains.
    constexpr int LDY = 20;
#pragma unroll
    for (int lev = 1; lev < 4; ++lev) {
      const int nb = 4 - lev;  // blocks (b + lev, b) at this distance
      static_assert(3 * 64 <= kChunkThreads, "one (block, row, 4 columns) group per thread");
      const int e = tid, b = e >> 6, r = (e >> 2) & 15, c = (e & 3) * 4, bi = b + lev;
      if (e < nb * 64) {
        float4 r_s = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int mm = 0; mm < 16 * lev; ++mm) {
          const int m = 16 * b + mm;
          const float a = s_a[(16 * bi + r) * LDA + m];
          const float4 t = *reinterpret_cast<const float4*>(s_tm + m * LDT + 16 * b + c);
          r_s.x = fmaf(a, t.x, r_s.x), r_s.y = fmaf(a, t.y, r_s.y), r_s.z = fmaf(a, t.z, r_s.z), r_s.w = fmaf(a, t.w, r_s.w);
        }
        *reinterpret_cast<float4*>(s_y + b * 16 * LDY + r * LDY + c) = r_s;
      }
      __syncthreads();
      if (e < nb * 64) {
        float4 r_s = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int kk = 0; kk < 16; ++kk) {
          if (kk > r) continue;
          const float a = s_tm[(16 * bi + r) * LDT + 16 * bi + kk];
          const float4 y = *reinterpret_cast<const float4*>(s_y + b * 16 * LDY + kk * LDY + c);
          r_s.x = fmaf(a, y.x, r_s.x), r_s.y = fmaf(a, y.y, r_s.y), r_s.z = fmaf(a, y.z, r_s.z), r_s.w = fmaf(a, y.w, r_s.w);
        }
        *reinterpret_cast<float4*>(s_tm + (16 * bi + r) * LDT + 16 * b + c) = make_float4(-r_s.x, -r_s.y, -r_s.z, -r_s.w);
      }
      __syncthreads();
    }
  }
#else
  // Tm = (I + A)^-1 by forward substitution in fp32: Tm[i][j] = delta_ij - sum_{m<i} A[i][m] Tm[m][j].
  // Four lanes per column (fixed shuffle order), warp w owns columns 8w..8w+7 (no block barrier).
  {
    const int col = warp * 8 + (lane >> 2), sub = lane & 3;
    const int mstart = (col & ~3) + sub;  // Tm[m][col] = 0 for m < col
    if (sub == 0) s_tm[col] = col == 0 ? 1.f : 0.f;
    __syncwarp();
    for (int i = 1; i < L; ++i) {
      float r_s = 0.f;
      for (int m = mstart; m < i; m += 4) r_s = fmaf(s_a[i * LDA + m], s_tm[m * LDT + col], r_s);
      r_s += __shfl_xor_sync(0xffffffffu, r_s, 1);
      r_s += __shfl_xor_sync(0xffffffffu, r_s, 2);
      if (sub == 0) s_tm[i * LDT + col] = (i == col ? 1.f : 0.f) - r_s;
      __syncwarp();
    }
    for (int i = max(L, 1); i < C; ++i)
      if (sub == 0) s_tm[i * LDT + col] = i == col ? 1.f : 0.f;
  }
  __syncthreads();
#endif

  // A is dead: V takes its place while Tm is rounded.
  load_ctile<C, D>(s_v, LDD<T>, g_v + ci.bos * p.sv + int64_t(ci.h) * p.dv, p.sv, L, p.dv, tid);
  cp_commit();
  // Tm -> T: W's and U's scaled MMA operands (over the fp32 Tm, through registers) and the backward's copy
  constexpr int NQ = C * C / 4 / kChunkThreads;  // float4 groups per thread
  static_assert(NQ * 4 * kChunkThreads == C * C, "every Tm element in exactly one thread's registers");
  {
    T* g_tm = g_Tm ? g_Tm + (int64_t(ci.c) * p.Hv + ci.h) * C * C : nullptr;
    float4 r_t[NQ];
    // this thread's four columns (the same for every j): beta and e^gamma read before the barrier,
    // since U's operand tile overwrites them
    static_assert(kChunkThreads % 16 == 0, "one column group per thread");
    const float4 b = *reinterpret_cast<const float4*>(s_beta + (tid & 15) * 4);
    const float4 e = *reinterpret_cast<const float4*>(s_eg + (tid & 15) * 4);
#pragma unroll
    for (int j = 0; j < NQ; ++j) {
      const int idx = tid + j * kChunkThreads, r = idx >> 4, c = (idx & 15) * 4;
      r_t[j] = *reinterpret_cast<const float4*>(s_tm + r * LDT + c);
      if (g_tm) {
        store2(g_tm + 4 * idx, r_t[j].x, r_t[j].y);
        store2(g_tm + 4 * idx + 2, r_t[j].z, r_t[j].w);
      }
    }
    __syncthreads();  // every fp32 row read before the rounded rows overwrite them
#pragma unroll
    for (int j = 0; j < NQ; ++j) {
      const int idx = tid + j * kChunkThreads, r = idx >> 4, c = (idx & 15) * 4;
      // columns c..c+3: W's operand Tm diag(beta e^gamma) and U's Tm diag(beta), each rounded once
      store2(s_tmt + r * LDC<T> + c, r_t[j].x * (b.x * e.x), r_t[j].y * (b.y * e.y));
      store2(s_tmt + r * LDC<T> + c + 2, r_t[j].z * (b.z * e.z), r_t[j].w * (b.w * e.w));
      store2(s_tmu + r * LDC<T> + c, r_t[j].x * b.x, r_t[j].y * b.y);
      store2(s_tmu + r * LDC<T> + c + 2, r_t[j].z * b.z, r_t[j].w * b.w);
    }
  }
  cp_wait<0>();
  __syncthreads();

  // W = (Tm diag(beta e^gamma)) K [C, dk], U = (Tm diag(beta)) V [C, dv]
  {
    const int m0 = 32 * (warp & 1), n0 = 32 * (warp >> 1);
    const int Lk = round16(L);
    if (m0 < L && n0 < p.dk) {
      float r_acc[2][4][4];
      zero(r_acc);
      warp_gemm<2, 4, false, false>(r_acc, s_tmt, LDC<T>, s_k, LDD<T>, m0, n0, Lk);
      store_frags(g_W + (ci.bos * p.Hv + ci.h) * p.dk, int64_t(p.Hv) * p.dk, r_acc, m0, n0, L, p.dk);
    }
    if (m0 < L && n0 < p.dv) {
      float r_acc[2][4][4];
      zero(r_acc);
      warp_gemm<2, 4, false, false>(r_acc, s_tmu, LDC<T>, s_v, LDD<T>, m0, n0, Lk);
      store_frags(g_U + (ci.bos * p.Hv + ci.h) * p.dv, int64_t(p.Hv) * p.dv, r_acc, m0, n0, L, p.dv);
    }
  }
}

// ---- the serial kernels' per-chunk tile loads (tiled and warp-owned forms share them) ----------
// Chunk c of sequence (eos its end) and v-head h into one pipeline stage `base` (layout S: the
// kernel's smem struct), V columns v0 .. v0 + nv of a tile BVc wide with row stride ldv, by NTHR
// threads. A full chunk (L = C, dk = D, nv = BVc: every chunk but a sequence's last at the bench
// shapes) takes load_tile_full; the others the generic zero-filling loop. The same copies either
// way. The caller commits the cp.async group.
template <class T, int COLS, int NTHR>
__device__ __forceinline__ void load_rows(T* s, int lds, const T* g, int64_t gstride, bool full, int L, int ncols,
                                          int tid) {
  if (full) load_tile_full<T, C, COLS, NTHR>(s, lds, g, gstride, tid);
  else load_tile(s, lds, g, gstride, C, L, ncols, COLS, tid, NTHR);
}
// The swizzled loaders below (for the wgmma kernels) copy with no L2 eviction hint. In the cluster
// kernels wy_wg_kernel and dqk_wg_kernel the shared base is a uniform register (0x400 + rank << 24),
// and ptxas 13.0 encoded hinted copies on it as LDGSTS [R+UR0], desc[UR1] (the cache-policy
// descriptor as an odd register pair): CUDA error 715, illegal instruction, at the first launch
// (docs/perf.md v0.40.0; the same fault as IST-DASLab/marlin#44 with CUDA 13.1).
// [C][D] bf16 rows (rows >= L zero) -> two 128-byte-swizzled atoms [C][64] at s (wgmma.cuh).
template <int NTHR, class T>
__device__ __forceinline__ void load_rows_sw128(unsigned char* s, const T* g, int64_t gstride, int L, int tid) {
  static_assert(sizeof(T) == 2 && D == 128, "load_rows_sw128: bf16 rows of 128");
  constexpr int CPR = D / 8;  // 16-byte chunks per row
  for (int idx = tid; idx < C * CPR; idx += NTHR) {
    const int r = idx / CPR, c = idx % CPR;
    const bool ok = r < L;
    cp_async16(s + (c >> 3) * (C * 128) + wg::sw128(r, c & 7), ok ? g + r * gstride + 8 * c : g, ok);
  }
}
// load_rows_sw128 with every row valid (L = C): the same copies per thread, whose rows are 8 apart,
// so r & 7 and with it the swizzled column are the same for all of them: each copy is an add, where
// the loop above spent ~20 instructions a copy on its index, predicate and 64-bit products (ncu:
// ~45% of the wg4 state kernel's executed instructions were its tile loads, v0.23.0).
// Its copies of one thread from the first (shared address sa, global gp): rows RSTEP apart.
template <int NTHR, class T>
__device__ __forceinline__ void cp_sw128_rows(uint32_t sa, const T* gp, int64_t gstride) {
  constexpr int CPR = D / 8, RSTEP = NTHR / CPR, N = C / RSTEP;
  static_assert(sizeof(T) == 2 && NTHR % CPR == 0 && RSTEP % 8 == 0 && C % RSTEP == 0, "cp_sw128_rows: shape");
  const int64_t gstep = RSTEP * gstride;
#pragma unroll
  for (int i = 0; i < N; ++i) cp_async16_sa(sa + i * RSTEP * 128, gp + i * gstep);
}
template <int NTHR, class T>
__device__ __forceinline__ void load_rows_sw128_full(unsigned char* s, const T* g, int64_t gstride, int tid) {
  constexpr int CPR = D / 8;
  const int r = tid / CPR, c = tid % CPR;
  cp_sw128_rows<NTHR>(smem_addr(s + (c >> 3) * (C * 128) + wg::sw128(r, c & 7)), g + r * gstride + 8 * c, gstride);
}
// A chunk's dk-wide rows (W, K or Q) into a stage: 128-byte-swizzled atoms for the wgmma kernels
// (SW, dk == D), else [C][LDD] rows.
template <int NTHR, bool SW, class T>
__device__ __forceinline__ void load_dk_rows(unsigned char* s, const T* g, int64_t gstride, bool full, int L, int dk,
                                             int tid) {
  if constexpr (SW) {
    if (L == C) load_rows_sw128_full<NTHR>(s, g, gstride, tid);
    else load_rows_sw128<NTHR>(s, g, gstride, L, tid);
  } else {
    load_rows<T, D, NTHR>(reinterpret_cast<T*>(s), LDD<T>, g, gstride, full, L, dk, tid);
  }
}
template <class S, int BVc, int NTHR, bool SW = false, class T>
__device__ __forceinline__ void load_state_tiles(unsigned char* base, const Params& p, int64_t bos, int eos, int h, int v0,
                                                 int nv, int ldv, const T* g_k, const T* g_W, const T* g_U,
                                                 const float* g_gam, int tid) {
  const int L = min(C, eos - int(bos)), hk = h / p.G;
  const bool full = L == C && p.dk == D && nv == BVc;
  load_dk_rows<NTHR, SW>(base + S::w, g_W + (bos * p.Hv + h) * p.dk, int64_t(p.Hv) * p.dk, full, L, p.dk, tid);
  load_dk_rows<NTHR, SW>(base + S::k, g_k + (bos * p.Hk + hk) * p.dk, int64_t(p.Hk) * p.dk, full, L, p.dk, tid);
  load_rows<T, BVc, NTHR>(reinterpret_cast<T*>(base + S::u), ldv, g_U + (bos * p.Hv + h) * p.dv + v0,
                          int64_t(p.Hv) * p.dv, full, L, nv, tid);
  load_col(reinterpret_cast<float*>(base + S::gam), g_gam + bos * p.Hv + h, p.Hv, C, L, tid, NTHR);
}
// The chunk's P [C][C] (bf16, every element written by p_tile) into one swizzled atom at s: rows i,
// 128 bytes of j each (the MN-major B operand of dO^T P, wgmma.cuh).
template <int NTHR, class T>
__device__ __forceinline__ void load_p_sw128(unsigned char* s, const T* g, int tid) {
  static_assert(sizeof(T) == 2 && C == 64, "load_p_sw128: bf16 rows of 64");
  for (int idx = tid; idx < C * 8; idx += NTHR) cp_async16(s + wg::sw128(idx >> 3, idx & 7), g + 8 * idx, true);
}
// WITH_K = false: all but K and gamma, which the K-split form loads a step ahead (load_rev_k).
// RP: the chunk's P (g_Pc, its [C][C] tile) instead of dDelta_local's rows.
template <class S, int BVc, int NTHR, bool SW = false, bool WITH_K = true, bool RP = false, class T>
__device__ __forceinline__ void load_rev_tiles(unsigned char* base, const Params& p, int64_t bos, int eos, int h, int v0,
                                               int nv, int ldv, const T* g_q, const T* g_k, const T* g_W,
                                               const T* g_do, const T* g_dDl, const float* g_gam, int tid,
                                               const T* g_Pc = nullptr) {
  const int L = min(C, eos - int(bos)), hk = h / p.G;
  const bool full = L == C && p.dk == D && nv == BVc;
  load_dk_rows<NTHR, SW>(base + S::q, g_q + (bos * p.Hk + hk) * p.dk, int64_t(p.Hk) * p.dk, full, L, p.dk, tid);
  if constexpr (WITH_K)
    load_dk_rows<NTHR, SW>(base + S::k, g_k + (bos * p.Hk + hk) * p.dk, int64_t(p.Hk) * p.dk, full, L, p.dk, tid);
  load_dk_rows<NTHR, SW>(base + S::w, g_W + (bos * p.Hv + h) * p.dk, int64_t(p.Hv) * p.dk, full, L, p.dk, tid);
  load_rows<T, BVc, NTHR>(reinterpret_cast<T*>(base + S::dO), ldv, g_do + (bos * p.Hv + h) * p.dv + v0,
                          int64_t(p.Hv) * p.dv, full, L, nv, tid);
  if constexpr (RP)
    load_p_sw128<NTHR>(base + S::pm, g_Pc, tid);
  else
    load_rows<T, BVc, NTHR>(reinterpret_cast<T*>(base + S::ddl), ldv, g_dDl + (bos * p.Hv + h) * p.dv + v0,
                            int64_t(p.Hv) * p.dv, full, L, nv, tid);
  if constexpr (WITH_K)
    load_col(reinterpret_cast<float*>(base + S::gam), g_gam + bos * p.Hv + h, p.Hv, C, L, tid, NTHR);
}

// rev's split-phase form (SP: wg4, one stage, P): chunk c's tiles in two
// cp.async groups, each issued once the previous chunk's copies of them are dead. A: K, P, dO and
// gamma (into gamma buffer gb), read by the step's first products; B: Q and W, read by its last.
// Together, load_rev_tiles<..., RP = true>'s copies.
template <class S, int BVc, int NTHR, class T>
__device__ __forceinline__ void load_rev_group_a(unsigned char* base, const Params& p, int64_t bos, int eos, int h,
                                                 int v0, int nv, int ldv, const T* g_k, const T* g_do,
                                                 const float* g_gam, const T* g_Pc, int gb, int tid) {
  const int L = min(C, eos - int(bos)), hk = h / p.G;
  const bool full = L == C && p.dk == D && nv == BVc;
  load_dk_rows<NTHR, true>(base + S::k, g_k + (bos * p.Hk + hk) * p.dk, int64_t(p.Hk) * p.dk, full, L, p.dk, tid);
  load_rows<T, BVc, NTHR>(reinterpret_cast<T*>(base + S::dO), ldv, g_do + (bos * p.Hv + h) * p.dv + v0,
                          int64_t(p.Hv) * p.dv, full, L, nv, tid);
  load_p_sw128<NTHR>(base + S::pm, g_Pc, tid);
  load_col(reinterpret_cast<float*>(base + S::gam) + gb * C, g_gam + bos * p.Hv + h, p.Hv, C, L, tid, NTHR);
}
template <class S, int NTHR, class T>
__device__ __forceinline__ void load_rev_group_b(unsigned char* base, const Params& p, int64_t bos, int eos, int h,
                                                 const T* g_q, const T* g_W, int tid) {
  const int L = min(C, eos - int(bos)), hk = h / p.G;
  load_dk_rows<NTHR, true>(base + S::q, g_q + (bos * p.Hk + hk) * p.dk, int64_t(p.Hk) * p.dk, L == C, L, p.dk, tid);
  load_dk_rows<NTHR, true>(base + S::w, g_W + (bos * p.Hv + h) * p.dk, int64_t(p.Hv) * p.dk, L == C, L, p.dk, tid);
}
// K and gamma of a chunk for wg4's rev kernel with K split off (DT_GDN_REV_KSPLIT), into K buffer
// `buf` a step ahead (the step's first product and its decays need them); the chunk's other tiles
// come from load_rev_tiles<..., WITH_K = false> at the step's start, awaited only after the first
// product. Layout S: WgRevSmemKS. Together, the same copies as load_rev_tiles.
template <class S, int BVc, int NTHR, class T>
__device__ __forceinline__ void load_rev_k(unsigned char* smem, int buf, const Params& p, int64_t bos, int eos, int h,
                                           const T* g_k, const float* g_gam, int tid) {
  const int L = min(C, eos - int(bos)), hk = h / p.G;
  load_dk_rows<NTHR, true>(smem + S::k + buf * S::kbuf, g_k + (bos * p.Hk + hk) * p.dk, int64_t(p.Hk) * p.dk, L == C,
                           L, p.dk, tid);
  load_col(reinterpret_cast<float*>(smem + S::gam) + buf * C, g_gam + bos * p.Hv + h, p.Hv, C, L, tid, NTHR);
}
// ---- state (serial over chunks): h[c] = S, Delta = U - W S, S = e^{gam_e} S + K^T (Delta (.) eL) ----
// Stages = 2 double-buffers the per-chunk tiles (chunk c+1 loads while chunk c computes), as
// rev_kernel does; the launcher picks the count (state_stages).
template <class T, int Stages>
struct StateSmem {
  static_assert(Stages == 1 || Stages == 2, "state_kernel: 1 or 2 stages");
  static constexpr int NS = Stages;                                // pipeline stages
  static constexpr size_t w = 0;                                   // T [C][LDD]
  static constexpr size_t k = w + sizeof(T) * C * LDD<T>;          // T [C][LDD]
  static constexpr size_t u = k + sizeof(T) * C * LDD<T>;          // T [C][LDV]
  static constexpr size_t gam = u + sizeof(T) * C * LDV<T>;        // f32 [C]
  static constexpr size_t stage = gam + sizeof(float) * C;
  static constexpr size_t s = NS * stage;                          // T [D][LDV]  state operand
  // decayed Delta: overwrites the stage's U tile in place (same thread, same element)
  static constexpr size_t bytes = s + sizeof(T) * D * LDV<T>;
  static_assert(stage % 16 == 0, "state_kernel: every stage must start 16-byte aligned (cp.async 16)");
};
// Two stages cost no occupancy at either dtype: bf16 104.5 KB keeps the two CTAs per SM that the
// 128-register bound allows (one stage: 61.3 KB, also two); f32 200.5 KB keeps the one CTA per SM
// that one stage (117.3 KB) already has. So the automatic choice is 2 stages for both.
static_assert(StateSmem<bf16, 2>::bytes <= kMaxSmem && StateSmem<float, 2>::bytes <= kMaxSmem,
              "state_kernel: shared memory over the 227 KB opt-in limit");
static_assert(kSeqMinBlocks<bf16> * (StateSmem<bf16, 2>::bytes + kSmemReservedPerCta) <= kSmemPerSm,
              "two-stage bf16 state_kernel: two CTAs per SM");
static_assert(kSeqMinBlocks<float> * (StateSmem<float, 2>::bytes + kSmemReservedPerCta) <= kSmemPerSm &&
                  2 * (StateSmem<float, 1>::bytes + kSmemReservedPerCta) > kSmemPerSm,
              "f32 state_kernel: one CTA per SM with one stage and with two");

template <class T, int Stages>
__global__ __launch_bounds__(kSeqThreads, kSeqMinBlocks<T>) void state_kernel(Params p, const T* __restrict__ g_k,
                                                            const T* __restrict__ g_W, const T* __restrict__ g_U,
                                                            const float* __restrict__ g_gam,
                                                            const float* __restrict__ g_h0,  // [N, Hv, dk, dv] or null
                                                            T* __restrict__ g_h,             // [NT, Hv, dk, dv] or null
                                                            T* __restrict__ g_D,             // [T, Hv, dv]
                                                            float* __restrict__ g_ht) {      // [N, Hv, dk, dv] or null
  extern __shared__ __align__(16) unsigned char smem[];
  using S = StateSmem<T, Stages>;
  T* s_s = reinterpret_cast<T*>(smem + S::s);
  const SeqCta cta = seq_cta(p);
  const int n = cta.n, h = cta.h, vt = cta.vt;
  const int v0 = vt * BV, nv = min(BV, p.dv - v0);
  const SeqSpan sp = seq_span(p, n);
  const int c0 = sp.c0, c1 = sp.c1, eos = sp.eos;
  const int tid = threadIdx.x, warp = tid >> 5;
  const int sm0 = 32 * (warp & 3), sn0 = 32 * (warp >> 2);  // state rows / tile columns of this warp
  const int64_t state_base = (int64_t(n) * p.Hv + h) * p.dk * p.dv + v0;

  float r_S[2][4][4];  // S[dk rows sm0.., tile cols sn0..] fp32
  frag_pairs(r_S, sm0, sn0, [&](int r, int c, float& x0, float& x1) {
    x0 = x1 = 0.f;
    if (g_h0 && r < p.dk && c < nv) {
      const float2 v = load2(g_h0 + state_base + int64_t(r) * p.dv + c);
      x0 = v.x, x1 = v.y;
    }
  });

  auto issue = [&](int c, int st) {
    load_state_tiles<S, BV, kSeqThreads>(smem + st * S::stage, p, sp.bos(c), eos, h, v0, nv, LDV<T>, g_k, g_W, g_U, g_gam,
                                         tid);
  };

  if constexpr (S::NS == 2) {
    if (c0 < c1) issue(c0, 0);
    cp_commit();
  }
  for (int c = c0; c < c1; ++c) {
    int st = 0;
    if constexpr (S::NS == 2) {
      st = (c - c0) & 1;
      cp_wait<0>();
      __syncthreads();
      if (c + 1 < c1) issue(c + 1, st ^ 1);
      cp_commit();
    } else {
      __syncthreads();
      issue(c, 0);
      cp_commit();
      cp_wait<0>();
      __syncthreads();
    }
    unsigned char* base = smem + st * S::stage;
    const T* s_w = reinterpret_cast<const T*>(base + S::w);
    const T* s_k = reinterpret_cast<const T*>(base + S::k);
    const T* s_u = reinterpret_cast<const T*>(base + S::u);
    const float* s_gam = reinterpret_cast<const float*>(base + S::gam);
    T* s_d = reinterpret_cast<T*>(base + S::u);
    const int64_t bos = sp.bos(c);
    const int L = min(C, eos - int(bos)), Lk = round16(L);
    const float gam_e = s_gam[L - 1];

    // 1. S -> smem operand (T) and the chunk-start state h[c]
    T* g_hc = g_h ? g_h + (int64_t(c) * p.Hv + h) * p.dk * p.dv + v0 : nullptr;
    frag_pairs(r_S, sm0, sn0, [&](int r, int cc, float& x0, float& x1) {
      store2(s_s + r * LDV<T> + cc, x0, x1);
      if (g_hc && r < p.dk && cc < nv) store2(g_hc + int64_t(r) * p.dv + cc, x0, x1);
    });
    __syncthreads();

    // 2. Delta = U - W S  [C, BV]; decayed copy for the state update (in place of U)
    {
      const int m0 = 16 * (warp & 3);
      float r_acc[1][4][4];
      zero(r_acc);
      if (m0 < L && sn0 < nv) warp_gemm<1, 4, false, false>(r_acc, s_w, LDD<T>, s_s, LDV<T>, m0, sn0, p.dk);
      frag_pairs(r_acc, m0, sn0, [&](int r, int cc, float& x0, float& x1) {
        const float2 u = load2(s_u + r * LDV<T> + cc);
        const float d0 = u.x - x0, d1 = u.y - x1;
        if (r < L && cc < nv) store2(g_D + ((bos + r) * p.Hv + h) * p.dv + v0 + cc, d0, d1);
        const float f = r < L ? gexp(gam_e - s_gam[r]) : 0.f;
        store2(s_d + r * LDV<T> + cc, r < L ? d0 * f : 0.f, r < L ? d1 * f : 0.f);
      });
    }
    __syncthreads();

    // 3. S = e^{gam_e} S + K^T Delta~
    {
      const float de = gexp(gam_e);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) r_S[i][j][e] *= de;
      if (sm0 < p.dk && sn0 < nv) warp_gemm<2, 4, true, false>(r_S, s_k, LDD<T>, s_d, LDV<T>, sm0, sn0, Lk);
    }
  }
  if (g_ht)
    frag_pairs(r_S, sm0, sn0, [&](int r, int c, float& x0, float& x1) {
      if (r < p.dk && c < nv) store2(g_ht + state_base + int64_t(r) * p.dv + c, x0, x1);
    });
}

// ---- out: O = scale (diag(e^gamma) Q h_c + P Delta), P = (Q K^T) (.) Gamma, causal -------------
// P [C][C] as out and dvl compute it (dvl uses it transposed): a warp tile per (16 rows, 32
// columns), zeros above the diagonal and in rows >= L, each entry rounded once into s_p.
template <class T>
__device__ __forceinline__ void p_tile(T* s_p, const T* s_q, const T* s_k, const float* s_gam, int L, int dk, int warp) {
  const int m0 = 16 * (warp & 3), n0 = 32 * (warp >> 2);
  float r_acc[1][4][4];
  zero(r_acc);
  if (m0 < L && n0 < m0 + 16) warp_gemm<1, 4, false, true>(r_acc, s_q, LDD<T>, s_k, LDD<T>, m0, n0, dk);
  frag_pairs(r_acc, m0, n0, [&](int r, int c, float& x0, float& x1) {
    const bool rv = r < L;
    store2(s_p + r * LDC<T> + c, (rv && c <= r) ? x0 * gexp(s_gam[r] - s_gam[c]) : 0.f,
           (rv && c + 1 <= r) ? x1 * gexp(s_gam[r] - s_gam[c + 1]) : 0.f);
  });
}
// The whole [C][C] tile to global (16-byte vectors); the forward hands it to dvl.
template <class T>
__device__ __forceinline__ void store_p(T* g, const T* s_p, int tid) {
  constexpr int V = 16 / sizeof(T);
  for (int idx = tid * V; idx < C * C; idx += kChunkThreads * V) {
    const int r = idx / C, c = idx - r * C;
    *reinterpret_cast<uint4*>(g + idx) = *reinterpret_cast<const uint4*>(s_p + r * LDC<T> + c);
  }
}
// out in two load phases: Q and h_c first (O = diag(e^gamma) Q h_c), then K and Delta over h_c
// (P, then O += P Delta): the same products in the same order as with all four resident, in
// 61.7 KB instead of 96.5 at bf16, so three CTAs per SM instead of two.
template <class T>
struct OutSmem {
  static constexpr size_t q = 0;                                 // T [C][LDD]
  static constexpr size_t hs = q + sizeof(T) * C * LDD<T>;       // T [D][LDD]  h_c [dk, dv]; then K, Delta
  static constexpr size_t k = hs;                                // T [C][LDD]  K, then z (norm epilogue)
  static constexpr size_t d = hs + sizeof(T) * C * LDD<T>;       // T [C][LDD]  Delta, then the o tile
  static constexpr size_t pm = hs + sizeof(T) * D * LDD<T>;      // T [C][LDC]
  static constexpr size_t gam = pm + sizeof(T) * C * LDC<T>;     // f32 [C]
  static constexpr size_t bytes = gam + sizeof(float) * C;
  static_assert(gam % 8 == 0, "p_tile's float2 reads of gamma");
};
template <class T> constexpr int kOutMinBlocks = sizeof(T) == 2 ? 3 : 1;
static_assert(3 * (OutSmem<bf16>::bytes + kSmemReservedPerCta) <= kSmemPerSm, "out: three bf16 CTAs per SM");
// dvl: dO, P, gamma first, so that with the forward's P (nothing else to load) the launch takes
// only those (26.9 KB at bf16; its 65 registers hold it to three CTAs per SM); Q, K after them.
template <class T>
struct DvlSmem {
  static constexpr size_t d = 0;                                 // T [C][LDD]  dO
  static constexpr size_t pm = d + sizeof(T) * C * LDD<T>;       // T [C][LDC]  P
  static constexpr size_t gam = pm + sizeof(T) * C * LDC<T>;     // f32 [C]
  static constexpr size_t bytes_p = gam + sizeof(float) * C;     // P from the forward
  static constexpr size_t q = bytes_p;                           // T [C][LDD]
  static constexpr size_t k = q + sizeof(T) * C * LDD<T>;        // T [C][LDD]
  static constexpr size_t bytes = k + sizeof(T) * C * LDD<T>;    // P computed here
  static_assert(gam % 8 == 0, "p_tile's float2 reads of gamma");
};

// The gated RMSNorm epilogue (GdnOutNorm; off with DT_GDN_OUT_NORM=0): y = o rstd w silu(z) per row of dv,
// rstd = 1 / sqrt(mean(o^2) + eps), from the rounded o tile in shared memory, with
// gated_rmsnorm_fwd_kernel's lanes (tpr per row, 16-byte slots), sum order and rounding.
struct OutNorm {
  const void* z;    // [T, Hv, dv]: token stride sz, head stride dv; null: no epilogue
  int64_t sz;
  const float* w;   // [dv]
  void* y;          // [T, Hv, dv]: token stride sy, head stride dv
  int64_t sy;
  float* rstd;      // [T * Hv]
  float eps;
  int tpr;
  int w_vec;        // w 16-byte aligned
};

template <class T>
__global__ __launch_bounds__(kChunkThreads, kOutMinBlocks<T>) void out_kernel(
    Params p, const T* __restrict__ g_q,
    const T* __restrict__ g_k,
    const float* __restrict__ g_gam,
    const T* __restrict__ g_h,  // [NT, Hv, dk, dv]
    const T* __restrict__ g_D,  // [T, Hv, dv]
    T* __restrict__ g_o,        // [T, Hv, dv]
    T* __restrict__ g_P,        // [NT, Hv, C, C] or null
    const OutNorm nrm) {
  extern __shared__ __align__(16) unsigned char smem[];
  using S = OutSmem<T>;
  T* s_q = reinterpret_cast<T*>(smem + S::q);
  T* s_k = reinterpret_cast<T*>(smem + S::k);
  T* s_d = reinterpret_cast<T*>(smem + S::d);
  T* s_h = reinterpret_cast<T*>(smem + S::hs);
  T* s_p = reinterpret_cast<T*>(smem + S::pm);
  float* s_gam = reinterpret_cast<float*>(smem + S::gam);
  const ChunkIdx ci = chunk_idx(p);
  const int tid = threadIdx.x, warp = tid >> 5, L = ci.L, Lk = round16(L);
  const bool norm = nrm.z != nullptr;
  // Phase I: Q, h_c, gamma; O = diag(e^gamma) Q h_c   [C, dv], this warp's [32, 32]
  load_ctile<C, D>(s_q, LDD<T>, g_q + (ci.bos * p.Hk + ci.hk) * p.dk, int64_t(p.Hk) * p.dk, L, p.dk, tid);
  load_col(s_gam, g_gam + ci.bos * p.Hv + ci.h, p.Hv, C, L, tid, kChunkThreads);
  if (p.done) {  // h_c comes from the state kernel (with_serial_pdl): Q and gamma load meanwhile
    if (tid == 0) serial_wait(p, ci.c);
    __syncthreads();
  }
  load_ctile<D, D>(s_h, LDD<T>, g_h + (int64_t(ci.c) * p.Hv + ci.h) * p.dk * p.dv, p.dv, p.dk, p.dv, tid);
  cp_commit();
  cp_wait<0>();
  __syncthreads();
  const int m0 = 32 * (warp & 1), n0 = 32 * (warp >> 1);
  const bool active = m0 < L && n0 < p.dv;
  float r_acc[2][4][4];
  zero(r_acc);
  if (active) {
    warp_gemm<2, 4, false, false>(r_acc, s_q, LDD<T>, s_h, LDD<T>, m0, n0, p.dk);
    frag_pairs(r_acc, m0, n0, [&](int r, int, float& x0, float& x1) {
      const float e = r < L ? gexp(s_gam[r]) : 0.f;
      x0 *= e, x1 *= e;
    });
  }
  __syncthreads();  // h_c is dead: phase II loads K and Delta over it
  load_ctile<C, D>(s_k, LDD<T>, g_k + (ci.bos * p.Hk + ci.hk) * p.dk, int64_t(p.Hk) * p.dk, L, p.dk, tid);
  cp_commit();
  load_ctile<C, D>(s_d, LDD<T>, g_D + (ci.bos * p.Hv + ci.h) * p.dv, int64_t(p.Hv) * p.dv, L, p.dv, tid);
  cp_commit();
  cp_wait<1>();  // K: P is computed while Delta lands
  __syncthreads();
  p_tile(s_p, s_q, s_k, s_gam, L, p.dk, warp);  // P = (Q K^T) (.) Gamma, j <= i < L   [C, C]
  cp_wait<0>();
  __syncthreads();
  if (g_P) store_p(g_P + (int64_t(ci.c) * p.Hv + ci.h) * C * C, s_p, tid);  // for dvl (saved intermediates)
  if (norm) {  // K is dead: z's tile loads over it while P Delta is computed
    load_tile(s_k, LDD<T>, static_cast<const T*>(nrm.z) + ci.bos * nrm.sz + int64_t(ci.h) * p.dv, nrm.sz, C, L, p.dv,
              D, tid, kChunkThreads);  // (not load_ctile: spilled at 80 registers)
    cp_commit();
  }
  if (active) warp_gemm<2, 4, false, false>(r_acc, s_p, LDC<T>, s_d, LDD<T>, m0, n0, Lk);  // O += P Delta
  if (!norm) {
    if (active)
      frag_pairs(r_acc, m0, n0, [&](int r, int c, float& x0, float& x1) {
        if (r < L && c < p.dv) store2(g_o + ((ci.bos + r) * p.Hv + ci.h) * p.dv + c, p.scale * x0, p.scale * x1);
      });
    return;
  }
  // Epilogue: the rounded o tile into Delta's (dead once every warp's products are done), then
  // one group of nrm.tpr lanes per row: o and y rows out in 16-byte slots, rstd per row.
  T* s_o = s_d;  // [C][LDD]
  __syncthreads();
  if (active)
    frag_pairs(r_acc, m0, n0, [&](int r, int c, float& x0, float& x1) {
      store2(s_o + r * LDD<T> + c, p.scale * x0, p.scale * x1);
    });
  cp_wait<0>();
  __syncthreads();
  constexpr int V = 16 / int(sizeof(T)), NS = (256 / V + 31) / 32;  // gated_rmsnorm's slots per lane
  const int tpr = nrm.tpr, lane = tid & (tpr - 1), grp = tid / tpr, gpb = kChunkThreads / tpr;
  float r_w[NS][V];
#pragma unroll
  for (int sl = 0; sl < NS; ++sl) ew::load_param<V>(nrm.w, int64_t(lane + sl * tpr) * V, p.dv, nrm.w_vec != 0, r_w[sl]);
  const float inv_d = 1.f / float(p.dv);
  for (int r = grp; r < C; r += gpb) {  // C is a multiple of gpb, or gpb > C: warp-uniform trips
    float r_o[NS][V], r_z[NS][V];
    float r_ss = 0.f;
#pragma unroll
    for (int sl = 0; sl < NS; ++sl) {
      const int e0 = (lane + sl * tpr) * V;
      if (e0 < p.dv) {
        ew::unpack16<T>(*reinterpret_cast<const uint4*>(s_o + r * LDD<T> + e0), r_o[sl]);
        ew::unpack16<T>(*reinterpret_cast<const uint4*>(s_k + r * LDD<T> + e0), r_z[sl]);
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) r_o[sl][e] = r_z[sl][e] = 0.f;
      }
#pragma unroll
      for (int e = 0; e < V; ++e) r_ss = fmaf(r_o[sl][e], r_o[sl][e], r_ss);
    }
    r_ss = ew::group_sum(r_ss, tpr);
    const float r_rstd = rsqrtf(r_ss * inv_d + nrm.eps);
    if (r >= L) continue;
    const int64_t t = ci.bos + r;
    T* g_orow = g_o + (t * p.Hv + ci.h) * p.dv;
    T* g_yrow = static_cast<T*>(nrm.y) + t * nrm.sy + int64_t(ci.h) * p.dv;
#pragma unroll
    for (int sl = 0; sl < NS; ++sl) {
      const int e0 = (lane + sl * tpr) * V;
      if (e0 < p.dv) {
        *reinterpret_cast<uint4*>(g_orow + e0) = *reinterpret_cast<const uint4*>(s_o + r * LDD<T> + e0);
        float r_y[V];
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const float z = r_z[sl][e];
          r_y[e] = r_o[sl][e] * r_rstd * r_w[sl][e] * (z * ew::sigmoid_f(z));
        }
        ew::store_slot<T>(g_yrow, e0, p.dv, true, r_y);
      }
    }
    if (lane == 0) nrm.rstd[t * p.Hv + ci.h] = r_rstd;
  }
}

// ---- dvl: dDelta_local = scale P^T dO  (B3) ------------------------------------------------------
// P from the forward (g_P, saved intermediates: only P and dO are loaded) or computed here exactly
// as the forward's out kernel does (p_tile), so both give the same bits.
// When wg4's rev kernel makes dDelta_local itself from P (DT_GDN_REV_P, rev_p_knob), g_dDl is
// null: no product here; without a saved P, this kernel writes its P to g_Pout for rev.
// With the gated RMSNorm's backward (GdnOutNormBwd, unless DT_GDN_OUT_NORM=0; nrm.dy set), dO is made
// here from dy, o, z and rstd, row by row with gated_rmsnorm_bwd_kernel's lanes, order and
// rounding (dO and dz the same bits), and written out for rev and dqk; the norm weight's gradient
// leaves as this CTA's column partial (its rows in fixed order), summed over CTAs by colsum_add.
struct DvlNorm {
  const void* dy;   // [T, Hv, dv]: token stride sdy, head stride dv; null: dO is an input
  int64_t sdy;
  const void* o;    // [T, Hv, dv] contiguous
  const void* z;    // [T, Hv, dv]: token stride sz
  int64_t sz;
  const float* w;   // [dv]
  const float* rstd;  // [T * Hv]
  void* dz;         // [T, Hv, dv]: token stride sdz
  int64_t sdz;
  float* part;      // [NT * Hv, dv] f32: per-CTA partials of dw
  int tpr;
  int w_vec;
};
template <class T>
constexpr size_t dvl_norm_bytes(bool p_saved) {  // after DvlSmem<T>::bytes: (o, z tiles unless over Q, K) rstd
  return (p_saved ? 0 : 2 * sizeof(T) * C * LDD<T>) + sizeof(float) * C;
}

// NORM: the gated RMSNorm prologue (its own instantiation, so the plain one keeps its 65 registers
// at bf16; four CTAs per SM at 64 registers measured no faster: 274 vs 265 us).
template <class T, bool NORM>
__global__ __launch_bounds__(kChunkThreads) void dvl_kernel(
    Params p, const T* __restrict__ g_q,
    const T* __restrict__ g_k,
    const float* __restrict__ g_gam,
    const T* __restrict__ g_P,   // [NT, Hv, C, C] or null
    T* __restrict__ g_do,        // [T, Hv, dv] (= with nrm)
    T* __restrict__ g_dDl,       // [T, Hv, dv] or null (rev makes it)
    T* __restrict__ g_Pout,      // [NT, Hv, C, C] or null: P for rev, when not from the forward
    const DvlNorm nrm) {
  extern __shared__ __align__(16) unsigned char smem[];
  using S = DvlSmem<T>;
  T* s_q = reinterpret_cast<T*>(smem + S::q);
  T* s_k = reinterpret_cast<T*>(smem + S::k);
  T* s_do = reinterpret_cast<T*>(smem + S::d);
  T* s_p = reinterpret_cast<T*>(smem + S::pm);
  float* s_gam = reinterpret_cast<float*>(smem + S::gam);
  // Norm tiles: o, z over Q, K when P comes from the forward (Q, K unused), else after them; rstd last.
  T* s_o = g_P ? s_q : reinterpret_cast<T*>(smem + S::bytes);             // norm: o [C][LDD]
  T* s_z = g_P ? s_k : s_o + C * LDD<T>;                                 // norm: z [C][LDD]
  float* s_rs = reinterpret_cast<float*>(smem + S::bytes + (g_P ? 0 : 2 * sizeof(T) * C * LDD<T>));  // [C]
  const ChunkIdx ci = chunk_idx(p);
  const int tid = threadIdx.x, warp = tid >> 5, L = ci.L, Lk = round16(L);
  constexpr bool norm = NORM;
  if constexpr (NORM) {  // dy into dO's tile (made into dO in place), o, z, rstd
    load_ctile<C, D>(s_do, LDD<T>, static_cast<const T*>(nrm.dy) + ci.bos * nrm.sdy + int64_t(ci.h) * p.dv,
        nrm.sdy, L, p.dv, tid);
    load_ctile<C, D>(s_o, LDD<T>, static_cast<const T*>(nrm.o) + (ci.bos * p.Hv + ci.h) * p.dv,
        int64_t(p.Hv) * p.dv, L, p.dv, tid);
    load_ctile<C, D>(s_z, LDD<T>, static_cast<const T*>(nrm.z) + ci.bos * nrm.sz + int64_t(ci.h) * p.dv,
        nrm.sz, L, p.dv, tid);
    load_col(s_rs, nrm.rstd + ci.bos * p.Hv + ci.h, p.Hv, C, L, tid, kChunkThreads);
  } else {
    load_ctile<C, D>(s_do, LDD<T>, g_do + (ci.bos * p.Hv + ci.h) * p.dv, int64_t(p.Hv) * p.dv, L, p.dv, tid);
  }
  if (g_P) {
    if (g_dDl) load_ctile<C, C>(s_p, LDC<T>, g_P + (int64_t(ci.c) * p.Hv + ci.h) * C * C, C, C, C, tid);
  } else {
    load_ctile<C, D>(s_q, LDD<T>, g_q + (ci.bos * p.Hk + ci.hk) * p.dk, int64_t(p.Hk) * p.dk, L, p.dk, tid);
    load_ctile<C, D>(s_k, LDD<T>, g_k + (ci.bos * p.Hk + ci.hk) * p.dk, int64_t(p.Hk) * p.dk, L, p.dk, tid);
    load_col(s_gam, g_gam + ci.bos * p.Hv + ci.h, p.Hv, C, L, tid, kChunkThreads);
  }
  cp_commit();
  cp_wait<0>();
  if (!g_P || norm) __syncthreads();
  if constexpr (NORM) {  // dO, dz per row (rows >= L load as zeros and stay zeros); dw's lane partials
    constexpr int V = 16 / int(sizeof(T)), NS = (256 / V + 31) / 32;  // gated_rmsnorm's slots per lane
    const int tpr = nrm.tpr, lane = tid & (tpr - 1), grp = tid / tpr, gpb = kChunkThreads / tpr;
    float r_w[NS][V], r_dw[NS][V];
#pragma unroll
    for (int sl = 0; sl < NS; ++sl) {
      ew::load_param<V>(nrm.w, int64_t(lane + sl * tpr) * V, p.dv, nrm.w_vec != 0, r_w[sl]);
#pragma unroll
      for (int e = 0; e < V; ++e) r_dw[sl][e] = 0.f;
    }
    const float inv_d = 1.f / float(p.dv);
    for (int r = grp; r < C; r += gpb) {  // warp-uniform trips (see the out kernel's epilogue)
      float r_o[NS][V], r_z[NS][V], r_dy[NS][V];
      const float r_rstd = s_rs[r];
      float r_m = 0.f;  // sum(xh * w * dy0)
      const int64_t t = ci.bos + r;
#pragma unroll
      for (int sl = 0; sl < NS; ++sl) {
        const int e0 = (lane + sl * tpr) * V;
        if (e0 < p.dv) {
          ew::unpack16<T>(*reinterpret_cast<const uint4*>(s_o + r * LDD<T> + e0), r_o[sl]);
          ew::unpack16<T>(*reinterpret_cast<const uint4*>(s_z + r * LDD<T> + e0), r_z[sl]);
          ew::unpack16<T>(*reinterpret_cast<const uint4*>(s_do + r * LDD<T> + e0), r_dy[sl]);
        } else {
#pragma unroll
          for (int e = 0; e < V; ++e) r_o[sl][e] = r_z[sl][e] = r_dy[sl][e] = 0.f;
        }
        float r_dz[V];
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const float z = r_z[sl][e], dy = r_dy[sl][e];
          const float xh = r_o[sl][e] * r_rstd;
          const float sg = ew::sigmoid_f(z);
          const float dy0 = dy * (z * sg);
          r_dz[e] = dy * xh * r_w[sl][e] * (sg * (1.f + z * (1.f - sg)));
          r_dw[sl][e] = fmaf(dy0, xh, r_dw[sl][e]);
          r_m = fmaf(xh * r_w[sl][e], dy0, r_m);
          r_o[sl][e] = xh;
          r_dy[sl][e] = dy0;
        }
        if (r < L && e0 < p.dv)
          ew::store_slot<T>(static_cast<T*>(nrm.dz) + t * nrm.sdz + int64_t(ci.h) * p.dv, e0, p.dv, true, r_dz);
      }
      r_m = ew::group_sum(r_m, tpr) * inv_d;
#pragma unroll
      for (int sl = 0; sl < NS; ++sl) {
        const int e0 = (lane + sl * tpr) * V;
        if (e0 < p.dv) {
          float r_do[V];
#pragma unroll
          for (int e = 0; e < V; ++e) r_do[e] = r_rstd * (r_w[sl][e] * r_dy[sl][e] - r_o[sl][e] * r_m);
          const uint4 u = ew::pack16<T>(r_do);
          *reinterpret_cast<uint4*>(s_do + r * LDD<T> + e0) = u;  // this lane's slot only: no race
          if (r < L) *reinterpret_cast<uint4*>(g_do + (t * p.Hv + ci.h) * p.dv + e0) = u;
        }
      }
    }
    __syncthreads();  // dO complete; o and z are dead: their tile takes dw's group partials
    float* s_dw = reinterpret_cast<float*>(s_o);  // [gpb][dv] f32
#pragma unroll
    for (int sl = 0; sl < NS; ++sl) {
      const int e0 = (lane + sl * tpr) * V;
#pragma unroll
      for (int e = 0; e < V; ++e)
        if (e0 + e < p.dv) s_dw[grp * p.dv + e0 + e] = r_dw[sl][e];
    }
    __syncthreads();
    for (int c = tid; c < p.dv; c += kChunkThreads) {
      float r_sum = 0.f;
      for (int g = 0; g < gpb; ++g) r_sum += s_dw[g * p.dv + c];
      nrm.part[(int64_t(ci.c) * p.Hv + ci.h) * p.dv + c] = r_sum;
    }
  }
  if (!g_P) p_tile(s_p, s_q, s_k, s_gam, L, p.dk, warp);  // P = (Q K^T) (.) Gamma, j <= i < L   [C, C]
  if (!g_dDl) {  // rev makes dDelta_local: it takes P from here when the forward's is not saved
    if (g_Pout) {
      __syncthreads();
      store_p(g_Pout + (int64_t(ci.c) * p.Hv + ci.h) * C * C, s_p, tid);
    }
    return;
  }
  __syncthreads();
  {  // dDelta_local = scale P^T dO   [C, dv] (P read transposed: rows i of P are the k index)
    const int m0 = 32 * (warp & 1), n0 = 32 * (warp >> 1);
    if (m0 < L && n0 < p.dv) {
      float r_acc[2][4][4];
      zero(r_acc);
      warp_gemm<2, 4, true, false>(r_acc, s_p, LDC<T>, s_do, LDD<T>, m0, n0, Lk);
      frag_pairs(r_acc, m0, n0, [&](int r, int c, float& x0, float& x1) {
        if (r < L && c < p.dv) store2(g_dDl + ((ci.bos + r) * p.Hv + ci.h) * p.dv + c, p.scale * x0, p.scale * x1);
      });
    }
  }
}

// ---- rev (serial, reversed chunks): dS1[c] = dS; dDelta = dDelta_local + eL (.) (K dS);
//      dS = e^{gam_e} dS + Q^T (scale e^gamma (.) dO) - W^T dDelta;  dh0 = dS  (B4) ---------------
// Stages = 2 double-buffers the per-chunk input tiles: chunk c-1's cp.async loads fly while chunk c
// computes. Only the load timing differs from Stages = 1 (same arithmetic in the same order, so
// the same bits). The launcher picks the stage count (rev_stages).
template <class T, int Stages>
struct RevSmem {
  static_assert(Stages == 1 || Stages == 2, "rev_kernel: 1 or 2 stages");
  // one stage: the input tiles of one chunk
  static constexpr size_t q = 0;                                   // T [C][LDD]
  static constexpr size_t k = q + sizeof(T) * C * LDD<T>;          // T [C][LDD]
  static constexpr size_t w = k + sizeof(T) * C * LDD<T>;          // T [C][LDD]
  static constexpr size_t dO = w + sizeof(T) * C * LDD<T>;         // T [C][LDV]  then scale e^gamma dO, in place
  static constexpr size_t ddl = dO + sizeof(T) * C * LDV<T>;       // T [C][LDV]  then -dDelta, in place
  static constexpr size_t gam = ddl + sizeof(T) * C * LDV<T>;      // f32 [C]
  static constexpr size_t stage = gam + sizeof(float) * C;
  static constexpr size_t s = Stages * stage;                      // T [D][LDV]  dS operand (one for all stages)
  static constexpr size_t bytes = s + sizeof(T) * D * LDV<T>;
  static_assert(stage % 16 == 0, "rev_kernel: every stage must start 16-byte aligned (cp.async 16)");
};
// bf16: one stage 87.3 KB (2 CTAs per SM), two stages 156.5 KB (1 per SM). f32: one stage 167.3 KB;
// two would take 300.5 KB, over the 227 KB a CTA may opt into on sm_90, so f32 has one stage only.
static_assert(RevSmem<bf16, 1>::bytes <= kMaxSmem && RevSmem<bf16, 2>::bytes <= kMaxSmem &&
                  RevSmem<float, 1>::bytes <= kMaxSmem,
              "rev_kernel: shared memory over the 227 KB opt-in limit");
static_assert(RevSmem<float, 2>::bytes > kMaxSmem, "the f32 rev_kernel fits two stages now: instantiate them");
static_assert(kSeqMinBlocks<bf16> * (RevSmem<bf16, 1>::bytes + kSmemReservedPerCta) <= kSmemPerSm,
              "one-stage bf16 rev_kernel: two CTAs per SM");
template <class T> constexpr int kRevMaxStages = sizeof(T) == 2 ? 2 : 1;
// Two stages run one CTA per SM (the launcher picks them only then): no 128-register cap.
template <class T, int Stages> constexpr int kRevMinBlocks = Stages == 2 ? 1 : kSeqMinBlocks<T>;

template <class T, int Stages>
__global__ __launch_bounds__(kSeqThreads, kRevMinBlocks<T, Stages>) void rev_kernel(
    Params p, const T* __restrict__ g_q, const T* __restrict__ g_k, const T* __restrict__ g_W,
    const float* __restrict__ g_gam, const T* __restrict__ g_do, const T* __restrict__ g_dDl,
    const float* __restrict__ g_dht,  // or null
    T* __restrict__ g_dS1,            // [NT, Hv, dk, dv]
    T* __restrict__ g_dD,             // [T, Hv, dv]
    float* __restrict__ g_dh0) {      // or null
  extern __shared__ __align__(16) unsigned char smem[];
  using S = RevSmem<T, Stages>;
  T* s_s = reinterpret_cast<T*>(smem + S::s);
  const SeqCta cta = seq_cta(p);
  const int n = cta.n, h = cta.h, vt = cta.vt;
  const int v0 = vt * BV, nv = min(BV, p.dv - v0);
  const int c0 = p.chunk_off[n], c1 = p.chunk_off[n + 1], eos = p.cu[n + 1];
  const int tid = threadIdx.x, warp = tid >> 5;
  const int sm0 = 32 * (warp & 3), sn0 = 32 * (warp >> 2);  // state rows / tile columns of this warp
  const int64_t state_base = (int64_t(n) * p.Hv + h) * p.dk * p.dv + v0;

  float r_dS[2][4][4];
  frag_pairs(r_dS, sm0, sn0, [&](int r, int c, float& x0, float& x1) {
    x0 = x1 = 0.f;
    if (g_dht && r < p.dk && c < nv) {
      const float2 v = load2(g_dht + state_base + int64_t(r) * p.dv + c);
      x0 = v.x, x1 = v.y;
    }
  });

  // cp.async loads of chunk c's tiles into stage st (the caller commits the group)
  auto issue = [&](int c, int st) {
    load_rev_tiles<S, BV, kSeqThreads>(smem + st * S::stage, p, p.chunk_start[c], eos, h, v0, nv, LDV<T>, g_q, g_k, g_W, g_do, g_dDl,
                                       g_gam, tid);
  };

  // Two stages: one cp.async group in flight at each wait (the chunk about to be computed).
  if constexpr (Stages == 2) {
    if (c0 < c1) issue(c1 - 1, 0);
    cp_commit();
  }
  for (int c = c1 - 1; c >= c0; --c) {
    const int st = Stages == 2 ? (c1 - 1 - c) & 1 : 0;
    const int64_t bos = p.chunk_start[c];
    const int L = min(C, eos - int(bos)), Lk = round16(L);
    if constexpr (Stages == 1) {
      __syncthreads();  // the previous chunk is done with every buffer
      issue(c, 0);
      cp_commit();
    }
    // dS -> operand and dS1[c] (gradient of this chunk's END state) while the loads fly. The
    // previous chunk's last read of s_s came before its mid-step barrier.
    T* g_d1 = g_dS1 + (int64_t(c) * p.Hv + h) * p.dk * p.dv + v0;
    frag_pairs(r_dS, sm0, sn0, [&](int r, int cc, float& x0, float& x1) {
      store2(s_s + r * LDV<T> + cc, x0, x1);
      if (r < p.dk && cc < nv) store2(g_d1 + int64_t(r) * p.dv + cc, x0, x1);
    });
    cp_wait<0>();
    __syncthreads();  // stage st and s_s visible to all; with 2 stages also: every thread is done with chunk c+1
    if constexpr (Stages == 2) {
      if (c > c0) issue(c - 1, st ^ 1);  // into the stage chunk c+1 used
      cp_commit();
    }
    unsigned char* base = smem + st * S::stage;
    const T* s_q = reinterpret_cast<const T*>(base + S::q);
    const T* s_k = reinterpret_cast<const T*>(base + S::k);
    const T* s_w = reinterpret_cast<const T*>(base + S::w);
    T* s_do = reinterpret_cast<T*>(base + S::dO);
    const T* s_ddl = reinterpret_cast<const T*>(base + S::ddl);
    T* s_x = reinterpret_cast<T*>(base + S::ddl);  // -dDelta over dDelta_local in place (same thread, same element)
    const float* s_gam = reinterpret_cast<const float*>(base + S::gam);
    const float gam_e = s_gam[L - 1];
    // dO <- scale e^gamma dO (rows), in place
    {
      constexpr int V = kPad<T>, VPR = BV / V;  // 16-byte vectors
      for (int idx = tid; idx < C * VPR; idx += kSeqThreads) {
        const int r = idx / VPR, cc = (idx - r * VPR) * V;
        const float f = r < L ? p.scale * gexp(s_gam[r]) : 0.f;
        uint4* pd = reinterpret_cast<uint4*>(s_do + r * LDV<T> + cc);
        uint4 x = *pd;
        T* ex = reinterpret_cast<T*>(&x);
#pragma unroll
        for (int e = 0; e < V; ++e) ex[e] = from_f<T>(to_f(ex[e]) * f);
        *pd = x;
      }
    }
    {  // dDelta = dDelta_local + eL (.) (K dS)  [C, BV]
      const int m0 = 16 * (warp & 3);
      float r_acc[1][4][4];
      zero(r_acc);
      if (m0 < L && sn0 < nv) warp_gemm<1, 4, false, false>(r_acc, s_k, LDD<T>, s_s, LDV<T>, m0, sn0, p.dk);
      frag_pairs(r_acc, m0, sn0, [&](int r, int cc, float& x0, float& x1) {
        const float2 dl = load2(s_ddl + r * LDV<T> + cc);
        const float f = r < L ? gexp(gam_e - s_gam[r]) : 0.f;
        const float d0 = dl.x + (r < L ? __fmul_rn(x0, f) : 0.f), d1 = dl.y + (r < L ? __fmul_rn(x1, f) : 0.f);
        if (r < L && cc < nv) store2(g_dD + ((bos + r) * p.Hv + h) * p.dv + v0 + cc, d0, d1);
        store2(s_x + r * LDV<T> + cc, -d0, -d1);
      });
    }
    __syncthreads();
    {  // dS = e^{gam_e} dS + Q^T dO~ - W^T dDelta
      const float de = gexp(gam_e);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) r_dS[i][j][e] *= de;
      if (sm0 < p.dk && sn0 < nv) {
        warp_gemm<2, 4, true, false>(r_dS, s_q, LDD<T>, s_do, LDV<T>, sm0, sn0, Lk);
        warp_gemm<2, 4, true, false>(r_dS, s_w, LDD<T>, s_x, LDV<T>, sm0, sn0, Lk);
      }
    }
  }
  if (g_dh0)
    frag_pairs(r_dS, sm0, sn0, [&](int r, int c, float& x0, float& x1) {
      if (r < p.dk && c < nv) store2(g_dh0 + state_base + int64_t(r) * p.dv + c, x0, x1);
    });
}

#include "ops/cuda/gdn_serial_warp.cuh"   // state_warp_kernel, rev_warp_kernel (bf16)
#include "ops/cuda/gdn_serial_split.cuh"  // state_split_kernel, rev_split_kernel (bf16, dk = 128)
#include "ops/cuda/gdn_fused_fwd.cuh"     // fused::fwd_kernel: state + out in one pass (bf16, dk = dv = 128)

// ---- GQA sum in a cluster (G == 2): dqk's dq, wy's dk ---------------------------------------------
// With p.pair the two v-heads of a key head run as one cluster of two CTAs (blockIdx.x = 2 hk +
// rank). Rank r finalises the column half r of the key head's [C, dk] result (warps 4r .. 4r + 3
// hold columns [64r, 64r + 64)): its own fragments plus the partner's, which the partner put in
// its shared memory `xbuf` (16 KB, dead at the call) and which are read through the cluster. So no
// f32 [T, Hv, dk] round trip through global memory and no gsum launch; the sum is one f32 add of
// the two heads' values, as gsum's, so the same bits. Returns whether this warp's acc now holds
// the sum to store; the caller then arrives at the cluster barrier (cluster_arrive) and waits
// (cluster_wait) before xbuf is reused or the CTA exits.
// acc += the partner's fragments of this warp slot from an exchange buffer [8][128] float4.
__device__ __forceinline__ void add_fragments(float (&acc)[2][4][4], const float4* src, int slot) {
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float4 o = src[(4 * i + j) * 128 + slot];
      acc[i][j][0] += o.x, acc[i][j][1] += o.y, acc[i][j][2] += o.z, acc[i][j][3] += o.w;
    }
}
__device__ __forceinline__ bool pair_sum(float (&acc)[2][4][4], float* xbuf) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  const cg::cluster_group cl = cg::this_cluster();
  const int rank = int(cl.block_rank()), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int slot = (warp & 3) * 32 + lane;  // the partner's warp of the same index holds the same fragments
  const bool mine = (warp >> 2) == rank;
  float4* buf = reinterpret_cast<float4*>(xbuf);  // [8][128] float4: conflict-free per fragment quad
  if (!mine)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) buf[(4 * i + j) * 128 + slot] = make_float4(acc[i][j][0], acc[i][j][1], acc[i][j][2], acc[i][j][3]);
  cl.sync();
  if (mine) {
    const float4* other = cl.map_shared_rank(buf, unsigned(rank ^ 1));
    add_fragments(acc, other, slot);
  }
  return mine;
#else
  __trap();  // the host launches clusters only on sm_90 and newer (gqa_pair)
  return false;
#endif
}
// The cluster barrier in two halves, for the fence that keeps xbuf alive while the partner reads it:
// arrive (release, as sync's) as soon as this CTA has consumed the partner's buffer, and wait
// only before this CTA's own buffer is overwritten or the CTA exits. As one sync after the key
// head's stores, the arrive's release fence had those stores to complete first, and the partner
// waited for it (ncu's source view: that fence and wait held ~5% of dqk's and of wy's stall
// samples, v0.17.0).
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cooperative_groups::this_cluster().barrier_arrive();
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cooperative_groups::this_cluster().barrier_wait();
#endif
}

// ---- pair_sum pushed (kPairPush, DT_GDN_GQA_PAIR=2 or unset: the default since v0.18.0) ---------
// The same exchange with no GPU-wide fence: every cluster-scope release (the barrier arrive of
// pair_sum's pull, a release.cluster mbarrier arrive) compiles to MEMBAR.ALL.GPU + ERRBAR, which
// waits for all of the thread's outstanding memory operations. Here each CTA's warps that do not
// finalise push their fragments into the PARTNER's xbuf with st.async, counted by the partner's
// "full" mbarrier (complete_tx); the partner's mine-warps wait on it and add from their own
// shared memory. Before pushing, a CTA waits on its "free" mbarrier, which the partner arrives on
// remotely once its xbuf is dead (after a release fence restricted to its shared memory: a
// CTA-scope membar, no GPU-wide one). The barriers are initialised at kernel
// start (pair_push_init) and are each used for one phase; the cluster barrier (arrive relaxed at
// init, wait before the exchange) only makes the partner's initialisation visible. Its wait is an
// acquire at cluster scope, which Hopper implements as an L1 invalidate (CCTL.IVALL: every
// co-resident CTA's L1-cached global data gone), so it runs once per CTA:
// * the full wait is relaxed at cluster scope and followed by an acquire fence restricted to
//   shared::cluster (what it orders: the reads of xbuf after st.async's release), no invalidate;
// * no cluster barrier at exit: every remote operation INTO a CTA (the partner's arrive on its
//   free barrier, its st.async bytes counted by its full barrier) completes before that CTA's
//   own waits on those barriers pass, so it cannot exit before them; the operations it issues
//   itself carry their data (registers, an arrive) and need nothing of it once issued.
// (Both were an acquire.cluster wait and an arrive-at-exchange / wait-at-exit barrier phase until
// v0.18.0: three L1 invalidates per CTA.)
// bars: [0] free (this CTA may write the partner's xbuf), [1] full (the partner's fragments are in
// this CTA's xbuf); a second exchange (dqk's dk) uses its own pair, [2] and [3], and skips the
// cluster barrier wait (first = false: the first exchange did it). Same values added in the same
// order as pair_sum: the same bits.
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
#endif
}
template <int NBARS = 2>
__device__ __forceinline__ void pair_push_init(uint64_t* bars) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (threadIdx.x == 0) {
#pragma unroll
    for (int b = 0; b < NBARS; ++b)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_addr(bars + b)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  cluster_arrive_relaxed();  // waited for in pair_sum_push, before the first remote access
#endif
}
// Waits for phase 0 of an mbarrier that another CTA of the cluster completes (its st.async bytes,
// its arrive): a relaxed wait at cluster scope, then an acquire fence restricted to shared::cluster,
// which orders this thread's later shared-memory accesses after the partner's release. (An
// acquire.cluster wait would also invalidate L1 for global data, CCTL.IVALL, which nothing here
// needs; an acquire.cta one would not, formally, synchronise with another CTA's release.)
__device__ __forceinline__ void mbar_wait_phase0(uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.relaxed.cluster.shared::cta.b64 p, [%0], 0;\n"
      "@!p bra WAIT;\n"
      "fence.acquire.sync_restrict::shared::cluster.cluster;\n"
      "}\n" ::"r"(bar)
      : "memory");
#endif
}
__device__ __forceinline__ uint32_t map_peer(uint32_t addr, unsigned rank) {
  uint32_t r = addr;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
#endif
  return r;
}
__device__ __forceinline__ bool pair_sum_push(float (&acc)[2][4][4], float* xbuf, uint64_t* bars, bool first = true) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned rank = cooperative_groups::this_cluster().block_rank(), peer = rank ^ 1u;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int slot = (warp & 3) * 32 + lane;  // as pair_sum: the partner's warp of the same index
  const bool mine = (warp >> 2) == int(rank);
  constexpr uint32_t kBytes = 4 * 32 * 8 * sizeof(float4);  // the partner's 4 warps x 32 lanes x 8 float4
  const uint32_t free_l = smem_addr(bars), full_l = smem_addr(bars + 1);
  if (first) cluster_wait();  // the partner's barriers are initialised (pair_push_init's arrive)
  if (threadIdx.x == 0) {  // after the caller's __syncthreads: this CTA's xbuf is dead
    // the bytes to expect, then let the partner push (the order is not needed: while this arrive is
    // pending an early complete_tx cannot finish the phase; it keeps the tx-count non-negative).
    // The release fence orders every thread's reads of xbuf (before the __syncthreads) before the
    // partner's writes into it, at cluster scope: a CTA-scope membar, where a release.cluster
    // arrive would be a GPU-wide one.
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(full_l), "r"(kBytes) : "memory");
    asm volatile("fence.release.sync_restrict::shared::cta.cluster;\n" ::: "memory");
    asm volatile("mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(map_peer(free_l, peer))
                 : "memory");
  }
  if (!mine) {
    mbar_wait_phase0(free_l);  // the partner's xbuf is dead
    const uint32_t buf_r = map_peer(smem_addr(xbuf), peer), full_r = map_peer(full_l, peer);
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
        asm volatile(
            "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(
                buf_r + uint32_t(((4 * i + j) * 128 + slot) * sizeof(float4))),
            "f"(acc[i][j][0]), "f"(acc[i][j][1]), "f"(acc[i][j][2]), "f"(acc[i][j][3]), "r"(full_r)
            : "memory");
  } else {
    mbar_wait_phase0(full_l);  // the partner's fragments are in this CTA's xbuf
    add_fragments(acc, reinterpret_cast<const float4*>(xbuf), slot);
  }
  return mine;
#else
  __trap();
  return false;
#endif
}

// The exchange in the launch's pair mode: pushed (pair_sum_push, with the mbarrier pair `bars`;
// first: this CTA's first exchange) or pulled (pair_sum, then this CTA arrives at the cluster
// barrier, the partner's xbuf being consumed: the caller waits, cluster_wait, before its own xbuf
// is reused or the CTA exits).
__device__ __forceinline__ bool pair_sum_mode(float (&acc)[2][4][4], float* xbuf, uint64_t* bars, int mode,
                                              bool first = true) {
  const bool sum = mode == kPairPush ? pair_sum_push(acc, xbuf, bars, first) : pair_sum(acc, xbuf);
  if (mode == kPairPull) cluster_arrive();
  return sum;
}

// ---- dqk's pieces (steps of dqk_kernel, and wy's row-sum stores) --------------------------------
// e^gamma and e^(gamma_last - gamma) of the chunk's rows (0 past L).
__device__ __forceinline__ void chunk_decays(const float* s_gam, float* s_eg, float* s_el, int L, int tid) {
  if (tid < C) {
    const float ge = s_gam[L - 1];
    s_eg[tid] = tid < L ? gexp(s_gam[tid]) : 0.f;
    s_el[tid] = tid < L ? gexp(ge - s_gam[tid]) : 0.f;
  }
}
// ds's epilogue on a warp's [16, 32] tile of dO Delta^T at (m0, n0) (ds_tile's mma.sync tile,
// dqk_wg_kernel's wgmma one): the diagonal -> s_dsd, then scale Gamma with the strict lower
// triangle kept, stored through st(r, c, y0, y1).
template <class ST>
__device__ __forceinline__ void ds_epilogue(float (&acc)[1][4][4], int m0, int n0, int L, float scale,
                                            const float* s_gam, float* s_dsd, ST&& st) {
  frag_pairs(acc, m0, n0, [&](int r, int c, float& x0, float& x1) {
    const bool rv = r < L;
    if (c == r) s_dsd[r] = rv ? scale * x0 : 0.f;
    if (c + 1 == r) s_dsd[r] = rv ? scale * x1 : 0.f;
  });
  // every factor, then the selects (as prep's A: dqk 1408 -> 1376 us, perf.md v0.35.0)
  frag_pairs(acc, m0, n0, [&](int r, int c, float& x0, float& x1) {
    const float gr = s_gam[r];
    const float2 gc = *reinterpret_cast<const float2*>(s_gam + c);
    x0 = scale * x0 * gexp(gr - gc.x);
    x1 = scale * x1 * gexp(gr - gc.y);
  });
  frag_pairs(acc, m0, n0, [&](int r, int c, float& y0, float& y1) {
    const bool rv = r < L;
    st(r, c, (rv && c < r) ? y0 : 0.f, (rv && c + 1 < r) ? y1 : 0.f);
  });
}
// Step 1: ds = scale (dO Delta^T) (.) Gamma, j < i < L (strict) -> s_ds; diagonal -> s_dsd (fp32).
// The diagonal of ds enters dq_i q_i and dk_i k_i identically and cancels in dgamma: it is kept
// out of the MMA operand (s_ds has a zero diagonal) and added to dq, dk in fp32 by the epilogues,
// with no dgamma term (gdn-math.md 10.5: dg is cancellation-prone).
template <class T>
__device__ __forceinline__ void ds_tile(T* s_ds, float* s_dsd, const T* s_do, const T* s_D, const float* s_gam, int L,
                                        int dv, float scale, int warp) {
  const int m0 = 16 * (warp & 3), n0 = 32 * (warp >> 2);
  float r_acc[1][4][4];
  zero(r_acc);
  if (m0 < L && n0 < m0 + 16) warp_gemm<1, 4, false, true>(r_acc, s_do, LDD<T>, s_D, LDD<T>, m0, n0, dv);
  ds_epilogue(r_acc, m0, n0, L, scale, s_gam, s_dsd,
              [&](int r, int c, float y0, float y1) { store2(s_ds + r * LDC<T> + c, y0, y1); });
}
// Step 4: this warp's part of sum(S0 (.) dS1) over `rows` state rows -> s_ws[warp]; S0 from shared
// memory ([rows][LDD]), dS1 from global ([rows][dv]) in 16-byte vectors.
template <class T>
__device__ __forceinline__ void state_dot(float* s_ws, const T* s_s, const T* g_d1, int rows, int dv, int tid) {
  constexpr int V = kPad<T>;  // elements per 16 bytes; dv % 16 == 0, so a vector stays in its row
  float r_s = 0.f;
  // idx's row and column stepped (STEP / dv rows and STEP % dv columns, with a carry) instead of
  // a signed division by the runtime dv per vector (~15 instructions each, 13% of dqk's executed
  // instructions; the loop hides behind dDelta's load, so dqk gained only ~5 us)
  constexpr int STEP = kChunkThreads * V;
  const int dr = STEP / dv, dc = STEP - dr * dv;
  int r = tid * V / dv, c = tid * V - r * dv;
#pragma unroll 4  // four loads in flight before their products (dS1 comes from L2; the same sum order)
  for (int idx = tid * V; idx < rows * dv; idx += STEP) {
    const uint4 sa = *reinterpret_cast<const uint4*>(s_s + r * LDD<T> + c);
    r += dr, c += dc;
    if (c >= dv) c -= dv, ++r;
    uint4 ga;  // L2 (.cg), not the read-only path: under serial_wait the rev kernel wrote dS1 during this kernel
    asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(ga.x), "=r"(ga.y), "=r"(ga.z), "=r"(ga.w)
                 : "l"(g_d1 + idx));
    const T* es = reinterpret_cast<const T*>(&sa);
    const T* eg = reinterpret_cast<const T*>(&ga);
#pragma unroll
    for (int e = 0; e < V; ++e) r_s = fmaf(to_f(es[e]), to_f(eg[e]), r_s);
  }
  r_s = warp_sum(r_s);
  if ((tid & 31) == 0) s_ws[tid >> 5] = r_s;
}
// A warp tile's row sums (frag_rowdot) into s[wn * C + row], by lane 0 of each quad.
template <int WM>
__device__ __forceinline__ void store_row_sums(float* s, int wn, int m0, const float (&rs)[WM][2], int lane) {
  if ((lane & 3) == 0)
#pragma unroll
    for (int i = 0; i < WM; ++i)
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) s[wn * C + m0 + 16 * i + (lane >> 2) + 8 * h2] = rs[i][h2];
}
// dgamma of the chunk's rows i < L from the row sums of steps 2 (s_dgq) and 5 (s_red: ds^T Q . k,
// s_red2: dk_state . k, over 4 column groups) and step 4's s_ws: -= both for i < L-1; the last row's
// own dk_state term cancels, leaving + e^gamma_last sum(S0 (.) dS1) + the other rows' dk_state terms.
__device__ __forceinline__ void dgamma_rows(float* g, int64_t stride, const float* s_dgq, const float* s_red,
                                            const float* s_red2, const float* s_ws, const float* s_eg, int L, int tid) {
  if (tid < L) {
    float dg = s_dgq[tid] - (s_red[tid] + s_red[C + tid] + s_red[2 * C + tid] + s_red[3 * C + tid]);
    if (tid < L - 1) {
      dg -= s_red2[tid] + s_red2[C + tid] + s_red2[2 * C + tid] + s_red2[3 * C + tid];
    } else {
      float s0 = 0.f, s1 = 0.f;
      for (int w = 0; w < 8; ++w) s0 += s_ws[w];
      for (int i = 0; i < L - 1; ++i) s1 += s_red2[i] + s_red2[C + i] + s_red2[2 * C + i] + s_red2[3 * C + i];
      dg += s_eg[tid] * s0 + s1;
    }
    g[int64_t(tid) * stride] = dg;
  }
}

// ---- dqk (B5): ds, dq, dk (state + intra part), dW, dgamma (partial) ------------------------------
template <class T>
struct DqkSmem {
  static constexpr size_t x1 = 0;                                  // T [C][LDD]  dO, then dDelta, then Delta
  static constexpr size_t x2 = x1 + sizeof(T) * C * LDD<T>;        // T [C][LDD]  Delta, then Q
  static constexpr size_t x3 = x2 + sizeof(T) * C * LDD<T>;        // T [C][LDD]  K
  static constexpr size_t big = x3 + sizeof(T) * C * LDD<T>;       // T [D][LDD]  S0, then dS1
  static constexpr size_t ds = big + sizeof(T) * D * LDD<T>;       // T [C][LDC]
  static constexpr size_t gam = ds + sizeof(T) * C * LDC<T>;       // f32 [C]
  static constexpr size_t eg = gam + sizeof(float) * C;            // f32 [C]
  static constexpr size_t el = eg + sizeof(float) * C;             // f32 [C]
  static constexpr size_t dgq = el + sizeof(float) * C;            // f32 [C]
  static constexpr size_t dsd = dgq + sizeof(float) * C;           // f32 [C]  diagonal of ds
  static constexpr size_t red = dsd + sizeof(float) * C;           // f32 [4][C]
  static constexpr size_t red2 = red + sizeof(float) * 4 * C;      // f32 [4][C]
  static constexpr size_t ws = red2 + sizeof(float) * 4 * C;       // f32 [8]
  static constexpr size_t bars = ws + sizeof(float) * 8;           // u64 [4]  pair_sum_push's mbarriers (dq, dk)
  static constexpr size_t bytes = bars + sizeof(uint64_t) * 4;
  static_assert(gam % 8 == 0, "ds_tile's float2 reads of gamma");
};

// Two CTAs per SM in bf16 by launch bound, not by luck: unbounded, one more Params field once took
// dqk to 133 registers, one CTA per SM and +45% time (perf.md v0.15.0).
template <class T> constexpr int kDqkMinBlocks = sizeof(T) == 2 ? 2 : 1;
static_assert(kDqkMinBlocks<bf16> * (DqkSmem<bf16>::bytes + kSmemReservedPerCta) <= kSmemPerSm,
              "dqk: two bf16 CTAs per SM");

template <class T>
__global__ __launch_bounds__(kChunkThreads, kDqkMinBlocks<T>) void dqk_kernel(
    Params p, const T* __restrict__ g_q,
    const T* __restrict__ g_k,
    const float* __restrict__ g_gam,
    const T* __restrict__ g_do, const T* __restrict__ g_D,
    const T* __restrict__ g_dD, const T* __restrict__ g_h,
    const T* __restrict__ g_dS1,
    float* __restrict__ g_dqh,   // [T, Hv, dk] (=), G > 1
    T* __restrict__ g_dq,        // [T, Hk, dk] (=), G == 1
    float* __restrict__ g_dkh,   // [T, Hv, dk] (=); with p.pair [T, Hk, dk]: the key head's two v-heads summed
    T* __restrict__ g_dW,        // [T, Hv, dk] (=)
    float* __restrict__ g_dgam) {  // [T, Hv] (=)
  extern __shared__ __align__(16) unsigned char smem[];
  using S = DqkSmem<T>;
  T* s_x1 = reinterpret_cast<T*>(smem + S::x1);
  T* s_x2 = reinterpret_cast<T*>(smem + S::x2);
  T* s_x3 = reinterpret_cast<T*>(smem + S::x3);
  T* s_big = reinterpret_cast<T*>(smem + S::big);
  T* s_ds = reinterpret_cast<T*>(smem + S::ds);
  float* s_gam = reinterpret_cast<float*>(smem + S::gam);
  float* s_eg = reinterpret_cast<float*>(smem + S::eg);
  float* s_el = reinterpret_cast<float*>(smem + S::el);
  float* s_dgq = reinterpret_cast<float*>(smem + S::dgq);
  float* s_dsd = reinterpret_cast<float*>(smem + S::dsd);
  float* s_red = reinterpret_cast<float*>(smem + S::red);
  float* s_red2 = reinterpret_cast<float*>(smem + S::red2);
  float* s_ws = reinterpret_cast<float*>(smem + S::ws);
  uint64_t* s_bars = reinterpret_cast<uint64_t*>(smem + S::bars);
  if (p.pair == kPairPush) pair_push_init<4>(s_bars);
  const ChunkIdx ci = chunk_idx(p);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, L = ci.L, Lk = round16(L);
  const int64_t qrow = ci.bos * p.Hk + ci.hk, vrow = ci.bos * p.Hv + ci.h;
  const int64_t sbase = (int64_t(ci.c) * p.Hv + ci.h) * p.dk * p.dv;
  // Step 2 loads Q's rows and step 4 reads dS1 straight from global: into L2 now (dS1 at bf16 only, where
  // its [dk][dv] lines are one per thread). (Prefetching dDelta, loaded after step 2, and in out
  // the second phase's K and Delta, measured slower: dqk +62 us, out +24 us.)
  constexpr int kLpr = D * sizeof(T) / 128;  // 128-byte lines per row of D elements
  static_assert(C * kLpr <= kChunkThreads && (sizeof(T) != 2 || D * kLpr <= kChunkThreads), "one line per thread");
  const int row_bytes = p.dk * int(sizeof(T));
  prefetch_l2_rows<kLpr>(g_q + qrow * p.dk, int64_t(p.Hk) * row_bytes, L, row_bytes, tid);
  if constexpr (sizeof(T) == 2) prefetch_l2_rows<kLpr>(g_dS1 + sbase, int64_t(p.dv) * sizeof(T), p.dk, p.dv * 2, tid);
  load_ctile<C, D, kLastRead>(s_x1, LDD<T>, g_do + vrow * p.dv, int64_t(p.Hv) * p.dv, L, p.dv, tid);
  load_ctile<C, D>(s_x2, LDD<T>, g_D + vrow * p.dv, int64_t(p.Hv) * p.dv, L, p.dv, tid);
  load_col(s_gam, g_gam + vrow, p.Hv, C, L, tid, kChunkThreads);
  cp_commit();
  load_ctile<C, D>(s_x3, LDD<T>, g_k + qrow * p.dk, int64_t(p.Hk) * p.dk, L, p.dk, tid);
  load_ctile<D, D, kLastRead>(s_big, LDD<T>, g_h + sbase, p.dv, p.dk, p.dv, tid);
  cp_commit();
  cp_wait<1>();  // dO, Delta and gamma: ds is computed while K and S0 land
  __syncthreads();
  chunk_decays(s_gam, s_eg, s_el, L, tid);
  ds_tile(s_ds, s_dsd, s_x1, s_x2, s_gam, L, p.dv, p.scale, warp);  // 1. ds, its diagonal
  cp_wait<0>();
  __syncthreads();
  const int m0 = 32 * (warp & 1), n0 = 32 * (warp >> 1), wn = warp >> 1;
  const bool active = m0 < L && n0 < p.dk;
  // Delta is dead until step 5 (which loads it again, from L2): Q takes its tile, each warp its own
  // [32][32] window (rows m0.., columns n0..; rows >= L and columns >= dk zero, as load_ctile
  // would) for step 2's row sums, loading while the products run; the warp waits for it alone.
  // A full window by load_tile_full (an add a copy, against load_tile's ~31 instructions).
  if (L - m0 >= 32 && p.dk - n0 >= 32)
    load_tile_full<T, 32, 32, 32>(s_x2 + m0 * LDD<T> + n0, LDD<T>, g_q + (qrow + int64_t(m0) * p.Hk) * p.dk + n0,
                                  int64_t(p.Hk) * p.dk, lane);
  else
    load_tile(s_x2 + m0 * LDD<T> + n0, LDD<T>, g_q + (qrow + int64_t(m0) * p.Hk) * p.dk + n0, int64_t(p.Hk) * p.dk,
              32, L - m0, p.dk - n0, 32, lane, 32);
  cp_commit();
  {  // 2. dq = scale e^gamma (dO S0^T) + ds K   [C, dk]; dgamma_i += sum_k dq q
    float r_acc[2][4][4];
    zero(r_acc);
    if (active) {
      warp_gemm<2, 4, false, true>(r_acc, s_x1, LDD<T>, s_big, LDD<T>, m0, n0, p.dv);
      frag_pairs(r_acc, m0, n0, [&](int r, int, float& x0, float& x1) {
        const float f = p.scale * s_eg[r];
        x0 *= f, x1 *= f;
      });
      warp_gemm<2, 4, false, false>(r_acc, s_ds, LDC<T>, s_x3, LDD<T>, m0, n0, Lk);
    }
    float r_rs[2][2];
    cp_wait<0>();  // this warp's window of Q
    __syncwarp();
    frag_rowdot(r_acc, m0, n0, r_rs, [&](int r, int c) { return load2(s_x2 + r * LDD<T> + c); });  // q_i
    if (active)
      frag_pairs(r_acc, m0, n0, [&](int r, int c, float& x0, float& x1) {
        const float2 kk = load2(s_x3 + r * LDD<T> + c);
        const float y0 = fmaf(s_dsd[r], kk.x, x0), y1 = fmaf(s_dsd[r], kk.y, x1);
        if (p.pair) {
          x0 = y0, x1 = y1;  // summed with the partner v-head's below
        } else if (r < L && c < p.dk) {
          // G == 1: [T, Hv, dk] is dq's layout and B12's sum of one head is this value, rounded here.
          const int64_t i = (ci.bos * p.Hv + int64_t(r) * p.Hv + ci.h) * p.dk + c;
          if (p.G == 1) store2(g_dq + i, y0, y1);
          else store2(g_dqh + i, y0, y1);
        }
      });
    store_row_sums(s_red, wn, m0, r_rs, lane);
    if (p.pair) {  // 2b. dq of the key head = this v-head's + the partner's, through s_x1 (dO is dead)
      __syncthreads();
      float* xbuf = reinterpret_cast<float*>(s_x1);
      const bool sum = pair_sum_mode(r_acc, xbuf, s_bars, p.pair);
      if (sum && active)
        store_frags(g_dq + qrow * p.dk, int64_t(p.Hk) * p.dk, r_acc, m0, n0, L, p.dk);
      // pull: the partner has read this CTA's s_x1 before dDelta overwrites it (push: the barrier
      // below waits for this CTA's mine-warps, which waited for the partner's pushes)
      if (p.pair == kPairPull) cluster_wait();
    }
  }
  if (p.done && tid == 0) serial_wait(p, ci.c);  // dDelta and dS1 come from the rev kernel (with_serial_pdl)
  __syncthreads();  // dO is dead: dDelta takes its tile
  load_ctile<C, D, kLastRead>(s_x1, LDD<T>, g_dD + vrow * p.dv, int64_t(p.Hv) * p.dv, L, p.dv, tid);
  cp_commit();
  if constexpr (sizeof(T) == 2)  // step 5's Delta (read at the start) kept in, or brought back to, L2
    prefetch_l2_rows<kLpr>(g_D + vrow * p.dv, int64_t(p.Hv) * p.dv * sizeof(T), L, p.dv * 2, tid);
  state_dot(s_ws, s_big, g_dS1 + sbase, p.dk, p.dv, tid);  // 4. sum(S0 (.) dS1) while dDelta loads
  cp_wait<0>();
  __syncthreads();
  if (active) {  // 3. dW = -dDelta S0^T   [C, dk]
    float r_acc[2][4][4];
    zero(r_acc);
    warp_gemm<2, 4, false, true>(r_acc, s_x1, LDD<T>, s_big, LDD<T>, m0, n0, p.dv);
    store_frags(g_dW + vrow * p.dk, int64_t(p.Hv) * p.dk, r_acc, m0, n0, L, p.dk, [](int, float& x0, float& x1) {
      x0 = -x0, x1 = -x1;
    });
  }
  if (tid < C) s_dgq[tid] = s_red[tid] + s_red[C + tid] + s_red[2 * C + tid] + s_red[3 * C + tid];
  __syncthreads();
  load_ctile<D, D, kLastRead>(s_big, LDD<T>, g_dS1 + sbase, p.dv, p.dk, p.dv, tid);
  load_ctile<C, D, kLastRead>(s_x1, LDD<T>, g_D + vrow * p.dv, int64_t(p.Hv) * p.dv, L, p.dv, tid);  // Delta again; Q in s_x2
  cp_commit();
  // Step 5's ds^T Q needs neither dS1 nor Delta, so it runs while they land (every Q window is
  // visible since the barriers after step 2): dqk -15 us, the same bits (perf.md v0.25.0).
  float r_acc[2][4][4];  // step 5's dk part: stored there, or with p.pair summed with the partner's below
  zero(r_acc);
  if (active) warp_gemm<2, 4, true, false>(r_acc, s_ds, LDC<T>, s_x2, LDD<T>, m0, n0, Lk);
  cp_wait<0>();
  __syncthreads();
  {  // 5. dk = eL (Delta dS1^T) + ds^T Q + diag(ds) Q   [C, dk]
    // dgamma_i -= (ds^T Q)_i . k_i  (every row)  and  -= dk_state_i . k_i  (rows i < L-1); the last
    // row's  + sum(dk_state (.) K)  then needs only rows i < L-1 (its own term cancels exactly).
    float r_st[2][4][4];
    zero(r_st);
    if (active) {
      warp_gemm<2, 4, false, true>(r_st, s_x1, LDD<T>, s_big, LDD<T>, m0, n0, p.dv);
      frag_pairs(r_st, m0, n0, [&](int r, int, float& x0, float& x1) {
        const float f = s_el[r];
        x0 *= f, x1 *= f;
      });
    }
    float r_rs[2][2], r_rs2[2][2];
    frag_rowdot(r_acc, m0, n0, r_rs, [&](int r, int c) { return load2(s_x3 + r * LDD<T> + c); });
    frag_rowdot(r_st, m0, n0, r_rs2, [&](int r, int c) { return load2(s_x3 + r * LDD<T> + c); });
    if ((lane & 3) == 0)
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
          s_red[wn * C + m0 + 16 * i + (lane >> 2) + 8 * h2] = r_rs[i][h2];
          s_red2[wn * C + m0 + 16 * i + (lane >> 2) + 8 * h2] = r_rs2[i][h2];
        }
    if (active) {
      const int lg = lane >> 2, lt = lane & 3;
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int h2 = 0; h2 < 2; ++h2) {
            const int r = m0 + 16 * i + lg + 8 * h2, c = n0 + 8 * j + 2 * lt;
            const float2 qq = load2(s_x2 + r * LDD<T> + c);
            float& x0 = r_acc[i][j][2 * h2];
            float& x1 = r_acc[i][j][2 * h2 + 1];
            x0 = r_st[i][j][2 * h2] + fmaf(s_dsd[r], qq.x, x0);
            x1 = r_st[i][j][2 * h2 + 1] + fmaf(s_dsd[r], qq.y, x1);
            if (!p.pair && r < L && c < p.dk) store2(g_dkh + (vrow + int64_t(r) * p.Hv) * p.dk + c, x0, x1);
          }
    }
  }
  __syncthreads();  // (also: every warp is past its reads of dS1, so s_big is dead)
  if (p.pair) {  // 5b. dk's part of the key head = this v-head's + the partner's, through s_big; wy adds its own
    // pair sum to it (so [T, Hk, dk] f32 is written and read once, not [T, Hv, dk] twice)
    float* xbuf = reinterpret_cast<float*>(s_big);
    const bool sum = pair_sum_mode(r_acc, xbuf, s_bars + 2, p.pair, false);
    // The pushing CTA's warps idle once pushed, while the pulling ones store dk: the dgamma epilogue
    // (inputs complete at the exchange's first barrier) runs there (dqk 1368 -> 1352, wy 908 -> 899
    // us under ncu on an H100, perf.md v0.36.0).
    if (p.pair == kPairPush) {  // rows 0..63 on the pushing group's first two warps, before the others' stores
      dgamma_rows(g_dgam + vrow, p.Hv, s_dgq, s_red, s_red2, s_ws, s_eg, L, sum ? C : (warp & 3) * 32 + lane);
      if (sum && active)
        store_frags(g_dkh + qrow * p.dk, int64_t(p.Hk) * p.dk, r_acc, m0, n0, L, p.dk);
      return;
    }
    if (sum && active)
      store_frags(g_dkh + qrow * p.dk, int64_t(p.Hk) * p.dk, r_acc, m0, n0, L, p.dk);
    if (p.pair == kPairPull) cluster_wait();  // the partner has read this CTA's s_big before it exits
  }
  dgamma_rows(g_dgam + vrow, p.Hv, s_dgq, s_red, s_red2, s_ws, s_eg, L, tid);
}

// wy's dk epilogue: dk[r][c] = acc + dkh[r][c] over this warp's fragments (rows < L, columns < dk),
// dkh and dk at the same row stride (elements). A fragment row group's 8 pairs are loaded before
// any store, so that the loads issue back to back (one after another, each behind a store it might
// alias, they held a quarter of wy's stall samples, ncu source view, v0.17.0; all 16 at once spill
// at wy's 80 registers). Off-tile pairs load row 0, column 0.
template <class T>
__device__ __forceinline__ void add_dkh_store(const float (&acc)[2][4][4], int m0, int n0, int L, int dk,
                                              const float* g_dkh, int64_t stride, T* g_dk, int lane) {
  const int lg = lane >> 2, lt = lane & 3;
  // full: every pair valid, so one row pointer per fragment row (store_frags' fast path); the
  // same loads and stores in the same order either way
  auto tile = [&](auto full) {
    constexpr bool F = decltype(full)::value;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float2 r_old[4][2];
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
          const int r = m0 + 16 * i + lg + 8 * h2, c = n0 + 8 * j + 2 * lt;
          const bool ok = F || (r < L && c < dk);
          r_old[j][h2] = load2(g_dkh + int64_t(ok ? r : 0) * stride + (ok ? c : 0));
        }
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
          const int r = m0 + 16 * i + lg + 8 * h2, c = n0 + 8 * j + 2 * lt;
          if (F || (r < L && c < dk))
            store2(g_dk + int64_t(r) * stride + c, r_old[j][h2].x + acc[i][j][2 * h2],
                   r_old[j][h2].y + acc[i][j][2 * h2 + 1]);
        }
    }
  };
  if (m0 + 32 <= L && n0 + 32 <= dk) tile(std::true_type{});
  else tile(std::false_type{});
}

// wy's steps 7 and 8 on a chunk's row i < C: dbeta, and the total dgamma into s_dg[i] (only thread i
// reads s_dg[i] first); then, by one warp once every row's s_dg is written, dg = the reverse cumsum
// of dgamma inside the chunk (fixed shuffle order).
__device__ __forceinline__ void wy_dbeta_dgamma(int i, int L, int64_t vrow, int Hv, const float* s_red,
                                                const float* s_red2, const float* s_eg, const float* s_beta,
                                                const float* s_db, float* s_dg, const float* g_dgam, float* g_dbeta) {
  float dgam = 0.f;
  if (i < L) {
    const float r1 = s_red[i] + s_red[C + i] + s_red[2 * C + i] + s_red[3 * C + i];
    const float r2 = s_red2[i] + s_red2[C + i] + s_red2[2 * C + i] + s_red2[3 * C + i];
    g_dbeta[vrow + int64_t(i) * Hv] = s_eg[i] * r1 + r2 + s_db[i];
    dgam = g_dgam[vrow + int64_t(i) * Hv] + s_beta[i] * s_eg[i] * r1 + s_dg[i];
  }
  s_dg[i] = dgam;
}
__device__ __forceinline__ void wy_dg_cumsum(int lane, int L, int64_t vrow, int Hv, const float* s_dg, float* g_dg) {
  const int i0 = 2 * lane, i1 = i0 + 1;
  const float y1 = s_dg[i1], y0 = s_dg[i0] + y1;
  float incl = y0;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const float y = __shfl_down_sync(0xffffffffu, incl, off);
    if (lane + off < 32) incl += y;
  }
  float excl = __shfl_down_sync(0xffffffffu, incl, 1);
  if (lane == 31) excl = 0.f;
  if (i0 < L) g_dg[vrow + int64_t(i0) * Hv] = excl + y0;
  if (i1 < L) g_dg[vrow + int64_t(i1) * Hv] = excl + y1;
}

// wy's step 1 epilogue on a warp's [16, 32] tile (tm0, tn0) of dTm = (dW K^T) diag(beta e) +
// (dDelta V^T) diag(beta), strictly lower and valid rows only; st(r, c, y0, y1) stores a pair
// (wy_kernel: padded rows, wy_wg_kernel: swizzled atoms).
template <class St>
__device__ __forceinline__ void wy_dtm_epilogue(const float (&a1)[4][4], const float (&a2)[4][4], int tm0, int tn0,
                                                int L, const float* s_beta, const float* s_eg, int lane, St&& st) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const int r = tm0 + g + 8 * h2, c = tn0 + 8 * j + 2 * t;
      const bool rv = r < L;
      const float y0 = (rv && c < r) ? s_beta[c] * (s_eg[c] * a1[j][2 * h2] + a2[j][2 * h2]) : 0.f;
      const float y1 = (rv && c + 1 < r) ? s_beta[c + 1] * (s_eg[c + 1] * a1[j][2 * h2 + 1] + a2[j][2 * h2 + 1]) : 0.f;
      st(r, c, y0, y1);
    }
}
// wy's step 3 epilogue on a warp's [16, 32] tile: dB = -(Tm^T X) (.) Gamma (strict lower, valid),
// M = dB (.) K K^T: row sums -> s_rowp[(warp >> 2) C + row] and beta-weighted column sums ->
// s_colp[(warp & 3) C + col] (fixed shuffle trees; step 4 sums the warps in a fixed order);
// st(r, c, y0, y1) stores dbb = diag(beta) dB.
template <class St>
__device__ __forceinline__ void wy_db_epilogue(const float (&acc)[4][4], const float (&kk)[4][4], int tm0, int tn0,
                                               int L, const float* s_gam, const float* s_beta, float* s_rowp,
                                               float* s_colp, int warp, int lane, St&& st) {
  const int g = lane >> 2, t = lane & 3;
  float r_row[2] = {0.f, 0.f}, r_col[4][2];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    r_col[j][0] = r_col[j][1] = 0.f;
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const int r = tm0 + g + 8 * h2, c = tn0 + 8 * j + 2 * t;
      const bool rv = r < L;
      const float b0 = (rv && c < r) ? -acc[j][2 * h2] * gexp(s_gam[r] - s_gam[c]) : 0.f;
      const float b1 = (rv && c + 1 < r) ? -acc[j][2 * h2 + 1] * gexp(s_gam[r] - s_gam[c + 1]) : 0.f;
      const float m0v = b0 * kk[j][2 * h2], m1v = b1 * kk[j][2 * h2 + 1];
      r_row[h2] += m0v + m1v;
      r_col[j][0] = fmaf(s_beta[r], m0v, r_col[j][0]);
      r_col[j][1] = fmaf(s_beta[r], m1v, r_col[j][1]);
      st(r, c, s_beta[r] * b0, s_beta[r] * b1);
    }
  }
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    r_row[h2] += __shfl_xor_sync(0xffffffffu, r_row[h2], 1);
    r_row[h2] += __shfl_xor_sync(0xffffffffu, r_row[h2], 2);
    if (t == 0) s_rowp[(warp >> 2) * C + tm0 + g + 8 * h2] = r_row[h2];
  }
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float v = r_col[j][e];
      v += __shfl_xor_sync(0xffffffffu, v, 4);
      v += __shfl_xor_sync(0xffffffffu, v, 8);
      v += __shfl_xor_sync(0xffffffffu, v, 16);
      if (g == 0) s_colp[(warp & 3) * C + tn0 + 8 * j + 2 * t + e] = v;
    }
}

// ---- wy (B6-B8): WY backward, dv, dbeta, dgamma, reverse chunk cumsum -> dg ----------------------
// Two load phases, so that only two [C][LDD] tiles are resident: phase I holds dDelta and V (dv's
// product, dDelta V^T into registers, then dv's dbeta term), phase II loads dW and K over them; dbb
// takes dTm's tile (dead after step 2). 65.8 KB at bf16: three CTAs per SM at 80 registers. (All
// four tiles resident took 110.4 KB, two CTAs per SM, and 1437 us against 1185 at shape (a) in
// the layer; docs/perf.md v0.12.0.)
template <class T>
struct WySmem {
  static constexpr size_t a = 0;                                   // T [C][LDD]  dDelta, then dW
  static constexpr size_t b = a + sizeof(T) * C * LDD<T>;          // T [C][LDD]  V, then K
  static constexpr size_t tm = b + sizeof(T) * C * LDD<T>;         // T [C][LDC]
  static constexpr size_t dt = tm + sizeof(T) * C * LDC<T>;        // T [C][LDC]  strict_lower(dTm), then diag(beta) dB
  static constexpr size_t x = dt + sizeof(T) * C * LDC<T>;         // T [C][LDC]  dTm Tm^T
  static constexpr size_t rowp = x + sizeof(T) * C * LDC<T>;       // f32 [2][C]  row partials of dB (.) KK^T
  static constexpr size_t colp = rowp + sizeof(float) * 2 * C;     // f32 [4][C]  column partials (beta-weighted)
  static constexpr size_t gam = colp + sizeof(float) * 4 * C;      // f32 [C] x 5
  static constexpr size_t beta = gam + sizeof(float) * C;
  static constexpr size_t eg = beta + sizeof(float) * C;
  static constexpr size_t db = eg + sizeof(float) * C;
  static constexpr size_t dg = db + sizeof(float) * C;
  static constexpr size_t red = dg + sizeof(float) * C;            // f32 [4][C]
  static constexpr size_t red2 = red + sizeof(float) * 4 * C;      // f32 [4][C]
  static constexpr size_t bars = red2 + sizeof(float) * 4 * C;     // u64 [2]  pair_sum_push's mbarriers
  static constexpr size_t bytes = bars + sizeof(uint64_t) * 2;
  static_assert(gam % 8 == 0 && beta % 8 == 0 && eg % 8 == 0, "steps 1 and 3's float2 reads");
};
template <class T> constexpr int kWyMinBlocks = sizeof(T) == 2 ? 3 : 1;
static_assert(3 * (WySmem<bf16>::bytes + kSmemReservedPerCta) <= kSmemPerSm, "wy: three bf16 CTAs per SM");
// pair_sum's buffer, [8][128] float4 (16 KB): dqk's dO tile (dq) and S0 / dS1 tile (dk), or wy's
// dTm and X tiles (adjacent), 16-byte aligned, at both dtypes.
template <class T>
constexpr bool pair_buffers_fit() {
  constexpr size_t need = 8 * 128 * sizeof(float4);
  return sizeof(T) * C * LDD<T> >= need && DqkSmem<T>::x1 % 16 == 0 && DqkSmem<T>::big % 16 == 0 &&
         WySmem<T>::x - WySmem<T>::dt == sizeof(T) * C * LDC<T> && 2 * sizeof(T) * C * LDC<T> >= need &&
         WySmem<T>::dt % 16 == 0;
}
static_assert(pair_buffers_fit<bf16>() && pair_buffers_fit<float>(), "pair_sum buffers");
static_assert(DqkSmem<bf16>::bars % 8 == 0 && DqkSmem<float>::bars % 8 == 0 && WySmem<bf16>::bars % 8 == 0 &&
                  WySmem<float>::bars % 8 == 0,
              "pair_sum_push's mbarriers are 8-byte aligned");

template <class T>
__global__ __launch_bounds__(kChunkThreads, kWyMinBlocks<T>) void wy_kernel(
    Params p, const T* __restrict__ g_k,
    const T* __restrict__ g_v,
    const float* __restrict__ g_beta,
    const float* __restrict__ g_gam,
    const T* __restrict__ g_Tm,  // [NT, Hv, C, C]
    const T* __restrict__ g_dW,  // [T, Hv, dk]
    const T* __restrict__ g_dD,  // [T, Hv, dv]
    const float* __restrict__ g_dgam,  // [T, Hv]
    const float* __restrict__ g_dkh,  // dqk's dk part: [T, Hv, dk]; with p.pair [T, Hk, dk], the key head's sum
    float* __restrict__ g_dk2,   // [T, Hv, dk] (=) this kernel's dk part, G > 1 without p.pair (gsum adds them)
    T* __restrict__ g_dk,        // [T, Hk, dk] =
    T* __restrict__ g_dv,        // [T, Hv, dv] =
    float* __restrict__ g_dbeta,  // [T, Hv] =
    float* __restrict__ g_dg) {  // [T, Hv] =
  extern __shared__ __align__(16) unsigned char smem[];
  using S = WySmem<T>;
  T* s_dd = reinterpret_cast<T*>(smem + S::a);
  T* s_dw = s_dd;
  T* s_v = reinterpret_cast<T*>(smem + S::b);
  T* s_k = s_v;
  T* s_tm = reinterpret_cast<T*>(smem + S::tm);
  T* s_dt = reinterpret_cast<T*>(smem + S::dt);
  T* s_x = reinterpret_cast<T*>(smem + S::x);
  T* s_dbb = s_dt;
  float* s_rowp = reinterpret_cast<float*>(smem + S::rowp);
  float* s_colp = reinterpret_cast<float*>(smem + S::colp);
  float* s_gam = reinterpret_cast<float*>(smem + S::gam);
  float* s_beta = reinterpret_cast<float*>(smem + S::beta);
  float* s_eg = reinterpret_cast<float*>(smem + S::eg);
  float* s_db = reinterpret_cast<float*>(smem + S::db);
  float* s_dg = reinterpret_cast<float*>(smem + S::dg);
  float* s_red = reinterpret_cast<float*>(smem + S::red);
  float* s_red2 = reinterpret_cast<float*>(smem + S::red2);
  uint64_t* s_bars = reinterpret_cast<uint64_t*>(smem + S::bars);
  if (p.pair == kPairPush) pair_push_init(s_bars);
  const ChunkIdx ci = chunk_idx(p);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, L = ci.L, Lk = round16(L);
  const int64_t qrow = ci.bos * p.Hk + ci.hk, vrow = ci.bos * p.Hv + ci.h;
  if constexpr (sizeof(T) == 2) {  // phase II's dW and K into L2 now (two lines per row, 128 threads each)
    prefetch_l2_rows<2>(g_dW + vrow * p.dk, int64_t(p.Hv) * p.dk * 2, L, p.dk * 2, tid);
    prefetch_l2_rows<2>(g_k + qrow * p.dk, int64_t(p.Hk) * p.dk * 2, L, p.dk * 2, tid - 128);
  }
  // Phase I: dDelta, Tm, gamma, beta, then V as a second commit group, so that step 6's product
  // Tm^T dDelta runs while V lands (dDelta V^T after it; the same products: wy 904 -> 890 us under
  // ncu on an H100, perf.md v0.37.0).
  load_ctile<C, D, kLastRead>(s_dd, LDD<T>, g_dD + vrow * p.dv, int64_t(p.Hv) * p.dv, L, p.dv, tid);
  load_ctile<C, C, kLastRead>(s_tm, LDC<T>, g_Tm + (int64_t(ci.c) * p.Hv + ci.h) * C * C, C, C, C, tid);
  load_col(s_gam, g_gam + vrow, p.Hv, C, L, tid, kChunkThreads);
  load_col(s_beta, g_beta + vrow, p.Hv, C, L, tid, kChunkThreads);
  cp_commit();
  load_ctile<C, D, kLastRead>(s_v, LDD<T>, g_v + ci.bos * p.sv + int64_t(ci.h) * p.dv, p.sv, L, p.dv, tid);
  cp_commit();
  cp_wait<1>();
  __syncthreads();
  if (tid < C) s_eg[tid] = tid < L ? gexp(s_gam[tid]) : 0.f;
  const int tm0 = 16 * (warp & 3), tn0 = 32 * (warp >> 2);  // [C, C] tiling
  const bool tri = tm0 < L && tn0 < tm0 + 16;
  float r_a2[1][4][4];  // dDelta V^T, held for step 1 (phase II)
  zero(r_a2);
  const int m0 = 32 * (warp & 1), n0 = 32 * (warp >> 1), wn = warp >> 1;
  {  // 6. dv = diag(beta) Tm^T dDelta; dbeta_i += sum_k (Tm^T dDelta)_ik v_ik
    const bool active = m0 < L && n0 < p.dv;
    float r_acc[2][4][4];
    zero(r_acc);
    if (active) warp_gemm<2, 4, true, false>(r_acc, s_tm, LDC<T>, s_dd, LDD<T>, m0, n0, Lk);
    cp_wait<0>();
    __syncthreads();  // V
    if (tri) warp_gemm<1, 4, false, true>(r_a2, s_dd, LDD<T>, s_v, LDD<T>, tm0, tn0, p.dv);
    float r_rs[2][2];
    frag_rowdot(r_acc, m0, n0, r_rs, [&](int r, int c) { return load2(s_v + r * LDD<T> + c); });
    store_row_sums(s_red2, wn, m0, r_rs, lane);
    if (active)
      store_frags(g_dv + ci.bos * p.sdv + int64_t(ci.h) * p.dv, p.sdv, r_acc, m0, n0, L, p.dv,
                  [&](int r, float& x0, float& x1) { x0 = s_beta[r] * x0, x1 = s_beta[r] * x1; });
  }
  __syncthreads();  // dDelta and V are dead: phase II loads dW and K over them
  // Step 5's dk_h (G == 1; with p.pair the key head's sum, read by rank r's column half r) and step
  // 7's dgamma partials are read from global in the epilogues: into L2 now.
  static_assert(C * (D * 4 / 128) <= kChunkThreads, "one line per thread");
  if (p.G == 1) prefetch_l2_rows<D * 4 / 128>(g_dkh + vrow * p.dk, int64_t(p.Hv) * p.dk * 4, L, p.dk * 4, tid);
  else if (p.pair && (tid & 2) == (ci.h & 1) * 2)  // lines 2r, 2r + 1 of each 512-byte row: columns [64r, 64r + 64)
    prefetch_l2_rows<D * 4 / 128>(g_dkh + qrow * p.dk, int64_t(p.Hk) * p.dk * 4, L, p.dk * 4, tid);
  prefetch_l2_rows<1>(g_dgam + vrow, int64_t(p.Hv) * 4, L, 4, tid);
  // (load_tile here, not load_ctile: the full form's second address set spilled at 80 registers;
  // load_ctile no longer spills since v0.22.0 but measured 890-895 us against 873-885, v0.24.0)
  load_tile<kLastRead>(s_dw, LDD<T>, g_dW + vrow * p.dk, int64_t(p.Hv) * p.dk, C, L, p.dk, D, tid, kChunkThreads);
  load_tile(s_k, LDD<T>, g_k + qrow * p.dk, int64_t(p.Hk) * p.dk, C, L, p.dk, D, tid, kChunkThreads);
  cp_commit();
  cp_wait<0>();
  __syncthreads();
  {  // 1. dTm = (dW K^T) diag(beta e) + (dDelta V^T) diag(beta), strictly lower, valid
    float r_a1[1][4][4];
    zero(r_a1);
    if (tri) warp_gemm<1, 4, false, true>(r_a1, s_dw, LDD<T>, s_k, LDD<T>, tm0, tn0, p.dk);
    wy_dtm_epilogue(r_a1[0], r_a2[0], tm0, tn0, L, s_beta, s_eg, lane,
                    [&](int r, int c, float y0, float y1) { store2(s_dt + r * LDC<T> + c, y0, y1); });
  }
  __syncthreads();
  {  // 2. X = dTm_sl Tm^T
    float r_acc[1][4][4];
    zero(r_acc);
    if (tm0 < L) warp_gemm<1, 4, false, true>(r_acc, s_dt, LDC<T>, s_tm, LDC<T>, tm0, tn0, Lk);
    frag_pairs(r_acc, tm0, tn0, [&](int r, int c, float& x0, float& x1) { store2(s_x + r * LDC<T> + c, x0, x1); });
  }
  __syncthreads();
  {  // 3. dA = -Tm^T X; dB = dA (.) Gamma (strict lower, valid); M = dB (.) K K^T; dbb = diag(beta) dB
    float r_acc[1][4][4], r_kk[1][4][4];
    zero(r_acc);
    zero(r_kk);
    if (tm0 < L && tn0 < tm0 + 16) {
      warp_gemm<1, 4, true, false>(r_acc, s_tm, LDC<T>, s_x, LDC<T>, tm0, tn0, Lk);
      warp_gemm<1, 4, false, true>(r_kk, s_k, LDD<T>, s_k, LDD<T>, tm0, tn0, p.dk);
    }
    wy_db_epilogue(r_acc[0], r_kk[0], tm0, tn0, L, s_gam, s_beta, s_rowp, s_colp, warp, lane,
                   [&](int r, int c, float y0, float y1) { store2(s_dbb + r * LDC<T> + c, y0, y1); });
  }
  __syncthreads();
  if (tid < C) {  // 4. dbeta_i += rowsum(M); dgamma_i += beta_i rowsum(M)_i - sum_i' beta_i' M[i'][i]
    const float rs = s_rowp[tid] + s_rowp[C + tid];
    const float cs = s_colp[tid] + s_colp[C + tid] + s_colp[2 * C + tid] + s_colp[3 * C + tid];
    s_db[tid] = rs;
    s_dg[tid] = s_beta[tid] * rs - cs;
  }
  {  // 5. dk2 = diag(beta e) Tm^T dW + diag(beta) dB K + dB^T diag(beta) K; dk = dk2 + dqk's part
    const bool active = m0 < L && n0 < p.dk;
    float r_acc[2][4][4];
    zero(r_acc);
    if (active) warp_gemm<2, 4, true, false>(r_acc, s_tm, LDC<T>, s_dw, LDD<T>, m0, n0, Lk);
    float r_rs[2][2];
    frag_rowdot(r_acc, m0, n0, r_rs, [&](int r, int c) { return load2(s_k + r * LDD<T> + c); });
    store_row_sums(s_red, wn, m0, r_rs, lane);
    if (active) {
      frag_pairs(r_acc, m0, n0, [&](int r, int, float& x0, float& x1) {
        const float f = s_beta[r] * s_eg[r];
        x0 *= f, x1 *= f;
      });
      warp_gemm<2, 4, false, false>(r_acc, s_dbb, LDC<T>, s_k, LDD<T>, m0, n0, Lk);
      warp_gemm<2, 4, true, false>(r_acc, s_dbb, LDC<T>, s_k, LDD<T>, m0, n0, Lk);
      if (p.G == 1) {  // dk itself, as gsum would round it
        add_dkh_store(r_acc, m0, n0, L, p.dk, g_dkh + vrow * p.dk, int64_t(p.Hv) * p.dk, g_dk + vrow * p.dk, lane);
      } else if (!p.pair) {  // gsum adds the heads' dk2, then their dqk parts
        frag_pairs(r_acc, m0, n0, [&](int r, int c, float& x0, float& x1) {
          if (r < L && c < p.dk) store2(g_dk2 + (vrow + int64_t(r) * p.Hv) * p.dk + c, x0, x1);
        });
      }
    }
    // dk of the key head = (this v-head's dk2 + the partner's) + dqk's pair sum, through s_dt and
    // s_x, once every warp is past its reads of dbb (in s_dt): gsum's order, so the same bits
    if (p.pair) {
      __syncthreads();
      float* xbuf = reinterpret_cast<float*>(smem + S::dt);
      const bool sum = pair_sum_mode(r_acc, xbuf, s_bars, p.pair);  // (pulled: waited for at the CTA's exit)
      if (sum && active)
        add_dkh_store(r_acc, m0, n0, L, p.dk, g_dkh + qrow * p.dk, int64_t(p.Hk) * p.dk, g_dk + qrow * p.dk, lane);
      if (p.pair == kPairPush) {  // uniform: every thread leaves here; steps 7 and 8 on the idle pushers (see dqk)
        const int w4 = warp & 3;  // the pushing group's first two warps, rows w4 * 32 + lane
        if (!sum && w4 < 2) {
          wy_dbeta_dgamma(w4 * 32 + lane, L, vrow, p.Hv, s_red, s_red2, s_eg, s_beta, s_db, s_dg, g_dgam, g_dbeta);
          asm volatile("bar.sync 1, 64;" ::: "memory");  // those 64 threads: every s_dg row written
          if (w4 == 0) wy_dg_cumsum(lane, L, vrow, p.Hv, s_dg, g_dg);
        }
        return;
      }
    }
  }
  __syncthreads();
  // 7. dbeta, total dgamma
  if (tid < C) wy_dbeta_dgamma(tid, L, vrow, p.Hv, s_red, s_red2, s_eg, s_beta, s_db, s_dg, g_dgam, g_dbeta);
  __syncthreads();
  if (warp == 0) wy_dg_cumsum(lane, L, vrow, p.Hv, s_dg, g_dg);  // 8. dg
  if (p.pair == kPairPull) cluster_wait();  // the partner has read this CTA's s_dt (push: see pair_sum_push)
}

// ---- wy through wgmma (bf16, dk = dv = 128, sm_90a; DT_GDN_WY=wgmma) ----------------------------
// wy_kernel's steps and sums with every product as a warpgroup MMA whose operands both sit in
// shared memory (wgmma.cuh's SS form), in 128-byte-swizzled atoms instead of padded rows: no
// ldmatrix and no mma.sync, and a product runs while the previous step's epilogue does (6b under
// 6a's, K K^T under step 1's and step 2, 5a under the barrier and step 4). The two warpgroups
// split N: the [C, C] products as m64n32 (a warp's accumulator is wy_kernel's tm0 / tn0 tile, so
// those epilogues are unchanged), the [C, D] ones as m64n64 (a warp holds 16 rows x 64 columns,
// the same column half per warpgroup, so the pair exchange pairs the same fragments). K is loaded
// in phase I and kept (the unpadded tiles make room: 62.2 KB, three CTAs per SM), so phase II
// loads only dW. Every token-dimension product runs its 4 k-steps: rows and columns >= L of every
// operand pair are exact zeros (a k-loop bounded by L made ptxas serialise the wgmma chain).
// Meant to give wy_kernel's bits (same k order, same sums); GdnChunkCuda.WyWgmmaSameBits checks.
namespace wyw {  // wy_wg_kernel's descriptors and swizzled element offsets
// Descriptor low words: start address >> 4 | LBO >> 4 << 16 (wgmma.cuh's SS wrappers add the high word).
// K-major operand in rows of 128-byte atoms (atom stride astride), k-step kk: 32 bytes a step inside
// an atom; LBO 16 bytes (unused for K-major).
__device__ __forceinline__ uint32_t dk_(uint32_t base, int kk, uint32_t astride) {
  return (((base + (kk >> 2) * astride + (kk & 3) * 32) & 0x3FFFF) >> 4) | (1u << 16);
}
// MN-major operand: k-step kk = rows 16 kk .. 16 kk + 15; LBO one atom (`atom` bytes: C * 128 for
// [C][64] atoms, D * 128 for out's h_c in [D][64] atoms)
__device__ __forceinline__ uint32_t dm_(uint32_t base, int kk, uint32_t atom = C * 128) {
  return (((base + kk * 2048) & 0x3FFFF) >> 4) | ((atom / 16) << 16);
}
// element (r, c) of a swizzled [rows][64 * natoms] bf16 tile whose atoms are `atom` bytes apart, byte offset
__device__ __forceinline__ uint32_t swe(int r, int c, uint32_t atom = C * 128) {
  return (c >> 6) * atom + wg::sw128(r, (c & 63) >> 3) + (c & 7) * 2;
}
// the shared address of the dynamic shared memory, trapping unless 1 KB-aligned (the atoms' wgmma
// descriptors need it); the test is opaque, else the compiler folds it away by __align__(1024)
__device__ __forceinline__ uint32_t smem_base_1k(const unsigned char* smem) {
  const uint32_t sb = smem_addr(smem);
  uint32_t a = sb;
  asm volatile("" : "+r"(a));
  if (a & 1023) __trap();
  return sb;
}
}  // namespace wyw

struct WyWgSmem {
  static constexpr size_t a = 0;                 // dDelta, then dW   [C][128] (2 atoms)
  static constexpr size_t k = a + 2 * C * 128;   // K (loaded in phase I)
  static constexpr size_t b = k + 2 * C * 128;   // V, then dt [C][64] + xt [C][64]
  static constexpr size_t dt = b, xt = b + C * 128;
  static constexpr size_t tm = b + 2 * C * 128;  // Tm [C][64]
  static constexpr size_t rowp = tm + C * 128;
  static constexpr size_t colp = rowp + 4 * 2 * C;
  static constexpr size_t gam = colp + 4 * 4 * C;
  static constexpr size_t beta = gam + 4 * C, eg = beta + 4 * C, db = eg + 4 * C, dg = db + 4 * C;
  static constexpr size_t red = dg + 4 * C, red2 = red + 4 * 4 * C, bars = red2 + 4 * 4 * C;
  static constexpr size_t bytes = bars + 16;
};
static_assert(3 * (WyWgSmem::bytes + kSmemReservedPerCta) <= kSmemPerSm, "wy_wg_kernel: three CTAs per SM");
static_assert(WyWgSmem::xt - WyWgSmem::dt == C * 128 && 2 * C * 128 >= 8 * 128 * sizeof(float4) &&
                  WyWgSmem::dt % 1024 == 0 && WyWgSmem::tm % 1024 == 0 && WyWgSmem::k % 1024 == 0,
              "wy_wg_kernel: 1 KB atoms; dt + xt hold pair_sum's buffer");

__device__ __forceinline__ void add_dkh_store_wg(const float (&acc)[8][4], int m0, int n0, int L, int dk,
                                                 const float* g_dkh, int64_t stride, bf16* g_dk, int lane) {
  const int lg = lane >> 2, lt = lane & 3;
  auto tile = [&](auto full) {
    constexpr bool F = decltype(full)::value;
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      float2 r_old[8];
      const int r = m0 + lg + 8 * h2;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int c = n0 + 8 * j + 2 * lt;
        const bool ok = F || (r < L && c < dk);
        r_old[j] = load2(g_dkh + int64_t(ok ? r : 0) * stride + (ok ? c : 0));
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int c = n0 + 8 * j + 2 * lt;
        if (F || (r < L && c < dk)) store2(g_dk + int64_t(r) * stride + c, r_old[j].x + acc[j][2 * h2], r_old[j].y + acc[j][2 * h2 + 1]);
      }
    }
  };
  if (m0 + 16 <= L && n0 + 64 <= dk) tile(std::true_type{});
  else tile(std::false_type{});
}
// row sums of acc (.) X over this warp's 64 columns as two 32-column partials (today's column
// groups 2 wgi, 2 wgi + 1, the same fmaf order) -> s[(2 wgi + half) C + row]
template <class XF>
__device__ __forceinline__ void rowdot_wg(const float (&acc)[8][4], int m0, int wgi, float* s, int lane, XF&& xf) {
  asm volatile("" : "+r"(lane));  // opaque: the swizzled offsets are recomputed here, not kept from step 6 (spilled)
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float2 x[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) x[j] = xf(m0 + g + 8 * h2, 64 * wgi + 32 * half + 8 * j + 2 * t);
      float v = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v = fmaf(acc[4 * half + j][2 * h2], x[j].x, v);
        v = fmaf(acc[4 * half + j][2 * h2 + 1], x[j].y, v);
      }
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      if (t == 0) s[(2 * wgi + half) * C + m0 + g + 8 * h2] = v;
    }
}

__global__ __launch_bounds__(kChunkThreads, 3) void wy_wg_kernel(
    Params p, const bf16* __restrict__ g_k, const bf16* __restrict__ g_v, const float* __restrict__ g_beta,
    const float* __restrict__ g_gam, const bf16* __restrict__ g_Tm, const bf16* __restrict__ g_dW,
    const bf16* __restrict__ g_dD, const float* __restrict__ g_dgam, const float* __restrict__ g_dkh,
    float* __restrict__ g_dk2, bf16* __restrict__ g_dk, bf16* __restrict__ g_dv, float* __restrict__ g_dbeta,
    float* __restrict__ g_dg) {
  extern __shared__ __align__(1024) unsigned char smem[];
  using S = WyWgSmem;
  using namespace wyw;
  using wg::m64n64k16_ss;
  using wg::m64n32k16_ss;
  const uint32_t sb = smem_base_1k(smem);
  float* s_rowp = reinterpret_cast<float*>(smem + S::rowp);
  float* s_colp = reinterpret_cast<float*>(smem + S::colp);
  float* s_gam = reinterpret_cast<float*>(smem + S::gam);
  float* s_beta = reinterpret_cast<float*>(smem + S::beta);
  float* s_eg = reinterpret_cast<float*>(smem + S::eg);
  float* s_db = reinterpret_cast<float*>(smem + S::db);
  float* s_dg = reinterpret_cast<float*>(smem + S::dg);
  float* s_red = reinterpret_cast<float*>(smem + S::red);
  float* s_red2 = reinterpret_cast<float*>(smem + S::red2);
  uint64_t* s_bars = reinterpret_cast<uint64_t*>(smem + S::bars);
  if (p.pair == kPairPush) pair_push_init(s_bars);
  const ChunkIdx ci = chunk_idx(p);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, L = ci.L;
  const int w4 = warp & 3, wgi = warp >> 2;
  const int64_t qrow = ci.bos * p.Hk + ci.hk, vrow = ci.bos * p.Hv + ci.h;
  prefetch_l2_rows<2>(g_dW + vrow * p.dk, int64_t(p.Hv) * p.dk * 2, L, p.dk * 2, tid);
  // phase I: dDelta, Tm, gamma, beta | V | K
  // (no L2 evict_first on them, unlike wy_kernel's loads: see load_rows_sw128)
  load_dk_rows<kChunkThreads, true>(smem + S::a, g_dD + vrow * p.dv, int64_t(p.Hv) * p.dv, L == C, L, p.dv, tid);
  load_p_sw128<kChunkThreads>(smem + S::tm, g_Tm + (int64_t(ci.c) * p.Hv + ci.h) * C * C, tid);
  load_col(s_gam, g_gam + vrow, p.Hv, C, L, tid, kChunkThreads);
  load_col(s_beta, g_beta + vrow, p.Hv, C, L, tid, kChunkThreads);
  cp_commit();
  load_dk_rows<kChunkThreads, true>(smem + S::b, g_v + ci.bos * p.sv + int64_t(ci.h) * p.dv, p.sv, L == C, L, p.dv,
                                    tid);
  cp_commit();
  load_dk_rows<kChunkThreads, true>(smem + S::k, g_k + qrow * p.dk, int64_t(p.Hk) * p.dk, L == C, L, p.dk, tid);
  cp_commit();
  cp_wait<2>();
  wg::fence_proxy_async();
  __syncthreads();
  if (tid < C) s_eg[tid] = tid < L ? gexp(s_gam[tid]) : 0.f;
  const int tm0 = 16 * w4, tn0 = 32 * wgi;
  // 6a. Tm^T dDelta: [64 x 64] per warpgroup, columns 64 wgi
  float acc6[1][8][4];
  zero(acc6);
  wg::wg_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    m64n64k16_ss<1, 1>(acc6[0], dm_(sb + S::tm, kk), dm_(sb + S::a + wgi * C * 128, kk), 1);
  wg::wg_commit();
  cp_wait<1>();
  wg::fence_proxy_async();
  __syncthreads();  // V
  float r_a2[1][4][4];
  zero(r_a2);
  wg::wg_fence();
#pragma unroll
  for (int kk = 0; kk < 8; ++kk)
    m64n32k16_ss<0, 0>(r_a2[0], dk_(sb + S::a, kk, C * 128), dk_(sb + S::b + wgi * 4096, kk, C * 128), 1);
  wg::wg_commit();
  wg::wg_hold(acc6[0]);
  wg::wg_hold(r_a2[0]);
  wg::wg_wait<1>();
  wg::wg_hold(acc6[0]);
  {
    rowdot_wg(acc6[0], tm0, wgi, s_red2, lane,
              [&](int r, int c) { return load2(reinterpret_cast<const bf16*>(smem + S::b + swe(r, c))); });
    if (tm0 < L)
      store_frags(g_dv + ci.bos * p.sdv + int64_t(ci.h) * p.dv, p.sdv, acc6, tm0, 64 * wgi, L, p.dv,
                  [&](int r, float& x0, float& x1) { x0 = s_beta[r] * x0, x1 = s_beta[r] * x1; });
  }
  wg::wg_hold(r_a2[0]);
  wg::wg_wait<0>();
  wg::wg_hold(r_a2[0]);
  __syncthreads();  // dDelta, V dead
  static_assert(C * (D * 4 / 128) <= kChunkThreads, "one line per thread");
  if (p.G == 1) prefetch_l2_rows<D * 4 / 128>(g_dkh + vrow * p.dk, int64_t(p.Hv) * p.dk * 4, L, p.dk * 4, tid);
  else if (p.pair && (tid & 2) == (ci.h & 1) * 2)
    prefetch_l2_rows<D * 4 / 128>(g_dkh + qrow * p.dk, int64_t(p.Hk) * p.dk * 4, L, p.dk * 4, tid);
  prefetch_l2_rows<1>(g_dgam + vrow, int64_t(p.Hv) * 4, L, 4, tid);
  load_dk_rows<kChunkThreads, true>(smem + S::a, g_dW + vrow * p.dk, int64_t(p.Hv) * p.dk, L == C, L, p.dk, tid);
  cp_commit();
  cp_wait<0>();
  wg::fence_proxy_async();
  __syncthreads();
  float r_kk[1][4][4];
  zero(r_kk);
  {  // 1. dTm
    float r_a1[1][4][4];
    zero(r_a1);
    wg::wg_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
      m64n32k16_ss<0, 0>(r_a1[0], dk_(sb + S::a, kk, C * 128), dk_(sb + S::k + wgi * 4096, kk, C * 128), 1);
    wg::wg_commit();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
      m64n32k16_ss<0, 0>(r_kk[0], dk_(sb + S::k, kk, C * 128), dk_(sb + S::k + wgi * 4096, kk, C * 128), 1);
    wg::wg_commit();
    wg::wg_hold(r_kk[0]);
    wg::wg_hold(r_a1[0]);
    wg::wg_wait<1>();
    wg::wg_hold(r_a1[0]);
    wy_dtm_epilogue(r_a1[0], r_a2[0], tm0, tn0, L, s_beta, s_eg, lane, [&](int r, int c, float y0, float y1) {
      store2(reinterpret_cast<bf16*>(smem + S::dt + swe(r, c)), y0, y1);
    });
  }
  wg::fence_proxy_async();
  __syncthreads();
  {  // 2. X = dTm_sl Tm^T -> X^T (stmatrix.trans)
    float r_x[4][4];
    zero_tiles(r_x);
    wg::wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      m64n32k16_ss<0, 0>(r_x, dk_(sb + S::dt, kk, 0), dk_(sb + S::tm + wgi * 4096, kk, 0), 1);
    wg::wg_commit();
    wg::wg_hold(r_kk[0]);
    wg::wg_hold(r_x);
    wg::wg_wait<0>();
    wg::wg_hold(r_x);
    wg::wg_hold(r_kk[0]);
#pragma unroll
    for (int jb = 0; jb < 4; jb += 2) {
      uint32_t rr[4];
#pragma unroll
      for (int m = 0; m < 4; ++m) rr[m] = pack_bf16(r_x[jb + (m >> 1)][2 * (m & 1)], r_x[jb + (m >> 1)][2 * (m & 1) + 1]);
      const int m = lane >> 3, n = tn0 + 8 * (jb + (m >> 1)) + (lane & 7);
      stsm_x4_t_sa(sb + uint32_t(S::xt) + wg::sw128(n, 2 * w4 + (m & 1)), rr);
    }
  }
  wg::fence_proxy_async();
  __syncthreads();
  {  // 3. dA = -Tm^T X ...
    float r_acc[1][4][4];
    zero(r_acc);
    wg::wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      m64n32k16_ss<1, 0>(r_acc[0], dm_(sb + S::tm, kk), dk_(sb + S::xt + wgi * 4096, kk, 0), 1);
    wg::wg_commit();
    wg::wg_hold(r_acc[0]);
    wg::wg_wait<0>();
    wg::wg_hold(r_acc[0]);
    wg::wg_hold(r_kk[0]);
    wy_db_epilogue(r_acc[0], r_kk[0], tm0, tn0, L, s_gam, s_beta, s_rowp, s_colp, warp, lane,
                   [&](int r, int c, float y0, float y1) {
                     store2(reinterpret_cast<bf16*>(smem + S::dt + swe(r, c)), y0, y1);
                   });
  }
  float acc5[1][8][4];
  zero(acc5);
  wg::wg_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    m64n64k16_ss<1, 1>(acc5[0], dm_(sb + S::tm, kk), dm_(sb + S::a + wgi * C * 128, kk), 1);
  wg::wg_commit();
  wg::fence_proxy_async();
  __syncthreads();
  if (tid < C) {
    const float rs = s_rowp[tid] + s_rowp[C + tid];
    const float cs = s_colp[tid] + s_colp[C + tid] + s_colp[2 * C + tid] + s_colp[3 * C + tid];
    s_db[tid] = rs;
    s_dg[tid] = s_beta[tid] * rs - cs;
  }
  {  // 5.
    const int m0 = tm0, n0 = 64 * wgi;
    const bool active = m0 < L && n0 < p.dk;
    wg::wait_acc(acc5[0]);
    rowdot_wg(acc5[0], m0, wgi, s_red, lane,
              [&](int r, int c) { return load2(reinterpret_cast<const bf16*>(smem + S::k + swe(r, c))); });
    frag_pairs(acc5, m0, n0, [&](int r, int, float& x0, float& x1) {
      const float f = s_beta[r] * s_eg[r];
      x0 *= f, x1 *= f;
    });
    wg::wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      m64n64k16_ss<0, 1>(acc5[0], dk_(sb + S::dt, kk, 0), dm_(sb + S::k + wgi * C * 128, kk), 1);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      m64n64k16_ss<1, 1>(acc5[0], dm_(sb + S::dt, kk), dm_(sb + S::k + wgi * C * 128, kk), 1);
    wg::wg_commit();
    wg::wait_acc(acc5[0]);
    if (active) {
      if (p.G == 1) {
        add_dkh_store_wg(acc5[0], m0, n0, L, p.dk, g_dkh + vrow * p.dk, int64_t(p.Hv) * p.dk, g_dk + vrow * p.dk, lane);
      } else if (!p.pair) {
        frag_pairs(acc5, m0, n0, [&](int r, int c, float& x0, float& x1) {
          if (r < L && c < p.dk) store2(g_dk2 + (vrow + int64_t(r) * p.Hv) * p.dk + c, x0, x1);
        });
      }
    }
    if (p.pair) {
      __syncthreads();
      float* xbuf = reinterpret_cast<float*>(smem + S::dt);
      auto& acc2 = reinterpret_cast<float(&)[2][4][4]>(acc5);
      const bool sum = pair_sum_mode(acc2, xbuf, s_bars, p.pair);
      if (sum && active)
        add_dkh_store_wg(acc5[0], m0, n0, L, p.dk, g_dkh + qrow * p.dk, int64_t(p.Hk) * p.dk, g_dk + qrow * p.dk, lane);
      if (p.pair == kPairPush) {
        if (!sum && w4 < 2) {
          wy_dbeta_dgamma(w4 * 32 + lane, L, vrow, p.Hv, s_red, s_red2, s_eg, s_beta, s_db, s_dg, g_dgam, g_dbeta);
          asm volatile("bar.sync 1, 64;" ::: "memory");
          if (w4 == 0) wy_dg_cumsum(lane, L, vrow, p.Hv, s_dg, g_dg);
        }
        return;
      }
    }
  }
  __syncthreads();
  if (tid < C) wy_dbeta_dgamma(tid, L, vrow, p.Hv, s_red, s_red2, s_eg, s_beta, s_db, s_dg, g_dgam, g_dbeta);
  __syncthreads();
  if (warp == 0) wy_dg_cumsum(lane, L, vrow, p.Hv, s_dg, g_dg);
  if (p.pair == kPairPull) cluster_wait();
}

// ---- dqk through wgmma (bf16, dk = dv = 128, sm_90a; DT_GDN_DQK=wgmma; docs/dqk-wgmma-design.md) ----
// dqk_kernel's steps and sums with every product an SS wgmma from 128-byte-swizzled atoms, the two
// warpgroups splitting N (ds as m64n32: ds_tile's warp tiles; the [C, D] products as m64n64: a warp
// holds 16 rows x 64 columns, warps 0-3 columns 0-63 as in dqk_kernel, so both pair exchanges pair
// the same fragments). ds^T Q and its diagonal term run before serial_wait and K's pairs stay in
// registers, so dS1 loads over K and Q: one load phase after the wait (dDelta under Delta dS1^T,
// state_dot and dk's epilogue), and Delta stays resident. Every token-dimension product runs its 4
// k-steps (rows and columns >= L are exact zeros). Meant to give dqk_kernel's bits (same k order,
// same epilogue arithmetic); GdnChunkCuda.DqkWgmmaSameBits checks. The design's other schedules
// (its sections 6, 7: the DQW_* switches before v0.40.0) were never run and are gone.

struct DqkWgSmem {
  static constexpr size_t x1 = 0;         // dO [C][128], then dq's pair buffer, then dDelta
  static constexpr size_t dl = 16384;     // Delta [C][128] (kept to step 5)
  static constexpr size_t k = 32768;      // K [C][128] (step 2 only: its pairs stay in registers)
  static constexpr size_t q = 49152;      // Q [C][128] (step 2 only)
  static constexpr size_t d1 = k;         // dS1 [D][128] over K and Q (atom 0 at k, atom 1 at q)
  static constexpr size_t s0 = 65536;     // S0 [D][128], then dk's pair buffer
  static constexpr size_t ds = 98304;     // ds [C][64] (one atom)
  static constexpr size_t gam = 106496, eg = gam + 256, el = eg + 256, dgq = el + 256, dsd = dgq + 256;
  static constexpr size_t red = dsd + 256;    // f32 [4][C] dq . q
  static constexpr size_t red2 = red + 1024;  // f32 [4][C] dk_state . k
  static constexpr size_t red3 = red2 + 1024; // f32 [4][C] (ds^T Q) . k
  static constexpr size_t ws = red3 + 1024, bars = ws + 32;
  static constexpr size_t bytes = bars + 32;
};
static_assert(2 * (DqkWgSmem::bytes + kSmemReservedPerCta) <= kSmemPerSm, "dqk_wg_kernel: two CTAs per SM");
static_assert(DqkWgSmem::q - DqkWgSmem::k == D * 128 && DqkWgSmem::s0 % 1024 == 0 && DqkWgSmem::ds % 1024 == 0,
              "dqk_wg_kernel: dS1's atoms 16 KB apart over K and Q; 1 KB atoms");

// [D][D] bf16 state tile (rows D apart in global) -> two swizzled [D][64] atoms; 8 copies a thread,
// rows 16 apart (r & 7 fixed, so one swizzled column per thread).
__device__ __forceinline__ void load_state_sw128(unsigned char* s, const bf16* g, int tid) {
  const int r = tid >> 4, c = tid & 15;
  const uint32_t sa = smem_addr(s + (c >> 3) * (D * 128) + wg::sw128(r, c & 7));
  const bf16* gp = g + r * D + 8 * c;
#pragma unroll
  for (int i = 0; i < D / 16; ++i) cp_async16_sa(sa + i * 16 * 128, gp + i * 16 * D);
}
// state_dot with both tiles swizzled in shared memory: thread tid's vectors idx = 8 tid + 2048 i in
// today's order (row tid / 16 + 16 i, columns 8 (tid % 16) ..), the same fmaf chain: the same bits.
__device__ __forceinline__ void state_dot_sw(float* s_ws, const unsigned char* s_s, const unsigned char* s_d, int tid) {
  const int r = tid >> 4, c = tid & 15;
  const uint32_t off = (c >> 3) * (D * 128) + wg::sw128(r, c & 7);
  float r_s = 0.f;
#pragma unroll 2
  for (int i = 0; i < D / 16; ++i) {
    const uint4 sa = *reinterpret_cast<const uint4*>(s_s + off + i * 2048);
    const uint4 sd = *reinterpret_cast<const uint4*>(s_d + off + i * 2048);
    const bf16* es = reinterpret_cast<const bf16*>(&sa);
    const bf16* ed = reinterpret_cast<const bf16*>(&sd);
#pragma unroll
    for (int e = 0; e < 8; ++e) r_s = fmaf(to_f(es[e]), to_f(ed[e]), r_s);
  }
  r_s = warp_sum(r_s);
  if ((tid & 31) == 0) s_ws[tid >> 5] = r_s;
}
// rowdot_wg with X from registers: kp[h2][j] = bf16 pair at (m0 + g + 8 h2, 64 wgi + 8 j + 2 t)
__device__ __forceinline__ void rowdot_kp(const float (&acc)[8][4], const uint32_t (&kp)[2][8], int m0, int wgi, float* s,
                                          int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float v = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&kp[h2][4 * half + j]));
        v = fmaf(acc[4 * half + j][2 * h2], x.x, v);
        v = fmaf(acc[4 * half + j][2 * h2 + 1], x.y, v);
      }
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      if (t == 0) s[(2 * wgi + half) * C + m0 + g + 8 * h2] = v;
    }
}

__global__ __launch_bounds__(kChunkThreads, 2) void dqk_wg_kernel(
    Params p, const bf16* __restrict__ g_q, const bf16* __restrict__ g_k, const float* __restrict__ g_gam,
    const bf16* __restrict__ g_do, const bf16* __restrict__ g_D, const bf16* __restrict__ g_dD,
    const bf16* __restrict__ g_h, const bf16* __restrict__ g_dS1, float* __restrict__ g_dqh, bf16* __restrict__ g_dq,
    float* __restrict__ g_dkh, bf16* __restrict__ g_dW, float* __restrict__ g_dgam) {
  extern __shared__ __align__(1024) unsigned char smem[];
  using S = DqkWgSmem;
  using namespace wyw;
  using wg::m64n32k16_ss;
  using wg::m64n64k16_ss;
  const uint32_t sb = smem_base_1k(smem);
  float* s_gam = reinterpret_cast<float*>(smem + S::gam);
  float* s_eg = reinterpret_cast<float*>(smem + S::eg);
  float* s_el = reinterpret_cast<float*>(smem + S::el);
  float* s_dgq = reinterpret_cast<float*>(smem + S::dgq);
  float* s_dsd = reinterpret_cast<float*>(smem + S::dsd);
  float* s_red = reinterpret_cast<float*>(smem + S::red);
  float* s_red2 = reinterpret_cast<float*>(smem + S::red2);
  float* s_red3 = reinterpret_cast<float*>(smem + S::red3);
  float* s_ws = reinterpret_cast<float*>(smem + S::ws);
  uint64_t* s_bars = reinterpret_cast<uint64_t*>(smem + S::bars);
  if (p.pair == kPairPush) pair_push_init<4>(s_bars);
  const ChunkIdx ci = chunk_idx(p);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, L = ci.L;
  const int w4 = warp & 3, wgi = warp >> 2, g = lane >> 2, t = lane & 3;
  const int64_t qrow = ci.bos * p.Hk + ci.hk, vrow = ci.bos * p.Hv + ci.h;
  const int64_t sbase = (int64_t(ci.c) * p.Hv + ci.h) * (D * D);
  prefetch_l2_rows<2>(g_dS1 + sbase, D * 2, D, D * 2, tid);  // dS1 -> L2 (one line per thread)
  // g0: dO, Delta, gamma | g1: K, S0, Q   (no L2 evict_first on the read-once tiles: see load_rows_sw128)
  load_dk_rows<kChunkThreads, true>(smem + S::x1, g_do + vrow * D, int64_t(p.Hv) * D, L == C, L, D, tid);
  load_dk_rows<kChunkThreads, true>(smem + S::dl, g_D + vrow * D, int64_t(p.Hv) * D, L == C, L, D, tid);
  load_col(s_gam, g_gam + vrow, p.Hv, C, L, tid, kChunkThreads);
  cp_commit();
  load_dk_rows<kChunkThreads, true>(smem + S::k, g_k + qrow * D, int64_t(p.Hk) * D, L == C, L, D, tid);
  load_state_sw128(smem + S::s0, g_h + sbase, tid);
  cp_commit();
  load_dk_rows<kChunkThreads, true>(smem + S::q, g_q + qrow * D, int64_t(p.Hk) * D, L == C, L, D, tid);
  cp_commit();  // g2: Q, waited before ds^T Q
  cp_wait<2>();
  wg::fence_proxy_async();
  __syncthreads();
  // 1. ds = scale (dO Delta^T) (.) Gamma: m64n32 x 8 per warpgroup (ds_tile's warp tiles)
  {
    const int m0 = 16 * w4, n0 = 32 * wgi;
    float a1[1][4][4];
    zero(a1);
    wg::wg_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
      m64n32k16_ss<0, 0>(a1[0], dk_(sb + S::x1, kk, C * 128), dk_(sb + S::dl + wgi * 4096, kk, C * 128), 1);
    wg::wg_commit();
    chunk_decays(s_gam, s_eg, s_el, L, tid);
    wg::wait_acc(a1[0]);
    ds_epilogue(a1, m0, n0, L, p.scale, s_gam, s_dsd, [&](int r, int c, float y0, float y1) {
      store2(reinterpret_cast<bf16*>(smem + S::ds + swe(r, c)), y0, y1);
    });
  }
  cp_wait<1>();
  wg::fence_proxy_async();
  __syncthreads();  // K, S0, (Q,) ds
  const int m0 = 16 * w4, n0 = 64 * wgi;
  const bool active = m0 < L;
  // 2. dq = scale e^gamma (dO S0^T) + ds K: m64n64 x 8, scale, m64n64 x 4
  float acc[1][8][4];
  zero(acc);
  wg::wg_fence();
#pragma unroll
  for (int kk = 0; kk < 8; ++kk)
    m64n64k16_ss<0, 0>(acc[0], dk_(sb + S::x1, kk, C * 128), dk_(sb + S::s0 + wgi * 8192, kk, D * 128), 1);
  wg::wg_commit();
  wg::wait_acc(acc[0]);
  frag_pairs(acc, m0, n0, [&](int r, int, float& x0, float& x1) {
    const float f = p.scale * s_eg[r];
    x0 *= f, x1 *= f;
  });
  float acc5[1][8][4];  // step 5's ds^T Q (+ diag(ds) Q): dk's intra part
  zero(acc5);
  wg::wg_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    m64n64k16_ss<0, 1>(acc[0], dk_(sb + S::ds, kk, 0), dm_(sb + S::k + wgi * C * 128, kk), 1);
  wg::wg_commit();
  cp_wait<0>();
  wg::fence_proxy_async();
  __syncthreads();  // Q (ds K runs meanwhile)
  // acc5's zeros are ordinary register writes that the compiler may place after 2b's fence: PTX
  // wants a wgmma.fence between them and the first wgmma on acc5 (2b's in-flight group is untouched)
  wg::wg_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    m64n64k16_ss<1, 1>(acc5[0], dm_(sb + S::ds, kk), dm_(sb + S::q + wgi * C * 128, kk), 1);
  wg::wg_commit();
  wg::wg_hold(acc5[0]);
  wg::wg_hold(acc[0]);
  wg::wg_wait<1>();
  wg::wg_hold(acc[0]);
  // dq epilogue: row dots with q (before the diag term) -> s_red; + diag(ds) k; stored (or summed below)
  rowdot_wg(acc[0], m0, wgi, s_red, lane,
            [&](int r, int c) { return load2(reinterpret_cast<const bf16*>(smem + S::q + swe(r, c))); });
  {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const int r = m0 + g + 8 * h2, c = n0 + 8 * j + 2 * t;
        const float2 kk = load2(reinterpret_cast<const bf16*>(smem + S::k + swe(r, c)));
        float& x0 = acc[0][j][2 * h2];
        float& x1 = acc[0][j][2 * h2 + 1];
        const float y0 = fmaf(s_dsd[r], kk.x, x0), y1 = fmaf(s_dsd[r], kk.y, x1);
        if (p.pair) {
          x0 = y0, x1 = y1;
        } else if (r < L) {
          const int64_t i = (ci.bos * p.Hv + int64_t(r) * p.Hv + ci.h) * D + c;
          if (p.G == 1) store2(g_dq + i, y0, y1);
          else store2(g_dqh + i, y0, y1);
        }
      }
  }
  if (p.pair) {  // 2b. dq of the key head through the dO tile (every warp's wgmma on dO waited)
    __syncthreads();
    float* xbuf = reinterpret_cast<float*>(smem + S::x1);
    auto& acc2 = reinterpret_cast<float(&)[2][4][4]>(acc);
    const bool sum = pair_sum_mode(acc2, xbuf, s_bars, p.pair);
    if (sum && active) store_frags(g_dq + qrow * D, int64_t(p.Hk) * D, acc, m0, n0, L, D);
    if (p.pair == kPairPull) cluster_wait();
  }
  wg::wait_acc(acc5[0]);
  // step 5's intra part now: (ds^T Q) . k -> s_red3, then + diag(ds) q (Q, K and ds are dead after this)
  rowdot_wg(acc5[0], m0, wgi, s_red3, lane,
            [&](int r, int c) { return load2(reinterpret_cast<const bf16*>(smem + S::k + swe(r, c))); });
  uint32_t kp[2][8];  // K at this thread's fragment pairs, kept for step 5's row dots once dS1 is over K
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2)
#pragma unroll
    for (int j = 0; j < 8; ++j) kp[h2][j] = *reinterpret_cast<const uint32_t*>(smem + S::k + swe(m0 + g + 8 * h2, n0 + 8 * j + 2 * t));
  frag_pairs(acc5, m0, n0, [&](int r, int c, float& x0, float& x1) {
    const float2 qq = load2(reinterpret_cast<const bf16*>(smem + S::q + swe(r, c)));
    x0 = fmaf(s_dsd[r], qq.x, x0);
    x1 = fmaf(s_dsd[r], qq.y, x1);
  });
  if (p.done && tid == 0) serial_wait(p, ci.c);
  __syncthreads();  // dO (and its pair buffer), K, Q dead
  if (tid < C) s_dgq[tid] = s_red[tid] + s_red[C + tid] + s_red[2 * C + tid] + s_red[3 * C + tid];
  load_state_sw128(smem + S::d1, g_dS1 + sbase, tid);
  cp_commit();
  load_dk_rows<kChunkThreads, true>(smem + S::x1, g_dD + vrow * D, int64_t(p.Hv) * D, L == C, L, D, tid);
  cp_commit();
  cp_wait<1>();
  wg::fence_proxy_async();
  __syncthreads();  // dS1
  {  // 5. dk = eL (Delta dS1^T) + [ds^T Q + diag(ds) Q]
    float st[1][8][4];
    zero(st);
    wg::wg_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
      m64n64k16_ss<0, 0>(st[0], dk_(sb + S::dl, kk, C * 128), dk_(sb + S::d1 + wgi * 8192, kk, D * 128), 1);
    wg::wg_commit();
    state_dot_sw(s_ws, smem + S::s0, smem + S::d1, tid);  // 4. sum(S0 (.) dS1) under the product
    wg::wait_acc(st[0]);
    frag_pairs(st, m0, n0, [&](int r, int, float& x0, float& x1) {
      const float f = s_el[r];
      x0 *= f, x1 *= f;
    });
    rowdot_kp(st[0], kp, m0, wgi, s_red2, lane);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc5[0][j][e] = st[0][j][e] + acc5[0][j][e];  // today's r_st + fmaf(dsd, q, ds^T Q)
    if (!p.pair && active)
      frag_pairs(acc5, m0, n0, [&](int r, int c, float& x0, float& x1) {
        if (r < L) store2(g_dkh + (vrow + int64_t(r) * p.Hv) * D + c, x0, x1);
      });
  }
  cp_wait<0>();
  wg::fence_proxy_async();
  __syncthreads();  // dDelta
  {  // 3. dW = -dDelta S0^T
    float w[1][8][4];
    zero(w);
    wg::wg_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
      m64n64k16_ss<0, 0>(w[0], dk_(sb + S::x1, kk, C * 128), dk_(sb + S::s0 + wgi * 8192, kk, D * 128), 1);
    wg::wg_commit();
    wg::wait_acc(w[0]);
    if (active) store_frags(g_dW + vrow * D, int64_t(p.Hv) * D, w, m0, n0, L, D, [](int, float& x0, float& x1) { x0 = -x0, x1 = -x1; });
  }
  __syncthreads();  // S0 dead (dW waited in every warp, state_dot done)
  if (p.pair) {
    float* xbuf = reinterpret_cast<float*>(smem + S::s0);
    auto& acc2 = reinterpret_cast<float(&)[2][4][4]>(acc5);
    const bool sum = pair_sum_mode(acc2, xbuf, s_bars + 2, p.pair, false);
    if (p.pair == kPairPush) {
      dgamma_rows(g_dgam + vrow, p.Hv, s_dgq, s_red3, s_red2, s_ws, s_eg, L, sum ? C : (warp & 3) * 32 + lane);
      if (sum && active) store_frags(g_dkh + qrow * D, int64_t(p.Hk) * D, acc5, m0, n0, L, D);
      return;
    }
    if (sum && active) store_frags(g_dkh + qrow * D, int64_t(p.Hk) * D, acc5, m0, n0, L, D);
    if (p.pair == kPairPull) cluster_wait();
  }
  dgamma_rows(g_dgam + vrow, p.Hv, s_dgq, s_red3, s_red2, s_ws, s_eg, L, tid);
}

// ---- out through wgmma (bf16, dk = dv = 128, sm_90a; DT_GDN_OUT=wgmma; docs/out-wgmma-design.md) ----
// out_kernel's products and epilogues with every product an SS wgmma from 128-byte-swizzled atoms:
// no ldmatrix, no mma.sync. P = (Q K^T) (.) Gamma runs first, from Q and K alone (both inputs of
// earlier kernels), so it overlaps the wait for the state kernel (serial_wait) instead of following
// O = Q h_c; h_c and Delta (the state kernel's outputs) then load in one phase, Delta over K.
// P's product is m64n32 per warpgroup (a warp's accumulator is p_tile's warp tile, rounded the same
// way); O's are m64n64 (warpgroup wgi: columns 64 wgi .., a warp 16 rows x 64 columns). The norm
// epilogue reads z straight from global memory into registers (prefetched while h_c and Delta
// load) and stages the rounded o tile in h_c's dead atoms; its row loop is out_kernel's (tpr = 16
// lanes a row, the same sums and roundings). P Delta runs its 4 token k-steps whatever L: P's
// columns >= L and Delta's rows >= L are exact zeros. Meant to give out_kernel's bits (same k
// order, same roundings); GdnChunkCuda.OutWgmmaSameBits checks.
struct OutWgSmem {
  static constexpr size_t q = 0;          // Q [C][128] (2 atoms)
  static constexpr size_t k = 16384;      // K [C][128]; after P, Delta
  static constexpr size_t d = k;
  static constexpr size_t hs = 32768;     // h_c [D][128] (2 atoms [D][64], 16 KB apart); then o (norm)
  static constexpr size_t pm = 65536;     // P [C][64] (one atom)
  static constexpr size_t gam = 73728;    // f32 [C]
  static constexpr size_t bytes = gam + 4 * C;
};
static_assert(3 * (OutWgSmem::bytes + kSmemReservedPerCta) <= kSmemPerSm, "out_wg_kernel: three CTAs per SM");
static_assert(OutWgSmem::k % 1024 == 0 && OutWgSmem::hs % 1024 == 0 && OutWgSmem::pm % 1024 == 0 &&
                  OutWgSmem::hs - OutWgSmem::k == 2 * C * 128 && OutWgSmem::pm - OutWgSmem::hs == 2 * D * 128,
              "out_wg_kernel: 1 KB atoms");

namespace outw {
constexpr int kTpr = 16;  // the norm's lanes per row at dv = 128 (out_norm's tpr)
}  // namespace outw

__global__ __launch_bounds__(kChunkThreads, 3) void out_wg_kernel(
    Params p, const bf16* __restrict__ g_q, const bf16* __restrict__ g_k, const float* __restrict__ g_gam,
    const bf16* __restrict__ g_h, const bf16* __restrict__ g_D, bf16* __restrict__ g_o, bf16* __restrict__ g_P,
    const OutNorm nrm) {
  extern __shared__ __align__(1024) unsigned char smem[];
  using S = OutWgSmem;
  using namespace wyw;
  using namespace outw;
  using wg::m64n32k16_ss;
  using wg::m64n64k16_ss;
  const uint32_t sb = smem_base_1k(smem);
  float* s_gam = reinterpret_cast<float*>(smem + S::gam);
  const ChunkIdx ci = chunk_idx(p);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, L = ci.L;
  const int w4 = warp & 3, wgi = warp >> 2, g = lane >> 2, t = lane & 3;
  const int64_t qrow = ci.bos * p.Hk + ci.hk, vrow = ci.bos * p.Hv + ci.h;
  const bool norm = nrm.z != nullptr;
  // phase I: Q, K, gamma (inputs of earlier kernels: no serial_wait before them)
  load_dk_rows<kChunkThreads, true>(smem + S::q, g_q + qrow * D, int64_t(p.Hk) * D, L == C, L, D, tid);
  load_dk_rows<kChunkThreads, true>(smem + S::k, g_k + qrow * D, int64_t(p.Hk) * D, L == C, L, D, tid);
  load_col(s_gam, g_gam + vrow, p.Hv, C, L, tid, kChunkThreads);
  cp_commit();
  cp_wait<0>();
  wg::fence_proxy_async();
  __syncthreads();  // Q, K, gamma
  {  // P = (Q K^T) (.) Gamma, j <= i < L: p_tile's warp tile (rows 16 w4, columns 32 wgi) and rounding
    const int m0 = 16 * w4, n0 = 32 * wgi;
    float pa[4][4];
    zero_tiles(pa);
    wg::wg_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)  // P[64, 32 wgi..] = Q[64, dk] K^T[dk, 32]
      m64n32k16_ss<0, 0>(pa, dk_(sb + S::q, kk, C * 128), dk_(sb + S::k + wgi * 4096, kk, C * 128), 1);
    wg::wg_commit();
    wg::wait_acc(pa);
#pragma unroll
    for (int q2 = 0; q2 < 2; ++q2) {  // matrices (j, h2) = (2 q2 + m / 2, m % 2) -> P's atom (stmatrix)
      uint32_t rr[4];
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int j = 2 * q2 + (m >> 1), h2 = m & 1, r = m0 + g + 8 * h2, c = n0 + 8 * j + 2 * t;
        const bool rv = r < L;
        rr[m] = pack_bf16((rv && c <= r) ? pa[j][2 * h2] * gexp(s_gam[r] - s_gam[c]) : 0.f,
                          (rv && c + 1 <= r) ? pa[j][2 * h2 + 1] * gexp(s_gam[r] - s_gam[c + 1]) : 0.f);
      }
      const int mi = lane >> 3;
      stsm_x4_sa(sb + uint32_t(S::pm) + wg::sw128(m0 + 8 * (mi & 1) + (lane & 7), 4 * wgi + 2 * q2 + (mi >> 1)), rr);
    }
  }
  wg::fence_proxy_async();                   // P's stores -> P Delta (async proxy)
  if (p.done && tid == 0) serial_wait(p, ci.c);  // h_c and Delta come from the state kernel (with_serial_pdl)
  __syncthreads();                           // P written; K dead (every warp waited Q K^T); the wait published
  // phase II: h_c, Delta over K
  load_state_sw128(smem + S::hs, g_h + (int64_t(ci.c) * p.Hv + ci.h) * (D * D), tid);
  load_dk_rows<kChunkThreads, true>(smem + S::d, g_D + vrow * D, int64_t(p.Hv) * D, L == C, L, D, tid);
  cp_commit();
  if (g_P) {  // P for dvl (saved intermediates): store_p's [C][C] rows, 16-byte vectors
    bf16* gp = g_P + (int64_t(ci.c) * p.Hv + ci.h) * C * C;
#pragma unroll
    for (int i = 0; i < C * C / 8 / kChunkThreads; ++i) {
      const int idx = tid + i * kChunkThreads;  // 16-byte vector idx: row idx / 8, chunk idx % 8
      *reinterpret_cast<uint4*>(gp + 8 * idx) = *reinterpret_cast<const uint4*>(smem + S::pm + wg::sw128(idx >> 3, idx & 7));
    }
  }
  // the norm's z slots of this thread (rows grp + 16 i, columns 8 ln ..), loaded under phase II
  const int ln = tid & (kTpr - 1), grp = tid / kTpr;
  uint4 r_zr[C / (kChunkThreads / kTpr)];
  if (norm) {
#pragma unroll
    for (int i = 0; i < C / (kChunkThreads / kTpr); ++i) {
      const int r = grp + i * (kChunkThreads / kTpr);
      r_zr[i] = r < L ? __ldg(reinterpret_cast<const uint4*>(static_cast<const bf16*>(nrm.z) + (ci.bos + r) * nrm.sz +
                                                             int64_t(ci.h) * D + 8 * ln))
                      : make_uint4(0, 0, 0, 0);
    }
  }
  cp_wait<0>();
  wg::fence_proxy_async();
  __syncthreads();  // h_c, Delta
  const int m0 = 16 * w4, n0 = 64 * wgi;
  float acc[8][4];
  zero_tiles(acc);
  wg::wg_fence();
#pragma unroll
  for (int kk = 0; kk < 8; ++kk)  // O[64, 64 wgi..] = Q[64, dk] h_c[dk, 64]
    m64n64k16_ss<0, 1>(acc, dk_(sb + S::q, kk, C * 128), dm_(sb + S::hs + wgi * (D * 128), kk, D * 128), 1);
  wg::wg_commit();
  wg::wait_acc(acc);
  {  // O = diag(e^gamma) O
    const int r0 = m0 + g;
    const float e0 = r0 < L ? gexp(s_gam[r0]) : 0.f, e1 = r0 + 8 < L ? gexp(s_gam[r0 + 8]) : 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      acc[j][0] *= e0, acc[j][1] *= e0;
      acc[j][2] *= e1, acc[j][3] *= e1;
    }
  }
  wg::wg_hold(acc);  // the scaled values before the fence (else the multiplies sink past it: C7519)
  wg::wg_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)  // O[64, 64 wgi..] += P[64, C] Delta[C, 64]
    m64n64k16_ss<0, 1>(acc, dk_(sb + S::pm, kk, 0), dm_(sb + S::d + wgi * (C * 128), kk), 1);
  wg::wg_commit();
  wg::wait_acc(acc);
  if (!norm) {
    if (m0 < L)
      store_frags(g_o + vrow * D, int64_t(p.Hv) * D, reinterpret_cast<const float(&)[1][8][4]>(acc), m0, n0, L, D,
                  [&](int, float& x0, float& x1) { x0 = p.scale * x0, x1 = p.scale * x1; });
    return;
  }
  // Epilogue: the rounded o tile into h_c's atom wgi (rows 0 .. C - 1), once this warpgroup's four
  // warps have waited their products (the other warpgroup reads only its own atom), then
  // out_kernel's row loop: kTpr lanes per row, o and y rows out in 16-byte slots, rstd per row.
  if (wgi == 0) asm volatile("bar.sync 1, 128;" ::: "memory");  // immediate ids: ptxas counts 2 barriers, not 16
  else asm volatile("bar.sync 2, 128;" ::: "memory");
#pragma unroll
  for (int q2 = 0; q2 < 4; ++q2) {  // matrices (j, h2) = (2 q2 + m / 2, m % 2)
    uint32_t rr[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int j = 2 * q2 + (m >> 1), h2 = m & 1;
      rr[m] = pack_bf16(p.scale * acc[j][2 * h2], p.scale * acc[j][2 * h2 + 1]);
    }
    const int mi = lane >> 3;
    stsm_x4_sa(sb + uint32_t(S::hs) + wgi * (D * 128) + wg::sw128(m0 + 8 * (mi & 1) + (lane & 7), 2 * q2 + (mi >> 1)), rr);
  }
  __syncthreads();  // the o tile
  constexpr int V = 8, GPB = kChunkThreads / kTpr;
  float r_w[V];
  ew::load_param<V>(nrm.w, int64_t(ln) * V, D, nrm.w_vec != 0, r_w);
  const float inv_d = 1.f / float(p.dv);
#pragma unroll
  for (int i = 0; i < C / GPB; ++i) {
    const int r = grp + i * GPB, e0 = ln * V;
    // the o tile in h_c's atoms (rows 0 .. C - 1 of each)
    const uint4 ov = *reinterpret_cast<const uint4*>(smem + S::hs + swe(r, e0, D * 128));
    float r_o[V], r_z[V];
    ew::unpack16<bf16>(ov, r_o);
    ew::unpack16<bf16>(r_zr[i], r_z);
    float r_ss = 0.f;
#pragma unroll
    for (int e = 0; e < V; ++e) r_ss = fmaf(r_o[e], r_o[e], r_ss);
    r_ss = ew::group_sum(r_ss, kTpr);
    const float r_rstd = rsqrtf(r_ss * inv_d + nrm.eps);
    if (r >= L) continue;
    const int64_t tt = ci.bos + r;
    *reinterpret_cast<uint4*>(g_o + (tt * p.Hv + ci.h) * D + e0) = ov;
    float r_y[V];
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float z = r_z[e];
      r_y[e] = r_o[e] * r_rstd * r_w[e] * (z * ew::sigmoid_f(z));
    }
    ew::store16<bf16>(static_cast<bf16*>(nrm.y) + tt * nrm.sy + int64_t(ci.h) * D + e0, r_y);  // store_slot's whole-slot form
    if (ln == 0) nrm.rstd[tt * p.Hv + ci.h] = r_rstd;
  }
}

// ---- gsum (B12): out[t, hk, :] = sum_{j < G} in[t, hk G + j, :] in head order -------------------
// With in2 (dk: in2 = wy's parts, in = dqk's): (sum_j in2[.., j, :]) + (sum_j in[.., j, :]), the order
// in which the G == 2 clusters add them (dqk sums its pair, wy its pair, then adds dqk's).
__device__ __forceinline__ float4 head_sum(const float* src, int G, int d) {
  float4 s = __ldg(reinterpret_cast<const float4*>(src));
  for (int j = 1; j < G; ++j) {
    const float4 x = __ldg(reinterpret_cast<const float4*>(src + int64_t(j) * d));
    s.x += x.x, s.y += x.y, s.z += x.z, s.w += x.w;
  }
  return s;
}
template <class T>
__global__ void gsum_kernel(const float* __restrict__ g_in, const float* __restrict__ g_in2, T* __restrict__ g_out,
                            int64_t rows, int G, int d) {
  const int64_t n4 = rows * d / 4;  // d % 16 == 0: four consecutive elements per thread
  for (int64_t i4 = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i4 < n4; i4 += int64_t(gridDim.x) * blockDim.x) {
    const int64_t idx = 4 * i4, r = idx / d, c = idx - r * d;
    float4 s = head_sum(g_in + r * G * d + c, G, d);
    if (g_in2) {
      const float4 a = head_sum(g_in2 + r * G * d + c, G, d);
      s = make_float4(a.x + s.x, a.y + s.y, a.z + s.z, a.w + s.w);
    }
    store2(g_out + idx, s.x, s.y);
    store2(g_out + idx + 2, s.z, s.w);
  }
}

// Shared memory stays under the 227 KB a block may use on sm_90 (kMaxSmem).
static_assert(PrepSmem<float>::bytes <= kMaxSmem && StateSmem<float, 2>::bytes <= kMaxSmem &&
              OutSmem<float>::bytes <= kMaxSmem && RevSmem<float, 1>::bytes <= kMaxSmem &&
              DqkSmem<float>::bytes <= kMaxSmem && WySmem<float>::bytes <= kMaxSmem, "smem budget");

// ================================================================================= launchers
struct NvtxRange {
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
};

inline bool absent(const TensorView& v) { return v.data == nullptr || v.numel() == 0; }

template <class K>
void set_smem(K kernel, size_t bytes) {
  DT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

struct Dims {
  int64_t T, N, NT, Hk, Hv, dk, dv;
};

// Shape s, dtype t (q's) and device dev (q's).
void check_like_q(const TensorView& x, const Shape& s, DType t, Device dev, const char* op, const char* name) {
  DT_CHECK(x.shape == s, "cuda::{}: {} must be {}, got {}", op, name, s.str(), x.str());
  DT_CHECK(x.dtype == t, "cuda::{}: {} must be {} like q, got {}", op, name, dtype_name(t), x.str());
  DT_CHECK(x.device == dev, "cuda::{}: {} must be on {} like q, got {}", op, name, dev.str(), x.str());
}
void check_act(const TensorView& x, const Shape& s, DType t, Device dev, const char* op, const char* name) {
  check_like_q(x, s, t, dev, op, name);
  DT_CHECK(x.is_contiguous(), "cuda::{}: {} must be contiguous, got {}", op, name, x.str());
  DT_CHECK(reinterpret_cast<uintptr_t>(x.data) % 16 == 0 || x.numel() == 0,
           "cuda::{}: {} must be 16-byte aligned, got {}", op, name, x.str());
}
// [T, H, d] with packed [H, d] rows and any token stride that keeps every row 16-byte aligned
// (v, dv: column views of a wider buffer, such as the conv output, read / written in place).
void check_token_rows(const TensorView& x, const Shape& s, DType t, Device dev, const char* op, const char* name) {
  check_like_q(x, s, t, dev, op, name);
  DT_CHECK(x.numel() == 0 || (x.stride[2] == 1 && x.stride[1] == s[2]),
           "cuda::{}: {} must have packed [{}, {}] rows (strides [*, {}, 1]), got {}", op, name, s[1], s[2], s[2],
           x.str());
  const int64_t vec = 16 / int64_t(dtype_size(t));
  DT_CHECK(x.numel() == 0 || (x.stride[0] >= s[1] * s[2] && x.stride[0] % vec == 0 &&
                              reinterpret_cast<uintptr_t>(x.data) % 16 == 0),
           "cuda::{}: {} needs a 16-byte aligned start and a token stride >= {} that is a multiple of {} elements, got "
           "{}",
           op, name, s[1] * s[2], vec, x.str());
}
void check_state(const TensorView& x, const Dims& d, Device dev, const char* op, const char* name) {
  if (absent(x)) return;
  check_act(x, Shape{d.N, d.Hv, d.dk, d.dv}, DType::f32, dev, op, name);
}

Dims check_common(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                  const TensorView& beta, const VarlenMeta& m, const char* op) {
  DT_CHECK(q.ndim() == 3, "cuda::{}: q must be [T, Hk, dk], got {}", op, q.str());
  DT_CHECK(v.ndim() == 3, "cuda::{}: v must be [T, Hv, dv], got {}", op, v.str());
  DT_CHECK(q.device.is_cuda(), "cuda::{}: q must be a CUDA tensor, got {}", op, q.str());
  DT_CHECK(q.dtype == DType::bf16 || q.dtype == DType::f32, "cuda::{}: q must be bf16 or f32, got {}", op, q.str());
  Dims d{q.shape[0], m.num_seqs, m.num_chunks, q.shape[1], v.shape[1], q.shape[2], v.shape[2]};
  DT_CHECK(d.dk % 16 == 0 && d.dk >= 16 && d.dk <= D && d.dv % 16 == 0 && d.dv >= 16 && d.dv <= D,
           "cuda::{}: head dims dk = {}, dv = {} must be multiples of 16 in [16, {}]", op, d.dk, d.dv, D);
  DT_CHECK(d.Hk > 0 && d.Hv % d.Hk == 0, "cuda::{}: Hv = {} must be a multiple of Hk = {}", op, d.Hv, d.Hk);
  DT_CHECK(m.total == d.T, "cuda::{}: cu_seqlens ends at {} but q has {} tokens ({})", op, m.total, d.T, q.str());
  DT_CHECK(d.N == 0 || (m.cu_dev && m.chunk_start_dev && m.chunk_offsets_dev && m.seq_order_dev),
           "cuda::{}: the VarlenMeta has no device arrays (build the VarlenBatch on the CUDA device)", op);
  DT_CHECK(d.T < (int64_t(1) << 31), "cuda::{}: T = {} exceeds int32 cu_seqlens", op, d.T);
  check_act(k, q.shape, q.dtype, q.device, op, "k");
  check_act(q, q.shape, q.dtype, q.device, op, "q");
  check_token_rows(v, Shape{d.T, d.Hv, d.dv}, q.dtype, q.device, op, "v");
  check_act(g, Shape{d.T, d.Hv}, DType::f32, q.device, op, "g");
  check_act(beta, Shape{d.T, d.Hv}, DType::f32, q.device, op, "beta");
  return d;
}

Params make_params(const Dims& d, const GdnArgs& args, const VarlenMeta& m) {
  Params p;
  p.T = d.T;
  p.sv = p.sdv = d.Hv * d.dv;
  p.N = int(d.N);
  p.NT = int(d.NT);
  p.Hk = int(d.Hk);
  p.Hv = int(d.Hv);
  p.G = int(d.Hv / d.Hk);
  p.dk = int(d.dk);
  p.dv = int(d.dv);
  p.nvt = int((d.dv + BV - 1) / BV);
  p.pair = 0;
  p.c0 = 0;
  p.scale = args.scale != 0.0f ? args.scale : float(1.0 / std::sqrt(double(d.dk)));
  p.cu = m.cu_dev;
  p.chunk_start = m.chunk_start_dev;
  p.chunk_off = m.chunk_offsets_dev;
  p.seq_order = m.seq_order_dev;
  p.chunk_seq = m.chunk_seq_dev;
  p.done = nullptr;
  p.done_target = 0;
  return p;
}

// Grid of the serial kernels (seq_cta): N * Hv * nvt CTAs on x.
unsigned seq_ctas(const Params& p) {
  const int64_t n = int64_t(p.N) * p.Hv * p.nvt;
  DT_CHECK(n < (int64_t(1) << 31), "gdn_chunk: {} sequences x {} v-heads x {} V tiles exceed the grid", p.N, p.Hv,
           p.nvt);
  return unsigned(n);
}

// An attribute of the current device that never changes (> 0), queried once per device into cache.
constexpr int kDevs = 64;
int device_attr(cudaDeviceAttr attr, std::atomic<int> (&cache)[kDevs]) {
  int dev = 0, n = 0;
  DT_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev >= 0 && dev < kDevs && (n = cache[dev].load(std::memory_order_relaxed)) > 0) return n;
  DT_CUDA_CHECK(cudaDeviceGetAttribute(&n, attr, dev));
  if (dev >= 0 && dev < kDevs) cache[dev].store(n, std::memory_order_relaxed);
  return n;
}
// Multiprocessors of the current device.
int sm_count() {
  static std::atomic<int> cache[kDevs];  // 0: not queried yet
  return device_attr(cudaDevAttrMultiProcessorCount, cache);
}
// The current device's compute capability major (9: Hopper).
int cc_major() {
  static std::atomic<int> cache[kDevs];
  return device_attr(cudaDevAttrComputeCapabilityMajor, cache);
}

// A forced stage count from the environment (`var`=1 or 2; for A/B benchmarks and the one-vs-two
// stage test), 0 when unset or empty (automatic choice).
int forced_stages(const char* var) {
  return env::choice(var, {{"1", "one-stage tile loads"}, {"2", "double-buffered tile loads"}}) + 1;
}

// rev_kernel's stage count. Automatic: 2 when the serial grid fits one CTA per SM (ctas <= SMs),
// where two stages' shared memory (bf16 156.5 KB: one CTA per SM) costs no occupancy; otherwise 1
// (87.3 KB: two CTAs per SM, which hide each other's load latency). f32 inputs: always 1 (two
// stages do not fit, RevSmem). DT_GDN_REV_STAGES=1|2 forces it (2 with f32 inputs is an error).
template <class T>
int rev_stages(unsigned ctas) {
  if (const int forced = forced_stages("DT_GDN_REV_STAGES")) {
    DT_CHECK(forced <= kRevMaxStages<T>,
             "DT_GDN_REV_STAGES=2 needs bf16 inputs: the f32 rev_kernel has one stage only (two stages of f32 "
             "tiles take {} bytes of shared memory, over the {} a CTA may use); set 1 or unset it",
             RevSmem<float, 2>::bytes, kMaxSmem);
    return forced;
  }
  return kRevMaxStages<T> == 2 && int64_t(ctas) <= int64_t(sm_count()) ? 2 : 1;
}

// state_kernel's stage count: 2 (two stages cost it no occupancy at either dtype, StateSmem);
// DT_GDN_STATE_STAGES=1|2 forces it.
int state_stages() {
  const int forced = forced_stages("DT_GDN_STATE_STAGES");
  return forced ? forced : 2;
}

// Which serial kernels (state K4, rev B4) run. DT_GDN_SERIAL=tile: the CTA-tiled kernels (8 warps
// share a [dk, 64] state tile; both dtypes); warp4 / warp8: gdn_serial_warp.cuh's warp-owned rows
// of the transposed state (4 warps and a 64-wide V tile, or 8 warps and 128; bf16 only); split2 /
// split4: gdn_serial_split.cuh's 2 or 4 warps per 16 rows (bf16; dk = 128, another dk runs warp4);
// wg4: warp4 with the serial kernels' products as wgmma (sm_90a, dk = 128, dv % 64 == 0; otherwise
// warp4). The same bits as warp4 (measured on an H200: wgmma sums the products in mma.sync's
// order) and faster (state 693 -> 653 us, rev 922 -> 870 us at the layer's shape, v0.14.0).
// Unset or empty: wg4 for bf16 (where it applies, else warp4), tile for f32. Read at every launch.
constexpr const char* kSerialNames[] = {"tile", "warp4", "warp8", "split2", "split4", "wg4"};
constexpr int kDefaultSerialBf16 = 5;  // wg4 since v0.14.0 (warp4 since v0.8.0 before it)
// warps > 0: the warp-owned form with that many warps; split > 0: the split form with G = split;
// both 0: the tiled form.
struct SerialForm {
  int warps = 0, split = 0;
  bool wg = false;  // warps == 4: the state kernel through wgmma (rev too, rev_wgmma_knob)
};
// Whether this device runs the wgmma kernels: sm_90 exactly (wgmma is sm_90a's; the build's
// sm_90a code does not run on later majors).
bool wgmma_device() { return cc_major() == 9; }
// One chooser for the three mma/wgmma knobs below: unset or empty (-1) and wgmma (1) pick the
// wgmma kernel (bf16, dk = dv = 128, sm_90; other cases keep the mma one); mma (0) the mma.sync one.
// Read at every call, so one build compares both; the meanings are literals, so a read builds nothing.
#define DT_WGMMA_MEANING(k) k "_wg_kernel: wgmma from swizzled tiles (bf16, dk = dv = 128, sm_90)"
#define DT_MMA_MEANING(k) k "_kernel: mma.sync from padded tiles"
bool wgmma_knob(const char* var, const char* mma_meaning, const char* wg_meaning) {
  return env::choice(var, {{"mma", mma_meaning}, {"wgmma", wg_meaning}}) != 0;
}
// DT_GDN_WY: wgmma (unset: the default since v0.40.0) | mma: the WY backward as wy_wg_kernel or
// wy_kernel. The same bits; wgmma 16% faster (888 -> 746 us at the layer's shape, H100).
std::atomic<int64_t> g_wy_wg_launches{0};  // wy_wg_launches()
bool wy_wgmma_knob() { return wgmma_knob("DT_GDN_WY", DT_MMA_MEANING("wy"), DT_WGMMA_MEANING("wy")); }
// DT_GDN_DQK: wgmma (unset: the default since v0.40.0) | mma: dqk as dqk_wg_kernel or dqk_kernel.
// Every launch mode is the same for both: pair clusters, gsum's partials, slabs, serial_wait after
// rev. The same bits; wgmma 18% faster (1302 -> 1071 us at the layer's shape, H100).
std::atomic<int64_t> g_dqk_wg_launches{0};  // dqk_wg_launches()
bool dqk_wgmma_knob() { return wgmma_knob("DT_GDN_DQK", DT_MMA_MEANING("dqk"), DT_WGMMA_MEANING("dqk")); }
// DT_GDN_OUT: wgmma (unset: the default since v0.42.0) | mma: the forward's out kernel as
// out_wg_kernel or out_kernel (docs/out-wgmma-design.md). The same bits
// (GdnChunkCuda.OutWgmmaSameBits); wgmma 16% faster (590 -> 497 us at the layer's shape, H200).
std::atomic<int64_t> g_out_wg_launches{0};  // out_wg_launches()
bool out_wgmma_knob() { return wgmma_knob("DT_GDN_OUT", DT_MMA_MEANING("out"), DT_WGMMA_MEANING("out")); }
#undef DT_MMA_MEANING
#undef DT_WGMMA_MEANING
template <class T>
SerialForm serial_form(int dk, int dv) {
  const int i = env::choice("DT_GDN_SERIAL", {{kSerialNames[0], "CTA-tiled serial kernels"},
                                              {kSerialNames[1], "warp-owned state rows, 4 warps, bf16"},
                                              {kSerialNames[2], "warp-owned state rows, 8 warps, bf16"},
                                              {kSerialNames[3], "2 warps per 16 state rows, bf16, dk 128"},
                                              {kSerialNames[4], "4 warps per 16 state rows, bf16, dk 128"},
                                              {kSerialNames[5], "warp4 with the products as wgmma, bf16, dk 128"}});
  DT_CHECK(i <= 0 || sizeof(T) == 2, "DT_GDN_SERIAL={} needs bf16 inputs: the warp-owned and split serial kernels are "
                                     "bf16 only; set tile or unset it",
           kSerialNames[i < 0 ? 0 : i]);
  const int f = i >= 0 ? i : sizeof(T) == 2 ? kDefaultSerialBf16 : 0;  // unset: the dtype's default
  switch (f) {
    case 0: return {};
    case 1: return {4, 0};
    case 2: return {8, 0};
    case 5: return {4, 0, dk == D && dv % 64 == 0 && wgmma_device()};
    default: return dk == D ? SerialForm{0, f == 3 ? 2 : 4} : SerialForm{4, 0};  // split: dk = 128 only
  }
}
// DT_GDN_REV_WGMMA: 1 or unset: with wg4, the rev kernel through wgmma too; 0: wg4's rev kernel is
// warp4's (the state kernel alone through wgmma).
bool rev_wgmma_knob() {
  return env::choice("DT_GDN_REV_WGMMA", {{"0", "wg4's rev kernel as warp4's"}, {"1", "wg4's rev kernel through wgmma"}}) !=
         0;
}
// DT_GDN_REV_KSPLIT: 1: wg4's rev kernel, when it runs with one stage, loads K and gamma a step ahead
// into two buffers and the rest of a chunk's tiles at its step's start, awaited after the first
// product (WgRevSmemKS); 0 or unset: one load of every tile per step. Measured (v0.19.0): rev 864 ->
// 847 us under ncu, the layer's A/B within noise, so off. The same bits either way. Read at every call.
bool rev_ksplit_knob() {
  return env::choice("DT_GDN_REV_KSPLIT", {{"0", "every tile at the step's start (default)"},
                                           {"1", "K and gamma a step ahead, the rest awaited after step 1"}}) == 1;
}
// DT_GDN_REV_P: 1 or unset: wg4's rev kernel (without K split) makes dDelta_local = scale P^T dO
// itself from P (the forward's, or dvl's when not saved), kept in fp32 on its way into dDelta, so
// dvl neither multiplies nor writes it and rev loads P [C][C] instead of its [C][BV] rows (-0.4 GB
// at the layer shape); 0: dvl makes it (bf16) and rev loads it, warp4's bits. Read at every call.
bool rev_p_knob() {
  return env::choice("DT_GDN_REV_P", {{"0", "dvl makes dDelta_local, rev loads it"},
                                      {"1", "rev makes dDelta_local from P (wg4 without K split)"}}) != 0;
}
// The serial grid in V tiles of 16 * nw columns.
Params warp_params(Params p, int nw) {
  p.nvt = (p.dv + 16 * nw - 1) / (16 * nw);
  return p;
}

template <class T>
T* tptr(const TensorView& v) {
  return absent(v) ? nullptr : static_cast<T*>(v.data);
}

// DT_GDN_GQA_PAIR=2 or unset: with G == 2 on sm_90 and newer, dqk and wy run as clusters of the
// key head's two v-heads and sum dq and dk there, the exchange pushed through st.async and
// mbarriers (pair_sum_push; the default since v0.18.0: dqk 1469 -> 1432 us under ncu); 1: the same
// clusters pulling the partner's fragments behind a fenced cluster barrier (pair_sum); 0: per-v-head
// f32 partials and gsum (the form before). The same bits in all three. Read at every call. The
// kernels must also have been compiled for sm_90 or newer (pair_sum traps in code built for an
// older virtual arch and JIT-compiled for this device): their PTX arch, as CUB reads it.
// Returns Params.pair.
template <class T>
PairMode gqa_pair(const Params& p) {
  const int knob = env::choice("DT_GDN_GQA_PAIR", {{"0", "per-v-head f32 partials summed by gsum"},
                                                   {"1", "G = 2 as clusters of two CTAs, pulling"},
                                                   {"2", "G = 2 as clusters, the exchange pushed (st.async; default)"}});
  if (p.G != 2 || knob == 0) return kPairOff;
  cudaFuncAttributes a{};
  DT_CUDA_CHECK(cudaFuncGetAttributes(&a, dqk_kernel<T>));
  if (cc_major() < 9 || a.ptxVersion < 90) return kPairOff;
  return knob == 1 ? kPairPull : kPairPush;
}

// A (chunk, v-head) kernel (prep, out, dvl, dqk, wy) on the per-chunk grid [Hv, chunks], the
// v-heads on x, so that the G v-heads of a key head (adjacent in launch order) read its q / k rows
// together: one DRAM read, the rest from L2. With the chunks on x (the form before v0.19.0) a key
// head's v-heads ran NT CTAs apart and each read them from DRAM. y holds at most 65535 chunks (4.2M
// tokens), so a larger batch launches in slabs of chunks, each with its Params.c0 (the kernel's
// first argument); DT_GDN_CHUNK_SLAB (tests) lowers the slab size to exercise that. With p.pair
// (dqk, wy) as clusters of the two v-heads of a key head (2 x 1: Hv = 2 Hk is even, so a cluster
// never straddles chunks).
// after_serial (out after state, dqk after rev, with Params.done): the first slab through
// Programmatic Dependent Launch, so that it starts once every serial CTA has (with_serial_pdl).
template <class... Exp, class... Act>
void launch_chunk_kernel_ex(bool after_serial, void (*kernel)(Exp...), const Params& p, size_t smem, cudaStream_t st,
                            Act&&... args) {
  set_smem(kernel, smem);
  const int slab = int(env::whole_number("DT_GDN_CHUNK_SLAB", 1, 65535, 65535, "chunks per per-chunk launch"));
  cudaLaunchConfig_t cfg = {};
  cfg.blockDim = dim3(kChunkThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[2];
  int na = 0;
  if (p.pair) {
    attr[na].id = cudaLaunchAttributeClusterDimension;
    attr[na].val.clusterDim.x = 2;
    attr[na].val.clusterDim.y = 1;
    attr[na].val.clusterDim.z = 1;
    ++na;
  }
  const int n_other = na;  // the attributes of every slab's launch
  if (after_serial) {
    DT_CHECK(p.done != nullptr, "launch_chunk_kernel_ex: a launch after the serial kernel needs Params.done");
    attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[na].val.programmaticStreamSerializationAllowed = 1;
    ++na;
  }
  cfg.attrs = attr;
  for (int c0 = 0; c0 < p.NT; c0 += slab) {
    Params ps = p;
    ps.c0 = c0;
    cfg.gridDim = dim3(p.Hv, std::min(slab, p.NT - c0));
    cfg.numAttrs = c0 == 0 ? na : n_other;  // later slabs follow the first one as usual
    DT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, ps, args...));
    DT_CUDA_LAUNCH_CHECK();
  }
}
template <class... Exp, class... Act>
void launch_chunk_kernel(void (*kernel)(Exp...), const Params& p, size_t smem, cudaStream_t st, Act&&... args) {
  launch_chunk_kernel_ex(false, kernel, p, smem, st, std::forward<Act>(args)...);
}

// DT_GDN_SERIAL_PDL: 1 or unset: the warp-owned serial kernels (state, rev) let the per-chunk kernel
// after them (out, dqk) start while their last CTAs run, each of its CTAs waiting for its own
// sequence (Params.done, serial_wait); 0: it starts after the whole serial grid. The same bits.
// Applies to bf16's warp forms (warp4, warp8, wg4) on sm_90 and newer. Read at every call.
bool serial_pdl_knob() {
  return env::choice("DT_GDN_SERIAL_PDL", {{"0", "the per-chunk kernel after the whole serial grid"},
                                           {"1", "the per-chunk kernel overlapping the serial grid's tail"}}) != 0;
}
// Params.done (serial_pdl_trigger, serial_done, serial_wait) for a serial kernel of `form` and the
// per-chunk kernel after it, when serial_pdl_knob and the form allow it: `done` gets the zeroed [N]
// counters (stream-ordered before the serial launch).
template <class T>
Params with_serial_pdl(const Params& p, const SerialForm& form, Tensor& done, Device dev, cudaStream_t st) {
  Params r = p;
  if (!std::is_same_v<T, bf16> || form.warps == 0 || form.split != 0 || p.N == 0 || p.NT == 0 || !serial_pdl_knob() ||
      cc_major() < 9)
    return r;
  done = Tensor::zeros(Shape{p.N}, DType::i32, dev, Stream{st});
  r.done = done.ptr<int>();
  r.done_target = p.Hv * warp_params(p, form.warps).nvt;
  return r;
}

// prep: gamma, W, U (and Tm).
template <class T>
void launch_prep(const Params& p, const TensorView& k, const TensorView& v, const TensorView& g,
                 const TensorView& beta, float* gam, T* W, T* U, T* Tm, cudaStream_t st) {
  if (p.NT > 0) {
    launch_chunk_kernel(prep_kernel<T>, p, PrepSmem<T>::bytes, st, tptr<T>(k), tptr<T>(v), tptr<float>(g),
                        tptr<float>(beta), gam, W, U, Tm);
  }
}
// Forward pieces shared by fwd and bwd: gamma, W, U (and Tm), then the chunk states and Delta.
template <class T>
void launch_prep_state(const Params& p, const TensorView& k, const TensorView& v, const TensorView& g,
                       const TensorView& beta, const TensorView& h0, float* gam, T* W, T* U, T* Tm, T* h, T* Dl,
                       float* ht, cudaStream_t st) {
  launch_prep<T>(p, k, v, g, beta, gam, W, U, Tm, st);
  if (p.N > 0 && (p.NT > 0 || ht)) {
    if constexpr (std::is_same_v<T, bf16>) {
      const SerialForm form = serial_form<T>(p.dk, p.dv);
      DT_CHECK(!p.done || (form.warps && !form.split), "gdn_chunk: Params.done set for a state kernel that does not "
                                                       "count itself done (DT_GDN_SERIAL changed during the call?)");
      if (const int sg = form.split) {  // two stages; V tiles of 64
        DT_CHECK(state_stages() == 2, "DT_GDN_STATE_STAGES=1 with DT_GDN_SERIAL=split{}: the split state kernel has "
                                      "two stages only; unset one of them",
                 sg);
        const Params pw = warp_params(p, 4);
        auto state = [&](auto groups) {
          constexpr int GS = decltype(groups)::value;
          constexpr size_t bytes = SStateSmem<GS, 2>::bytes;
          set_smem(state_split_kernel<GS, 2>, bytes);
          state_split_kernel<GS, 2><<<seq_ctas(pw), SplitTiles<GS>::NTHR, bytes, st>>>(
              pw, tptr<T>(k), W, U, gam, tptr<float>(h0), h, Dl, ht);
          DT_CUDA_LAUNCH_CHECK();
        };
        if (sg == 2) state(std::integral_constant<int, 2>{});
        else state(std::integral_constant<int, 4>{});
        return;
      }
      if (const int nw = form.warps) {
        const Params pw = warp_params(p, nw);
        auto state = [&](auto warps, auto stages) {
          constexpr int NW = decltype(warps)::value, NS = decltype(stages)::value;
          constexpr size_t bytes = WStateSmem<NW, NS>::bytes;
          set_smem(state_warp_kernel<NW, NS>, bytes);
          state_warp_kernel<NW, NS><<<seq_ctas(pw), 32 * NW, bytes, st>>>(pw, tptr<T>(k), W, U, gam, tptr<float>(h0),
                                                                          h, Dl, ht);
          DT_CUDA_LAUNCH_CHECK();
        };
        const int ns = state_stages();
        if (form.wg) {
          auto state_wg = [&](auto stages) {
            constexpr int NS = decltype(stages)::value;
            constexpr size_t bytes = WgStateSmem<NS>::bytes;
            set_smem(state_warp_kernel<4, NS, true>, bytes);
            state_warp_kernel<4, NS, true><<<seq_ctas(pw), 128, bytes, st>>>(pw, tptr<T>(k), W, U, gam,
                                                                              tptr<float>(h0), h, Dl, ht);
            DT_CUDA_LAUNCH_CHECK();
          };
          if (ns == 2) state_wg(std::integral_constant<int, 2>{});
          else state_wg(std::integral_constant<int, 1>{});
          return;
        }
        if (nw == 8) {
          DT_CHECK(ns == 2, "DT_GDN_STATE_STAGES=1 with DT_GDN_SERIAL=warp8: the 8-warp state kernel has two stages "
                            "only; unset one of them");
          state(std::integral_constant<int, 8>{}, std::integral_constant<int, 2>{});
        } else if (ns == 2) {
          state(std::integral_constant<int, 4>{}, std::integral_constant<int, 2>{});
        } else {
          state(std::integral_constant<int, 4>{}, std::integral_constant<int, 1>{});
        }
        return;
      }
    }
    auto state = [&](auto stages) {
      constexpr int NS = decltype(stages)::value;
      constexpr size_t bytes = StateSmem<T, NS>::bytes;
      set_smem(state_kernel<T, NS>, bytes);
      state_kernel<T, NS><<<seq_ctas(p), kSeqThreads, bytes, st>>>(p, tptr<T>(k), W, U, gam, tptr<float>(h0), h, Dl,
                                                                   ht);
      DT_CUDA_LAUNCH_CHECK();
    };
    if (state_stages() == 2) state(std::integral_constant<int, 2>{});
    else state(std::integral_constant<int, 1>{});
  }
}

// The gated RMSNorm (GdnArgs.norm / norm_bwd) inside out and dvl (default), or DT_GDN_OUT_NORM=0 as
// its own kernels around the chunk rule. Paired A/B of the layer (gdn_layer --ab, 40 rounds):
// fused -0.30 and -0.19 ms fwd+bwd in two calls (faster in 29 and 24 of 40; docs/perf.md v0.16.0).
bool out_norm_knob() {
  const int knob =
      env::choice("DT_GDN_OUT_NORM", {{"0", "the gated RMSNorm's own kernels around the chunk rule"},
                                      {"1", "in the out kernel's epilogue and the dvl kernel's prologue (default)"}});
  return knob != 0;  // unset (-1) or 1
}
// A [T, Hv, dv] view the norm's 16-byte row slots can use: head stride dv, aligned token rows.
template <class T>
bool norm_rows16(const TensorView& v, int dv) {
  return v.ndim() == 3 && v.stride[1] == dv && v.stride[2] == 1 && ew::aligned16(v.data) &&
         (v.stride[0] * int64_t(sizeof(T))) % 16 == 0;
}

// The out kernel's norm epilogue for GdnArgs.norm, unless DT_GDN_OUT_NORM=0, when the views allow
// its 16-byte row slots (o, y, z rows aligned; dv a multiple of 16 already); else z = null and
// the caller runs gated_rmsnorm_fwd after.
template <class T>
OutNorm out_norm(const GdnOutNorm* n, const TensorView& o, const Params& p) {
  OutNorm r{};
  if (!n || !out_norm_knob()) return r;
  const int64_t es = int64_t(sizeof(T));
  if (!norm_rows16<T>(n->y, p.dv) || !norm_rows16<T>(n->z, p.dv) || !ew::aligned16(o.data) ||
      !n->rstd.is_contiguous())
    return r;
  r.z = n->z.data, r.sz = n->z.stride[0];
  r.w = n->w.ptr<float>(), r.w_vec = ew::aligned16(n->w.data) ? 1 : 0;
  r.y = n->y.data, r.sy = n->y.stride[0];
  r.rstd = const_cast<float*>(n->rstd.ptr<float>());
  r.eps = n->eps;
  r.tpr = std::min(32, ew::pow2_ceil((p.dv + 16 / es - 1) / (16 / es)));  // gated_rmsnorm's lanes per row
  return r;
}

// DT_GDN_FWD: split (unset: the default): state and out as their own kernels; fused: fused::fwd_kernel,
// the state recurrence and the output (with the norm epilogue) in one serial pass; split_tma: the
// split forward with fused::fwd_kernel's state chain alone as its state kernel (two warpgroups of
// 64 rows sharing a ring, h and Delta leaving by TMA stores from the hand-off buffers: v0.33.0 timed
// that chain at 0.32 ms against wg4's 0.60 with its stores). fused and split_tma apply to bf16,
// dk = dv = 128, Hv % 4 == 0 (gamma's 16-byte TMA rows) on sm_90 (elsewhere split). Read at every call.
enum class FwdForm { split, fused, split_tma };
constexpr const char* kFwdFormNames[] = {"split", "fused", "split_tma"};  // the knob's values, GdnChunkSaved::fwd_form
FwdForm fwd_form_knob() {
  const int c = env::choice("DT_GDN_FWD",
                             {{kFwdFormNames[0], "state and out kernels (default)"},
                              {kFwdFormNames[1], "state + out in one serial pass (bf16, dk = dv = 128, Hv % 4 == 0, sm_90)"},
                              {kFwdFormNames[2], "out after the fused kernel's state chain, h and Delta by TMA stores "
                                                 "(bf16, dk = dv = 128, Hv % 4 == 0, sm_90)"}});
  return c < 0 ? FwdForm::split : FwdForm(c);  // unset: -1
}
template <class T>
FwdForm fwd_form(const Params& p) {
  const FwdForm f = fwd_form_knob();  // the knob first: a bad value fails wherever no fused form applies too
  const bool ok = std::is_same_v<T, bf16> && p.dk == D && p.dv == D && p.NT > 0 && p.Hv % 4 == 0 &&
                  wgmma_device();
  return ok ? f : FwdForm::split;
}
// A TMA descriptor of a row-major tensor (dims innermost first, strides in bytes of dims 1..rank-1),
// through the driver's cuTensorMapEncodeTiled as cudart hands it over (no link to libcuda).
CUtensorMap tensor_map(CUtensorMapDataType type, cuuint32_t rank, const void* base, const cuuint64_t* dims,
                       const cuuint64_t* strides, const cuuint32_t* box, CUtensorMapSwizzle swizzle) {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    DT_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
    DT_CHECK(fn && q == cudaDriverEntryPointSuccess, "gdn_chunk: the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  CUtensorMap m;
  const cuuint32_t estride[3] = {1, 1, 1};
  const CUresult r = encode(&m, type, rank, const_cast<void*>(base), dims, strides, box, estride,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  DT_CHECK(r == CUDA_SUCCESS, "gdn_chunk: cuTensorMapEncodeTiled failed (CUresult {})", int(r));
  return m;
}
// fused::Maps: the loads' (W, U [T, Hv, 128] and K, Q [T, Hk, 128] bf16 in boxes of
// 64 x 1 x 64 with the 128-byte swizzle, the kernels' atoms; gamma [T, Hv] f32 in boxes of 4 heads x
// 64 tokens), and the stores' (h rows and Delta, where given).
fused::Maps fused_maps(const Params& p, const bf16* q, const bf16* k, const bf16* W, const bf16* U, const float* gam,
                       const bf16* h, const bf16* Dl) {
  fused::Maps m{};
  const cuuint32_t box[3] = {64, 1, 64};
  auto rows = [&](const bf16* base, int heads) {
    const cuuint64_t dims[3] = {cuuint64_t(D), cuuint64_t(heads), cuuint64_t(p.T)};
    const cuuint64_t strides[2] = {cuuint64_t(D) * 2, cuuint64_t(heads) * D * 2};
    return tensor_map(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, base, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B);
  };
  DT_CHECK(p.Hv % 4 == 0, "gdn_chunk: the fused forward needs Hv % 4 == 0 (gamma's 16-byte TMA rows), got Hv {}", p.Hv);
  m.w = rows(W, p.Hv);
  m.u = rows(U, p.Hv);
  m.k = rows(k, p.Hk);
  m.q = rows(q, p.Hk);
  const cuuint64_t gdims[2] = {cuuint64_t(p.Hv), cuuint64_t(p.T)}, gstrides[1] = {cuuint64_t(p.Hv) * 4};
  const cuuint32_t gbox[2] = {4, 64};
  m.g = tensor_map(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, gam, gdims, gstrides, gbox, CU_TENSOR_MAP_SWIZZLE_NONE);
  if (h) {  // h [NT Hv dk][dv] rows, stored from the S buffer's [128][64] atoms
    const int64_t hrows = int64_t(p.NT) * p.Hv * D;
    DT_CHECK(hrows < (int64_t(1) << 31), "gdn_chunk: {} chunk-state rows exceed the TMA stores' int32 coordinates", hrows);
    const cuuint64_t hdims[2] = {cuuint64_t(D), cuuint64_t(hrows)}, hstrides[1] = {cuuint64_t(D) * 2};
    const cuuint32_t hbox[2] = {64, cuuint32_t(D)};
    m.h = tensor_map(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, h, hdims, hstrides, hbox, CU_TENSOR_MAP_SWIZZLE_128B);
  }
  if (Dl) m.d = rows(Dl, p.Hv);  // Delta [T, Hv, dv]
  return m;
}

// prep (gamma, W, U, Tm), then fused::fwd_kernel for the chunk states, Delta, ht, o (and y, rstd with
// nrm.z) and P: run_fwd's outputs without its state and out launches. state_only (split_tma): its
// state chain alone, for h, Delta and ht (o, P and nrm unused), counting into p.done for out.
template <class T>
void launch_fused_fwd(bool state_only, const Params& p, const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& g, const TensorView& beta, const TensorView& h0, float* gam, T* W, T* U, T* Tm,
                      T* h, T* Dl, T* P, const TensorView& ht, const TensorView& o, const OutNorm& nrm,
                      cudaStream_t st) {
  if constexpr (std::is_same_v<T, bf16>) {
    DT_CHECK(!state_only || (h && Dl), "gdn_chunk: split_tma's state chain needs h and Delta");
    DT_CHECK(!p.done || (state_only && p.done_target == p.Hv), "gdn_chunk: Params.done set for the fused forward");
    launch_prep<T>(p, k, v, g, beta, gam, W, U, Tm, st);
    const Params pw = warp_params(p, 8);  // nvt = 1 (dv = 128)
    const fused::Maps maps = fused_maps(p, tptr<T>(q), tptr<T>(k), W, U, gam, h, Dl);
    auto go = [&](auto norm, auto only) {
      constexpr bool NORM = decltype(norm)::value, ONLY = decltype(only)::value;
      set_smem(fused::fwd_kernel<NORM, ONLY>, fused::Smem::bytes);
      fused::fwd_kernel<NORM, ONLY><<<seq_ctas(pw), fused::kThreads, fused::Smem::bytes, st>>>(
          pw, tptr<float>(h0), h, Dl, tptr<float>(ht), tptr<T>(o), P, nrm, maps);
      DT_CUDA_LAUNCH_CHECK();
    };
    if (state_only) go(std::false_type{}, std::true_type{});
    else if (nrm.z) go(std::true_type{}, std::false_type{});
    else go(std::false_type{}, std::false_type{});
  } else {
    DT_CHECK(false, "gdn_chunk: the fused forward is bf16 only");
  }
}

template <class T>
void run_fwd(const TensorView& o, const TensorView& ht, const TensorView& q, const TensorView& k, const TensorView& v,
             const TensorView& g, const TensorView& beta, const TensorView& h0, const Params& p, Device dev,
             cudaStream_t st, GdnChunkSaved* saved, const GdnOutNorm* norm) {
  const DType dt = q.dtype;
  const int64_t T1 = std::max<int64_t>(p.T, 1), NT1 = std::max<int64_t>(p.NT, 1);
  Tensor gam = Tensor::empty(Shape{T1, p.Hv}, DType::f32, dev);            // [T, Hv] f32
  Tensor W = Tensor::empty(Shape{T1, p.Hv, p.dk}, dt, dev);                 // [T, Hv, dk]
  Tensor U = Tensor::empty(Shape{T1, p.Hv, p.dv}, dt, dev);                 // [T, Hv, dv]
  Tensor Tm = saved ? Tensor::empty(Shape{NT1, p.Hv, C, C}, dt, dev) : Tensor();  // [NT, Hv, C, C]
  // The fused forward keeps h and Delta on chip: they are written only as saved intermediates.
  const FwdForm form = fwd_form<T>(p);
  const bool fused = form == FwdForm::fused, hd = saved || !fused;
  Tensor h = hd ? Tensor::empty(Shape{NT1, p.Hv, p.dk, p.dv}, dt, dev) : Tensor();  // [NT, Hv, dk, dv]
  Tensor Dl = hd ? Tensor::empty(Shape{T1, p.Hv, p.dv}, dt, dev) : Tensor();        // [T, Hv, dv]
  Tensor P = saved ? Tensor::empty(Shape{NT1, p.Hv, C, C}, dt, dev) : Tensor();   // [NT, Hv, C, C]
  T* const h_p = hd ? h.ptr<T>() : nullptr;
  T* const Dl_p = hd ? Dl.ptr<T>() : nullptr;
  const OutNorm nrm = out_norm<T>(norm, o, p);
  if (fused) {
    launch_fused_fwd<T>(false, p, q, k, v, g, beta, h0, gam.ptr<float>(), W.ptr<T>(), U.ptr<T>(),
                        saved ? Tm.ptr<T>() : nullptr, h_p, Dl_p, saved ? P.ptr<T>() : nullptr, ht, o, nrm, st);
  } else {
    Tensor done;  // [N] int32: the state kernel's CTAs done per sequence, for out (with_serial_pdl)
    // split_tma's state kernel, fused::fwd_kernel: 8 warps of 16 rows, one CTA per (sequence, v-head)
    const SerialForm sf = form == FwdForm::split_tma                   ? SerialForm{8}
                          : std::is_same_v<T, bf16> && p.N > 0 ? serial_form<T>(p.dk, p.dv)
                                                               : SerialForm{};
    const Params pf = with_serial_pdl<T>(p, sf, done, dev, st);
    if (form == FwdForm::split_tma)
      launch_fused_fwd<T>(true, pf, q, k, v, g, beta, h0, gam.ptr<float>(), W.ptr<T>(), U.ptr<T>(),
                          saved ? Tm.ptr<T>() : nullptr, h_p, Dl_p, nullptr, ht, o, OutNorm{}, st);
    else
      launch_prep_state<T>(pf, k, v, g, beta, h0, gam.ptr<float>(), W.ptr<T>(), U.ptr<T>(),
                           saved ? Tm.ptr<T>() : nullptr, h_p, Dl_p, tptr<float>(ht), st);
    if (p.NT > 0) {
      // out_wg_kernel (DT_GDN_OUT=wgmma, the default; bf16, dk = dv = 128, sm_90), else out_kernel: the
      // same arguments
      const bool out_wg = out_wgmma_knob() && std::is_same_v<T, bf16> && p.dk == D && p.dv == D && wgmma_device();
      auto* out = out_kernel<T>;
      size_t out_smem = OutSmem<T>::bytes;
      if constexpr (std::is_same_v<T, bf16>) {
        if (out_wg) {
          DT_CHECK(!nrm.z || nrm.tpr == outw::kTpr, "gdn_chunk: out_wg_kernel's norm epilogue needs {} lanes a row, got {}",
                   outw::kTpr, nrm.tpr);
          out = out_wg_kernel, out_smem = OutWgSmem::bytes;
        }
      }
      launch_chunk_kernel_ex(pf.done != nullptr, out, pf, out_smem, st, tptr<T>(q), tptr<T>(k), gam.ptr<float>(), h_p,
                             Dl_p, tptr<T>(o), saved ? P.ptr<T>() : nullptr, nrm);
      if (out_wg) g_out_wg_launches.fetch_add(1, std::memory_order_relaxed);
    }
  }
  if (norm && !nrm.z) cuda::gated_rmsnorm_fwd(norm->y, norm->rstd, o, norm->z, norm->w, norm->eps, Stream{st});
  // U is not kept: the backward reads it only to recompute h and Delta, which are kept (-1x the
  // bytes of v per layer; bench-0.8b: -33 MB per GDN layer, -0.6 GB a step).
  if (saved) {
    saved->tensors = {std::move(gam), std::move(W), Tensor(), std::move(Tm), std::move(h), std::move(Dl), std::move(P)};
    saved->fwd_form = kFwdFormNames[int(form)];
  }
}

// dvl's norm prologue for GdnArgs.norm_bwd, unless DT_GDN_OUT_NORM=0, when every row is 16-byte
// aligned (dy, o, z, dz, do); else dy = null and the caller runs gated_rmsnorm_bwd first.
template <class T>
DvlNorm dvl_norm(const GdnOutNormBwd* n, const TensorView& do_, const Params& p) {
  DvlNorm r{};
  if (!n || !out_norm_knob()) return r;
  const int64_t es = int64_t(sizeof(T));
  if (!norm_rows16<T>(n->dy, p.dv) || !norm_rows16<T>(n->z, p.dv) || !norm_rows16<T>(n->dz, p.dv) ||
      !ew::aligned16(n->o.data) || !n->o.is_contiguous() || !ew::aligned16(do_.data) || !n->rstd.is_contiguous())
    return r;
  r.dy = n->dy.data, r.sdy = n->dy.stride[0];
  r.o = n->o.data;
  r.z = n->z.data, r.sz = n->z.stride[0];
  r.w = n->w.ptr<float>(), r.w_vec = ew::aligned16(n->w.data) ? 1 : 0;
  r.rstd = n->rstd.ptr<float>();
  r.dz = n->dz.data, r.sdz = n->dz.stride[0];
  r.tpr = std::min(32, ew::pow2_ceil((p.dv + 16 / es - 1) / (16 / es)));  // gated_rmsnorm's lanes per row
  return r;
}

template <class T>
void run_bwd(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dg,
             const TensorView& dbeta, const TensorView& dh0, const TensorView& do_, const TensorView& dht,
             const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
             const TensorView& beta, const TensorView& h0, const Params& p, Device dev, cudaStream_t st,
             const GdnChunkSaved* saved, const GdnOutNormBwd* norm) {
  const DType dt = q.dtype;
  const int64_t T1 = std::max<int64_t>(p.T, 1), NT1 = std::max<int64_t>(p.NT, 1);
  Tensor gam, W, U, Tm, h, Dl, P;  // from the forward when it saved them, else recomputed (P: in dvl)
  if (saved && saved->defined()) {
    DT_CHECK(saved->tensors.size() == 7 && saved->tensors[1].shape() == (Shape{T1, p.Hv, p.dk}) &&
                 saved->tensors[4].shape() == (Shape{NT1, p.Hv, p.dk, p.dv}) && saved->tensors[1].dtype() == dt,
             "gdn_chunk_bwd: GdnChunkSaved does not come from the forward of these inputs");
    gam = saved->tensors[0];
    W = saved->tensors[1];
    // U (tensors[2]) is not kept: only the state recomputation reads it.
    Tm = saved->tensors[3];
    h = saved->tensors[4];
    Dl = saved->tensors[5];
    P = saved->tensors[6];
  } else {
    gam = Tensor::empty(Shape{T1, p.Hv}, DType::f32, dev);       // [T, Hv] f32
    W = Tensor::empty(Shape{T1, p.Hv, p.dk}, dt, dev);            // [T, Hv, dk]
    U = Tensor::empty(Shape{T1, p.Hv, p.dv}, dt, dev);            // [T, Hv, dv]
    Tm = Tensor::empty(Shape{NT1, p.Hv, C, C}, dt, dev);          // [NT, Hv, C, C]
    h = Tensor::empty(Shape{NT1, p.Hv, p.dk, p.dv}, dt, dev);     // [NT, Hv, dk, dv]
    Dl = Tensor::empty(Shape{T1, p.Hv, p.dv}, dt, dev);           // [T, Hv, dv] Delta
    launch_prep_state<T>(p, k, v, g, beta, h0, gam.ptr<float>(), W.ptr<T>(), U.ptr<T>(), Tm.ptr<T>(), h.ptr<T>(),
                         Dl.ptr<T>(), nullptr, st);
  }
  // The serial form, and whether wg4's rev kernel makes dDelta_local itself from P (rev_p_knob):
  // then dvl writes no dDelta_local (and, without the forward's P, writes its P for rev instead).
  const SerialForm form = p.N > 0 ? serial_form<T>(p.dk, p.dv) : SerialForm{};
  const int sg = form.split, nw = form.warps;
  const unsigned rev_ctas = nw ? seq_ctas(warp_params(p, nw)) : 0u;
  const int rev_ns = nw ? rev_stages<T>(rev_ctas) : 1;
  const bool rev_wg = std::is_same_v<T, bf16> && form.wg && rev_wgmma_knob();
  const bool rev_ks = rev_wg && rev_ns == 1 && rev_ksplit_knob();
  const bool rev_p = rev_wg && !rev_ks && p.NT > 0 && rev_p_knob();
  Tensor done;  // [N] int32: the rev kernel's CTAs done per sequence, for dqk (with_serial_pdl)
  const Params pr = with_serial_pdl<T>(p, form, done, dev, st);
  const bool p_from_fwd = P.defined();  // the forward's P (saved intermediates)
  if (rev_p && !p_from_fwd) P = Tensor::empty(Shape{NT1, p.Hv, C, C}, dt, dev);  // [NT, Hv, C, C], from dvl
  Tensor dDl = rev_p ? Tensor() : Tensor::empty(Shape{T1, p.Hv, p.dv}, dt, dev);  // [T, Hv, dv] dDelta_local
  Tensor dS1 = Tensor::empty(Shape{NT1, p.Hv, p.dk, p.dv}, dt, dev);        // [NT, Hv, dk, dv]
  Tensor dD = Tensor::empty(Shape{T1, p.Hv, p.dv}, dt, dev);                // [T, Hv, dv] dDelta
  // The gated RMSNorm's backward: in dvl (unless DT_GDN_OUT_NORM=0; 16-byte rows) or before it.
  const DvlNorm nrm = dvl_norm<T>(norm, do_, p);
  if (norm && !nrm.dy)
    cuda::gated_rmsnorm_bwd(do_, norm->dz, norm->dw, norm->dy, norm->o, norm->z, norm->w, norm->rstd, Stream{st});
  if (p.NT > 0) {
    Tensor part;  // [NT * Hv, dv] f32: dvl's per-CTA partials of the norm weight's gradient
    DvlNorm nk = nrm;
    if (nk.dy) {
      part = Tensor::empty(Shape{int64_t(p.NT) * p.Hv, p.dv}, DType::f32, dev);
      nk.part = part.ptr<float>();
    }
    const size_t bytes = nk.dy ? DvlSmem<T>::bytes + dvl_norm_bytes<T>(p_from_fwd)
                               : (p_from_fwd ? DvlSmem<T>::bytes_p : DvlSmem<T>::bytes);
    auto dvl = [&](auto norm_tag) {
      launch_chunk_kernel(dvl_kernel<T, decltype(norm_tag)::value>, p, bytes, st, tptr<T>(q), tptr<T>(k),
                          gam.ptr<float>(), p_from_fwd ? P.ptr<T>() : nullptr, tptr<T>(do_),
                          rev_p ? nullptr : dDl.ptr<T>(), rev_p && !p_from_fwd ? P.ptr<T>() : nullptr, nk);
    };
    if (nk.dy) dvl(std::true_type{});
    else if (!(rev_p && p_from_fwd)) dvl(std::false_type{});  // else nothing to do: dO given, P saved
    if (nk.dy)  // dw += the CTAs' partials, in CTA order
      ew::colsum_add(norm->dw.ptr<float>(), norm->dw.ptr<float>(), part.ptr<float>(), int64_t(p.NT) * p.Hv, p.dv,
                     p.dv, st);
  }
  if constexpr (std::is_same_v<T, bf16>) {
    if (sg) {  // G = 2: two stages (202.5 KB); G = 4: one (two would not fit); V tiles of 64
      const Params pw = warp_params(p, 4);
      const int forced = forced_stages("DT_GDN_REV_STAGES");
      DT_CHECK(forced == 0 || forced == (sg == 2 ? 2 : 1),
               "DT_GDN_REV_STAGES={} with DT_GDN_SERIAL=split{}: the split rev kernel has {} stage(s) only; unset one "
               "of them",
               forced, sg, sg == 2 ? 2 : 1);
      auto rev = [&](auto groups) {
        constexpr int GS = decltype(groups)::value, NS = GS == 2 ? 2 : 1;
        constexpr size_t bytes = SRevSmem<GS, NS>::bytes;
        set_smem(rev_split_kernel<GS, NS>, bytes);
        rev_split_kernel<GS, NS><<<seq_ctas(pw), SplitTiles<GS>::NTHR, bytes, st>>>(
            pw, tptr<T>(q), tptr<T>(k), W.ptr<T>(), gam.ptr<float>(), tptr<T>(do_), dDl.ptr<T>(), tptr<float>(dht),
            dS1.ptr<T>(), dD.ptr<T>(), tptr<float>(dh0));
        DT_CUDA_LAUNCH_CHECK();
      };
      if (sg == 2) rev(std::integral_constant<int, 2>{});
      else rev(std::integral_constant<int, 4>{});
    }
    if (nw) {
      const Params pw = warp_params(pr, nw);
      const unsigned ctas = rev_ctas;
      auto rev = [&](auto warps, auto stages) {
        constexpr int NW = decltype(warps)::value, NS = decltype(stages)::value;
        constexpr size_t bytes = WRevSmem<NW, NS>::bytes;
        set_smem(rev_warp_kernel<NW, NS>, bytes);
        rev_warp_kernel<NW, NS><<<ctas, 32 * NW, bytes, st>>>(pw, tptr<T>(q), tptr<T>(k), W.ptr<T>(), gam.ptr<float>(),
                                                              tptr<T>(do_), dDl.ptr<T>(), tptr<float>(dht),
                                                              dS1.ptr<T>(), dD.ptr<T>(), tptr<float>(dh0), nullptr);
        DT_CUDA_LAUNCH_CHECK();
      };
      // 4 warps: two stages (162.5 KB, one CTA per SM) when the grid fits one CTA per SM, else one
      // (93.3 KB, two per SM), as for the tiled kernel; 8 warps: always two (one CTA per SM anyway).
      const int ns = rev_ns;
      if (rev_wg) {
        auto launch_wg = [&](auto stages, auto ks, auto rp) {
          constexpr int NS = decltype(stages)::value;
          constexpr bool KS = decltype(ks)::value, RP = decltype(rp)::value;
          constexpr size_t bytes = KS ? WgRevSmemKS::bytes : WgRevSmem<NS, RP>::bytes;
          set_smem(rev_warp_kernel<4, NS, true, KS, RP>, bytes);
          rev_warp_kernel<4, NS, true, KS, RP><<<ctas, 128, bytes, st>>>(
              pw, tptr<T>(q), tptr<T>(k), W.ptr<T>(), gam.ptr<float>(), tptr<T>(do_), RP ? nullptr : dDl.ptr<T>(),
              tptr<float>(dht), dS1.ptr<T>(), dD.ptr<T>(), tptr<float>(dh0), RP ? P.ptr<T>() : nullptr);
          DT_CUDA_LAUNCH_CHECK();
        };
        using One = std::integral_constant<int, 1>;
        using Two = std::integral_constant<int, 2>;
        if (rev_ks) launch_wg(One{}, std::true_type{}, std::false_type{});
        else if (ns == 2 && rev_p) launch_wg(Two{}, std::false_type{}, std::true_type{});
        else if (ns == 2) launch_wg(Two{}, std::false_type{}, std::false_type{});
        else if (rev_p) launch_wg(One{}, std::false_type{}, std::true_type{});
        else launch_wg(One{}, std::false_type{}, std::false_type{});
      } else if (nw == 8) {
        DT_CHECK(ns == 2 || forced_stages("DT_GDN_REV_STAGES") == 0,
                 "DT_GDN_REV_STAGES=1 with DT_GDN_SERIAL=warp8: the 8-warp rev kernel has two stages only; unset "
                 "one of them");
        rev(std::integral_constant<int, 8>{}, std::integral_constant<int, 2>{});
      } else if (ns == 2) {
        rev(std::integral_constant<int, 4>{}, std::integral_constant<int, 2>{});
      } else {
        rev(std::integral_constant<int, 4>{}, std::integral_constant<int, 1>{});
      }
    }
  }
  if (p.N > 0 && !nw && !sg) {
    const unsigned ctas = seq_ctas(p);
    auto rev = [&](auto stages) {
      constexpr int NS = decltype(stages)::value;
      constexpr size_t bytes = RevSmem<T, NS>::bytes;
      set_smem(rev_kernel<T, NS>, bytes);
      rev_kernel<T, NS><<<ctas, kSeqThreads, bytes, st>>>(p, tptr<T>(q), tptr<T>(k), W.ptr<T>(), gam.ptr<float>(),
                                                          tptr<T>(do_), dDl.ptr<T>(), tptr<float>(dht), dS1.ptr<T>(),
                                                          dD.ptr<T>(), tptr<float>(dh0));
      DT_CUDA_LAUNCH_CHECK();
    };
    const int ns = rev_stages<T>(ctas);  // 2 only where kRevMaxStages<T> == 2
    if constexpr (kRevMaxStages<T> == 2) {
      if (ns == 2) rev(std::integral_constant<int, 2>{});
      else rev(std::integral_constant<int, 1>{});
    } else {
      rev(std::integral_constant<int, 1>{});
    }
  }
  if (p.NT == 0) return;
  U = Tensor();  // not needed any more (rev, which dqk may overlap, never reads U)
  // G == 1 (Hv == Hk): dqk and wy write dq and dk themselves, without the f32 round trip of B12's
  // gsum (bench-0.8b: -2 launches and ~270 MB of traffic per GDN layer); G == 2: the same through
  // clusters of the two v-heads (gqa_pair; dq's f32 partials are not written, dk's are read once
  // and not written back). The same bits.
  Params pb = pr;
  pb.pair = gqa_pair<T>(p);
  const bool direct = p.G == 1 || pb.pair;
  Tensor dqh = direct ? Tensor() : Tensor::empty(Shape{T1, p.Hv, p.dk}, DType::f32, dev);  // [T, Hv, dk] f32
  // dqk's dk part: [T, Hv, dk] f32, or with pb.pair the key head's sum [T, Hk, dk]; wy's own part
  // goes to dk2 only for gsum (G > 1 without clusters)
  Tensor dkh = Tensor::empty(Shape{T1, pb.pair ? p.Hk : p.Hv, p.dk}, DType::f32, dev);
  Tensor dk2 = direct ? Tensor() : Tensor::empty(Shape{T1, p.Hv, p.dk}, DType::f32, dev);  // [T, Hv, dk] f32
  Tensor dW = Tensor::empty(Shape{T1, p.Hv, p.dk}, dt, dev);                // [T, Hv, dk]
  Tensor dgam = Tensor::empty(Shape{T1, p.Hv}, DType::f32, dev);  // [T, Hv] f32
  // dqk and wy: the wgmma kernels (bf16, dk = dv = 128, sm_90; DT_GDN_DQK / DT_GDN_WY), else the
  // mma ones, with the same arguments
  constexpr bool is_bf16 = std::is_same_v<T, bf16>;
  const bool wg_shape = p.dk == D && p.dv == D && wgmma_device();
  auto* dqk = dqk_kernel<T>;
  size_t dqk_smem = DqkSmem<T>::bytes;
  const bool dqk_wg = is_bf16 && dqk_wgmma_knob() && wg_shape;
  if constexpr (is_bf16) {
    if (dqk_wg) dqk = dqk_wg_kernel, dqk_smem = DqkWgSmem::bytes;
  }
  launch_chunk_kernel_ex(pb.done != nullptr, dqk, pb, dqk_smem, st, tptr<T>(q), tptr<T>(k), gam.ptr<float>(),
                         tptr<T>(do_), Dl.ptr<T>(), dD.ptr<T>(), h.ptr<T>(), dS1.ptr<T>(),
                         direct ? nullptr : dqh.ptr<float>(), tptr<T>(dq), dkh.ptr<float>(), dW.ptr<T>(),
                         dgam.ptr<float>());
  if (dqk_wg) g_dqk_wg_launches.fetch_add(1, std::memory_order_relaxed);
  auto* wy = wy_kernel<T>;
  size_t wy_smem = WySmem<T>::bytes;
  const bool wy_wg = is_bf16 && wy_wgmma_knob() && wg_shape;
  if constexpr (is_bf16) {
    if (wy_wg) wy = wy_wg_kernel, wy_smem = WyWgSmem::bytes;
  }
  launch_chunk_kernel(wy, pb, wy_smem, st, tptr<T>(k), tptr<T>(v), tptr<float>(beta), gam.ptr<float>(), Tm.ptr<T>(),
                      dW.ptr<T>(), dD.ptr<T>(), dgam.ptr<float>(), dkh.ptr<float>(), direct ? nullptr : dk2.ptr<float>(),
                      tptr<T>(dk), tptr<T>(dv), tptr<float>(dbeta), tptr<float>(dg));
  if (wy_wg) g_wy_wg_launches.fetch_add(1, std::memory_order_relaxed);
  if (direct) return;
  const int64_t rows = p.T * p.Hk;
  const int blocks = int(std::min<int64_t>((rows * p.dk / 4 + 255) / 256, 132 * 16));
  gsum_kernel<T><<<blocks, 256, 0, st>>>(dqh.ptr<float>(), nullptr, tptr<T>(dq), rows, p.G, p.dk);
  DT_CUDA_LAUNCH_CHECK();
  gsum_kernel<T><<<blocks, 256, 0, st>>>(dkh.ptr<float>(), dk2.ptr<float>(), tptr<T>(dk), rows, p.G, p.dk);
  DT_CUDA_LAUNCH_CHECK();
}

// v and dv may be token-strided views (packed [Hv, dv] rows, check_token_rows): the layer passes
// v and dv as column views of its conv output / conv-input gradient. DT_GDN_STRIDED_V=1 or unset:
// the kernels read and write them in place (gdn_layer -0.65 ms on an H200, docs/perf.md v0.8.0);
// 0: a strided v is copied to a contiguous tensor first and a strided dv written through one (the
// copies the layer made before). Read at every call.
bool strided_v_in_place() {
  return env::choice("DT_GDN_STRIDED_V", {{"0", "through contiguous copies"}, {"1", "read and written in place"}}) != 0;
}
// x itself when contiguous or when the kernels take it in place, else a contiguous tensor `tmp`
// (filled from x when `fill`).
TensorView packed_or_temp(const TensorView& x, Tensor& tmp, bool fill, cudaStream_t st) {
  if (x.is_contiguous() || x.numel() == 0 || strided_v_in_place()) return x;
  tmp = Tensor::empty(x.shape, x.dtype, x.device);
  if (fill) ops::copy(tmp, x, Stream{st});
  return tmp.view();
}
int64_t token_stride(const TensorView& x, int64_t packed) { return x.numel() > 0 ? x.stride[0] : packed; }

}  // namespace gck
}  // namespace

int64_t wy_wg_launches() { return gck::g_wy_wg_launches.load(std::memory_order_relaxed); }
int64_t dqk_wg_launches() { return gck::g_dqk_wg_launches.load(std::memory_order_relaxed); }
int64_t out_wg_launches() { return gck::g_out_wg_launches.load(std::memory_order_relaxed); }

void gdn_chunk_fwd(const TensorView& o, const TensorView& ht, const TensorView& q, const TensorView& k,
                   const TensorView& v, const TensorView& g, const TensorView& beta, const TensorView& h0,
                   const GdnArgs& args, const VarlenMeta& m, Stream s) {
  constexpr const char* op = "gdn_chunk_fwd";
  const gck::Dims d = gck::check_common(q, k, v, g, beta, m, op);
  gck::check_act(o, v.shape, q.dtype, q.device, op, "o");
  gck::check_state(h0, d, q.device, op, "h0");
  gck::check_state(ht, d, q.device, op, "ht");
  gck::NvtxRange range("gdn_chunk_fwd");
  cudaStream_t st = cuda_stream(s);
  Tensor vt;  // [T, Hv, dv] contiguous copy of a strided v (gck::strided_v_in_place)
  const TensorView vin = gck::packed_or_temp(v, vt, true, st);
  gck::Params p = gck::make_params(d, args, m);
  p.sv = gck::token_stride(vin, d.Hv * d.dv);
  if (q.dtype == DType::bf16)
    gck::run_fwd<gck::bf16>(o, ht, q, k, vin, g, beta, h0, p, q.device, st, args.saved, args.norm);
  else
    gck::run_fwd<float>(o, ht, q, k, vin, g, beta, h0, p, q.device, st, args.saved, args.norm);
}

void gdn_chunk_bwd(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dg,
                   const TensorView& dbeta, const TensorView& dh0, const TensorView& do_, const TensorView& dht,
                   const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                   const TensorView& beta, const TensorView& h0, const GdnArgs& args, const VarlenMeta& m,
                   Stream s) {
  constexpr const char* op = "gdn_chunk_bwd";
  const gck::Dims d = gck::check_common(q, k, v, g, beta, m, op);
  gck::check_act(dq, q.shape, q.dtype, q.device, op, "dq");
  gck::check_act(dk, q.shape, q.dtype, q.device, op, "dk");
  gck::check_token_rows(dv, v.shape, q.dtype, q.device, op, "dv");
  gck::check_act(do_, v.shape, q.dtype, q.device, op, "do");
  gck::check_act(dg, Shape{d.T, d.Hv}, DType::f32, q.device, op, "dg");
  gck::check_act(dbeta, Shape{d.T, d.Hv}, DType::f32, q.device, op, "dbeta");
  gck::check_state(h0, d, q.device, op, "h0");
  gck::check_state(dht, d, q.device, op, "dht");
  gck::check_state(dh0, d, q.device, op, "dh0");
  gck::NvtxRange range("gdn_chunk_bwd");
  cudaStream_t st = cuda_stream(s);
  Tensor vt, dvt;  // contiguous stand-ins for a strided v (copied in) and dv (copied out)
  const TensorView vin = gck::packed_or_temp(v, vt, true, st), dvo = gck::packed_or_temp(dv, dvt, false, st);
  gck::Params p = gck::make_params(d, args, m);
  p.sv = gck::token_stride(vin, d.Hv * d.dv);
  p.sdv = gck::token_stride(dvo, d.Hv * d.dv);
  if (q.dtype == DType::bf16)
    gck::run_bwd<gck::bf16>(dq, dk, dvo, dg, dbeta, dh0, do_, dht, q, k, vin, g, beta, h0, p, q.device, st, args.saved,
                            args.norm_bwd);
  else
    gck::run_bwd<float>(dq, dk, dvo, dg, dbeta, dh0, do_, dht, q, k, vin, g, beta, h0, p, q.device, st, args.saved,
                        args.norm_bwd);
  if (dvt.defined()) ops::copy(dv, dvt, s);
}

}  // namespace dt::ops::cuda
