// Benchmark of the dense layers' element-wise kernels, forward and backward, bf16, at the bench
// model's shapes: T = 8192 tokens, hidden 1024, MLP intermediate F = 3584, attention 8 q heads and
// 2 kv heads of d = 256, rotary dim 64 (partial_rotary_factor 0.25), as the layers call them:
//   swiglu      g | u: the halves of one [T, 2F] buffer; y [T, F]; dg | du into one [T, 2F]
//                                                                        src/ops/cuda/swiglu.cu
//   rmsnorm1p   hidden: x, y, dy, dx [T, 1024]; q heads: x and dx the q half of each head of the
//               [T, 8 * 2 * 256] q|gate projection (rows [8T, 256], row stride 512), y, dy
//               contiguous; w, dw [D] f32, rstd f32            src/ops/cuda/rmsnorm1p.cu
//   rope        q in place [T, 8, 256]; k out of place into the k columns of [T, 2 * 2 * 256]
//                                                                        src/ops/cuda/attention.cu
//   sigmoid     y, o [8T, 256] contiguous; g the gate half of each head of the q|gate buffer
//   gate        (row stride 512); do contiguous, dg into the gate half  src/ops/cuda/attention.cu
//   add         the residual add, out = a + b, [T, 1024]                 src/ops/cuda/basic.cu
// Bytes are the compulsory traffic of each call (every input read once, every output written
// once; rstd, w and dw (read and written) included; the backward's dw partials not counted).
// RoPE in place reads and writes only the rotated dims (rd of d); out of place also copies the
// rest. Ideal = bytes / 4.3 TB/s; the harness (bytes_bench.h) reports the median of the timed
// calls, the ratio to the ideal, and the same calls back to back.
// Usage: dense_elementwise [reps [family]] (family: swiglu | rmsnorm | rope | gate | add, default all).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bytes_bench.h"
#include "core/cuda_check.h"
#include "deltatron/core/tensor.h"
#include "deltatron/ops/attention.h"
#include "deltatron/ops/basic.h"
#include "deltatron/ops/layers_ops.h"

namespace {

using dt::DType;
using dt::Shape;
using dt::Stream;
using dt::Tensor;
using dt::TensorView;
using namespace dt::bench;

constexpr int64_t T = 8192, Hd = 1024, F = 3584, Hq = 8, Hkv = 2, d = 256, rd = 64;
constexpr double kBf16 = 2;

Tensor bf16(Shape s) { return Tensor::empty(s, DType::bf16, kGpu); }
Tensor f32(Shape s) { return Tensor::empty(s, DType::f32, kGpu); }
// Columns [off, off + d) of each head of a [T, H * 2d] buffer, as [T * H, d] rows (row stride 2d).
TensorView head_half(const Tensor& buf, int64_t H, int64_t off) {
  return buf.view().reshape(Shape{T * H, 2 * d}).slice(1, off, off + d);
}

void bench_swiglu(cudaStream_t st, const Tensor& busy) {
  const double act = double(T * F) * kBf16;
  const int nsets = sets_for(5 * act);
  struct Set { Tensor gu, y, dy, dgu; };
  std::vector<Set> sets(static_cast<size_t>(nsets));
  for (int i = 0; i < nsets; ++i) {
    Set& s = sets[size_t(i)];
    s.gu = bf16(Shape{T, 2 * F}), s.y = bf16(Shape{T, F}), s.dy = bf16(Shape{T, F}), s.dgu = bf16(Shape{T, 2 * F});
    rand_fill(s.gu, 10 + i, -4.f, 4.f, st), rand_fill(s.dy, 50 + i, -1.f, 1.f, st);
  }
  time_kernel("swiglu fwd", 3 * act, nsets, st, busy, [&](int i) {
    const Set& s = sets[size_t(i)];
    dt::ops::swiglu_fwd(s.y, cols(s.gu, 0, F), cols(s.gu, F, F), Stream{st});
  });
  check_finite("swiglu y", sets[0].y, st);
  time_kernel("swiglu bwd", 5 * act, nsets, st, busy, [&](int i) {
    const Set& s = sets[size_t(i)];
    dt::ops::swiglu_bwd(cols(s.dgu, 0, F), cols(s.dgu, F, F), s.dy, cols(s.gu, 0, F), cols(s.gu, F, F), Stream{st});
  });
  check_finite("swiglu dg|du", sets[0].dgu, st);
}

void bench_rmsnorm(cudaStream_t st, const Tensor& busy) {
  {  // hidden: [T, 1024]
    const double act = double(T * Hd) * kBf16, vec = double(Hd) * 4, rows = double(T) * 4;
    const int nsets = sets_for(4 * act);
    struct Set { Tensor x, y, rstd, dy, dx; };
    std::vector<Set> sets(static_cast<size_t>(nsets));
    for (int i = 0; i < nsets; ++i) {
      Set& s = sets[size_t(i)];
      s.x = bf16(Shape{T, Hd}), s.y = bf16(Shape{T, Hd}), s.rstd = f32(Shape{T}), s.dy = bf16(Shape{T, Hd});
      s.dx = bf16(Shape{T, Hd});
      rand_fill(s.x, 100 + i, -2.f, 2.f, st), rand_fill(s.dy, 150 + i, -1.f, 1.f, st);
    }
    Tensor w = f32(Shape{Hd}), dw = Tensor::zeros(Shape{Hd}, DType::f32, kGpu, {st});
    rand_fill(w, 99, -0.5f, 0.5f, st);
    time_kernel("rmsnorm1p fwd [T,1024]", 2 * act + rows + vec, nsets, st, busy, [&](int i) {
      const Set& s = sets[size_t(i)];
      dt::ops::rmsnorm1p_fwd(s.y, s.rstd, s.x, w, 1e-6f, Stream{st});
    });
    check_finite("rmsnorm y", sets[0].y, st);
    time_kernel("rmsnorm1p bwd [T,1024]", 3 * act + rows + 3 * vec, nsets, st, busy, [&](int i) {
      const Set& s = sets[size_t(i)];
      dt::ops::rmsnorm1p_bwd(s.dx, dw, s.dy, s.x, w, s.rstd, Stream{st});
    });
    check_finite("rmsnorm dx", sets[0].dx, st);
  }
  {  // q heads: rows [8T, 256] of the q|gate buffer (row stride 512)
    const int64_t R = T * Hq;
    const double act = double(R * d) * kBf16, vec = double(d) * 4, rows = double(R) * 4;
    const int nsets = sets_for(4 * act);
    struct Set { Tensor qg, y, rstd, dy, dqg; };
    std::vector<Set> sets(static_cast<size_t>(nsets));
    for (int i = 0; i < nsets; ++i) {
      Set& s = sets[size_t(i)];
      s.qg = bf16(Shape{T, Hq * 2 * d}), s.y = bf16(Shape{R, d}), s.rstd = f32(Shape{R}), s.dy = bf16(Shape{R, d});
      s.dqg = bf16(Shape{T, Hq * 2 * d});
      rand_fill(s.qg, 200 + i, -2.f, 2.f, st), rand_fill(s.dy, 250 + i, -1.f, 1.f, st);
    }
    Tensor w = f32(Shape{d}), dw = Tensor::zeros(Shape{d}, DType::f32, kGpu, {st});
    rand_fill(w, 98, -0.5f, 0.5f, st);
    time_kernel("rmsnorm1p fwd q heads", 2 * act + rows + vec, nsets, st, busy, [&](int i) {
      const Set& s = sets[size_t(i)];
      dt::ops::rmsnorm1p_fwd(s.y, s.rstd, head_half(s.qg, Hq, 0), w, 1e-6f, Stream{st});
    });
    check_finite("rmsnorm q y", sets[0].y, st);
    time_kernel("rmsnorm1p bwd q heads", 3 * act + rows + 3 * vec, nsets, st, busy, [&](int i) {
      const Set& s = sets[size_t(i)];
      dt::ops::rmsnorm1p_bwd(head_half(s.dqg, Hq, 0), dw, s.dy, head_half(s.qg, Hq, 0), w, s.rstd, Stream{st});
    });
    check_finite("rmsnorm q dx", head_half(sets[0].dqg, Hq, 0), st);
  }
}

void bench_rope(cudaStream_t st, const Tensor& busy) {
  std::vector<int32_t> posv(T);
  for (int64_t t = 0; t < T; ++t) posv[size_t(t)] = int32_t(t % 4096);  // packed sequences of 4096
  Tensor pos_h = Tensor::empty(Shape{T}, DType::i32);
  std::copy(posv.begin(), posv.end(), pos_h.ptr<int32_t>());
  Tensor pos = dt::ops::to_device(pos_h, kGpu);
  const double theta = 1e7;
  {  // q in place: only the rotated dims move
    const double bytes = 2 * double(T * Hq * rd) * kBf16 + double(T) * 4;
    const int nsets = sets_for(double(T * Hq * d) * kBf16);
    std::vector<Tensor> q(static_cast<size_t>(nsets));
    for (int i = 0; i < nsets; ++i) q[size_t(i)] = bf16(Shape{T, Hq, d}), rand_fill(q[size_t(i)], 300 + i, -1.f, 1.f, st);
    time_kernel("rope fwd q (in place)", bytes, nsets, st, busy, [&](int i) {
      dt::ops::rope_fwd(q[size_t(i)], q[size_t(i)], pos, rd, theta, Stream{st});
    });
    time_kernel("rope bwd q (in place)", bytes, nsets, st, busy, [&](int i) {
      dt::ops::rope_bwd(q[size_t(i)], q[size_t(i)], pos, rd, theta, Stream{st});
    });
    check_finite("rope q", q[0], st);
  }
  {  // k out of place: kn [T, 2, 256] -> the k columns of kvl [T, 2 * 2 * 256]
    const double bytes = 2 * double(T * Hkv * d) * kBf16 + double(T) * 4;
    const int nsets = sets_for(bytes);
    struct Set { Tensor kn, kvl; };
    std::vector<Set> sets(static_cast<size_t>(nsets));
    for (int i = 0; i < nsets; ++i) {
      sets[size_t(i)].kn = bf16(Shape{T, Hkv, d}), sets[size_t(i)].kvl = bf16(Shape{T, 2 * Hkv * d});
      rand_fill(sets[size_t(i)].kn, 350 + i, -1.f, 1.f, st);
    }
    auto kcols = [](const Tensor& kvl) {
      TensorView v = cols(kvl, 0, Hkv * d);
      v.shape = Shape{T, Hkv, d};
      v.stride = {kvl.shape()[1], d, 1};
      return v;
    };
    time_kernel("rope fwd k (out of place)", bytes, nsets, st, busy, [&](int i) {
      dt::ops::rope_fwd(kcols(sets[size_t(i)].kvl), sets[size_t(i)].kn, pos, rd, theta, Stream{st});
    });
    check_finite("rope k", kcols(sets[0].kvl), st);
  }
}

void bench_gate(cudaStream_t st, const Tensor& busy) {
  const int64_t R = T * Hq;
  const double act = double(R * d) * kBf16;
  const int nsets = sets_for(6 * act);
  struct Set { Tensor qg, o, y, dy, d_o, dqg; };
  std::vector<Set> sets(static_cast<size_t>(nsets));
  for (int i = 0; i < nsets; ++i) {
    Set& s = sets[size_t(i)];
    s.qg = bf16(Shape{T, Hq * 2 * d}), s.o = bf16(Shape{R, d}), s.y = bf16(Shape{R, d}), s.dy = bf16(Shape{R, d});
    s.d_o = bf16(Shape{R, d}), s.dqg = bf16(Shape{T, Hq * 2 * d});
    rand_fill(s.qg, 400 + i, -4.f, 4.f, st), rand_fill(s.o, 450 + i, -1.f, 1.f, st), rand_fill(s.dy, 480 + i, -1.f, 1.f, st);
  }
  time_kernel("sigmoid_gate fwd", 3 * act, nsets, st, busy, [&](int i) {
    const Set& s = sets[size_t(i)];
    dt::ops::sigmoid_gate_fwd(s.y, s.o, head_half(s.qg, Hq, d), Stream{st});
  });
  check_finite("gate y", sets[0].y, st);
  time_kernel("sigmoid_gate bwd", 5 * act, nsets, st, busy, [&](int i) {
    const Set& s = sets[size_t(i)];
    dt::ops::sigmoid_gate_bwd(s.d_o, head_half(s.dqg, Hq, d), s.dy, s.o, head_half(s.qg, Hq, d), Stream{st});
  });
  check_finite("gate do", sets[0].d_o, st);
}

void bench_add(cudaStream_t st, const Tensor& busy) {
  const double act = double(T * Hd) * kBf16;
  const int nsets = sets_for(3 * act);
  struct Set { Tensor a, b, out; };
  std::vector<Set> sets(static_cast<size_t>(nsets));
  for (int i = 0; i < nsets; ++i) {
    Set& s = sets[size_t(i)];
    s.a = bf16(Shape{T, Hd}), s.b = bf16(Shape{T, Hd}), s.out = bf16(Shape{T, Hd});
    rand_fill(s.a, 500 + i, -1.f, 1.f, st), rand_fill(s.b, 550 + i, -1.f, 1.f, st);
  }
  time_kernel("add (residual)", 3 * act, nsets, st, busy, [&](int i) {
    const Set& s = sets[size_t(i)];
    dt::ops::add(s.out, s.a, s.b, Stream{st});
  });
  check_finite("add out", sets[0].out, st);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) g_reps = std::max(20, std::atoi(argv[1]));
  const std::string only = argc > 2 ? argv[2] : "";
  auto want = [&](const char* family) { return only.empty() || only == family; };
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("dense_elementwise: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop{};
  DT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("dense_elementwise: %s, %d SMs, L2 %.0f MB | T=%lld hidden=%lld F=%lld Hq=%lld Hkv=%lld d=%lld rd=%lld "
              "bf16 | %d reps, median | ideal = bytes / %.1f TB/s, target ratio <= %.1f\n",
              prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1048576.0, (long long)T, (long long)Hd,
              (long long)F, (long long)Hq, (long long)Hkv, (long long)d, (long long)rd, g_reps, kCopyBytesPerS / 1e12,
              kTarget);
  cudaStream_t st;
  DT_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  Tensor busy = Tensor::empty(Shape{int64_t(1) << 29}, DType::f32, kGpu);  // 2 GiB

  bench_floor(st, busy);
  if (want("swiglu")) bench_swiglu(st, busy);
  if (want("rmsnorm")) bench_rmsnorm(st, busy);
  if (want("rope")) bench_rope(st, busy);
  if (want("gate")) bench_gate(st, busy);
  if (want("add")) bench_add(st, busy);

  print_table();
  DT_CUDA_CHECK(cudaStreamSynchronize(st));
  DT_CUDA_CHECK(cudaStreamDestroy(st));
  return 0;
}
