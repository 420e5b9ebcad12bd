#include "deltatron/core/dtype.h"

#include "deltatron/core/check.h"

namespace dt {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: case DType::i32: return 4;
    case DType::bf16: case DType::f16: case DType::u16: return 2;
    case DType::i64: return 8;
    case DType::u8: return 1;
  }
  DT_FAIL("invalid DType value {}", int(t));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
    case DType::u16: return "u16";
  }
  return "?";
}

bool dtype_is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

std::string dtype_names() { return "f32, bf16, f16, i32, i64, u8, u16"; }

bool try_parse_dtype(std::string_view n, DType* out) {
  struct Alias { std::string_view name; DType t; };
  static constexpr Alias kAliases[] = {
      {"f32", DType::f32},   {"fp32", DType::f32},  {"float32", DType::f32}, {"float", DType::f32},
      {"bf16", DType::bf16}, {"bfloat16", DType::bf16},
      {"f16", DType::f16},   {"fp16", DType::f16},  {"float16", DType::f16}, {"half", DType::f16},
      {"i32", DType::i32},   {"int32", DType::i32}, {"i64", DType::i64},     {"int64", DType::i64},
      {"u8", DType::u8},     {"uint8", DType::u8},  {"u16", DType::u16},     {"uint16", DType::u16}};
  for (const Alias& a : kAliases)
    if (a.name == n) {
      *out = a.t;
      return true;
    }
  return false;
}

DType parse_dtype(std::string_view n) {
  DType t;
  if (!try_parse_dtype(n, &t)) user_error(fmt::format("unknown dtype '{}' (valid: {})", n, dtype_names()));
  return t;
}

std::string Device::str() const { return kind == CPU ? "cpu" : fmt::format("cuda:{}", index); }

bool try_parse_device(std::string_view s, Device* out) {
  if (s == "cpu") { *out = Device::cpu(); return true; }
  if (s == "cuda") { *out = Device::cuda(0); return true; }
  if (s.substr(0, 5) == "cuda:" && s.size() > 5) {
    int i = 0;
    for (char c : s.substr(5)) {
      if (c < '0' || c > '9') return false;
      i = i * 10 + (c - '0');
    }
    *out = Device::cuda(i);
    return true;
  }
  return false;
}

}  // namespace dt
