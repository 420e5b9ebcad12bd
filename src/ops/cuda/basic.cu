// CUDA basic ops: fill, strided copy with casts, elementwise add/mul/scale/axpy, deterministic
// sum / sum of squares, counter-based RNG fill (bit-identical to the CPU for uniform; normal
// within an ulp) (GEMM through cuBLASLt: gemm_lt.cpp). Float element types f32, bf16, f16; fp32 math.
// Reductions: a fixed grid derived from n only (never from the device), one partial per
// block, then one block sums the partials in order: the same bits on every run. The sum of
// squares over a list of views (the grad norm) cuts every view into fixed chunks, one block each.
// add/mul/scale/axpy of same-dtype f32 | bf16 views with 16-byte aligned data take a 16-byte
// vector kernel (the residual adds); it rounds exactly as the generic kernel does (same bits).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/cuda_check.h"
#include "deltatron/core/allocator.h"
#include "deltatron/core/numeric.h"
#include "deltatron/core/rng.h"
#include "ops/basic_backends.h"

namespace dt::ops::cuda {
namespace {

// ---- element access -------------------------------------------------------------------
__device__ __forceinline__ float ld(const void* p, DType t, int64_t i) {
  if (t == DType::f32) return static_cast<const float*>(p)[i];
  if (t == DType::bf16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return __half2float(static_cast<const __half*>(p)[i]);
}
// Stores round to nearest even through the same bit functions as the CPU backend.
__device__ __forceinline__ void st(void* p, DType t, int64_t i, float v) {
  if (t == DType::f32) static_cast<float*>(p)[i] = v;
  else if (t == DType::bf16) static_cast<uint16_t*>(p)[i] = f32_to_bf16_bits(v);
  else static_cast<uint16_t*>(p)[i] = f32_to_f16_bits(v);
}

struct StridedIndex {  // row-major unravel of a linear index over a strided view
  int ndim;
  bool contiguous;  // the identity map: no 64-bit div/mod per element (a uniform branch)
  int64_t shape[kMaxDims];
  int64_t stride[kMaxDims];
  explicit StridedIndex(const TensorView& v) : ndim(v.ndim()), contiguous(v.is_contiguous()) {
    for (int d = 0; d < kMaxDims; ++d) {
      shape[d] = d < ndim ? v.shape[d] : 1;
      stride[d] = d < ndim ? v.stride[d] : 0;
    }
  }
  __device__ __forceinline__ int64_t operator()(int64_t i) const {
    if (contiguous) return i;
    int64_t off = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      off += (i % shape[d]) * stride[d];
      i /= shape[d];
    }
    return off;
  }
};

// Collapses a view to [rows, cols] with unit inner stride and row pitch `pitch` (elements):
// every dim but the first must be contiguous with the next. False otherwise.
bool as_2d(const TensorView& v, int64_t* rows, int64_t* cols, int64_t* pitch) {
  const int nd = v.ndim();
  if (nd == 0) return false;
  int64_t c = 1;  // elements of one row so far, innermost dims first
  for (int d = nd - 1; d >= 1; --d) {
    if (v.shape[d] != 1 && v.stride[d] != c) return false;
    c *= v.shape[d];
  }
  if (nd == 1) {  // one row of shape[0] elements
    if (v.shape[0] != 1 && v.stride[0] != 1) return false;
    *rows = 1;
    *cols = *pitch = v.shape[0];
    return true;
  }
  *rows = v.shape[0];
  *cols = c;
  *pitch = v.shape[0] == 1 ? c : v.stride[0];
  return *pitch >= c;
}

constexpr int kThreads = 256;
inline unsigned blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 65536 * 16 ? (b > 0 ? b : 1) : 65536 * 16);  // grid-stride loops cover the rest
}

// ---- kernels --------------------------------------------------------------------------
template <typename T>
__global__ void fill_kernel(T* x, StridedIndex idx, int64_t n, T v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[idx(i)] = v;
}

__global__ void copy_cast_kernel(void* dst, DType dt, StridedIndex di, const void* src, DType stt, StridedIndex si,
                                 int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    st(dst, dt, di(i), ld(src, stt, si(i)));
}

// Contiguous views: flat indices and no StridedIndex parameter (a dynamically indexed struct
// parameter costs every thread a local-memory copy of it, even when the identity branch is taken).
__global__ void copy_cast_flat_kernel(void* dst, DType dt, const void* src, DType stt, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    st(dst, dt, i, ld(src, stt, i));
}
// f32 -> bf16 of contiguous, aligned views (the bf16 weight refresh after every update): four
// elements per thread through one 16-byte load and one 8-byte store; the n % 4 tail by thread 0..2.
__global__ void cast_f32_bf16_kernel(uint16_t* dst, const float* src, int64_t n) {
  const int64_t n4 = n / 4;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n4; i += int64_t(gridDim.x) * blockDim.x) {
    const float4 v = reinterpret_cast<const float4*>(src)[i];
    reinterpret_cast<ushort4*>(dst)[i] =
        make_ushort4(f32_to_bf16_bits(v.x), f32_to_bf16_bits(v.y), f32_to_bf16_bits(v.z), f32_to_bf16_bits(v.w));
  }
  if (blockIdx.x == 0 && threadIdx.x < n - n4 * 4) dst[n4 * 4 + threadIdx.x] = f32_to_bf16_bits(src[n4 * 4 + threadIdx.x]);
}
template <typename T>
__global__ void fill_flat_kernel(T* x, int64_t n, T v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = v;
}

template <typename T>
__global__ void copy_same_kernel(T* dst, StridedIndex di, const T* src, StridedIndex si, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[di(i)] = src[si(i)];
}

enum class Bin { add, mul, axpy, scale };
// Explicit round-to-nearest intrinsics: no FMA contraction, so results are the CPU's bits.
// o: the current out element (axpy, scale); a, b: the inputs (add, mul; a for axpy).
__device__ __forceinline__ float bin_op(Bin op, float o, float a, float b, float alpha) {
  switch (op) {
    case Bin::add: return __fadd_rn(a, b);
    case Bin::mul: return __fmul_rn(a, b);
    case Bin::axpy: return __fadd_rn(o, __fmul_rn(alpha, a));
    default: return __fmul_rn(o, alpha);
  }
}
__global__ void binary_kernel(Bin op, void* out, DType ot, const void* a, DType at, const void* b, DType bt,
                              float alpha, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const bool uses_out = op == Bin::axpy || op == Bin::scale, uses_ab = op != Bin::scale;
    const float o = uses_out ? ld(out, ot, i) : 0.f;
    const float va = uses_ab ? ld(a, at, i) : 0.f, vb = (op == Bin::add || op == Bin::mul) ? ld(b, bt, i) : 0.f;
    st(out, ot, i, bin_op(op, o, va, vb, alpha));
  }
}

// The same ops on same-dtype f32 | bf16 views whose data are 16-byte aligned (the residual adds,
// gradient accumulation): kBinU 16-byte vectors per thread with every load issued before the
// math, and only the operands the op reads; the n % V tail element by element in block 0. Same
// intrinsics and the same bf16 rounding (f32_to_bf16_bits) as binary_kernel: the same bits.
constexpr int kBinU = 4;
template <typename T>
__device__ __forceinline__ void unpack_v(const uint4& u, float (&r)[16 / sizeof(T)]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int k = 0; k < 4; ++k) r[k] = __uint_as_float(w[k]);
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) r[2 * k] = __uint_as_float(w[k] << 16),
                                r[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
  }
}
template <typename T>
__device__ __forceinline__ uint4 pack_v(const float (&r)[16 / sizeof(T)]) {
  uint32_t w[4];
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = __float_as_uint(r[k]);
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k)
      w[k] = uint32_t(f32_to_bf16_bits(r[2 * k])) | (uint32_t(f32_to_bf16_bits(r[2 * k + 1])) << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}
__device__ __forceinline__ float ld_t(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ld_t(const uint16_t* p, int64_t i) { return bf16_bits_to_f32(p[i]); }
__device__ __forceinline__ void st_t(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st_t(uint16_t* p, int64_t i, float v) { p[i] = f32_to_bf16_bits(v); }

// T: float or uint16_t (bf16 bits).
template <Bin OP, typename T>
__global__ __launch_bounds__(256) void binary_vec_kernel(T* out, const T* a, const T* b, float alpha, int64_t n) {
  constexpr int V = 16 / sizeof(T), U = kBinU;
  constexpr bool kOut = OP == Bin::axpy || OP == Bin::scale;  // the operands each op reads
  constexpr bool kA = OP != Bin::scale, kB = OP == Bin::add || OP == Bin::mul;
  const int64_t nv = n / V, step = int64_t(gridDim.x) * U * blockDim.x;
  auto* o4 = reinterpret_cast<uint4*>(out);
  auto* a4 = reinterpret_cast<const uint4*>(a);
  auto* b4 = reinterpret_cast<const uint4*>(b);
  for (int64_t base = int64_t(blockIdx.x) * U * blockDim.x + threadIdx.x; base < nv; base += step) {
    uint4 r_o[U], r_a[U], r_b[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = base + int64_t(u) * blockDim.x;
      if (k < nv) {
        if constexpr (kOut) r_o[u] = o4[k];
        if constexpr (kA) r_a[u] = a4[k];  // plain loads: out may alias a or b
        if constexpr (kB) r_b[u] = b4[k];
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = base + int64_t(u) * blockDim.x;
      if (k < nv) {
        float fo[V] = {}, fa[V] = {}, fb[V] = {}, r[V];
        if constexpr (kOut) unpack_v<T>(r_o[u], fo);
        if constexpr (kA) unpack_v<T>(r_a[u], fa);
        if constexpr (kB) unpack_v<T>(r_b[u], fb);
#pragma unroll
        for (int e = 0; e < V; ++e) r[e] = bin_op(OP, fo[e], fa[e], fb[e], alpha);
        o4[k] = pack_v<T>(r);
      }
    }
  }
  if (blockIdx.x == 0 && threadIdx.x < n - nv * V) {
    const int64_t i = nv * V + threadIdx.x;
    st_t(out, i, bin_op(OP, kOut ? ld_t(out, i) : 0.f, kA ? ld_t(a, i) : 0.f, kB ? ld_t(b, i) : 0.f, alpha));
  }
}

constexpr int kReduceBlocks = 1024;  // upper bound on partials; the grid size depends on n only
__device__ __forceinline__ float block_sum(float v, float* s_buf) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) s_buf[warp] = v;
  __syncthreads();
  v = threadIdx.x < blockDim.x / 32 ? s_buf[threadIdx.x] : 0.f;
  if (warp == 0)
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}
__global__ void reduce_partial_kernel(float* g_partial, const void* x, DType t, int64_t n, bool squares) {
  __shared__ float s_buf[32];
  float acc = 0.f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float v = ld(x, t, i);
    acc += squares ? v * v : v;
  }
  acc = block_sum(acc, s_buf);
  if (threadIdx.x == 0) g_partial[blockIdx.x] = acc;
}
__global__ void reduce_final_kernel(float* out, const float* g_partial, int nparts) {
  __shared__ float s_buf[32];
  float acc = 0.f;
  for (int i = threadIdx.x; i < nparts; i += blockDim.x) acc += g_partial[i];
  acc = block_sum(acc, s_buf);
  if (threadIdx.x == 0) *out = acc;
}

// sum_squares_list: every non-empty view is cut into kSqChunk-element chunks (its last one may be
// shorter); one block per chunk writes one partial, reduce_final_kernel sums them in order.
constexpr int kSqChunk = 64 * 1024;
struct SqSeg {  // one non-empty view: its chunks are chunk0, chunk0 + 1, ...
  const float* p;
  int64_t n;
  int64_t chunk0;
};
// grid [nchunks], block kThreads; g_seg [nseg] by increasing chunk0; g_partial [nchunks] f32.
// Thread t adds elements 4t..4t+3 of every 4 * kThreads elements of its chunk, in order, one fmaf
// each: float4 loads (a full chunk of a 16-byte aligned view) and scalar loads (anything else)
// add the same values in the same order, so the bits depend on the sizes only, not on alignment.
__global__ __launch_bounds__(kThreads) void sum_squares_list_kernel(float* g_partial, const SqSeg* g_seg, int nseg) {
  __shared__ float s_buf[32];
  __shared__ int s_seg;
  const int64_t c = blockIdx.x;
  for (int i = threadIdx.x; i < nseg; i += blockDim.x)  // the one segment holding chunk c
    if (g_seg[i].chunk0 <= c && (i + 1 == nseg || g_seg[i + 1].chunk0 > c)) s_seg = i;
  __syncthreads();
  const SqSeg sg = g_seg[s_seg];
  const int64_t begin = (c - sg.chunk0) * kSqChunk;
  const float* p = sg.p + begin;
  const int len = int(min(int64_t(kSqChunk), sg.n - begin));
  float acc = 0.f;
  if (len == kSqChunk && reinterpret_cast<uintptr_t>(p) % 16 == 0) {
    const float4* p4 = reinterpret_cast<const float4*>(p);
#pragma unroll 8
    for (int k = threadIdx.x; k < kSqChunk / 4; k += kThreads) {
      const float4 v = __ldg(p4 + k);
      acc = fmaf(v.x, v.x, acc);
      acc = fmaf(v.y, v.y, acc);
      acc = fmaf(v.z, v.z, acc);
      acc = fmaf(v.w, v.w, acc);
    }
  } else {
    for (int j = 4 * threadIdx.x; j < len; j += 4 * kThreads)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float v = j + e < len ? __ldg(p + j + e) : 0.f;  // fmaf(0, 0, acc) == acc
        acc = fmaf(v, v, acc);
      }
  }
  acc = block_sum(acc, s_buf);
  if (threadIdx.x == 0) g_partial[c] = acc;
}

struct RngArgs {
  int ndim;
  int64_t local[kMaxDims], global[kMaxDims], offset[kMaxDims];
};
__global__ void rng_kernel(void* x, DType t, int64_t n, RngArgs r, uint64_t seed, uint64_t stream, bool normal,
                           float p0, float p1) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t rem = i, g = 0, gs = 1;
    for (int d = r.ndim - 1; d >= 0; --d) {
      g += (rem % r.local[d] + r.offset[d]) * gs;
      rem /= r.local[d];
      gs *= r.global[d];
    }
    st(x, t, i, normal ? rng_normal_at(seed, stream, uint64_t(g), p0, p1) : rng_uniform_at(seed, stream, uint64_t(g), p0, p1));
  }
}

struct Range {  // NVTX range for the launcher's lifetime
  explicit Range(const char* name) { nvtxRangePushA(name); }
  ~Range() { nvtxRangePop(); }
};

}  // namespace

// ---- launchers ------------------------------------------------------------------------
void fill(const TensorView& x, double value, Stream s) {
  int64_t n = x.numel();
  if (!n) return;
  Range r("dt::fill");
  if (value == 0.0 && !std::signbit(value) && x.is_contiguous()) {  // +0 is all-zero bits in every dtype
    DT_CUDA_CHECK(cudaMemsetAsync(x.data, 0, x.nbytes(), cuda_stream(s)));
    return;
  }
  StridedIndex idx(x);
  const bool flat = x.is_contiguous();
  auto go = [&](auto v) {
    using T = decltype(v);
    if (flat) fill_flat_kernel<T><<<blocks_for(n), kThreads, 0, cuda_stream(s)>>>(static_cast<T*>(x.data), n, v);
    else fill_kernel<T><<<blocks_for(n), kThreads, 0, cuda_stream(s)>>>(static_cast<T*>(x.data), idx, n, v);
  };
  switch (x.dtype) {
    case DType::f32: case DType::i32: {
      uint32_t bits = x.dtype == DType::f32 ? float_bits(float(value)) : uint32_t(int32_t(value));
      go(bits);
      break;
    }
    case DType::bf16: go(f32_to_bf16_bits(float(value))); break;
    case DType::f16: go(f32_to_f16_bits(float(value))); break;
    case DType::u16: go(uint16_t(value)); break;
    case DType::i64: go(int64_t(value)); break;
    case DType::u8: go(uint8_t(value)); break;
  }
  DT_CUDA_LAUNCH_CHECK();
}

void copy(const TensorView& dst, const TensorView& src, Stream s) {
  int64_t n = dst.numel();
  if (!n) return;
  Range r("dt::copy");
  if (dst.dtype == src.dtype && dst.is_contiguous() && src.is_contiguous()) {
    DT_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, dst.nbytes(), cudaMemcpyDeviceToDevice, cuda_stream(s)));
    return;
  }
  // Row-strided views (column slices of a wider buffer, [T, H, d] head slices) collapse to
  // [rows, cols] with a pitch: one cudaMemcpy2DAsync moves them at copy bandwidth.
  int64_t dr, dc, dp, sr, sc, sp;
  if (dst.dtype == src.dtype && as_2d(dst, &dr, &dc, &dp) && as_2d(src, &sr, &sc, &sp) && dr == sr && dc == sc) {
    const size_t es = dtype_size(dst.dtype);
    DT_CUDA_CHECK(cudaMemcpy2DAsync(dst.data, size_t(dp) * es, src.data, size_t(sp) * es, size_t(dc) * es, size_t(dr),
                                    cudaMemcpyDeviceToDevice, cuda_stream(s)));
    return;
  }
  if (dst.dtype != src.dtype && dst.is_contiguous() && src.is_contiguous()) {  // casts, e.g. the bf16 weight refresh
    if (dst.dtype == DType::bf16 && src.dtype == DType::f32 && reinterpret_cast<uintptr_t>(src.data) % 16 == 0 &&
        reinterpret_cast<uintptr_t>(dst.data) % 8 == 0) {
      cast_f32_bf16_kernel<<<blocks_for((n + 3) / 4), kThreads, 0, cuda_stream(s)>>>(
          static_cast<uint16_t*>(dst.data), static_cast<const float*>(src.data), n);
      DT_CUDA_LAUNCH_CHECK();
      return;
    }
    copy_cast_flat_kernel<<<blocks_for(n), kThreads, 0, cuda_stream(s)>>>(dst.data, dst.dtype, src.data, src.dtype, n);
    DT_CUDA_LAUNCH_CHECK();
    return;
  }
  StridedIndex di(dst), si(src);
  if (dst.dtype == src.dtype) {
    switch (dtype_size(dst.dtype)) {
      case 1: copy_same_kernel<<<blocks_for(n), kThreads, 0, cuda_stream(s)>>>(dst.ptr<uint8_t>(), di, src.ptr<uint8_t>(), si, n); break;
      case 2: copy_same_kernel<<<blocks_for(n), kThreads, 0, cuda_stream(s)>>>(dst.ptr<uint16_t>(), di, src.ptr<uint16_t>(), si, n); break;
      case 4: copy_same_kernel<<<blocks_for(n), kThreads, 0, cuda_stream(s)>>>(dst.ptr<uint32_t>(), di, src.ptr<uint32_t>(), si, n); break;
      default: copy_same_kernel<<<blocks_for(n), kThreads, 0, cuda_stream(s)>>>(dst.ptr<uint64_t>(), di, src.ptr<uint64_t>(), si, n); break;
    }
  } else {
    copy_cast_kernel<<<blocks_for(n), kThreads, 0, cuda_stream(s)>>>(dst.data, dst.dtype, di, src.data, src.dtype, si, n);
  }
  DT_CUDA_LAUNCH_CHECK();
}

static void binary(Bin op, const TensorView& out, const TensorView& a, const TensorView& b, float alpha, Stream s) {
  int64_t n = out.numel();
  if (!n) return;
  Range r("dt::elementwise");
  const DType t = out.dtype;
  const bool same = a.dtype == t && b.dtype == t && (t == DType::f32 || t == DType::bf16);
  auto al16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (same && al16(out.data) && al16(a.data) && al16(b.data)) {
    const int64_t V = t == DType::f32 ? 4 : 8, per_block = int64_t(kBinU) * kThreads * V;
    const unsigned grid = blocks_for((n + per_block - 1) / per_block * kThreads);
    auto launch = [&](auto op_tag, auto* tp) {
      using T = std::remove_pointer_t<decltype(tp)>;
      binary_vec_kernel<decltype(op_tag)::value, T><<<grid, kThreads, 0, cuda_stream(s)>>>(
          static_cast<T*>(out.data), static_cast<const T*>(a.data), static_cast<const T*>(b.data), alpha, n);
    };
    auto by_type = [&](auto op_tag) {
      if (t == DType::f32) launch(op_tag, static_cast<float*>(nullptr));
      else launch(op_tag, static_cast<uint16_t*>(nullptr));
    };
    switch (op) {
      case Bin::add: by_type(std::integral_constant<Bin, Bin::add>{}); break;
      case Bin::mul: by_type(std::integral_constant<Bin, Bin::mul>{}); break;
      case Bin::axpy: by_type(std::integral_constant<Bin, Bin::axpy>{}); break;
      default: by_type(std::integral_constant<Bin, Bin::scale>{}); break;
    }
    DT_CUDA_LAUNCH_CHECK();
    return;
  }
  binary_kernel<<<blocks_for(n), kThreads, 0, cuda_stream(s)>>>(op, out.data, out.dtype, a.data, a.dtype, b.data,
                                                                 b.dtype, alpha, n);
  DT_CUDA_LAUNCH_CHECK();
}
void add(const TensorView& out, const TensorView& a, const TensorView& b, Stream s) { binary(Bin::add, out, a, b, 0.f, s); }
void mul(const TensorView& out, const TensorView& a, const TensorView& b, Stream s) { binary(Bin::mul, out, a, b, 0.f, s); }
void scale(const TensorView& x, float alpha, Stream s) { binary(Bin::scale, x, x, x, alpha, s); }
void axpy(const TensorView& y, float alpha, const TensorView& x, Stream s) { binary(Bin::axpy, y, x, x, alpha, s); }

void sum(const TensorView& out, const TensorView& x, bool squares, Stream s) {
  Range r("dt::sum");
  int64_t n = x.numel();
  int nparts = int(std::min<int64_t>(kReduceBlocks, std::max<int64_t>(1, (n + 4 * kThreads - 1) / (4 * kThreads))));
  Tensor partial = Tensor::empty(Shape{nparts}, DType::f32, out.device);
  reduce_partial_kernel<<<nparts, kThreads, 0, cuda_stream(s)>>>(partial.ptr<float>(), x.data, x.dtype, n, squares);
  DT_CUDA_LAUNCH_CHECK();
  reduce_final_kernel<<<1, 1024, 0, cuda_stream(s)>>>(out.ptr<float>(), partial.ptr<float>(), nparts);
  DT_CUDA_LAUNCH_CHECK();
}

void sum_squares_list(const TensorView& out, std::span<const TensorView> xs, Stream s) {
  Range r("dt::sum_squares_list");
  std::vector<SqSeg> segs;  // [nseg] host table; empty views have no chunk
  segs.reserve(xs.size());
  int64_t nchunks = 0;
  for (const TensorView& x : xs) {
    if (x.empty()) continue;
    segs.push_back({x.ptr<const float>(), x.numel(), nchunks});
    nchunks += (x.numel() + kSqChunk - 1) / kSqChunk;
  }
  if (!nchunks) {
    DT_CUDA_CHECK(cudaMemsetAsync(out.data, 0, sizeof(float), cuda_stream(s)));  // +0.f
    return;
  }
  DT_CHECK(nchunks <= INT32_MAX, "sum_squares_list: {} chunks exceed the grid", nchunks);
  // One small upload (24 B a view), no sync. A pageable source is copied out by the driver before
  // cudaMemcpyAsync returns (CUDA's "API synchronization behavior"), so `segs` may go at the end
  // of this call.
  Tensor d_segs = Tensor::empty(Shape{int64_t(segs.size() * sizeof(SqSeg))}, DType::u8, out.device);
  DT_CUDA_CHECK(cudaMemcpyAsync(d_segs.data(), segs.data(), segs.size() * sizeof(SqSeg), cudaMemcpyHostToDevice,
                                cuda_stream(s)));
  Tensor partial = Tensor::empty(Shape{nchunks}, DType::f32, out.device);  // [nchunks] f32
  sum_squares_list_kernel<<<unsigned(nchunks), kThreads, 0, cuda_stream(s)>>>(
      partial.ptr<float>(), d_segs.ptr<const SqSeg>(), int(segs.size()));
  DT_CUDA_LAUNCH_CHECK();
  reduce_final_kernel<<<1, 1024, 0, cuda_stream(s)>>>(out.ptr<float>(), partial.ptr<float>(), int(nchunks));
  DT_CUDA_LAUNCH_CHECK();
}

void rng_fill(const TensorView& x, uint64_t seed, uint64_t stream, bool normal, float p0, float p1,
              const RngSlice& w, Stream s) {
  int64_t n = x.numel();
  if (!n) return;
  Range r("dt::rng_fill");
  RngArgs a{};
  a.ndim = x.ndim();
  for (int d = 0; d < a.ndim; ++d) {
    a.local[d] = x.shape[d];
    a.global[d] = w.global[d];
    a.offset[d] = w.offset[d];
  }
  rng_kernel<<<blocks_for(n), kThreads, 0, cuda_stream(s)>>>(x.data, x.dtype, n, a, seed, stream, normal, p0, p1);
  DT_CUDA_LAUNCH_CHECK();
}

void memcpy_async(const TensorView& dst, const TensorView& src, Stream s) {
  DT_CHECK(dst.nbytes() == src.nbytes(), "memcpy_async: sizes differ {} vs {}", dst.str(), src.str());
  if (!dst.nbytes()) return;
  DT_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, dst.nbytes(), cudaMemcpyDefault, cuda_stream(s)));
}

void stream_sync(Stream s) { DT_CUDA_CHECK(cudaStreamSynchronize(cuda_stream(s))); }

}  // namespace dt::ops::cuda
