// Varlen causal attention (the gated-attention kernel of issue 5), fwd and fwd+bwd, bf16:
//   16 query heads / 2 KV heads of dim 256 (the Qwen3-Next full-attention shape),
//   (a) T = 32768 packed from lengths drawn in [256, 8192]; (b) T = 8192 from lengths in [16, 300];
//   (c) bench-0.8b's attention: 8 query heads / 2 KV heads of dim 256, T = 8192 from lengths in
//   [256, 4096] (what bench/train_step's six attention layers see).
// Each case runs the native kernels and, when cuDNN's path can run here (cuDNN >= 9.19 and the
// frontend headers: attention.backend=cudnn), cuDNN's SDPA too, after printing how far the
// cuDNN outputs are from the native ones (rel. L2 of o, dq, dk, dv; both bf16: ~1e-3 expected).
// Median of 20 timed runs (CUDA events) after warm-up. FLOPs are the causal ones over the real
// tokens: fwd 4 * sum_i L_i (L_i + 1) / 2 * D * Hq (QK^T and PV), bwd 2.5x fwd (five products;
// the native dq/dkv split recomputes two more, which are not counted). Target: >= 400 TFLOP/s fwd.
// Usage: attention [seed] [lengths_out.txt]  (the lengths of (a), one per line, for
// bench/attention_torch.py, which times PyTorch's scaled_dot_product_attention per sequence).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "deltatron/core/tensor.h"
#include "deltatron/ops/attention.h"
#include "deltatron/ops/basic.h"
#include "ops/attention_backends.h"

using dt::Device;
using dt::DType;
using dt::Shape;
using dt::Tensor;

namespace {

using dt::bench::draw_cu;
using dt::bench::i32_dev;


// ||a - b|| / ||b|| over two device views of one shape.
double rel_l2(const Tensor& a, const Tensor& b) {
  Tensor x = Tensor::empty(a.shape(), DType::f32), y = Tensor::empty(b.shape(), DType::f32);
  dt::ops::copy(x, dt::ops::to_host(a));
  dt::ops::copy(y, dt::ops::to_host(b));
  double num = 0, den = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double d = double(x.ptr<float>()[i]) - double(y.ptr<float>()[i]);
    num += d * d;
    den += double(y.ptr<float>()[i]) * double(y.ptr<float>()[i]);
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

struct Outs {
  Tensor o, lse, dq, dk, dv;
};

void bench(const char* name, const std::vector<int32_t>& cu, uint64_t seed, bool with_cudnn, int64_t Hq = 16) {
  const int64_t Hkv = 2, D = 256, T = cu.back(), N = int64_t(cu.size()) - 1;
  const Device dev = Device::cuda();
  dt::Stream s{};
  cudaStream_t st = static_cast<cudaStream_t>(s.handle);
  std::vector<int32_t> pos;
  double pairs = 0;
  int64_t maxlen = 0;
  for (int64_t i = 0; i < N; ++i) {
    const int64_t L = cu[size_t(i + 1)] - cu[size_t(i)];
    for (int64_t p = 0; p < L; ++p) pos.push_back(int32_t(p));
    pairs += double(L) * double(L + 1) / 2;
    maxlen = std::max(maxlen, L);
  }
  Tensor cu_d = i32_dev(cu), pos_d = i32_dev(pos);
  auto rnd = [&](Shape sh, uint64_t stream) {
    Tensor x = Tensor::empty(sh, DType::bf16, dev);
    dt::ops::rng_uniform(x, seed, stream, -1.f, 1.f, dt::ops::RngSlice::whole(x), s);
    return x;
  };
  auto outs = [&] {
    return Outs{Tensor::empty(Shape{T, Hq, D}, DType::bf16, dev), Tensor::empty(Shape{T, Hq}, DType::f32, dev),
                Tensor::empty(Shape{T, Hq, D}, DType::bf16, dev), Tensor::empty(Shape{T, Hkv, D}, DType::bf16, dev),
                Tensor::empty(Shape{T, Hkv, D}, DType::bf16, dev)};
  };
  Tensor q = rnd({T, Hq, D}, 1), k = rnd({T, Hkv, D}, 2), v = rnd({T, Hkv, D}, 3), d_o = rnd({T, Hq, D}, 4);
  const float scale = float(1.0 / std::sqrt(double(D)));
  const double flops = 4.0 * pairs * double(D) * double(Hq);
  Outs native;
  for (dt::ops::AttnBackend be : {dt::ops::AttnBackend::native, dt::ops::AttnBackend::cudnn}) {
    const bool cudnn = be == dt::ops::AttnBackend::cudnn;
    if (cudnn && !with_cudnn) break;
    const dt::ops::AttnVarlen m{cu_d, cu_d, pos_d, 1, be, maxlen};
    Outs r = outs();
    auto fwd = [&] { dt::ops::attention_fwd(r.o, r.lse, q, k, v, m, scale, s); };
    auto bwd = [&] { dt::ops::attention_bwd(r.dq, r.dk, r.dv, d_o, q, k, v, r.o, r.lse, m, scale, s); };
    fwd();
    bwd();
    if (cudnn)
      std::printf("%-32s cudnn vs native rel. L2: o %.2e  dq %.2e  dk %.2e  dv %.2e\n", name, rel_l2(r.o, native.o),
                  rel_l2(r.dq, native.dq), rel_l2(r.dk, native.dk), rel_l2(r.dv, native.dv));
    const double f_ms = dt::bench::median_ms(fwd, st);
    fwd();
    const double b_ms = dt::bench::median_ms(bwd, st);
    const double fb_ms = dt::bench::median_ms([&] { fwd(); bwd(); }, st);
    std::printf("%-32s %-6s T %6lld N %4lld | fwd %7.3f ms %6.1f TFLOP/s | bwd %7.3f ms %6.1f TFLOP/s | fwd+bwd "
                "%7.3f ms %6.1f TFLOP/s | %.2f Mtok/s fwd+bwd\n",
                name, cudnn ? "cudnn" : "native", static_cast<long long>(T), static_cast<long long>(N), f_ms,
                flops / f_ms * 1e-9, b_ms, 2.5 * flops / b_ms * 1e-9, fb_ms, 3.5 * flops / fb_ms * 1e-9,
                double(T) / fb_ms * 1e-3);
    if (!cudnn) native = std::move(r);  // the outputs of the last timed fwd + bwd
  }
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1234;
  std::mt19937_64 gen(seed);
  std::printf("varlen causal attention, bf16, Hq 16 ((c): 8), Hkv 2, D 256 (target: fwd >= 400 TFLOP/s)\n");
  const std::string why = dt::ops::cuda::cudnn_attention_unavailable();
  if (!why.empty()) std::printf("cuDNN path not run: %s\n", why.c_str());
  const auto cu_a = draw_cu(gen, 32768, 256, 8192);
  if (argc > 2) {
    std::ofstream f(argv[2]);
    for (size_t i = 1; i < cu_a.size(); ++i) f << cu_a[i] - cu_a[i - 1] << "\n";
  }
  bench("(a) 32K tok, lengths 256..8192", cu_a, seed, why.empty());
  bench("(b) 8K tok, lengths 16..300", draw_cu(gen, 8192, 16, 300), seed, why.empty());
  bench("(c) 8K tok, lengths 256..4096, Hq 8", draw_cu(gen, 8192, 256, 4096), seed, why.empty(), 8);
  return 0;
}
