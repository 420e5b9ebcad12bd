// Benchmark of the memory-bound GDN kernel families (issue 3), forward and backward, bf16, at the
// Qwen3.5-35B shape: T = 32768 packed tokens (16 sequences of 2048), conv_dim D = 2*16*128 +
// 32*128 = 8192, W = 4 (SiLU, no bias), Hk = 16, Hv = 32, dk = dv = 128.
//   conv1d_varlen   x, y, dy, dx [T, D]                                  src/ops/cuda/conv1d_varlen.cu
//   l2norm          q|k as one [T, 2*Hk, dk] view of the conv output [T, D] (row stride D);
//                   y [T, 2*Hk, dk] contiguous; dx into a [T, D] buffer (3D strided view)
//   gdn_gate        a, b [T, Hv] slices of a [T, 2*Hv] buffer [b | a]; g, beta, dg, dbeta f32
//   gated_rmsnorm   o [T, Hv, dv] contiguous; z [T, Hv, dv] inside [T, Hv*dv + 64] rows (3D)
// Bytes are the compulsory traffic of each call (every input read once, every output written
// once; the small parameter vectors, seq_idx and rstd included; backward scratch partials not
// counted). The ideal time is bytes / 4.3 TB/s (the project's measured H200 copy bandwidth,
// gdn-math.md 9.3); the issue's target is ratio <= 1.5.
// Timing: one stream; 3 warm-up calls; a 2 GiB fill keeps the GPU busy while the timed calls
// are queued (so host launch latency never shows); CUDA events around each of 30 calls, median
// (and min) reported. Inputs rotate over several sets so that the 60 MB L2 never holds the
// previous call's data. The same harness around a one-element fill gives the floor of any
// timed call (launch and event overhead), printed first: it matters for the gates, whose bytes
// take ~3 us. A second measurement times the same calls back to back between ONE pair of
// events (queued behind the fill again) and reports the mean per call: the time a kernel adds
// to a busy stream, without the per-call event overhead (the two agree for the large kernels).
// conv_gate times the conv with and without the gates in its launch (what the layer runs) and
// prints the gates' increment against their bytes.
// conv_l2norm times the conv + q|k L2 norm as the two ops and as the fused op the layer runs.
// Usage: gdn_elementwise [reps [family]] (family: conv | l2norm | gate | conv_gate | conv_l2norm |
// gated_rmsnorm, default all).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "deltatron/core/tensor.h"
#include "deltatron/ops/basic.h"
#include "deltatron/ops/gdn.h"
#include "deltatron/ops/varlen.h"
#include "bytes_bench.h"

namespace {

using dt::Device;
using dt::DType;
using dt::Shape;
using dt::Stream;
using dt::Tensor;
using dt::TensorView;
using namespace dt::bench;

constexpr int64_t T = 32768, Hk = 16, Hv = 32, dk = 128, dv = 128, W = 4;
constexpr int64_t D = 2 * Hk * dk + Hv * dv;  // 8192

// 3D view [A, B, C] over a 2D buffer's rows: row stride rs, B heads of C elements from column c0.
TensorView view3(const Tensor& buf, int64_t A, int64_t B, int64_t C, int64_t c0) {
  TensorView v = buf.view();
  v.data = v.at_offset(c0);
  v.shape = Shape{A, B, C};
  v.stride[0] = buf.shape()[1];
  v.stride[1] = C;
  v.stride[2] = 1;
  return v;
}

void bench_conv(const dt::ops::VarlenMeta& m, cudaStream_t st, const Tensor& busy) {
  const double act = double(T * D) * 2;  // one [T, D] bf16 tensor
  const double fwd_bytes = 2 * act + double(D * W) * 4 + double(T) * 4;
  const double bwd_bytes = 3 * act + 3 * double(D * W) * 4 + double(T) * 4;  // x, dy, dx; w, dw r+w; seq
  const int nsets = sets_for(4 * act);
  struct Set { Tensor x, y, dy, dx; };
  std::vector<Set> sets(static_cast<size_t>(nsets));
  for (int i = 0; i < nsets; ++i) {
    Set& s = sets[size_t(i)];
    s.x = Tensor::empty(Shape{T, D}, DType::bf16, kGpu), s.y = Tensor::empty(Shape{T, D}, DType::bf16, kGpu);
    s.dy = Tensor::empty(Shape{T, D}, DType::bf16, kGpu), s.dx = Tensor::empty(Shape{T, D}, DType::bf16, kGpu);
    rand_fill(s.x, 10 + i, -1.f, 1.f, st), rand_fill(s.dy, 50 + i, -1.f, 1.f, st);
  }
  Tensor w = Tensor::empty(Shape{D, W}, DType::f32, kGpu), dw = Tensor::zeros(Shape{D, W}, DType::f32, kGpu, {st});
  rand_fill(w, 99, -0.5f, 0.5f, st);
  time_kernel("conv1d_varlen fwd", fwd_bytes, nsets, st, busy, [&](int i) {
    dt::ops::causal_conv1d_fwd(sets[size_t(i)].y, sets[size_t(i)].x, w, TensorView{}, true, m, Stream{st});
  });
  check_finite("conv y", sets[0].y, st);
  time_kernel("conv1d_varlen bwd", bwd_bytes, nsets, st, busy, [&](int i) {
    const Set& s = sets[size_t(i)];
    dt::ops::causal_conv1d_bwd(s.dx, dw, TensorView{}, s.dy, s.x, w, TensorView{}, true, m, Stream{st});
  });
  check_finite("conv dx", sets[0].dx, st);
}

void bench_l2norm(cudaStream_t st, const Tensor& busy) {
  const int64_t H = 2 * Hk, rows = T * H;
  const double act = double(rows * dk) * 2;  // q|k bf16
  const double fwd_bytes = 2 * act + double(rows) * 4;
  const double bwd_bytes = 3 * act + double(rows) * 4;
  const int nsets = sets_for(4 * act);
  struct Set { Tensor conv, y, rstd, dy, dconv; };
  std::vector<Set> sets(static_cast<size_t>(nsets));
  for (int i = 0; i < nsets; ++i) {
    Set& s = sets[size_t(i)];
    s.conv = Tensor::empty(Shape{T, D}, DType::bf16, kGpu), s.y = Tensor::empty(Shape{T, H, dk}, DType::bf16, kGpu);
    s.rstd = Tensor::empty(Shape{rows}, DType::f32, kGpu), s.dy = Tensor::empty(Shape{T, H, dk}, DType::bf16, kGpu);
    s.dconv = Tensor::empty(Shape{T, D}, DType::bf16, kGpu);
    rand_fill(s.conv, 100 + i, -1.f, 1.f, st), rand_fill(s.dy, 150 + i, -1.f, 1.f, st);
  }
  time_kernel("l2norm fwd (q|k)", fwd_bytes, nsets, st, busy, [&](int i) {
    const Set& s = sets[size_t(i)];
    dt::ops::l2norm_fwd(s.y, s.rstd, view3(s.conv, T, H, dk, 0), 1e-6f, Stream{st});
  });
  check_finite("l2norm y", sets[0].y, st);
  time_kernel("l2norm bwd (q|k)", bwd_bytes, nsets, st, busy, [&](int i) {
    const Set& s = sets[size_t(i)];
    dt::ops::l2norm_bwd(view3(s.dconv, T, H, dk, 0), s.dy, view3(s.conv, T, H, dk, 0), s.rstd, Stream{st});
  });
  check_finite("l2norm dx", view3(sets[0].dconv, T, H, dk, 0), st);
}

void bench_gate(cudaStream_t st, const Tensor& busy) {
  const double act = double(T * Hv) * 2, f32 = double(T * Hv) * 4, par = double(Hv) * 4;
  const double fwd_bytes = 2 * act + 2 * f32 + 2 * par;
  const double bwd_bytes = 2 * act + 2 * f32 + 2 * act + 2 * par + 4 * par;
  const int nsets = sets_for(4 * act + 4 * f32);
  struct Set { Tensor ba, g, beta, dg, dbeta, dba; };
  std::vector<Set> sets(static_cast<size_t>(nsets));
  for (int i = 0; i < nsets; ++i) {
    Set& s = sets[size_t(i)];
    s.ba = Tensor::empty(Shape{T, 2 * Hv}, DType::bf16, kGpu), s.dba = Tensor::empty(Shape{T, 2 * Hv}, DType::bf16, kGpu);
    s.g = Tensor::empty(Shape{T, Hv}, DType::f32, kGpu), s.beta = Tensor::empty(Shape{T, Hv}, DType::f32, kGpu);
    s.dg = Tensor::empty(Shape{T, Hv}, DType::f32, kGpu), s.dbeta = Tensor::empty(Shape{T, Hv}, DType::f32, kGpu);
    rand_fill(s.ba, 200 + i, -4.f, 4.f, st), rand_fill(s.dg, 250 + i, -1.f, 1.f, st);
    rand_fill(s.dbeta, 300 + i, -1.f, 1.f, st);
  }
  Tensor A_log = Tensor::empty(Shape{Hv}, DType::f32, kGpu), dt_bias = Tensor::empty(Shape{Hv}, DType::f32, kGpu);
  rand_fill(A_log, 7, 0.f, 2.7f, st), rand_fill(dt_bias, 8, 0.5f, 1.5f, st);
  Tensor dA = Tensor::zeros(Shape{Hv}, DType::f32, kGpu, {st}), ddt = Tensor::zeros(Shape{Hv}, DType::f32, kGpu, {st});
  time_kernel("gdn_gate fwd", fwd_bytes, nsets, st, busy, [&](int i) {
    const Set& s = sets[size_t(i)];
    dt::ops::gdn_gate_fwd(s.g, s.beta, cols(s.ba, Hv, Hv), cols(s.ba, 0, Hv), A_log, dt_bias, Stream{st});
  });
  check_finite("gate g", sets[0].g, st);
  time_kernel("gdn_gate bwd", bwd_bytes, nsets, st, busy, [&](int i) {
    const Set& s = sets[size_t(i)];
    dt::ops::gdn_gate_bwd(cols(s.dba, Hv, Hv), cols(s.dba, 0, Hv), dA, ddt, s.dg, s.dbeta, cols(s.ba, Hv, Hv),
                          cols(s.ba, 0, Hv), A_log, dt_bias, Stream{st});
  });
  check_finite("gate da", cols(sets[0].dba, Hv, Hv), st);
}

// The layer's conv + q|k L2 norm (ops::causal_conv1d_l2norm_fwd) against the two ops it fuses:
// conv into [T, D], then l2norm of its q|k heads. Fused bytes: x read, qn|kn and v written once,
// rstd; the separate form also writes and re-reads c's q|k columns.
void bench_conv_l2norm(const dt::ops::VarlenMeta& m, cudaStream_t st, const Tensor& busy) {
  const int64_t H = 2 * Hk, qk = Hk * dk;
  const double act = double(T * D) * 2, qkb = double(T * 2 * qk) * 2, rs = double(T * H) * 4;
  const double fused = 2 * act + rs + double(D * W) * 4 + double(T) * 4;
  const double separate = fused + 2 * qkb;
  const int nsets = sets_for(3 * act);
  struct Set { Tensor x, c, qkn, rstd, v; };
  std::vector<Set> sets(static_cast<size_t>(nsets));
  for (int i = 0; i < nsets; ++i) {
    Set& s = sets[size_t(i)];
    s.x = Tensor::empty(Shape{T, D}, DType::bf16, kGpu), s.c = Tensor::empty(Shape{T, D}, DType::bf16, kGpu);
    s.qkn = Tensor::empty(Shape{2, T, Hk, dk}, DType::bf16, kGpu), s.rstd = Tensor::empty(Shape{2, T * Hk}, DType::f32, kGpu);
    s.v = Tensor::empty(Shape{T, D - 2 * qk}, DType::bf16, kGpu);
    rand_fill(s.x, 900 + i, -1.f, 1.f, st);
  }
  Tensor w = Tensor::empty(Shape{D, W}, DType::f32, kGpu);
  rand_fill(w, 97, -0.5f, 0.5f, st);
  time_kernel("conv1d fwd + l2norm fwd (q|k)", separate, nsets, st, busy, [&](int i) {
    const Set& s = sets[size_t(i)];
    dt::ops::causal_conv1d_fwd(s.c, s.x, w, TensorView{}, true, m, Stream{st});
    dt::ops::l2norm_fwd(s.qkn.view().reshape(Shape{T, H, dk}), s.rstd.view().flatten(),
                        view3(s.c, T, H, dk, 0), 1e-6f, Stream{st});
  });
  time_kernel("conv1d+l2norm fwd (fused)", fused, nsets, st, busy, [&](int i) {
    const Set& s = sets[size_t(i)];
    const TensorView q = s.qkn.view().slice(0, 0, 1).reshape(Shape{T, Hk, dk}),
                     k = s.qkn.view().slice(0, 1, 2).reshape(Shape{T, Hk, dk});
    const TensorView rq = s.rstd.view().slice(0, 0, 1).flatten(), rk = s.rstd.view().slice(0, 1, 2).flatten();
    dt::ops::causal_conv1d_l2norm_fwd({q, k, rq, rk, s.v}, s.x, w, TensorView{}, true, 1e-6f, m, nullptr, Stream{st});
  });
  check_finite("conv+l2norm qn", sets[0].qkn, st);

  // Backward: l2norm_bwd_y of q and k into dc's q|k columns, then the conv backward (dc's v
  // columns as the chunk backward left them), against the one launch (dq|dk, qn|kn, rstd and dv
  // read; dc's q|k columns never written).
  Tensor dqk = Tensor::empty(Shape{2, T, Hk, dk}, DType::bf16, kGpu), dvv = Tensor::empty(Shape{T, D - 2 * qk}, DType::bf16, kGpu);
  Tensor dc = Tensor::empty(Shape{T, D}, DType::bf16, kGpu), dx = Tensor::empty(Shape{T, D}, DType::bf16, kGpu);
  Tensor dw = Tensor::zeros(Shape{D, W}, DType::f32, kGpu, {st});
  rand_fill(dqk, 950, -1.f, 1.f, st), rand_fill(dvv, 951, -1.f, 1.f, st), rand_fill(dc, 952, -1.f, 1.f, st);
  const double bwd_fused = 3 * act + rs + 3 * double(D * W) * 4 + double(T) * 4 + qkb;  // x, dq|dk + dv, dx; qn|kn
  const double bwd_separate = bwd_fused + 2 * qkb;
  time_kernel("l2norm bwd (q|k) + conv1d bwd", bwd_separate, nsets, st, busy, [&](int i) {
    const Set& s = sets[size_t(i)];
    for (int j = 0; j < 2; ++j)
      dt::ops::l2norm_bwd_y(view3(dc, T, Hk, dk, j * qk), dqk.view().slice(0, j, j + 1).reshape(Shape{T, Hk, dk}),
                            s.qkn.view().slice(0, j, j + 1).reshape(Shape{T, Hk, dk}),
                            s.rstd.view().slice(0, j, j + 1).flatten(), Stream{st});
    dt::ops::causal_conv1d_bwd(dx, dw, TensorView{}, dc, s.x, w, TensorView{}, true, m, Stream{st});
  });
  time_kernel("conv1d+l2norm bwd (fused)", bwd_fused, nsets, st, busy, [&](int i) {
    const Set& s = sets[size_t(i)];
    auto part = [&](const Tensor& t2, int j) { return t2.view().slice(0, j, j + 1).reshape(Shape{T, Hk, dk}); };
    dt::ops::causal_conv1d_l2norm_bwd(dx, dw, TensorView{},
                                      {part(dqk, 0), part(dqk, 1), part(s.qkn, 0), part(s.qkn, 1),
                                       s.rstd.view().slice(0, 0, 1).flatten(), s.rstd.view().slice(0, 1, 2).flatten(), dvv},
                                      s.x, w, TensorView{}, true, m, nullptr, Stream{st});
  });
  check_finite("conv+l2norm dx", dx, st);
}

// The gates carried by the conv's launch (ops::causal_conv1d_gate_fwd/bwd, what the layer runs):
// conv alone and conv + gates on the same sets, back to back in one harness; the gates' cost is
// the difference, against the gates' own bytes (the 1.5x target applies to that increment).
void bench_conv_gate(const dt::ops::VarlenMeta& m, cudaStream_t st, const Tensor& busy) {
  const double act = double(T * D) * 2, gact = double(T * Hv) * 2, gf32 = double(T * Hv) * 4, par = double(Hv) * 4;
  const double conv_fwd = 2 * act + double(D * W) * 4 + double(T) * 4;
  const double conv_bwd = 3 * act + 3 * double(D * W) * 4 + double(T) * 4;
  const double gate_fwd = 2 * gact + 2 * gf32 + 2 * par;
  const double gate_bwd = 2 * gact + 2 * gf32 + 2 * gact + 2 * par + 4 * par;
  const int nsets = sets_for(4 * act + 4 * gact + 4 * gf32);
  struct Set { Tensor x, y, dy, dx, ba, dba, g, beta, dg, dbeta; };
  std::vector<Set> sets(static_cast<size_t>(nsets));
  for (int i = 0; i < nsets; ++i) {
    Set& s = sets[size_t(i)];
    s.x = Tensor::empty(Shape{T, D}, DType::bf16, kGpu), s.y = Tensor::empty(Shape{T, D}, DType::bf16, kGpu);
    s.dy = Tensor::empty(Shape{T, D}, DType::bf16, kGpu), s.dx = Tensor::empty(Shape{T, D}, DType::bf16, kGpu);
    s.ba = Tensor::empty(Shape{T, 2 * Hv}, DType::bf16, kGpu), s.dba = Tensor::empty(Shape{T, 2 * Hv}, DType::bf16, kGpu);
    s.g = Tensor::empty(Shape{T, Hv}, DType::f32, kGpu), s.beta = Tensor::empty(Shape{T, Hv}, DType::f32, kGpu);
    s.dg = Tensor::empty(Shape{T, Hv}, DType::f32, kGpu), s.dbeta = Tensor::empty(Shape{T, Hv}, DType::f32, kGpu);
    rand_fill(s.x, 600 + i, -1.f, 1.f, st), rand_fill(s.dy, 650 + i, -1.f, 1.f, st);
    rand_fill(s.ba, 700 + i, -4.f, 4.f, st), rand_fill(s.dg, 750 + i, -1.f, 1.f, st);
    rand_fill(s.dbeta, 800 + i, -1.f, 1.f, st);
  }
  Tensor w = Tensor::empty(Shape{D, W}, DType::f32, kGpu), dw = Tensor::zeros(Shape{D, W}, DType::f32, kGpu, {st});
  rand_fill(w, 98, -0.5f, 0.5f, st);
  Tensor A_log = Tensor::empty(Shape{Hv}, DType::f32, kGpu), dt_bias = Tensor::empty(Shape{Hv}, DType::f32, kGpu);
  rand_fill(A_log, 17, 0.f, 2.7f, st), rand_fill(dt_bias, 18, 0.5f, 1.5f, st);
  Tensor dA = Tensor::zeros(Shape{Hv}, DType::f32, kGpu, {st}), ddt = Tensor::zeros(Shape{Hv}, DType::f32, kGpu, {st});
  auto fwd_gates = [&](const Set& s) {
    return dt::ops::GdnGateFwdViews{s.g, s.beta, cols(s.ba, Hv, Hv), cols(s.ba, 0, Hv), A_log, dt_bias};
  };
  auto bwd_gates = [&](const Set& s) {
    return dt::ops::GdnGateBwdViews{cols(s.dba, Hv, Hv), cols(s.dba, 0, Hv), dA, ddt, s.dg, s.dbeta,
                                    cols(s.ba, Hv, Hv), cols(s.ba, 0, Hv), A_log, dt_bias};
  };
  const size_t r0 = g_results.size();
  time_kernel("conv1d fwd (alone)", conv_fwd, nsets, st, busy, [&](int i) {
    const Set& s = sets[size_t(i)];
    dt::ops::causal_conv1d_fwd(s.y, s.x, w, TensorView{}, true, m, Stream{st});
  });
  time_kernel("conv1d+gate fwd", conv_fwd + gate_fwd, nsets, st, busy, [&](int i) {
    const Set& s = sets[size_t(i)];
    dt::ops::causal_conv1d_gate_fwd(s.y, s.x, w, TensorView{}, true, m, fwd_gates(s), Stream{st});
  });
  check_finite("conv+gate g", sets[0].g, st);
  time_kernel("conv1d bwd (alone)", conv_bwd, nsets, st, busy, [&](int i) {
    const Set& s = sets[size_t(i)];
    dt::ops::causal_conv1d_bwd(s.dx, dw, TensorView{}, s.dy, s.x, w, TensorView{}, true, m, Stream{st});
  });
  time_kernel("conv1d+gate bwd", conv_bwd + gate_bwd, nsets, st, busy, [&](int i) {
    const Set& s = sets[size_t(i)];
    dt::ops::causal_conv1d_gate_bwd(s.dx, dw, TensorView{}, s.dy, s.x, w, TensorView{}, true, m, bwd_gates(s),
                                    Stream{st});
  });
  check_finite("conv+gate da", cols(sets[0].dba, Hv, Hv), st);
  const char* dir[2] = {"fwd", "bwd"};
  const double gbytes[2] = {gate_fwd, gate_bwd};
  for (int k = 0; k < 2; ++k) {
    const Result& alone = g_results[r0 + 2 * k];
    const Result& fused = g_results[r0 + 2 * k + 1];
    const double ideal_us = gbytes[k] / kCopyBytesPerS * 1e6;
    const double inc_med = (fused.med_ms - alone.med_ms) * 1e3, inc_b2b = (fused.b2b_ms - alone.b2b_ms) * 1e3;
    std::printf("gdn_gate %s in the conv launch: +%.2f us median, +%.2f us back to back over the conv alone; gate "
                "bytes %.2f MB = %.2f us; ratio %.2f median, %.2f back to back (target <= %.1f)\n",
                dir[k], inc_med, inc_b2b, gbytes[k] / 1e6, ideal_us, inc_med / ideal_us, inc_b2b / ideal_us, kTarget);
  }
  std::fflush(stdout);
}

void bench_gated_rmsnorm(cudaStream_t st, const Tensor& busy) {
  const int64_t rows = T * Hv;
  const double act = double(rows * dv) * 2;
  const double fwd_bytes = 3 * act + double(rows) * 4 + double(dv) * 4;
  const double bwd_bytes = 5 * act + double(rows) * 4 + 3 * double(dv) * 4;
  const int nsets = sets_for(7 * act);
  const int64_t zrow = Hv * dv + 64;  // z inside wider rows, like the in_proj output
  struct Set { Tensor o, zbuf, y, rstd, dy, do_, dz; };
  std::vector<Set> sets(static_cast<size_t>(nsets));
  for (int i = 0; i < nsets; ++i) {
    Set& s = sets[size_t(i)];
    s.o = Tensor::empty(Shape{T, Hv, dv}, DType::bf16, kGpu), s.zbuf = Tensor::empty(Shape{T, zrow}, DType::bf16, kGpu);
    s.y = Tensor::empty(Shape{T, Hv, dv}, DType::bf16, kGpu), s.rstd = Tensor::empty(Shape{rows}, DType::f32, kGpu);
    s.dy = Tensor::empty(Shape{T, Hv, dv}, DType::bf16, kGpu), s.do_ = Tensor::empty(Shape{T, Hv, dv}, DType::bf16, kGpu);
    s.dz = Tensor::empty(Shape{T, Hv, dv}, DType::bf16, kGpu);
    rand_fill(s.o, 400 + i, -2.f, 2.f, st), rand_fill(s.zbuf, 450 + i, -4.f, 4.f, st);
    rand_fill(s.dy, 500 + i, -1.f, 1.f, st);
  }
  Tensor w = Tensor::empty(Shape{dv}, DType::f32, kGpu), dw = Tensor::zeros(Shape{dv}, DType::f32, kGpu, {st});
  rand_fill(w, 9, 0.5f, 1.5f, st);
  time_kernel("gated_rmsnorm fwd", fwd_bytes, nsets, st, busy, [&](int i) {
    const Set& s = sets[size_t(i)];
    dt::ops::gated_rmsnorm_fwd(s.y, s.rstd, s.o, view3(s.zbuf, T, Hv, dv, 0), w, 1e-6f, Stream{st});
  });
  check_finite("gated_rmsnorm y", sets[0].y, st);
  time_kernel("gated_rmsnorm bwd", bwd_bytes, nsets, st, busy, [&](int i) {
    const Set& s = sets[size_t(i)];
    dt::ops::gated_rmsnorm_bwd(s.do_, s.dz, dw, s.dy, s.o, view3(s.zbuf, T, Hv, dv, 0), w, s.rstd, Stream{st});
  });
  check_finite("gated_rmsnorm do", sets[0].do_, st);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) g_reps = std::max(20, std::atoi(argv[1]));
  const std::string only = argc > 2 ? argv[2] : "";
  auto want = [&](const char* family) { return only.empty() || only == family; };
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("gdn_elementwise: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop{};
  DT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("gdn_elementwise: %s, %d SMs, L2 %.0f MB | T=%lld D=%lld W=%lld Hk=%lld Hv=%lld dk=%lld dv=%lld bf16 | "
              "%d reps, median | ideal = bytes / %.1f TB/s, target ratio <= %.1f\n",
              prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1048576.0, (long long)T, (long long)D,
              (long long)W, (long long)Hk, (long long)Hv, (long long)dk, (long long)dv, g_reps, kCopyBytesPerS / 1e12,
              kTarget);
  cudaStream_t st;
  DT_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  Tensor busy = Tensor::empty(Shape{int64_t(1) << 29}, DType::f32, kGpu);  // 2 GiB

  std::vector<int32_t> cu{0};
  for (int n = 0; n < 16; ++n) cu.push_back(cu.back() + int32_t(T / 16));
  dt::ops::VarlenBatch batch(cu, kGpu, Stream{st});

  bench_floor(st, busy);
  if (want("conv")) bench_conv(batch.meta(), st, busy);
  if (want("l2norm")) bench_l2norm(st, busy);
  if (want("gate")) bench_gate(st, busy);
  if (want("conv_gate")) bench_conv_gate(batch.meta(), st, busy);
  if (want("conv_l2norm")) bench_conv_l2norm(batch.meta(), st, busy);
  if (want("gated_rmsnorm")) bench_gated_rmsnorm(st, busy);

  dt::bench::print_table();
  DT_CUDA_CHECK(cudaStreamSynchronize(st));
  DT_CUDA_CHECK(cudaStreamDestroy(st));
  return 0;
}
