// Internal: CPU and CUDA implementations behind include/deltatron/ops/{basic,gemm}.h.
// Views reaching these are on the backend's device; basic.cpp checks shapes and routes.
#pragma once
#include "deltatron/ops/basic.h"
#include "deltatron/ops/gemm.h"

#define DT_BASIC_DECLS                                                                                      \
  void fill(const TensorView& x, double value, Stream s);                                                   \
  void copy(const TensorView& dst, const TensorView& src, Stream s); /* same device, any strides, casts */   \
  void add(const TensorView& out, const TensorView& a, const TensorView& b, Stream s);                      \
  void mul(const TensorView& out, const TensorView& a, const TensorView& b, Stream s);                      \
  void scale(const TensorView& x, float alpha, Stream s);                                                   \
  void axpy(const TensorView& y, float alpha, const TensorView& x, Stream s);                               \
  void sum(const TensorView& out, const TensorView& x, bool squares, Stream s);                             \
  void sum_squares_list(const TensorView& out, std::span<const TensorView> xs, Stream s);                   \
  void rng_fill(const TensorView& x, uint64_t seed, uint64_t stream, bool normal, float p0, float p1,       \
                const RngSlice& where, Stream s);                                                           \
  void gemm(const TensorView& c, const TensorView& a, const TensorView& b, const GemmOpts& o, Stream s);

namespace dt::ops::cpu {
DT_BASIC_DECLS
}
namespace dt::ops::cuda {
DT_BASIC_DECLS
// Host <-> device (or device <-> device) byte copy of contiguous views, ordered on s.
void memcpy_async(const TensorView& dst, const TensorView& src, Stream s);
void stream_sync(Stream s);
}  // namespace dt::ops::cuda

namespace dt::ops {
// Shared by both backends: the index of element `i` (row-major over the local shape) inside
// the global tensor described by `where`.
inline int64_t rng_global_index(const Shape& local, const RngSlice& where, int64_t i) {
  int64_t g = 0, gstride = 1;
  for (int d = local.ndim - 1; d >= 0; --d) {
    int64_t idx = i % local.d[d];
    i /= local.d[d];
    g += (idx + where.offset[d]) * gstride;
    gstride *= where.global.d[d];
  }
  return g;
}
}  // namespace dt::ops
