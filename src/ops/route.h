// Internal: routing of an op to its backend by the device of a view. Every public op checks
// its arguments, then calls DT_ROUTE(op, first_view, args...), which runs cuda::op(args...)
// for a CUDA view and cpu::op(args...) otherwise. A CPU-only build (DELTATRON_CUDA=OFF) fails
// clearly on a CUDA view instead of referencing CUDA code that was not compiled.
#pragma once
#include "deltatron/core/check.h"
#include "deltatron/core/tensor.h"

namespace dt::ops::detail {
inline bool on_cuda(const TensorView& v, const char* op) {
  if (v.device.is_cpu()) return false;
#if DELTATRON_HAVE_CUDA
  return true;
#else
  DT_FAIL("{}: got a CUDA tensor ({}), but deltatron was built without CUDA (DELTATRON_CUDA=OFF)", op, v.str());
#endif
}
}  // namespace dt::ops::detail

#if DELTATRON_HAVE_CUDA
#define DT_ROUTE(op, first, ...) \
  (::dt::ops::detail::on_cuda(first, #op) ? cuda::op(__VA_ARGS__) : cpu::op(__VA_ARGS__))
#else
#define DT_ROUTE(op, first, ...) (::dt::ops::detail::on_cuda(first, #op), cpu::op(__VA_ARGS__))
#endif
