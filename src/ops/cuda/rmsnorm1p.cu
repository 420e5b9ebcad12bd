// CUDA Qwen3.5 RMSNorm with (1 + w) (HF Qwen3_5RMSNorm, gdn-math.md 8.2), per row over D:
//   forward:  rstd = 1 / sqrt(mean_j x_j^2 + eps);  y = x * rstd * (1 + w)            y, rstd (=)
//   backward: g = dy * (1 + w);  dx = rstd * (g - xh * mean_j(g_j xh_j))                dx (=)
//             dw += sum_rows dy * xh                                                    dw (+=)
// Layouts: x, y, dy, dx [rows, D] f32 | bf16 (any row stride, unit inner stride; the attention's
// q heads are the strided half of a [T, 2 * H * d] buffer); w, dw [D] f32; rstd [rows] f32.
// Math fp32, rstd via 1/sqrtf (IEEE).
// Row kernels: D <= 32 lanes x 8 slots x 16 bytes (2048 bf16 / 1024 f32 elements): one warp
// per row, lane l owns the 16-byte slots l, l + 32, ... of the row, which stay in registers
// between the sum and the output; the forward issues 4 (D <= 256 bf16), 2 or 1 rows' loads per
// warp before its reductions, the backward 2 or 1 (bytes in flight). 16-byte accesses when the
// base and row stride are 16-byte aligned, element accesses otherwise (and for a ragged last
// slot). Wider rows: one block of 256 threads per row (the generic kernels below).
// Determinism: the row backward's grid is G = min(ceil(rows / rows per block), 512) blocks,
// fixed by the shape (on an H200: one wave at 4 blocks per SM for D = 256, two at 2 for 1024).
// Warp w of block b owns the row groups b * 8 + w, + 8G, ... in order and keeps its dw partials
// in registers (fixed columns per lane); the block adds its 8 warps' partials in warp order into
// its scratch row of [G, D]; ew::colsum_add then sums the G rows of every column in a fixed
// order and adds to dw. The generic backward (G = min(rows, 512), one block per row)
// accumulates its rows in order into the same scratch.
#include <algorithm>

#include "deltatron/core/allocator.h"
#include "ops/cuda/gdn_elementwise_common.cuh"
#include "ops/cuda/layers_common.cuh"
#include "ops/layers_ops_backends.h"

namespace dt::ops::cuda {
namespace {

constexpr int kMaxBwdBlocks = 512;
constexpr int kWarps = lc::kThreads / 32;  // warps per block of the row kernels
constexpr int kMaxSlots = 8;               // 16-byte slots per lane of a row kernel

// ---- row kernels (one warp per row) ----------------------------------------------------------
// NS: 16-byte slots per lane (D <= 32 * NS * V); RW: rows whose loads one warp issues together.
template <typename T, int NS, int RW>
__global__ __launch_bounds__(lc::kThreads) void rmsnorm1p_fwd_kernel(T* g_y, int64_t ldy, float* g_rstd,
                                                                      const T* g_x, int64_t ldx, const float* g_w,
                                                                      int64_t R, int64_t D, float eps, bool vx,
                                                                      bool vy, bool vw) {
  constexpr int V = ew::kVec<T>;
  const int lane = threadIdx.x & 31;
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t r0 = warp * RW; r0 < R; r0 += nwarps * RW) {
    uint4 r_x[RW][NS];  // packed as in memory, unpacked per pass (registers for more rows)
#pragma unroll
    for (int i = 0; i < RW; ++i)
#pragma unroll
      for (int k = 0; k < NS; ++k)
        r_x[i][k] = r0 + i < R ? ew::load_slot_raw<T>(g_x + (r0 + i) * ldx, int64_t(k * 32 + lane) * V, D, vx)
                               : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < RW; ++i) {
      float ss = 0.f;
#pragma unroll
      for (int k = 0; k < NS; ++k) {
        float xs[V];
        ew::unpack16<T>(r_x[i][k], xs);
#pragma unroll
        for (int e = 0; e < V; ++e) ss = fmaf(xs[e], xs[e], ss);
      }
      ss = ew::group_sum(ss, 32);
      const float rs = 1.f / sqrtf(ss / float(D) + eps);
      if (r0 + i < R) {
        if (lane == 0) g_rstd[r0 + i] = rs;
#pragma unroll
        for (int k = 0; k < NS; ++k) {
          float r_w[V], xs[V], r_y[V];
          ew::load_param<V>(g_w, int64_t(k * 32 + lane) * V, D, vw, r_w);  // L1 hits after the first row
          ew::unpack16<T>(r_x[i][k], xs);
#pragma unroll
          for (int e = 0; e < V; ++e) r_y[e] = xs[e] * rs * (1.f + r_w[e]);
          ew::store_span<T, V>(g_y + (r0 + i) * ldy, int64_t(k * 32 + lane) * V, D, vy, r_y);
        }
      }
    }
  }
}

// Blocks per SM asked of the register allocator: 4 at one slot, 2 up to four slots (128
// registers, no spills), else as many as fit.
template <int NS>
inline constexpr int kBwdMinBlocks = NS == 1 ? 4 : (NS <= 4 ? 2 : 1);

// g_part: [gridDim.x, D] scratch, every element written (no memset needed).
template <typename T, int NS, int RW>
__global__ __launch_bounds__(lc::kThreads, kBwdMinBlocks<NS>) void rmsnorm1p_bwd_kernel(
    T* g_dx, int64_t lddx, float* g_part, const T* g_dy, int64_t lddy, const T* g_x, int64_t ldx, const float* g_w,
    const float* g_rstd, int64_t R, int64_t D, bool vx, bool vdy, bool vdx, bool vw) {
  constexpr int V = ew::kVec<T>;
  __shared__ float s_part[kWarps][32 * V];
  const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5;
  const int64_t warp = int64_t(blockIdx.x) * kWarps + wib;
  const int64_t nwarps = int64_t(gridDim.x) * kWarps;
  float r_acc[NS][V];  // this warp's dw partials of the lane's columns
#pragma unroll
  for (int k = 0; k < NS; ++k)
#pragma unroll
    for (int e = 0; e < V; ++e) r_acc[k][e] = 0.f;
  for (int64_t r0 = warp * RW; r0 < R; r0 += nwarps * RW) {
    // The rows stay packed (16 bytes per slot: half the registers for bf16) and are unpacked
    // in each of the two passes below.
    uint4 r_x[RW][NS], r_d[RW][NS];
    float r_rs[RW];
#pragma unroll
    for (int i = 0; i < RW; ++i) {
      const bool ok = r0 + i < R;
      r_rs[i] = ok ? __ldg(g_rstd + r0 + i) : 0.f;
#pragma unroll
      for (int k = 0; k < NS; ++k) {
        const int64_t e0 = int64_t(k * 32 + lane) * V;
        r_x[i][k] = ok ? ew::load_slot_raw<T>(g_x + (r0 + i) * ldx, e0, D, vx) : make_uint4(0, 0, 0, 0);
        r_d[i][k] = ok ? ew::load_slot_raw<T>(g_dy + (r0 + i) * lddy, e0, D, vdy) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int i = 0; i < RW; ++i) {
      const float rs = r_rs[i];
      float dot = 0.f;
#pragma unroll
      for (int k = 0; k < NS; ++k) {
        // w is re-read per row (L1 hits) rather than held: registers go to the rows in flight.
        float r_w[V], xs[V], ds[V];
        ew::load_param<V>(g_w, int64_t(k * 32 + lane) * V, D, vw, r_w);
        ew::unpack16<T>(r_x[i][k], xs);
        ew::unpack16<T>(r_d[i][k], ds);
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const float xh = xs[e] * rs;
          r_acc[k][e] = fmaf(ds[e], xh, r_acc[k][e]);  // rows past R add 0
          dot = fmaf(ds[e] * (1.f + r_w[e]), xh, dot);
        }
      }
      const float mean = ew::group_sum(dot, 32) / float(D);
      if (r0 + i < R) {
#pragma unroll
        for (int k = 0; k < NS; ++k) {
          float r_w[V], xs[V], ds[V], r_dx[V];
          ew::load_param<V>(g_w, int64_t(k * 32 + lane) * V, D, vw, r_w);
          ew::unpack16<T>(r_x[i][k], xs);
          ew::unpack16<T>(r_d[i][k], ds);
#pragma unroll
          for (int e = 0; e < V; ++e) r_dx[e] = rs * (ds[e] * (1.f + r_w[e]) - xs[e] * rs * mean);
          ew::store_span<T, V>(g_dx + (r0 + i) * lddx, int64_t(k * 32 + lane) * V, D, vdx, r_dx);
        }
      }
    }
  }
  // Block partial of dw: the 8 warps' register partials added in warp order, one slot at a time.
  float* part = g_part + int64_t(blockIdx.x) * D;
#pragma unroll
  for (int k = 0; k < NS; ++k) {
#pragma unroll
    for (int e = 0; e < V; ++e) s_part[wib][lane * V + e] = r_acc[k][e];
    __syncthreads();
    for (int c = threadIdx.x; c < 32 * V; c += blockDim.x) {
      const int64_t col = int64_t(k) * 32 * V + c;
      if (col < D) {
        float v = s_part[0][c];
#pragma unroll
        for (int w = 1; w < kWarps; ++w) v += s_part[w][c];
        part[col] = v;
      }
    }
    __syncthreads();
  }
}

// ---- generic kernels (one block per row, any D) ------------------------------------------------
template <typename T>
__global__ __launch_bounds__(lc::kThreads) void rmsnorm1p_fwd_block_kernel(T* g_y, int64_t ldy, float* g_rstd,
                                                                            const T* g_x, int64_t ldx,
                                                                            const float* g_w, int64_t R, int64_t D,
                                                                            float eps) {
  __shared__ float s_buf[32];
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const T* x = g_x + r * ldx;
    float ss = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float v = lc::ld(x, j);
      ss = fmaf(v, v, ss);
    }
    ss = lc::block_reduce<lc::Red::sum>(ss, s_buf);
    const float rs = 1.f / sqrtf(ss / float(D) + eps);
    if (threadIdx.x == 0) g_rstd[r] = rs;
    T* y = g_y + r * ldy;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) lc::st(y, j, lc::ld(x, j) * rs * (1.f + g_w[j]));
  }
}

// g_part: [gridDim.x, D], zeroed by the launcher.
template <typename T>
__global__ __launch_bounds__(lc::kThreads) void rmsnorm1p_bwd_block_kernel(T* g_dx, int64_t lddx, float* g_part,
                                                                            const T* g_dy, int64_t lddy,
                                                                            const T* g_x, int64_t ldx,
                                                                            const float* g_w, const float* g_rstd,
                                                                            int64_t R, int64_t D) {
  __shared__ float s_buf[32];
  float* part = g_part + int64_t(blockIdx.x) * D;
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const T *x = g_x + r * ldx, *dy = g_dy + r * lddy;
    const float rs = g_rstd[r];
    float dot = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float xh = lc::ld(x, j) * rs, d = lc::ld(dy, j);
      dot = fmaf(d * (1.f + g_w[j]), xh, dot);
      part[j] = fmaf(d, xh, part[j]);
    }
    const float mean = lc::block_reduce<lc::Red::sum>(dot, s_buf) / float(D);
    T* dx = g_dx + r * lddx;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float xh = lc::ld(x, j) * rs, g = lc::ld(dy, j) * (1.f + g_w[j]);
      lc::st(dx, j, rs * (g - xh * mean));
    }
  }
}

// 16-byte slots per lane for a row of D elements of `t` (a power of two), 0 when D is too wide.
int row_slots(int64_t D, DType t) {
  const int64_t V = 16 / int64_t(dtype_size(t));
  const int64_t need = (D + 32 * V - 1) / (32 * V);
  const int ns = ew::pow2_ceil(need < 1 ? 1 : need);
  return ns <= kMaxSlots ? ns : 0;
}

bool rows16(const TensorView& v) {
  return ew::aligned16(v.data) && (v.stride[0] * int64_t(dtype_size(v.dtype))) % 16 == 0;
}

// Calls body with compile-time NS in {1, 2, 4, 8} (= ns) and RW = max(1, RWX / NS).
#define DT_RMS_SLOTS(ns, RWX, ...)                       \
  do {                                                   \
    switch (ns) {                                        \
      case 1: { constexpr int NS = 1, RW = RWX; __VA_ARGS__; } break; \
      case 2: { constexpr int NS = 2, RW = RWX / 2 > 0 ? RWX / 2 : 1; __VA_ARGS__; } break; \
      case 4: { constexpr int NS = 4, RW = RWX / 4 > 0 ? RWX / 4 : 1; __VA_ARGS__; } break; \
      default: { constexpr int NS = 8, RW = 1; __VA_ARGS__; } break; \
    }                                                    \
  } while (0)

}  // namespace

void rmsnorm1p_fwd(const TensorView& y, const TensorView& rstd, const TensorView& x, const TensorView& w, float eps,
                   Stream s) {
  lc::Nvtx nv("rmsnorm1p_fwd");
  DT_CHECK(x.dtype == y.dtype, "cuda::rmsnorm1p_fwd: x {} and y {} must share a dtype", x.str(), y.str());
  const int64_t R = x.shape[0], D = x.shape[1];
  if (R == 0) return;
  auto st = static_cast<cudaStream_t>(s.handle);
  if (const int ns = row_slots(D, x.dtype); ns > 0) {
    const bool vx = rows16(x), vy = rows16(y), vw = ew::aligned16(w.data);
    DT_RMS_SLOTS(ns, 4, {
      const int64_t rows_per_block = int64_t(kWarps) * RW;
      const unsigned grid = lc::grid_for((R + rows_per_block - 1) / rows_per_block, 65535 * 16);
      DT_LC_DISPATCH(x.dtype, rmsnorm1p_fwd_kernel<E, NS, RW><<<grid, lc::kThreads, 0, st>>>(
                                  y.ptr<E>(), y.stride[0], rstd.ptr<float>(), x.ptr<E>(), x.stride[0],
                                  w.ptr<float>(), R, D, eps, vx, vy, vw));
    });
  } else {
    DT_LC_DISPATCH(x.dtype, rmsnorm1p_fwd_block_kernel<E><<<lc::grid_for(R), lc::kThreads, 0, st>>>(
                                y.ptr<E>(), y.stride[0], rstd.ptr<float>(), x.ptr<E>(), x.stride[0], w.ptr<float>(),
                                R, D, eps));
  }
  DT_CUDA_LAUNCH_CHECK();
}

void rmsnorm1p_bwd(const TensorView& dx, const TensorView& dw, const TensorView& dy, const TensorView& x,
                   const TensorView& w, const TensorView& rstd, Stream s) {
  lc::Nvtx nv("rmsnorm1p_bwd");
  DT_CHECK(x.dtype == dy.dtype && x.dtype == dx.dtype, "cuda::rmsnorm1p_bwd: x {}, dy {}, dx {} must share a dtype",
           x.str(), dy.str(), dx.str());
  const int64_t R = x.shape[0], D = x.shape[1];
  if (R == 0) return;
  auto st = static_cast<cudaStream_t>(s.handle);
  if (const int ns = row_slots(D, x.dtype); ns > 0) {
    const bool vx = rows16(x), vdy = rows16(dy), vdx = rows16(dx), vw = ew::aligned16(w.data);
    DT_RMS_SLOTS(ns, 2, {
      const int64_t rows_per_block = int64_t(kWarps) * RW;
      const int64_t need = (R + rows_per_block - 1) / rows_per_block;
      const int G = int(std::min<int64_t>(need, kMaxBwdBlocks));  // fixed by the shape
      Tensor part = Tensor::empty(Shape{int64_t(G), D}, DType::f32, x.device);  // [G, D] dw partials
      DT_LC_DISPATCH(x.dtype, rmsnorm1p_bwd_kernel<E, NS, RW><<<G, lc::kThreads, 0, st>>>(
                                  dx.ptr<E>(), dx.stride[0], part.ptr<float>(), dy.ptr<E>(), dy.stride[0],
                                  x.ptr<E>(), x.stride[0], w.ptr<float>(), rstd.ptr<float>(), R, D, vx, vdy, vdx,
                                  vw));
      DT_CUDA_LAUNCH_CHECK();
      ew::colsum_add(dw.ptr<float>(), dw.ptr<float>(), part.ptr<float>(), G, D, D, st);
    });
    return;
  }
  const int G = int(R < kMaxBwdBlocks ? R : kMaxBwdBlocks);
  Tensor part = Tensor::empty(Shape{int64_t(G), D}, DType::f32, x.device);  // [G, D] dw partials
  DT_CUDA_CHECK(cudaMemsetAsync(part.data(), 0, part.nbytes(), st));
  DT_LC_DISPATCH(x.dtype, rmsnorm1p_bwd_block_kernel<E><<<G, lc::kThreads, 0, st>>>(
                              dx.ptr<E>(), dx.stride[0], part.ptr<float>(), dy.ptr<E>(), dy.stride[0], x.ptr<E>(),
                              x.stride[0], w.ptr<float>(), rstd.ptr<float>(), R, D));
  DT_CUDA_LAUNCH_CHECK();
  ew::colsum_add(dw.ptr<float>(), dw.ptr<float>(), part.ptr<float>(), G, D, D, st);
}

}  // namespace dt::ops::cuda
