// CUDA vocab-parallel cross-entropy pieces (include/deltatron/ops/layers_ops.h has the protocol).
// Per row t of logits [T, V_l] f32 | bf16 (any row stride), this rank's vocab columns
// [vocab_begin, vocab_begin + V_l); targets [T] i32 (< 0: predicts nothing); vectors [T] f32:
//   ce_stats:    m = max_j l_j;  se = sum_j exp(l_j - m);  tl = l[target - vocab_begin] if owned
//                else 0, in ONE read of the row (online softmax: each thread keeps (m, s) and
//                rescales s by expf(m_old - m_new) when its max grows; the block merges the
//                pairs the same way)                                                      (=)
//   ce_rescale:  se *= expf(m - M), M the max over tp (factor exactly 1 where m == M)      (=)
//   ce_loss:     loss = logf(se) + m - tl, or 0 when target < 0                           (=)
//   ce_bwd:      dl_j = scale * (exp(l_j - m) / se - [j is the target]), or 0            (=)
//                (f32 logits may give bf16 dlogits: the GEMMs after it run in the activation dtype)
// One block of 256 threads per row (grid-stride over rows). Rows are read 16 bytes per load (8
// bf16 or 4 f32 elements) from the first 16-byte-aligned element on; the few before it and the
// tail go one by one. Each thread visits its elements in a fixed order and the reductions run in a
// fixed order, so the results are deterministic. The per-element exponentials of ce_stats and
// ce_bwd are one FFMA and one MUFU ex2 (exp(x - m) = 2^(x log2e - m log2e), relative error ~1e-6:
// far below bf16 logits' rounding), which keeps both passes at their byte time (accurate expf
// made ce_stats instruction-bound at half of it, docs/perf.md v0.9.0); the rare rescales of the
// online softmax and logf stay accurate. -inf logits add exactly 0 to se (a row of them: m = -inf,
// se = 0); a NaN logit makes se NaN.
#include <cmath>

#include "ops/cuda/layers_common.cuh"
#include "ops/layers_ops_backends.h"

namespace dt::ops::cuda {
namespace {

// One 16-byte vector as N = 16 / sizeof(T) fp32 values (bf16: 8, f32: 4); store_vec<TD, N> writes
// N values (N * sizeof(TD) bytes: f32 logits may give bf16 dlogits).
template <typename T>
constexpr int kVecN = int(16 / sizeof(T));
template <typename T>
__device__ __forceinline__ void load_vec(const T* p, float (&x)[kVecN<T>]) {
  const uint4 r = *reinterpret_cast<const uint4*>(p);
  if constexpr (sizeof(T) == 4) {
    x[0] = __uint_as_float(r.x), x[1] = __uint_as_float(r.y), x[2] = __uint_as_float(r.z), x[3] = __uint_as_float(r.w);
  } else {
    const unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) x[2 * i] = __uint_as_float(w[i] << 16), x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
template <typename TD, int N>
__device__ __forceinline__ void store_vec(TD* p, const float (&x)[N]) {
  if constexpr (sizeof(TD) == 4) {
#pragma unroll
    for (int i = 0; i < N; i += 4) *reinterpret_cast<float4*>(p + i) = make_float4(x[i], x[i + 1], x[i + 2], x[i + 3]);
  } else {
    unsigned w[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const __nv_bfloat162 b = __floats2bfloat162_rn(x[2 * i], x[2 * i + 1]);
      w[i] = *reinterpret_cast<const unsigned*>(&b);
    }
    if constexpr (N == 8) *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
    else *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
  }
}
// Elements before the first 16-byte-aligned one (0 .. kVecN - 1); p is element-aligned.
template <typename T>
__device__ __forceinline__ int64_t head_of(const T* p) {
  return int64_t(((0 - reinterpret_cast<uintptr_t>(p)) & 15) / sizeof(T));
}

constexpr float kLog2e = 1.4426950408889634f;
// 2^x, MUFU (approximate, ~2 ulp; results below 2^-126 flush to 0; 2^-inf = 0).
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Online softmax state of a set of values: m their max, s = sum exp(x - m), ml = m log2e;
// (-inf, 0, -inf) if empty.
struct MaxSum {
  float m, s, ml;
};
// -inf values add exactly 0 (and never compute -inf - -inf); a NaN value makes s NaN.
__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float M = fmaxf(a.m, b.m);
  if (M == -INFINITY) return {M, a.s + b.s, M};  // 0, or NaN
  return {M, a.s * expf(a.m - M) + b.s * expf(b.m - M), M * kLog2e};
}
// Adds N values: one rescale per group (when the group raises the max), one FFMA + ex2 per value.
template <int N>
__device__ __forceinline__ void absorb(MaxSum& st, const float (&x)[N]) {
  float mv = x[0];
#pragma unroll
  for (int i = 1; i < N; ++i) mv = fmaxf(mv, x[i]);  // fmaxf skips NaN
  if (mv > st.m) {
    st.s *= expf(st.m - mv);  // from st.m = -inf: factor 0
    st.m = mv;
    st.ml = mv * kLog2e;
  }
  if (st.m == -INFINITY) {  // every value so far -inf or NaN: they add 0, or make s NaN
#pragma unroll
    for (int i = 0; i < N; ++i)
      if (x[i] != x[i]) st.s = x[i];
    return;
  }
#pragma unroll
  for (int i = 0; i < N; ++i) st.s += ex2(fmaf(x[i], kLog2e, -st.ml));  // x = -inf: 2^-inf = 0
}
__device__ __forceinline__ void absorb1(MaxSum& st, float x) {
  const float v[1] = {x};
  absorb(st, v);
}

// Block-wide merge of one pair per thread (blockDim.x == kThreads); thread 0 gets the result.
// A butterfly within each warp, then the warps in index order: fixed order.
__device__ __forceinline__ MaxSum block_merge(MaxSum v, float* s_m, float* s_s) {
  for (int o = 16; o > 0; o >>= 1)
    v = merge(v, {__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o), 0.f});
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();  // the buffers may still be read for the previous row
  if (lane == 0) s_m[warp] = v.m, s_s[warp] = v.s;
  __syncthreads();
  MaxSum r{s_m[0], s_s[0], 0.f};
  for (int w = 1; w < nw; ++w) r = merge(r, {s_m[w], s_s[w], 0.f});
  return r;
}

template <typename T>
__global__ __launch_bounds__(lc::kThreads) void ce_stats_kernel(float* g_m, float* g_se, float* g_tl, const T* g_l,
                                                                 int64_t ldl, const int32_t* g_tg, int64_t T_,
                                                                 int64_t V, int64_t vb) {
  constexpr int N = kVecN<T>;
  __shared__ float s_m[32], s_s[32];
  const int64_t tid = threadIdx.x, nt = blockDim.x;
  for (int64_t t = blockIdx.x; t < T_; t += gridDim.x) {
    const T* l = g_l + t * ldl;
    // [0, h) one by one, [h, b) as nv vectors of N, [b, V) one by one.
    const int64_t h0 = head_of(l), h = h0 < V ? h0 : V, nv = (V - h) / N, b = h + N * nv;
    MaxSum st{-INFINITY, 0.f, -INFINITY};
    if (tid < h) absorb1(st, lc::ld(l, tid));
    // Two loads in flight per thread; vectors tid, tid + nt, tid + 2 nt, ... in that order.
    for (int64_t v = tid; v < nv; v += 2 * nt) {
      float x0[N], x1[N];
      const bool two = v + nt < nv;
      load_vec(l + h + N * v, x0);
      if (two) load_vec(l + h + N * (v + nt), x1);
      absorb(st, x0);
      if (two) absorb(st, x1);
    }
    for (int64_t j = b + tid; j < V; j += nt) absorb1(st, lc::ld(l, j));
    st = block_merge(st, s_m, s_s);
    if (tid == 0) {
      g_m[t] = st.m;
      g_se[t] = st.s;
      const int32_t tg = g_tg[t];
      const int64_t c = int64_t(tg) - vb;
      g_tl[t] = (tg >= 0 && c >= 0 && c < V) ? lc::ld(l, c) : 0.f;
    }
  }
}

__global__ void ce_rescale_kernel(float* g_se, const float* g_m, const float* g_M, int64_t T_) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < T_; t += int64_t(gridDim.x) * blockDim.x)
    if (g_m[t] != g_M[t]) g_se[t] *= expf(g_m[t] - g_M[t]);
}

__global__ void ce_loss_kernel(float* g_loss, const float* g_m, const float* g_se, const float* g_tl,
                               const int32_t* g_tg, int64_t T_) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < T_; t += int64_t(gridDim.x) * blockDim.x)
    g_loss[t] = g_tg[t] >= 0 ? logf(g_se[t]) + g_m[t] - g_tl[t] : 0.f;
}

template <typename T, typename TD>
__global__ __launch_bounds__(lc::kThreads) void ce_bwd_kernel(TD* g_d, int64_t ldd, const T* g_l, int64_t ldl,
                                                               const float* g_m, const float* g_se,
                                                               const int32_t* g_tg, int64_t T_, int64_t V, int64_t vb,
                                                               float scale) {
  constexpr int N = kVecN<T>;
  const int64_t tid = threadIdx.x, nt = blockDim.x;
  for (int64_t t = blockIdx.x; t < T_; t += gridDim.x) {
    const T* l = g_l + t * ldl;
    TD* d = g_d + t * ldd;
    const int32_t tg = g_tg[t];
    if (tg < 0) {
      for (int64_t j = tid; j < V; j += nt) lc::st(d, j, 0.f);
      continue;
    }
    // dl_j = exp(x_j - m) * (scale / se) - (j == c ? scale : 0)
    const float ml = g_m[t] * kLog2e, a = scale / g_se[t];
    const int64_t c = int64_t(tg) - vb;
    auto prob = [&](float x) { return ex2(fmaf(x, kLog2e, -ml)) * a; };  // scale * softmax
    auto grad = [&](int64_t j, float x) { return prob(x) - (j == c ? scale : 0.f); };
    // Vectors where logits and dlogits are aligned at the same element (16 B for the logits, N
    // elements for the dlogits); else one by one.
    const int64_t hl = head_of(l);
    const bool same = (reinterpret_cast<uintptr_t>(d + hl) % (N * sizeof(TD))) == 0;
    const int64_t h = same && hl < V ? hl : V, nv = (V - h) / N, b = h + N * nv;
    for (int64_t j = tid; j < h; j += nt) lc::st(d, j, grad(j, lc::ld(l, j)));
    for (int64_t v = tid; v < nv; v += nt) {
      const int64_t j = h + N * v;
      float x[N];
      load_vec(l + j, x);
#pragma unroll
      for (int i = 0; i < N; ++i) x[i] = prob(x[i]);
      if (c >= j && c < j + N) x[c - j] -= scale;  // the target's column: one vector of the row
      store_vec<TD, N>(d + j, x);
    }
    for (int64_t j = b + tid; j < V; j += nt) lc::st(d, j, grad(j, lc::ld(l, j)));
  }
}

}  // namespace

void ce_stats(const TensorView& m, const TensorView& se, const TensorView& tl, const TensorView& logits,
              const TensorView& targets, int64_t vocab_begin, Stream s) {
  lc::Nvtx nv("ce_stats");
  const int64_t T = logits.shape[0], V = logits.shape[1];
  auto st = static_cast<cudaStream_t>(s.handle);
  DT_LC_DISPATCH(logits.dtype, ce_stats_kernel<E><<<lc::grid_for(T), lc::kThreads, 0, st>>>(
                                   m.ptr<float>(), se.ptr<float>(), tl.ptr<float>(), logits.ptr<E>(),
                                   logits.stride[0], targets.ptr<int32_t>(), T, V, vocab_begin));
  DT_CUDA_LAUNCH_CHECK();
}

void ce_rescale(const TensorView& se, const TensorView& m, const TensorView& m_global, Stream s) {
  lc::Nvtx nv("ce_rescale");
  const int64_t T = se.numel();
  auto st = static_cast<cudaStream_t>(s.handle);
  ce_rescale_kernel<<<lc::grid_for((T + 255) / 256), 256, 0, st>>>(se.ptr<float>(), m.ptr<float>(),
                                                                   m_global.ptr<float>(), T);
  DT_CUDA_LAUNCH_CHECK();
}

void ce_loss(const TensorView& loss, const TensorView& m, const TensorView& se, const TensorView& tl,
             const TensorView& targets, Stream s) {
  lc::Nvtx nv("ce_loss");
  const int64_t T = loss.numel();
  auto st = static_cast<cudaStream_t>(s.handle);
  ce_loss_kernel<<<lc::grid_for((T + 255) / 256), 256, 0, st>>>(loss.ptr<float>(), m.ptr<float>(), se.ptr<float>(),
                                                                tl.ptr<float>(), targets.ptr<int32_t>(), T);
  DT_CUDA_LAUNCH_CHECK();
}

void ce_bwd(const TensorView& dlogits, const TensorView& logits, const TensorView& m, const TensorView& se,
            const TensorView& targets, int64_t vocab_begin, float scale, Stream s) {
  lc::Nvtx nv("ce_bwd");
  DT_CHECK(dlogits.dtype == logits.dtype || logits.dtype == DType::f32,
           "cuda::ce_bwd: dlogits {} from logits {}: f32 -> f32 | bf16 or bf16 -> bf16", dlogits.str(), logits.str());
  const int64_t T = logits.shape[0], V = logits.shape[1];
  auto st = static_cast<cudaStream_t>(s.handle);
  auto launch = [&](auto* lp) {
    using L = std::remove_const_t<std::remove_pointer_t<decltype(lp)>>;
    DT_LC_DISPATCH(dlogits.dtype, ce_bwd_kernel<L, E><<<lc::grid_for(T), lc::kThreads, 0, st>>>(
                                      dlogits.ptr<E>(), dlogits.stride[0], lp, logits.stride[0], m.ptr<float>(),
                                      se.ptr<float>(), targets.ptr<int32_t>(), T, V, vocab_begin, scale));
  };
  if (logits.dtype == DType::bf16) launch(logits.ptr<__nv_bfloat16>());
  else launch(logits.ptr<float>());
  DT_CUDA_LAUNCH_CHECK();
}

}  // namespace dt::ops::cuda
