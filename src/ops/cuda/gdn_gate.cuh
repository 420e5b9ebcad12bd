// The GDN gates' per-element math and row loops (gdn-math.md 1.1, B9, B10), shared by the
// standalone kernels in gdn_gate.cu and by the conv1d launch that carries them
// (conv1d_varlen.cu, ops::causal_conv1d_gate_fwd/bwd): the gates move ~13-17 MB at the
// Qwen3.5 shape, less than one launch plus one DRAM round trip, so alone they run at 2.4-3.5x
// their byte time; as extra blocks at the front of the conv grid they cost only their bytes.
// Both forms run these functions, so g, beta, da, db are the same bits either way; dA_log and
// ddt_bias are summed over a different (still fixed) block tiling.
// Math and accuracy: gdn_gate.cu's header.
#pragma once
#include <algorithm>
#include <cstdint>

#include "ops/cuda/gdn_elementwise_common.cuh"

namespace dt::ops::cuda {

// Launch parameters of one gates call (views checked by gate_fwd_params / gate_bwd_params).
struct GateFwdParams {
  float* g;           // [T, H] f32, row stride gs
  float* beta;        // [T, H] f32
  const void* a;      // [T, H] bf16|f32
  const void* b;      // [T, H] bf16|f32
  const float* A_log;  // [H]
  const float* dt_bias;  // [H]
  int64_t gs, betas, as, bs;
  int64_t T;
  int H, cpr;  // heads; 4-head chunks per row (a power of two <= 64)
  unsigned vec;
};
struct GateBwdParams {
  void* da;             // [T, H] like a (=)
  void* db;             // [T, H] like b (=)
  const float* dg;      // [T, H] f32
  const float* dbeta;   // [T, H] f32
  const void* a;
  const void* b;
  const float* A_log;
  const float* dt_bias;
  float* part;          // [nblocks, 2H] f32 block partials of [dA_log | ddt_bias]
  int64_t das, dbs, dgs, dbetas, as, bs;
  int64_t T;
  int H, cpr;
  unsigned vec;
};

// Check the views exactly as gdn_gate_fwd / gdn_gate_bwd do (messages name `op`) and fill the
// parameters; part is left null. Defined in gdn_gate.cu.
GateFwdParams gate_fwd_params(const TensorView& g, const TensorView& beta, const TensorView& a, const TensorView& b,
                              const TensorView& A_log, const TensorView& dt_bias, const char* op);
GateBwdParams gate_bwd_params(const TensorView& da, const TensorView& db, const TensorView& dA_log,
                              const TensorView& ddt_bias, const TensorView& dg, const TensorView& dbeta,
                              const TensorView& a, const TensorView& b, const TensorView& A_log,
                              const TensorView& dt_bias, const char* op);
// Block count for `threads` threads and `rows` rows per thread: one block per row tile, at most
// max_blocks (which then loop). In the backward one partial row per block, so the count must be
// a function of the shape (and the cap) only: determinism.
inline int64_t gate_block_count(int64_t T, int cpr, int threads, int rows, int64_t max_blocks) {
  const int64_t per_tile = int64_t(threads / cpr) * rows;
  return std::min<int64_t>((T + per_tile - 1) / per_tile, max_blocks);
}

namespace {
namespace gate {

constexpr int kE = 4;  // heads per thread
constexpr int kMaxH = 256;

enum : unsigned { kVecA = 1, kVecB = 2, kVecG = 4, kVecBeta = 8, kVecDa = 16, kVecDb = 32, kVecDg = 64, kVecDbeta = 128,
                  kVecP = 256 };

// 4 elements from element h0 of a row of H: one 8-byte (bf16) or 16-byte (f32) access when
// `vec` (row start aligned to 4 elements) and the chunk is whole, else element by element.
template <typename T>
__device__ __forceinline__ void load4(const T* row, int64_t h0, int H, bool vec, float (&r)[kE]) {
  if (vec && h0 + kE <= H) {
    if constexpr (std::is_same_v<T, float>) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(row + h0));
      r[0] = f.x, r[1] = f.y, r[2] = f.z, r[3] = f.w;
    } else {
      const uint2 u = __ldg(reinterpret_cast<const uint2*>(row + h0));
      r[0] = ew::bf16lo(u.x), r[1] = ew::bf16hi(u.x), r[2] = ew::bf16lo(u.y), r[3] = ew::bf16hi(u.y);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kE; ++k) r[k] = h0 + k < H ? ew::to_f32(row[h0 + k]) : 0.f;
  }
}
template <typename T>
__device__ __forceinline__ void store4(T* row, int64_t h0, int H, bool vec, const float (&r)[kE]) {
  if (vec && h0 + kE <= H) {
    if constexpr (std::is_same_v<T, float>) {
      *reinterpret_cast<float4*>(row + h0) = make_float4(r[0], r[1], r[2], r[3]);
    } else {
      *reinterpret_cast<uint2*>(row + h0) = make_uint2(ew::pack_bf16x2(r[0], r[1]), ew::pack_bf16x2(r[2], r[3]));
    }
  } else {
#pragma unroll
    for (int k = 0; k < kE; ++k)
      if (h0 + k < H) row[h0 + k] = ew::from_f32<T>(r[k]);
  }
}

// Per-thread head constants: nA = -exp(A_log[h]), dtb = dt_bias[h] for the thread's 4 heads.
__device__ __forceinline__ void load_head_consts(const float* g_A_log, const float* g_dt_bias, int64_t h0, int H,
                                                 bool vec, float (&r_nA)[kE], float (&r_dtb)[kE]) {
  ew::load_param<kE>(g_A_log, h0, H, vec, r_nA);
  ew::load_param<kE>(g_dt_bias, h0, H, vec, r_dtb);
#pragma unroll
  for (int k = 0; k < kE; ++k) r_nA[k] = -expf(r_nA[k]);
}

// e = exp(x) for x <= 20 (MUFU ex2; 0 for x below ~-87, where softplus(x) = e underflows anyway).
__device__ __forceinline__ float exp_f(float x) { return ew::ex2_ftz(x * 1.4426950408889634f); }
// log(1 + e) for e >= 0 (accuracy in gdn_gate.cu's header): series below 1/4, lg2 above.
__device__ __forceinline__ float log1p_f(float e) {
  float s = -1.f / 10;  // e (1 - e/2 + e^2/3 - ... - e^9/10), Horner from the inside
#pragma unroll
  for (int k = 9; k >= 1; --k) s = fmaf(s, e, (k & 1 ? 1.f : -1.f) / float(k));
  const float series = s * e;
  const float lg = ew::lg2_ftz(1.f + e) * 0.6931471805599453f;
  return e < 0.25f ? series : lg;
}

// Forward of block `blk` of `nblk`: row blocks blk, blk + nblk, ... of (kThr / cpr) * R tokens;
// thread = (row, 4-head chunk), R rows each (stride kThr / cpr), every load of a row block issued
// before its math. kLoop = false: one row block per block (the standalone grid), which keeps
// the loop's registers out of the kernel (31 instead of 45: one wave at T = 32k).
template <typename T, int kThr, int R, bool kLoop>
__device__ __forceinline__ void fwd_rows(const GateFwdParams& p, int64_t blk, int64_t nblk) {
  const int cpr = p.cpr, H = p.H, gpb = kThr / cpr;
  const int64_t h0 = int64_t(threadIdx.x & (cpr - 1)) * kE;
  if (h0 >= H) return;
  const int64_t per_blk = int64_t(gpb) * R;
  const T* g_a = static_cast<const T*>(p.a);
  const T* g_b = static_cast<const T*>(p.b);
  auto row_block = [&](int64_t rb) {
    const int64_t tb = rb * per_blk + int64_t(threadIdx.x) / cpr;
    if (tb >= p.T) return;
    float r_a[R][kE], r_b[R][kE], r_nA[kE], r_dtb[kE];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t t = tb + int64_t(i) * gpb;
      if (t < p.T) {
        load4<T>(g_a + t * p.as, h0, H, p.vec & kVecA, r_a[i]);
        load4<T>(g_b + t * p.bs, h0, H, p.vec & kVecB, r_b[i]);
      }
    }
    load_head_consts(p.A_log, p.dt_bias, h0, H, p.vec & kVecP, r_nA, r_dtb);
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t t = tb + int64_t(i) * gpb;
      if (t < p.T) {
        float r_g[kE], r_be[kE];
#pragma unroll
        for (int k = 0; k < kE; ++k) {
          const float x = r_a[i][k] + r_dtb[k];
          r_g[k] = r_nA[k] * (x > 20.f ? x : log1p_f(exp_f(x)));
          r_be[k] = ew::sigmoid_f(r_b[i][k]);
        }
        store4<float>(p.g + t * p.gs, h0, H, p.vec & kVecG, r_g);
        store4<float>(p.beta + t * p.betas, h0, H, p.vec & kVecBeta, r_be);
      }
    }
  };
  if constexpr (kLoop) {
    const int64_t nrb = (p.T + per_blk - 1) / per_blk;
    for (int64_t rb = blk; rb < nrb; rb += nblk) row_block(rb);
  } else {
    row_block(blk);
  }
}

// Backward of block `blk` of `nblk`: row tiles blk, blk + nblk, ... of (kThr / cpr) * R tokens;
// writes p.part[blk, 0:2H] = [dA_log partial | ddt_bias partial] (thread partials summed in
// index order through s_red, 2 * kThr * kE floats of shared memory). Every thread of the block
// must call it (it holds a block barrier).
template <typename T, int kThr, int R>
__device__ __forceinline__ void bwd_tiles(const GateBwdParams& p, int64_t blk, int64_t nblk, float* s_red) {
  const int cpr = p.cpr, H = p.H;
  const int lane = int(threadIdx.x) & (cpr - 1);
  const int group = int(threadIdx.x) / cpr;
  const int gpb = kThr / cpr;
  const int64_t h0 = int64_t(lane) * kE;
  const bool active = h0 < H;
  const int64_t per_tile = int64_t(gpb) * R;
  const int64_t ntiles = (p.T + per_tile - 1) / per_tile;
  const T* g_a = static_cast<const T*>(p.a);
  const T* g_b = static_cast<const T*>(p.b);
  T* g_da = static_cast<T*>(p.da);
  T* g_db = static_cast<T*>(p.db);

  float r_nA[kE], r_dtb[kE], r_sA[kE], r_sdt[kE];  // head constants; dA_log, ddt_bias partials
  load_head_consts(p.A_log, p.dt_bias, active ? h0 : 0, active ? H : 0, p.vec & kVecP, r_nA, r_dtb);
#pragma unroll
  for (int k = 0; k < kE; ++k) r_sA[k] = 0.f, r_sdt[k] = 0.f;

  if (active) {
    for (int64_t tile = blk; tile < ntiles; tile += nblk) {
      const int64_t tb = tile * per_tile + group;
      float r_a[R][kE], r_b[R][kE], r_dg[R][kE], r_dbe[R][kE];  // [rows in flight, heads]
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const int64_t t = tb + int64_t(i) * gpb;
        if (t < p.T) {
          load4<T>(g_a + t * p.as, h0, H, p.vec & kVecA, r_a[i]);
          load4<T>(g_b + t * p.bs, h0, H, p.vec & kVecB, r_b[i]);
          load4<float>(p.dg + t * p.dgs, h0, H, p.vec & kVecDg, r_dg[i]);
          load4<float>(p.dbeta + t * p.dbetas, h0, H, p.vec & kVecDbeta, r_dbe[i]);
        }
      }
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const int64_t t = tb + int64_t(i) * gpb;
        if (t < p.T) {
          float r_da[kE], r_db[kE];
#pragma unroll
          for (int k = 0; k < kE; ++k) {
            const float x = r_a[i][k] + r_dtb[k];
            const float dg = r_dg[i][k];
            const bool lin = x > 20.f;
            const float e = exp_f(lin ? 0.f : x);  // one exp for the softplus and its slope
            const float sp = lin ? x : log1p_f(e);
            const float sp_grad = lin ? 1.f : e * ew::rcp_ftz(1.f + e);
            r_da[k] = dg * r_nA[k] * sp_grad;
            r_sA[k] = fmaf(dg, r_nA[k] * sp, r_sA[k]);
            r_sdt[k] += r_da[k];
            const float sb = ew::sigmoid_f(r_b[i][k]);
            r_db[k] = r_dbe[i][k] * sb * (1.f - sb);
          }
          store4<T>(g_da + t * p.das, h0, H, p.vec & kVecDa, r_da);
          store4<T>(g_db + t * p.dbs, h0, H, p.vec & kVecDb, r_db);
        }
      }
    }
  }
  // Thread partials -> shared [thread, head of chunk] (idle lanes hold zeros, never read).
  float* s_A = s_red;
  float* s_dt = s_red + kThr * kE;
#pragma unroll
  for (int k = 0; k < kE; ++k) s_A[threadIdx.x * kE + k] = r_sA[k], s_dt[threadIdx.x * kE + k] = r_sdt[k];
  ew::pdl_trigger();  // the partials reduction may start launching (it waits for our writes)
  __syncthreads();
  for (int c = int(threadIdx.x); c < 2 * H; c += kThr) {
    const int which = c >= H, h = c - which * H;
    const float* s_col = (which ? s_dt : s_A) + h;  // thread (group, h / kE), head h % kE
    float r_sum = 0.f;
    for (int g = 0; g < gpb; ++g) r_sum += s_col[g * cpr * kE];
    p.part[blk * 2 * H + c] = r_sum;
  }
}

}  // namespace gate
}  // namespace
}  // namespace dt::ops::cuda
