// Scalar conversions shared bit-for-bit by the CPU and CUDA backends.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DT_HD __host__ __device__ __forceinline__
#else
#define DT_HD inline
#endif

namespace dt {

DT_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

DT_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// f32 -> bf16 bits, round to nearest even; NaN stays a (quiet) NaN.
DT_HD uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
DT_HD float bf16_bits_to_f32(uint16_t b) { return bits_float(uint32_t(b) << 16); }

// f32 <-> f16 (IEEE binary16) bits, round to nearest even, with subnormals, inf and NaN.
DT_HD uint16_t f32_to_f16_bits(float f) {
  uint32_t x = float_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return uint16_t(sign | 0x7e00u);          // NaN
  if (absx >= 0x477ff000u) return uint16_t(sign | 0x7c00u);         // overflow (incl. rounding) -> inf
  if (absx < 0x38800000u) {                                         // subnormal or zero in f16
    if (absx < 0x33000000u) return uint16_t(sign);                  // < half of min subnormal
    uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
    int shift = 126 - int(absx >> 23);                              // 13..24: value / 2^-24
    uint32_t half = 1u << (shift - 1);
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t r = mant >> shift;
    if (rem > half || (rem == half && (r & 1u))) r += 1;
    return uint16_t(sign | r);
  }
  uint32_t r = absx + 0xc8000fffu + ((absx >> 13) & 1u);  // rebias exponent (-112<<23) and round
  return uint16_t(sign | (r >> 13));
}
DT_HD float f16_bits_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);
    float f = float(mant) * (1.0f / 16777216.0f);  // mant * 2^-24
    return sign ? -f : f;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

}  // namespace dt
