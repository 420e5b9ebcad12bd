// CUDA depthwise causal conv1d on packed (THD) sequences, gdn-math.md section 7.
//   forward:  y_pre[t, c] = bias[c] + sum_{j<W} w[c, j] * x[t - (W-1) + j, c]
//             (a tap reads x[s] only when s is in t's sequence: the window never crosses a
//              sequence start; taps before the start read 0)
//             y = silu(y_pre) when `silu`, else y_pre
//   backward (y_pre recomputed from x, never stored):
//             dy_pre[t] = dy[t] * sigmoid(y_pre) * (1 + y_pre (1 - sigmoid(y_pre)))   (or dy)
//             dx[s, c]  = sum_{i<W} w[c, W-1-i] * dy_pre[s+i, c]  (s+i in s's sequence)   dx OVERWRITTEN (=)
//             dw[c, j] += sum_t dy_pre[t, c] * x[t-(W-1)+j, c]  (same-sequence taps)    dw ACCUMULATES (+=)
//             dbias[c] += sum_t dy_pre[t, c]                                            dbias ACCUMULATES (+=)
// Layouts: x, y, dy, dx: [T, D] (any row stride, unit inner stride; x is typically the qkv slice
//   of the in_proj output); w, dw: [D, W] f32 (HF conv1d.weight [D, 1, W]; any row stride, unit
//   inner stride), 2 <= W <= 8; bias, dbias: [D] f32 contiguous or empty views. Sequence
//   boundaries: VarlenMeta.seq_idx_dev [T] (a tap is valid iff seq_idx of both rows match).
// Dtypes: x, y, dy, dx one of bf16 | f32 (one dtype per call); all math fp32 (sigmoid:
//   ew::sigmoid_f, MUFU ex2 and rcp); y and dx rounded once (RNE).
// Mapping: a block owns 256 channels x ~250 tokens (a "group"); its 128 threads own 2 channels
//   each and stream the group's rows in order with register windows (x window, pending dx
//   sums), so every input row is read once per group (plus W'-1 halo rows). Rows arrive in
//   16-row shared-memory tiles through cp.async (16-byte, coalesced), a ring of S tiles so the
//   next S-1 tiles are in flight while the current one is consumed. The kernel is
//   compiled for a window W' in {4, 8}; W < W' runs with W'-W leading zero taps (exactly the
//   same sums).
// Determinism: no atomics. Each block writes its fp32 dw/dbias partials for its (group, channel
//   block) into scratch [ngroups, D, W'+1] (caching allocator; released on return, which is safe
//   under the allocator's one-compute-stream reuse rule), then a second pass sums the groups in
//   a fixed order and adds into dw/dbias (a programmatic dependent launch, overlapping the main
//   kernel's tail). The grid depends only on (T, D, W, dtype). Tiles that touch a sequence
//   boundary take a masked path (a select per tap); the others skip the selects; interior tiles
//   of a block whose channels all exist and store as aligned pairs, with SiLU, also skip the
//   per-row bounds, alignment and SiLU tests (the FAST step: ~25 instead of ~38 instructions
//   per forward row step in the SASS). All run the same fma chains, so the path taken never
//   changes the bits.
// L2 norm (causal_conv1d_l2norm_fwd): blocks whose channels start in the q|k sections put each
//   16-row tile's outputs (rounded) into a shared-memory stage instead of DRAM; while the next
//   tile streams, l2norm_tile normalises the staged one per head exactly as l2norm_fwd_kernel
//   (its lanes, sum order, rsqrtf) and writes qn, kn, rstd (and a mixed block's v columns).
// L2 norm backward (causal_conv1d_l2norm_bwd): for q|k chunks the ring loads dqn|dkn (as dy),
//   qn|kn and rstd instead of dy; right after a tile lands each thread turns its own chunks into
//   dy = rstd (dqn - qn sum(dqn qn)) (l2norm_bwd_chunks: a head row's chunks are consecutive
//   lanes, l2norm's own grouping, so no extra barrier); v channels read dy at c - nrm_ch.
// Gates: causal_conv1d_gate_fwd/bwd put the GDN gates' row loops (gdn_gate.cuh) in extra blocks
//   at the front of this grid (the conv's blocks and results unchanged); the backward's gate
//   partials get their own fixed-order column sum after the conv's.
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "core/env_knob.h"
#include "ops/cuda/gdn_elementwise_common.cuh"
#include "ops/cuda/gdn_gate.cuh"
#include "ops/gdn_backends.h"

namespace dt::ops::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kCPT = 2;               // channels per thread
constexpr int kCB = kThreads * kCPT;  // channels per block (256)
constexpr int kTT = 16;               // rows per shared-memory tile
#ifndef DT_CONV_TILES
#define DT_CONV_TILES 16
#endif
constexpr int kTilesPerGroup = DT_CONV_TILES;  // a block streams 16 tiles = 256 rows
// Tokens per block ("group"; one dw partial row per group): the streamed rows (group plus W'-1
// halo rows before it, and W'-1 after it in the backward) fill the 16 tiles exactly.
constexpr int group_tokens(int wp, bool bwd) { return kTilesPerGroup * kTT - (wp - 1) * (bwd ? 2 : 1); }
// Row-loop unroll (a multiple of the window W') and cp.async ring depth (tiles in shared memory),
// forward and backward; minimum resident blocks per SM (register budget 65536 / (128 * minblocks)).
#ifndef DT_CONV_UNROLL_FWD
#define DT_CONV_UNROLL_FWD 16
#endif
#ifndef DT_CONV_UNROLL_BWD
#define DT_CONV_UNROLL_BWD 4
#endif
#ifndef DT_CONV_STAGES_FWD
#define DT_CONV_STAGES_FWD 3
#endif
#ifndef DT_CONV_STAGES_BWD
#define DT_CONV_STAGES_BWD 2
#endif
#ifndef DT_CONV_MINB_FWD
#define DT_CONV_MINB_FWD 5
#endif
#ifndef DT_CONV_MINB_BWD
#define DT_CONV_MINB_BWD 5
#endif
constexpr int kMinBlocksFwd = DT_CONV_MINB_FWD;  // register budget: 65536 / (128 * minblocks)
constexpr int kMinBlocksBwd = DT_CONV_MINB_BWD;
// The forward alone needs ~80 registers (6 blocks per SM); with the gates' branch and the L2-norm
// pass ptxas spills at 6 blocks (85 registers), so the gate form also runs at 5 (96 registers,
// 8 bytes of spills at bf16 W' = 4).
constexpr int kMinBlocksFwdGate = 5;
constexpr int kMinBlocksBwdWide = 3;  // W' = 8 backward: its 8-tap windows spill below ~160 registers
template <bool BWD>
inline constexpr int kStages = BWD ? DT_CONV_STAGES_BWD : DT_CONV_STAGES_FWD;
template <bool BWD>
inline constexpr int kUnroll = BWD ? DT_CONV_UNROLL_BWD : DT_CONV_UNROLL_FWD;

enum : unsigned { kVecX = 1, kVecDy = 2, kVecOut = 4, kVecOut16 = 8 };  // kVecOut16: out rows 16-byte aligned

// Gates carried by the launch (causal_conv1d_gate_fwd/bwd): gate_blocks blocks at the front of
// the grid run the gates' row loops (gdn_gate.cuh), the rest the conv. Few blocks that loop
// over the rows (several rows in flight per thread), so they take few of the first wave's slots
// from the conv: measured at T = 32k, Hv = 32 (docs/perf.md v0.6.0), the backward costs +4.8 us
// with 128 blocks (8 tiles each) but +9.1 us with 512 (2 each).
constexpr int kGateRowsFwd = 4;          // forward rows per thread per row block
constexpr int kGateRowsBwd = 2;          // backward rows per thread in flight
constexpr int64_t kGateFwdBlocks = 128;  // forward blocks at most
constexpr int64_t kGateBwdBlocks = 128;  // backward blocks (= partial rows) at most

struct ConvParams {
  const void* x;             // [T, D] (row stride xs)
  const void* dy;            // [T, D] (row stride dys), backward only
  void* out;                 // y (forward) or dx (backward) [T, D] (row stride outs)
  const float* w;            // [D, W] (row stride ws)
  const float* bias;         // [D] or nullptr
  float* part;               // [ngroups, D, W'+1] fp32 partials (backward)
  const int32_t* seq_idx;    // [T]
  int64_t xs, dys, outs, ws;
  int64_t T, D;
  int W;
  int silu;
  unsigned vec;              // kVecX | kVecDy: rows 16-byte aligned; kVecOut: channel pairs aligned
  int64_t gate_blocks;       // GATE kernels: blocks that run the gates ...
  int gate_first;            // ... at the front of the grid (1) or at its end (0)
  GateFwdParams gf;          // forward gates
  GateBwdParams gb;          // backward gates
  // causal_conv1d_l2norm_fwd: channels [0, nrm_ch) are the q and k sections (nrm_ch / 2 each,
  // heads of nrm_d channels); they go L2-normalised to nrm_y[section] [T, nrm_ch / 2] with
  // rstd to nrm_r[section] [T * heads]; channel c >= nrm_ch goes to out at c - nrm_ch.
  // causal_conv1d_l2norm_bwd: dy of channels [0, nrm_ch) is l2norm_bwd_y(nrm_g, nrm_y, nrm_r) of
  // the section's head rows, made in shared memory as each tile lands; dy of channel c >= nrm_ch
  // is p.dy at c - nrm_ch.
  int64_t nrm_ch;            // 0: a plain conv
  int nrm_lg, nrm_tpr;       // log2 of the head dim; lanes per head row (as l2norm's tpr)
  float nrm_eps;
  void* nrm_y[2];            // qn, kn [T, heads, hd]: written (forward) or read (backward)
  float* nrm_r[2];           // rstd [T * heads]: likewise
  const void* nrm_g[2];      // backward: dqn, dkn [T, heads, hd]
};

template <typename T, bool BWD>
constexpr int buf_bytes() {  // one pipeline stage: x tile [kTT, kCB] (+ dy tile) + seq [kTT]
  return kTT * kCB * int(sizeof(T)) * (BWD ? 2 : 1) + kTT * 4;
}
template <typename T, bool BWD>
constexpr int smem_bytes() {
  return kStages<BWD> * buf_bytes<T, BWD>();
}
// The forward with the L2 norm also stages the tiles' outputs: s_y [2][kTT, kCB] T after the ring
// (tile k's steps fill one half while tile k - 1's norm pass reads the other).
template <typename T>
constexpr int nrm_stage_bytes() {
  return 2 * kTT * kCB * int(sizeof(T));
}
// The backward with the L2 norm loads per stage the tile's qn|kn rows and, per thread and row, the
// rstd of its own chunk's head: s_yn [kTT, kCB] T | s_rs [rows per thread][kThreads] f32.
template <typename T>
constexpr int nrm_bwd_stage_bytes() {
  return kTT * kCB * int(sizeof(T)) + kTT * kCB / (16 / int(sizeof(T))) * 4;
}

// One 16-byte chunk (kVec<T> channels from c) of row u into shared memory: cp.async when the
// row is valid, aligned and the chunk inside D; element loads for a ragged or unaligned chunk;
// zeros for an invalid row.
template <typename T>
__device__ __forceinline__ void load_chunk(T* s_dst, const T* g, int64_t gs, int64_t u, int64_t c, bool row_ok,
                                           int64_t D, bool vec_ok) {
  constexpr int V = ew::kVec<T>;
  if (row_ok && vec_ok && c + V <= D) {
    ew::cp_async16(s_dst, g + u * gs + c);
  } else if (row_ok && c < D) {
#pragma unroll
    for (int e = 0; e < V; ++e) s_dst[e] = (c + e < D) ? g[u * gs + c + e] : ew::from_f32<T>(0.f);
  } else {
    *reinterpret_cast<uint4*>(s_dst) = make_uint4(0u, 0u, 0u, 0u);
  }
}

template <typename T>
__device__ __forceinline__ void read_pair(const T* s, float (&r)[kCPT]) {
  if constexpr (std::is_same_v<T, float>) {
    const float2 f = *reinterpret_cast<const float2*>(s);
    r[0] = f.x, r[1] = f.y;
  } else {
    const uint32_t u = *reinterpret_cast<const uint32_t*>(s);
    r[0] = ew::bf16lo(u), r[1] = ew::bf16hi(u);
  }
}

// Channels c, c + 1 as one aligned pair (the caller knows both exist and the pair is aligned).
template <typename T>
__device__ __forceinline__ void store_pair_full(T* g_p, const float (&r)[kCPT]) {
  if constexpr (std::is_same_v<T, float>) *reinterpret_cast<float2*>(g_p) = make_float2(r[0], r[1]);
  else *reinterpret_cast<uint32_t*>(g_p) = ew::pack_bf16x2(r[0], r[1]);
}
// g_p points at channel c of the output row.
template <typename T>
__device__ __forceinline__ void store_pair(T* g_p, int64_t c, int64_t D, bool vec_ok, const float (&r)[kCPT]) {
  if (vec_ok && c + 1 < D) {
    store_pair_full<T>(g_p, r);
  } else {
    if (c < D) g_p[0] = ew::from_f32<T>(r[0]);
    if (c + 1 < D) g_p[1] = ew::from_f32<T>(r[1]);
  }
}

// The head dim whose L2-norm passes are compiled with it known (2^7 = 128, the Qwen3.5 shapes; W' = 4
// kernels only: the W' = 8 ones would spill), and l2norm's lanes per head row for a head dim 2^lg
// (nrm_setup's value, for the powers of two the fused ops take).
constexpr int kNormLgKnown = 7;
template <typename T>
constexpr int norm_lanes(int lg) {
  return (1 << lg) / ew::kVec<T> < 32 ? (1 << lg) / ew::kVec<T> : 32;
}

// The L2-norm pass over one staged tile (forward with p.nrm_ch > cb0): rows r of s_y [kTT, kCB]
// are tokens tok0 + r, owned when r in [r_lo, r_hi). Each (row, head-dim unit) is a group of
// p.nrm_tpr lanes with l2norm_fwd_kernel's slots, sum order and rounding, so qn, kn and rstd are
// its bits; units at or past nrm_ch (v channels of a mixed block) are copied out as they are.
// Every lane runs every unit (the group sums shuffle over whole warps); only stores are masked.
// The head dim is a power of two (p.nrm_lg = log2), so the unit indexing is shifts only.
// LGC > 0: the head dim 2^LGC known at compile time (the Qwen shapes' 128), so the unit loop,
// the group sums and the slot tests unroll away; the same lanes, sums and roundings.
template <typename T, int LGC = 0>
__device__ __forceinline__ void l2norm_tile(const ConvParams& p, const T* s_y, int64_t cb0, int64_t tok0, int r_lo,
                                            int r_hi) {
  constexpr int V = ew::kVec<T>, NS = (256 / V + 31) / 32;  // l2norm's slots per lane: 1 (bf16), 2 (f32)
  const int lg = LGC > 0 ? LGC : p.nrm_lg, hd = 1 << lg, lg_units = 8 - lg;  // kCB = 256 = 2^8 channels
  const int tpr = LGC > 0 ? norm_lanes<T>(LGC) : p.nrm_tpr;
  const int gpb = kThreads / tpr;
  const int lane = int(threadIdx.x) & (tpr - 1), grp = int(threadIdx.x) / tpr;
  const int64_t sec_ch = p.nrm_ch >> 1, heads = sec_ch >> lg;
  const int iters = (kTT << lg_units) / gpb;  // kTT * units is a multiple of gpb: warp-uniform trips
  constexpr int kUnrollUnits = LGC > 0 ? 8 : 1;  // (a runtime count unrolled would cost registers)
#pragma unroll kUnrollUnits
  for (int k = 0; k < iters; ++k) {
    const int it = grp + k * gpb;
    const int r = it >> lg_units, u = it & ((1 << lg_units) - 1);
    const int64_t cu = cb0 + (int64_t(u) << lg), tok = tok0 + r;
    const T* s_row = s_y + r * kCB + (u << lg);
    float r_x[NS][V];
    float r_ss = 0.f;
#pragma unroll
    for (int sl = 0; sl < NS; ++sl) {
      const int e0 = (lane + sl * tpr) * V;
      if (e0 < hd) {
        ew::unpack16<T>(*reinterpret_cast<const uint4*>(s_row + e0), r_x[sl]);
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) r_x[sl][k] = 0.f;
      }
#pragma unroll
      for (int k = 0; k < V; ++k) r_ss = fmaf(r_x[sl][k], r_x[sl][k], r_ss);
    }
    r_ss = ew::group_sum(r_ss, tpr);
    const float r_rstd = rsqrtf(r_ss + p.nrm_eps);
    if (r < r_lo || r >= r_hi) continue;
    if (cu >= p.nrm_ch) {  // v channels: out[tok, cu - nrm_ch + e], e < D - cu
      T* g_o = static_cast<T*>(p.out) + tok * p.outs + (cu - p.nrm_ch);
#pragma unroll
      for (int sl = 0; sl < NS; ++sl) {
        const int e0 = (lane + sl * tpr) * V;
        if (e0 < hd) ew::store_slot<T>(g_o, e0, p.D - cu, (p.vec & kVecOut16) != 0, r_x[sl]);
      }
    } else {
      const int sec = cu >= sec_ch ? 1 : 0;
      const int64_t row = tok * heads + ((cu - (sec ? sec_ch : 0)) >> lg);  // l2norm's row t * Hk + h
      T* g_y = static_cast<T*>(p.nrm_y[sec]) + (row << lg);
#pragma unroll
      for (int sl = 0; sl < NS; ++sl) {
        const int e0 = (lane + sl * tpr) * V;
        if (e0 < hd) {
          float r_y[V];
#pragma unroll
          for (int k = 0; k < V; ++k) r_y[k] = r_x[sl][k] * r_rstd;
          // Whole slots (hd is a multiple of V; qn|kn rows 16-byte aligned): store_slot's test is
          // always true, so the known head dim skips it (the general form keeps it: fewer registers).
          if constexpr (LGC > 0) ew::store16<T>(g_y + e0, r_y);
          else ew::store_slot<T>(g_y, e0, hd, true, r_y);
        }
      }
      if (lane == 0) p.nrm_r[sec][row] = r_rstd;
    }
  }
}

// ============================================================================== kernels
// grid.x = ngroups * ncb (ngroups = ceil(T / group_tokens(WP, BWD)), ncb = ceil(D / kCB)), channel
// block fastest;
// block = kThreads; dynamic shared memory = smem_bytes<T, BWD>().
// Forward: streams rows [A - (WP-1), Bc) of its group [A, Bc) and writes y[A:Bc].
// Backward: streams rows [A - (WP-1), Bc + WP - 1), writes dx[A:Bc] and the group's partials
// p.part[group, c, 0:WP] (dw, padded taps first) and p.part[group, c, WP] (dbias).
// GATE: blocks [0, gate_blocks) (or the last gate_blocks) run the gates instead (forward rows, or
// backward tiles and their partial rows p.gb.part), the conv's blocks the rest in order.
template <typename T, int WP, bool BWD, bool GATE>
__global__ __launch_bounds__(kThreads, BWD ? (WP > 4 ? kMinBlocksBwdWide : kMinBlocksBwd)
                                           : (GATE && WP == 4 ? kMinBlocksFwdGate : kMinBlocksFwd)) void
conv1d_varlen_kernel(const ConvParams p) {
  extern __shared__ __align__(16) unsigned char s_raw[];
  int64_t bid = blockIdx.x;
  if constexpr (GATE) {
    // The gate blocks are [0, gate_blocks) or, with gate_first = 0, the last gate_blocks.
    const int64_t gb = p.gate_first ? bid : bid - (int64_t(gridDim.x) - p.gate_blocks);
    if (gb >= 0 && gb < p.gate_blocks) {
      static_assert(!BWD || 2 * kThreads * gate::kE * 4 <= kStages<BWD> * buf_bytes<T, BWD>(),
                    "the gates' block sums use the conv's shared memory");
      if constexpr (BWD) gate::bwd_tiles<T, kThreads, kGateRowsBwd>(p.gb, gb, p.gate_blocks, reinterpret_cast<float*>(s_raw));
      else gate::fwd_rows<T, kThreads, kGateRowsFwd, true>(p.gf, gb, p.gate_blocks);
      return;
    }
    if (p.gate_first) bid -= p.gate_blocks;
  }
  constexpr int V = ew::kVec<T>;
  constexpr int kTileElems = kTT * kCB;
  constexpr int kBuf = buf_bytes<T, BWD>();
  constexpr int kChunksPerRow = kCB / V;
  constexpr int kChunkIters = kTT * kChunksPerRow / kThreads;
  static_assert(kTT * kChunksPerRow % kThreads == 0, "tile chunks must divide evenly");

  const int64_t ncb = (p.D + kCB - 1) / kCB;
  const int64_t grp = bid / ncb;
  const int64_t cb0 = (bid - grp * ncb) * kCB;
  constexpr int kGroup = group_tokens(WP, BWD);
  const int64_t A = grp * kGroup;
  const int64_t Bc = min(A + int64_t(kGroup), p.T);
  const int64_t u_begin = A - (WP - 1);
  const int64_t u_end = BWD ? Bc + (WP - 1) : Bc;
  const int ntiles = int((u_end - u_begin + kTT - 1) / kTT);
  const int64_t c0 = cb0 + int64_t(kCPT) * threadIdx.x;  // this thread's first channel
  const T* __restrict__ g_x = static_cast<const T*>(p.x);
  const T* __restrict__ g_dy = static_cast<const T*>(p.dy);
  T* __restrict__ g_out = static_cast<T*>(p.out);

  // s_x [kTT, kCB] T | s_dy [kTT, kCB] T (backward) | s_seq [kTT] int32, S times (ring).
  constexpr int S = kStages<BWD>, kUn = kUnroll<BWD>;
  auto s_x = [&](int buf) { return reinterpret_cast<T*>(s_raw + buf * kBuf); };
  auto s_dy = [&](int buf) { return reinterpret_cast<T*>(s_raw + buf * kBuf + kTileElems * int(sizeof(T))); };
  auto s_seq = [&](int buf) {
    return reinterpret_cast<int32_t*>(s_raw + buf * kBuf + kTileElems * int(sizeof(T)) * (BWD ? 2 : 1));
  };
  // Backward with the L2 norm: per-stage qn|kn rows and per-thread rstd after the ring.
  constexpr int kNrmBwd = nrm_bwd_stage_bytes<T>();
  auto s_yn = [&](int buf) { return reinterpret_cast<T*>(s_raw + S * kBuf + buf * kNrmBwd); };
  auto s_rs = [&](int buf) {
    return reinterpret_cast<float*>(s_raw + S * kBuf + buf * kNrmBwd + kTileElems * int(sizeof(T)));
  };
  const bool nrm_bwd = BWD && cb0 < p.nrm_ch;  // block-uniform

  // This thread's chunk column is fixed (kThreads is a multiple of kChunksPerRow); its rows step
  // by kRowStep. Rows outside [0, min(T, u_end)) are zero-filled.
  constexpr int kRowStep = kThreads / kChunksPerRow;
  static_assert(kThreads % kChunksPerRow == 0, "a thread's chunk column must be fixed");
  const int cc0 = int(threadIdx.x) % kChunksPerRow, r_first = int(threadIdx.x) / kChunksPerRow;
  const int64_t c_ld = cb0 + int64_t(cc0) * V;
  const int64_t u_lim = min(p.T, u_end);
  auto load_tile = [&](int k, int buf) {
    const int64_t ut = u_begin + int64_t(k) * kTT;
#pragma unroll
    for (int it = 0; it < kChunkIters; ++it) {
      const int r = r_first + it * kRowStep;
      const int64_t u = ut + r;
      const bool row_ok = u >= 0 && u < u_lim;
      load_chunk<T>(s_x(buf) + r * kCB + cc0 * V, g_x, p.xs, u, c_ld, row_ok, p.D, p.vec & kVecX);
      if constexpr (BWD) {  // dy rows before A only feed pending sums of earlier groups: skip them
        const bool dy_ok = row_ok && u >= A;
        if (c_ld >= p.nrm_ch) {  // dy = p.dy at c - nrm_ch (nrm_ch = 0 but with the L2 norm)
          load_chunk<T>(s_dy(buf) + r * kCB + cc0 * V, g_dy, p.dys, u, c_ld - p.nrm_ch, dy_ok, p.D - p.nrm_ch,
                        p.vec & kVecDy);
        } else {  // q|k channels: this chunk of the head row's dqn|dkn and qn|kn, and its rstd
          const int sec = c_ld >= (p.nrm_ch >> 1) ? 1 : 0;
          const int64_t hc = c_ld - (sec ? p.nrm_ch >> 1 : 0), heads = (p.nrm_ch >> 1) >> p.nrm_lg;
          const int64_t row = u * heads + (hc >> p.nrm_lg);
          const int64_t off = (row << p.nrm_lg) + (hc & ((int64_t(1) << p.nrm_lg) - 1));
          T* d_dy = s_dy(buf) + r * kCB + cc0 * V;
          T* d_yn = s_yn(buf) + r * kCB + cc0 * V;
          if (dy_ok) {
            ew::cp_async16(d_dy, static_cast<const T*>(p.nrm_g[sec]) + off);
            ew::cp_async16(d_yn, static_cast<const T*>(p.nrm_y[sec]) + off);
          } else {
            *reinterpret_cast<uint4*>(d_dy) = make_uint4(0u, 0u, 0u, 0u);
            *reinterpret_cast<uint4*>(d_yn) = make_uint4(0u, 0u, 0u, 0u);
          }
          ew::cp_async4_zfill(s_rs(buf) + it * kThreads + threadIdx.x, p.nrm_r[sec] + (dy_ok ? row : 0), dy_ok);
        }
      }
    }
    if (threadIdx.x < kTT) {
      // Invalid rows get sentinels that keep the column non-decreasing and match no sequence:
      // -2 before the first token, INT_MAX after the stream (x = dy = 0 there anyway).
      const int64_t u = ut + threadIdx.x;
      if (u >= 0 && u < u_lim) ew::cp_async4_zfill(s_seq(buf) + threadIdx.x, p.seq_idx + u, true);
      else s_seq(buf)[threadIdx.x] = u < 0 ? -2 : INT_MAX;
    }
  };

  // The L2-norm backward of a landed tile's q|k chunks, in place in s_dy: dy = rstd (dqn - qn
  // sum(dqn qn)) per head row, exactly l2norm_bwd_y's lanes, order and rounding. A head row's
  // chunks are consecutive lanes of one warp (the chunk column is the lane for bf16, lane + 32
  // per warp pair for f32), which are l2norm's lanes for that row: each thread only transforms
  // the chunks it loaded itself. Every lane joins the group sums; only q|k chunks are written.
  // tpr_tag: the lanes per head row when the head dim is known (kNormLgKnown), else 0 (p.nrm_tpr).
  auto l2norm_bwd_chunks = [&](int buf, auto tpr_tag) {
    constexpr int TPR = decltype(tpr_tag)::value;
    const int tpr = TPR > 0 ? TPR : p.nrm_tpr;
#pragma unroll
    for (int it = 0; it < kChunkIters; ++it) {
      const int r = r_first + it * kRowStep;
      T* d_dy = s_dy(buf) + r * kCB + cc0 * V;
      float r_dy[V], r_y[V];
      ew::unpack16<T>(*reinterpret_cast<const uint4*>(d_dy), r_dy);
      ew::unpack16<T>(*reinterpret_cast<const uint4*>(s_yn(buf) + r * kCB + cc0 * V), r_y);
      float r_dot = 0.f;
#pragma unroll
      for (int e = 0; e < V; ++e) r_dot = fmaf(r_dy[e], r_y[e], r_dot);
      r_dot = ew::group_sum(r_dot, tpr);
      if (c_ld < p.nrm_ch) {
        const float r_rstd = s_rs(buf)[it * kThreads + threadIdx.x];
        float r_dx[V];
#pragma unroll
        for (int e = 0; e < V; ++e) r_dx[e] = r_rstd * (r_dy[e] - r_y[e] * r_dot);
        *reinterpret_cast<uint4*>(d_dy) = ew::pack16<T>(r_dx);
      }
    }
  };

  // Per-thread constants: taps right-aligned in a WP-wide window (leading WP-W taps are 0).
  float r_w[kCPT][WP], r_b[kCPT];  // [channel, tap]
#pragma unroll
  for (int ch = 0; ch < kCPT; ++ch) {
    const int64_t c = c0 + ch;
#pragma unroll
    for (int jj = 0; jj < WP; ++jj) {
      const int j = jj - (WP - p.W);
      r_w[ch][jj] = (c < p.D && j >= 0) ? __ldg(p.w + c * p.ws + j) : 0.f;
    }
    r_b[ch] = (p.bias != nullptr && c < p.D) ? __ldg(p.bias + c) : 0.f;
  }
  float r_xw[kCPT][WP];  // x window: r_xw[.][jj] = x[u - (WP-1) + jj]
  int r_sw[WP];          // seq_idx of the window rows
  float r_pend[kCPT][WP], r_dw[kCPT][WP], r_db[kCPT];  // backward: pending dx of rows u-(WP-1)+jj; partials
#pragma unroll
  for (int jj = 0; jj < WP; ++jj) {
    r_sw[jj] = -1;
#pragma unroll
    for (int ch = 0; ch < kCPT; ++ch) r_xw[ch][jj] = 0.f, r_pend[ch][jj] = 0.f, r_dw[ch][jj] = 0.f;
  }
#pragma unroll
  for (int ch = 0; ch < kCPT; ++ch) r_db[ch] = 0.f;
  const bool out_vec = (p.vec & kVecOut) || (!BWD && cb0 < p.nrm_ch);  // s_y pairs are aligned
  // Every thread's pair exists and is aligned; W' = 4 only (the W' = 8 forms would spill with a
  // third copy of the row loop).
  const bool fast_block = WP == 4 && p.silu && out_vec && cb0 + kCB <= p.D;
  const bool norm_known = WP == 4 && p.nrm_lg == kNormLgKnown;  // the head dim's compiled-in norm passes
  const int nown = int(Bc - A);  // tokens of this group
  // Forward with the L2 norm: this block's channels start in the q|k sections, so its outputs
  // go to s_y and l2norm_tile stores them (block-uniform).
  const bool staged = !BWD && cb0 < p.nrm_ch;
  T* s_y = reinterpret_cast<T*>(s_raw + S * kBuf);
  const int64_t out_c0 = c0 - (BWD ? 0 : p.nrm_ch);  // the output column of channel c0 (unstaged blocks)
  const int64_t row_step = staged ? kCB : p.outs;
  auto norm_pass = [&](int kk) {  // tile kk's staged outputs -> qn, kn, rstd, v
    const int rel0k = kk * kTT - (WP - 1);
    const T* s_t = s_y + (kk & 1) * kTileElems;
    const int r_lo = max(0, -rel0k), r_hi = min(kTT, nown - rel0k);
    if (norm_known) l2norm_tile<T, kNormLgKnown>(p, s_t, cb0, A + rel0k, r_lo, r_hi);
    else l2norm_tile<T>(p, s_t, cb0, A + rel0k, r_lo, r_hi);
  };

#pragma unroll
  for (int k = 0; k < S - 1; ++k) {
    if (k < ntiles) load_tile(k, k);
    ew::cp_async_commit();
  }
  int buf = 0;  // k % S
  for (int k = 0; k < ntiles; ++k) {
    // The buffer of tile k - 1 (freed by the barrier closing iteration k - 1) takes tile k + S - 1.
    if (k + S - 1 < ntiles) load_tile(k + S - 1, buf == 0 ? S - 1 : buf - 1);
    ew::cp_async_commit();
    ew::cp_async_wait<S - 1>();  // tile k has landed (this thread's copies) ...
    if (BWD && nrm_bwd) {  // on this thread's own chunks only: no barrier
      if (norm_known) l2norm_bwd_chunks(buf, std::integral_constant<int, norm_lanes<T>(kNormLgKnown)>{});
      else l2norm_bwd_chunks(buf, std::integral_constant<int, 0>{});
    }
    __syncthreads();             // ... and everyone's
    const T* s_xb = s_x(buf) + kCPT * threadIdx.x;
    const T* s_dyb = s_dy(buf) + kCPT * threadIdx.x;
    const int32_t* s_sq = s_seq(buf);
    // Tile-local 32-bit positions relative to the group start A: row r of the tile is token
    // A + rel0 + r. The output row pointer runs along with r (outs elements per row): it points
    // at row u (forward) or at row u - (WP-1), whose dx completes at step u (backward).
    const int rel0 = k * kTT - (WP - 1);
    // Staged (forward with the L2 norm): tile row r goes to s_y row r instead (generic stores).
    T* g_row = staged ? s_y + (k & 1) * kTileElems + kCPT * threadIdx.x
                      : g_out + (u_begin + int64_t(k) * kTT - (BWD ? (WP - 1) : 0)) * p.outs + out_c0;

    // One step of the stream (row r of the tile). MASKED: the window may hold rows of an
    // earlier sequence, so every tap checks seq_idx; otherwise all taps are valid.
    auto step = [&](int r, auto masked_tag, auto interior_tag, auto fast_tag) {
      constexpr bool MASKED = decltype(masked_tag)::value;
      // FAST (interior, unmasked tiles of full blocks with SiLU: the bulk of the work): no bounds
      // or alignment tests per row and no runtime SiLU flag; the same arithmetic as the general
      // path, so the same bits.
      constexpr bool FAST = decltype(fast_tag)::value;
      constexpr bool INTERIOR = decltype(interior_tag)::value;  // every row of the tile is owned (and,
                                                                // backward, completes an owned dx row)
      const int rel = rel0 + r;  // token u = A + rel
      float r_xn[kCPT];
      read_pair<T>(s_xb + r * kCB, r_xn);
#pragma unroll
      for (int jj = 0; jj < WP - 1; ++jj)
#pragma unroll
        for (int ch = 0; ch < kCPT; ++ch) r_xw[ch][jj] = r_xw[ch][jj + 1];
#pragma unroll
      for (int ch = 0; ch < kCPT; ++ch) r_xw[ch][WP - 1] = r_xn[ch];
      bool m[WP];  // tap jj reads a row of u's sequence
      if constexpr (MASKED) {
        const int sq = s_sq[r];
#pragma unroll
        for (int jj = 0; jj < WP - 1; ++jj) r_sw[jj] = r_sw[jj + 1];
        r_sw[WP - 1] = sq;
#pragma unroll
        for (int jj = 0; jj < WP; ++jj) m[jj] = r_sw[jj] == sq;
      } else {
#pragma unroll
        for (int jj = 0; jj < WP; ++jj) m[jj] = true;
      }
      // Masking selects values (never multiplies by a 0/1 mask), so whatever another sequence
      // holds cannot leak in, not even as 0 * inf.
      float r_xm[kCPT][WP], r_yp[kCPT];  // masked window; y_pre
#pragma unroll
      for (int ch = 0; ch < kCPT; ++ch) {
        float acc = r_b[ch];
#pragma unroll
        for (int jj = 0; jj < WP; ++jj) {
          r_xm[ch][jj] = m[jj] ? r_xw[ch][jj] : 0.f;
          acc = fmaf(r_w[ch][jj], r_xm[ch][jj], acc);
        }
        r_yp[ch] = acc;
      }
      if constexpr (!BWD) {
        if (INTERIOR || (rel >= 0 && rel < nown)) {
          float r_y[kCPT];
#pragma unroll
          for (int ch = 0; ch < kCPT; ++ch) r_y[ch] = (FAST || p.silu) ? r_yp[ch] * ew::sigmoid_f(r_yp[ch]) : r_yp[ch];
          if constexpr (FAST) store_pair_full<T>(g_row, r_y);
          else store_pair<T>(g_row, c0, p.D, out_vec, r_y);
        }
      } else {
        float r_dyn[kCPT];
        read_pair<T>(s_dyb + r * kCB, r_dyn);
        const bool own = INTERIOR || (rel >= 0 && rel < nown);  // u's dw/dbias terms belong to this group
#pragma unroll
        for (int ch = 0; ch < kCPT; ++ch) {
          float dyp = r_dyn[ch];
          if (FAST || p.silu) {
            const float sg = ew::sigmoid_f(r_yp[ch]);
            dyp *= sg * fmaf(r_yp[ch], 1.f - sg, 1.f);
          }
#pragma unroll
          for (int jj = 0; jj < WP; ++jj) r_pend[ch][jj] = fmaf(m[jj] ? r_w[ch][jj] : 0.f, dyp, r_pend[ch][jj]);
          if (own) {
#pragma unroll
            for (int jj = 0; jj < WP; ++jj) r_dw[ch][jj] = fmaf(dyp, r_xm[ch][jj], r_dw[ch][jj]);
            r_db[ch] += dyp;
          }
        }
        const int rel_s = rel - (WP - 1);  // row A + rel_s has its dx complete (g_row points at it)
        if (INTERIOR || (rel_s >= 0 && rel_s < nown)) {
          float r_dx[kCPT];
#pragma unroll
          for (int ch = 0; ch < kCPT; ++ch) r_dx[ch] = r_pend[ch][0];
          if constexpr (FAST) store_pair_full<T>(g_row, r_dx);
          else store_pair<T>(g_row, c0, p.D, out_vec, r_dx);
        }
#pragma unroll
        for (int ch = 0; ch < kCPT; ++ch) {
#pragma unroll
          for (int jj = 0; jj < WP - 1; ++jj) r_pend[ch][jj] = r_pend[ch][jj + 1];
          r_pend[ch][WP - 1] = 0.f;
        }
      }
      g_row += row_step;
    };

    // Block-uniform: is the window plus the whole tile inside one sequence? The seq column
    // (with its sentinels) is non-decreasing, so comparing the oldest window row with the
    // tile's last row decides it.
    // Interior: all rows of the tile inside [A, Bc) (and, backward, their dx rows too).
    const int sq_last = s_sq[kTT - 1];
    const bool interior = rel0 - (BWD ? WP - 1 : 0) >= 0 && rel0 + kTT <= nown;
    if (r_sw[1] == sq_last && s_sq[0] == sq_last) {
      if (interior && fast_block) {
#pragma unroll kUn
        for (int r = 0; r < kTT; ++r) step(r, std::false_type{}, std::true_type{}, std::true_type{});
      } else if (interior) {
#pragma unroll kUn
        for (int r = 0; r < kTT; ++r) step(r, std::false_type{}, std::true_type{}, std::false_type{});
      } else {
#pragma unroll kUn
        for (int r = 0; r < kTT; ++r) step(r, std::false_type{}, std::false_type{}, std::false_type{});
      }
#pragma unroll
      for (int jj = 0; jj < WP; ++jj) r_sw[jj] = sq_last;
    } else {
#pragma unroll kUn
      for (int r = 0; r < kTT; ++r) step(r, std::true_type{}, std::false_type{}, std::false_type{});
    }
    // The previous tile's norm pass: its s_y half was filled before the last iteration's closing
    // barrier, and is refilled only after this iteration's.
    if (!BWD && staged && k > 0) norm_pass(k - 1);
    __syncthreads();  // this buffer (and the other s_y half) is refilled by the next iteration
    buf = buf == S - 1 ? 0 : buf + 1;
  }

  if (!BWD && staged && ntiles > 0) norm_pass(ntiles - 1);  // after the loop's closing barrier
  if constexpr (BWD) {
    ew::pdl_trigger();  // the partials reduction may start launching (it waits for our writes)
#pragma unroll
    for (int ch = 0; ch < kCPT; ++ch) {
      const int64_t c = c0 + ch;
      if (c < p.D) {
        float* g_p = p.part + (grp * p.D + c) * (WP + 1);
#pragma unroll
        for (int jj = 0; jj < WP; ++jj) g_p[jj] = r_dw[ch][jj];
        g_p[WP] = r_db[ch];
      }
    }
  }
}

// Second backward pass: column col = c * (WP+1) + jj of the partials, summed over groups in a
// fixed order (ew::colsum_kernel), goes to dw[c, jj - (WP-W)] (real taps) or dbias[c] (jj = WP).
struct ConvGradOut {
  float* dw;
  int64_t ws;
  float* dbias;  // nullptr: not requested
  int W, WP;
  __device__ __forceinline__ void operator()(int64_t col, float v) const {
    const int64_t c = col / (WP + 1);
    const int jj = int(col - c * (WP + 1));
    if (jj == WP) {
      if (dbias != nullptr) dbias[c] += v;
    } else {
      const int j = jj - (WP - W);
      if (j >= 0) dw[c * ws + j] += v;
    }
  }
};

// ============================================================================== launchers
struct Act {  // a [T, D] activation view: row stride, 16-byte aligned rows
  int64_t stride = 0;
  bool vec16 = false, vec_pair = false;
};

Act check_act(const TensorView& v, const TensorView& x, const char* op, const char* what) {
  DT_CHECK(v.device.is_cuda() && v.device == x.device, "{}: {} must be a CUDA view on {}, got {}", op, what,
           x.device.str(), v.str());
  DT_CHECK(v.dtype == x.dtype, "{}: {} must have x's dtype {}, got {}", op, what, dtype_name(x.dtype), v.str());
  DT_CHECK(v.ndim() == 2 && v.shape == x.shape && (v.shape[1] <= 1 || v.stride[1] == 1),
           "{}: {} must be {} with a unit inner stride, got {}", op, what, x.shape.str(), v.str());
  Act a;
  a.stride = v.stride[0];
  const int64_t sz = int64_t(dtype_size(v.dtype));
  a.vec16 = ew::aligned16(v.data) && (a.stride * sz) % 16 == 0;
  a.vec_pair = reinterpret_cast<uintptr_t>(v.data) % uintptr_t(2 * sz) == 0 && a.stride % 2 == 0;
  return a;
}

struct ConvDims {
  int64_t T = 0, D = 0;
  int W = 0;
};

ConvDims check_common(const TensorView& x, const TensorView& w, const TensorView& bias, const VarlenMeta& m,
                      const char* op) {
  DT_CHECK(x.device.is_cuda(), "{}: x must be a CUDA view, got {}", op, x.str());
  DT_CHECK(x.dtype == DType::bf16 || x.dtype == DType::f32, "{}: x must be bf16 or f32, got {}", op, x.str());
  DT_CHECK(x.ndim() == 2 && (x.shape[1] <= 1 || x.stride[1] == 1), "{}: x must be [T, D] with a unit inner stride, got {}",
           op, x.str());
  ConvDims d{x.shape[0], x.shape[1], 0};
  DT_CHECK(w.device == x.device && w.dtype == DType::f32 && w.ndim() == 2 && w.shape[0] == d.D &&
               (w.shape[1] <= 1 || w.stride[1] == 1),
           "{}: w must be an f32 [D={}, W] view (HF [D, 1, W] viewed as [D, W]) with a unit inner stride on {}, got {}",
           op, d.D, x.device.str(), w.str());
  d.W = int(w.shape[1]);
  DT_CHECK(d.W >= 2 && d.W <= 8, "{}: conv width W must be in [2, 8], got {} ({})", op, d.W, w.str());
  if (!ew::is_absent(bias))
    DT_CHECK(bias.device == x.device && bias.dtype == DType::f32 && bias.numel() == d.D && bias.is_contiguous(),
             "{}: bias must be an empty view or a contiguous f32 [{}] view, got {}", op, d.D, bias.str());
  DT_CHECK(m.total == d.T, "{}: x holds {} tokens but VarlenMeta.total is {}", op, d.T, m.total);
  DT_CHECK(d.T == 0 || (m.seq_idx_dev != nullptr && m.device.is_cuda()),
           "{}: VarlenMeta has no device seq_idx (build the VarlenBatch on {})", op, x.device.str());
  return d;
}

int64_t num_groups(int64_t T, int W, bool bwd) {
  const int g = group_tokens(W > 4 ? 8 : 4, bwd);
  return (T + g - 1) / g;
}

template <typename T, int WP, bool BWD, bool GATE>
void launch_conv(const ConvParams& p, int64_t ngroups, cudaStream_t st) {
  const int smem =
      smem_bytes<T, BWD>() + (p.nrm_ch > 0 ? (BWD ? kStages<true> * nrm_bwd_stage_bytes<T>() : nrm_stage_bytes<T>()) : 0);
  auto kernel = conv1d_varlen_kernel<T, WP, BWD, GATE>;
  if (smem > 48 * 1024) DT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int64_t ncb = (p.D + kCB - 1) / kCB;
  const int64_t blocks = ngroups * ncb + (GATE ? p.gate_blocks : 0);
  DT_CHECK(blocks <= int64_t(INT_MAX), "causal_conv1d: {} blocks exceed the grid limit (T = {}, D = {})", blocks, p.T,
           p.D);
  kernel<<<unsigned(blocks), kThreads, smem, st>>>(p);
  DT_CUDA_LAUNCH_CHECK();
}

template <bool BWD, bool GATE>
void dispatch_conv(DType dt, const ConvParams& p, int64_t ngroups, cudaStream_t st) {
  const bool wide = p.W > 4;
  if (dt == DType::bf16) {
    if (wide) launch_conv<__nv_bfloat16, 8, BWD, GATE>(p, ngroups, st);
    else launch_conv<__nv_bfloat16, 4, BWD, GATE>(p, ngroups, st);
  } else {
    if (wide) launch_conv<float, 8, BWD, GATE>(p, ngroups, st);
    else launch_conv<float, 4, BWD, GATE>(p, ngroups, st);
  }
}

// The forward's parameters (views checked); false when there is nothing to compute.
// An activation that holds only x's channels from `skip` on ([T, D - skip]; skip = 0: check_act).
Act check_act_from(const TensorView& v, const TensorView& x, int64_t skip, const char* op, const char* what) {
  if (skip == 0) return check_act(v, x, op, what);
  DT_CHECK(v.ndim() == 2 && v.shape[0] == x.shape[0] && v.shape[1] == x.shape[1] - skip,
           "{}: {} must be [T={}, {}], got {}", op, what, x.shape[0], x.shape[1] - skip, v.str());
  DT_CHECK(v.dtype == x.dtype && v.device == x.device, "{}: {} must have x's dtype and device ({}), got {}", op, what,
           x.str(), v.str());
  return check_act(v, v, op, what);
}

// The forward's parameters; false when there is nothing to compute. nrm_ch > 0
// (causal_conv1d_l2norm_fwd): y holds only the channels from nrm_ch on, [T, D - nrm_ch].
bool fwd_params(ConvParams* p, const TensorView& y, const TensorView& x, const TensorView& w, const TensorView& bias,
                bool silu, const VarlenMeta& m, const char* op, int64_t nrm_ch = 0) {
  const ConvDims d = check_common(x, w, bias, m, op);
  const Act xa = check_act(x, x, op, "x");                // [T, D]
  const Act ya = check_act_from(y, x, nrm_ch, op, "y");  // [T, D - nrm_ch] (=)
  *p = ConvParams{};
  p->x = x.data, p->xs = xa.stride;
  p->out = y.data, p->outs = ya.stride;
  p->w = w.ptr<float>(), p->ws = w.stride[0];
  p->bias = ew::is_absent(bias) ? nullptr : bias.ptr<float>();
  p->seq_idx = m.seq_idx_dev;
  p->T = d.T, p->D = d.D, p->W = d.W, p->silu = silu ? 1 : 0;
  p->vec = (xa.vec16 ? kVecX : 0) | (ya.vec_pair ? kVecOut : 0) | (ya.vec16 ? kVecOut16 : 0);
  return d.T > 0 && d.D > 0;
}

// The L2 norm's fields for q|k sections of H heads of hd channels each (hd a power of two).
void nrm_setup(ConvParams* p, int64_t H, int64_t hd, DType dt) {
  p->nrm_ch = 2 * H * hd;
  p->nrm_lg = 0;
  while ((int64_t(1) << p->nrm_lg) < hd) ++p->nrm_lg;
  p->nrm_tpr = std::min(32, ew::pow2_ceil(int(hd) / (dt == DType::bf16 ? 8 : 4)));  // l2norm's lanes per row
}

// The backward's parameters but the partials pointer; false when there is nothing to compute.
// nrm_ch > 0 (causal_conv1d_l2norm_bwd): dy holds only the channels from nrm_ch on, [T, D - nrm_ch].
bool bwd_params(ConvParams* p, const TensorView& dx, const TensorView& dw, const TensorView& dbias,
                const TensorView& dy, const TensorView& x, const TensorView& w, const TensorView& bias, bool silu,
                const VarlenMeta& m, const char* op, int64_t nrm_ch = 0) {
  const ConvDims d = check_common(x, w, bias, m, op);
  const Act xa = check_act(x, x, op, "x");                   // [T, D]
  const Act dya = check_act_from(dy, x, nrm_ch, op, "dy");  // [T, D - nrm_ch]
  const Act dxa = check_act(dx, x, op, "dx");  // [T, D] (=)
  DT_CHECK(dw.device == x.device && dw.dtype == DType::f32 && dw.ndim() == 2 && dw.shape == w.shape &&
               (dw.shape[1] <= 1 || dw.stride[1] == 1),
           "{}: dw must be an f32 {} view with a unit inner stride on {}, got {}", op, w.shape.str(), x.device.str(),
           dw.str());
  if (!ew::is_absent(dbias))
    DT_CHECK(dbias.device == x.device && dbias.dtype == DType::f32 && dbias.numel() == d.D && dbias.is_contiguous(),
             "{}: dbias must be an empty view or a contiguous f32 [{}] view, got {}", op, d.D, dbias.str());
  *p = ConvParams{};
  p->x = x.data, p->xs = xa.stride;
  p->dy = dy.data, p->dys = dya.stride;
  p->out = dx.data, p->outs = dxa.stride;
  p->w = w.ptr<float>(), p->ws = w.stride[0];
  p->bias = ew::is_absent(bias) ? nullptr : bias.ptr<float>();
  p->seq_idx = m.seq_idx_dev;
  p->T = d.T, p->D = d.D, p->W = d.W, p->silu = silu ? 1 : 0;
  p->vec = (xa.vec16 ? kVecX : 0) | (dya.vec16 ? kVecDy : 0) | (dxa.vec_pair ? kVecOut : 0);
  return d.T > 0 && d.D > 0;
}

// The backward's scratch and second pass around the main kernel (the gates' too when GATE).
template <bool GATE>
void run_bwd(ConvParams& p, DType dt, Device dev, const TensorView& dw, const TensorView& dbias,
             const GdnGateBwdViews* gate, cudaStream_t st) {
  const int WP = p.W > 4 ? 8 : 4;
  const int64_t ngroups = num_groups(p.T, p.W, true);
  // Scratch: fp32 partials of every group (stream-ordered reuse; see the file header).
  Tensor part = Tensor::empty(Shape{ngroups, p.D, int64_t(WP + 1)}, DType::f32, dev);  // [ngroups, D, WP+1]
  p.part = part.ptr<float>();
  Tensor gpart;
  if constexpr (GATE) {
    gpart = Tensor::empty(Shape{p.gate_blocks, 2 * int64_t(p.gb.H)}, DType::f32, dev);  // [gate_blocks, 2 Hv]
    p.gb.part = gpart.ptr<float>();
  }
  dispatch_conv<true, GATE>(dt, p, ngroups, st);
  const ConvGradOut conv_out{dw.ptr<float>(), dw.stride[0], ew::is_absent(dbias) ? nullptr : dbias.ptr<float>(), p.W,
                             WP};
  if constexpr (GATE)  // both column sums in one dependent launch
    ew::colsum_apply2(conv_out, part.ptr<float>(), ngroups, p.D * (WP + 1),
                      ew::AddToSplit{gate->dA_log.ptr<float>(), gate->ddt_bias.ptr<float>(), p.gb.H}, p.gb.part,
                      p.gate_blocks, 2 * int64_t(p.gb.H), st);
  else
    ew::colsum_apply(conv_out, part.ptr<float>(), ngroups, p.D * (WP + 1), st);
}

// The gate-block caps: kGateFwdBlocks / kGateBwdBlocks, or DT_CONV_GATE_FWD_BLOCKS /
// DT_CONV_GATE_BWD_BLOCKS (tuning knobs for A/B runs: a positive integer; read on every call).
int64_t gate_block_cap(const char* var, int64_t dflt) {
  return env::whole_number(var, 1, int64_t(1) << 20, dflt, "the conv launch's gate blocks");
}

// Where the gate blocks go: the front (default), or the end with DT_CONV_GATE_LAST=1 (A/B knob).
int gate_first() {
  return env::choice("DT_CONV_GATE_LAST", {{"0", "gate blocks first"}, {"1", "gate blocks last"}}) == 1 ? 0 : 1;
}

// The gates' views must share the conv's rows (T) and device.
void check_gate_rows(int64_t T_gate, int64_t T, Device gdev, Device dev, const char* op) {
  DT_CHECK(T_gate == T && gdev == dev, "{}: the gates' a has {} rows on {}, the conv's x {} rows on {}", op, T_gate,
           gdev.str(), T, dev.str());
}

// The gates' parameters in a conv launch (their checks, block count and place); the caller has
// the conv's. gate_fwd_setup / gate_bwd_setup.
void gate_fwd_setup(ConvParams& p, const TensorView& x, const GdnGateFwdViews& gt, const char* op) {
  p.gf = gate_fwd_params(gt.g, gt.beta, gt.a, gt.b, gt.A_log, gt.dt_bias, op);
  check_gate_rows(p.gf.T, x.shape[0], gt.a.device, x.device, op);
  DT_CHECK(gt.a.dtype == x.dtype, "{}: the gates' a must have x's dtype {}, got {}", op, dtype_name(x.dtype),
           gt.a.str());
  p.gate_first = gate_first();
  p.gate_blocks =
      gate_block_count(p.gf.T, p.gf.cpr, kThreads, kGateRowsFwd, gate_block_cap("DT_CONV_GATE_FWD_BLOCKS", kGateFwdBlocks));
}
void gate_bwd_setup(ConvParams& p, const TensorView& x, const GdnGateBwdViews& gt, const char* op) {
  p.gb = gate_bwd_params(gt.da, gt.db, gt.dA_log, gt.ddt_bias, gt.dg, gt.dbeta, gt.a, gt.b, gt.A_log, gt.dt_bias, op);
  check_gate_rows(p.gb.T, x.shape[0], gt.a.device, x.device, op);
  DT_CHECK(gt.a.dtype == x.dtype, "{}: the gates' a must have x's dtype {}, got {}", op, dtype_name(x.dtype),
           gt.a.str());
  p.gate_first = gate_first();
  p.gate_blocks =
      gate_block_count(p.gb.T, p.gb.cpr, kThreads, kGateRowsBwd, gate_block_cap("DT_CONV_GATE_BWD_BLOCKS", kGateBwdBlocks));
}

}  // namespace

void causal_conv1d_fwd(const TensorView& y, const TensorView& x, const TensorView& w, const TensorView& bias,
                       bool silu, const VarlenMeta& m, Stream s) {
  constexpr const char* op = "cuda::causal_conv1d_fwd";
  ConvParams p;
  if (!fwd_params(&p, y, x, w, bias, silu, m, op)) return;
  ew::NvtxRange range(op);
  dispatch_conv<false, false>(x.dtype, p, num_groups(p.T, p.W, false), static_cast<cudaStream_t>(s.handle));
}

void causal_conv1d_bwd(const TensorView& dx, const TensorView& dw, const TensorView& dbias, const TensorView& dy,
                       const TensorView& x, const TensorView& w, const TensorView& bias, bool silu,
                       const VarlenMeta& m, Stream s) {
  constexpr const char* op = "cuda::causal_conv1d_bwd";
  ConvParams p;
  if (!bwd_params(&p, dx, dw, dbias, dy, x, w, bias, silu, m, op)) return;
  ew::NvtxRange range(op);
  run_bwd<false>(p, x.dtype, x.device, dw, dbias, nullptr, static_cast<cudaStream_t>(s.handle));
}

void causal_conv1d_gate_fwd(const TensorView& y, const TensorView& x, const TensorView& w, const TensorView& bias,
                            bool silu, const VarlenMeta& m, const GdnGateFwdViews& gt, Stream s) {
  constexpr const char* op = "cuda::causal_conv1d_gate_fwd";
  ConvParams p;
  const bool conv = fwd_params(&p, y, x, w, bias, silu, m, op);
  gate_fwd_setup(p, x, gt, op);
  if (!conv) {  // no conv channels (D = 0) or no tokens: the gates alone (nothing at T = 0)
    cuda::gdn_gate_fwd(gt.g, gt.beta, gt.a, gt.b, gt.A_log, gt.dt_bias, s);
    return;
  }
  ew::NvtxRange range(op);
  dispatch_conv<false, true>(x.dtype, p, num_groups(p.T, p.W, false), static_cast<cudaStream_t>(s.handle));
}

// The conv with the L2 norm of the q, k heads (shapes checked by ops::causal_conv1d_l2norm_fwd).
// One launch when the head dim divides the 256-channel blocks (a power of two from 16 to 256),
// so each block's units are whole heads of one section; else the three ops in turn.
void causal_conv1d_l2norm_fwd(const ConvNormOut& out, const TensorView& x, const TensorView& w, const TensorView& bias,
                              bool silu, float eps, const VarlenMeta& m, const GdnGateFwdViews* gt, Stream s) {
  constexpr const char* op = "cuda::causal_conv1d_l2norm_fwd";
  const int64_t T = x.shape[0], H = out.qn.shape[1], hd = out.qn.shape[2];
  const bool fusable = hd >= 16 && kCB % hd == 0 && H > 0;  // a power of two from 16 to 256
  if (!fusable || T == 0) {
    detail::conv_l2norm_composed(out, x, w, bias, silu, eps, m, gt, s);
    return;
  }
  ConvParams p;
  fwd_params(&p, out.v, x, w, bias, silu, m, op, 2 * H * hd);  // out: the v channels only
  nrm_setup(&p, H, hd, x.dtype);
  p.nrm_eps = eps;
  p.nrm_y[0] = out.qn.data, p.nrm_y[1] = out.kn.data;
  p.nrm_r[0] = out.rq.ptr<float>(), p.nrm_r[1] = out.rk.ptr<float>();
  DT_CHECK(ew::aligned16(out.qn.data) && ew::aligned16(out.kn.data), "{}: qn and kn must be 16-byte aligned, got {} {}",
           op, out.qn.str(), out.kn.str());
  const cudaStream_t st = static_cast<cudaStream_t>(s.handle);
  ew::NvtxRange range(op);
  if (gt) {
    gate_fwd_setup(p, x, *gt, op);
    dispatch_conv<false, true>(x.dtype, p, num_groups(p.T, p.W, false), st);
  } else {
    dispatch_conv<false, false>(x.dtype, p, num_groups(p.T, p.W, false), st);
  }
}

// The conv backward from the q, k L2 norm's input gradients (shapes checked by
// ops::causal_conv1d_l2norm_bwd). One launch when each head row's chunks are one group of
// lanes (head dim a power of two, 16..256 for bf16, 16..128 for f32), else the ops in turn.
void causal_conv1d_l2norm_bwd(const TensorView& dx, const TensorView& dw, const TensorView& dbias,
                              const ConvNormGrad& g, const TensorView& x, const TensorView& w, const TensorView& bias,
                              bool silu, const VarlenMeta& m, const GdnGateBwdViews* gt, Stream s) {
  constexpr const char* op = "cuda::causal_conv1d_l2norm_bwd";
  const int64_t T = x.shape[0], H = g.qn.shape[1], hd = g.qn.shape[2];
  const int V = x.dtype == DType::bf16 ? 8 : 4;
  const bool fusable = hd >= 16 && kCB % hd == 0 && hd / V <= 32 && H > 0;  // a power of two
  if (!fusable || T == 0) {
    detail::conv_l2norm_bwd_composed(dx, dw, dbias, g, x, w, bias, silu, m, gt, s);
    return;
  }
  for (const TensorView* v : {&g.dq, &g.dk, &g.qn, &g.kn})
    DT_CHECK(ew::aligned16(v->data), "{}: dq, dk, qn and kn must be 16-byte aligned, got {}", op, v->str());
  ConvParams p;
  bwd_params(&p, dx, dw, dbias, g.dv, x, w, bias, silu, m, op, 2 * H * hd);  // dy: the v channels only
  nrm_setup(&p, H, hd, x.dtype);  // tpr = hd / V: a head row's chunks are one lane group
  p.nrm_g[0] = g.dq.data, p.nrm_g[1] = g.dk.data;
  p.nrm_y[0] = g.qn.data, p.nrm_y[1] = g.kn.data;
  p.nrm_r[0] = const_cast<float*>(g.rq.ptr<float>()), p.nrm_r[1] = const_cast<float*>(g.rk.ptr<float>());
  const cudaStream_t st = static_cast<cudaStream_t>(s.handle);
  ew::NvtxRange range(op);
  if (gt) {
    gate_bwd_setup(p, x, *gt, op);
    run_bwd<true>(p, x.dtype, x.device, dw, dbias, gt, st);
  } else {
    run_bwd<false>(p, x.dtype, x.device, dw, dbias, nullptr, st);
  }
}

void causal_conv1d_gate_bwd(const TensorView& dx, const TensorView& dw, const TensorView& dbias,
                            const TensorView& dy, const TensorView& x, const TensorView& w, const TensorView& bias,
                            bool silu, const VarlenMeta& m, const GdnGateBwdViews& gt, Stream s) {
  constexpr const char* op = "cuda::causal_conv1d_gate_bwd";
  ConvParams p;
  const bool conv = bwd_params(&p, dx, dw, dbias, dy, x, w, bias, silu, m, op);
  gate_bwd_setup(p, x, gt, op);
  if (!conv) {
    cuda::gdn_gate_bwd(gt.da, gt.db, gt.dA_log, gt.ddt_bias, gt.dg, gt.dbeta, gt.a, gt.b, gt.A_log, gt.dt_bias, s);
    return;
  }
  ew::NvtxRange range(op);
  run_bwd<true>(p, x.dtype, x.device, dw, dbias, &gt, static_cast<cudaStream_t>(s.handle));
}

}  // namespace dt::ops::cuda
