// DType and Device: runtime properties of every tensor view.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dt {

enum class DType : uint8_t { f32, bf16, f16, i32, i64, u8, u16 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
bool dtype_is_float(DType t);
// Parses "f32" | "fp32" | "float32" | "bf16" | "bfloat16" | "f16" | "fp16" | "float16" |
// "i32" | "int32" | "i64" | "int64" | "u8" | "uint8" | "u16" | "uint16".
// Unknown names abort all ranks with a message listing the valid names; use
// try_parse_dtype where the caller wants to report the error itself.
DType parse_dtype(std::string_view name);
bool try_parse_dtype(std::string_view name, DType* out);
std::string dtype_names();  // "f32, bf16, f16, i32, i64, u8, u16"

struct Device {
  enum Kind : uint8_t { CPU, CUDA };
  Kind kind = CPU;
  int index = 0;  // CUDA ordinal; 0 for CPU

  static Device cpu() { return {CPU, 0}; }
  static Device cuda(int i = 0) { return {CUDA, i}; }
  bool is_cpu() const { return kind == CPU; }
  bool is_cuda() const { return kind == CUDA; }
  bool operator==(const Device& o) const { return kind == o.kind && (kind == CPU || index == o.index); }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;  // "cpu" | "cuda:0"
};

// Parses "cpu" | "cuda" | "cuda:N".
bool try_parse_device(std::string_view s, Device* out);

// An opaque execution stream: a cudaStream_t for CUDA work (nullptr = legacy default
// stream), ignored for CPU work. Kept as void* so that CPU-only code never sees CUDA headers.
struct Stream {
  void* handle = nullptr;
};

}  // namespace dt
