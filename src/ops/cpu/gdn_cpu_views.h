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

// [rows, d] or [A, B, d] (rows = A B) f32 CPU view of the given shape with a unit inner stride
// and any strides on the leading dims, as the CUDA kernels' RowMap takes them (head rows read
// in place from a wider buffer, e.g. q's columns of the conv output as [T, Hk, dk]).
inline ref::Rows<float> head_rows(const TensorView& v, const Shape& shape, const char* op, const char* what) {
  const std::string label = fmt::format("cpu::{} {}", op, what);
  check_cpu_f32(v, label);
  check_shape(v, shape, label.c_str());
  const int nd = v.ndim();
  DT_CHECK(nd == 2 || nd == 3, "{}: must be [rows, d] or [A, B, d], got {}", label, v.str());
  DT_CHECK(v.shape[nd - 1] <= 1 || v.stride[nd - 1] == 1, "{}: the last dim must have a unit stride, got {}", label,
           v.str());
  if (nd == 2) return {v.ptr<float>(), v.stride[0]};
  return {v.ptr<float>(), v.stride[0], v.shape[1], v.stride[1]};
}
// Rows and row length of a [rows, d] or [A, B, d] view.
inline void rows_and_d(const TensorView& v, int64_t* rows, int64_t* d, const char* op, const char* what) {
  DT_CHECK(v.ndim() == 2 || v.ndim() == 3, "cpu::{}: {} must be [rows, d] or [A, B, d], got {}", op, what, v.str());
  *d = v.shape[v.ndim() - 1];
  *rows = v.ndim() == 2 ? v.shape[0] : v.shape[0] * v.shape[1];
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
