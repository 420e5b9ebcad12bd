// CUDA GDN gates, gdn-math.md section 1.1 (forward), 4.2 B9 and B10 (backward).
//   forward:  x = a + dt_bias[h];  e = exp(x);  sp = softplus(x) = (x > 20 ? x : log1p(e))
//             g = -exp(A_log[h]) * sp        (natural-log decay, always <= 0)
//             beta = sigmoid(b) = 1 / (1 + exp(-b))
//   backward: da = dg * -exp(A_log[h]) * softplus'(x)   (softplus'(x) = 1 for x > 20, else
//                  sigmoid(x) = e / (1 + e) with the same e as the softplus)
//                                                                         da OVERWRITTEN (=)
//             db = dbeta * beta * (1 - beta)                              db OVERWRITTEN (=)
//             dA_log[h]   += sum_t dg * g                                 ACCUMULATES (+=)
//             ddt_bias[h] += sum_t da                                     ACCUMULATES (+=)
// Layouts: a, b, da, db: [T, Hv] (row stride arbitrary, unit inner stride; typically slices of
//   the in_proj output); g, beta, dg, dbeta: [T, Hv] f32 (row stride arbitrary, unit inner
//   stride); A_log, dt_bias, dA_log, ddt_bias: [Hv] f32 contiguous. Hv <= 256.
// Dtypes: a, b, da, db one of bf16 | f32 (one dtype per call); all math fp32 (A_log is never
//   exponentiated in bf16, gdn-math.md section 10 item 4; exp(A_log) is the accurate expf).
// Accuracy: the per-element math uses the single-instruction MUFU forms (ex2, lg2, rcp with
//   flush-to-zero) instead of libm expf / log1pf / the IEEE reciprocal (~106 instructions per
//   element; measured: the forward 13% faster back to back, the backward the same). log1p(e) is
//   a degree-10 series for e < 1/4 (truncation < e^11/11, relative < 1e-7) and lg2(1 + e) above
//   (absolute error 2^-22.6 on [1, 2], 2 ulp beyond: relative < 6e-7 since log1p(e) >= 0.22
//   there); e = 2^(x log2 e) carries the rounding of the product, relative ~|x| * 6e-8 <= 1.2e-6
//   at the threshold x = 20. So g, beta and the gradients are within ~2e-6 relative of the libm
//   forms, far below the 1e-4 fp32 test tolerance and the bf16 rounding of a, b.
// Mapping: the problem is a few MB, so it is latency-bound: every thread owns 4 heads of one
//   token row (an 8-byte bf16 or 16-byte f32 access of each tensor) and the grid is about one
//   wave with every load issued up front (kBwdRows row chunks per thread in the backward). At
//   T = 32k, Hv = 32 the bytes (12.6 MB forward) need 2.9 us: the launch and one DRAM round trip
//   are as long, so fusing into the chunk kernel is what removes the cost (docs/perf.md).
// Determinism: dA_log and ddt_bias are reduced without atomics: a shape-fixed grid of at most
//   kMaxBwdBlocks blocks writes one fp32 partial row [2*Hv] per block (thread partials summed
//   in shared memory in index order), then colsum_add adds the rows in a fixed order (a
//   programmatic dependent launch, overlapping the main kernel's tail). Scratch from the
//   caching allocator, released on return (stream-ordered reuse on the compute stream).
#include "ops/cuda/gdn_elementwise_common.cuh"
#include "ops/gdn_backends.h"

namespace dt::ops::cuda {
namespace {

constexpr int kE = 4;               // heads per thread
constexpr int kMaxH = 256;
#ifndef DT_GATE_FWD_THREADS
#define DT_GATE_FWD_THREADS 256
#endif
#ifndef DT_GATE_BWD_THREADS
#define DT_GATE_BWD_THREADS 128
#endif
constexpr int kFwdThreads = DT_GATE_FWD_THREADS;
constexpr int kBwdThreads = DT_GATE_BWD_THREADS;
// Backward: row chunks per thread in flight and the register budget (65536 / (threads * minblocks)).
#ifndef DT_GATE_ROWS
#define DT_GATE_ROWS 1
#endif
#ifndef DT_GATE_MINB
#define DT_GATE_MINB 8
#endif
constexpr int kBwdRows = DT_GATE_ROWS;
constexpr int kMaxBwdBlocks = 1024; // backward grid cap (= number of partial rows)

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
// log(1 + e) for e >= 0 (accuracy in the header): series below 1/4, lg2 above.
__device__ __forceinline__ float log1p_f(float e) {
  float s = -1.f / 10;  // e (1 - e/2 + e^2/3 - ... - e^9/10), Horner from the inside
#pragma unroll
  for (int k = 9; k >= 1; --k) s = fmaf(s, e, (k & 1 ? 1.f : -1.f) / float(k));
  const float series = s * e;
  const float lg = ew::lg2_ftz(1.f + e) * 0.6931471805599453f;
  return e < 0.25f ? series : lg;
}

// ============================================================================== kernels
// grid.x = ceil(T / (kFwdThreads / cpr)); block = kFwdThreads; thread = (row, 4-head chunk),
// cpr = chunks per row (a power of two <= 64).
template <typename T>
__global__ __launch_bounds__(kFwdThreads) void gdn_gate_fwd_kernel(
    float* __restrict__ g_g, int64_t gs, float* __restrict__ g_beta, int64_t betas, const T* __restrict__ g_a,
    int64_t as, const T* __restrict__ g_b, int64_t bs, const float* __restrict__ g_A_log,
    const float* __restrict__ g_dt_bias, int64_t T_, int H, int cpr, unsigned vec) {
  const int64_t t = int64_t(blockIdx.x) * (kFwdThreads / cpr) + threadIdx.x / cpr;
  const int64_t h0 = int64_t(threadIdx.x & (cpr - 1)) * kE;
  if (t >= T_ || h0 >= H) return;
  float r_a[kE], r_b[kE], r_nA[kE], r_dtb[kE];
  load4<T>(g_a + t * as, h0, H, vec & kVecA, r_a);
  load4<T>(g_b + t * bs, h0, H, vec & kVecB, r_b);
  load_head_consts(g_A_log, g_dt_bias, h0, H, vec & kVecP, r_nA, r_dtb);
  float r_g[kE], r_be[kE];
#pragma unroll
  for (int k = 0; k < kE; ++k) {
    const float x = r_a[k] + r_dtb[k];
    r_g[k] = r_nA[k] * (x > 20.f ? x : log1p_f(exp_f(x)));
    r_be[k] = ew::sigmoid_f(r_b[k]);
  }
  store4<float>(g_g + t * gs, h0, H, vec & kVecG, r_g);
  store4<float>(g_beta + t * betas, h0, H, vec & kVecBeta, r_be);
}

// grid.x = nblocks <= kMaxBwdBlocks (fixed by the shape); block b handles the row tiles b,
// b + nblocks, ... of (kBwdThreads / cpr) * kBwdRows tokens and writes g_part[b, 0:2H] =
// [dA_log partial (H) | ddt_bias partial (H)].
template <typename T>
__global__ __launch_bounds__(kBwdThreads, DT_GATE_MINB) void gdn_gate_bwd_kernel(
    T* __restrict__ g_da, int64_t das, T* __restrict__ g_db, int64_t dbs, const float* __restrict__ g_dg, int64_t dgs,
    const float* __restrict__ g_dbeta, int64_t dbetas, const T* __restrict__ g_a, int64_t as,
    const T* __restrict__ g_b, int64_t bs, const float* __restrict__ g_A_log, const float* __restrict__ g_dt_bias,
    float* __restrict__ g_part, int64_t T_, int H, int cpr, unsigned vec) {
  constexpr int R = kBwdRows;
  __shared__ float s_red[2][kBwdThreads * kE];  // [dA_log | ddt_bias][thread, head of chunk] partials
  const int lane = threadIdx.x & (cpr - 1);
  const int group = threadIdx.x / cpr;
  const int gpb = kBwdThreads / cpr;
  const int64_t h0 = int64_t(lane) * kE;
  const bool active = h0 < H;
  const int64_t per_tile = int64_t(gpb) * R;
  const int64_t ntiles = (T_ + per_tile - 1) / per_tile;

  float r_nA[kE], r_dtb[kE], r_sA[kE], r_sdt[kE];  // head constants; dA_log, ddt_bias partials
  load_head_consts(g_A_log, g_dt_bias, active ? h0 : 0, active ? H : 0, vec & kVecP, r_nA, r_dtb);
#pragma unroll
  for (int k = 0; k < kE; ++k) r_sA[k] = 0.f, r_sdt[k] = 0.f;

  if (active) {
    for (int64_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
      const int64_t tb = tile * per_tile + group;
      float r_a[R][kE], r_b[R][kE], r_dg[R][kE], r_dbe[R][kE];  // [rows in flight, heads]
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const int64_t t = tb + int64_t(i) * gpb;
        if (t < T_) {
          load4<T>(g_a + t * as, h0, H, vec & kVecA, r_a[i]);
          load4<T>(g_b + t * bs, h0, H, vec & kVecB, r_b[i]);
          load4<float>(g_dg + t * dgs, h0, H, vec & kVecDg, r_dg[i]);
          load4<float>(g_dbeta + t * dbetas, h0, H, vec & kVecDbeta, r_dbe[i]);
        }
      }
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const int64_t t = tb + int64_t(i) * gpb;
        if (t < T_) {
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
          store4<T>(g_da + t * das, h0, H, vec & kVecDa, r_da);
          store4<T>(g_db + t * dbs, h0, H, vec & kVecDb, r_db);
        }
      }
    }
  }
  // Thread partials -> shared [thread, head of chunk] (idle lanes hold zeros, never read).
#pragma unroll
  for (int k = 0; k < kE; ++k) s_red[0][threadIdx.x * kE + k] = r_sA[k], s_red[1][threadIdx.x * kE + k] = r_sdt[k];
  ew::pdl_trigger();  // the partials reduction may start launching (it waits for our writes)
  __syncthreads();
  for (int c = threadIdx.x; c < 2 * H; c += kBwdThreads) {
    const int which = c >= H, h = c - which * H;
    const float* s_col = &s_red[which][h];  // thread (group, h / kE), head h % kE: (group * cpr + h / kE) * kE + h % kE
    float r_sum = 0.f;
    for (int g = 0; g < gpb; ++g) r_sum += s_col[g * cpr * kE];
    g_part[int64_t(blockIdx.x) * 2 * H + c] = r_sum;
  }
}

// ============================================================================== launchers
struct RowsOf {  // a 2D [T, Hv] view: row stride, rows aligned to 4 elements
  int64_t stride = 0;
  bool vec = false;
};

RowsOf rows_of(const TensorView& v, const Shape& shape, DType dt, Device dev, const char* op, const char* what) {
  DT_CHECK(v.device == dev && v.device.is_cuda(), "{}: {} must be a CUDA view on {}, got {}", op, what, dev.str(),
           v.str());
  DT_CHECK(v.dtype == dt, "{}: {} must be {}, got {}", op, what, dtype_name(dt), v.str());
  DT_CHECK(v.ndim() == 2 && v.shape == shape && (shape[1] <= 1 || v.stride[1] == 1),
           "{}: {} must be {} with a unit inner stride, got {}", op, what, shape.str(), v.str());
  RowsOf r;
  r.stride = v.stride[0];
  const int64_t sz = int64_t(dtype_size(dt));
  r.vec = reinterpret_cast<uintptr_t>(v.data) % uintptr_t(kE * sz) == 0 && r.stride % kE == 0;
  return r;
}

void check_param(const TensorView& p, int64_t n, Device dev, const char* op, const char* what) {
  DT_CHECK(p.device == dev, "{}: {} is on {}, expected {}", op, what, p.device.str(), dev.str());
  DT_CHECK(p.dtype == DType::f32 && p.numel() == n && p.is_contiguous(),
           "{}: {} must be a contiguous f32 view of {} elements, got {}", op, what, n, p.str());
}

void check_act(const TensorView& a, int64_t* T_, int64_t* H, const char* op) {
  DT_CHECK(a.device.is_cuda(), "{}: a must be a CUDA view, got {}", op, a.str());
  DT_CHECK(a.dtype == DType::bf16 || a.dtype == DType::f32, "{}: a must be bf16 or f32, got {}", op, a.str());
  DT_CHECK(a.ndim() == 2, "{}: a must be [T, Hv], got {}", op, a.str());
  *T_ = a.shape[0], *H = a.shape[1];
  DT_CHECK(*H >= 1 && *H <= kMaxH, "{}: Hv must be in [1, {}], got {} ({})", op, kMaxH, *H, a.str());
}

int chunks_per_row(int64_t H) { return ew::pow2_ceil((H + kE - 1) / kE); }  // <= 64

}  // namespace

void gdn_gate_fwd(const TensorView& g, const TensorView& beta, const TensorView& a, const TensorView& b,
                  const TensorView& A_log, const TensorView& dt_bias, Stream s) {
  constexpr const char* op = "cuda::gdn_gate_fwd";
  int64_t T_, H;
  check_act(a, &T_, &H, op);
  const Shape sh{T_, H};
  const RowsOf ar = rows_of(a, sh, a.dtype, a.device, op, "a");                 // [T, Hv]
  const RowsOf br = rows_of(b, sh, a.dtype, a.device, op, "b");                 // [T, Hv]
  const RowsOf gr = rows_of(g, sh, DType::f32, a.device, op, "g");              // [T, Hv] f32
  const RowsOf ber = rows_of(beta, sh, DType::f32, a.device, op, "beta");       // [T, Hv] f32
  check_param(A_log, H, a.device, op, "A_log");                                 // [Hv] f32
  check_param(dt_bias, H, a.device, op, "dt_bias");                             // [Hv] f32
  if (T_ == 0) return;
  const unsigned vec = (ar.vec ? kVecA : 0) | (br.vec ? kVecB : 0) | (gr.vec ? kVecG : 0) |
                       (ber.vec ? kVecBeta : 0) |
                       (ew::aligned16(A_log.data) && ew::aligned16(dt_bias.data) ? kVecP : 0);
  ew::NvtxRange range(op);
  const cudaStream_t st = static_cast<cudaStream_t>(s.handle);
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    const int cpr = chunks_per_row(H);
    const int64_t per_block = kFwdThreads / cpr;
    gdn_gate_fwd_kernel<T><<<unsigned((T_ + per_block - 1) / per_block), kFwdThreads, 0, st>>>(
        g.ptr<float>(), gr.stride, beta.ptr<float>(), ber.stride, a.ptr<T>(), ar.stride, b.ptr<T>(), br.stride,
        A_log.ptr<float>(), dt_bias.ptr<float>(), T_, int(H), cpr, vec);
  };
  if (a.dtype == DType::bf16) launch(__nv_bfloat16{});
  else launch(float{});
  DT_CUDA_LAUNCH_CHECK();
}

void gdn_gate_bwd(const TensorView& da, const TensorView& db, const TensorView& dA_log, const TensorView& ddt_bias,
                  const TensorView& dg, const TensorView& dbeta, const TensorView& a, const TensorView& b,
                  const TensorView& A_log, const TensorView& dt_bias, Stream s) {
  constexpr const char* op = "cuda::gdn_gate_bwd";
  int64_t T_, H;
  check_act(a, &T_, &H, op);
  const Shape sh{T_, H};
  const RowsOf ar = rows_of(a, sh, a.dtype, a.device, op, "a");                 // [T, Hv]
  const RowsOf br = rows_of(b, sh, a.dtype, a.device, op, "b");                 // [T, Hv]
  const RowsOf dar = rows_of(da, sh, a.dtype, a.device, op, "da");              // [T, Hv] (=)
  const RowsOf dbr = rows_of(db, sh, a.dtype, a.device, op, "db");              // [T, Hv] (=)
  const RowsOf dgr = rows_of(dg, sh, DType::f32, a.device, op, "dg");           // [T, Hv] f32
  const RowsOf dber = rows_of(dbeta, sh, DType::f32, a.device, op, "dbeta");    // [T, Hv] f32
  check_param(A_log, H, a.device, op, "A_log");                                 // [Hv] f32
  check_param(dt_bias, H, a.device, op, "dt_bias");                             // [Hv] f32
  check_param(dA_log, H, a.device, op, "dA_log");                               // [Hv] f32 (+=)
  check_param(ddt_bias, H, a.device, op, "ddt_bias");                           // [Hv] f32 (+=)
  if (T_ == 0) return;
  const unsigned vec = (ar.vec ? kVecA : 0) | (br.vec ? kVecB : 0) | (dar.vec ? kVecDa : 0) |
                       (dbr.vec ? kVecDb : 0) | (dgr.vec ? kVecDg : 0) | (dber.vec ? kVecDbeta : 0) |
                       (ew::aligned16(A_log.data) && ew::aligned16(dt_bias.data) ? kVecP : 0);
  ew::NvtxRange range(op);
  const cudaStream_t st = static_cast<cudaStream_t>(s.handle);
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    const int cpr = chunks_per_row(H);
    const int64_t per_tile = int64_t(kBwdThreads / cpr) * kBwdRows;
    const int64_t nblocks = std::min<int64_t>((T_ + per_tile - 1) / per_tile, kMaxBwdBlocks);
    Tensor part = Tensor::empty(Shape{nblocks, 2 * H}, DType::f32, a.device);  // [nblocks, 2*Hv] f32 scratch
    gdn_gate_bwd_kernel<T><<<unsigned(nblocks), kBwdThreads, 0, st>>>(
        da.ptr<T>(), dar.stride, db.ptr<T>(), dbr.stride, dg.ptr<float>(), dgr.stride, dbeta.ptr<float>(), dber.stride,
        a.ptr<T>(), ar.stride, b.ptr<T>(), br.stride, A_log.ptr<float>(), dt_bias.ptr<float>(), part.ptr<float>(), T_,
        int(H), cpr, vec);
    DT_CUDA_LAUNCH_CHECK();
    ew::colsum_add(dA_log.ptr<float>(), ddt_bias.ptr<float>(), part.ptr<float>(), nblocks, 2 * H, H, st);
  };
  if (a.dtype == DType::bf16) launch(__nv_bfloat16{});
  else launch(float{});
}

}  // namespace dt::ops::cuda
