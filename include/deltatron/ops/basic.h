// Basic tensor ops. Each dispatches on the device of its views to the CPU implementation
// (src/ops/cpu/basic.cpp) or the CUDA one (src/ops/cuda/basic.cu); layers never branch on
// the backend. Float element types: f32, bf16, f16; arithmetic is in fp32.
// Outputs are overwritten (=) unless the name says accumulate (axpy: y += a*x).
#pragma once
#include <cstdint>
#include <span>

#include "deltatron/core/tensor.h"

namespace dt::ops {

// x[:] = value (any dtype; integer types take the value truncated).
void fill(const TensorView& x, double value, Stream s = {});

// dst = src. Same shape; any strides (up to kMaxDims dims); same dtype, or a float cast
// (f32 <-> bf16/f16, round to nearest even). Across devices (host <-> CUDA) both views must
// be contiguous and of one dtype; the copy is ordered on `s` (the host side must stay alive
// until s completes; pageable host memory makes it synchronous).
void copy(const TensorView& dst, const TensorView& src, Stream s = {});

// Elementwise, contiguous, same shape; output may alias an input.
void add(const TensorView& out, const TensorView& a, const TensorView& b, Stream s = {});  // out = a + b
void mul(const TensorView& out, const TensorView& a, const TensorView& b, Stream s = {});  // out = a * b
void scale(const TensorView& x, float alpha, Stream s = {});                               // x *= alpha
void axpy(const TensorView& y, float alpha, const TensorView& x, Stream s = {});           // y += alpha * x

// Reductions over all elements into out: an f32 tensor of 1 element on the same device
// (no host sync). Deterministic: fixed blocking and order, independent of launch timing.
void sum(const TensorView& out, const TensorView& x, Stream s = {});
void sum_squares(const TensorView& out, const TensorView& x, Stream s = {});
// out = sum over the views of sum(x^2): contiguous f32 views of any size (0 included) in one
// launch on CUDA, not one per view (the global grad norm over every gradient). The blocking and
// the order depend only on the sizes of the views, in list order. An empty list gives 0.
void sum_squares_list(const TensorView& out, std::span<const TensorView> xs, Stream s = {});

// Counter-based random fill (core/rng.h). `x` is the local piece of a global tensor of
// shape `global` starting at `offset` in every dim; element values depend only on
// (seed, stream, global index), never on the local slicing. Pass global = x.shape and
// offset = {} for an unsharded tensor.
struct RngSlice {
  Shape global;
  std::array<int64_t, kMaxDims> offset{};
  static RngSlice whole(const TensorView& x) { return {x.shape, {}}; }
};
void rng_uniform(const TensorView& x, uint64_t seed, uint64_t stream, float lo, float hi, const RngSlice& where,
                 Stream s = {});
void rng_normal(const TensorView& x, uint64_t seed, uint64_t stream, float mean, float std, const RngSlice& where,
                Stream s = {});

// Host readback helpers for tests and logging (synchronise the stream).
float item(const TensorView& x, Stream s = {});
Tensor to_host(const TensorView& x, Stream s = {});
Tensor to_device(const TensorView& x, Device d, Stream s = {});

}  // namespace dt::ops
