// Internal: Hopper warpgroup MMA (wgmma.mma_async, sm_90a) for the GDN chunk kernels, with A
// from registers (the RS form) and B in shared memory in 128-byte-swizzled atoms.
//
// A warpgroup is 4 consecutive warps (warp index divisible by 4); warp w of it owns rows
// 16 w .. 16 w + 15 of the m64 tile, so a warp's A fragment (4 x b32) and accumulator tiles
// (float[N / 8][4]: n8 tile j, elements (g, 2 tq), (g, 2 tq + 1), (g + 8, 2 tq), (g + 8, 2 tq + 1)
// with lane = 4 g + tq) have exactly mma.m16n8k16's layouts: code that keeps a warp-owned state in
// mma accumulators can hand it to wgmma unchanged.
//
// Shared-memory operand (B): rows of 64 bf16 (128 bytes) in atoms of [rows][128 B] that start on
// 1024-byte boundaries; 16-byte chunk c of row r sits at r * 128 + ((c ^ (r & 7)) * 16) (the
// 128-byte swizzle, conflict-free for both the cp.async stores and the tensor cores' reads). A
// [rows][128] bf16 tile is two atoms: columns 0..63, then 64..127 at + rows * 128 bytes.
//   K-major B (B[k][n] = tile[n][k], e.g. W for S^T W^T): k-step kk at atom kk / 4, + 32 (kk % 4)
//     bytes; SBO = 1024 (the next 8 rows = n), LBO unused.
//   MN-major B (B[k][n] = tile[k][n], e.g. K for Delta^T K; imm-trans-b = 1): k-step kk at
//     + 2048 kk (16 rows); SBO = 1024 (the next 8 rows = k), LBO = the atom stride (the next 64 n).
// Ordering: wgmma is asynchronous. wg_fence() before the first wgmma that reads registers written
// by ordinary instructions (A fragments, accumulators); A registers and accumulators must not be
// touched until wg_wait<0>() (wg_hold() pins them for the compiler); shared memory written by
// ordinary stores or cp.async needs fence_proxy_async() in each writing thread before the barrier
// that precedes the wgmma.
#pragma once
#include <cstdint>

namespace dt::ops::cuda {
namespace {
namespace wg {

// 128-byte-swizzled byte offset of 16-byte chunk c (0..7) of row r inside an atom.
__device__ __forceinline__ uint32_t sw128(int r, int c) { return uint32_t(r * 128 + ((c ^ (r & 7)) << 4)); }

// Shared-memory matrix descriptor: start address, leading / stride byte offsets, 128-byte swizzle.
__device__ __forceinline__ uint64_t desc_sw128(uint32_t smem_byte_addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((smem_byte_addr & 0x3FFFF) >> 4) | (uint64_t((lbo & 0x3FFFF) >> 4) << 16) |
         (uint64_t((sbo & 0x3FFFF) >> 4) << 32) | (uint64_t(1) << 62);
}

__device__ __forceinline__ void wg_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wg_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Pins accumulator registers across an asynchronous wgmma for the compiler (no instruction).
template <int NJ>
__device__ __forceinline__ void wg_hold(float (&d)[NJ][4]) {
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}

// The same for A-fragment registers that an asynchronous wgmma still reads: held until after its
// wg_wait (else the compiler may reuse them once their last ordinary use is done).
template <int N>
__device__ __forceinline__ void wg_hold(uint32_t (&a)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[i][e])::"memory");
}

// d[64, 64] (+)= A[64, 16] B[16, 64]: A this warp's mma A fragment, B K-major (TB = 0) or MN-major
// (TB = 1: imm-trans-b). accumulate = 0 overwrites d.
template <int TB = 0>
__device__ __forceinline__ void m64n64k16_rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc_b,
                                             int accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, %37;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(TB), "r"(accumulate));
#else
  __trap();  // the host launches wgmma kernels only on sm_90a builds and devices
#endif
}
// d[64, 128] += A[64, 16] B[16, 128]: A this warp's mma A fragment, B MN-major (imm-trans-b 1).
__device__ __forceinline__ void m64n128k16_rs_tb(float (&d)[16][4], const uint32_t (&a)[4], uint64_t desc_b,
                                                 int accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %70, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, %69;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(1), "r"(accumulate));
#else
  __trap();
#endif
}

// Both operands from shared memory (the SS form): d[64, N] (+)= A[64, 16] B[16, N]. da, db: the
// low words of 128-byte-swizzle descriptors (start >> 4 | LBO >> 4 << 16); the high word, SBO
// 1024 and the swizzle mode, is the constant 0x40000040, so ptxas keeps the low words in uniform
// registers. TA / TB: imm-trans-a / -b (MN-major A / B). accumulate = 0 overwrites d.
template <int TA, int TB>
__device__ __forceinline__ void m64n64k16_ss(float (&d)[8][4], uint32_t da, uint32_t db, int acc) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 da, db;\nsetp.ne.b32 p, %34, 0;\nmov.b64 da, {%32, 0x40000040};\nmov.b64 db, {%33, 0x40000040};\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, da, db, p, 1, 1, %35, %36;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(da), "r"(db), "r"(acc), "n"(TA), "n"(TB));
#else
  __trap();
#endif
}
template <int TA, int TB>
__device__ __forceinline__ void m64n32k16_ss(float (&d)[4][4], uint32_t da, uint32_t db, int acc) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 da, db;\nsetp.ne.b32 p, %18, 0;\nmov.b64 da, {%16, 0x40000040};\nmov.b64 db, {%17, 0x40000040};\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, da, db, p, 1, 1, %19, %20;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "r"(da), "r"(db), "r"(acc), "n"(TA), "n"(TB));
#else
  __trap();
#endif
}


// The products the GDN kernels issue whole. Issued and committed, not awaited: wait_acc(d) before d
// is read (the caller may do other work between).
// d[64, 64] (=) A[64, 16 K] B[16 K, 64]: a the K k-steps' A fragments; B K-major, the 64 rows of a
// [64][16 K] bf16 tile in 128-byte-swizzled [64][64] atoms at shared address b, `astride` bytes apart.
template <int K>
__device__ __forceinline__ void issue_kmajor_n64(float (&d)[8][4], const uint32_t (&a)[K][4], uint32_t b,
                                                 uint32_t astride) {
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < K; ++kk) m64n64k16_rs(d, a[kk], desc_sw128(b + (kk >> 2) * astride + (kk & 3) * 32, 16, 1024), kk);
  wg_commit();
}
// d[64, 128] (+)= A[64, 16 K] B[16 K, 128]: B MN-major, a [16 K][128] bf16 tile in two 128-byte-
// swizzled [16 K][64] atoms at b, `astride` bytes apart. accumulate = false overwrites d.
template <int K>
__device__ __forceinline__ void issue_mn_n128(float (&d)[16][4], const uint32_t (&a)[K][4], uint32_t b,
                                              uint32_t astride, bool accumulate) {
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < K; ++kk) m64n128k16_rs_tb(d, a[kk], desc_sw128(b + kk * 2048, astride, 1024), accumulate || kk > 0);
  wg_commit();
}
template <int NJ>
__device__ __forceinline__ void wait_acc(float (&d)[NJ][4]) {
  wg_hold(d);
  wg_wait<0>();
  wg_hold(d);
}

}  // namespace wg
}  // namespace
}  // namespace dt::ops::cuda
