// CUDA gated RMSNorm on the GDN output, gdn-math.md section 8.1 (HF Qwen3_5RMSNormGated: norm
// first, then the gate; plain weight w shared by all heads, not 1 + w).
//   forward:  rstd = 1 / sqrt(mean_i(o_i^2) + eps) over dv;  xh = o * rstd
//             y = xh * w * silu(z)                     (fp32 math, y rounded once)
//   backward: sg = sigmoid(z);  dy0 = dy * z * sg
//             dz  = dy * xh * w * sg * (1 + z (1 - sg))                     dz OVERWRITTEN (=)
//             do  = rstd * (w * dy0 - xh * mean_i(xh_i * w_i * dy0_i))    do OVERWRITTEN (=)
//             dw += sum_rows dy0 * xh                                     dw ACCUMULATES (+=)
// Layouts: o, z, y, dy, do, dz: [rows, dv] or [A, B, dv] (e.g. [T, Hv, dv]); any strides on the
//   leading dims, unit inner stride; w, dw: [dv] f32 contiguous; rstd: [rows] f32 contiguous
//   (saved by the forward). dv <= 256.
// Dtypes: o, z, y, dy, do, dz one of bf16 | f32 (one dtype per call); math fp32; sigmoid via
//   __expf and __fdividef (natural exp); rstd via rsqrtf.
// Mapping: as l2norm.cu, a group of tpr lanes per row, 16-byte slots, two rows in flight per lane.
// Determinism: dw is reduced without atomics. The backward grid is fixed by the shape (at most
//   1024 blocks, each a fixed strided set of row tiles); each block reduces its lanes' fp32
//   partials in shared memory in index order into a scratch row [blocks, dv] (caching allocator,
//   released on return: stream-ordered reuse on the compute stream), then colsum_add sums the
//   rows in a fixed order and adds to dw (launched as a programmatic dependent of the main
//   kernel, so its launch overlaps the main kernel's tail). The bits depend only on (rows, dv,
//   dtype).
#include "ops/cuda/gdn_elementwise_common.cuh"
#include "ops/gdn_backends.h"

namespace dt::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxD = 256;
constexpr int kRows = 2;               // rows per lane group in flight
constexpr int kMaxBwdBlocks = 1024;    // backward grid cap (= number of dw partial rows)

template <typename T>
inline constexpr int kSlots = (kMaxD / ew::kVec<T> + 31) / 32;  // 16-byte slots per lane: 1 (bf16), 2 (f32)

// Vector-access flags, one bit per view (rows 16-byte aligned).
enum : unsigned { kVecO = 1, kVecZ = 2, kVecY = 4, kVecDy = 8, kVecDo = 16, kVecDz = 32, kVecW = 64 };

// ============================================================================== kernels
// grid.x = ceil(rows / ((kThreads / tpr) * kRows)); block = kThreads.
template <typename T>
__global__ __launch_bounds__(kThreads) void gated_rmsnorm_fwd_kernel(
    T* __restrict__ g_y, ew::RowMap ym, float* __restrict__ g_rstd, const T* __restrict__ g_o, ew::RowMap om,
    const T* __restrict__ g_z, ew::RowMap zm, const float* __restrict__ g_w, int64_t rows, int d, int tpr, float eps,
    unsigned vec) {
  constexpr int V = ew::kVec<T>, NS = kSlots<T>, R = kRows;
  const int lane = threadIdx.x & (tpr - 1);
  const int group = threadIdx.x / tpr;
  const int gpb = kThreads / tpr;
  const int64_t row0 = int64_t(blockIdx.x) * gpb * R + group;

  float r_o[R][NS][V], r_z[R][NS][V];  // [rows in flight, slots, vec] fp32
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int64_t r = row0 + int64_t(i) * gpb;
#pragma unroll
    for (int s = 0; s < NS; ++s) {
      const int64_t e0 = int64_t(lane + s * tpr) * V;
      if (r < rows && e0 < d) {
        ew::load_slot<T>(g_o + om(r), e0, d, vec & kVecO, r_o[i][s]);
        ew::load_slot<T>(g_z + zm(r), e0, d, vec & kVecZ, r_z[i][s]);
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) r_o[i][s][k] = 0.f, r_z[i][s][k] = 0.f;
      }
    }
  }
  float r_w[NS][V];  // [slots, vec] the lane's slice of w
#pragma unroll
  for (int s = 0; s < NS; ++s) ew::load_param<V>(g_w, int64_t(lane + s * tpr) * V, d, vec & kVecW, r_w[s]);

  const float inv_d = 1.f / float(d);
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int64_t r = row0 + int64_t(i) * gpb;
    float r_ss = 0.f;
#pragma unroll
    for (int s = 0; s < NS; ++s)
#pragma unroll
      for (int k = 0; k < V; ++k) r_ss = fmaf(r_o[i][s][k], r_o[i][s][k], r_ss);
    r_ss = ew::group_sum(r_ss, tpr);
    const float r_rstd = rsqrtf(r_ss * inv_d + eps);
    if (r < rows) {
#pragma unroll
      for (int s = 0; s < NS; ++s) {
        const int64_t e0 = int64_t(lane + s * tpr) * V;
        if (e0 < d) {
          float r_y[V];
#pragma unroll
          for (int k = 0; k < V; ++k) {
            const float z = r_z[i][s][k];
            r_y[k] = r_o[i][s][k] * r_rstd * r_w[s][k] * (z * ew::sigmoid_f(z));
          }
          ew::store_slot<T>(g_y + ym(r), e0, d, vec & kVecY, r_y);
        }
      }
      if (lane == 0) g_rstd[r] = r_rstd;
    }
  }
}

// grid.x = nblocks <= kMaxBwdBlocks (fixed by the shape); block b handles the row tiles
// b, b + nblocks, ... of (kThreads / tpr) * kRows rows and writes g_part[b, 0:d].
template <typename T>
__global__ __launch_bounds__(kThreads) void gated_rmsnorm_bwd_kernel(
    T* __restrict__ g_do, ew::RowMap dom, T* __restrict__ g_dz, ew::RowMap dzm, const T* __restrict__ g_dy,
    ew::RowMap dym, const T* __restrict__ g_o, ew::RowMap om, const T* __restrict__ g_z, ew::RowMap zm,
    const float* __restrict__ g_w, const float* __restrict__ g_rstd, float* __restrict__ g_part, int64_t rows, int d,
    int tpr, unsigned vec) {
  constexpr int V = ew::kVec<T>, NS = kSlots<T>, R = kRows;
  __shared__ float s_dw[kThreads * V * NS];  // [groups, d] lane partials (gpb * d <= kThreads * V * NS)
  const int lane = threadIdx.x & (tpr - 1);
  const int group = threadIdx.x / tpr;
  const int gpb = kThreads / tpr;
  const int64_t per_tile = int64_t(gpb) * R;
  const int64_t ntiles = (rows + per_tile - 1) / per_tile;

  float r_w[NS][V], r_dw[NS][V];  // [slots, vec] w slice, dw partial
#pragma unroll
  for (int s = 0; s < NS; ++s) {
    ew::load_param<V>(g_w, int64_t(lane + s * tpr) * V, d, vec & kVecW, r_w[s]);
#pragma unroll
    for (int k = 0; k < V; ++k) r_dw[s][k] = 0.f;
  }
  const float inv_d = 1.f / float(d);

  for (int64_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
    const int64_t row0 = tile * per_tile + group;
    float r_o[R][NS][V], r_z[R][NS][V], r_dy[R][NS][V];  // [rows in flight, slots, vec] fp32
    float r_rstd[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t r = row0 + int64_t(i) * gpb;
      r_rstd[i] = r < rows ? __ldg(g_rstd + r) : 0.f;
#pragma unroll
      for (int s = 0; s < NS; ++s) {
        const int64_t e0 = int64_t(lane + s * tpr) * V;
        if (r < rows && e0 < d) {
          ew::load_slot<T>(g_o + om(r), e0, d, vec & kVecO, r_o[i][s]);
          ew::load_slot<T>(g_z + zm(r), e0, d, vec & kVecZ, r_z[i][s]);
          ew::load_slot<T>(g_dy + dym(r), e0, d, vec & kVecDy, r_dy[i][s]);
        } else {
#pragma unroll
          for (int k = 0; k < V; ++k) r_o[i][s][k] = 0.f, r_z[i][s][k] = 0.f, r_dy[i][s][k] = 0.f;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t r = row0 + int64_t(i) * gpb;
      float r_m = 0.f;  // sum(xh * w * dy0)
#pragma unroll
      for (int s = 0; s < NS; ++s) {
        const int64_t e0 = int64_t(lane + s * tpr) * V;
        float r_dz[V];
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float z = r_z[i][s][k], dy = r_dy[i][s][k];
          const float xh = r_o[i][s][k] * r_rstd[i];
          const float sg = ew::sigmoid_f(z);
          const float dy0 = dy * (z * sg);
          r_dz[k] = dy * xh * r_w[s][k] * (sg * (1.f + z * (1.f - sg)));
          r_dw[s][k] = fmaf(dy0, xh, r_dw[s][k]);
          r_m = fmaf(xh * r_w[s][k], dy0, r_m);
          r_o[i][s][k] = xh;
          r_dy[i][s][k] = dy0;
        }
        if (r < rows && e0 < d) ew::store_slot<T>(g_dz + dzm(r), e0, d, vec & kVecDz, r_dz);
      }
      r_m = ew::group_sum(r_m, tpr) * inv_d;
      if (r < rows) {
#pragma unroll
        for (int s = 0; s < NS; ++s) {
          const int64_t e0 = int64_t(lane + s * tpr) * V;
          if (e0 < d) {
            float r_do[V];
#pragma unroll
            for (int k = 0; k < V; ++k) r_do[k] = r_rstd[i] * (r_w[s][k] * r_dy[i][s][k] - r_o[i][s][k] * r_m);
            ew::store_slot<T>(g_do + dom(r), e0, d, vec & kVecDo, r_do);
          }
        }
      }
    }
  }

  ew::pdl_trigger();  // the partials reduction may start launching (it waits for our writes)
  // Block partial of dw: lane partials -> shared [group, d] -> fixed-order sum over groups.
#pragma unroll
  for (int s = 0; s < NS; ++s) {
    const int e0 = (lane + s * tpr) * V;
#pragma unroll
    for (int k = 0; k < V; ++k)
      if (e0 + k < d) s_dw[group * d + e0 + k] = r_dw[s][k];
  }
  __syncthreads();
  for (int c = threadIdx.x; c < d; c += kThreads) {
    float r_sum = 0.f;
    for (int g = 0; g < gpb; ++g) r_sum += s_dw[g * d + c];
    g_part[int64_t(blockIdx.x) * d + c] = r_sum;
  }
}

// ============================================================================== launchers
struct RowsOf {
  ew::RowMap map;
  int64_t rows = 0, d = 0;
  bool vec = false;
};

RowsOf rows_of(const TensorView& v, const TensorView& like, const char* op, const char* what) {
  RowsOf r;
  DT_CHECK(v.device.is_cuda(), "{}: {} must be a CUDA view, got {}", op, what, v.str());
  DT_CHECK(v.dtype == DType::bf16 || v.dtype == DType::f32, "{}: {} must be bf16 or f32, got {}", op, what, v.str());
  DT_CHECK(v.dtype == like.dtype && v.device == like.device && v.shape == like.shape,
           "{}: {} {} must match o {} in dtype, device and shape", op, what, v.str(), like.str());
  DT_CHECK(ew::make_rowmap(v, &r.map, &r.rows, &r.d),
           "{}: {} must be [rows, dv] or [A, B, dv] with a unit inner stride (leading dims with any strides), got {}",
           op, what, v.str());
  r.vec = ew::rows_aligned16(v, r.map);
  return r;
}

void check_param(const TensorView& p, int64_t n, const TensorView& o, const char* op, const char* what) {
  DT_CHECK(p.device == o.device, "{}: {} is on {} but o on {}", op, what, p.device.str(), o.device.str());
  DT_CHECK(p.dtype == DType::f32 && p.numel() == n && p.is_contiguous(),
           "{}: {} must be a contiguous f32 view of {} elements, got {}", op, what, n, p.str());
}

int lanes_per_row(int64_t d, int vec) { return std::min(32, ew::pow2_ceil((d + vec - 1) / vec)); }

}  // namespace

void gated_rmsnorm_fwd(const TensorView& y, const TensorView& rstd, const TensorView& o, const TensorView& z,
                       const TensorView& w, float eps, Stream s) {
  constexpr const char* op = "cuda::gated_rmsnorm_fwd";
  const RowsOf orr = rows_of(o, o, op, "o");  // [rows, dv]
  const RowsOf zr = rows_of(z, o, op, "z");   // [rows, dv]
  const RowsOf yr = rows_of(y, o, op, "y");   // [rows, dv]
  DT_CHECK(orr.d >= 1 && orr.d <= kMaxD, "{}: dv must be in [1, {}], got {} ({})", op, kMaxD, orr.d, o.str());
  check_param(w, orr.d, o, op, "w");               // [dv] f32
  check_param(rstd, orr.rows, o, op, "rstd");      // [rows] f32
  if (orr.rows == 0) return;
  const unsigned vec = (orr.vec ? kVecO : 0) | (zr.vec ? kVecZ : 0) | (yr.vec ? kVecY : 0) |
                       (ew::aligned16(w.data) ? kVecW : 0);
  ew::NvtxRange range(op);
  const cudaStream_t st = static_cast<cudaStream_t>(s.handle);
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    const int tpr = lanes_per_row(orr.d, ew::kVec<T>);
    const int64_t per_block = int64_t(kThreads / tpr) * kRows;
    gated_rmsnorm_fwd_kernel<T><<<unsigned((orr.rows + per_block - 1) / per_block), kThreads, 0, st>>>(
        y.ptr<T>(), yr.map, rstd.ptr<float>(), o.ptr<T>(), orr.map, z.ptr<T>(), zr.map, w.ptr<float>(), orr.rows,
        int(orr.d), tpr, eps, vec);
  };
  if (o.dtype == DType::bf16) launch(__nv_bfloat16{});
  else launch(float{});
  DT_CUDA_LAUNCH_CHECK();
}

void gated_rmsnorm_bwd(const TensorView& do_, const TensorView& dz, const TensorView& dw, const TensorView& dy,
                       const TensorView& o, const TensorView& z, const TensorView& w, const TensorView& rstd,
                       Stream s) {
  constexpr const char* op = "cuda::gated_rmsnorm_bwd";
  const RowsOf orr = rows_of(o, o, op, "o");     // [rows, dv]
  const RowsOf zr = rows_of(z, o, op, "z");      // [rows, dv]
  const RowsOf dyr = rows_of(dy, o, op, "dy");   // [rows, dv]
  const RowsOf dor = rows_of(do_, o, op, "do");  // [rows, dv] (=)
  const RowsOf dzr = rows_of(dz, o, op, "dz");   // [rows, dv] (=)
  DT_CHECK(orr.d >= 1 && orr.d <= kMaxD, "{}: dv must be in [1, {}], got {} ({})", op, kMaxD, orr.d, o.str());
  check_param(w, orr.d, o, op, "w");            // [dv] f32
  check_param(dw, orr.d, o, op, "dw");          // [dv] f32 (+=)
  check_param(rstd, orr.rows, o, op, "rstd");   // [rows] f32
  if (orr.rows == 0) return;
  const unsigned vec = (orr.vec ? kVecO : 0) | (zr.vec ? kVecZ : 0) | (dyr.vec ? kVecDy : 0) |
                       (dor.vec ? kVecDo : 0) | (dzr.vec ? kVecDz : 0) | (ew::aligned16(w.data) ? kVecW : 0);
  ew::NvtxRange range(op);
  const cudaStream_t st = static_cast<cudaStream_t>(s.handle);
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    const int tpr = lanes_per_row(orr.d, ew::kVec<T>);
    const int64_t per_tile = int64_t(kThreads / tpr) * kRows;
    const int64_t nblocks = std::min<int64_t>((orr.rows + per_tile - 1) / per_tile, kMaxBwdBlocks);
    // Scratch: one dw partial row per block (stream-ordered reuse; see the file header).
    Tensor part = Tensor::empty(Shape{nblocks, orr.d}, DType::f32, o.device);  // [nblocks, dv] f32
    gated_rmsnorm_bwd_kernel<T><<<unsigned(nblocks), kThreads, 0, st>>>(
        do_.ptr<T>(), dor.map, dz.ptr<T>(), dzr.map, dy.ptr<T>(), dyr.map, o.ptr<T>(), orr.map, z.ptr<T>(), zr.map,
        w.ptr<float>(), rstd.ptr<float>(), part.ptr<float>(), orr.rows, int(orr.d), tpr, vec);
    DT_CUDA_LAUNCH_CHECK();
    ew::colsum_add(dw.ptr<float>(), dw.ptr<float>(), part.ptr<float>(), nblocks, orr.d, orr.d, st);
  };
  if (o.dtype == DType::bf16) launch(__nv_bfloat16{});
  else launch(float{});
}

}  // namespace dt::ops::cuda
