// Internal to gdn_chunk.cu (included inside its gck namespace): the serial kernels (state K4 and
// rev B4) with WARP-OWNED state rows, bf16 only.
//
// The tiled serial kernels keep S [dk, BV] spread over 8 warps as mma accumulators; every chunk
// step then stores S to shared memory (it is the B operand of Delta = U - W S), syncs the CTA,
// stages Delta~ in shared memory again for S += K^T Delta~, and syncs once more: a ~5.6 us step
// at bench-0.8b of which the ~110 MMAs per warp are a small part (docs/perf.md, v0.4.0 ncu).
// Here each warp owns 16 rows of the TRANSPOSED state S^T [dv, dk] (all dk columns), so both
// products of a step use the warp's own registers as the A operand:
//   Delta^T [16, C] = U^T - S^T W^T          A = bf16(S^T) from the accumulators, B = W rows
//   S^T     [16, dk] = e^{gam_e} S^T + Delta~^T K     A = bf16(Delta~^T) from the accumulators
// (the m16n8 accumulator layout of two adjacent n-tiles is the m16n8k16 A-fragment layout).
// No shared-memory round trip and no CTA barrier inside a step: the CTA's warps (NW = BVw / 16)
// share only the cp.async tile loads of W, K, U (one __syncthreads per chunk, at the pipeline).
// The same products in the same k order as the tiled kernels, on the same bf16-rounded operands.
//
// Outputs leave through a per-warp staging tile: stmatrix.trans writes the accumulators' bf16
// values transposed ([dk rows][16 v] for h / dS1, [C rows][16 v] for Delta / dDelta), and each
// row of 16 v (32 bytes, one sector) goes to global memory in two 16-byte stores.
//
// Fragment ownership (lane = 4 g + tq): S^T element (row v0 + 16 warp + g + 8 h2, col 8 j + 2 tq + e)
// sits in r_S[j][2 h2 + e], j < dk / 8.

constexpr int LDW = 24;  // staging tile row stride (bf16): 48-byte rows keep stmatrix conflict-free

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // the rounding of store2
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ float bf16_lo(uint32_t x) { return __uint_as_float(x << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t x) { return __uint_as_float(x & 0xffff0000u); }
__device__ __forceinline__ void stsm_x4_t_sa(uint32_t sa, const uint32_t (&r)[4]) {  // sa: smem byte address
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(sa), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
}
__device__ __forceinline__ void stsm_x4_t(void* p, const uint32_t (&r)[4]) { stsm_x4_t_sa(smem_addr(p), r); }
// stmatrix not transposed: register m of a lane = its mma fragment pair of 8 x 8 matrix m; lanes
// 8 m .. 8 m + 7 give the rows' addresses of matrix m (out_wg_kernel's P and o tiles).
__device__ __forceinline__ void stsm_x4_sa(uint32_t sa, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(sa), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
}
// The A fragment of k-step kk (columns 16 kk .. 16 kk + 15) from fp32 accumulators of n-tiles 2kk, 2kk+1.
template <int NJ>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&acc)[NJ][4], int kk) {
  a[0] = pack_bf16(acc[2 * kk][0], acc[2 * kk][1]);
  a[1] = pack_bf16(acc[2 * kk][2], acc[2 * kk][3]);
  a[2] = pack_bf16(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
  a[3] = pack_bf16(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
}
template <int NJ>
__device__ __forceinline__ void zero_tiles(float (&acc)[NJ][4]) {
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
}
// Staging address of this lane for the stmatrix.trans of k-step kk's fragment: row 16 kk + (8 if
// matrix 2, 3) + lane % 8, column 8 if matrix 1, 3 (matrix = lane / 8).
__device__ __forceinline__ bf16* stage_row(bf16* s_stg, int kk, int lane) {
  return s_stg + (16 * kk + 8 * (lane >> 4) + (lane & 7)) * LDW + 8 * ((lane >> 3) & 1);
}
// Rows [0, rows) of the warp's staging tile [rows][16] -> g[r * gstride + 0..15] (16-byte stores).
__device__ __forceinline__ void stage_out(const bf16* s_stg, bf16* g, int64_t gstride, int rows, int lane) {
  __syncwarp();
  for (int it = lane; it < 2 * rows; it += 32) {
    const int r = it >> 1, half = it & 1;
    *reinterpret_cast<uint4*>(g + r * gstride + 8 * half) =
        *reinterpret_cast<const uint4*>(s_stg + r * LDW + 8 * half);
  }
  __syncwarp();
}
// stage_out of ROWS rows known at compile time (a full chunk's step): the same copies, each lane's
// 2 ROWS / 32 vectors read in groups of G before the group's stores. In the loop above the compiler
// gave every iteration the same four registers, so each shared-memory load waited for the previous
// global store to release them (ncu: ~11% of the wg4 state kernel's stall samples, long scoreboard
// on that reuse). G bounds the registers held. The state kernels use it; rev's keep the loop (there).
template <int ROWS, int G>
__device__ __forceinline__ void stage_out(const bf16* s_stg, bf16* g, int64_t gstride, int lane) {
  constexpr int N = 2 * ROWS / 32;
  static_assert(N % G == 0, "stage_out: groups of G vectors");
  __syncwarp();
  const bf16* s = s_stg + (lane >> 1) * LDW + 8 * (lane & 1);
  bf16* gp = g + (lane >> 1) * gstride + 8 * (lane & 1);
#pragma unroll
  for (int i0 = 0; i0 < N; i0 += G) {
    uint4 v[G];
#pragma unroll
    for (int i = 0; i < G; ++i) v[i] = *reinterpret_cast<const uint4*>(s + (i0 + i) * 16 * LDW);
#pragma unroll
    for (int i = 0; i < G; ++i) *reinterpret_cast<uint4*>(gp + (i0 + i) * 16 * gstride) = v[i];
  }
  __syncwarp();
}
// fp32 state [dk, dv] (h0, dht) <-> the warp's S^T fragments (once per CTA: plain loads / stores).
template <class F>
__device__ __forceinline__ void state_elems(float (&r)[16][4], int dk, int row0, F&& f) {
  const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = 8 * j + 2 * tq + (e & 1), row = row0 + g + 8 * (e >> 1);
      if (8 * j < dk) f(r[j][e], col, row);
    }
}

// X [16, C] = bf16(S^T) R^T over the token rows of s_rows [C][LDD] (W or K): k-steps over dk,
// token tiles below L. With s_stg, the A fragments (S^T's bf16 values) are also staged through
// stmatrix.trans for the h / dS1 store. S holds NJ n-tiles: all of dk (16), or a warp's slice of
// it (gdn_serial_split.cuh, with s_rows offset to the slice's first column).
template <int NJ>
__device__ __forceinline__ void state_times_rows_t(float (&X)[8][4], const float (&S)[NJ][4], const bf16* s_rows,
                                                   int L, int nkk, bf16* s_stg) {
  const int lane = threadIdx.x & 31, mi = lane >> 3, r8 = lane & 7;
  zero_tiles(X);
#pragma unroll
  for (int kk = 0; kk < NJ / 2; ++kk) {
    if (kk >= nkk) break;
    uint32_t a[4];
    acc_to_a(a, S, kk);
    if (s_stg) stsm_x4_t(stage_row(s_stg, kk, lane), a);
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {  // token columns 16 jj .. 16 jj + 15
      if (16 * jj >= L) break;
      uint32_t b[4];
      ldsm_x4(b, s_rows + (16 * jj + r8 + (mi >> 1) * 8) * LDD<bf16> + 16 * kk + (mi & 1) * 8);
      mma_bf16(X[2 * jj], a, b[0], b[1]);
      mma_bf16(X[2 * jj + 1], a, b[2], b[3]);
    }
  }
}
// The wgmma form of state_times_rows_t for the warpgroup kernels (dk = D, every warp active): each
// warp's X [16, C] = bf16(S^T) R^T as 8 m64n64k16 with R's C token rows in 128-byte-swizzled atoms
// at s_rows (K-major B: W in the state kernel, K in rev; rows >= L are zero there, so all C token
// columns run). With stage, the A fragments are also staged through stmatrix.trans at s_stg.
__device__ __forceinline__ void wg_state_times_rows_t(float (&X)[8][4], const float (&S)[16][4], const bf16* s_rows,
                                                      bf16* s_stg, bool stage, int lane) {
  uint32_t a1[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    acc_to_a(a1[kk], S, kk);
    if (stage) stsm_x4_t(stage_row(s_stg, kk, lane), a1[kk]);
  }
  wg::issue_kmajor_n64(X, a1, smem_addr(s_rows), C * 128);
  wg::wait_acc(X);
}
// S^T [16, dk] += A R over k-step jj: A the fragments of token columns 16 jj .. 16 jj + 15, R the
// same token rows of s_rows [C][LDD] (K, Q or W), dk columns in steps of 16 (NJ n-tiles of S).
template <int NJ>
__device__ __forceinline__ void add_times_rows(float (&S)[NJ][4], const uint32_t (&a)[4], const bf16* s_rows, int jj,
                                               int nkk) {
  const int lane = threadIdx.x & 31, mi = lane >> 3, r8 = lane & 7;
#pragma unroll
  for (int jn = 0; jn < NJ / 2; ++jn) {  // dk columns 16 jn .. 16 jn + 15
    if (jn >= nkk) break;
    uint32_t b[4];
    ldsm_x4_t(b, s_rows + (16 * jj + r8 + (mi & 1) * 8) * LDD<bf16> + 16 * jn + (mi >> 1) * 8);
    mma_bf16(S[2 * jn], a, b[0], b[1]);
    mma_bf16(S[2 * jn + 1], a, b[2], b[3]);
  }
}
// f[i] = e^{gam_e - gam_t} for the lane's tokens t = 16 jj + 2 tq + {0, 1, 8, 9} of token tile jj
// (the rows of its accumulator fragments), 0 for t >= L: one expf per token and lane. gamma_t at
// s_gam[GS t] (GS > 1: a TMA box of GS heads a row, the fused forward's tiles).
template <int GS = 1>
__device__ __forceinline__ void decay_to_end(float (&f)[4], const float* s_gam, float gam_e, int jj, int tq, int L) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int t = 16 * jj + 2 * tq + (i & 1) + 8 * (i >> 1);
    f[i] = t < L ? gexp(gam_e - s_gam[GS * t]) : 0.f;
  }
}
// Step 2 of the state kernels for token tile jj (tokens 16 jj .. 16 jj + 15), from U^T's fragments u
// and X's two n-tiles xa (tokens 16 jj + 0..7) and xb (+ 8..15): d = bf16(U^T - X), Delta^T's
// fragments for its store, and a = bf16(Delta^T e^{gam_e - gam_t}), 0 for t >= L: the A fragments
// of S^T += Delta~^T K.
template <int GS = 1>
__device__ __forceinline__ void delta_frags(uint32_t (&d)[4], uint32_t (&a)[4], const uint32_t (&u)[4],
                                            const float (&xa)[4], const float (&xb)[4], const float* s_gam,
                                            float gam_e, int jj, int tq, int L) {
  float f[4];
  decay_to_end<GS>(f, s_gam, gam_e, jj, tq, L);
#pragma unroll
  for (int q = 0; q < 4; ++q) {  // q: n-tile 2 jj + (q >> 1), row half q & 1
    const float* x = ((q >> 1) ? xb : xa) + 2 * (q & 1);
    const int t = 16 * jj + 8 * (q >> 1) + 2 * tq;
    const float d0 = bf16_lo(u[q]) - x[0], d1 = bf16_hi(u[q]) - x[1];
    d[q] = pack_bf16(d0, d1);
    const float f0 = f[2 * (q >> 1)], f1 = f[2 * (q >> 1) + 1];
    a[q] = pack_bf16(t < L ? d0 * f0 : 0.f, t + 1 < L ? d1 * f1 : 0.f);
  }
}
template <int NJ>
__device__ __forceinline__ void scale_tiles(float (&S)[NJ][4], float f) {
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) S[j][e] *= f;
}

template <int NW>
struct WarpTiles {
  static constexpr int BV = 16 * NW;        // V tile of a CTA
  static constexpr int LDU = BV + 8;        // [C][BV] tiles (U, dO, dDelta_local): +16 bytes per row
  static constexpr size_t big = sizeof(bf16) * C * LDD<bf16>;  // one [C][LDD] tile
  static constexpr size_t narrow = sizeof(bf16) * C * LDU;     // one [C][LDU] tile
  static constexpr size_t staging = sizeof(bf16) * NW * D * LDW;
};
// The state kernel's LEAN copies of one thread for a full chunk's [C][LDU] tile of 64 columns (U, dO) from its first
// copy (sa, g; rows rstride elements apart): load_tile_full<T, C, 64, 128>'s 4 copies, rows 16 apart.
// (The swizzled [C][D] atoms go through cp_sw128_rows<128>, gamma through cp_async4_sa.)
__device__ __forceinline__ void cp_narrow_rows(uint32_t sa, const bf16* g, int64_t rstride) {
#pragma unroll
  for (int i = 0; i < 4; ++i) cp_async16_sa(sa + i * uint32_t(16 * WarpTiles<4>::LDU * sizeof(bf16)), g + i * 16 * rstride);
}

template <int NW, int Stages>
struct WStateSmem {
  using W = WarpTiles<NW>;
  static constexpr size_t w = 0;                     // bf16 [C][LDD]
  static constexpr size_t k = w + W::big;            // bf16 [C][LDD]
  static constexpr size_t u = k + W::big;            // bf16 [C][LDU]
  static constexpr size_t gam = u + W::narrow;       // f32 [C]
  static constexpr size_t stage = gam + sizeof(float) * C;
  static constexpr size_t stg = Stages * stage;      // bf16 [NW][D][LDW] staging
  static constexpr size_t bytes = stg + W::staging;
  static_assert(stage % 16 == 0, "state_warp_kernel: stages must be 16-byte aligned");
};
// DT_GDN_SERIAL=wg4 (4 warps = one warpgroup, dk = 128, dv % 64 == 0): W and K in 128-byte-swizzled
// atoms (wgmma.cuh) at 1024-byte boundaries, each stage rounded up to 1 KB. 108 KB at two stages:
// two CTAs per SM, as the mma form.
template <int Stages>
struct WgStateSmem {
  using W = WarpTiles<4>;
  static constexpr size_t w = 0;                     // bf16 2 x [C][64] atoms
  static constexpr size_t k = w + 2 * C * 128;       // bf16 2 x [C][64] atoms
  static constexpr size_t u = k + 2 * C * 128;       // bf16 [C][LDU]
  static constexpr size_t gam = u + W::narrow;       // f32 [C]
  static constexpr size_t stage = (gam + sizeof(float) * C + 1023) / 1024 * 1024;
  static constexpr size_t stg = Stages * stage;      // bf16 [4][D][LDW] staging
  static constexpr size_t bytes = stg + W::staging;
};
// The rev kernel's wgmma form (DT_GDN_REV_WGMMA=1 with wg4): Q, K, W in swizzled atoms, dO and
// dDelta_local as in WRevSmem. 91 KB at one stage (two CTAs per SM), 158 KB at two (one).
// RP (DT_GDN_REV_P): the chunk's P [C][C] in one swizzled atom instead of dDelta_local (the kernel
// makes dDelta_local from it): 91 KB at one stage, 157 KB at two.
template <int Stages, bool RP = false>
struct WgRevSmem {
  using W = WarpTiles<4>;
  static constexpr size_t q = 0;                     // bf16 2 x [C][64] atoms
  static constexpr size_t k = q + 2 * C * 128;       // bf16 2 x [C][64] atoms
  static constexpr size_t w = k + 2 * C * 128;       // bf16 2 x [C][64] atoms
  static constexpr size_t pm = w + 2 * C * 128;      // RP: bf16 [C][64] atom, P[i][j] (MN-major B of dO^T P)
  static constexpr size_t dO = RP ? pm + C * 128 : pm;  // bf16 [C][LDU]
  static constexpr size_t ddl = dO + W::narrow;      // bf16 [C][LDU] (not RP)
  static constexpr size_t gam = RP ? ddl : ddl + W::narrow;  // f32 [2][C] (the second for rev's SP)
  static constexpr size_t stage = (gam + 2 * sizeof(float) * C + 1023) / 1024 * 1024;
  static constexpr size_t stg = Stages * stage;
  static constexpr size_t bytes = stg + W::staging;
  static_assert(pm % 1024 == 0 && stage % 1024 == 0, "swizzled atoms at 1 KB boundaries");
};
// wg4's rev kernel with K split off (DT_GDN_REV_KSPLIT, one stage): Q, W, dO, dDelta_local once;
// K and gamma twice (chunk c's and the next one's, loading a step ahead). 107 KB: two CTAs per SM,
// as the one-stage form.
struct WgRevSmemKS {
  using W = WarpTiles<4>;
  static constexpr size_t q = 0;                     // bf16 2 x [C][64] atoms
  static constexpr size_t w = q + 2 * C * 128;       // bf16 2 x [C][64] atoms
  static constexpr size_t k = w + 2 * C * 128;       // bf16 [2] x 2 x [C][64] atoms
  static constexpr size_t kbuf = 2 * C * 128;        // one K buffer
  static constexpr size_t dO = k + 2 * kbuf;         // bf16 [C][LDU], then scale e^gamma dO in place
  static constexpr size_t ddl = dO + W::narrow;      // bf16 [C][LDU]
  static constexpr size_t gam = ddl + W::narrow;     // f32 [2][C]
  static constexpr size_t stg = (gam + 2 * sizeof(float) * C + 1023) / 1024 * 1024;
  static constexpr size_t stage = stg;               // (one stage: the kernel's stage offset is 0)
  static constexpr size_t bytes = stg + W::staging;
  static_assert(q % 1024 == 0 && w % 1024 == 0 && k % 1024 == 0 && kbuf % 1024 == 0, "swizzled atoms at 1 KB boundaries");
};
template <int NW, int Stages>
struct WRevSmem {
  using W = WarpTiles<NW>;
  static constexpr size_t q = 0;                     // bf16 [C][LDD]
  static constexpr size_t k = q + W::big;            // bf16 [C][LDD]
  static constexpr size_t w = k + W::big;            // bf16 [C][LDD]
  static constexpr size_t dO = w + W::big;           // bf16 [C][LDU], then scale e^gamma dO in place
  static constexpr size_t ddl = dO + W::narrow;      // bf16 [C][LDU]
  static constexpr size_t gam = ddl + W::narrow;     // f32 [C]
  static constexpr size_t stage = gam + sizeof(float) * C;
  static constexpr size_t stg = Stages * stage;
  static constexpr size_t bytes = stg + W::staging;
  static_assert(stage % 16 == 0, "rev_warp_kernel: stages must be 16-byte aligned");
};
// 4 warps: state 2 stages 110.5 KB (two CTAs per SM); rev 1 stage 93.3 KB (two per SM), 2 stages
// 162.5 KB (one). 8 warps: state 150.5 KB, rev 2 stages 218.5 KB (one CTA per SM each).
static_assert(2 * (WStateSmem<4, 2>::bytes + kSmemReservedPerCta) <= kSmemPerSm, "4-warp state: two CTAs per SM");
static_assert(2 * (WgStateSmem<2>::bytes + kSmemReservedPerCta) <= kSmemPerSm, "wgmma state: two CTAs per SM");
static_assert(2 * (WRevSmem<4, 1>::bytes + kSmemReservedPerCta) <= kSmemPerSm, "4-warp rev: two CTAs per SM");
static_assert(2 * (WgRevSmem<1>::bytes + kSmemReservedPerCta) <= kSmemPerSm && WgRevSmem<2>::bytes <= kMaxSmem &&
                  2 * (WgRevSmem<1, true>::bytes + kSmemReservedPerCta) <= kSmemPerSm &&
                  WgRevSmem<2, true>::bytes <= kMaxSmem,
              "wgmma rev: two CTAs per SM at one stage, one at two");
static_assert(2 * (WgRevSmemKS::bytes + kSmemReservedPerCta) <= kSmemPerSm, "wgmma rev, K split: two CTAs per SM");
static_assert(WRevSmem<4, 2>::bytes <= kMaxSmem && WStateSmem<8, 2>::bytes <= kMaxSmem &&
                  WRevSmem<8, 2>::bytes <= kMaxSmem,
              "warp serial kernels: shared memory over the 227 KB opt-in limit");

// ---- state (K4), warp-owned rows: h[c] = S, Delta = U - W S, S = e^{gam_e} S + K^T (Delta (.) eL) ----
// WG (NW = 4, dk = D, every warp active): the two products of a step as wgmma with the warp's
// fragments as A (wgmma.cuh): S^T W^T as 8 m64n64k16, Delta~^T K as 4 m64n128k16, instead of 128
// mma.sync per warp and the ldmatrix loads of W and K.
template <int NW, int Stages, bool WG = false>
__global__ __launch_bounds__(32 * NW) void state_warp_kernel(Params p, const bf16* __restrict__ g_k,
                                                             const bf16* __restrict__ g_W,
                                                             const bf16* __restrict__ g_U,
                                                             const float* __restrict__ g_gam,
                                                             const float* __restrict__ g_h0,  // or null
                                                             bf16* __restrict__ g_h,          // or null
                                                             bf16* __restrict__ g_D,
                                                             float* __restrict__ g_ht) {      // or null
  extern __shared__ __align__(1024) unsigned char smem[];
  static_assert(!WG || NW == 4, "state_warp_kernel: the wgmma form is one warpgroup");
  using S = std::conditional_t<WG, WgStateSmem<Stages>, WStateSmem<NW, Stages>>;
  constexpr int NTHR = 32 * NW, BVw = WarpTiles<NW>::BV, LDU = WarpTiles<NW>::LDU;
  const SeqCta cta = seq_cta(p);  // p.nvt counts V tiles of BVw
  const int n = cta.n, h = cta.h;
  serial_pdl_trigger(p);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, mi = lane >> 3, r8 = lane & 7;
  const int v0 = cta.vt * BVw, wv = 16 * warp;  // the warp's rows: v0 + wv .. + 15
  const bool active = wv < min(BVw, p.dv - v0);  // dv % 16 == 0: a warp's rows are all valid or none
  const SeqSpan sp = seq_span(p, n);
  const int c0 = sp.c0, c1 = sp.c1, eos = sp.eos;
  const int nkk = p.dk / 16;
  const int64_t state_base = (int64_t(n) * p.Hv + h) * p.dk * p.dv + v0 + wv;
  bf16* s_stg = reinterpret_cast<bf16*>(smem + S::stg) + warp * D * LDW;

  float r_S[16][4];
  state_elems(r_S, D, 0, [&](float& x, int, int) { x = 0.f; });
  if (g_h0 && active)
    state_elems(r_S, p.dk, 0, [&](float& x, int col, int row) { x = g_h0[state_base + int64_t(col) * p.dv + row]; });

  // LEAN (wg4): a full chunk's copies from per-thread pointers made here
  // once, the same copies as load_state_tiles' full path. Per step that path recomputed them (the SASS view:
  // ~240 instructions per warp and step around 21 copies, among them an integer division for the
  // key head h / G), about a fifth of the step's instructions.
  constexpr bool LEAN = WG;
  // this thread's first copy of each tile for chunk c0 (chunk c: + (c - c0) C rows), and its shared offsets
  [[maybe_unused]] const bf16 *lw = nullptr, *lk = nullptr, *lu = nullptr;
  [[maybe_unused]] const float* lg = nullptr;
  [[maybe_unused]] uint32_t lo_sdk = 0, lo_su = 0, lo_s0 = 0;
  if constexpr (LEAN) {
    const int r = tid / 16, cc = tid % 16;                   // load_rows_sw128_full's copies of W, K
    const int ru = tid / 8, cu = (tid % 8) * 8;              // load_tile_full<T, C, 64, 128>'s of U
    const int64_t t0 = sp.bos0;
    lw = g_W + ((t0 + r) * p.Hv + h) * p.dk + 8 * cc;
    lk = g_k + ((t0 + r) * p.Hk + h / p.G) * p.dk + 8 * cc;
    lu = g_U + ((t0 + ru) * p.Hv + h) * p.dv + v0 + cu;
    lg = g_gam + (t0 + min(tid, C - 1)) * p.Hv + h;
    lo_sdk = (cc >> 3) * (C * 128) + wg::sw128(r, cc & 7);
    lo_su = (ru * LDU + cu) * sizeof(bf16);
    lo_s0 = smem_addr(smem);
  }
  auto issue = [&](int c, int st) {
    if constexpr (LEAN) {
      if (eos - sp.bos(c) >= C) {
        const int dc = c - c0;
        const uint32_t sb = lo_s0 + st * uint32_t(S::stage);
        const int64_t rw = int64_t(p.Hv) * p.dk, rk = int64_t(p.Hk) * p.dk, ru = int64_t(p.Hv) * p.dv;  // row strides
        const bf16* gw = lw + dc * (C * rw);
        const bf16* gk = lk + dc * (C * rk);
        const bf16* gu = lu + dc * (C * ru);
        cp_sw128_rows<NTHR>(sb + uint32_t(S::w) + lo_sdk, gw, rw);
        cp_sw128_rows<NTHR>(sb + uint32_t(S::k) + lo_sdk, gk, rk);
        cp_narrow_rows(sb + uint32_t(S::u) + lo_su, gu, ru);
        if (tid < C) cp_async4_sa(sb + uint32_t(S::gam) + 4 * tid, lg + dc * (C * p.Hv));
        return;
      }
    }
    load_state_tiles<S, BVw, NTHR, WG>(smem + st * S::stage, p, sp.bos(c), eos, h, v0, min(BVw, p.dv - v0), LDU, g_k, g_W,
                                       g_U, g_gam, tid);
  };

  if constexpr (Stages == 2) {
    if (c0 < c1) issue(c0, 0);
    cp_commit();
  }
  for (int c = c0; c < c1; ++c) {
    int st = 0;
    if constexpr (Stages == 2) {
      st = (c - c0) & 1;
      cp_wait<0>();
      if constexpr (WG) wg::fence_proxy_async();  // the tiles are read by the tensor cores' async proxy
      __syncthreads();  // stage st visible; every warp done with stage st ^ 1 (chunk c - 1)
      if (c + 1 < c1) issue(c + 1, st ^ 1);
      cp_commit();
    } else {
      __syncthreads();
      issue(c, 0);
      cp_commit();
      cp_wait<0>();
      if constexpr (WG) wg::fence_proxy_async();
      __syncthreads();
    }
    if (!WG && !active) continue;  // WG: the host launches it with every warp active
    const unsigned char* base = smem + st * S::stage;
    const bf16* s_w = reinterpret_cast<const bf16*>(base + S::w);
    const bf16* s_k = reinterpret_cast<const bf16*>(base + S::k);
    const bf16* s_u = reinterpret_cast<const bf16*>(base + S::u);
    const float* s_gam = reinterpret_cast<const float*>(base + S::gam);
    const int64_t bos = sp.bos(c);
    const int L = min(C, eos - int(bos));
    const float gam_e = s_gam[L - 1];
    // One chunk step; F: a full chunk with dk = D, where every bound below is a constant (no
    // branches on L or dk in the unrolled products). The same operations either way.
    auto step = [&](auto full) {
      constexpr bool F = decltype(full)::value;
      const int Lc = F ? C : L;
      [[maybe_unused]] const int nk = F ? D / 16 : nkk;

      // 1. h[c] = S (staged), X = S^T W^T  [16, C]
      float r_X[8][4];
      if constexpr (WG) {  // all 64 token columns (W's rows >= L are zero)
        wg_state_times_rows_t(r_X, r_S, s_w, s_stg, g_h != nullptr, lane);
      } else {
        state_times_rows_t(r_X, r_S, s_w, Lc, nk, g_h ? s_stg : nullptr);
      }
      uint32_t r_u[4][4];  // step 2's U fragments, read before the h store (its smem reads wait behind them)
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) ldsm_x4_t(r_u[jj], s_u + (16 * jj + r8 + (mi >> 1) * 8) * LDU + wv + (mi & 1) * 8);
      if (g_h) {
        bf16* g = g_h + (int64_t(c) * p.Hv + h) * p.dk * p.dv + v0 + wv;
        if constexpr (F) stage_out<D, 8>(s_stg, g, p.dv, lane);
        else stage_out(s_stg, g, p.dv, p.dk, lane);
      }

      // 2. Delta^T = U^T - X (stored, t < L); Delta~^T = Delta^T e^{gam_e - gam_t} (0 for t >= L) as A fragments
      uint32_t a2[4][4];
      {
        const int tq = lane & 3;
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          uint32_t d[4];
          delta_frags(d, a2[jj], r_u[jj], r_X[2 * jj], r_X[2 * jj + 1], s_gam, gam_e, jj, tq, Lc);
          stsm_x4_t(stage_row(s_stg, jj, lane), d);
        }
      }
      if constexpr (F)
        stage_out<C, 4>(s_stg, g_D + (bos * p.Hv + h) * p.dv + v0 + wv, int64_t(p.Hv) * p.dv, lane);
      else stage_out(s_stg, g_D + (bos * p.Hv + h) * p.dv + v0 + wv, int64_t(p.Hv) * p.dv, Lc, lane);

      // 3. S^T = e^{gam_e} S^T + Delta~^T K
      scale_tiles(r_S, gexp(gam_e));
      if constexpr (WG) {  // all four token k-steps: a2 is 0 past L and K's rows >= L are zero (+= 0 exactly)
        wg::issue_mn_n128(r_S, a2, smem_addr(s_k), C * 128, true);
        wg::wait_acc(r_S);
      } else {
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          if (16 * jj >= Lc) break;
          add_times_rows(r_S, a2[jj], s_k, jj, nk);
        }
      }
    };
    if (L == C && nkk == D / 16) step(std::true_type{});
    else step(std::false_type{});
  }
  if (g_ht && active)
    state_elems(r_S, p.dk, 0, [&](float& x, int col, int row) { g_ht[state_base + int64_t(col) * p.dv + row] = x; });
  serial_done(p, n);
}

// ---- rev (B4), warp-owned rows: dS1[c] = dS; dDelta = dDelta_local + eL (.) (K dS);
//      dS = e^{gam_e} dS + Q^T (scale e^gamma (.) dO) - W^T dDelta;  dh0 = dS ---------------------
// WG (NW = 4, dk = D, every warp active; DT_GDN_REV_WGMMA=1): the three products of a step as
// wgmma, as the state kernel's: dS^T K^T as 8 m64n64k16 (K-major B), then dO~^T Q and -dDelta^T W as
// 4 + 4 m64n128k16 (MN-major B) in the same order as the mma form.
// KS (DT_GDN_REV_KSPLIT, wg4 with one stage only): K and gamma double-buffered and loaded a step
// ahead; Q, W, dO and dDelta_local loaded at the step's start and awaited after step 1 (WgRevSmemKS,
// load_rev_k / load_rev_tiles without K): the first product no longer waits for the whole chunk's tiles.
// RP (DT_GDN_REV_P, WG without KS): dDelta_local^T = scale dO^T P made here, as 4 m64n64k16 with P
// (g_P [NT, Hv, C, C], the forward's or dvl's) as MN-major B, accumulated onto step 1's product
// after its decay (so dDelta_local is never rounded to bf16, stored or loaded): dDelta^T =
// scale (X e^{gam_e - gam_t} / scale + dO^T P). Not warp4's bits (dvl rounds dDelta_local to bf16).
// WG forms scale dO~ = scale e^gamma dO in the A fragments (registers) instead of in shared memory:
// the same roundings, so the same bits.
template <int NW, int Stages, bool WG = false, bool KS = false, bool RP = false>
__global__ __launch_bounds__(32 * NW) void rev_warp_kernel(Params p, const bf16* __restrict__ g_q,
                                                           const bf16* __restrict__ g_k,
                                                           const bf16* __restrict__ g_W,
                                                           const float* __restrict__ g_gam,
                                                           const bf16* __restrict__ g_do,
                                                           const bf16* __restrict__ g_dDl,
                                                           const float* __restrict__ g_dht,  // or null
                                                           bf16* __restrict__ g_dS1, bf16* __restrict__ g_dD,
                                                           float* __restrict__ g_dh0,        // or null
                                                           const bf16* __restrict__ g_P) {   // RP, else null
  extern __shared__ __align__(1024) unsigned char smem[];
  static_assert(!WG || NW == 4, "rev_warp_kernel: the wgmma form is one warpgroup");
  static_assert(!KS || (WG && Stages == 1), "rev_warp_kernel: K split is a form of wg4's one-stage kernel");
  static_assert(!RP || (WG && !KS), "rev_warp_kernel: RP is a form of wg4's kernel without K split");
  using S = std::conditional_t<KS, WgRevSmemKS,
                               std::conditional_t<WG, WgRevSmem<Stages, RP>, WRevSmem<NW, Stages>>>;
  constexpr int NTHR = 32 * NW, BVw = WarpTiles<NW>::BV, LDU = WarpTiles<NW>::LDU;
  const SeqCta cta = seq_cta(p);
  const int n = cta.n, h = cta.h;
  serial_pdl_trigger(p);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, mi = lane >> 3, r8 = lane & 7;
  const int v0 = cta.vt * BVw, wv = 16 * warp, nv = min(BVw, p.dv - v0);
  const bool active = wv < nv;
  const int c0 = p.chunk_off[n], c1 = p.chunk_off[n + 1], eos = p.cu[n + 1];
  const int nkk = p.dk / 16;
  const int64_t state_base = (int64_t(n) * p.Hv + h) * p.dk * p.dv + v0 + wv;
  bf16* s_stg = reinterpret_cast<bf16*>(smem + S::stg) + warp * D * LDW;

  float r_dS[16][4];
  state_elems(r_dS, D, 0, [&](float& x, int, int) { x = 0.f; });
  if (g_dht && active)
    state_elems(r_dS, p.dk, 0, [&](float& x, int col, int row) { x = g_dht[state_base + int64_t(col) * p.dv + row]; });

  constexpr size_t kKbuf = [] {  // KS: the distance between the two K buffers
    if constexpr (KS) return S::kbuf;
    else return size_t(0);
  }();
  [[maybe_unused]] auto issue = [&](int c, int st) {  // SP issues its own two groups
    load_rev_tiles<S, BVw, NTHR, WG, true, RP>(smem + st * S::stage, p, p.chunk_start[c], eos, h, v0, nv, LDU, g_q,
                                               g_k, g_W, g_do, g_dDl, g_gam, tid,
                                               RP ? g_P + (int64_t(c) * p.Hv + h) * C * C : nullptr);
  };

  if constexpr (Stages == 2) {
    if (c0 < c1) issue(c1 - 1, 0);
    cp_commit();
  }
  if constexpr (KS) {  // chunk c1 - 1's K and gamma; in the loop, chunk c's K is in buffer c & 1
    if (c0 < c1) load_rev_k<S, BVw, NTHR>(smem, (c1 - 1) & 1, p, p.chunk_start[c1 - 1], eos, h, g_k, g_gam, tid);
    cp_commit();
  }
  // SP (wg4 with one stage and P): group A of chunk c (K, P, dO, gamma) is issued in step c + 1 once
  // its first products have read those tiles, group B (Q, W) at step c's start, awaited only before
  // its last product; gamma alternates between two buffers (c & 1), as step c still reads its own
  // when group A of chunk c - 1 lands. The same copies and arithmetic as one load_rev_tiles.
  constexpr bool SP = WG && RP && Stages == 1 && !KS;
  [[maybe_unused]] auto issue_a = [&](int c) {
    if constexpr (SP)
      load_rev_group_a<S, BVw, NTHR>(smem, p, p.chunk_start[c], eos, h, v0, nv, LDU, g_k, g_do, g_gam,
                                     g_P + (int64_t(c) * p.Hv + h) * C * C, c & 1, tid);
  };
  if constexpr (SP) {
    if (c0 < c1) issue_a(c1 - 1);
    cp_commit();
  }
  for (int c = c1 - 1; c >= c0; --c) {
    const int st = Stages == 2 ? (c1 - 1 - c) & 1 : 0;
    if constexpr (SP) {
      __syncthreads();  // every warp is done with chunk c + 1's Q and W (its last product)
      load_rev_group_b<S, NTHR>(smem, p, p.chunk_start[c], eos, h, g_q, g_W, tid);
      cp_commit();
      cp_wait<1>();  // chunk c's group A (committed in step c + 1); group B may pend
    } else if constexpr (KS) {
      __syncthreads();  // every warp is done with chunk c + 1 (its Q, W, dO, dDelta_local and K buffer)
      load_rev_tiles<S, BVw, NTHR, true, false>(smem, p, p.chunk_start[c], eos, h, v0, nv, LDU, g_q, g_k, g_W, g_do,
                                                g_dDl, g_gam, tid);
      cp_commit();
      if (c > c0) load_rev_k<S, BVw, NTHR>(smem, (c - 1) & 1, p, p.chunk_start[c - 1], eos, h, g_k, g_gam, tid);
      cp_commit();
      cp_wait<2>();  // chunk c's K and gamma (committed a step ahead); the two groups above may pend
    } else if constexpr (Stages == 1) {
      __syncthreads();  // every warp is done with the previous chunk's tiles
      issue(c, 0);
      cp_commit();
    }
    if constexpr (!KS && !SP) cp_wait<0>();
    if constexpr (WG) wg::fence_proxy_async();  // Q, K, W are read by the tensor cores' async proxy
    __syncthreads();  // stage st visible; with 2 stages also: every warp is done with chunk c + 1
    if constexpr (Stages == 2) {
      if (c > c0) issue(c - 1, st ^ 1);
      cp_commit();
    }
    if (!WG && !active) continue;  // WG: the host launches it with every warp active
    unsigned char* base = smem + st * S::stage;
    const int kb = KS || SP ? (c & 1) : 0;  // KS: chunk c's K and gamma buffer; SP: its gamma buffer
    const bf16* s_q = reinterpret_cast<const bf16*>(base + S::q);
    const bf16* s_k = reinterpret_cast<const bf16*>(base + S::k + kb * kKbuf);
    const bf16* s_w = reinterpret_cast<const bf16*>(base + S::w);
    bf16* s_do = reinterpret_cast<bf16*>(base + S::dO);
    [[maybe_unused]] const bf16* s_ddl = reinterpret_cast<const bf16*>(base + S::ddl);
    const float* s_gam = reinterpret_cast<const float*>(base + S::gam) + kb * C;
    const int64_t bos = p.chunk_start[c];
    const int L = min(C, eos - int(bos));
    const float gam_e = s_gam[L - 1];

    // One chunk step; F: a full chunk with dk = D (constant bounds, as in state_warp_kernel).
    auto step = [&](auto full) {
      constexpr bool F = decltype(full)::value;
      const int Lc = F ? C : L;
      [[maybe_unused]] const int nk = F ? D / 16 : nkk;

      // 1. dS1[c] = dS (staged), X = dS^T K^T  [16, C]
      float r_X[8][4];
      if constexpr (WG) {  // all 64 token columns (K's rows >= L are zero)
        wg_state_times_rows_t(r_X, r_dS, s_k, s_stg, true, lane);
      } else {
        state_times_rows_t(r_X, r_dS, s_k, Lc, nk, s_stg);
      }
      // The loop form of stage_out here: the grouped one (stage_out<D, 4>, and <C, 4> for dDelta below)
      // measured this kernel 822 -> 1357 us under ncu (v0.23.0; its SASS then waited on long
      // scoreboard all through the step), while it took the state kernel's h store from its stalls.
      stage_out(s_stg, g_dS1 + (int64_t(c) * p.Hv + h) * p.dk * p.dv + v0 + wv, p.dv, p.dk, lane);
      if constexpr (KS) {  // now the rest of chunk c's tiles (the K group of chunk c - 1 may pend)
        cp_wait<1>();
        wg::fence_proxy_async();
        __syncthreads();
      }
      // WG: dO^T's A fragments (k-step jj: tokens 16 jj .. 16 jj + 15), unscaled; RP needs them now
      [[maybe_unused]] uint32_t a_do[4][4];
      [[maybe_unused]] auto load_a_do = [&] {
#pragma unroll
        for (int jj = 0; jj < 4; ++jj)
          ldsm_x4_t(a_do[jj], s_do + (16 * jj + r8 + (mi >> 1) * 8) * LDU + wv + (mi & 1) * 8);
      };
      if constexpr (RP) {  // 1b. X <- X e^{gam_e - gam_t} / scale (0 for t >= L) + dO^T P
        const int tq = lane & 3;
        const float inv_scale = 1.f / p.scale;
        load_a_do();
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          float f[4];
          decay_to_end(f, s_gam, gam_e, jj, tq, Lc);
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            float* x = r_X[2 * jj + (q >> 1)] + 2 * (q & 1);
            x[0] *= f[2 * (q >> 1)] * inv_scale;
            x[1] *= f[2 * (q >> 1) + 1] * inv_scale;
          }
        }
        const uint32_t pb = smem_addr(base + S::pm);
        wg::wg_fence();
#pragma unroll
        for (int jj = 0; jj < 4; ++jj)
          wg::m64n64k16_rs<1>(r_X, a_do[jj], wg::desc_sw128(pb + jj * 2048, C * 128, 1024), 1);
        wg::wg_commit();
        wg::wg_hold(r_X);
        wg::wg_wait<0>();
        wg::wg_hold(r_X);
        if constexpr (SP) {
          __syncthreads();  // every warp is past chunk c's K, P and dO (dO^T's fragments are in a_do)
          if (c > c0) issue_a(c - 1);
          cp_commit();
        }
      }

      // 2. dDelta^T = dDelta_local^T + (t < L ? X e^{gam_e - gam_t} : 0) (stored, t < L); -dDelta^T as A fragments
      uint32_t a3[4][4];
      {
        const int tq = lane & 3;
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          uint32_t d[4];
          if constexpr (RP) {
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              const float* x = r_X[2 * jj + (q >> 1)] + 2 * (q & 1);
              const int t = 16 * jj + 8 * (q >> 1) + 2 * tq;
              const float d0 = t < Lc ? p.scale * x[0] : 0.f, d1 = t + 1 < Lc ? p.scale * x[1] : 0.f;
              d[q] = pack_bf16(d0, d1);
              a3[jj][q] = pack_bf16(-d0, -d1);
            }
          } else {
            uint32_t dl[4];
            ldsm_x4_t(dl, s_ddl + (16 * jj + r8 + (mi >> 1) * 8) * LDU + wv + (mi & 1) * 8);
            float f[4];
            decay_to_end(f, s_gam, gam_e, jj, tq, Lc);
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              const float* x = r_X[2 * jj + (q >> 1)] + 2 * (q & 1);
              const int t = 16 * jj + 8 * (q >> 1) + 2 * tq;
              const float f0 = f[2 * (q >> 1)], f1 = f[2 * (q >> 1) + 1];
              // __fmul_rn: never contracted into an FMA with the add (a full chunk has no select in
              // between), so the sum rounds as the tiled kernel's does
              const float d0 = bf16_lo(dl[q]) + (t < Lc ? __fmul_rn(x[0], f0) : 0.f);
              const float d1 = bf16_hi(dl[q]) + (t + 1 < Lc ? __fmul_rn(x[1], f1) : 0.f);
              d[q] = pack_bf16(d0, d1);
              a3[jj][q] = pack_bf16(-d0, -d1);
            }
          }
          stsm_x4_t(stage_row(s_stg, jj, lane), d);
        }
      }
      stage_out(s_stg, g_dD + (bos * p.Hv + h) * p.dv + v0 + wv, int64_t(p.Hv) * p.dv, Lc, lane);

      // 3. dO~ = scale e^{gam_t} dO (0 for t >= L): WG in a_do (the factors of the 64 tokens through
      // the warp's staging tile, free until the next step), else this warp's 16 columns in place
      if constexpr (WG) {
        if constexpr (!RP) load_a_do();
        float* s_f = reinterpret_cast<float*>(s_stg);
        for (int r = lane; r < C; r += 32) s_f[r] = r < Lc ? p.scale * gexp(s_gam[r]) : 0.f;
        __syncwarp();
        const int tq = lane & 3;
#pragma unroll
        for (int jj = 0; jj < 4; ++jj)
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const float2 f = *reinterpret_cast<const float2*>(s_f + 16 * jj + 8 * (q >> 1) + 2 * tq);
            a_do[jj][q] = pack_bf16(bf16_lo(a_do[jj][q]) * f.x, bf16_hi(a_do[jj][q]) * f.y);
          }
      } else {
        for (int it = lane; it < 2 * C; it += 32) {
          const int r = it >> 1, cc = wv + 8 * (it & 1);
          const float f = r < Lc ? p.scale * gexp(s_gam[r]) : 0.f;
          uint4* pd = reinterpret_cast<uint4*>(s_do + r * LDU + cc);
          uint4 x = *pd;
          bf16* ex = reinterpret_cast<bf16*>(&x);
#pragma unroll
          for (int e = 0; e < 8; ++e) ex[e] = from_f<bf16>(to_f(ex[e]) * f);
          *pd = x;
        }
        __syncwarp();
      }

      // 4. dS^T = e^{gam_e} dS^T + dO~^T Q - dDelta^T W (all of the Q part first, as the tiled kernel)
      if constexpr (SP) {
        cp_wait<1>();  // chunk c's Q and W (group A of chunk c - 1 may pend)
        wg::fence_proxy_async();
        __syncthreads();
      }
      scale_tiles(r_dS, gexp(gam_e));
      if constexpr (WG) {  // all four token k-steps: dO~ and dDelta are 0 past L, Q's and W's rows zero
        const uint32_t qb = smem_addr(s_q), wb = smem_addr(s_w);
        wg::wg_fence();
#pragma unroll
        for (int jj = 0; jj < 4; ++jj)
          wg::m64n128k16_rs_tb(r_dS, a_do[jj], wg::desc_sw128(qb + jj * 2048, C * 128, 1024), 1);
#pragma unroll
        for (int jj = 0; jj < 4; ++jj)
          wg::m64n128k16_rs_tb(r_dS, a3[jj], wg::desc_sw128(wb + jj * 2048, C * 128, 1024), 1);
        wg::wg_commit();
        wg::wg_hold(r_dS);
        wg::wg_wait<0>();
        wg::wg_hold(r_dS);
      } else {
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          if (16 * jj >= Lc) break;
          uint32_t a[4];
          ldsm_x4_t(a, s_do + (16 * jj + r8 + (mi >> 1) * 8) * LDU + wv + (mi & 1) * 8);
          add_times_rows(r_dS, a, s_q, jj, nk);
        }
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          if (16 * jj >= Lc) break;
          add_times_rows(r_dS, a3[jj], s_w, jj, nk);
        }
      }
    };
    if (L == C && nkk == D / 16) step(std::true_type{});
    else step(std::false_type{});
  }
  if (g_dh0 && active)
    state_elems(r_dS, p.dk, 0, [&](float& x, int col, int row) { g_dh0[state_base + int64_t(col) * p.dv + row] = x; });
  serial_done(p, n);
}
