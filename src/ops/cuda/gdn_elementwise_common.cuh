// Internal: helpers shared by the memory-bound GDN kernel families (conv1d_varlen, l2norm,
// gdn_gate, gated_rmsnorm) and the dense layers' element-wise kernels (rmsnorm1p, swiglu, the
// attention's sigmoid gate): 16-byte vector access of bf16/f32 rows as fp32 registers, a row
// map for [rows, d] / [A, B, d] views with unit inner stride, the per-thread cp.async ring of
// the streaming row kernels, the deterministic column reduction of per-block fp32 partials,
// and host-side view checks.
//
// Everything lives in an anonymous namespace: each .cu gets its own copy (no -rdc needed).
// Element offsets are int64. No atomics anywhere: every reduction has a fixed order that
// depends only on the problem shape, never on the device or on timing.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/cuda_check.h"
#include "deltatron/core/tensor.h"

namespace dt::ops::cuda {
namespace {
namespace ew {

// ---- scoped NVTX range (one per launcher) ----------------------------------------------------
struct NvtxRange {
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

// ---- 16-byte vectors of T as fp32 registers ---------------------------------------------------
template <typename T>
inline constexpr int kVec = int(16 / sizeof(T));  // 8 for bf16, 4 for f32

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// bf16 pair <-> 32-bit word: low half is the first element (little endian).
__device__ __forceinline__ float bf16lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf16hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ uint32_t pack_bf16x2(float a, float b) {
  __nv_bfloat162 h = __floats2bfloat162_rn(a, b);  // RNE, .x = a (low half)
  return *reinterpret_cast<uint32_t*>(&h);
}

// A 16-byte word <-> kVec<T> fp32 values (element 0 in the lowest bytes).
template <typename T>
__device__ __forceinline__ void unpack16(const uint4& u, float (&r)[kVec<T>]) {
  if constexpr (std::is_same_v<T, float>) {
    r[0] = __uint_as_float(u.x), r[1] = __uint_as_float(u.y), r[2] = __uint_as_float(u.z), r[3] = __uint_as_float(u.w);
  } else {
    r[0] = bf16lo(u.x), r[1] = bf16hi(u.x), r[2] = bf16lo(u.y), r[3] = bf16hi(u.y);
    r[4] = bf16lo(u.z), r[5] = bf16hi(u.z), r[6] = bf16lo(u.w), r[7] = bf16hi(u.w);
  }
}
template <typename T>
__device__ __forceinline__ uint4 pack16(const float (&r)[kVec<T>]) {
  uint4 u;
  if constexpr (std::is_same_v<T, float>) {
    u.x = __float_as_uint(r[0]), u.y = __float_as_uint(r[1]), u.z = __float_as_uint(r[2]), u.w = __float_as_uint(r[3]);
  } else {
    u.x = pack_bf16x2(r[0], r[1]), u.y = pack_bf16x2(r[2], r[3]);
    u.z = pack_bf16x2(r[4], r[5]), u.w = pack_bf16x2(r[6], r[7]);
  }
  return u;
}

// One aligned 16-byte load: r[0..kVec) = p[0..kVec). Read-only path.
template <typename T>
__device__ __forceinline__ void load16(const T* p, float (&r)[kVec<T>]) {
  unpack16<T>(__ldg(reinterpret_cast<const uint4*>(p)), r);
}
template <typename T>
__device__ __forceinline__ void store16(T* p, const float (&r)[kVec<T>]) {
  *reinterpret_cast<uint4*>(p) = pack16<T>(r);
}

// N elements starting at element e0 of a row of n elements (N a multiple of kVec<T>): 16-byte
// accesses when `vec_ok` (row start 16-byte aligned) and the span is full, else element by
// element (the tail of a ragged row, or an unaligned view). Missing elements read as 0.
template <typename T, int N>
__device__ __forceinline__ void load_span(const T* row, int64_t e0, int64_t n, bool vec_ok, float (&r)[N]) {
  static_assert(N % kVec<T> == 0, "span must be whole 16-byte vectors");
  if (vec_ok && e0 + N <= n) {
#pragma unroll
    for (int c = 0; c < N / kVec<T>; ++c) load16<T>(row + e0 + c * kVec<T>, *reinterpret_cast<float(*)[kVec<T>]>(r + c * kVec<T>));
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) r[i] = (e0 + i < n) ? to_f32(row[e0 + i]) : 0.f;
  }
}
template <typename T, int N>
__device__ __forceinline__ void store_span(T* row, int64_t e0, int64_t n, bool vec_ok, const float (&r)[N]) {
  static_assert(N % kVec<T> == 0, "span must be whole 16-byte vectors");
  if (vec_ok && e0 + N <= n) {
#pragma unroll
    for (int c = 0; c < N / kVec<T>; ++c)
      store16<T>(row + e0 + c * kVec<T>, *reinterpret_cast<const float(*)[kVec<T>]>(r + c * kVec<T>));
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i)
      if (e0 + i < n) row[e0 + i] = from_f32<T>(r[i]);
  }
}
// One 16-byte slot (kVec<T> elements).
template <typename T>
__device__ __forceinline__ void load_slot(const T* row, int64_t e0, int64_t n, bool vec_ok, float (&r)[kVec<T>]) {
  load_span<T, kVec<T>>(row, e0, n, vec_ok, r);
}
template <typename T>
__device__ __forceinline__ void store_slot(T* row, int64_t e0, int64_t n, bool vec_ok, const float (&r)[kVec<T>]) {
  store_span<T, kVec<T>>(row, e0, n, vec_ok, r);
}

// One slot as it lies in memory (16 bytes, unpacked later with unpack16: half the registers of
// fp32 for bf16 rows held across a reduction): one 16-byte load when `vec_ok` and whole, else
// element loads packed the same way (exact: the values are already of type T); zeros past n.
template <typename T>
__device__ __forceinline__ uint4 load_slot_raw(const T* row, int64_t e0, int64_t n, bool vec_ok) {
  if (vec_ok && e0 + kVec<T> <= n) return __ldg(reinterpret_cast<const uint4*>(row + e0));
  float r[kVec<T>];
#pragma unroll
  for (int i = 0; i < kVec<T>; ++i) r[i] = (e0 + i < n) ? to_f32(row[e0 + i]) : 0.f;
  return pack16<T>(r);
}

// f32 parameter vector slot (w, A_log, ...): contiguous, 16-byte loads when aligned.
template <int V>
__device__ __forceinline__ void load_param(const float* p, int64_t e0, int64_t n, bool vec_ok, float (&r)[V]) {
#pragma unroll
  for (int i = 0; i < V; i += 4) {
    if (vec_ok && e0 + i + 4 <= n) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(p + e0 + i));
      r[i] = f.x, r[i + 1] = f.y, r[i + 2] = f.z, r[i + 3] = f.w;
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) r[i + k] = (e0 + i + k < n) ? __ldg(p + e0 + i + k) : 0.f;
    }
  }
}

// sigmoid with the fast exp2 and reciprocal (a few ulp; 0 and 1 in the saturated limits). The
// flush-to-zero forms are single MUFU instructions (the IEEE-denormal forms add a range fix-up
// around each); here a denormal only ever appears as exp(-x) next to the 1 it is added to.
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float rcp_ftz(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float sigmoid_f(float x) { return rcp_ftz(1.f + ex2_ftz(x * -1.4426950408889634f)); }
// log2 by the MUFU op: absolute error 2^-22.6 on [1, 2], 2 ulp beyond (the gates' log1p).
__device__ __forceinline__ float lg2_ftz(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Sum over the `width` lanes of an aligned lane group (width a power of two <= 32). All 32
// lanes of the warp must call it. Butterfly order: the same bits on every run.
__device__ __forceinline__ float group_sum(float v, int width) {
  for (int off = width >> 1; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// ---- rows of a view ----------------------------------------------------------------------------
// Row r of a [rows, d] view (2D: any row stride) or of an [A, B, d] view (3D: any strides on the
// two leading dims) -> element offset of its first element. Unit inner stride.
struct RowMap {
  int64_t inner = 1;    // B for 3D, 1 for 2D
  int64_t s_outer = 0;  // stride of dim 0 (elements)
  int64_t s_inner = 0;  // stride of dim 1 for 3D
  bool narrow = true;   // rows < 2^32: the 3D split uses a 32-bit division
  __device__ __forceinline__ int64_t operator()(int64_t r) const {
    if (inner == 1) return r * s_outer;
    int64_t q;
    if (narrow) q = int64_t(uint32_t(r) / uint32_t(inner));
    else q = r / inner;
    return q * s_outer + (r - q * inner) * s_inner;
  }
};

// Collapses the leading dims of v (all but the last) into at most two strided dims.
// Returns false when that is impossible (the caller reports the view).
inline bool make_rowmap(const TensorView& v, RowMap* out, int64_t* rows, int64_t* d) {
  const int nd = v.ndim();
  if (nd < 1) return false;
  *d = v.shape[nd - 1];
  if (*d > 1 && v.stride[nd - 1] != 1) return false;
  int64_t dims[kMaxDims], strides[kMaxDims];
  int n = 0;
  for (int i = 0; i < nd - 1; ++i) {
    if (v.shape[i] == 1) continue;
    if (n > 0 && strides[n - 1] == v.stride[i] * v.shape[i]) {  // merge into the previous dim
      dims[n - 1] *= v.shape[i];
      strides[n - 1] = v.stride[i];
    } else {
      dims[n] = v.shape[i], strides[n] = v.stride[i], ++n;
    }
  }
  *rows = 1;
  for (int i = 0; i < n; ++i) *rows *= dims[i];
  RowMap m;
  if (n == 0) {
    m.inner = 1, m.s_outer = 0;
  } else if (n == 1) {
    m.inner = 1, m.s_outer = strides[0];
  } else if (n == 2) {
    m.inner = dims[1], m.s_outer = strides[0], m.s_inner = strides[1];
    m.narrow = *rows < (int64_t(1) << 32);
  } else {
    return false;
  }
  *out = m;
  return true;
}

// True when every row start of v is 16-byte aligned (base and leading strides).
inline bool rows_aligned16(const TensorView& v, const RowMap& m) {
  const int64_t sz = int64_t(dtype_size(v.dtype));
  if (reinterpret_cast<uintptr_t>(v.data) % 16 != 0) return false;
  if ((m.s_outer * sz) % 16 != 0) return false;
  if (m.inner > 1 && (m.s_inner * sz) % 16 != 0) return false;
  return true;
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline bool is_absent(const TensorView& v) { return v.data == nullptr || v.numel() == 0; }

inline int pow2_ceil(int64_t x) {
  int p = 1;
  while (p < x) p <<= 1;
  return p;
}

// ---- cp.async (sm_80+) ------------------------------------------------------------------------
__device__ __forceinline__ void cp_async16(void* s_dst, const void* g_src) {
  const unsigned sa = unsigned(__cvta_generic_to_shared(s_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(g_src) : "memory");
}
// 4 bytes; when !valid the destination is zero-filled and g_src is not read.
__device__ __forceinline__ void cp_async4_zfill(void* s_dst, const void* g_src, bool valid) {
  const unsigned sa = unsigned(__cvta_generic_to_shared(s_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(sa), "l"(g_src), "r"(valid ? 4 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// ---- per-thread cp.async ring of 16-byte row slots ---------------------------------------------
// The streaming row kernels (l2norm, gated_rmsnorm) keep S-1 tiles of loads in flight per thread
// without holding them in registers: every thread copies the 16-byte slots it will consume into
// its own shared-memory words and reads back only those, so cp.async.wait_group alone orders copy
// and read (no block barrier). Ring layout [S stages][P slots][kThreads] uint4: a warp's 32 slots
// are 512 contiguous bytes (conflict-free). A stage is refilled one iteration after it was read;
// the reads fed the row sums that the refill's iteration waited on, so they are complete.
template <int NT>
__device__ __forceinline__ uint4* ring_slot(uint4* s_ring, int P, int stage, int p) {
  return s_ring + (stage * P + p) * NT + threadIdx.x;
}
// One slot (elements e0 .. e0+kVec of a row of n) into s_dst: cp.async when valid, aligned and
// whole; element loads for a ragged or unaligned slot; zeros for an invalid row or past n.
template <typename T>
__device__ __forceinline__ void stage_slot(uint4* s_dst, const T* row, int64_t e0, int64_t n, bool vec_ok, bool valid) {
  if (valid && vec_ok && e0 + kVec<T> <= n) {
    cp_async16(s_dst, row + e0);
  } else {
    float r[kVec<T>];
#pragma unroll
    for (int i = 0; i < kVec<T>; ++i) r[i] = (valid && e0 + i < n) ? to_f32(row[e0 + i]) : 0.f;
    *s_dst = pack16<T>(r);
  }
}

// Blocks of `kernel` that fit on the current device at once (blocks per SM x SMs), for the
// persistent grids of the forward kernels (the backward grids are fixed by the shape instead).
template <class Kernel>
inline int64_t resident_blocks(Kernel kernel, int threads, size_t smem) {
  int dev = 0, sms = 0, per_sm = 0;
  DT_CUDA_CHECK(cudaGetDevice(&dev));
  DT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  DT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  return int64_t(std::max(per_sm, 1)) * sms;
}

// ---- programmatic dependent launch (sm_90) -------------------------------------------------------
// The column reduction below is launched as a dependent of the kernel that wrote the partials:
// its launch overlaps that kernel's tail, and griddepcontrol.wait holds it until the partials
// are complete and visible. The producer may trigger early (after its main loop). Both are
// no-ops when the launch carries no dependency.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// ---- deterministic column reduction of per-block partials --------------------------------------
// out(c, sum_{b < nparts} part[b * ncols + c]) for every column c, summed in a fixed order:
// 32 threads of a column take the strided partial sums over b (b = ty, ty + 32, ...), then one
// thread adds those 32 sums in index order. `Out` is a small functor that applies the result
// (e.g. g_out[c] += v).
constexpr int kColsumX = 32, kColsumY = 32;
// Column c's partials b, b + kColsumY, ... in batches of W loads in flight, added to r_acc in that
// order, while a whole batch remains; b is left at the first partial not taken.
template <int W>
__device__ __forceinline__ void colsum_batches(float& r_acc, int64_t& b, const float* __restrict__ g_part,
                                               int64_t nparts, int64_t ncols, int64_t c) {
  for (; b + (W - 1) * kColsumY < nparts; b += W * kColsumY) {
    float v[W];
#pragma unroll
    for (int i = 0; i < W; ++i) v[i] = g_part[(b + i * kColsumY) * ncols + c];
#pragma unroll
    for (int i = 0; i < W; ++i) r_acc += v[i];
  }
}
// One block's kColsumX columns [blk * kColsumX, ...) of the reduction (blockDim = kColsumX x kColsumY).
template <class Out>
__device__ __forceinline__ void colsum_block(Out out, const float* __restrict__ g_part, int64_t nparts, int64_t ncols,
                                             int64_t blk, float (*s_sum)[kColsumX + 1]) {
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = blk * kColsumX + tx;
  float r_acc = 0.f;
  if (c < ncols) {
    int64_t b = ty;
    // 32, then 8 independent loads in flight (the reduction is latency-bound): dvl's norm-weight
    // sum (16384 partials, 128 columns: four blocks) took 35.7 us with 8 (64 rounds per thread, each
    // a DRAM latency), 22.3 us with 32 first (perf.md v0.37.0). The same adds in the same order.
    colsum_batches<32>(r_acc, b, g_part, nparts, ncols, c);
    colsum_batches<8>(r_acc, b, g_part, nparts, ncols, c);
    for (; b < nparts; b += kColsumY) r_acc += g_part[b * ncols + c];
  }
  s_sum[ty][tx] = r_acc;
  __syncthreads();
  if (ty == 0 && c < ncols) {
    float r_tot = 0.f;
#pragma unroll
    for (int k = 0; k < kColsumY; ++k) r_tot += s_sum[k][tx];
    out(c, r_tot);
  }
}

template <class Out>
__global__ __launch_bounds__(kColsumX* kColsumY) void colsum_kernel(Out out, const float* __restrict__ g_part,
                                                                    int64_t nparts, int64_t ncols) {
  __shared__ float s_sum[kColsumY][kColsumX + 1];
  pdl_wait();  // the partials come from the previous kernel in the stream
  colsum_block(out, g_part, nparts, ncols, blockIdx.x, s_sum);
}

// Two independent reductions in one launch (the second's blocks first): a kernel that wrote two
// sets of partials needs one dependent launch, not two in a row.
template <class Out0, class Out1>
__global__ __launch_bounds__(kColsumX* kColsumY) void colsum2_kernel(Out0 out0, const float* __restrict__ part0,
                                                                     int64_t nparts0, int64_t ncols0, Out1 out1,
                                                                     const float* __restrict__ part1,
                                                                     int64_t nparts1, int64_t ncols1) {
  __shared__ float s_sum[kColsumY][kColsumX + 1];
  pdl_wait();
  const int64_t nb1 = (ncols1 + kColsumX - 1) / kColsumX;
  if (int64_t(blockIdx.x) < nb1) colsum_block(out1, part1, nparts1, ncols1, blockIdx.x, s_sum);
  else colsum_block(out0, part0, nparts0, ncols0, int64_t(blockIdx.x) - nb1, s_sum);
}

// Launches `kernel` (grid blocks of kColsumX x kColsumY) as a programmatic dependent of the
// previous kernel in the stream.
template <class Kernel, class... Args>
inline void launch_dependent(Kernel kernel, int64_t blocks, cudaStream_t st, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(blocks));
  cfg.blockDim = dim3(kColsumX, kColsumY);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  DT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
  DT_CUDA_LAUNCH_CHECK();
}

template <class Out>
inline void colsum_apply(Out out, const float* part, int64_t nparts, int64_t ncols, cudaStream_t st) {
  if (ncols == 0) return;
  launch_dependent(colsum_kernel<Out>, (ncols + kColsumX - 1) / kColsumX, st, out, part, nparts, ncols);
}
template <class Out0, class Out1>
inline void colsum_apply2(Out0 out0, const float* part0, int64_t nparts0, int64_t ncols0, Out1 out1,
                          const float* part1, int64_t nparts1, int64_t ncols1, cudaStream_t st) {
  const int64_t blocks = (ncols0 + kColsumX - 1) / kColsumX + (ncols1 + kColsumX - 1) / kColsumX;
  if (blocks == 0) return;
  launch_dependent(colsum2_kernel<Out0, Out1>, blocks, st, out0, part0, nparts0, ncols0, out1, part1, nparts1,
                   ncols1);
}

// out0[c] += v for c < n0, out1[c - n0] += v otherwise (contiguous f32 parameter gradients).
struct AddToSplit {
  float* out0;
  float* out1;
  int64_t n0;
  __device__ __forceinline__ void operator()(int64_t c, float v) const {
    if (c < n0) out0[c] += v;
    else out1[c - n0] += v;
  }
};
inline void colsum_add(float* out0, float* out1, const float* part, int64_t nparts, int64_t ncols, int64_t n0,
                       cudaStream_t st) {
  colsum_apply(AddToSplit{out0, out1, n0}, part, nparts, ncols, st);
}

}  // namespace ew
}  // namespace
}  // namespace dt::ops::cuda
