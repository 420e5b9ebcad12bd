// CPU reference of the basic ops: fp32 arithmetic (double for reductions), strided copy
// with casts (round to nearest even), counter-based RNG, and GEMM through OpenBLAS sgemm.
#include <cblas.h>

#include <cmath>
#include <cstring>

#include "deltatron/core/numeric.h"
#include "deltatron/core/rng.h"
#include "ops/basic_backends.h"

namespace dt::ops::cpu {
namespace {

float load(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::bf16: return bf16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::f16: return f16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
    default: DT_FAIL("not a float dtype: {}", dtype_name(t));
  }
}
void store(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::f32: static_cast<float*>(p)[i] = v; return;
    case DType::bf16: static_cast<uint16_t*>(p)[i] = f32_to_bf16_bits(v); return;
    case DType::f16: static_cast<uint16_t*>(p)[i] = f32_to_f16_bits(v); return;
    default: DT_FAIL("not a float dtype: {}", dtype_name(t));
  }
}

// Element offset of the i-th element (row-major over the shape) of a strided view.
int64_t offset_of(const TensorView& v, int64_t i) {
  int64_t off = 0;
  for (int d = v.ndim() - 1; d >= 0; --d) {
    off += (i % v.shape[d]) * v.stride[d];
    i /= v.shape[d];
  }
  return off;
}

template <typename F>
void map2(const TensorView& out, const TensorView& a, F f) {
  int64_t n = out.numel();
  if (out.dtype == DType::f32 && a.dtype == DType::f32) {
    float* o = out.ptr<float>();
    const float* x = a.ptr<float>();
    for (int64_t i = 0; i < n; ++i) o[i] = f(o[i], x[i]);
    return;
  }
  for (int64_t i = 0; i < n; ++i) store(out.data, out.dtype, i, f(load(out.data, out.dtype, i), load(a.data, a.dtype, i)));
}

}  // namespace

void fill(const TensorView& x, double value, Stream) {
  int64_t n = x.numel();
  auto each = [&](auto v) {
    using T = decltype(v);
    for (int64_t i = 0; i < n; ++i) static_cast<T*>(x.data)[offset_of(x, i)] = v;
  };
  switch (x.dtype) {
    case DType::f32: each(float(value)); break;
    case DType::bf16: each(f32_to_bf16_bits(float(value))); break;
    case DType::f16: each(f32_to_f16_bits(float(value))); break;
    case DType::i32: each(int32_t(value)); break;
    case DType::i64: each(int64_t(value)); break;
    case DType::u8: each(uint8_t(value)); break;
    case DType::u16: each(uint16_t(value)); break;
  }
}

void copy(const TensorView& dst, const TensorView& src, Stream) {
  int64_t n = dst.numel();
  if (dst.dtype == src.dtype) {
    size_t es = dtype_size(dst.dtype);
    if (dst.is_contiguous() && src.is_contiguous()) {
      std::memmove(dst.data, src.data, size_t(n) * es);
      return;
    }
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(static_cast<char*>(dst.data) + offset_of(dst, i) * es,
                  static_cast<const char*>(src.data) + offset_of(src, i) * es, es);
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    store(dst.data, dst.dtype, offset_of(dst, i), load(src.data, src.dtype, offset_of(src, i)));
}

void add(const TensorView& out, const TensorView& a, const TensorView& b, Stream) {
  for (int64_t i = 0, n = out.numel(); i < n; ++i)
    store(out.data, out.dtype, i, load(a.data, a.dtype, i) + load(b.data, b.dtype, i));
}
void mul(const TensorView& out, const TensorView& a, const TensorView& b, Stream) {
  for (int64_t i = 0, n = out.numel(); i < n; ++i)
    store(out.data, out.dtype, i, load(a.data, a.dtype, i) * load(b.data, b.dtype, i));
}
void scale(const TensorView& x, float alpha, Stream) {
  map2(x, x, [alpha](float o, float) { return o * alpha; });
}
void axpy(const TensorView& y, float alpha, const TensorView& x, Stream) {
  map2(y, x, [alpha](float o, float v) { return o + alpha * v; });
}

void sum(const TensorView& out, const TensorView& x, bool squares, Stream) {
  double acc = 0;
  for (int64_t i = 0, n = x.numel(); i < n; ++i) {
    double v = load(x.data, x.dtype, i);
    acc += squares ? v * v : v;
  }
  *out.ptr<float>() = float(acc);
}

void sum_squares_list(const TensorView& out, std::span<const TensorView> xs, Stream) {
  double acc = 0;
  for (const TensorView& x : xs) {
    const float* p = x.ptr<float>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) acc += double(p[i]) * p[i];
  }
  *out.ptr<float>() = float(acc);
}

void rng_fill(const TensorView& x, uint64_t seed, uint64_t stream, bool normal, float p0, float p1,
              const RngSlice& w, Stream) {
  for (int64_t i = 0, n = x.numel(); i < n; ++i) {
    uint64_t g = uint64_t(rng_global_index(x.shape, w, i));
    store(x.data, x.dtype, i, normal ? rng_normal_at(seed, stream, g, p0, p1) : rng_uniform_at(seed, stream, g, p0, p1));
  }
}

void gemm(const TensorView& c, const TensorView& a, const TensorView& b, const GemmOpts& o, Stream) {
  DT_CHECK(a.dtype == DType::f32 && c.dtype == DType::f32, "CPU gemm is fp32 only, got A {} C {}", a.str(), c.str());
  int64_t M = c.shape[0], N = c.shape[1], K = o.trans_a ? a.shape[0] : a.shape[1];
  if (M == 0 || N == 0) return;
  if (K == 0) {  // sgemm with K = 0 still scales C by beta
    if (o.beta == 0.f) fill(c, 0.0, {});
    else scale(c, o.beta, {});
    return;
  }
  cblas_sgemm(CblasRowMajor, o.trans_a ? CblasTrans : CblasNoTrans, o.trans_b ? CblasTrans : CblasNoTrans, int(M),
              int(N), int(K), o.alpha, a.ptr<float>(), int(a.stride[0]), b.ptr<float>(), int(b.stride[0]), o.beta,
              c.ptr<float>(), int(c.stride[0]));
}

}  // namespace dt::ops::cpu
