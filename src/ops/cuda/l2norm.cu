// CUDA row L2-norm over the head dim, gdn-math.md sections 1.1, 6 and 4.2 (B11).
//   forward:  rstd = 1 / sqrt(sum_i x_i^2 + eps)   (eps inside the root of the SUM, as FLA and HF)
//             y = x * rstd
//   backward: y = x * rstd (recomputed from x and the saved rstd; l2norm_bwd_y: given as y)
//             dx = rstd * (dy - y * sum_i(dy_i * y_i))                        dx OVERWRITTEN (=)
// Layouts: x, y, dy, dx: [rows, d] or [A, B, d] (e.g. [T, Hk, dk] straight out of the conv
//   output [T, conv_dim]): any strides on the leading dims, unit inner stride; rstd: [rows] f32
//   contiguous (rows = product of the leading dims). d <= 256.
// Dtypes: x, y, dy, dx one of bf16 | f32 (one dtype per call); all math fp32; y and dx rounded
//   once (RNE). rsqrtf for rstd (<= 2 ulp).
// Mapping: a row is handled by a group of tpr = min(32, pow2ceil(d / vec)) lanes, each lane a
//   16-byte slot (8 bf16 or 4 f32 elements; f32 rows of more than 128 take two slots per lane).
//   A tile is R rows per group. The grid is persistent (the blocks that fit at once); a block
//   walks the tiles b, b + grid, ... and every thread streams its slots of the next S-1 tiles
//   through a per-thread cp.async ring in shared memory (ew::stage_slot), so loads stay in
//   flight while a tile is reduced and stored. Row sums are per-lane sums then a butterfly over
//   the group: deterministic, no atomics, no scratch.
#include "ops/cuda/gdn_elementwise_common.cuh"
#include "ops/gdn_backends.h"

namespace dt::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxD = 256;
// 16-byte slots per thread and tile (rows x slots per row) and ring depth; f32 rows take two
// slots per lane at d > 128 and half the rows.
#ifndef DT_L2N_FWD_SLOTS
#define DT_L2N_FWD_SLOTS 4
#endif
#ifndef DT_L2N_FWD_STAGES
#define DT_L2N_FWD_STAGES 2
#endif
#ifndef DT_L2N_BWD_SLOTS
#define DT_L2N_BWD_SLOTS 2
#endif
#ifndef DT_L2N_BWD_STAGES
#define DT_L2N_BWD_STAGES 4
#endif
constexpr int kFwdSlots = DT_L2N_FWD_SLOTS, kFwdStages = DT_L2N_FWD_STAGES;
constexpr int kBwdSlots = DT_L2N_BWD_SLOTS, kBwdStages = DT_L2N_BWD_STAGES;

template <typename T>
inline constexpr int kSlots = (kMaxD / ew::kVec<T> + 31) / 32;  // 16-byte slots per lane: 1 (bf16), 2 (f32)
template <typename T, int SLOTS>
inline constexpr int kRowsOf = SLOTS / kSlots<T> > 0 ? SLOTS / kSlots<T> : 1;  // rows per group and tile

// Dynamic shared memory of the ring: stages x slots x inputs x kThreads x 16 bytes (+ rstd words).
template <typename T, bool BWD>
constexpr size_t ring_bytes() {
  constexpr int R = kRowsOf<T, BWD ? kBwdSlots : kFwdSlots>, S = BWD ? kBwdStages : kFwdStages;
  return size_t(S) * R * kSlots<T> * (BWD ? 2 : 1) * kThreads * 16 + (BWD ? size_t(S) * R * kThreads * 4 : 0);
}

// ============================================================================== kernels
// grid.x = min(tiles, resident blocks); block = kThreads; dynamic smem = ring_bytes<T, false>().
template <typename T>
__global__ __launch_bounds__(kThreads) void l2norm_fwd_kernel(T* __restrict__ g_y, ew::RowMap ym,
                                                              float* __restrict__ g_rstd, const T* __restrict__ g_x,
                                                              ew::RowMap xm, int64_t rows, int d, int tpr, float eps,
                                                              bool x_vec, bool y_vec) {
  constexpr int V = ew::kVec<T>, NS = kSlots<T>, R = kRowsOf<T, kFwdSlots>, S = kFwdStages, P = R * NS;
  static_assert(S >= 2, "the ring needs two stages");
  extern __shared__ uint4 s_ring[];  // [S][P][kThreads] x slots
  const int lane = threadIdx.x & (tpr - 1);
  const int group = threadIdx.x / tpr;
  const int gpb = kThreads / tpr;
  const int64_t per_tile = int64_t(gpb) * R;
  const int64_t ntiles = (rows + per_tile - 1) / per_tile;

  auto issue = [&](int64_t tile, int stage) {
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t r = tile * per_tile + int64_t(i) * gpb + group;
#pragma unroll
      for (int s = 0; s < NS; ++s) {
        const int64_t e0 = int64_t(lane + s * tpr) * V;
        ew::stage_slot<T>(ew::ring_slot<kThreads>(s_ring, P, stage, i * NS + s), g_x + xm(r), e0, d, x_vec,
                          r < rows && e0 < d);
      }
    }
  };
  const int64_t G = gridDim.x;
#pragma unroll
  for (int st = 0; st < S - 1; ++st) {
    if (blockIdx.x + st * G < ntiles) issue(blockIdx.x + st * G, st);
    ew::cp_async_commit();
  }
  int stage = 0;
  for (int64_t tile = blockIdx.x; tile < ntiles; tile += G) {
    const int refill = stage == 0 ? S - 1 : stage - 1;  // the stage read one iteration ago
    if (tile + (S - 1) * G < ntiles) issue(tile + (S - 1) * G, refill);
    ew::cp_async_commit();
    ew::cp_async_wait<S - 1>();  // this tile's slots have landed

    float r_x[R][NS][V];  // [rows, slots, vec] fp32
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int s = 0; s < NS; ++s) ew::unpack16<T>(*ew::ring_slot<kThreads>(s_ring, P, stage, i * NS + s), r_x[i][s]);
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t r = tile * per_tile + int64_t(i) * gpb + group;
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
    stage = stage == S - 1 ? 0 : stage + 1;
  }
}

// grid.x = min(tiles, resident blocks); block = kThreads; dynamic smem = ring_bytes<T, true>().
template <typename T>
__global__ __launch_bounds__(kThreads) void l2norm_bwd_kernel(T* __restrict__ g_dx, ew::RowMap dxm,
                                                              const T* __restrict__ g_dy, ew::RowMap dym,
                                                              const T* __restrict__ g_x, ew::RowMap xm,
                                                              const float* __restrict__ g_rstd, int64_t rows, int d,
                                                              int tpr, bool dx_vec, bool dy_vec, bool x_vec,
                                                              bool x_is_y) {
  constexpr int V = ew::kVec<T>, NS = kSlots<T>, R = kRowsOf<T, kBwdSlots>, S = kBwdStages, P = 2 * R * NS;
  static_assert(S >= 2, "the ring needs two stages");
  extern __shared__ uint4 s_ring[];  // [S][P][kThreads] x | dy slots, then [S][R][kThreads] rstd
  float* s_rstd = reinterpret_cast<float*>(s_ring + S * P * kThreads);
  const int lane = threadIdx.x & (tpr - 1);
  const int group = threadIdx.x / tpr;
  const int gpb = kThreads / tpr;
  const int64_t per_tile = int64_t(gpb) * R;
  const int64_t ntiles = (rows + per_tile - 1) / per_tile;

  auto issue = [&](int64_t tile, int stage) {
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t r = tile * per_tile + int64_t(i) * gpb + group;
      const bool ok = r < rows;
      ew::cp_async4_zfill(s_rstd + (stage * R + i) * kThreads + threadIdx.x, g_rstd + (ok ? r : 0), ok);
#pragma unroll
      for (int s = 0; s < NS; ++s) {
        const int64_t e0 = int64_t(lane + s * tpr) * V;
        ew::stage_slot<T>(ew::ring_slot<kThreads>(s_ring, P, stage, (2 * i) * NS + s), g_x + xm(r), e0, d, x_vec,
                          ok && e0 < d);
        ew::stage_slot<T>(ew::ring_slot<kThreads>(s_ring, P, stage, (2 * i + 1) * NS + s), g_dy + dym(r), e0, d,
                          dy_vec, ok && e0 < d);
      }
    }
  };
  const int64_t G = gridDim.x;
#pragma unroll
  for (int st = 0; st < S - 1; ++st) {
    if (blockIdx.x + st * G < ntiles) issue(blockIdx.x + st * G, st);
    ew::cp_async_commit();
  }
  int stage = 0;
  for (int64_t tile = blockIdx.x; tile < ntiles; tile += G) {
    const int refill = stage == 0 ? S - 1 : stage - 1;
    if (tile + (S - 1) * G < ntiles) issue(tile + (S - 1) * G, refill);
    ew::cp_async_commit();
    ew::cp_async_wait<S - 1>();

    float r_x[R][NS][V], r_dy[R][NS][V], r_rstd[R];  // [rows, slots, vec] fp32
#pragma unroll
    for (int i = 0; i < R; ++i) {
      r_rstd[i] = s_rstd[(stage * R + i) * kThreads + threadIdx.x];
#pragma unroll
      for (int s = 0; s < NS; ++s) {
        ew::unpack16<T>(*ew::ring_slot<kThreads>(s_ring, P, stage, (2 * i) * NS + s), r_x[i][s]);
        ew::unpack16<T>(*ew::ring_slot<kThreads>(s_ring, P, stage, (2 * i + 1) * NS + s), r_dy[i][s]);
      }
    }
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t r = tile * per_tile + int64_t(i) * gpb + group;
      float r_dot = 0.f;  // sum(dy * y)
#pragma unroll
      for (int s = 0; s < NS; ++s)
#pragma unroll
        for (int k = 0; k < V; ++k) {
          if (!x_is_y) r_x[i][s][k] *= r_rstd[i];  // now y
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
    stage = stage == S - 1 ? 0 : stage + 1;
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

// Persistent grid: min(tiles, resident blocks), with the ring's shared memory opted in.
template <typename T, bool BWD, class Kernel>
unsigned ring_grid(Kernel kernel, int64_t rows, int tpr) {
  constexpr size_t smem = ring_bytes<T, BWD>();
  if constexpr (smem > 48 * 1024)
    DT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const int64_t per_tile = int64_t(kThreads / tpr) * kRowsOf<T, BWD ? kBwdSlots : kFwdSlots>;
  const int64_t ntiles = (rows + per_tile - 1) / per_tile;
  return unsigned(std::min(ntiles, ew::resident_blocks(kernel, kThreads, smem)));
}

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
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    const int tpr = lanes_per_row(xr.d, ew::kVec<T>);
    const unsigned grid = ring_grid<T, false>(l2norm_fwd_kernel<T>, xr.rows, tpr);
    l2norm_fwd_kernel<T><<<grid, kThreads, ring_bytes<T, false>(), st>>>(
        y.ptr<T>(), yr.map, rstd.ptr<float>(), x.ptr<T>(), xr.map, xr.rows, int(xr.d), tpr, eps, xr.vec, yr.vec);
  };
  if (x.dtype == DType::bf16) launch(__nv_bfloat16{});
  else launch(float{});
  DT_CUDA_LAUNCH_CHECK();
}

namespace {
// x_is_y: `x` holds y itself (l2norm_bwd_y).
void l2norm_bwd_impl(const TensorView& dx, const TensorView& dy, const TensorView& x, const TensorView& rstd,
                     bool x_is_y, Stream s) {
  const char* op = x_is_y ? "cuda::l2norm_bwd_y" : "cuda::l2norm_bwd";
  const RowsOf xr = rows_of(x, op, "x");     // [rows, d]
  const RowsOf dyr = rows_of(dy, op, "dy");  // [rows, d]
  const RowsOf dxr = rows_of(dx, op, "dx");  // [rows, d] (=)
  check_same_shape(dy, x, "cuda::l2norm_bwd dy vs x (or y)");
  check_same_shape(dx, x, "cuda::l2norm_bwd dx vs x (or y)");
  DT_CHECK(dx.dtype == x.dtype && dy.dtype == x.dtype, "{}: dx {}, dy {} and x {} must have one dtype", op, dx.str(),
           dy.str(), x.str());
  DT_CHECK(dx.device == x.device && dy.device == x.device, "{}: dx, dy and x must be on one device", op);
  DT_CHECK(xr.d >= 1 && xr.d <= kMaxD, "{}: the row length d must be in [1, {}], got {} ({})", op, kMaxD, xr.d,
           x.str());
  check_rstd(rstd, xr.rows, x, op);
  if (xr.rows == 0) return;
  ew::NvtxRange range(op);
  const cudaStream_t st = static_cast<cudaStream_t>(s.handle);
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    const int tpr = lanes_per_row(xr.d, ew::kVec<T>);
    const unsigned grid = ring_grid<T, true>(l2norm_bwd_kernel<T>, xr.rows, tpr);
    l2norm_bwd_kernel<T><<<grid, kThreads, ring_bytes<T, true>(), st>>>(
        dx.ptr<T>(), dxr.map, dy.ptr<T>(), dyr.map, x.ptr<T>(), xr.map, rstd.ptr<float>(), xr.rows, int(xr.d), tpr,
        dxr.vec, dyr.vec, xr.vec, x_is_y);
  };
  if (x.dtype == DType::bf16) launch(__nv_bfloat16{});
  else launch(float{});
  DT_CUDA_LAUNCH_CHECK();
}
}  // namespace

void l2norm_bwd(const TensorView& dx, const TensorView& dy, const TensorView& x, const TensorView& rstd, Stream s) {
  l2norm_bwd_impl(dx, dy, x, rstd, false, s);
}
void l2norm_bwd_y(const TensorView& dx, const TensorView& dy, const TensorView& y, const TensorView& rstd, Stream s) {
  l2norm_bwd_impl(dx, dy, y, rstd, true, s);
}

}  // namespace dt::ops::cuda
