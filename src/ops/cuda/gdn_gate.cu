// CUDA GDN gates, gdn-math.md section 1.1 (forward), 4.2 B9 and B10 (backward).
//   forward:  x = a + dt_bias[h];  sp = softplus(x) = (x > 20 ? x : log1p(exp(x)))
//             g = -exp(A_log[h]) * sp        (natural-log decay, always <= 0)
//             beta = sigmoid(b)
//   backward: da = dg * -exp(A_log[h]) * softplus'(x)   (softplus'(x) = 1 for x > 20, else sigmoid(x))
//                                                                         da OVERWRITTEN (=)
//             db = dbeta * beta * (1 - beta)                              db OVERWRITTEN (=)
//             dA_log[h]   += sum_t dg * g                                 ACCUMULATES (+=)
//             ddt_bias[h] += sum_t da                                     ACCUMULATES (+=)
// Layouts: a, b, da, db: [T, Hv] (row stride arbitrary, unit inner stride; typically slices of
//   the in_proj output); g, beta, dg, dbeta: [T, Hv] f32 (row stride arbitrary, unit inner
//   stride); A_log, dt_bias, dA_log, ddt_bias: [Hv] f32 contiguous. Hv <= 256 (bf16) / 128 (f32).
// Dtypes: a, b, da, db one of bf16 | f32 (one dtype per call); all math fp32 with the accurate
//   expf / log1pf (A_log is never exponentiated in bf16, gdn-math.md section 10 item 4).
// Mapping: one token row per group of tpr lanes, each lane a 16-byte slot of a/b (8 heads in
//   bf16, 4 in f32; the f32 tensors are then read and written as 2 or 1 16-byte vectors).
// Determinism: dA_log and ddt_bias are reduced without atomics: a shape-fixed grid of at most
//   kMaxBwdBlocks blocks writes one fp32 partial row [2*Hv] per block (lane partials summed in
//   shared memory in index order), then colsum_add adds the rows in a fixed order (a programmatic
//   dependent launch, overlapping the main kernel's tail). Scratch from
//   the caching allocator, released on return (stream-ordered reuse on the compute stream).
#include "ops/cuda/gdn_elementwise_common.cuh"
#include "ops/gdn_backends.h"

namespace dt::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kFwdRows = 4;         // token rows per lane group in flight (forward)
constexpr int kBwdRows = 1;         // (backward: four inputs)
constexpr int kMaxBwdBlocks = 512;  // backward grid cap (= number of partial rows)

enum : unsigned { kVecA = 1, kVecB = 2, kVecG = 4, kVecBeta = 8, kVecDa = 16, kVecDb = 32, kVecDg = 64, kVecDbeta = 128,
                  kVecP = 256 };

__device__ __forceinline__ float softplus_thr(float x) { return x > 20.f ? x : log1pf(expf(x)); }
__device__ __forceinline__ float sigmoid_acc(float x) { return 1.f / (1.f + expf(-x)); }

// Per-lane head constants: nA = -exp(A_log[h]), dtb = dt_bias[h] for the lane's V heads.
template <int V>
__device__ __forceinline__ void load_head_consts(const float* g_A_log, const float* g_dt_bias, int64_t h0, int H,
                                                 bool vec_ok, float (&r_nA)[V], float (&r_dtb)[V]) {
  ew::load_param<V>(g_A_log, h0, H, vec_ok, r_nA);
  ew::load_param<V>(g_dt_bias, h0, H, vec_ok, r_dtb);
#pragma unroll
  for (int k = 0; k < V; ++k) r_nA[k] = -expf(r_nA[k]);
}

// ============================================================================== kernels
// grid.x = ceil(T / ((kThreads / tpr) * kFwdRows)); block = kThreads.
template <typename T>
__global__ __launch_bounds__(kThreads) void gdn_gate_fwd_kernel(
    float* __restrict__ g_g, int64_t gs, float* __restrict__ g_beta, int64_t betas, const T* __restrict__ g_a,
    int64_t as, const T* __restrict__ g_b, int64_t bs, const float* __restrict__ g_A_log,
    const float* __restrict__ g_dt_bias, int64_t T_, int H, int tpr, unsigned vec) {
  constexpr int V = ew::kVec<T>, R = kFwdRows;
  const int lane = threadIdx.x & (tpr - 1);
  const int group = threadIdx.x / tpr;
  const int gpb = kThreads / tpr;
  const int64_t t0 = int64_t(blockIdx.x) * gpb * R + group;
  const int64_t h0 = int64_t(lane) * V;
  if (h0 >= H) return;  // idle lanes (no shuffles in this kernel)

  float r_a[R][V], r_b[R][V];  // [rows in flight, heads]
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int64_t t = t0 + int64_t(i) * gpb;
    if (t < T_) {
      ew::load_span<T, V>(g_a + t * as, h0, H, vec & kVecA, r_a[i]);
      ew::load_span<T, V>(g_b + t * bs, h0, H, vec & kVecB, r_b[i]);
    }
  }
  float r_nA[V], r_dtb[V];
  load_head_consts<V>(g_A_log, g_dt_bias, h0, H, vec & kVecP, r_nA, r_dtb);
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int64_t t = t0 + int64_t(i) * gpb;
    if (t < T_) {
      float r_g[V], r_be[V];
#pragma unroll
      for (int k = 0; k < V; ++k) {
        r_g[k] = r_nA[k] * softplus_thr(r_a[i][k] + r_dtb[k]);
        r_be[k] = sigmoid_acc(r_b[i][k]);
      }
      ew::store_span<float, V>(g_g + t * gs, h0, H, vec & kVecG, r_g);
      ew::store_span<float, V>(g_beta + t * betas, h0, H, vec & kVecBeta, r_be);
    }
  }
}

// grid.x = nblocks <= kMaxBwdBlocks (fixed by the shape); block b handles the row tiles b,
// b + nblocks, ... of (kThreads / tpr) * kBwdRows tokens and writes g_part[b, 0:2H] =
// [dA_log partial (H) | ddt_bias partial (H)].
template <typename T>
__global__ __launch_bounds__(kThreads) void gdn_gate_bwd_kernel(
    T* __restrict__ g_da, int64_t das, T* __restrict__ g_db, int64_t dbs, const float* __restrict__ g_dg, int64_t dgs,
    const float* __restrict__ g_dbeta, int64_t dbetas, const T* __restrict__ g_a, int64_t as,
    const T* __restrict__ g_b, int64_t bs, const float* __restrict__ g_A_log, const float* __restrict__ g_dt_bias,
    float* __restrict__ g_part, int64_t T_, int H, int tpr, unsigned vec) {
  constexpr int V = ew::kVec<T>, R = kBwdRows;
  __shared__ float s_red[2 * kThreads * V];  // [groups, 2H] lane partials (groups * H <= kThreads * V)
  const int lane = threadIdx.x & (tpr - 1);
  const int group = threadIdx.x / tpr;
  const int gpb = kThreads / tpr;
  const int64_t h0 = int64_t(lane) * V;
  const bool active = h0 < H;
  const int64_t per_tile = int64_t(gpb) * R;
  const int64_t ntiles = (T_ + per_tile - 1) / per_tile;

  float r_nA[V], r_dtb[V], r_sA[V], r_sdt[V];  // head constants; dA_log, ddt_bias partials
  load_head_consts<V>(g_A_log, g_dt_bias, active ? h0 : 0, active ? H : 0, vec & kVecP, r_nA, r_dtb);
#pragma unroll
  for (int k = 0; k < V; ++k) r_sA[k] = 0.f, r_sdt[k] = 0.f;

  if (active) {
    for (int64_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
      const int64_t tb = tile * per_tile + group;
      float r_a[R][V], r_b[R][V], r_dg[R][V], r_dbe[R][V];  // [rows in flight, heads]
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const int64_t t = tb + int64_t(i) * gpb;
        if (t < T_) {
          ew::load_span<T, V>(g_a + t * as, h0, H, vec & kVecA, r_a[i]);
          ew::load_span<T, V>(g_b + t * bs, h0, H, vec & kVecB, r_b[i]);
          ew::load_span<float, V>(g_dg + t * dgs, h0, H, vec & kVecDg, r_dg[i]);
          ew::load_span<float, V>(g_dbeta + t * dbetas, h0, H, vec & kVecDbeta, r_dbe[i]);
        }
      }
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const int64_t t = tb + int64_t(i) * gpb;
        if (t < T_) {
          float r_da[V], r_db[V];
#pragma unroll
          for (int k = 0; k < V; ++k) {
            const float x = r_a[i][k] + r_dtb[k];
            const float dg = r_dg[i][k];
            const float sp_grad = x > 20.f ? 1.f : sigmoid_acc(x);
            r_da[k] = dg * r_nA[k] * sp_grad;
            r_sA[k] = fmaf(dg, r_nA[k] * softplus_thr(x), r_sA[k]);
            r_sdt[k] += r_da[k];
            const float sb = sigmoid_acc(r_b[i][k]);
            r_db[k] = r_dbe[i][k] * sb * (1.f - sb);
          }
          ew::store_span<T, V>(g_da + t * das, h0, H, vec & kVecDa, r_da);
          ew::store_span<T, V>(g_db + t * dbs, h0, H, vec & kVecDb, r_db);
        }
      }
    }
    // Lane partials -> shared [group, 2H].
#pragma unroll
    for (int k = 0; k < V; ++k)
      if (h0 + k < H) {
        s_red[group * 2 * H + h0 + k] = r_sA[k];
        s_red[group * 2 * H + H + h0 + k] = r_sdt[k];
      }
  }
  ew::pdl_trigger();  // the partials reduction may start launching (it waits for our writes)
  __syncthreads();
  for (int c = threadIdx.x; c < 2 * H; c += kThreads) {
    float r_sum = 0.f;
    for (int g = 0; g < gpb; ++g) r_sum += s_red[g * 2 * H + c];
    g_part[int64_t(blockIdx.x) * 2 * H + c] = r_sum;
  }
}

// ============================================================================== launchers
struct RowsOf {  // a 2D [T, Hv] view: row stride, 16-byte aligned rows
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
  r.vec = ew::aligned16(v.data) && (r.stride * sz) % 16 == 0;
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
  const int64_t maxH = 32 * int64_t(16 / dtype_size(a.dtype));
  DT_CHECK(*H >= 1 && *H <= maxH, "{}: Hv must be in [1, {}] for {} inputs, got {} ({})", op, maxH,
           dtype_name(a.dtype), *H, a.str());
}

int lanes_per_row(int64_t H, int vec) { return std::min(32, ew::pow2_ceil((H + vec - 1) / vec)); }

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
    const int tpr = lanes_per_row(H, ew::kVec<T>);
    const int64_t per_block = int64_t(kThreads / tpr) * kFwdRows;
    gdn_gate_fwd_kernel<T><<<unsigned((T_ + per_block - 1) / per_block), kThreads, 0, st>>>(
        g.ptr<float>(), gr.stride, beta.ptr<float>(), ber.stride, a.ptr<T>(), ar.stride, b.ptr<T>(), br.stride,
        A_log.ptr<float>(), dt_bias.ptr<float>(), T_, int(H), tpr, vec);
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
    const int tpr = lanes_per_row(H, ew::kVec<T>);
    const int64_t per_tile = int64_t(kThreads / tpr) * kBwdRows;
    const int64_t nblocks = std::min<int64_t>((T_ + per_tile - 1) / per_tile, kMaxBwdBlocks);
    Tensor part = Tensor::empty(Shape{nblocks, 2 * H}, DType::f32, a.device);  // [nblocks, 2*Hv] f32 scratch
    gdn_gate_bwd_kernel<T><<<unsigned(nblocks), kThreads, 0, st>>>(
        da.ptr<T>(), dar.stride, db.ptr<T>(), dbr.stride, dg.ptr<float>(), dgr.stride, dbeta.ptr<float>(), dber.stride,
        a.ptr<T>(), ar.stride, b.ptr<T>(), br.stride, A_log.ptr<float>(), dt_bias.ptr<float>(), part.ptr<float>(), T_,
        int(H), tpr, vec);
    DT_CUDA_LAUNCH_CHECK();
    ew::colsum_add(dA_log.ptr<float>(), ddt_bias.ptr<float>(), part.ptr<float>(), nblocks, 2 * H, H, st);
  };
  if (a.dtype == DType::bf16) launch(__nv_bfloat16{});
  else launch(float{});
}

}  // namespace dt::ops::cuda
