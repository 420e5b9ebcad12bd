#include "ops/gemm_tuned.h"

#include "core/env_knob.h"

namespace dt::ops {
namespace {

// bench/gdn_layer's GEMMs (H 2048, Hk 16, Hv 32, dk = dv = 128, T 32768 tokens: Qwen3-Next's
// GDN layer) on an H100 SXM with CUDA 13's cuBLASLt. Each shape's 8 heuristic candidates were
// A/B'd one by one inside the layer, then the winners together (docs/perf.md v0.29.0): per
// fwd+bwd -0.27 to -0.41 ms in one-iteration paired A/Bs, and -0.04, -0.18 and -0.21 ms in A/Bs
// of 10-iteration blocks, which let the power cap settle as in a steady run. The weight-gradient
// shapes keep the first. The custom option is recorded where a log named it (v0.30.0's
// DT_GEMM_AUTOTUNE=2 run: in_proj fwd's candidate 7 is 197.35.5.2).
constexpr TunedGemm kTable[] = {
    {"NVIDIA H100 80GB HBM3", 32768, 12352, 2048, 2, 7, 197, 35, 5, 2},  // in_proj fwd
    {"NVIDIA H100 80GB HBM3", 32768, 2048, 4096, 2, 4, 29, 35, 3, -1},   // out_proj fwd
    {"NVIDIA H100 80GB HBM3", 32768, 4096, 2048, 0, 5, 29, 35, 3, -1},   // out_proj dX
    {"NVIDIA H100 80GB HBM3", 32768, 2048, 12352, 0, 4, 29, 35, 3, -1},  // in_proj dX
};

}  // namespace

std::span<const TunedGemm> tuned_gemm_table() { return kTable; }

const TunedGemm* tuned_gemm(std::string_view device, int64_t m, int64_t n, int64_t k, int trans) {
  if (env::choice("DT_GEMM_TUNED", {{"0", "cuBLASLt's first candidate for every shape"},
                                    {"1", "the tuned table where device and shape match (default)"}}) == 0)
    return nullptr;
  for (const TunedGemm& e : kTable)
    if (device == e.device && e.m == m && e.n == n && e.k == k && e.trans == trans) return &e;
  return nullptr;
}

}  // namespace dt::ops
