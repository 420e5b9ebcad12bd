// Benchmark of the chunked gated delta rule (src/ops/cuda/gdn_chunk.cu), bf16, dk = dv = 128,
// at the issue's shapes, with FLA/Triton H200 numbers beside ours:
//   (a) T = 32768 packed from lengths drawn in [256, 8192], Hk = 16, Hv = 32  (FLA fwd 2.70, fwd+bwd 8.34 ms)
//   (b) same packing, Hk = 8, Hv = 16                                          (FLA fwd 1.97, fwd+bwd 5.22 ms)
//   (c) T = 8192 from ~50 sequences of 16..300 tokens, Hk = 16, Hv = 32       (FLA fwd+bwd 4.34 ms)
//   (d) T = 8192 from lengths in [256, 4096], Hk = Hv = 16: bench-0.8b's GDN layers (no FLA number)
// DT_GDN_SERIAL=tile|warp4|warp8 picks the serial kernels (src/ops/cuda/gdn_chunk.cu); the header
// line prints it.
// Timing: CUDA events around each call on one stream, 3 warm-up calls, median of 20 repetitions.
// TFLOP/s use the FLA-style count of gdn-math.md 9.1 (with the backward's recomputation):
//   F_fwd = 6 C dk + 4 C dv + 6 dk dv + C^2/2,  F_bwd = 18 C dk + 10 C dv + 18 dk dv + 4 C^2  per token and v-head.
// Inputs are random (never zeros): q, k uniform with ||k|| ~ 1, v and dO uniform, g in [-2, -1e-3],
// beta in [0, 1]; no h0/dht (training). Usage: gdn_kernels [seed]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "bench_util.h"
#include "core/cuda_check.h"
#include "deltatron/core/sha256.h"
#include "deltatron/core/tensor.h"
#include "deltatron/ops/basic.h"
#include "deltatron/ops/gdn.h"
#include "deltatron/ops/varlen.h"

namespace {

using dt::bench::draw_cu;
using dt::bench::i32_dev;

using dt::Device;
using dt::DType;
using dt::Shape;
using dt::Tensor;

struct Row {
  const char* name;
  int64_t T, N;
  double fwd_ms, bwd_ms, fb_ms, fwd_tf, fb_tf, fla_fwd, fla_fb, fb_saved_ms;
};


Row bench(const char* name, const std::vector<int32_t>& cu, int64_t Hk, int64_t Hv, uint64_t seed, double fla_fwd,
          double fla_fb) {
  const int64_t dk = 128, dv = 128, T = cu.back(), N = int64_t(cu.size()) - 1;
  const Device dev = Device::cuda();
  dt::Stream s{};
  cudaStream_t st = dt::cuda_stream(s);
  dt::ops::VarlenBatch vb(cu, dev, s);
  auto rnd = [&](Shape sh, DType t, float lo, float hi, uint64_t stream) {
    Tensor x = Tensor::empty(sh, t, dev);
    dt::ops::rng_uniform(x, seed, stream, lo, hi, dt::ops::RngSlice::whole(x), s);
    return x;
  };
  const float a = std::sqrt(3.0f / float(dk));
  Tensor q = rnd({T, Hk, dk}, DType::bf16, -a, a, 1);        // [T, Hk, dk] bf16
  Tensor k = rnd({T, Hk, dk}, DType::bf16, -a, a, 2);        // [T, Hk, dk] bf16
  Tensor v = rnd({T, Hv, dv}, DType::bf16, -1.7f, 1.7f, 3);  // [T, Hv, dv] bf16
  Tensor dO = rnd({T, Hv, dv}, DType::bf16, -1.7f, 1.7f, 4); // [T, Hv, dv] bf16
  Tensor g = rnd({T, Hv}, DType::f32, -2.0f, -1e-3f, 5);     // [T, Hv] f32
  Tensor beta = rnd({T, Hv}, DType::f32, 0.0f, 1.0f, 6);     // [T, Hv] f32
  Tensor o = Tensor::empty({T, Hv, dv}, DType::bf16, dev);
  Tensor ht = Tensor::empty({N, Hv, dk, dv}, DType::f32, dev);
  Tensor dq = Tensor::empty({T, Hk, dk}, DType::bf16, dev), dkk = Tensor::empty({T, Hk, dk}, DType::bf16, dev);
  Tensor dvv = Tensor::empty({T, Hv, dv}, DType::bf16, dev);
  Tensor dg = Tensor::empty({T, Hv}, DType::f32, dev), db = Tensor::empty({T, Hv}, DType::f32, dev);
  Tensor dh0 = Tensor::empty({N, Hv, dk, dv}, DType::f32, dev);
  dt::ops::GdnArgs args;
  const dt::TensorView none;
  auto fwd = [&] { dt::ops::gdn_chunk_fwd(o, ht, q, k, v, g, beta, none, args, vb.meta(), s); };
  auto bwd = [&] {
    dt::ops::gdn_chunk_bwd(dq, dkk, dvv, dg, db, dh0, dO, none, q, k, v, g, beta, none, args, vb.meta(), s);
  };
  Row r{name, T, N, 0, 0, 0, 0, 0, fla_fwd, fla_fb, 0};
  r.fwd_ms = dt::bench::median_ms(fwd, st);
  r.bwd_ms = dt::bench::median_ms(bwd, st);
  r.fb_ms = dt::bench::median_ms([&] { fwd(); bwd(); }, st);
  // The forward hands its intermediates to the backward (GdnChunkSaved): no prep/state recompute.
  dt::ops::GdnChunkSaved saved;
  dt::ops::GdnArgs sargs;
  sargs.saved = &saved;
  r.fb_saved_ms = dt::bench::median_ms(
      [&] {
        dt::ops::gdn_chunk_fwd(o, ht, q, k, v, g, beta, none, sargs, vb.meta(), s);
        dt::ops::gdn_chunk_bwd(dq, dkk, dvv, dg, db, dh0, dO, none, q, k, v, g, beta, none, sargs, vb.meta(), s);
        saved.clear();
      },
      st);
  const double C = 64, Ff = 6 * C * dk + 4 * C * dv + 6.0 * dk * dv + C * C / 2;
  const double Fb = 18 * C * dk + 10 * C * dv + 18.0 * dk * dv + 4 * C * C;
  const double th = double(T) * double(Hv);
  r.fwd_tf = th * Ff / (r.fwd_ms * 1e-3) / 1e12;
  r.fb_tf = th * (Ff + Fb) / (r.fb_ms * 1e-3) / 1e12;
  Tensor total = Tensor::empty(Shape{1}, DType::f32, o.device());
  dt::ops::sum(total, o, s);
  const float sum = dt::ops::item(total, s);  // a sanity read: the output must be finite
  // The outputs' bits (the last call: saved intermediates), so that two builds can be compared
  // exactly: a kernel change that keeps every product and sum order must keep this digest.
  dt::Sha256 sha;
  std::vector<unsigned char> host;
  for (const Tensor* t : {&o, &dq, &dkk, &dvv, &dg, &db}) {
    host.resize(t->nbytes());
    DT_CUDA_CHECK(cudaMemcpy(host.data(), t->data(), t->nbytes(), cudaMemcpyDeviceToHost));
    sha.update(host.data(), host.size());
  }
  const std::string digest = dt::to_hex(sha.finish()).substr(0, 16);
  std::printf("%-40s T=%lld N=%lld Hk=%lld Hv=%lld: fwd %.3f ms (%.2f Mtok/s, %.0f TFLOP/s) bwd %.3f ms, fwd+bwd "
              "%.3f ms (%.2f Mtok/s, %.0f TFLOP/s), fwd+bwd with saved intermediates %.3f ms, outputs' sha256 %s%s\n",
              name, (long long)T, (long long)N, (long long)Hk, (long long)Hv, r.fwd_ms, T / r.fwd_ms / 1e3, r.fwd_tf,
              r.bwd_ms, r.fb_ms, T / r.fb_ms / 1e3, r.fb_tf, r.fb_saved_ms, digest.c_str(), std::isfinite(sum) ? "" : "  NON-FINITE OUTPUT");
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1234;
  std::mt19937_64 gen(seed);
  const char* serial = std::getenv("DT_GDN_SERIAL");
  std::printf("gdn_chunk bench, bf16, dk = dv = 128, seed %llu, DT_GDN_SERIAL=%s; TFLOP/s by the FLA-style count "
              "(gdn-math.md 9.1)\n",
              (unsigned long long)seed, serial && *serial ? serial : "(unset)");
  const auto cu_a = draw_cu(gen, 32768, 256, 8192);
  std::vector<Row> rows;
  rows.push_back(bench("(a) 32K tok, 256..8192, Hk16 Hv32", cu_a, 16, 32, seed, 2.70, 8.34));
  rows.push_back(bench("(b) 32K tok, 256..8192, Hk8 Hv16", cu_a, 8, 16, seed, 1.97, 5.22));
  rows.push_back(bench("(c) 8K tok, 16..300, Hk16 Hv32", draw_cu(gen, 8192, 16, 300), 16, 32, seed, NAN, 4.34));
  rows.push_back(bench("(d) 8K tok, 256..4096, Hk16 Hv16", draw_cu(gen, 8192, 256, 4096), 16, 16, seed, NAN, NAN));
  std::printf("\n| shape | T | N | fwd ms | FLA fwd | fwd+bwd ms | saved: fwd+bwd ms | FLA fwd+bwd | fwd+bwd TFLOP/s |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows)
    std::printf("| %s | %lld | %lld | %.3f | %.2f | %.3f | %.3f | %.2f | %.0f |\n", r.name, (long long)r.T,
                (long long)r.N, r.fwd_ms, r.fla_fwd, r.fb_ms, r.fb_saved_ms, r.fla_fb, r.fb_tf);
  return 0;
}
