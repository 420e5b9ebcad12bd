// CUDA SwiGLU, elementwise over [T, F] views (any row stride, unit inner stride; g and u may be
// the two halves of one [T, 2F] buffer), f32 | bf16 with fp32 math:
//   y = silu(g) * u                                                                  y (=)
//   sg = sigmoid(g);  du = dy * g * sg;  dg = dy * u * sg * (1 + g (1 - sg))         dg, du (=)
// sigmoid = rcp.approx(1 + ex2.approx(-g log2 e)) (ew::sigmoid_f, flush-to-zero forms) instead of
// 1 / (1 + expf(-g)): ex2.approx ~2 ulp and rcp.approx ~1 ulp, plus the rounding of -g log2 e,
// which perturbs exp(-g) by up to |g| * 9e-8 relative; sg differs from the IEEE form by at most
// ~(3 + |g|) * 1e-7 relative (< 2e-6 for |g| <= 16; saturates to exactly 0 / 1 beyond). Far below
// bf16 storage (2^-9 = 2e-3) and the f32 tests' 1e-4. The vector and scalar paths use the same
// function and expressions. Deterministic (no reductions).
// Shapes, dtypes and unit inner strides are checked by ops/layers_ops.cpp. Fast path: every
// view's base and row stride 16-byte aligned and F a multiple of 8 (bf16) or 4 (f32): one
// 16-byte load/store per 8 | 4 elements, U vectors per thread with every load issued before the
// math (bytes in flight for HBM). Otherwise one element per thread (misaligned or ragged views).
#include "ops/cuda/gdn_elementwise_common.cuh"
#include "ops/cuda/layers_common.cuh"
#include "ops/layers_ops_backends.h"

namespace dt::ops::cuda {
namespace {

using ew::sigmoid_f;

template <typename T>
__global__ void swiglu_fwd_kernel(T* g_y, int64_t ldy, const T* g_g, int64_t ldg, const T* g_u, int64_t ldu,
                                  int64_t T_, int64_t F) {
  const int64_t n = T_ * F;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / F, j = i - t * F;
    const float g = lc::ld(g_g, t * ldg + j), u = lc::ld(g_u, t * ldu + j);
    lc::st(g_y, t * ldy + j, g * sigmoid_f(g) * u);
  }
}

template <typename T>
__global__ void swiglu_bwd_kernel(T* g_dg, int64_t lddg, T* g_du, int64_t lddu, const T* g_dy, int64_t lddy,
                                  const T* g_g, int64_t ldg, const T* g_u, int64_t ldu, int64_t T_, int64_t F) {
  const int64_t n = T_ * F;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / F, j = i - t * F;
    const float g = lc::ld(g_g, t * ldg + j), u = lc::ld(g_u, t * ldu + j), d = lc::ld(g_dy, t * lddy + j);
    const float sg = sigmoid_f(g);
    lc::st(g_du, t * lddu + j, d * g * sg);
    lc::st(g_dg, t * lddg + j, d * u * sg * (1.f + g * (1.f - sg)));
  }
}

// Vector k of the flat [T, F / V] index space -> (row, first column). 32-bit division when the
// vector count fits (the bench shapes: 3.7 M vectors), else 64-bit.
template <typename T>
__device__ __forceinline__ void vec_pos(int64_t k, int64_t fv, bool narrow, int64_t* t, int64_t* j) {
  const int64_t q = narrow ? int64_t(uint32_t(k) / uint32_t(fv)) : k / fv;
  *t = q;
  *j = (k - q * fv) * ew::kVec<T>;
}

template <typename T>
__device__ __forceinline__ uint4 ld16(const T* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

// Fast path. nv = T * F / V vectors; thread handles vectors base + u * blockDim + tid, u < U.
constexpr int kFwdU = 4, kBwdU = 2;  // 128 and 96 bytes of loads in flight per thread

template <typename T>
__global__ __launch_bounds__(lc::kThreads) void swiglu_fwd_vec_kernel(T* g_y, int64_t ldy, const T* g_g, int64_t ldg,
                                                                       const T* g_u, int64_t ldu, int64_t fv,
                                                                       int64_t nv, bool narrow) {
  constexpr int V = ew::kVec<T>, U = kFwdU;
  const int64_t step = int64_t(gridDim.x) * U * blockDim.x;
  for (int64_t base = int64_t(blockIdx.x) * U * blockDim.x + threadIdx.x; base < nv; base += step) {
    uint4 r_g[U], r_u[U];  // packed as in memory: half the registers for bf16
    int64_t t[U], j[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = base + int64_t(u) * blockDim.x;
      if (k < nv) {
        vec_pos<T>(k, fv, narrow, &t[u], &j[u]);
        r_g[u] = ld16(g_g + t[u] * ldg + j[u]);
        r_u[u] = ld16(g_u + t[u] * ldu + j[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (base + int64_t(u) * blockDim.x < nv) {
        float fg[V], fu[V], r_y[V];
        ew::unpack16<T>(r_g[u], fg);
        ew::unpack16<T>(r_u[u], fu);
#pragma unroll
        for (int e = 0; e < V; ++e) r_y[e] = fg[e] * sigmoid_f(fg[e]) * fu[e];
        ew::store16<T>(g_y + t[u] * ldy + j[u], r_y);
      }
    }
  }
}

template <typename T>
__global__ __launch_bounds__(lc::kThreads) void swiglu_bwd_vec_kernel(T* g_dg, int64_t lddg, T* g_du, int64_t lddu,
                                                                       const T* g_dy, int64_t lddy, const T* g_g,
                                                                       int64_t ldg, const T* g_u, int64_t ldu,
                                                                       int64_t fv, int64_t nv, bool narrow) {
  constexpr int V = ew::kVec<T>, U = kBwdU;
  const int64_t step = int64_t(gridDim.x) * U * blockDim.x;
  for (int64_t base = int64_t(blockIdx.x) * U * blockDim.x + threadIdx.x; base < nv; base += step) {
    uint4 r_g[U], r_u[U], r_d[U];
    int64_t t[U], j[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = base + int64_t(u) * blockDim.x;
      if (k < nv) {
        vec_pos<T>(k, fv, narrow, &t[u], &j[u]);
        r_g[u] = ld16(g_g + t[u] * ldg + j[u]);
        r_u[u] = ld16(g_u + t[u] * ldu + j[u]);
        r_d[u] = ld16(g_dy + t[u] * lddy + j[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (base + int64_t(u) * blockDim.x < nv) {
        float fg[V], fu[V], fd[V], r_dg[V], r_du[V];
        ew::unpack16<T>(r_g[u], fg);
        ew::unpack16<T>(r_u[u], fu);
        ew::unpack16<T>(r_d[u], fd);
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const float g = fg[e], uu = fu[e], d = fd[e], sg = sigmoid_f(g);
          r_du[e] = d * g * sg;
          r_dg[e] = d * uu * sg * (1.f + g * (1.f - sg));
        }
        ew::store16<T>(g_du + t[u] * lddu + j[u], r_du);
        ew::store16<T>(g_dg + t[u] * lddg + j[u], r_dg);
      }
    }
  }
}

unsigned blocks(int64_t n) { return lc::grid_for((n + lc::kThreads - 1) / lc::kThreads, 65535 * 16); }

// The fast path's precondition: F a whole number of 16-byte vectors, every base and row stride
// 16-byte aligned.
bool vec_ok(int64_t F, std::initializer_list<const TensorView*> vs) {
  const int64_t sz = int64_t(dtype_size(vs.begin()[0]->dtype));
  if ((F * sz) % 16 != 0) return false;
  for (const TensorView* v : vs)
    if (!ew::aligned16(v->data) || (v->stride[0] * sz) % 16 != 0) return false;
  return true;
}

}  // namespace

void swiglu_fwd(const TensorView& y, const TensorView& g, const TensorView& u, Stream s) {
  lc::Nvtx nv("swiglu_fwd");
  DT_CHECK(g.dtype == u.dtype && g.dtype == y.dtype, "cuda::swiglu_fwd: y {}, g {}, u {} must share a dtype", y.str(),
           g.str(), u.str());
  const int64_t T = g.shape[0], F = g.shape[1];
  if (T * F == 0) return;
  auto st = static_cast<cudaStream_t>(s.handle);
  if (vec_ok(F, {&y, &g, &u})) {
    const int64_t fv = F * int64_t(dtype_size(g.dtype)) / 16, n = T * fv;
    const bool narrow = n < (int64_t(1) << 32);
    const unsigned grid = lc::grid_for((n + kFwdU * lc::kThreads - 1) / (kFwdU * lc::kThreads), 65535 * 16);
    DT_LC_DISPATCH(g.dtype, swiglu_fwd_vec_kernel<E><<<grid, lc::kThreads, 0, st>>>(
                                y.ptr<E>(), y.stride[0], g.ptr<E>(), g.stride[0], u.ptr<E>(), u.stride[0], fv, n,
                                narrow));
  } else {
    DT_LC_DISPATCH(g.dtype, swiglu_fwd_kernel<E><<<blocks(T * F), lc::kThreads, 0, st>>>(
                                y.ptr<E>(), y.stride[0], g.ptr<E>(), g.stride[0], u.ptr<E>(), u.stride[0], T, F));
  }
  DT_CUDA_LAUNCH_CHECK();
}

void swiglu_bwd(const TensorView& dg, const TensorView& du, const TensorView& dy, const TensorView& g,
                const TensorView& u, Stream s) {
  lc::Nvtx nv("swiglu_bwd");
  for (const TensorView* v : {&dg, &du, &dy, &u})
    DT_CHECK(v->dtype == g.dtype, "cuda::swiglu_bwd: {} must have the dtype of g {}", v->str(), g.str());
  const int64_t T = g.shape[0], F = g.shape[1];
  if (T * F == 0) return;
  auto st = static_cast<cudaStream_t>(s.handle);
  if (vec_ok(F, {&dg, &du, &dy, &g, &u})) {
    const int64_t fv = F * int64_t(dtype_size(g.dtype)) / 16, n = T * fv;
    const bool narrow = n < (int64_t(1) << 32);
    const unsigned grid = lc::grid_for((n + kBwdU * lc::kThreads - 1) / (kBwdU * lc::kThreads), 65535 * 16);
    DT_LC_DISPATCH(g.dtype, swiglu_bwd_vec_kernel<E><<<grid, lc::kThreads, 0, st>>>(
                                dg.ptr<E>(), dg.stride[0], du.ptr<E>(), du.stride[0], dy.ptr<E>(), dy.stride[0],
                                g.ptr<E>(), g.stride[0], u.ptr<E>(), u.stride[0], fv, n, narrow));
  } else {
    DT_LC_DISPATCH(g.dtype, swiglu_bwd_kernel<E><<<blocks(T * F), lc::kThreads, 0, st>>>(
                                dg.ptr<E>(), dg.stride[0], du.ptr<E>(), du.stride[0], dy.ptr<E>(), dy.stride[0],
                                g.ptr<E>(), g.stride[0], u.ptr<E>(), u.stride[0], T, F));
  }
  DT_CUDA_LAUNCH_CHECK();
}

}  // namespace dt::ops::cuda
