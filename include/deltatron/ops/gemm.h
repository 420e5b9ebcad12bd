// GEMM on row-major views:  C = alpha * op(A) @ op(B) + beta * C
//   A: [M, K] (or [K, M] with trans_a), B: [K, N] (or [N, K] with trans_b), C: [M, N].
// Rows may be strided (leading dim = stride[0] >= the row length; unit inner stride).
// CPU: fp32 only (OpenBLAS sgemm). CUDA: cuBLASLt, A/B both bf16 or both f32, C bf16 or f32,
// fp32 accumulation; f32 inputs use true fp32 math (no TF32) unless allow_tf32 is set.
// The cuBLASLt workspace comes from the CUDA caching allocator (no cudaMalloc per call
// once warm).
#pragma once
#include "deltatron/core/tensor.h"

namespace dt::ops {

struct GemmOpts {
  bool trans_a = false;
  bool trans_b = false;
  float alpha = 1.0f;
  float beta = 0.0f;  // beta = 1 accumulates into C
  bool allow_tf32 = false;
};

void gemm(const TensorView& c, const TensorView& a, const TensorView& b, const GemmOpts& o = {}, Stream s = {});

}  // namespace dt::ops
