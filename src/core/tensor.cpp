#include "deltatron/core/tensor.h"

#include "deltatron/core/allocator.h"
#include "deltatron/ops/basic.h"

namespace dt {

Shape::Shape(std::initializer_list<int64_t> dims) {
  DT_CHECK(dims.size() <= size_t(kMaxDims), "a shape has at most {} dims, got {}", kMaxDims, dims.size());
  for (int64_t x : dims) {
    DT_CHECK(x >= 0, "negative dimension {} in a shape", x);
    d[ndim++] = x;
  }
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= d[i];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (ndim != o.ndim) return false;
  for (int i = 0; i < ndim; ++i)
    if (d[i] != o.d[i]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

TensorView::TensorView(void* data_, DType dtype_, Device device_, Shape shape_)
    : data(data_), dtype(dtype_), device(device_), shape(shape_) {
  int64_t st = 1;
  for (int i = shape.ndim - 1; i >= 0; --i) {
    stride[i] = st;
    st *= shape.d[i];
  }
}

int64_t TensorView::size(int dim) const {
  if (dim < 0) dim += shape.ndim;
  DT_CHECK(dim >= 0 && dim < shape.ndim, "dim {} out of range for {}", dim, str());
  return shape.d[dim];
}

bool TensorView::is_contiguous() const {
  int64_t st = 1;
  for (int i = shape.ndim - 1; i >= 0; --i) {
    if (shape.d[i] != 1 && stride[i] != st) return false;
    st *= shape.d[i];
  }
  return true;
}

TensorView TensorView::slice(int dim, int64_t begin, int64_t end) const {
  if (dim < 0) dim += shape.ndim;
  DT_CHECK(dim >= 0 && dim < shape.ndim, "slice dim {} out of range for {}", dim, str());
  DT_CHECK(0 <= begin && begin <= end && end <= shape.d[dim], "slice [{}, {}) out of range for dim {} of {}", begin,
           end, dim, str());
  TensorView v = *this;
  v.data = begin ? at_offset(begin * stride[dim]) : data;
  v.shape.d[dim] = end - begin;
  return v;
}

TensorView TensorView::select(int dim, int64_t index) const {
  if (dim < 0) dim += shape.ndim;
  TensorView v = slice(dim, index, index + 1);
  for (int i = dim; i + 1 < v.shape.ndim; ++i) {
    v.shape.d[i] = v.shape.d[i + 1];
    v.stride[i] = v.stride[i + 1];
  }
  v.shape.ndim -= 1;
  return v;
}

TensorView TensorView::reshape(Shape s) const {
  DT_CHECK(s.numel() == numel(), "reshape {} -> {}: element counts differ ({} vs {})", shape.str(), s.str(), numel(),
           s.numel());
  DT_CHECK(is_contiguous(), "reshape needs a contiguous view, got {}", str());
  return TensorView(data, dtype, device, s);
}

TensorView TensorView::transpose(int a, int b) const {
  if (a < 0) a += shape.ndim;
  if (b < 0) b += shape.ndim;
  DT_CHECK(a >= 0 && a < shape.ndim && b >= 0 && b < shape.ndim, "transpose({}, {}) out of range for {}", a, b,
           str());
  TensorView v = *this;
  std::swap(v.shape.d[a], v.shape.d[b]);
  std::swap(v.stride[a], v.stride[b]);
  return v;
}

TensorView TensorView::as_dtype(DType t) const {
  DT_CHECK(dtype_size(t) == dtype_size(dtype), "as_dtype {} -> {}: element sizes differ", dtype_name(dtype),
           dtype_name(t));
  TensorView v = *this;
  v.dtype = t;
  return v;
}

std::string TensorView::str() const {
  std::string strides;
  if (!is_contiguous()) {
    strides = " strides [";
    for (int i = 0; i < shape.ndim; ++i) strides += (i ? ", " : "") + std::to_string(stride[i]);
    strides += "]";
  }
  return fmt::format("{}{} {}{}", dtype_name(dtype), shape.str(), device.str(),
                     strides.empty() ? "" : strides);
}

void check_same_shape(const TensorView& a, const TensorView& b, const char* what) {
  DT_CHECK(a.shape == b.shape, "{}: shapes differ: {} vs {}", what, a.str(), b.str());
}
void check_dtype(const TensorView& a, DType t, const char* what) {
  DT_CHECK(a.dtype == t, "{}: expected dtype {}, got {}", what, dtype_name(t), a.str());
}
void check_device(const TensorView& a, const TensorView& b, const char* what) {
  DT_CHECK(a.device == b.device, "{}: devices differ: {} vs {}", what, a.str(), b.str());
}
void check_contiguous(const TensorView& a, const char* what) {
  DT_CHECK(a.is_contiguous(), "{}: expected a contiguous view, got {}", what, a.str());
}
void check_shape(const TensorView& a, const Shape& s, const char* what) {
  DT_CHECK(a.shape == s, "{}: expected shape {}, got {}", what, s.str(), a.str());
}

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  Tensor t;
  size_t bytes = size_t(shape.numel()) * dtype_size(dtype);
  Allocator* alloc = &allocator_for(device);
  void* p = bytes ? alloc->allocate(bytes) : nullptr;
  t.storage_ = std::shared_ptr<void>(p, [alloc, bytes](void* q) {
    if (q) alloc->deallocate(q, bytes);
  });
  t.view_ = TensorView(p, dtype, device, shape);
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  DT_CHECK(defined() && view_.ndim() >= 1 && view_.is_contiguous(), "Tensor::rows: needs a defined contiguous tensor "
                                                                     "with at least one dim, got {}",
           view_.str());
  DT_CHECK(0 <= begin && begin <= end && end <= view_.shape[0], "Tensor::rows: [{}, {}) is not inside dim 0 of {}",
           begin, end, view_.str());
  Tensor t;
  t.storage_ = storage_;
  t.view_ = view_.slice(0, begin, end);
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype, Device device, Stream s) {
  Tensor t = empty(shape, dtype, device);
  if (t.numel()) ops::fill(t.view(), 0.0, s);
  return t;
}

}  // namespace dt
