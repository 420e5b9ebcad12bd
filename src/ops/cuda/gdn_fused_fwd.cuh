// Internal to gdn_chunk.cu (included inside its gck namespace after gdn_serial_warp.cuh): the fused
// forward (DT_GDN_FWD=fused, fwd_form_knob): the state kernel (K4) and the out kernel (K5, with
// the gated RMSNorm epilogue) as ONE serial pass, bf16, dk = dv = 128, sm_90a.
//
// Why: the split forward writes every chunk-start state h_c (537 MB at the layer's shape) and
// Delta, and out reads them back; out is its own 0.7 ms launch with ~1.5 GB of traffic. Here the
// output is made on chip while the serial chain runs, by warps the chain leaves idle, and h / Delta
// leave only as the backward's saved intermediates (stores off the chain).
//
// One CTA per (sequence, v-head) (nvt = 1, seq_cta's longest-first order), 384 threads, one CTA per
// SM (setmaxnreg: 176 + 176 + 152 registers a thread; the counts must sum to 3 x the launch's 168,
// since a warpgroup's increase draws only on what the CTA's others released: 176 + 176 + 160 hung):
//   WG0, WG1 (state): S^T rows v = 64 wg .. 64 wg + 63, each exactly wg4's state warpgroup
//     (gdn_serial_warp.cuh): X = S^T W^T, Delta = U - X, S^T = e^{gam_e} S^T + Delta~^T K; they share
//     the W, K, U, gamma tiles of a two-stage TMA ring (barrier kBarRing, 256 threads). Each step
//     also puts bf16(S) [dk][dv] and Delta [C][dv] into shared memory (stmatrix.trans into 128-byte
//     swizzled atoms: the MN-major B operands of WG2's products).
//   WG2 (out): its own Q, K, gamma tiles (one stage, the next chunk's issued once P is made), then
//     P = (Q K^T) (.) Gamma (causal, state-free), O = e^gamma (Q S_c) once S_c is staged, O += P Delta
//     once Delta is, the norm epilogue (o, y, rstd), and the stores of P, h_c and Delta.
// Hand-offs are named barriers (bar.arrive by the producer, bar.sync by the consumer, 384 threads):
//   S_c in buffer c & 1: kBarSFull + b (state -> out), kBarSEmpty + b (out -> state, when chunk
//   c + 2 will reuse it); Delta_c in one buffer: kBarDFull / kBarDEmpty likewise. Every arrival
//   has exactly one matching wait (the conditions on i below), so none is left pending at exit.
// The products are wgmma with register A operands (wgmma.cuh); o and y leave straight from the
// accumulator fragments. o, P, h, Delta and ht are the split forward's bits (wgmma sums in
// mma.sync's order); y and rstd are within rounding (the norm's row sums run over fragments).
// Measured (docs/perf.md v0.32.0-v0.34.0): correct; since the norm weight moved to shared memory,
// 1.27 ms against state + out's 1.31 on an H100, within the layer's noise of the split forward.
namespace fused {

// Timing study only (scripts/gpu_ab.sh variants; wrong outputs): DT_EXP_FUSED_SKIP bits leave out the
// out warpgroup's h_c stores (1), Delta_c stores (2), P store (4), o / y / rstd stores (8), or all of its
// work but the hand-offs (16: the state warpgroups' chain alone, as this kernel schedules it).
#ifndef DT_EXP_FUSED_SKIP
#define DT_EXP_FUSED_SKIP 0
#endif
constexpr int kSkip = DT_EXP_FUSED_SKIP;
// The tiles come by TMA (cp.async.bulk.tensor, 128-byte swizzle: the atoms' layout) completing on
// mbarriers, issued by one thread per ring, and h_c and a full chunk's Delta_c leave by TMA stores
// from the hand-off buffers (one thread; each buffer is released once the stores have read it).
// Measured against the cp.async form (v0.33.0-v0.34.0): 1274 against 1319 us, and no thread then
// has copies in flight at a hand-off's fence. A chunk's box is always 64 token rows: rows past the
// sequence's end hold the next sequence's values (past T, zeros), which every use masks by
// selection or multiplies by an exact zero (A fragments, P's columns), so the results equal those
// of zero-filled tiles for finite data (a NaN or Inf there would reach this sequence's last chunk
// through 0 x NaN). gamma comes as [C][4] boxes (4 heads: TMA's 16-byte minimum row), read with
// stride 4, so the kernel needs Hv % 4 == 0 (fwd_form falls back to split otherwise). A partial
// chunk's Delta is copied: a box would write the next sequence's rows. Dropped after measurement
// (v0.33.0-v0.34.0): issuing the next chunk's tiles after the Delta hand-off, staging S_c before
// X's wgmma, silu by tanh.approx, and an L2 prefetch of z.
constexpr int GS = 4;  // gamma's stride in its [C][4] tiles

constexpr int kThreads = 384;       // WG0, WG1: state; WG2: out
constexpr int kStateThreads = 256;
enum : int { kBarRing = 1, kBarSFull = 2, kBarSEmpty = 4, kBarDFull = 6, kBarDEmpty = 7, kBarOut = 8 };

__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
// setmaxnreg: ptxas allocates the code after it within the new count (the state warpgroups' step
// spills at the launch's 168, fits at 176).
template <int R>
__device__ __forceinline__ void reg_alloc() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
#endif
}
template <int R>
__device__ __forceinline__ void reg_dealloc() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
#endif
}

// The TMA descriptors: 3-D maps (128 columns, heads, tokens) of W, U [T, Hv, 128], K, Q [T, Hk, 128],
// boxes of 64 columns x 1 head x 64 tokens; gamma [T, Hv] f32, boxes of 4 heads x 64 tokens.
struct Maps {
  CUtensorMap w, u, k, q, g;
  CUtensorMap h;  // with h: h [NT Hv dk rows][dv], boxes of 128 rows x 64 columns
  CUtensorMap d;  // with Delta: Delta [T, Hv, dv], boxes as W's
};
__device__ __forceinline__ void mbar_init(uint32_t bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void tma_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
#endif
}
// A TMA store of a box from shared memory, in the thread's bulk group (tma_store_wait_read: until read).
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, uint32_t src, int c0, int c1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(map), "r"(src),
               "r"(c0), "r"(c1)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(map), "r"(src),
               "r"(c0), "r"(c1), "r"(c2)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
// Until this thread's bulk stores are complete (their writes performed), then a proxy fence: the
// writes, made by the async proxy, are ordered before the thread's later generic release.
__device__ __forceinline__ void tma_store_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void tma_store_wait_read() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void tma_2d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
#endif
}

struct Smem {
  // the state warpgroups' ring, two stages
  static constexpr size_t w = 0;                          // bf16 2 x [C][64] atoms
  static constexpr size_t k = w + 2 * C * 128;            // bf16 2 x [C][64] atoms
  static constexpr size_t u = k + 2 * C * 128;            // bf16 2 x [C][64] atoms
  static constexpr size_t gam = u + 2 * C * 128;          // f32 [C][4]
  static constexpr size_t gam_bytes = sizeof(float) * C * GS;
  static constexpr size_t stage = (gam + gam_bytes + 1023) / 1024 * 1024;
  static constexpr uint32_t stage_tx = 3 * 2 * C * 128 + gam_bytes;  // TMA bytes of a stage
  // hand-offs
  static constexpr size_t s = 2 * stage;                  // bf16 [2] x 2 x [D][64] atoms: S_c [dk][dv]
  static constexpr size_t sbuf = 2 * D * 128;
  static constexpr size_t dl = s + 2 * sbuf;              // bf16 2 x [C][64] atoms: Delta_c [C][dv]
  // the out warpgroup's tiles (one stage; gamma two)
  static constexpr size_t q = dl + 2 * C * 128;           // bf16 2 x [C][64] atoms
  static constexpr size_t ko = q + 2 * C * 128;           // bf16 2 x [C][64] atoms
  static constexpr size_t gamo = ko + 2 * C * 128;        // f32 [2][C][4]
  static constexpr size_t gamo_buf = sizeof(float) * C * GS;
  static constexpr uint32_t out_tx = 2 * 2 * C * 128 + gamo_buf;  // TMA bytes of Q, K, gamma
  static constexpr size_t bars = gamo + 2 * gamo_buf;     // u64 [3]: the ring's full[2], the out tiles' full
  // the norm's weight, f32 [dv]: read per element from global beside the y stores (which may alias
  // it), each load's L2 latency was on the step (v0.33.0: ~45% of the out warpgroup's samples)
  static constexpr size_t wn = bars + 3 * 8;
  static constexpr size_t bytes = wn + sizeof(float) * D;
  static_assert(stage % 1024 == 0 && s % 1024 == 0 && dl % 1024 == 0 && q % 1024 == 0 && ko % 1024 == 0,
                "swizzled atoms at 1 KB boundaries");
};
static_assert(Smem::bytes <= kMaxSmem, "fused forward: shared memory over the 227 KB opt-in limit");

// This lane's stmatrix.trans address for k-step kk of a warp whose 16 S^T rows (v) are columns
// 16 wq .. 16 wq + 15 of atom `atom` ([rows][64] atoms `astride` bytes apart): the transposed
// [rows][16] tile lands at rows 16 kk + 8 (matrix >> 1) + lane % 8, chunk 2 wq + (matrix & 1).
__device__ __forceinline__ uint32_t stage_sw(uint32_t base, int atom, uint32_t astride, int wq, int kk, int lane) {
  const int r = 16 * kk + 8 * (lane >> 4) + (lane & 7), ch = 2 * wq + ((lane >> 3) & 1);
  return base + atom * astride + wg::sw128(r, ch);
}
// Swizzled [rows][128] bf16 (two [rows][64] atoms) -> global rows r < nrows at g + r * gstride,
// 16-byte copies by 128 threads (t: 0..127), consecutive threads on consecutive 16 bytes of a row.
template <int ROWS>
__device__ __forceinline__ void copy_out_sw128(const unsigned char* s, bf16* g, int64_t gstride, int nrows, int t) {
#pragma unroll 4
  for (int idx = t; idx < ROWS * 16; idx += 128) {
    const int r = idx >> 4, cc = idx & 15;
    if (r >= nrows) break;  // rows ascend with idx
    const uint4 x = *reinterpret_cast<const uint4*>(s + (cc >> 3) * (ROWS * 128) + wg::sw128(r, cc & 7));
    *reinterpret_cast<uint4*>(g + r * gstride + 8 * cc) = x;
  }
}

// STATE_ONLY (DT_GDN_FWD=split_tma): the state chain alone, a state kernel for the split forward: WG2
// only stores h_c and Delta_c from the hand-off buffers (TMA stores by one thread; a partial chunk's
// Delta copied), then counts the CTA done for out (Params.done, as the split state kernels do).
// Q, K, W, U and gamma come through `maps` only.
template <bool NORM, bool STATE_ONLY = false>
__global__ __launch_bounds__(kThreads, 1) void fwd_kernel(Params p,
                                                         const float* __restrict__ g_h0,  // or null
                                                         bf16* __restrict__ g_h,          // or null
                                                         bf16* __restrict__ g_D,          // or null
                                                         float* __restrict__ g_ht,        // or null
                                                         bf16* __restrict__ g_o,          // [T, Hv, dv]
                                                         bf16* __restrict__ g_P,          // or null
                                                         const OutNorm nrm, const __grid_constant__ Maps maps) {
  extern __shared__ __align__(1024) unsigned char smem[];
  using S = Smem;
  const SeqCta cta = seq_cta(p);  // p.nvt == 1
  const int n = cta.n, h = cta.h;
  const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  const SeqSpan sp = seq_span(p, n);
  const int c0 = sp.c0, c1 = sp.c1, eos = sp.eos, nch = c1 - c0;
  const uint32_t s0 = smem_addr(smem);
  if (s0 & 1023) __trap();  // the swizzled atoms (wgmma descriptors, TMA boxes) need 1 KB alignment
  if constexpr (STATE_ONLY) serial_pdl_trigger(p);  // out may launch: it waits for done[n] before reading h
  const uint32_t bar_ring = s0 + uint32_t(S::bars), bar_out = bar_ring + 16;  // the ring's full[2], out's
  if (tid == 0) {
    mbar_init(bar_ring);
    mbar_init(bar_ring + 8);
    mbar_init(bar_out);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (tid < kStateThreads) {
    // ================================================================== state warpgroups
    reg_alloc<176>();
    const int sw = tid >> 7, wq = (tid >> 5) & 3, mi = lane >> 3, r8 = lane & 7;
    const int wv = 64 * sw + 16 * wq;  // the warp's S^T rows (v)
    const int64_t state_base = (int64_t(n) * p.Hv + h) * p.dk * p.dv + wv;
    float r_S[16][4];
    state_elems(r_S, D, 0, [&](float& x, int, int) { x = 0.f; });
    if (g_h0) state_elems(r_S, D, 0, [&](float& x, int col, int row) { x = g_h0[state_base + int64_t(col) * p.dv + row]; });
    auto issue = [&](int c, int st) {  // one thread: the whole stage
      if (tid == 0) {
        const uint32_t sb = s0 + st * uint32_t(S::stage), bar = bar_ring + 8 * st;
        const int t0 = int(sp.bos(c));
        mbar_expect_tx(bar, S::stage_tx);
#pragma unroll
        for (int a = 0; a < 2; ++a) {
          tma_3d(sb + uint32_t(S::w) + a * (C * 128), &maps.w, bar, 64 * a, h, t0);
          tma_3d(sb + uint32_t(S::k) + a * (C * 128), &maps.k, bar, 64 * a, h / p.G, t0);
          tma_3d(sb + uint32_t(S::u) + a * (C * 128), &maps.u, bar, 64 * a, h, t0);
        }
        tma_2d(sb + uint32_t(S::gam), &maps.g, bar, h & ~3, t0);
      }
    };
    if (nch > 0) issue(c0, 0);
    for (int i = 0; i < nch; ++i) {
      const int c = c0 + i, st = i & 1, b = i & 1;
      mbar_wait(bar_ring + 8 * st, (i >> 1) & 1);
      bar_sync(kBarRing, kStateThreads);  // both warpgroups done with stage st ^ 1
      if (i + 1 < nch) issue(c + 1, st ^ 1);
      const unsigned char* base = smem + st * S::stage;
      const uint32_t s_w = s0 + st * uint32_t(S::stage) + uint32_t(S::w);
      const uint32_t s_k = s0 + st * uint32_t(S::stage) + uint32_t(S::k);
      const float* s_gam = reinterpret_cast<const float*>(base + S::gam) + (h & 3);
      const int L = min(C, eos - int(sp.bos(c)));
      const float gam_e = s_gam[GS * (L - 1)];

      // 1. X = S^T W^T [16, C] (wgmma, A = bf16(S^T)), then bf16(S) into S buffer b for WG2 once the
      // wgmma completes (reading its A registers while it runs is undefined in PTX)
      float r_X[8][4];
      {
        const uint32_t sb = s0 + uint32_t(S::s) + b * uint32_t(S::sbuf);
        uint32_t a1[D / 16][4];
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) acc_to_a(a1[kk], r_S, kk);
        wg::issue_kmajor_n64(r_X, a1, s_w, C * 128);
        wg::wait_acc(r_X);
        wg::wg_hold(a1);  // read by the wgmma until its wait
        if (i >= 2) bar_sync(kBarSEmpty + b, kThreads);  // WG2 is done with chunk i - 2's S
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) stsm_x4_t_sa(stage_sw(sb, sw, D * 128, wq, kk, lane), a1[kk]);
        wg::fence_proxy_async();
        bar_arrive(kBarSFull + b, kThreads);
      }
      // 2. Delta^T = U^T - X (into the Delta buffer for WG2); Delta~^T = Delta^T e^{gam_e - gam_t} as A fragments
      uint32_t a2[4][4];
      {
        uint32_t r_u[4][4];
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          const int t = 16 * jj + r8 + (mi >> 1) * 8, v = wv + (mi & 1) * 8;  // U in two swizzled [C][64] atoms
          ldsm_x4_t(r_u[jj], base + S::u + (v >> 6) * (C * 128) + wg::sw128(t, (v & 63) >> 3));
        }
        if (i >= 1) bar_sync(kBarDEmpty, kThreads);  // WG2 is done with chunk i - 1's Delta
        const uint32_t db = s0 + uint32_t(S::dl);
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          uint32_t d[4];
          delta_frags<GS>(d, a2[jj], r_u[jj], r_X[2 * jj], r_X[2 * jj + 1], s_gam, gam_e, jj, tq, L);
          stsm_x4_t_sa(stage_sw(db, sw, C * 128, wq, jj, lane), d);
        }
        wg::fence_proxy_async();
        bar_arrive(kBarDFull, kThreads);
      }
      // 3. S^T = e^{gam_e} S^T + Delta~^T K (a2 is 0 past L; K's rows >= L hold the next sequence's
      // finite values, or zeros past T: + 0 exactly)
      scale_tiles(r_S, gexp(gam_e));
      wg::issue_mn_n128(r_S, a2, s_k, C * 128, true);
      wg::wait_acc(r_S);
    }
    if (g_ht) state_elems(r_S, D, 0, [&](float& x, int col, int row) { g_ht[state_base + int64_t(col) * p.dv + row] = x; });
    return;
  }

  // ==================================================================== out warpgroup
  reg_dealloc<152>();
  const int t2 = tid - kStateThreads, wq = t2 >> 5;  // rows 16 wq .. 16 wq + 15 of the chunk
  // h_c from S buffer b by two TMA stores (one thread; maps.h); Delta_c from the Delta buffer, a full
  // chunk's by two TMA stores (maps.d), a partial one's copied by the warpgroup (a box would write
  // the next sequence's rows)
  auto store_h_tma = [&](int b, int c) {
    if (t2 == 0)
      for (int a = 0; a < 2; ++a)
        tma_store_2d(&maps.h, s0 + uint32_t(S::s) + b * uint32_t(S::sbuf) + a * (D * 128), 64 * a, (c * p.Hv + h) * D);
  };
  auto store_delta = [&](int64_t bos, int L) {
    if (L == C) {
      if (t2 == 0)
        for (int a = 0; a < 2; ++a) tma_store_3d(&maps.d, s0 + uint32_t(S::dl) + a * (C * 128), 64 * a, h, int(bos));
    } else {
      copy_out_sw128<C>(smem + S::dl, g_D + (bos * p.Hv + h) * p.dv, int64_t(p.Hv) * p.dv, L, t2);
    }
  };
  if constexpr (STATE_ONLY) {  // h_c and Delta_c to global, then done[n] for out
    for (int i = 0; i < nch; ++i) {
      const int c = c0 + i, b = i & 1;
      const int64_t bos = sp.bos(c);
      bar_sync(kBarSFull + b, kThreads);
      store_h_tma(b, c);
      bar_sync(kBarDFull, kThreads);
      store_delta(bos, min(C, eos - int(bos)));
      if (t2 == 0) tma_store_wait_read();  // both buffers read: the state warpgroups may overwrite them
      if (i + 1 < nch) bar_arrive(kBarDEmpty, kThreads);
      if (i + 2 < nch) bar_arrive(kBarSEmpty + b, kThreads);
    }
    if (t2 == 0) tma_store_wait_all();  // the stores' writes done, and ordered before the release below
    bar_sync(kBarOut, 128);             // the partial chunks' copies too
    if (t2 == 0) serial_count_done(p, n);
    return;
  }
  const int hk = h / p.G;
  auto issue = [&](int c, int gb) {  // one thread: Q, K and gamma of chunk c
    if (t2 == 0) {
      const int t0 = int(sp.bos(c));
      mbar_expect_tx(bar_out, S::out_tx);
#pragma unroll
      for (int a = 0; a < 2; ++a) {
        tma_3d(s0 + uint32_t(S::q) + a * (C * 128), &maps.q, bar_out, 64 * a, hk, t0);
        tma_3d(s0 + uint32_t(S::ko) + a * (C * 128), &maps.k, bar_out, 64 * a, hk, t0);
      }
      tma_2d(s0 + uint32_t(S::gamo) + gb * uint32_t(S::gamo_buf), &maps.g, bar_out, h & ~3, t0);
    }
  };
  if constexpr (kSkip & 16) {  // the hand-offs alone
    for (int i = 0; i < nch; ++i) {
      bar_sync(kBarSFull + (i & 1), kThreads);
      if (i + 2 < nch) bar_arrive(kBarSEmpty + (i & 1), kThreads);
      bar_sync(kBarDFull, kThreads);
      if (i + 1 < nch) bar_arrive(kBarDEmpty, kThreads);
    }
    return;
  }
  if constexpr (NORM) reinterpret_cast<float*>(smem + S::wn)[t2] = nrm.w[t2];  // seen after the loop's kBarOut
  if (nch > 0) issue(c0, 0);
  for (int i = 0; i < nch; ++i) {
    const int c = c0 + i, b = i & 1;
    const int64_t bos = sp.bos(c);
    const int L = min(C, eos - int(bos));
    mbar_wait(bar_out, i & 1);  // Q, K, gamma of chunk c landed
    const float* s_gam = reinterpret_cast<const float*>(smem + S::gamo + b * S::gamo_buf) + (h & 3);

    // Q's A fragments (rows 16 wq + .., k-step kk), kept for P and for Q S_c
    uint32_t qa[D / 16][4];
    {
      const int r = 16 * wq + (lane & 7) + 8 * ((lane >> 3) & 1);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const int ch = 2 * kk + (lane >> 4);
        ldsm_x4_sa(qa[kk], s0 + uint32_t(S::q) + (ch >> 3) * (C * 128) + wg::sw128(r, ch & 7));
      }
    }
    // P = Q K^T [C, C]: this warp's rows, all 64 columns
    float r_P[8][4];
    wg::issue_kmajor_n64(r_P, qa, s0 + uint32_t(S::ko), C * 128);
    wg::wait_acc(r_P);
    bar_sync(kBarOut, 128);  // every warp is done reading Q and K: the next chunk's load them
    if (i + 1 < nch) issue(c + 1, b ^ 1);
    // P (.) Gamma, causal, rows < L; rounded once to bf16 as the A fragments of P Delta
    uint32_t pa[4][4];
    {
      const int i0 = 16 * wq + g, i1 = i0 + 8;
      const float gi0 = s_gam[GS * i0], gi1 = s_gam[GS * i1];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int col = 8 * j + 2 * tq;
        const float gj0 = s_gam[GS * col], gj1 = s_gam[GS * (col + 1)];
        float* x = r_P[j];
        x[0] = (i0 < L && col <= i0) ? x[0] * gexp(gi0 - gj0) : 0.f;
        x[1] = (i0 < L && col + 1 <= i0) ? x[1] * gexp(gi0 - gj1) : 0.f;
        x[2] = (i1 < L && col <= i1) ? x[2] * gexp(gi1 - gj0) : 0.f;
        x[3] = (i1 < L && col + 1 <= i1) ? x[3] * gexp(gi1 - gj1) : 0.f;
      }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) acc_to_a(pa[kk], r_P, kk);
      if (g_P && !(kSkip & 4)) {  // [C][C] rows i, for dvl / rev (saved intermediates)
        bf16* gp = g_P + (int64_t(c) * p.Hv + h) * C * C;
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          const int col = 16 * kk + 2 * tq;
          *reinterpret_cast<uint32_t*>(gp + i0 * C + col) = pa[kk][0];
          *reinterpret_cast<uint32_t*>(gp + i1 * C + col) = pa[kk][1];
          *reinterpret_cast<uint32_t*>(gp + i0 * C + col + 8) = pa[kk][2];
          *reinterpret_cast<uint32_t*>(gp + i1 * C + col + 8) = pa[kk][3];
        }
      }
    }
    // O = diag(e^gamma) Q S_c
    float r_O[16][4];
    {
      bar_sync(kBarSFull + b, kThreads);
      const uint32_t sb = s0 + uint32_t(S::s) + b * uint32_t(S::sbuf);
      wg::issue_mn_n128(r_O, qa, sb, D * 128, false);
      wg::wait_acc(r_O);
      if (g_h && !(kSkip & 1)) store_h_tma(b, c);
      const int r0 = 16 * wq + g;
      const float e0 = r0 < L ? gexp(s_gam[GS * r0]) : 0.f, e1 = r0 + 8 < L ? gexp(s_gam[GS * (r0 + 8)]) : 0.f;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        r_O[j][0] *= e0, r_O[j][1] *= e0;
        r_O[j][2] *= e1, r_O[j][3] *= e1;
      }
    }
    // z of this lane's output elements, loaded while Delta_c is awaited and P Delta_c runs
    [[maybe_unused]] uint32_t r_z[2][16];
    if constexpr (NORM) {
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const int r = 16 * wq + g + 8 * h2;
        const bf16* zrow = static_cast<const bf16*>(nrm.z) + (bos + r) * nrm.sz + int64_t(h) * p.dv + 2 * tq;
#pragma unroll
        for (int j = 0; j < 16; ++j) r_z[h2][j] = r < L ? *reinterpret_cast<const uint32_t*>(zrow + 8 * j) : 0u;
      }
    }
    // O += P Delta_c
    {
      bar_sync(kBarDFull, kThreads);
      wg::issue_mn_n128(r_O, pa, s0 + uint32_t(S::dl), C * 128, true);
      wg::wait_acc(r_O);
      if (g_D && !(kSkip & 2)) store_delta(bos, L);
      // the Delta buffer and S buffer b are free once their stores have read them
      if (t2 == 0 && (g_h || g_D)) tma_store_wait_read();
      if (i + 1 < nch) bar_arrive(kBarDEmpty, kThreads);
      if (i + 2 < nch) bar_arrive(kBarSEmpty + b, kThreads);
    }
    // Epilogue: o = bf16(scale O); with NORM y = o rstd w silu(z), rstd = 1 / sqrt(mean(o^2) + eps) per row
    if constexpr (kSkip & 8) continue;
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const int r = 16 * wq + g + 8 * h2;
      const int64_t t = bos + r;
      uint32_t ob[16];
      float ss = 0.f;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        ob[j] = pack_bf16(p.scale * r_O[j][2 * h2], p.scale * r_O[j][2 * h2 + 1]);
        const float a = bf16_lo(ob[j]), bb = bf16_hi(ob[j]);
        ss = fmaf(a, a, ss);
        ss = fmaf(bb, bb, ss);
      }
      bf16* orow = g_o + (t * p.Hv + h) * p.dv + 2 * tq;
      if constexpr (NORM) {
        ss += __shfl_xor_sync(0xffffffffu, ss, 1);
        ss += __shfl_xor_sync(0xffffffffu, ss, 2);
        const float rstd = rsqrtf(ss * (1.f / float(D)) + nrm.eps);
        if (r < L) {
          bf16* yrow = static_cast<bf16*>(nrm.y) + t * nrm.sy + int64_t(h) * p.dv + 2 * tq;
#pragma unroll
          for (int j = 0; j < 16; ++j) {
            const float z0 = bf16_lo(r_z[h2][j]), z1 = bf16_hi(r_z[h2][j]);
            const float2 w = reinterpret_cast<const float2*>(smem + S::wn)[4 * j + tq];
            const float w0 = w.x, w1 = w.y;
            const float y0 = bf16_lo(ob[j]) * rstd * w0 * (z0 * ew::sigmoid_f(z0));
            const float y1 = bf16_hi(ob[j]) * rstd * w1 * (z1 * ew::sigmoid_f(z1));
            *reinterpret_cast<uint32_t*>(orow + 8 * j) = ob[j];
            *reinterpret_cast<uint32_t*>(yrow + 8 * j) = pack_bf16(y0, y1);
          }
          if (tq == 0) nrm.rstd[t * p.Hv + h] = rstd;
        }
      } else {
        if (r < L) {
#pragma unroll
          for (int j = 0; j < 16; ++j) *reinterpret_cast<uint32_t*>(orow + 8 * j) = ob[j];
        }
      }
    }
  }
}

}  // namespace fused
