// CUDA gated RMSNorm on the GDN output, gdn-math.md section 8.1 (HF Qwen3_5RMSNormGated: norm
// first, then the gate; plain weight w shared by all heads, not 1 + w).
//   forward:  rstd = 1 / sqrt(mean_i(o_i^2) + eps) over dv;  xh = o * rstd
//             y = xh * w * silu(z)                     (fp32 math, y rounded once)
//   backward: sg = sigmoid(z);  dy0 = dy * z * sg
//             dz  = dy * xh * w * sg * (1 + z (1 - sg))                     dz OVERWRITTEN (=)
//             do  = rstd * (w * dy0 - xh * mean_i(xh_i * w_i * dy0_i))    do OVERWRITTEN (=)
//             dw += sum_rows dy0 * xh                                     dw ACCUMULATES (+=)
// Layouts: o, z, y, dy, do, dz: [rows, dv] or [A, B, dv] (e.g. [T, Hv, dv]); any strides on the
//   leading dims, unit inner stride; w, dw: [dv] f32 contiguous; rstd: [rows] f32 contiguous
//   (saved by the forward). dv <= 256.
// Dtypes: o, z, y, dy, do, dz one of bf16 | f32 (one dtype per call); math fp32; sigmoid via
//   ew::sigmoid_f (MUFU ex2 and rcp, flush-to-zero); rstd via rsqrtf.
// Mapping: as l2norm.cu: a group of tpr lanes per row, 16-byte slots, tiles of R rows per group,
//   a persistent grid whose threads stream the next S-1 tiles through a per-thread cp.async ring
//   in shared memory (ew::stage_slot) while the current tile is reduced and stored.
// Determinism: dw is reduced without atomics. The backward grid is fixed by the shape (at most
//   kBwdGrid blocks, each a fixed strided set of row tiles); each block reduces its lanes' fp32
//   partials in shared memory in index order into a scratch row [blocks, dv] (caching allocator,
//   released on return: stream-ordered reuse on the compute stream), then colsum_add sums the
//   rows in a fixed order and adds to dw (launched as a programmatic dependent of the main
//   kernel, so its launch overlaps the main kernel's tail). The bits depend only on (rows, dv,
//   dtype).
#include "ops/cuda/gdn_elementwise_common.cuh"
#include "ops/gdn_backends.h"

namespace dt::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxD = 256;
// 16-byte slots per thread, input and tile (rows x slots per row) and ring depth.
#ifndef DT_GRMS_FWD_SLOTS
#define DT_GRMS_FWD_SLOTS 2
#endif
#ifndef DT_GRMS_FWD_STAGES
#define DT_GRMS_FWD_STAGES 4
#endif
#ifndef DT_GRMS_BWD_SLOTS
#define DT_GRMS_BWD_SLOTS 2
#endif
#ifndef DT_GRMS_BWD_STAGES
#define DT_GRMS_BWD_STAGES 3
#endif
// Backward: blocks per SM the registers must allow, and the shape-fixed grid cap (= number of dw
// partial rows): one wave of 132 SMs (H200) at that occupancy.
#ifndef DT_GRMS_BWD_MINB
#define DT_GRMS_BWD_MINB 2
#endif
#ifndef DT_GRMS_BWD_GRID
#define DT_GRMS_BWD_GRID 264
#endif
constexpr int kFwdSlots = DT_GRMS_FWD_SLOTS, kFwdStages = DT_GRMS_FWD_STAGES;
constexpr int kBwdSlots = DT_GRMS_BWD_SLOTS, kBwdStages = DT_GRMS_BWD_STAGES;
constexpr int kBwdGrid = DT_GRMS_BWD_GRID;

template <typename T>
inline constexpr int kSlots = (kMaxD / ew::kVec<T> + 31) / 32;  // 16-byte slots per lane: 1 (bf16), 2 (f32)
template <typename T, int SLOTS>
inline constexpr int kRowsOf = SLOTS / kSlots<T> > 0 ? SLOTS / kSlots<T> : 1;  // rows per group and tile

// Dynamic shared memory of the ring: stages x rows x slots x inputs x kThreads x 16 bytes, plus
// the rstd words of the backward; the backward's dw block reduction reuses it.
template <typename T, bool BWD>
constexpr size_t ring_bytes() {
  constexpr int R = kRowsOf<T, BWD ? kBwdSlots : kFwdSlots>, S = BWD ? kBwdStages : kFwdStages;
  return size_t(S) * R * kSlots<T> * (BWD ? 3 : 2) * kThreads * 16 + (BWD ? size_t(S) * R * kThreads * 4 : 0);
}

// Vector-access flags, one bit per view (rows 16-byte aligned).
enum : unsigned { kVecO = 1, kVecZ = 2, kVecY = 4, kVecDy = 8, kVecDo = 16, kVecDz = 32, kVecW = 64 };

// ============================================================================== kernels
// grid.x = min(tiles, resident blocks); block = kThreads; dynamic smem = ring_bytes<T, false>().
template <typename T>
__global__ __launch_bounds__(kThreads) void gated_rmsnorm_fwd_kernel(
    T* __restrict__ g_y, ew::RowMap ym, float* __restrict__ g_rstd, const T* __restrict__ g_o, ew::RowMap om,
    const T* __restrict__ g_z, ew::RowMap zm, const float* __restrict__ g_w, int64_t rows, int d, int tpr, float eps,
    unsigned vec) {
  constexpr int V = ew::kVec<T>, NS = kSlots<T>, R = kRowsOf<T, kFwdSlots>, S = kFwdStages, P = 2 * R * NS;
  static_assert(S >= 2, "the ring needs two stages");
  extern __shared__ uint4 s_ring[];  // [S][P][kThreads]: per row o slots then z slots
  const int lane = threadIdx.x & (tpr - 1);
  const int group = threadIdx.x / tpr;
  const int gpb = kThreads / tpr;
  const int64_t per_tile = int64_t(gpb) * R;
  const int64_t ntiles = (rows + per_tile - 1) / per_tile;

  auto issue = [&](int64_t tile, int stage) {
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t r = tile * per_tile + int64_t(i) * gpb + group;
#pragma unroll
      for (int s = 0; s < NS; ++s) {
        const int64_t e0 = int64_t(lane + s * tpr) * V;
        const bool ok = r < rows && e0 < d;
        ew::stage_slot<T>(ew::ring_slot<kThreads>(s_ring, P, stage, (2 * i) * NS + s), g_o + om(r), e0, d,
                          vec & kVecO, ok);
        ew::stage_slot<T>(ew::ring_slot<kThreads>(s_ring, P, stage, (2 * i + 1) * NS + s), g_z + zm(r), e0, d,
                          vec & kVecZ, ok);
      }
    }
  };
  const int64_t G = gridDim.x;
#pragma unroll
  for (int st = 0; st < S - 1; ++st) {
    if (blockIdx.x + st * G < ntiles) issue(blockIdx.x + st * G, st);
    ew::cp_async_commit();
  }
  float r_w[NS][V];  // [slots, vec] the lane's slice of w
#pragma unroll
  for (int s = 0; s < NS; ++s) ew::load_param<V>(g_w, int64_t(lane + s * tpr) * V, d, vec & kVecW, r_w[s]);
  const float inv_d = 1.f / float(d);

  int stage = 0;
  for (int64_t tile = blockIdx.x; tile < ntiles; tile += G) {
    const int refill = stage == 0 ? S - 1 : stage - 1;  // the stage read one iteration ago
    if (tile + (S - 1) * G < ntiles) issue(tile + (S - 1) * G, refill);
    ew::cp_async_commit();
    ew::cp_async_wait<S - 1>();  // this tile's slots have landed

    float r_o[R][NS][V], r_z[R][NS][V];  // [rows, slots, vec] fp32
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int s = 0; s < NS; ++s) {
        ew::unpack16<T>(*ew::ring_slot<kThreads>(s_ring, P, stage, (2 * i) * NS + s), r_o[i][s]);
        ew::unpack16<T>(*ew::ring_slot<kThreads>(s_ring, P, stage, (2 * i + 1) * NS + s), r_z[i][s]);
      }
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t r = tile * per_tile + int64_t(i) * gpb + group;
      float r_ss = 0.f;
#pragma unroll
      for (int s = 0; s < NS; ++s)
#pragma unroll
        for (int k = 0; k < V; ++k) r_ss = fmaf(r_o[i][s][k], r_o[i][s][k], r_ss);
      r_ss = ew::group_sum(r_ss, tpr);
      const float r_rstd = rsqrtf(r_ss * inv_d + eps);
      if (r < rows) {
#pragma unroll
        for (int s = 0; s < NS; ++s) {
          const int64_t e0 = int64_t(lane + s * tpr) * V;
          if (e0 < d) {
            float r_y[V];
#pragma unroll
            for (int k = 0; k < V; ++k) {
              const float z = r_z[i][s][k];
              r_y[k] = r_o[i][s][k] * r_rstd * r_w[s][k] * (z * ew::sigmoid_f(z));
            }
            ew::store_slot<T>(g_y + ym(r), e0, d, vec & kVecY, r_y);
          }
        }
        if (lane == 0) g_rstd[r] = r_rstd;
      }
    }
    stage = stage == S - 1 ? 0 : stage + 1;
  }
}

// grid.x = nblocks <= kBwdGrid (fixed by the shape); block b handles the row tiles b, b + nblocks,
// ... and writes g_part[b, 0:d]; dynamic smem = ring_bytes<T, true>().
template <typename T>
__global__ __launch_bounds__(kThreads, DT_GRMS_BWD_MINB) void gated_rmsnorm_bwd_kernel(
    T* __restrict__ g_do, ew::RowMap dom, T* __restrict__ g_dz, ew::RowMap dzm, const T* __restrict__ g_dy,
    ew::RowMap dym, const T* __restrict__ g_o, ew::RowMap om, const T* __restrict__ g_z, ew::RowMap zm,
    const float* __restrict__ g_w, const float* __restrict__ g_rstd, float* __restrict__ g_part, int64_t rows, int d,
    int tpr, unsigned vec) {
  constexpr int V = ew::kVec<T>, NS = kSlots<T>, R = kRowsOf<T, kBwdSlots>, S = kBwdStages, P = 3 * R * NS;
  static_assert(S >= 2, "the ring needs two stages");
  static_assert(ring_bytes<T, true>() >= size_t(kThreads) * V * NS * 4, "the dw reduction reuses the ring");
  extern __shared__ uint4 s_ring[];  // [S][P][kThreads]: per row o, z, dy slots; then [S][R][kThreads] rstd
  float* s_rstd = reinterpret_cast<float*>(s_ring + S * P * kThreads);
  const int lane = threadIdx.x & (tpr - 1);
  const int group = threadIdx.x / tpr;
  const int gpb = kThreads / tpr;
  const int64_t per_tile = int64_t(gpb) * R;
  const int64_t ntiles = (rows + per_tile - 1) / per_tile;

  auto issue = [&](int64_t tile, int stage) {
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t r = tile * per_tile + int64_t(i) * gpb + group;
      const bool rok = r < rows;
      ew::cp_async4_zfill(s_rstd + (stage * R + i) * kThreads + threadIdx.x, g_rstd + (rok ? r : 0), rok);
#pragma unroll
      for (int s = 0; s < NS; ++s) {
        const int64_t e0 = int64_t(lane + s * tpr) * V;
        const bool ok = rok && e0 < d;
        ew::stage_slot<T>(ew::ring_slot<kThreads>(s_ring, P, stage, (3 * i) * NS + s), g_o + om(r), e0, d,
                          vec & kVecO, ok);
        ew::stage_slot<T>(ew::ring_slot<kThreads>(s_ring, P, stage, (3 * i + 1) * NS + s), g_z + zm(r), e0, d,
                          vec & kVecZ, ok);
        ew::stage_slot<T>(ew::ring_slot<kThreads>(s_ring, P, stage, (3 * i + 2) * NS + s), g_dy + dym(r), e0, d,
                          vec & kVecDy, ok);
      }
    }
  };
  const int64_t G = gridDim.x;
#pragma unroll
  for (int st = 0; st < S - 1; ++st) {
    if (blockIdx.x + st * G < ntiles) issue(blockIdx.x + st * G, st);
    ew::cp_async_commit();
  }
  float r_w[NS][V], r_dw[NS][V];  // [slots, vec] w slice, dw partial
#pragma unroll
  for (int s = 0; s < NS; ++s) {
    ew::load_param<V>(g_w, int64_t(lane + s * tpr) * V, d, vec & kVecW, r_w[s]);
#pragma unroll
    for (int k = 0; k < V; ++k) r_dw[s][k] = 0.f;
  }
  const float inv_d = 1.f / float(d);

  int stage = 0;
  for (int64_t tile = blockIdx.x; tile < ntiles; tile += G) {
    const int refill = stage == 0 ? S - 1 : stage - 1;
    if (tile + (S - 1) * G < ntiles) issue(tile + (S - 1) * G, refill);
    ew::cp_async_commit();
    ew::cp_async_wait<S - 1>();

    float r_o[R][NS][V], r_z[R][NS][V], r_dy[R][NS][V];  // [rows, slots, vec] fp32
    float r_rstd[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      r_rstd[i] = s_rstd[(stage * R + i) * kThreads + threadIdx.x];
#pragma unroll
      for (int s = 0; s < NS; ++s) {
        ew::unpack16<T>(*ew::ring_slot<kThreads>(s_ring, P, stage, (3 * i) * NS + s), r_o[i][s]);
        ew::unpack16<T>(*ew::ring_slot<kThreads>(s_ring, P, stage, (3 * i + 1) * NS + s), r_z[i][s]);
        ew::unpack16<T>(*ew::ring_slot<kThreads>(s_ring, P, stage, (3 * i + 2) * NS + s), r_dy[i][s]);
      }
    }
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t r = tile * per_tile + int64_t(i) * gpb + group;
      float r_m = 0.f;  // sum(xh * w * dy0)
#pragma unroll
      for (int s = 0; s < NS; ++s) {
        const int64_t e0 = int64_t(lane + s * tpr) * V;
        float r_dz[V];
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float z = r_z[i][s][k], dy = r_dy[i][s][k];
          const float xh = r_o[i][s][k] * r_rstd[i];
          const float sg = ew::sigmoid_f(z);
          const float dy0 = dy * (z * sg);
          r_dz[k] = dy * xh * r_w[s][k] * (sg * (1.f + z * (1.f - sg)));
          r_dw[s][k] = fmaf(dy0, xh, r_dw[s][k]);
          r_m = fmaf(xh * r_w[s][k], dy0, r_m);
          r_o[i][s][k] = xh;
          r_dy[i][s][k] = dy0;
        }
        if (r < rows && e0 < d) ew::store_slot<T>(g_dz + dzm(r), e0, d, vec & kVecDz, r_dz);
      }
      r_m = ew::group_sum(r_m, tpr) * inv_d;
      if (r < rows) {
#pragma unroll
        for (int s = 0; s < NS; ++s) {
          const int64_t e0 = int64_t(lane + s * tpr) * V;
          if (e0 < d) {
            float r_do[V];
#pragma unroll
            for (int k = 0; k < V; ++k) r_do[k] = r_rstd[i] * (r_w[s][k] * r_dy[i][s][k] - r_o[i][s][k] * r_m);
            ew::store_slot<T>(g_do + dom(r), e0, d, vec & kVecDo, r_do);
          }
        }
      }
    }
    stage = stage == S - 1 ? 0 : stage + 1;
  }

  ew::pdl_trigger();  // the partials reduction may start launching (it waits for our writes)
  // Block partial of dw: lane partials -> shared [group, d] (over the drained ring) -> fixed-order
  // sum over groups.
  ew::cp_async_wait<0>();
  __syncthreads();
  float* s_dw = reinterpret_cast<float*>(s_ring);
#pragma unroll
  for (int s = 0; s < NS; ++s) {
    const int e0 = (lane + s * tpr) * V;
#pragma unroll
    for (int k = 0; k < V; ++k)
      if (e0 + k < d) s_dw[group * d + e0 + k] = r_dw[s][k];
  }
  __syncthreads();
  for (int c = threadIdx.x; c < d; c += kThreads) {
    float r_sum = 0.f;
    for (int g = 0; g < gpb; ++g) r_sum += s_dw[g * d + c];
    g_part[int64_t(blockIdx.x) * d + c] = r_sum;
  }
}

// ============================================================================== launchers
struct RowsOf {
  ew::RowMap map;
  int64_t rows = 0, d = 0;
  bool vec = false;
};

RowsOf rows_of(const TensorView& v, const TensorView& like, const char* op, const char* what) {
  RowsOf r;
  DT_CHECK(v.device.is_cuda(), "{}: {} must be a CUDA view, got {}", op, what, v.str());
  DT_CHECK(v.dtype == DType::bf16 || v.dtype == DType::f32, "{}: {} must be bf16 or f32, got {}", op, what, v.str());
  DT_CHECK(v.dtype == like.dtype && v.device == like.device && v.shape == like.shape,
           "{}: {} {} must match o {} in dtype, device and shape", op, what, v.str(), like.str());
  DT_CHECK(ew::make_rowmap(v, &r.map, &r.rows, &r.d),
           "{}: {} must be [rows, dv] or [A, B, dv] with a unit inner stride (leading dims with any strides), got {}",
           op, what, v.str());
  r.vec = ew::rows_aligned16(v, r.map);
  return r;
}

void check_param(const TensorView& p, int64_t n, const TensorView& o, const char* op, const char* what) {
  DT_CHECK(p.device == o.device, "{}: {} is on {} but o on {}", op, what, p.device.str(), o.device.str());
  DT_CHECK(p.dtype == DType::f32 && p.numel() == n && p.is_contiguous(),
           "{}: {} must be a contiguous f32 view of {} elements, got {}", op, what, n, p.str());
}

int lanes_per_row(int64_t d, int vec) { return std::min(32, ew::pow2_ceil((d + vec - 1) / vec)); }

template <typename T, bool BWD, class Kernel>
void ring_smem_opt_in(Kernel kernel) {
  constexpr size_t smem = ring_bytes<T, BWD>();
  if constexpr (smem > 48 * 1024)
    DT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
}
template <typename T, bool BWD>
int64_t num_tiles(int64_t rows, int tpr) {
  const int64_t per_tile = int64_t(kThreads / tpr) * kRowsOf<T, BWD ? kBwdSlots : kFwdSlots>;
  return (rows + per_tile - 1) / per_tile;
}

}  // namespace

void gated_rmsnorm_fwd(const TensorView& y, const TensorView& rstd, const TensorView& o, const TensorView& z,
                       const TensorView& w, float eps, Stream s) {
  constexpr const char* op = "cuda::gated_rmsnorm_fwd";
  const RowsOf orr = rows_of(o, o, op, "o");  // [rows, dv]
  const RowsOf zr = rows_of(z, o, op, "z");   // [rows, dv]
  const RowsOf yr = rows_of(y, o, op, "y");   // [rows, dv]
  DT_CHECK(orr.d >= 1 && orr.d <= kMaxD, "{}: dv must be in [1, {}], got {} ({})", op, kMaxD, orr.d, o.str());
  check_param(w, orr.d, o, op, "w");               // [dv] f32
  check_param(rstd, orr.rows, o, op, "rstd");      // [rows] f32
  if (orr.rows == 0) return;
  const unsigned vec = (orr.vec ? kVecO : 0) | (zr.vec ? kVecZ : 0) | (yr.vec ? kVecY : 0) |
                       (ew::aligned16(w.data) ? kVecW : 0);
  ew::NvtxRange range(op);
  const cudaStream_t st = static_cast<cudaStream_t>(s.handle);
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    const int tpr = lanes_per_row(orr.d, ew::kVec<T>);
    ring_smem_opt_in<T, false>(gated_rmsnorm_fwd_kernel<T>);
    const int64_t grid = std::min(num_tiles<T, false>(orr.rows, tpr),
                                  ew::resident_blocks(gated_rmsnorm_fwd_kernel<T>, kThreads, ring_bytes<T, false>()));
    gated_rmsnorm_fwd_kernel<T><<<unsigned(grid), kThreads, ring_bytes<T, false>(), st>>>(
        y.ptr<T>(), yr.map, rstd.ptr<float>(), o.ptr<T>(), orr.map, z.ptr<T>(), zr.map, w.ptr<float>(), orr.rows,
        int(orr.d), tpr, eps, vec);
  };
  if (o.dtype == DType::bf16) launch(__nv_bfloat16{});
  else launch(float{});
  DT_CUDA_LAUNCH_CHECK();
}

void gated_rmsnorm_bwd(const TensorView& do_, const TensorView& dz, const TensorView& dw, const TensorView& dy,
                       const TensorView& o, const TensorView& z, const TensorView& w, const TensorView& rstd,
                       Stream s) {
  constexpr const char* op = "cuda::gated_rmsnorm_bwd";
  const RowsOf orr = rows_of(o, o, op, "o");     // [rows, dv]
  const RowsOf zr = rows_of(z, o, op, "z");      // [rows, dv]
  const RowsOf dyr = rows_of(dy, o, op, "dy");   // [rows, dv]
  const RowsOf dor = rows_of(do_, o, op, "do");  // [rows, dv] (=)
  const RowsOf dzr = rows_of(dz, o, op, "dz");   // [rows, dv] (=)
  DT_CHECK(orr.d >= 1 && orr.d <= kMaxD, "{}: dv must be in [1, {}], got {} ({})", op, kMaxD, orr.d, o.str());
  check_param(w, orr.d, o, op, "w");            // [dv] f32
  check_param(dw, orr.d, o, op, "dw");          // [dv] f32 (+=)
  check_param(rstd, orr.rows, o, op, "rstd");   // [rows] f32
  if (orr.rows == 0) return;
  const unsigned vec = (orr.vec ? kVecO : 0) | (zr.vec ? kVecZ : 0) | (dyr.vec ? kVecDy : 0) |
                       (dor.vec ? kVecDo : 0) | (dzr.vec ? kVecDz : 0) | (ew::aligned16(w.data) ? kVecW : 0);
  ew::NvtxRange range(op);
  const cudaStream_t st = static_cast<cudaStream_t>(s.handle);
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    const int tpr = lanes_per_row(orr.d, ew::kVec<T>);
    ring_smem_opt_in<T, true>(gated_rmsnorm_bwd_kernel<T>);
    const int64_t nblocks = std::min<int64_t>(num_tiles<T, true>(orr.rows, tpr), kBwdGrid);
    // Scratch: one dw partial row per block (stream-ordered reuse; see the file header).
    Tensor part = Tensor::empty(Shape{nblocks, orr.d}, DType::f32, o.device);  // [nblocks, dv] f32
    gated_rmsnorm_bwd_kernel<T><<<unsigned(nblocks), kThreads, ring_bytes<T, true>(), st>>>(
        do_.ptr<T>(), dor.map, dz.ptr<T>(), dzr.map, dy.ptr<T>(), dyr.map, o.ptr<T>(), orr.map, z.ptr<T>(), zr.map,
        w.ptr<float>(), rstd.ptr<float>(), part.ptr<float>(), orr.rows, int(orr.d), tpr, vec);
    DT_CUDA_LAUNCH_CHECK();
    ew::colsum_add(dw.ptr<float>(), dw.ptr<float>(), part.ptr<float>(), nblocks, orr.d, orr.d, st);
  };
  if (o.dtype == DType::bf16) launch(__nv_bfloat16{});
  else launch(float{});
}

}  // namespace dt::ops::cuda
