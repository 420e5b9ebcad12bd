// TensorView (non-owning, trivially copyable) and Tensor (owning storage + a view).
// Strides are in ELEMENTS. Shapes are written in comments at use sites: // [T, Hv, dv] bf16
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "deltatron/core/check.h"
#include "deltatron/core/dtype.h"

namespace dt {

inline constexpr int kMaxDims = 6;

struct Shape {
  int ndim = 0;
  std::array<int64_t, kMaxDims> d{};

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  int64_t operator[](int i) const { return d[i]; }
  int64_t& operator[](int i) { return d[i]; }
  int64_t numel() const;
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string str() const;  // "[4, 8]"
};

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device{};
  Shape shape;
  std::array<int64_t, kMaxDims> stride{};

  TensorView() = default;
  // Contiguous (row-major) view.
  TensorView(void* data, DType dtype, Device device, Shape shape);

  int ndim() const { return shape.ndim; }
  int64_t size(int dim) const;  // negative dims count from the end
  int64_t numel() const { return shape.numel(); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  bool is_contiguous() const;
  bool empty() const { return numel() == 0; }

  template <typename T> T* ptr() const { return static_cast<T*>(data); }
  // Element-offset address (no dtype check).
  void* at_offset(int64_t elems) const { return static_cast<char*>(data) + elems * int64_t(dtype_size(dtype)); }

  // Views without copies.
  TensorView slice(int dim, int64_t begin, int64_t end) const;  // [begin, end) along dim
  TensorView select(int dim, int64_t index) const;              // drops dim
  TensorView reshape(Shape s) const;                             // contiguous views only
  TensorView flatten() const { return reshape(Shape{numel()}); }
  TensorView transpose(int a, int b) const;                      // swaps dims (non-contiguous result)
  TensorView as_dtype(DType t) const;                            // same bytes, other element type (sizes must match)

  std::string str() const;  // "bf16[32768, 16, 128] cuda:0 (contiguous)"
};

// Checks whose failure message shows both sides.
void check_same_shape(const TensorView& a, const TensorView& b, const char* what);
void check_dtype(const TensorView& a, DType t, const char* what);
void check_device(const TensorView& a, const TensorView& b, const char* what);
void check_contiguous(const TensorView& a, const char* what);
void check_shape(const TensorView& a, const Shape& s, const char* what);

class Allocator;

// Owning tensor. Memory comes from an allocator (aligned host memory, or the CUDA caching
// allocator); it is returned when the last Tensor sharing the storage is destroyed.
class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(Shape shape, DType dtype, Device device = Device::cpu());
  static Tensor zeros(Shape shape, DType dtype, Device device = Device::cpu(), Stream s = {});

  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }  // NOLINT: tensors pass where views are taken
  void* data() const { return view_.data; }
  DType dtype() const { return view_.dtype; }
  Device device() const { return view_.device; }
  const Shape& shape() const { return view_.shape; }
  int64_t numel() const { return view_.numel(); }
  size_t nbytes() const { return view_.nbytes(); }
  bool defined() const { return storage_ != nullptr; }
  template <typename T> T* ptr() const { return view_.ptr<T>(); }
  // Rows [begin, end) (along dim 0) of a contiguous tensor, sharing its storage: the memory lives
  // while either tensor does (model::make_params_rows: parameters in one allocation).
  Tensor rows(int64_t begin, int64_t end) const;

 private:
  std::shared_ptr<void> storage_;
  TensorView view_;
};

}  // namespace dt
