// Varlen causal attention through cuDNN's SDPA (attention.backend=cudnn), fwd and fwd+bwd, bf16,
// in the shapes and output format of bench/attention.cu, so the two print comparable lines:
//   16 query heads / 2 KV heads of dim 256, (a) T = 32768 packed from lengths in [256, 8192];
//   (b) T = 8192 from lengths in [16, 300]. Same seed = same packs as bench/attention.
// Median of 20 timed runs (CUDA events) after warm-up; causal FLOPs over the real tokens: fwd
// 4 * sum_i L_i (L_i + 1) / 2 * D * Hq, bwd 2.5x fwd. The max_seqlen host hint is passed, as the
// layer does (no host sync per call). Before timing, the cuDNN outputs are compared with the
// native kernels' (rel. L2 of o, dq, dk, dv; both bf16, so ~1e-3 is expected).
// Usage: attention_cudnn [seed]. Prints the reason and exits 0 when the cuDNN path is unavailable.
#include <cmath>
#include <cstdio>
#include <random>
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

void bench(const char* name, const std::vector<int32_t>& cu, uint64_t seed) {
  const int64_t Hq = 16, Hkv = 2, D = 256, T = cu.back(), N = int64_t(cu.size()) - 1;
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
  auto empty = [&](Shape sh, DType t = DType::bf16) { return Tensor::empty(sh, t, dev); };
  Tensor q = rnd({T, Hq, D}, 1), k = rnd({T, Hkv, D}, 2), v = rnd({T, Hkv, D}, 3), d_o = rnd({T, Hq, D}, 4);
  Tensor o = empty({T, Hq, D}), lse = empty({T, Hq}, DType::f32), dq = empty({T, Hq, D}), dk = empty({T, Hkv, D}),
         dv = empty({T, Hkv, D});
  const dt::ops::AttnVarlen m{cu_d, cu_d, pos_d, 1, dt::ops::AttnBackend::cudnn, maxlen};
  const float scale = float(1.0 / std::sqrt(double(D)));
  auto fwd = [&] { dt::ops::attention_fwd(o, lse, q, k, v, m, scale, s); };
  auto bwd = [&] { dt::ops::attention_bwd(dq, dk, dv, d_o, q, k, v, o, lse, m, scale, s); };
  {  // agreement with the native kernels
    dt::ops::AttnVarlen mn = m;
    mn.backend = dt::ops::AttnBackend::native;
    Tensor on = empty({T, Hq, D}), ln = empty({T, Hq}, DType::f32), dqn = empty({T, Hq, D}),
           dkn = empty({T, Hkv, D}), dvn = empty({T, Hkv, D});
    dt::ops::attention_fwd(on, ln, q, k, v, mn, scale, s);
    dt::ops::attention_bwd(dqn, dkn, dvn, d_o, q, k, v, on, ln, mn, scale, s);
    fwd();
    bwd();
    std::printf("%-32s cudnn vs native rel. L2: o %.2e  dq %.2e  dk %.2e  dv %.2e\n", name, rel_l2(o, on),
                rel_l2(dq, dqn), rel_l2(dk, dkn), rel_l2(dv, dvn));
  }
  const double f_ms = dt::bench::median_ms(fwd, st);
  fwd();
  const double b_ms = dt::bench::median_ms(bwd, st);
  const double fb_ms = dt::bench::median_ms([&] { fwd(); bwd(); }, st);
  const double flops = 4.0 * pairs * double(D) * double(Hq);
  std::printf("%-32s T %6lld N %4lld | fwd %7.3f ms %6.1f TFLOP/s | bwd %7.3f ms %6.1f TFLOP/s | fwd+bwd %7.3f ms "
              "%6.1f TFLOP/s | %.2f Mtok/s fwd+bwd\n",
              name, static_cast<long long>(T), static_cast<long long>(N), f_ms, flops / f_ms * 1e-9, b_ms,
              2.5 * flops / b_ms * 1e-9, fb_ms, 3.5 * flops / fb_ms * 1e-9, double(T) / fb_ms * 1e-3);
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1234;
  std::mt19937_64 gen(seed);
  std::printf("varlen causal attention via cuDNN SDPA (THD), bf16, Hq 16, Hkv 2, D 256 (target: fwd >= 400 "
              "TFLOP/s)\n");
  if (const std::string why = dt::ops::cuda::cudnn_attention_unavailable(); !why.empty()) {
    std::printf("cuDNN path unavailable: %s\n", why.c_str());
    return 0;
  }
  const auto cu_a = draw_cu(gen, 32768, 256, 8192);
  bench("(a) 32K tok, lengths 256..8192", cu_a, seed);
  bench("(b) 8K tok, lengths 16..300", draw_cu(gen, 8192, 16, 300), seed);
  return 0;
}
