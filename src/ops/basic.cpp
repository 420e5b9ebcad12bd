// Routing and shared checks of the basic ops (include/deltatron/ops/basic.h, gemm.h).
#include <cstring>

#include "ops/basic_backends.h"
#include "ops/route.h"

namespace dt::ops {
namespace {
void check_float(const TensorView& x, const char* what) {
  DT_CHECK(dtype_is_float(x.dtype), "{}: expected a float dtype (f32, bf16, f16), got {}", what, x.str());
}
void check_elementwise(const TensorView& out, const TensorView& a, const char* what) {
  check_same_shape(out, a, what);
  check_device(out, a, what);
  check_contiguous(out, what);
  check_contiguous(a, what);
  check_float(out, what);
  check_float(a, what);
}
}  // namespace


void fill(const TensorView& x, double value, Stream s) { DT_ROUTE(fill, x, x, value, s); }

void copy(const TensorView& dst, const TensorView& src, Stream s) {
  check_same_shape(dst, src, "copy");
  if (dst.empty()) return;
  if (dst.device == src.device) {
    if (dst.dtype != src.dtype)
      DT_CHECK(dtype_is_float(dst.dtype) && dtype_is_float(src.dtype), "copy: cast {} -> {} is not supported",
               src.str(), dst.str());
    DT_ROUTE(copy, dst, dst, src, s);
    return;
  }
  DT_CHECK(dst.dtype == src.dtype && dst.is_contiguous() && src.is_contiguous(),
           "copy across devices needs contiguous views of one dtype: {} <- {}", dst.str(), src.str());
#if DELTATRON_HAVE_CUDA
  cuda::memcpy_async(dst, src, s);
#else
  DT_FAIL("copy {} <- {}: built without CUDA", dst.str(), src.str());
#endif
}

void add(const TensorView& out, const TensorView& a, const TensorView& b, Stream s) {
  check_elementwise(out, a, "add");
  check_elementwise(out, b, "add");
  DT_ROUTE(add, out, out, a, b, s);
}
void mul(const TensorView& out, const TensorView& a, const TensorView& b, Stream s) {
  check_elementwise(out, a, "mul");
  check_elementwise(out, b, "mul");
  DT_ROUTE(mul, out, out, a, b, s);
}
void scale(const TensorView& x, float alpha, Stream s) {
  check_elementwise(x, x, "scale");
  DT_ROUTE(scale, x, x, alpha, s);
}
void axpy(const TensorView& y, float alpha, const TensorView& x, Stream s) {
  check_elementwise(y, x, "axpy");
  DT_ROUTE(axpy, y, y, alpha, x, s);
}

static void check_reduce(const TensorView& out, const TensorView& x, const char* what) {
  check_dtype(out, DType::f32, what);
  DT_CHECK(out.numel() == 1, "{}: out must hold 1 element, got {}", what, out.str());
  check_device(out, x, what);
  check_contiguous(x, what);
  check_float(x, what);
}
void sum(const TensorView& out, const TensorView& x, Stream s) {
  check_reduce(out, x, "sum");
  DT_ROUTE(sum, out, out, x, false, s);
}
void sum_squares(const TensorView& out, const TensorView& x, Stream s) {
  check_reduce(out, x, "sum_squares");
  DT_ROUTE(sum, out, out, x, true, s);
}
void sum_squares_list(const TensorView& out, std::span<const TensorView> xs, Stream s) {
  check_dtype(out, DType::f32, "sum_squares_list out");
  DT_CHECK(out.numel() == 1, "sum_squares_list: out must hold 1 element, got {}", out.str());
  for (size_t i = 0; i < xs.size(); ++i) {
    const TensorView& x = xs[i];
    DT_CHECK(x.dtype == DType::f32, "sum_squares_list: xs[{}] must be f32, got {}", i, x.str());
    DT_CHECK(x.is_contiguous(), "sum_squares_list: xs[{}] must be contiguous, got {}", i, x.str());
    DT_CHECK(x.device == out.device, "sum_squares_list: xs[{}] is on another device than out: {} vs {}", i, x.str(),
             out.str());
  }
  DT_ROUTE(sum_squares_list, out, out, xs, s);
}

static void check_rng(const TensorView& x, const RngSlice& w, const char* what) {
  check_contiguous(x, what);
  check_float(x, what);
  DT_CHECK(w.global.ndim == x.ndim(), "{}: global shape {} and local {} differ in rank", what, w.global.str(),
           x.str());
  for (int d = 0; d < x.ndim(); ++d)
    DT_CHECK(w.offset[d] >= 0 && w.offset[d] + x.shape[d] <= w.global[d],
             "{}: local {} at offset {} of dim {} exceeds the global shape {}", what, x.str(), w.offset[d], d,
             w.global.str());
}
void rng_uniform(const TensorView& x, uint64_t seed, uint64_t stream, float lo, float hi, const RngSlice& w,
                 Stream s) {
  check_rng(x, w, "rng_uniform");
  DT_ROUTE(rng_fill, x, x, seed, stream, false, lo, hi, w, s);
}
void rng_normal(const TensorView& x, uint64_t seed, uint64_t stream, float mean, float std, const RngSlice& w,
                Stream s) {
  check_rng(x, w, "rng_normal");
  DT_ROUTE(rng_fill, x, x, seed, stream, true, mean, std, w, s);
}

void gemm(const TensorView& c, const TensorView& a, const TensorView& b, const GemmOpts& o, Stream s) {
  DT_CHECK(a.ndim() == 2 && b.ndim() == 2 && c.ndim() == 2, "gemm: 2-D views expected, got A {} B {} C {}", a.str(),
           b.str(), c.str());
  int64_t M = o.trans_a ? a.shape[1] : a.shape[0], K = o.trans_a ? a.shape[0] : a.shape[1];
  int64_t Kb = o.trans_b ? b.shape[1] : b.shape[0], N = o.trans_b ? b.shape[0] : b.shape[1];
  DT_CHECK(K == Kb && c.shape[0] == M && c.shape[1] == N,
           "gemm: shapes do not chain: op(A) [{}, {}] @ op(B) [{}, {}] -> C {} (trans_a {}, trans_b {})", M, K, Kb, N,
           c.str(), o.trans_a, o.trans_b);
  for (const TensorView* v : {&a, &b, &c}) {
    DT_CHECK(v->stride[1] == 1 && v->stride[0] >= v->shape[1], "gemm: rows must have unit inner stride, got {}",
             v->str());
    check_device(*v, c, "gemm");
  }
  DT_CHECK(a.dtype == b.dtype, "gemm: A and B must share a dtype: {} vs {}", a.str(), b.str());
  DT_ROUTE(gemm, c, c, a, b, o, s);
}

Tensor to_host(const TensorView& x, Stream s) {
  Tensor h = Tensor::empty(x.shape, x.dtype, Device::cpu());
  if (x.device.is_cpu()) {
    copy(h, x, s);
    return h;
  }
#if DELTATRON_HAVE_CUDA
  if (x.is_contiguous()) {
    cuda::memcpy_async(h, x, s);
  } else {
    Tensor d = Tensor::empty(x.shape, x.dtype, x.device);
    copy(d, x, s);
    cuda::memcpy_async(h, d, s);
    cuda::stream_sync(s);  // d must outlive the copy
  }
  cuda::stream_sync(s);
#endif
  return h;
}

Tensor to_device(const TensorView& x, Device dev, Stream s) {
  Tensor t = Tensor::empty(x.shape, x.dtype, dev);
  if (x.is_contiguous()) {
    copy(t, x, s);
  } else {
    Tensor c = Tensor::empty(x.shape, x.dtype, x.device);
    copy(c, x, s);
    copy(t, c, s);
#if DELTATRON_HAVE_CUDA
    if (!dev.is_cpu() || !x.device.is_cpu()) cuda::stream_sync(s);  // c must outlive the copy
#endif
  }
  return t;
}

float item(const TensorView& x, Stream s) {
  DT_CHECK(x.numel() == 1, "item: expected 1 element, got {}", x.str());
  Tensor h = to_host(x, s);
  Tensor f = Tensor::empty(Shape{1}, DType::f32);
  copy(f, h, s);
  return *f.ptr<float>();
}

}  // namespace dt::ops
