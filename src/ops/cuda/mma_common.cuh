// Internal: the warp-level building blocks of the tensor-core kernel families (gdn_chunk,
// attention): fp32 <-> element conversion, 16-byte cp.async tile loads with zero fill, ldmatrix,
// mma.sync m16n8k16 bf16, and warp_gemm, which runs the same fragment ownership either on bf16
// tensor cores (fp32 accumulate) or as exact fp32 FFMA for f32 tiles, so one kernel source
// serves both precisions. Anonymous namespace: each .cu has its own copy (no -rdc).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace dt::ops::cuda {
namespace {
namespace mma {

using bf16 = __nv_bfloat16;

// Shared-memory row padding (elements): +16 bytes per row keeps ldmatrix conflict-free; also
// the 16-byte vector width of the tile loads.
template <class T> constexpr int kPad = int(16 / sizeof(T));

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
template <class T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16_rn(x); }

// Two consecutive elements (p must be 2-element aligned).
__device__ __forceinline__ void store2(float* p, float a, float b) { *reinterpret_cast<float2*>(p) = make_float2(a, b); }
__device__ __forceinline__ void store2(bf16* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}
__device__ __forceinline__ float2 load2(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ float2 load2(const bf16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// 16-byte async copy; src_bytes = 0 zero-fills the destination (src is not read).
__device__ __forceinline__ void cp_async16(void* s, const void* g, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(s)), "l"(g), "r"(ok ? 16 : 0)
               : "memory");
}
// cp.async of 16 bytes to a shared-memory address (smem_addr) computed by the caller.
__device__ __forceinline__ void cp_async16_sa(uint32_t sa, const void* g) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(g) : "memory");
}
__device__ __forceinline__ void cp_async4_sa(uint32_t sa, const void* g) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(sa), "l"(g) : "memory");
}
__device__ __forceinline__ void cp_async4(void* s, const void* g, bool ok) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(s)), "l"(g), "r"(ok ? 4 : 0)
               : "memory");
}
// L2 eviction priority of a tile load: kL2Normal, or kL2EvictFirst for a tile read for the last
// time, so that its lines leave L2 before those the kernel (or its cluster partner) reads again.
enum L2Hint { kL2Normal, kL2EvictFirst };
__device__ __forceinline__ uint64_t l2_policy_evict_first() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
  return pol;
}
// cp_async16 with the L2 eviction policy pol (createpolicy)
__device__ __forceinline__ void cp_async16_pol(uint32_t sa, const void* g, int bytes, uint64_t pol) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(sa), "l"(g), "r"(bytes),
               "l"(pol)
               : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// L2 prefetch of rows [0, nvalid) x bytes [0, row_bytes) of a global tile whose rows start on
// 128-byte lines, LPR >= row_bytes / 128 lines per row, one line per thread t of a group (t in
// [0, nvalid * LPR); other t do nothing): no loop, no registers held, nothing to wait for. For tiles
// that a kernel loads later (a second load phase, epilogue reads straight from global memory), so
// that they come from L2, not DRAM.
template <int LPR>
__device__ __forceinline__ void prefetch_l2_rows(const void* g, int64_t stride_bytes, int nvalid, int row_bytes, int t) {
  const int r = t / LPR, l = t % LPR;
  if (t >= 0 && r < nvalid && l * 128 < row_bytes)
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(static_cast<const char*>(g) + r * stride_bytes + l * 128));
}

// s[r*lds + c] = g[r*gstride + c] for r < nvalid, c < ncols; zero for the rest of [rows) x [cols).
// ncols and cols are multiples of the 16-byte vector width.
template <L2Hint H = kL2Normal, class T>
__device__ __forceinline__ void load_tile(T* s, int lds, const T* g, int64_t gstride, int rows, int nvalid, int ncols,
                                          int cols, int tid, int nthr) {
  constexpr int V = kPad<T>;
  const int vpr = cols / V;
  [[maybe_unused]] uint64_t pol = 0;
  if constexpr (H == kL2EvictFirst) pol = l2_policy_evict_first();
  for (int idx = tid; idx < rows * vpr; idx += nthr) {
    const int r = idx / vpr, c = (idx - r * vpr) * V;
    const bool ok = r < nvalid && c < ncols;
    if constexpr (H == kL2EvictFirst)
      cp_async16_pol(smem_addr(s + r * lds + c), ok ? g + r * gstride + c : g, ok ? 16 : 0, pol);
    else
      cp_async16(s + r * lds + c, ok ? g + r * gstride + c : g, ok);
  }
}
// load_tile for a tile with every element valid (nvalid = ROWS, ncols = COLS), sizes known at
// compile time: the same copies, but each thread's rows are a fixed stride apart, so its shared
// and global addresses are computed once and each copy is one add and one LDGSTS (the generic
// loop spends ~28 instructions a copy on divisions, 64-bit products and predicates; on the serial
// kernels' critical path that was ~20-25% of a chunk step's instructions, docs/perf.md v0.8.0).
template <class T, int ROWS, int COLS, int NTHR, L2Hint H = kL2Normal>
__device__ __forceinline__ void load_tile_full(T* s, int lds, const T* g, int64_t gstride, int tid) {
  constexpr int V = kPad<T>, VPR = COLS / V, RSTEP = NTHR / VPR, N = ROWS * VPR / NTHR;
  static_assert(COLS % V == 0 && NTHR % VPR == 0 && (ROWS * VPR) % NTHR == 0, "load_tile_full: tile / thread shape");
  const int r = tid / VPR, c = (tid - r * VPR) * V;
  const unsigned sa = smem_addr(s + r * lds + c), sstep = unsigned(RSTEP * lds * sizeof(T));
  const T* gp = g + r * gstride + c;
  const int64_t gstep = RSTEP * gstride;
  [[maybe_unused]] uint64_t pol = 0;
  if constexpr (H == kL2EvictFirst) pol = l2_policy_evict_first();
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if constexpr (H == kL2EvictFirst)
      cp_async16_pol(sa + i * sstep, gp + i * gstep, 16, pol);
    else
      cp_async16_sa(sa + i * sstep, gp + i * gstep);
  }
}
// s[i] = g[i*stride] for i < nvalid, 0 for nvalid <= i < n (fp32 columns such as gamma, beta).
__device__ __forceinline__ void load_col(float* s, const float* g, int64_t stride, int n, int nvalid, int tid,
                                         int nthr) {
  for (int i = tid; i < n; i += nthr) cp_async4(s + i, i < nvalid ? g + i * stride : g, i < nvalid);
}

// sa: a shared-memory byte address (smem_addr), as the swizzled-atom kernels compute them.
__device__ __forceinline__ void ldsm_x4_sa(uint32_t (&r)[4], uint32_t sa) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(sa)
               : "memory");
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) { ldsm_x4_sa(r, smem_addr(p)); }
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Warp tile (16*WM) x (8*WN) at (m0, n0):  acc += A[m0.., 0..K) * B[0..K), n0..)  (K % 16 == 0)
//   A(m, k) = AT ? sA[k*lda + m] : sA[m*lda + k];   B(k, n) = BT ? sB[n*ldb + k] : sB[k*ldb + n]
// bf16: ldmatrix (.trans for the transposed cases) + mma.sync bf16, fp32 accumulate.
// f32:  the same fragment ownership with plain fp32 FFMA (exact fp32, no TF32).
// Fragment element acc[i][j][2*h2 + e] sits at row m0 + 16i + lane/4 + 8*h2, col n0 + 8j + 2*(lane%4) + e.
template <int WM, int WN, bool AT, bool BT, class T>
__device__ __forceinline__ void warp_gemm(float (&acc)[WM][WN][4], const T* sA, int lda, const T* sB, int ldb, int m0,
                                          int n0, int K) {
  const int lane = threadIdx.x & 31;
  if constexpr (std::is_same_v<T, bf16>) {
    static_assert(WN % 2 == 0, "WN must be even");
    const int mi = lane >> 3, r8 = lane & 7;
    for (int k0 = 0; k0 < K; k0 += 16) {
      uint32_t a[WM][4];
#pragma unroll
      for (int i = 0; i < WM; ++i) {
        if constexpr (!AT) ldsm_x4(a[i], sA + (m0 + 16 * i + (lane & 15)) * lda + k0 + (lane >> 4) * 8);
        else ldsm_x4_t(a[i], sA + (k0 + r8 + (mi >> 1) * 8) * lda + m0 + 16 * i + (mi & 1) * 8);
      }
#pragma unroll
      for (int j = 0; j < WN; j += 2) {
        uint32_t b[4];
        if constexpr (BT) ldsm_x4(b, sB + (n0 + 8 * j + r8 + (mi >> 1) * 8) * ldb + k0 + (mi & 1) * 8);
        else ldsm_x4_t(b, sB + (k0 + r8 + (mi & 1) * 8) * ldb + n0 + 8 * j + (mi >> 1) * 8);
#pragma unroll
        for (int i = 0; i < WM; ++i) {
          mma_bf16(acc[i][j], a[i], b[0], b[1]);
          mma_bf16(acc[i][j + 1], a[i], b[2], b[3]);
        }
      }
    }
  } else {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll 2
    for (int k = 0; k < K; ++k) {
      float a[WM][2], b[WN][2];
#pragma unroll
      for (int i = 0; i < WM; ++i) {
        const int r = m0 + 16 * i + g;
        a[i][0] = AT ? sA[k * lda + r] : sA[r * lda + k];
        a[i][1] = AT ? sA[k * lda + r + 8] : sA[(r + 8) * lda + k];
      }
#pragma unroll
      for (int j = 0; j < WN; ++j) {
        const int c = n0 + 8 * j + 2 * t;
        if constexpr (BT) {
          b[j][0] = sB[c * ldb + k];
          b[j][1] = sB[(c + 1) * ldb + k];
        } else {
          const float2 v = load2(sB + k * ldb + c);
          b[j][0] = v.x;
          b[j][1] = v.y;
        }
      }
#pragma unroll
      for (int i = 0; i < WM; ++i)
#pragma unroll
        for (int j = 0; j < WN; ++j) {
          acc[i][j][0] = fmaf(a[i][0], b[j][0], acc[i][j][0]);
          acc[i][j][1] = fmaf(a[i][0], b[j][1], acc[i][j][1]);
          acc[i][j][2] = fmaf(a[i][1], b[j][0], acc[i][j][2]);
          acc[i][j][3] = fmaf(a[i][1], b[j][1], acc[i][j][3]);
        }
    }
  }
}

template <int WM, int WN>
__device__ __forceinline__ void zero(float (&acc)[WM][WN][4]) {
#pragma unroll
  for (int i = 0; i < WM; ++i)
#pragma unroll
    for (int j = 0; j < WN; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
}

// f(row, col, v0, v1) over the element pairs (row, col), (row, col + 1) a thread owns.
template <int WM, int WN, class F>
__device__ __forceinline__ void frag_pairs(float (&acc)[WM][WN][4], int m0, int n0, F&& f) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < WM; ++i)
#pragma unroll
    for (int j = 0; j < WN; ++j)
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) f(m0 + 16 * i + g + 8 * h2, n0 + 8 * j + 2 * t, acc[i][j][2 * h2], acc[i][j][2 * h2 + 1]);
}

}  // namespace mma
}  // namespace
}  // namespace dt::ops::cuda
