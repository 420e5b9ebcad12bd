// Internal: the table of GEMM candidates tuned inside a layer on one kind of GPU.
//
// cuBLASLt's heuristic ranks its candidates for a GEMM alone; inside the power-capped GDN layer a
// lower-ranked one can make the whole fwd+bwd faster (docs/perf.md v0.28.0-v0.29.0). For shapes
// measured that way by scripts/gemm_tune.sh, the table names the heuristic's candidate and the
// kernel configuration it had then (tile, stages, cluster, and the custom option where recorded). The CUDA gemm uses an entry only
// where the device's name, the shape, the transposes and the dtypes (bf16 in and out) all match
// and the heuristic's candidate still has that configuration; anything else gets the first.
// DT_GEMM_ALGO and DT_GEMM_CONFIG pins and DT_GEMM_AUTOTUNE override the table; DT_GEMM_TUNED=0 turns it off (read
// at every call). An entry matches on shape alone, so another layer's GEMM of the same shape,
// transposes and dtypes gets the same candidate.
#pragma once
#include <cstdint>
#include <span>
#include <string_view>

namespace dt::ops {

struct TunedGemm {
  const char* device;  // cudaDeviceProp::name
  int64_t m, n, k;     // C [m, n] = op(A) [m, k] op(B) [k, n]
  int trans;           // trans_a | trans_b << 1
  int candidate;       // index into cuBLASLt's heuristic list
  int tile, stages, cluster;  // CUBLASLT_ALGO_CONFIG_{TILE,STAGES,CLUSTER_SHAPE}_ID it had when measured
  int custom;                 // CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION it had, or -1: not recorded (not checked)
};

std::span<const TunedGemm> tuned_gemm_table();

// The entry for this bf16 GEMM on this device, or null (none, or DT_GEMM_TUNED=0).
const TunedGemm* tuned_gemm(std::string_view device, int64_t m, int64_t n, int64_t k, int trans);

}  // namespace dt::ops
