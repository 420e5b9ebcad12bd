// Internal: argument checks shared by the public op wrappers (messages name the op, the
// argument and both sides).
#pragma once
#include <string>

#include "deltatron/core/check.h"
#include "deltatron/core/tensor.h"

namespace dt::ops::detail {

// [rows, cols] with unit inner stride and row stride >= cols, on `dev`; dtype f32, or also
// bf16 on CUDA when `bf16_on_cuda`.
inline void check_rows(const TensorView& v, int64_t rows, int64_t cols, Device dev, const char* op, const char* what,
                       bool bf16_on_cuda) {
  const std::string label = fmt::format("{} {}", op, what);
  check_shape(v, Shape{rows, cols}, label.c_str());
  DT_CHECK(v.device == dev, "{}: on {}, expected {} like the first view", label, v.device.str(), dev.str());
  DT_CHECK(cols <= 1 || v.stride[1] == 1, "{}: needs a unit inner stride, got {}", label, v.str());
  DT_CHECK(rows <= 1 || v.stride[0] >= cols, "{}: row stride {} < row length {}", label, v.stride[0], cols);
  if (bf16_on_cuda)
    DT_CHECK(v.dtype == DType::f32 || (dev.is_cuda() && v.dtype == DType::bf16),
             "{}: dtype must be f32 (or bf16 on CUDA), got {}", label, v.str());
  else
    check_dtype(v, DType::f32, label.c_str());
}

// Contiguous [n] vector of dtype `t` on `dev`.
inline void check_vec(const TensorView& v, int64_t n, DType t, Device dev, const char* op, const char* what) {
  const std::string label = fmt::format("{} {}", op, what);
  check_shape(v, Shape{n}, label.c_str());
  check_dtype(v, t, label.c_str());
  check_contiguous(v, label.c_str());
  DT_CHECK(v.device == dev, "{}: on {}, expected {} like the first view", label, v.device.str(), dev.str());
}

}  // namespace dt::ops::detail
