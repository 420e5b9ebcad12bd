// Internal to gdn_chunk.cu (included inside its gck namespace, after gdn_serial_warp.cuh, whose
// fragment helpers it uses): the serial kernels (state K4, rev B4) with G warps per 16 rows of
// the transposed state, bf16, dk = D (128) only.
//
// The warp-owned form gives each warp 16 rows of S^T [dv, dk] with all dk columns. At bench-0.8b
// that is one warp per scheduler and a chunk step of ~1000 dependent instructions (128 MMAs): the
// longest sequence's chain of steps is the kernel's time (docs/perf.md v0.8.0). Here the G warps
// of a row group share the 16 rows; warp g holds the dk slice [g DS, (g + 1) DS), DS = D / G:
//   1. X_g [16, C] = bf16(S^T_g) W_g^T                 the slice's part of X = S^T W^T
//   2. reduce-scatter: the owner of token tiles [g JT, (g + 1) JT) (JT = 4 / G) adds the G
//      partials in slice order 0..G-1, forms Delta^T = U^T - X there (stores Delta) and
//      Delta~^T = Delta^T e^{gam_e - gam_t}, and publishes Delta~^T's A fragments
//   3. S^T_g = e^{gam_e} S^T_g + Delta~^T K_g          all token k-steps, the slice's columns
// with two named barriers of the group's 32 G threads a step (partials written; fragments
// written). Per warp: 128 / G MMAs and 1 / G of the element-wise work, and 4 G warps per CTA to
// hide each other's latency. The reverse pass splits the same way (X = dS^T K^T reduce-scattered,
// dDelta formed by the owners, then dS^T_g += dO~^T Q_g - dDelta^T W_g).
//
// Products 3 (and the reverse pass's dS update) are the warp form's per output element: the same
// operands give the same sums. Product 1's sum over dk is split in G and added in a fixed order:
// deterministic, but not the other forms' bits; the tests compare with a tolerance.
//
// Shared memory per row group: partials float4 [G src][4 jj][2 halves][32 lanes] (G KB x 4) and
// Delta~ / -dDelta A fragments uint4 [4 jj][32 lanes] (2 KB). Hazards: a step writes the partials
// before its first barrier and reads them before its second, so the next step's writes (after
// the second) never meet a read; the fragments likewise between the first barrier and the next
// step's first.

template <int G>
struct SplitTiles {
  static_assert(G == 2 || G == 4, "split serial kernels: G = 2 or 4 warps per 16 state rows");
  static constexpr int R = 4;                           // row groups: a V tile of 64 columns
  static constexpr int NW = R * G, NTHR = 32 * NW;
  static constexpr int BV = 16 * R, LDU = BV + 8;
  static constexpr int DS = D / G, NJ = DS / 8, JT = 4 / G;  // dk slice, its n-tiles, owned token tiles
  static constexpr size_t big = sizeof(bf16) * C * LDD<bf16>;  // one [C][LDD] tile
  static constexpr size_t narrow = sizeof(bf16) * C * LDU;     // one [C][LDU] tile
  static constexpr size_t xbuf = sizeof(float4) * R * G * 8 * 32;
  static constexpr size_t abuf = sizeof(uint4) * R * 4 * 32;
  static constexpr size_t staging = sizeof(bf16) * NW * DS * LDW;  // h / dS1 slices, then owned Delta rows
  static_assert(16 * JT <= DS, "split serial kernels: the staging tile holds the owned token rows");
};

template <int G, int Stages>
struct SStateSmem {
  using W = SplitTiles<G>;
  static constexpr size_t w = 0;                // bf16 [C][LDD]
  static constexpr size_t k = w + W::big;       // bf16 [C][LDD]
  static constexpr size_t u = k + W::big;       // bf16 [C][LDU]
  static constexpr size_t gam = u + W::narrow;  // f32 [C]
  static constexpr size_t stage = gam + sizeof(float) * C;
  static constexpr size_t xb = Stages * stage;
  static constexpr size_t ab = xb + W::xbuf;
  static constexpr size_t stg = ab + W::abuf;
  static constexpr size_t bytes = stg + W::staging;
  static_assert(stage % 16 == 0, "state_split_kernel: stages must be 16-byte aligned");
};
template <int G, int Stages>
struct SRevSmem {
  using W = SplitTiles<G>;
  static constexpr size_t q = 0;                 // bf16 [C][LDD]
  static constexpr size_t k = q + W::big;        // bf16 [C][LDD]
  static constexpr size_t w = k + W::big;        // bf16 [C][LDD]
  static constexpr size_t dO = w + W::big;       // bf16 [C][LDU], then scale e^gamma dO in place
  static constexpr size_t ddl = dO + W::narrow;  // bf16 [C][LDU]
  static constexpr size_t gam = ddl + W::narrow; // f32 [C]
  static constexpr size_t stage = gam + sizeof(float) * C;
  static constexpr size_t xb = Stages * stage;
  static constexpr size_t ab = xb + W::xbuf;
  static constexpr size_t stg = ab + W::abuf;
  static constexpr size_t bytes = stg + W::staging;
  static_assert(stage % 16 == 0, "rev_split_kernel: stages must be 16-byte aligned");
};
// state: G = 2 150.5 KB, G = 4 182.5 KB (two stages); rev: G = 2 two stages 202.5 KB, G = 4 one
// stage 165.3 KB (two would be 234.5 KB). One CTA per SM each.
static_assert(SStateSmem<2, 2>::bytes <= kMaxSmem && SStateSmem<4, 2>::bytes <= kMaxSmem &&
                  SRevSmem<2, 2>::bytes <= kMaxSmem && SRevSmem<4, 1>::bytes <= kMaxSmem,
              "split serial kernels: shared memory over the 227 KB opt-in limit");

// Named barrier of the nthr threads of a row group (ids 1.., 0 is __syncthreads).
__device__ __forceinline__ void group_sync(int id, int nthr) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(nthr) : "memory");
}
// fp32 state [dk, dv] (h0, dht, ht, dh0) <-> a warp's fragments of its slice (dk columns k0..).
template <int NJ, class F>
__device__ __forceinline__ void slice_elems(float (&r)[NJ][4], int k0, F&& f) {
  const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) f(r[j][e], k0 + 8 * j + 2 * tq + (e & 1), g + 8 * (e >> 1));
}
// Step 2's reduce-scatter of the group's partial X [16, C]: every warp writes its token tiles
// below L, then the owner of tiles [sl JT, (sl + 1) JT) sums their G partials in slice order into
// Xo (tile jl: n-tiles 2 jl, 2 jl + 1). xb: the group's partials.
template <int G>
__device__ __forceinline__ void reduce_scatter(float (&Xo)[2 * (4 / G)][4], const float (&X)[8][4], float4* xb,
                                               int sl, int L, int bar) {
  constexpr int JT = 4 / G;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int jj = 0; jj < 4; ++jj) {
    if (16 * jj >= L) break;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float* x = X[2 * jj + hh];
      xb[((sl * 4 + jj) * 2 + hh) * 32 + lane] = make_float4(x[0], x[1], x[2], x[3]);
    }
  }
  group_sync(bar, 32 * G);
#pragma unroll
  for (int jl = 0; jl < JT; ++jl) {
    const int jj = sl * JT + jl;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
      if (16 * jj < L) {
        s = xb[(jj * 2 + hh) * 32 + lane];  // slice 0
#pragma unroll
        for (int src = 1; src < G; ++src) {
          const float4 v = xb[((src * 4 + jj) * 2 + hh) * 32 + lane];
          s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
        }
      }
      Xo[2 * jl + hh][0] = s.x, Xo[2 * jl + hh][1] = s.y, Xo[2 * jl + hh][2] = s.z, Xo[2 * jl + hh][3] = s.w;
    }
  }
}
// After the second barrier: the A fragments of token tiles below L (published by their owners).
__device__ __forceinline__ void gather_frags(uint32_t (&a)[4][4], const uint4* ab, int L) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int jj = 0; jj < 4; ++jj) {
    if (16 * jj >= L) break;
    const uint4 v = ab[jj * 32 + lane];
    a[jj][0] = v.x, a[jj][1] = v.y, a[jj][2] = v.z, a[jj][3] = v.w;
  }
}

// ---- state (K4), G warps per 16 rows: h[c] = S, Delta = U - W S, S = e^{gam_e} S + K^T (Delta (.) eL) ----
template <int G, int Stages>
__global__ __launch_bounds__(SplitTiles<G>::NTHR) void state_split_kernel(Params p, const bf16* __restrict__ g_k,
                                                                           const bf16* __restrict__ g_W,
                                                                           const bf16* __restrict__ g_U,
                                                                           const float* __restrict__ g_gam,
                                                                           const float* __restrict__ g_h0,  // or null
                                                                           bf16* __restrict__ g_h,          // or null
                                                                           bf16* __restrict__ g_D,
                                                                           float* __restrict__ g_ht) {      // or null
  extern __shared__ __align__(16) unsigned char smem[];
  using S = SStateSmem<G, Stages>;
  using W = SplitTiles<G>;
  constexpr int BV = W::BV, LDU = W::LDU, DS = W::DS, NJ = W::NJ, JT = W::JT;
  const SeqCta cta = seq_cta(p);  // p.nvt counts V tiles of BV
  const int n = cta.n, h = cta.h;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, mi = lane >> 3, r8 = lane & 7, tq = lane & 3;
  const int grp = warp / G, sl = warp % G, bar = 1 + grp;  // row group, dk slice, its barrier
  const int v0 = cta.vt * BV, wv = 16 * grp, k0 = sl * DS;
  const bool active = wv < min(BV, p.dv - v0);  // dv % 16 == 0: a group's rows are all valid or none
  const SeqSpan sp = seq_span(p, n);
  const int c0 = sp.c0, c1 = sp.c1, eos = sp.eos;
  const int64_t state_base = (int64_t(n) * p.Hv + h) * p.dk * p.dv + v0 + wv;
  bf16* s_stg = reinterpret_cast<bf16*>(smem + S::stg) + warp * DS * LDW;
  float4* s_xb = reinterpret_cast<float4*>(smem + S::xb) + grp * G * 8 * 32;
  uint4* s_ab = reinterpret_cast<uint4*>(smem + S::ab) + grp * 4 * 32;

  float r_S[NJ][4];  // S^T rows v0 + wv + lane / 4 (+ 8), dk columns k0 + 8 j + 2 (lane % 4) (+ 1)
  zero_tiles(r_S);
  if (g_h0 && active)
    slice_elems(r_S, k0, [&](float& x, int col, int row) { x = g_h0[state_base + int64_t(col) * p.dv + row]; });

  auto issue = [&](int c, int st) {
    load_state_tiles<S, BV, W::NTHR>(smem + st * S::stage, p, sp.bos(c), eos, h, v0, min(BV, p.dv - v0), LDU, g_k, g_W, g_U,
                                     g_gam, tid);
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
      __syncthreads();  // stage st visible; every warp done with stage st ^ 1 (chunk c - 1)
      if (c + 1 < c1) issue(c + 1, st ^ 1);
      cp_commit();
    } else {
      __syncthreads();
      issue(c, 0);
      cp_commit();
      cp_wait<0>();
      __syncthreads();
    }
    if (!active) continue;  // the whole group: its named barriers are skipped together
    const unsigned char* base = smem + st * S::stage;
    const bf16* s_w = reinterpret_cast<const bf16*>(base + S::w);
    const bf16* s_k = reinterpret_cast<const bf16*>(base + S::k);
    const bf16* s_u = reinterpret_cast<const bf16*>(base + S::u);
    const float* s_gam = reinterpret_cast<const float*>(base + S::gam);
    const int64_t bos = sp.bos(c);
    const int L = min(C, eos - int(bos));
    const float gam_e = s_gam[L - 1];
    auto step = [&](auto full) {  // full: L = C, constant bounds (as in state_warp_kernel)
      constexpr bool F = decltype(full)::value;
      const int Lc = F ? C : L;

      // 1. h[c] = S (this slice, staged), X_g = S^T_g W_g^T  [16, C]
      float r_X[8][4];
      state_times_rows_t(r_X, r_S, s_w + k0, Lc, NJ / 2, g_h ? s_stg : nullptr);
      if (g_h) stage_out(s_stg, g_h + (int64_t(c) * p.Hv + h) * p.dk * p.dv + int64_t(k0) * p.dv + v0 + wv, p.dv, DS,
                         lane);

      // 2. X of the owned token tiles; Delta^T = U^T - X there (stored, t < L), Delta~^T as A fragments
      float r_Xo[2 * JT][4];
      reduce_scatter<G>(r_Xo, r_X, s_xb, sl, Lc, bar);
#pragma unroll
      for (int jl = 0; jl < JT; ++jl) {
        const int jj = sl * JT + jl;
        if (16 * jj >= Lc) break;
        uint32_t u[4], d[4], a[4];
        ldsm_x4_t(u, s_u + (16 * jj + r8 + (mi >> 1) * 8) * LDU + wv + (mi & 1) * 8);
        delta_frags(d, a, u, r_Xo[2 * jl], r_Xo[2 * jl + 1], s_gam, gam_e, jj, tq, Lc);
        stsm_x4_t(stage_row(s_stg, jl, lane), d);
        s_ab[jj * 32 + lane] = make_uint4(a[0], a[1], a[2], a[3]);
      }
      const int t0 = 16 * JT * sl, rows = min(16 * JT, Lc - t0);
      if (rows > 0) stage_out(s_stg, g_D + ((bos + t0) * p.Hv + h) * p.dv + v0 + wv, int64_t(p.Hv) * p.dv, rows, lane);
      group_sync(bar, 32 * G);

      // 3. S^T_g = e^{gam_e} S^T_g + Delta~^T K_g
      uint32_t a2[4][4];
      gather_frags(a2, s_ab, Lc);
      scale_tiles(r_S, gexp(gam_e));
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        if (16 * jj >= Lc) break;
        add_times_rows(r_S, a2[jj], s_k + k0, jj, NJ / 2);
      }
    };
    if (L == C) step(std::true_type{});
    else step(std::false_type{});
  }
  if (g_ht && active)
    slice_elems(r_S, k0, [&](float& x, int col, int row) { g_ht[state_base + int64_t(col) * p.dv + row] = x; });
}

// ---- rev (B4), G warps per 16 rows: dS1[c] = dS; dDelta = dDelta_local + eL (.) (K dS);
//      dS = e^{gam_e} dS + Q^T (scale e^gamma (.) dO) - W^T dDelta;  dh0 = dS ---------------------
template <int G, int Stages>
__global__ __launch_bounds__(SplitTiles<G>::NTHR) void rev_split_kernel(Params p, const bf16* __restrict__ g_q,
                                                                         const bf16* __restrict__ g_k,
                                                                         const bf16* __restrict__ g_W,
                                                                         const float* __restrict__ g_gam,
                                                                         const bf16* __restrict__ g_do,
                                                                         const bf16* __restrict__ g_dDl,
                                                                         const float* __restrict__ g_dht,  // or null
                                                                         bf16* __restrict__ g_dS1,
                                                                         bf16* __restrict__ g_dD,
                                                                         float* __restrict__ g_dh0) {      // or null
  extern __shared__ __align__(16) unsigned char smem[];
  using S = SRevSmem<G, Stages>;
  using W = SplitTiles<G>;
  constexpr int BV = W::BV, LDU = W::LDU, DS = W::DS, NJ = W::NJ, JT = W::JT;
  const SeqCta cta = seq_cta(p);
  const int n = cta.n, h = cta.h;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, mi = lane >> 3, r8 = lane & 7, tq = lane & 3;
  const int grp = warp / G, sl = warp % G, bar = 1 + grp;
  const int v0 = cta.vt * BV, wv = 16 * grp, k0 = sl * DS, nv = min(BV, p.dv - v0);
  const bool active = wv < nv;
  const int c0 = p.chunk_off[n], c1 = p.chunk_off[n + 1], eos = p.cu[n + 1];
  const int64_t state_base = (int64_t(n) * p.Hv + h) * p.dk * p.dv + v0 + wv;
  bf16* s_stg = reinterpret_cast<bf16*>(smem + S::stg) + warp * DS * LDW;
  float4* s_xb = reinterpret_cast<float4*>(smem + S::xb) + grp * G * 8 * 32;
  uint4* s_ab = reinterpret_cast<uint4*>(smem + S::ab) + grp * 4 * 32;

  float r_dS[NJ][4];
  zero_tiles(r_dS);
  if (g_dht && active)
    slice_elems(r_dS, k0, [&](float& x, int col, int row) { x = g_dht[state_base + int64_t(col) * p.dv + row]; });

  auto issue = [&](int c, int st) {
    load_rev_tiles<S, BV, W::NTHR>(smem + st * S::stage, p, p.chunk_start[c], eos, h, v0, nv, LDU, g_q, g_k, g_W, g_do, g_dDl, g_gam,
                                   tid);
  };

  if constexpr (Stages == 2) {
    if (c0 < c1) issue(c1 - 1, 0);
    cp_commit();
  }
  for (int c = c1 - 1; c >= c0; --c) {
    const int st = Stages == 2 ? (c1 - 1 - c) & 1 : 0;
    if constexpr (Stages == 1) {
      __syncthreads();  // every warp is done with the previous chunk's tiles
      issue(c, 0);
      cp_commit();
    }
    cp_wait<0>();
    __syncthreads();  // stage st visible; with 2 stages also: every warp is done with chunk c + 1
    if constexpr (Stages == 2) {
      if (c > c0) issue(c - 1, st ^ 1);
      cp_commit();
    }
    if (!active) continue;
    unsigned char* base = smem + st * S::stage;
    const bf16* s_q = reinterpret_cast<const bf16*>(base + S::q);
    const bf16* s_k = reinterpret_cast<const bf16*>(base + S::k);
    const bf16* s_w = reinterpret_cast<const bf16*>(base + S::w);
    bf16* s_do = reinterpret_cast<bf16*>(base + S::dO);
    const bf16* s_ddl = reinterpret_cast<const bf16*>(base + S::ddl);
    const float* s_gam = reinterpret_cast<const float*>(base + S::gam);
    const int64_t bos = p.chunk_start[c];
    const int L = min(C, eos - int(bos));
    const float gam_e = s_gam[L - 1];
    auto step = [&](auto full) {
      constexpr bool F = decltype(full)::value;
      const int Lc = F ? C : L;

      // 1. dS1[c] = dS (this slice, staged), X_g = dS^T_g K_g^T  [16, C]
      float r_X[8][4];
      state_times_rows_t(r_X, r_dS, s_k + k0, Lc, NJ / 2, s_stg);
      stage_out(s_stg, g_dS1 + (int64_t(c) * p.Hv + h) * p.dk * p.dv + int64_t(k0) * p.dv + v0 + wv, p.dv, DS, lane);

      // 2. X of the owned token tiles; dDelta^T = dDelta_local^T + (t < L ? X e^{gam_e - gam_t} : 0) there
      //    (stored, t < L); -dDelta^T as A fragments
      float r_Xo[2 * JT][4];
      reduce_scatter<G>(r_Xo, r_X, s_xb, sl, Lc, bar);
#pragma unroll
      for (int jl = 0; jl < JT; ++jl) {
        const int jj = sl * JT + jl;
        if (16 * jj >= Lc) break;
        uint32_t dl[4], d[4], a[4];
        ldsm_x4_t(dl, s_ddl + (16 * jj + r8 + (mi >> 1) * 8) * LDU + wv + (mi & 1) * 8);
        float f[4];
        decay_to_end(f, s_gam, gam_e, jj, tq, Lc);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float* x = r_Xo[2 * jl + (q >> 1)] + 2 * (q & 1);
          const int t = 16 * jj + 8 * (q >> 1) + 2 * tq;
          const float f0 = f[2 * (q >> 1)], f1 = f[2 * (q >> 1) + 1];
          const float d0 = bf16_lo(dl[q]) + (t < Lc ? __fmul_rn(x[0], f0) : 0.f);  // no FMA: as the other forms
          const float d1 = bf16_hi(dl[q]) + (t + 1 < Lc ? __fmul_rn(x[1], f1) : 0.f);
          d[q] = pack_bf16(d0, d1);
          a[q] = pack_bf16(-d0, -d1);
        }
        stsm_x4_t(stage_row(s_stg, jl, lane), d);
        s_ab[jj * 32 + lane] = make_uint4(a[0], a[1], a[2], a[3]);
      }
      const int t0 = 16 * JT * sl, rows = min(16 * JT, Lc - t0);
      if (rows > 0) stage_out(s_stg, g_dD + ((bos + t0) * p.Hv + h) * p.dv + v0 + wv, int64_t(p.Hv) * p.dv, rows, lane);

      // 3. dO~ = scale e^{gam_t} dO (0 for t >= L): the owned token rows of the group's 16 columns, in place
      for (int it = lane; it < 2 * 16 * JT; it += 32) {
        const int r = t0 + (it >> 1), cc = wv + 8 * (it & 1);
        const float fo = r < Lc ? p.scale * gexp(s_gam[r]) : 0.f;
        uint4* pd = reinterpret_cast<uint4*>(s_do + r * LDU + cc);
        uint4 x = *pd;
        bf16* ex = reinterpret_cast<bf16*>(&x);
#pragma unroll
        for (int e = 0; e < 8; ++e) ex[e] = from_f<bf16>(to_f(ex[e]) * fo);
        *pd = x;
      }
      group_sync(bar, 32 * G);  // -dDelta fragments and dO~ visible to the group

      // 4. dS^T_g = e^{gam_e} dS^T_g + dO~^T Q_g - dDelta^T W_g (all of the Q part first, as the other forms)
      uint32_t a3[4][4];
      gather_frags(a3, s_ab, Lc);
      scale_tiles(r_dS, gexp(gam_e));
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        if (16 * jj >= Lc) break;
        uint32_t a[4];
        ldsm_x4_t(a, s_do + (16 * jj + r8 + (mi >> 1) * 8) * LDU + wv + (mi & 1) * 8);
        add_times_rows(r_dS, a, s_q + k0, jj, NJ / 2);
      }
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        if (16 * jj >= Lc) break;
        add_times_rows(r_dS, a3[jj], s_w + k0, jj, NJ / 2);
      }
    };
    if (L == C) step(std::true_type{});
    else step(std::false_type{});
  }
  if (g_dh0 && active)
    slice_elems(r_dS, k0, [&](float& x, int col, int row) { g_dh0[state_base + int64_t(col) * p.dv + row] = x; });
}
