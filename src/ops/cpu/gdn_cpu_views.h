// Internal: view checks shared by the CPU GDN ops (src/ops/cpu/{conv1d_varlen, l2norm, gdn_gate,
// gdn_chunk, gated_rmsnorm}.cpp). The CPU backend takes f32 views only; activations may have an
// arbitrary row stride (stride[0]) with a unit inner stride, everything else is contiguous.
// An empty view (data == nullptr or numel 0) means "absent" where the op allows it.
#pragma once
#include <string>

#include <fmt/format.h>

#include "deltatron/core/check.h"
#include "deltatron/core/tensor.h"
#include "deltatron/ops/cpu/gdn_ref.h"
#include "deltatron/ops/varlen.h"

namespace dt::ops::cpu::views {

inline bool absent(const TensorView& v) { return v.data == nullptr || v.numel() == 0; }

inline void check_cpu_f32(const TensorView& v, const std::string& label) {
  DT_CHECK(v.device.is_cpu(), "{}: expected a CPU view, got {}", label, v.str());
  check_dtype(v, DType::f32, label.c_str());
}

// [shape...] f32 CPU view whose first dim may have any stride and whose other dims are
// packed (row-major, unit inner stride). Returns the row accessor (row = first index).
inline ref::Rows<float> rows(const TensorView& v, const Shape& shape, const char* op, const char* what) {
  const std::string label = fmt::format("cpu::{} {}", op, what);
  check_cpu_f32(v, label);
  check_shape(v, shape, label.c_str());
  int64_t inner = 1;
  for (int i = v.ndim() - 1; i >= 1; --i) {
    DT_CHECK(v.shape[i] <= 1 || v.stride[i] == inner,
             "{}: dims after the first must be packed (unit inner stride); dim {} has stride {}, expected {} ({})",
             label, i, v.stride[i], inner, v.str());
    inner *= v.shape[i];
  }
  return {v.ptr<float>(), v.ndim() >= 1 ? v.stride[0] : 0};
}

// Contiguous f32 CPU view of the given shape, or nullptr when absent and `optional`.
inline float* dense(const TensorView& v, const Shape& shape, const char* op, const char* what, bool optional) {
  if (optional && absent(v)) return nullptr;
  const std::string label = fmt::format("cpu::{} {}", op, what);
  DT_CHECK(!absent(v) || shape.numel() == 0, "{}: required view is empty", label);
  check_cpu_f32(v, label);
  check_shape(v, shape, label.c_str());
  check_contiguous(v, label.c_str());
  return v.ptr<float>();
}

// The host cu_seqlens of `m`, checked against the token count of the views.
inline const int32_t* host_cu(const VarlenMeta& m, int64_t T, const char* op) {
  DT_CHECK(m.cu_host != nullptr || m.num_seqs == 0, "cpu::{}: VarlenMeta has no host cu_seqlens", op);
  DT_CHECK(m.total == T, "cpu::{}: the views hold {} tokens but VarlenMeta.total is {}", op, T, m.total);
  DT_CHECK(m.num_seqs == 0 || m.cu_host[m.num_seqs] == T, "cpu::{}: cu_seqlens[{}] = {} but the views hold {} tokens",
           op, m.num_seqs, m.num_seqs ? m.cu_host[m.num_seqs] : 0, T);
  return m.cu_host;
}

}  // namespace dt::ops::cpu::views
