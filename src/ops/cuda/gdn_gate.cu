// CUDA GDN gates, gdn-math.md section 1.1 (forward), 4.2 B9 and B10 (backward).
//   forward:  x = a + dt_bias[h];  e = exp(x);  sp = softplus(x) = (x > 20 ? x : log1p(e))
//             g = -exp(A_log[h]) * sp        (natural-log decay, always <= 0)
//             beta = sigmoid(b) = 1 / (1 + exp(-b))
//   backward: da = dg * -exp(A_log[h]) * softplus'(x)   (softplus'(x) = 1 for x > 20, else
//                  sigmoid(x) = e / (1 + e) with the same e as the softplus)
//                                                                         da OVERWRITTEN (=)
//             db = dbeta * beta * (1 - beta)                              db OVERWRITTEN (=)
//             dA_log[h]   += sum_t dg * g                                 ACCUMULATES (+=)
//             ddt_bias[h] += sum_t da                                     ACCUMULATES (+=)
// Layouts: a, b, da, db: [T, Hv] (row stride arbitrary, unit inner stride; typically slices of
//   the in_proj output); g, beta, dg, dbeta: [T, Hv] f32 (row stride arbitrary, unit inner
//   stride); A_log, dt_bias, dA_log, ddt_bias: [Hv] f32 contiguous. Hv <= 256.
// Dtypes: a, b, da, db one of bf16 | f32 (one dtype per call); all math fp32 (A_log is never
//   exponentiated in bf16, gdn-math.md section 10 item 4; exp(A_log) is the accurate expf).
// Accuracy: the per-element math uses the single-instruction MUFU forms (ex2, lg2, rcp with
//   flush-to-zero) instead of libm expf / log1pf / the IEEE reciprocal (~106 instructions per
//   element; measured: the forward 13% faster back to back, the backward the same). log1p(e) is
//   a degree-10 series for e < 1/4 (truncation < e^11/11, relative < 1e-7) and lg2(1 + e) above
//   (absolute error 2^-22.6 on [1, 2], 2 ulp beyond: relative < 6e-7 since log1p(e) >= 0.22
//   there); e = 2^(x log2 e) carries the rounding of the product, relative ~|x| * 6e-8 <= 1.2e-6
//   at the threshold x = 20. So g, beta and the gradients are within ~2e-6 relative of the libm
//   forms, far below the 1e-4 fp32 test tolerance and the bf16 rounding of a, b.
// Mapping: the problem is a few MB, so it is latency-bound: every thread owns 4 heads of one
//   token row (an 8-byte bf16 or 16-byte f32 access of each tensor) and the grid is about one
//   wave with every load issued up front (kBwdRows row chunks per thread in the backward). At
//   T = 32k, Hv = 32 the bytes (12.6 MB forward) need 2.9 us: the launch and one DRAM round trip
//   are as long. So the layer runs them inside the conv's launch instead
//   (ops::causal_conv1d_gate_fwd/bwd, conv1d_varlen.cu), with the row loops of gdn_gate.cuh that
//   these standalone kernels also run (docs/perf.md has both timings).
// Determinism: dA_log and ddt_bias are reduced without atomics: a shape-fixed grid of at most
//   kMaxBwdBlocks blocks writes one fp32 partial row [2*Hv] per block (thread partials summed
//   in shared memory in index order), then colsum_add adds the rows in a fixed order (a
//   programmatic dependent launch, overlapping the main kernel's tail). Scratch from the
//   caching allocator, released on return (stream-ordered reuse on the compute stream).
#include "ops/cuda/gdn_gate.cuh"
#include "ops/gdn_backends.h"

namespace dt::ops::cuda {
namespace {

using namespace gate;
#ifndef DT_GATE_FWD_THREADS
#define DT_GATE_FWD_THREADS 256
#endif
#ifndef DT_GATE_BWD_THREADS
#define DT_GATE_BWD_THREADS 128
#endif
constexpr int kFwdThreads = DT_GATE_FWD_THREADS;
constexpr int kBwdThreads = DT_GATE_BWD_THREADS;
// Backward: row chunks per thread in flight and the register budget (65536 / (threads * minblocks)).
#ifndef DT_GATE_ROWS
#define DT_GATE_ROWS 1
#endif
#ifndef DT_GATE_MINB
#define DT_GATE_MINB 8
#endif
constexpr int kBwdRows = DT_GATE_ROWS;
constexpr int kMaxBwdBlocks = 1024; // backward grid cap (= number of partial rows)

// ============================================================================== kernels
// grid.x = ceil(T / (kFwdThreads / cpr)); block = kFwdThreads; thread = (row, 4-head chunk).
template <typename T>
__global__ __launch_bounds__(kFwdThreads) void gdn_gate_fwd_kernel(const GateFwdParams p) {
  fwd_rows<T, kFwdThreads, 1, false>(p, blockIdx.x, gridDim.x);
}

// grid.x = nblocks <= kMaxBwdBlocks (fixed by the shape); block b handles the row tiles b,
// b + nblocks, ... of (kBwdThreads / cpr) * kBwdRows tokens and writes p.part[b, 0:2H].
template <typename T>
__global__ __launch_bounds__(kBwdThreads, DT_GATE_MINB) void gdn_gate_bwd_kernel(const GateBwdParams p) {
  __shared__ float s_red[2 * kBwdThreads * kE];  // [dA_log | ddt_bias][thread, head of chunk] partials
  bwd_tiles<T, kBwdThreads, kBwdRows>(p, blockIdx.x, gridDim.x, s_red);
}

// ============================================================================== launchers
struct RowsOf {  // a 2D [T, Hv] view: row stride, rows aligned to 4 elements
  int64_t stride = 0;
  bool vec = false;
};

RowsOf rows_of(const TensorView& v, const Shape& shape, DType dt, Device dev, const char* op, const char* what) {
  DT_CHECK(v.device == dev && v.device.is_cuda(), "{}: {} must be a CUDA view on {}, got {}", op, what, dev.str(),
           v.str());
  DT_CHECK(v.dtype == dt, "{}: {} must be {}, got {}", op, what, dtype_name(dt), v.str());
  DT_CHECK(v.ndim() == 2 && v.shape == shape && (shape[1] <= 1 || v.stride[1] == 1),
           "{}: {} must be {} with a unit inner stride, got {}", op, what, shape.str(), v.str());
  RowsOf r;
  r.stride = v.stride[0];
  const int64_t sz = int64_t(dtype_size(dt));
  r.vec = reinterpret_cast<uintptr_t>(v.data) % uintptr_t(kE * sz) == 0 && r.stride % kE == 0;
  return r;
}

void check_param(const TensorView& p, int64_t n, Device dev, const char* op, const char* what) {
  DT_CHECK(p.device == dev, "{}: {} is on {}, expected {}", op, what, p.device.str(), dev.str());
  DT_CHECK(p.dtype == DType::f32 && p.numel() == n && p.is_contiguous(),
           "{}: {} must be a contiguous f32 view of {} elements, got {}", op, what, n, p.str());
}

void check_act(const TensorView& a, int64_t* T_, int64_t* H, const char* op) {
  DT_CHECK(a.device.is_cuda(), "{}: a must be a CUDA view, got {}", op, a.str());
  DT_CHECK(a.dtype == DType::bf16 || a.dtype == DType::f32, "{}: a must be bf16 or f32, got {}", op, a.str());
  DT_CHECK(a.ndim() == 2, "{}: a must be [T, Hv], got {}", op, a.str());
  *T_ = a.shape[0], *H = a.shape[1];
  DT_CHECK(*H >= 1 && *H <= kMaxH, "{}: Hv must be in [1, {}], got {} ({})", op, kMaxH, *H, a.str());
}

int chunks_per_row(int64_t H) { return ew::pow2_ceil((H + kE - 1) / kE); }  // <= 64

}  // namespace

GateFwdParams gate_fwd_params(const TensorView& g, const TensorView& beta, const TensorView& a, const TensorView& b,
                              const TensorView& A_log, const TensorView& dt_bias, const char* op) {
  int64_t T_, H;
  check_act(a, &T_, &H, op);
  const Shape sh{T_, H};
  const RowsOf ar = rows_of(a, sh, a.dtype, a.device, op, "a");                 // [T, Hv]
  const RowsOf br = rows_of(b, sh, a.dtype, a.device, op, "b");                 // [T, Hv]
  const RowsOf gr = rows_of(g, sh, DType::f32, a.device, op, "g");              // [T, Hv] f32
  const RowsOf ber = rows_of(beta, sh, DType::f32, a.device, op, "beta");       // [T, Hv] f32
  check_param(A_log, H, a.device, op, "A_log");                                 // [Hv] f32
  check_param(dt_bias, H, a.device, op, "dt_bias");                             // [Hv] f32
  GateFwdParams p{};
  p.g = g.ptr<float>(), p.beta = beta.ptr<float>(), p.a = a.data, p.b = b.data;
  p.A_log = A_log.ptr<float>(), p.dt_bias = dt_bias.ptr<float>();
  p.gs = gr.stride, p.betas = ber.stride, p.as = ar.stride, p.bs = br.stride;
  p.T = T_, p.H = int(H), p.cpr = chunks_per_row(H);
  p.vec = (ar.vec ? kVecA : 0) | (br.vec ? kVecB : 0) | (gr.vec ? kVecG : 0) | (ber.vec ? kVecBeta : 0) |
          (ew::aligned16(A_log.data) && ew::aligned16(dt_bias.data) ? kVecP : 0);
  return p;
}

GateBwdParams gate_bwd_params(const TensorView& da, const TensorView& db, const TensorView& dA_log,
                              const TensorView& ddt_bias, const TensorView& dg, const TensorView& dbeta,
                              const TensorView& a, const TensorView& b, const TensorView& A_log,
                              const TensorView& dt_bias, const char* op) {
  int64_t T_, H;
  check_act(a, &T_, &H, op);
  const Shape sh{T_, H};
  const RowsOf ar = rows_of(a, sh, a.dtype, a.device, op, "a");                 // [T, Hv]
  const RowsOf br = rows_of(b, sh, a.dtype, a.device, op, "b");                 // [T, Hv]
  const RowsOf dar = rows_of(da, sh, a.dtype, a.device, op, "da");              // [T, Hv] (=)
  const RowsOf dbr = rows_of(db, sh, a.dtype, a.device, op, "db");              // [T, Hv] (=)
  const RowsOf dgr = rows_of(dg, sh, DType::f32, a.device, op, "dg");           // [T, Hv] f32
  const RowsOf dber = rows_of(dbeta, sh, DType::f32, a.device, op, "dbeta");    // [T, Hv] f32
  check_param(A_log, H, a.device, op, "A_log");                                 // [Hv] f32
  check_param(dt_bias, H, a.device, op, "dt_bias");                             // [Hv] f32
  check_param(dA_log, H, a.device, op, "dA_log");                               // [Hv] f32 (+=)
  check_param(ddt_bias, H, a.device, op, "ddt_bias");                           // [Hv] f32 (+=)
  GateBwdParams p{};
  p.da = da.data, p.db = db.data, p.dg = dg.ptr<float>(), p.dbeta = dbeta.ptr<float>(), p.a = a.data, p.b = b.data;
  p.A_log = A_log.ptr<float>(), p.dt_bias = dt_bias.ptr<float>();
  p.das = dar.stride, p.dbs = dbr.stride, p.dgs = dgr.stride, p.dbetas = dber.stride, p.as = ar.stride;
  p.bs = br.stride;
  p.T = T_, p.H = int(H), p.cpr = chunks_per_row(H);
  p.vec = (ar.vec ? kVecA : 0) | (br.vec ? kVecB : 0) | (dar.vec ? kVecDa : 0) | (dbr.vec ? kVecDb : 0) |
          (dgr.vec ? kVecDg : 0) | (dber.vec ? kVecDbeta : 0) |
          (ew::aligned16(A_log.data) && ew::aligned16(dt_bias.data) ? kVecP : 0);
  return p;
}

void gdn_gate_fwd(const TensorView& g, const TensorView& beta, const TensorView& a, const TensorView& b,
                  const TensorView& A_log, const TensorView& dt_bias, Stream s) {
  constexpr const char* op = "cuda::gdn_gate_fwd";
  const GateFwdParams p = gate_fwd_params(g, beta, a, b, A_log, dt_bias, op);
  if (p.T == 0) return;
  ew::NvtxRange range(op);
  const cudaStream_t st = static_cast<cudaStream_t>(s.handle);
  const int64_t per_block = kFwdThreads / p.cpr;
  const unsigned grid = unsigned((p.T + per_block - 1) / per_block);
  if (a.dtype == DType::bf16) gdn_gate_fwd_kernel<__nv_bfloat16><<<grid, kFwdThreads, 0, st>>>(p);
  else gdn_gate_fwd_kernel<float><<<grid, kFwdThreads, 0, st>>>(p);
  DT_CUDA_LAUNCH_CHECK();
}

void gdn_gate_bwd(const TensorView& da, const TensorView& db, const TensorView& dA_log, const TensorView& ddt_bias,
                  const TensorView& dg, const TensorView& dbeta, const TensorView& a, const TensorView& b,
                  const TensorView& A_log, const TensorView& dt_bias, Stream s) {
  constexpr const char* op = "cuda::gdn_gate_bwd";
  GateBwdParams p = gate_bwd_params(da, db, dA_log, ddt_bias, dg, dbeta, a, b, A_log, dt_bias, op);
  if (p.T == 0) return;
  ew::NvtxRange range(op);
  const cudaStream_t st = static_cast<cudaStream_t>(s.handle);
  const int64_t nblocks = gate_block_count(p.T, p.cpr, kBwdThreads, kBwdRows, kMaxBwdBlocks);
  Tensor part = Tensor::empty(Shape{nblocks, 2 * int64_t(p.H)}, DType::f32, a.device);  // [nblocks, 2*Hv] f32 scratch
  p.part = part.ptr<float>();
  if (a.dtype == DType::bf16) gdn_gate_bwd_kernel<__nv_bfloat16><<<unsigned(nblocks), kBwdThreads, 0, st>>>(p);
  else gdn_gate_bwd_kernel<float><<<unsigned(nblocks), kBwdThreads, 0, st>>>(p);
  DT_CUDA_LAUNCH_CHECK();
  ew::colsum_add(dA_log.ptr<float>(), ddt_bias.ptr<float>(), p.part, nblocks, 2 * int64_t(p.H), p.H, st);
}

}  // namespace dt::ops::cuda
