// Helpers of the CUDA op tests: casts between dtypes and devices, inputs rounded through a dtype
// (so that the CPU reference and the GPU see the same values), and the dtype's tolerance.
#pragma once
#include "deltatron/ops/basic.h"
#include "test_util.h"

namespace dt::testing {

inline const Device kGpu = Device::cuda(0);
// A copy of x in dtype t, on x's device.
inline Tensor as(const TensorView& x, DType t) {
  Tensor o = Tensor::empty(x.shape, t, x.device);
  ops::copy(o, x);
  return o;
}
// Host f32 rounded through dtype t (the values both backends see).
inline Tensor rounded(const TensorView& h, DType t) { return as(as(h, t), DType::f32); }
inline Tensor dev(const TensorView& h, DType t) { return ops::to_device(as(h, t), kGpu); }
inline Tensor host32(const TensorView& d) { return as(ops::to_host(d), DType::f32); }
// CUDA vs CPU tolerance (rel. L2): f32 1e-4, bf16 1e-2.
inline double tol(DType t) { return t == DType::bf16 ? 1e-2 : 1e-4; }

}  // namespace dt::testing
