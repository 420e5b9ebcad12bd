// CUDA row L2-norm over the head dim, gdn-math.md sections 1.1, 6 and 4.2 (B11).
//   forward:  rstd = 1 / sqrt(sum_i x_i^2 + eps)   (eps inside the root of the SUM, as FLA and HF)
//             y = x * rstd
//   backward: y = x * rstd (recomputed from x and the saved rstd)
//             dx = rstd * (dy - y * sum_i(dy_i * y_i))                        dx OVERWRITTEN (=)
// Layouts: x, y, dy, dx: [rows, d] or [A, B, d] (e.g. [T, Hk, dk] straight out of the conv
//   output [T, conv_dim]): any strides on the leading dims, unit inner stride; rstd: [rows] f32
//   contiguous (rows = product of the leading dims). d <= 256.
// Dtypes: x, y, dy, dx one of bf16 | f32 (one dtype per call); all math fp32; y and dx rounded
//   once (RNE). rsqrtf for rstd (<= 2 ulp).
// Mapping: a row is handled by a group of tpr = min(32, pow2ceil(d / vec)) lanes, each lane a
//   16-byte slot (8 bf16 or 4 f32 elements; f32 rows of more than 128 take two slots per lane);
//   every thread keeps several rows' loads in flight before its first reduction. Row sums are
//   per-lane sums then a butterfly over the group: deterministic, no atomics, no scratch.
#include "ops/cuda/gdn_elementwise_common.cuh"
#include "ops/gdn_backends.h"

namespace dt::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxD = 256;
constexpr int kFwdRows = 4;  // rows per lane group in flight (forward: one input)
constexpr int kBwdRows = 2;  // (backward: two inputs)

template <typename T>
inline constexpr int kSlots = (kMaxD / ew::kVec<T> + 31) / 32;  // 16-byte slots per lane: 1 (bf16), 2 (f32)

// ============================================================================== kernels
// grid.x = ceil(rows / ((kThreads / tpr) * kFwdRows)); block = kThreads.
template <typename T>
__global__ __launch_bounds__(kThreads) void l2norm_fwd_kernel(T* __restrict__ g_y, ew::RowMap ym,
                                                              float* __restrict__ g_rstd, const T* __restrict__ g_x,
                                                              ew::RowMap xm, int64_t rows, int d, int tpr, float eps,
                                                              bool x_vec, bool y_vec) {
  constexpr int V = ew::kVec<T>, NS = kSlots<T>, R = kFwdRows;
  const int lane = threadIdx.x & (tpr - 1);
  const int group = threadIdx.x / tpr;
  const int gpb = kThreads / tpr;
  const int64_t row0 = int64_t(blockIdx.x) * gpb * R + group;

  float r_x[R][NS][V];  // [rows in flight, slots, vec] fp32
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int64_t r = row0 + int64_t(i) * gpb;
#pragma unroll
    for (int s = 0; s < NS; ++s) {
      const int64_t e0 = int64_t(lane + s * tpr) * V;
      if (r < rows && e0 < d) {
        ew::load_slot<T>(g_x + xm(r), e0, d, x_vec, r_x[i][s]);
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) r_x[i][s][k] = 0.f;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int64_t r = row0 + int64_t(i) * gpb;
    float r_ss = 0.f;
#pragma unroll
    for (int s = 0; s < NS; ++s)
#pragma unroll
      for (int k = 0; k < V; ++k) r_ss = fmaf(r_x[i][s][k], r_x[i][s][k], r_ss);
    r_ss = ew::group_sum(r_ss, tpr);
    const float r_rstd = rsqrtf(r_ss + eps);
    if (r < rows) {
#pragma unroll
      for (int s = 0; s < NS; ++s) {
        const int64_t e0 = int64_t(lane + s * tpr) * V;
        if (e0 < d) {
          float r_y[V];
#pragma unroll
          for (int k = 0; k < V; ++k) r_y[k] = r_x[i][s][k] * r_rstd;
          ew::store_slot<T>(g_y + ym(r), e0, d, y_vec, r_y);
        }
      }
      if (lane == 0) g_rstd[r] = r_rstd;
    }
  }
}

// grid.x = ceil(rows / ((kThreads / tpr) * kBwdRows)); block = kThreads.
template <typename T>
__global__ __launch_bounds__(kThreads) void l2norm_bwd_kernel(T* __restrict__ g_dx, ew::RowMap dxm,
                                                              const T* __restrict__ g_dy, ew::RowMap dym,
                                                              const T* __restrict__ g_x, ew::RowMap xm,
                                                              const float* __restrict__ g_rstd, int64_t rows, int d,
                                                              int tpr, bool dx_vec, bool dy_vec, bool x_vec) {
  constexpr int V = ew::kVec<T>, NS = kSlots<T>, R = kBwdRows;
  const int lane = threadIdx.x & (tpr - 1);
  const int group = threadIdx.x / tpr;
  const int gpb = kThreads / tpr;
  const int64_t row0 = int64_t(blockIdx.x) * gpb * R + group;

  float r_x[R][NS][V], r_dy[R][NS][V];  // [rows in flight, slots, vec] fp32
  float r_rstd[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int64_t r = row0 + int64_t(i) * gpb;
    r_rstd[i] = r < rows ? __ldg(g_rstd + r) : 0.f;
#pragma unroll
    for (int s = 0; s < NS; ++s) {
      const int64_t e0 = int64_t(lane + s * tpr) * V;
      if (r < rows && e0 < d) {
        ew::load_slot<T>(g_x + xm(r), e0, d, x_vec, r_x[i][s]);
        ew::load_slot<T>(g_dy + dym(r), e0, d, dy_vec, r_dy[i][s]);
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) r_x[i][s][k] = 0.f, r_dy[i][s][k] = 0.f;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int64_t r = row0 + int64_t(i) * gpb;
    float r_dot = 0.f;  // sum(dy * y)
#pragma unroll
    for (int s = 0; s < NS; ++s)
#pragma unroll
      for (int k = 0; k < V; ++k) {
        r_x[i][s][k] *= r_rstd[i];  // now y
        r_dot = fmaf(r_dy[i][s][k], r_x[i][s][k], r_dot);
      }
    r_dot = ew::group_sum(r_dot, tpr);
    if (r < rows) {
#pragma unroll
      for (int s = 0; s < NS; ++s) {
        const int64_t e0 = int64_t(lane + s * tpr) * V;
        if (e0 < d) {
          float r_dx[V];
#pragma unroll
          for (int k = 0; k < V; ++k) r_dx[k] = r_rstd[i] * (r_dy[i][s][k] - r_x[i][s][k] * r_dot);
          ew::store_slot<T>(g_dx + dxm(r), e0, d, dx_vec, r_dx);
        }
      }
    }
  }
}

// ============================================================================== launchers
struct RowsOf {
  ew::RowMap map;
  int64_t rows = 0, d = 0;
  bool vec = false;
};

RowsOf rows_of(const TensorView& v, const char* op, const char* what) {
  RowsOf r;
  DT_CHECK(v.device.is_cuda(), "{}: {} must be a CUDA view, got {}", op, what, v.str());
  DT_CHECK(v.dtype == DType::bf16 || v.dtype == DType::f32, "{}: {} must be bf16 or f32, got {}", op, what, v.str());
  DT_CHECK(ew::make_rowmap(v, &r.map, &r.rows, &r.d),
           "{}: {} must be [rows, d] or [A, B, d] with a unit inner stride (leading dims with any strides), got {}",
           op, what, v.str());
  r.vec = ew::rows_aligned16(v, r.map);
  return r;
}

void check_rstd(const TensorView& rstd, int64_t rows, const TensorView& x, const char* op) {
  DT_CHECK(rstd.device == x.device, "{}: rstd is on {} but x on {}", op, rstd.device.str(), x.device.str());
  check_dtype(rstd, DType::f32, "l2norm rstd");
  DT_CHECK(rstd.numel() == rows && rstd.is_contiguous(), "{}: rstd must be a contiguous f32 view of {} rows, got {}",
           op, rows, rstd.str());
}

int lanes_per_row(int64_t d, int vec) { return std::min(32, ew::pow2_ceil((d + vec - 1) / vec)); }

}  // namespace

void l2norm_fwd(const TensorView& y, const TensorView& rstd, const TensorView& x, float eps, Stream s) {
  constexpr const char* op = "cuda::l2norm_fwd";
  const RowsOf xr = rows_of(x, op, "x");  // [rows, d]
  const RowsOf yr = rows_of(y, op, "y");  // [rows, d]
  check_same_shape(y, x, "cuda::l2norm_fwd y vs x");
  DT_CHECK(y.dtype == x.dtype && y.device == x.device, "{}: y {} must match x {} in dtype and device", op, y.str(),
           x.str());
  DT_CHECK(xr.d >= 1 && xr.d <= kMaxD, "{}: the row length d must be in [1, {}], got {} ({})", op, kMaxD, xr.d,
           x.str());
  check_rstd(rstd, xr.rows, x, op);
  if (xr.rows == 0) return;
  ew::NvtxRange range(op);
  const cudaStream_t st = static_cast<cudaStream_t>(s.handle);
  if (x.dtype == DType::bf16) {
    using T = __nv_bfloat16;
    const int tpr = lanes_per_row(xr.d, ew::kVec<T>);
    const int64_t per_block = int64_t(kThreads / tpr) * kFwdRows;
    l2norm_fwd_kernel<T><<<unsigned((xr.rows + per_block - 1) / per_block), kThreads, 0, st>>>(
        y.ptr<T>(), yr.map, rstd.ptr<float>(), x.ptr<T>(), xr.map, xr.rows, int(xr.d), tpr, eps, xr.vec, yr.vec);
  } else {
    using T = float;
    const int tpr = lanes_per_row(xr.d, ew::kVec<T>);
    const int64_t per_block = int64_t(kThreads / tpr) * kFwdRows;
    l2norm_fwd_kernel<T><<<unsigned((xr.rows + per_block - 1) / per_block), kThreads, 0, st>>>(
        y.ptr<T>(), yr.map, rstd.ptr<float>(), x.ptr<T>(), xr.map, xr.rows, int(xr.d), tpr, eps, xr.vec, yr.vec);
  }
  DT_CUDA_LAUNCH_CHECK();
}

void l2norm_bwd(const TensorView& dx, const TensorView& dy, const TensorView& x, const TensorView& rstd, Stream s) {
  constexpr const char* op = "cuda::l2norm_bwd";
  const RowsOf xr = rows_of(x, op, "x");     // [rows, d]
  const RowsOf dyr = rows_of(dy, op, "dy");  // [rows, d]
  const RowsOf dxr = rows_of(dx, op, "dx");  // [rows, d] (=)
  check_same_shape(dy, x, "cuda::l2norm_bwd dy vs x");
  check_same_shape(dx, x, "cuda::l2norm_bwd dx vs x");
  DT_CHECK(dx.dtype == x.dtype && dy.dtype == x.dtype, "{}: dx {}, dy {} and x {} must have one dtype", op, dx.str(),
           dy.str(), x.str());
  DT_CHECK(dx.device == x.device && dy.device == x.device, "{}: dx, dy and x must be on one device", op);
  DT_CHECK(xr.d >= 1 && xr.d <= kMaxD, "{}: the row length d must be in [1, {}], got {} ({})", op, kMaxD, xr.d,
           x.str());
  check_rstd(rstd, xr.rows, x, op);
  if (xr.rows == 0) return;
  ew::NvtxRange range(op);
  const cudaStream_t st = static_cast<cudaStream_t>(s.handle);
  if (x.dtype == DType::bf16) {
    using T = __nv_bfloat16;
    const int tpr = lanes_per_row(xr.d, ew::kVec<T>);
    const int64_t per_block = int64_t(kThreads / tpr) * kBwdRows;
    l2norm_bwd_kernel<T><<<unsigned((xr.rows + per_block - 1) / per_block), kThreads, 0, st>>>(
        dx.ptr<T>(), dxr.map, dy.ptr<T>(), dyr.map, x.ptr<T>(), xr.map, rstd.ptr<float>(), xr.rows, int(xr.d), tpr,
        dxr.vec, dyr.vec, xr.vec);
  } else {
    using T = float;
    const int tpr = lanes_per_row(xr.d, ew::kVec<T>);
    const int64_t per_block = int64_t(kThreads / tpr) * kBwdRows;
    l2norm_bwd_kernel<T><<<unsigned((xr.rows + per_block - 1) / per_block), kThreads, 0, st>>>(
        dx.ptr<T>(), dxr.map, dy.ptr<T>(), dyr.map, x.ptr<T>(), xr.map, rstd.ptr<float>(), xr.rows, int(xr.d), tpr,
        dxr.vec, dyr.vec, xr.vec);
  }
  DT_CUDA_LAUNCH_CHECK();
}

}  // namespace dt::ops::cuda
