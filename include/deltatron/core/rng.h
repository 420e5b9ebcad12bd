// Counter-based RNG: Philox4x32-10 (Salmon et al., SC'11). A value depends only on
// (seed, stream, element index), so a seed gives the same numbers on CPU and GPU and a
// parameter's init never depends on how it is sharded: each element draws from its GLOBAL
// index (see ops::rng_uniform / ops::rng_normal).
#pragma once
#include <cstdint>

#include <cmath>

#include "deltatron/core/numeric.h"

namespace dt {

struct Philox4 {
  uint32_t v[4];
};

DT_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = uint64_t(M0) * c0, p1 = uint64_t(M1) * c2;
    uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0), hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
    k0 += W0; k1 += W1;
  }
  return {{c0, c1, c2, c3}};
}

// The four 32-bit words drawn for element `index` of random stream `stream` under `seed`.
DT_HD Philox4 rng_draw(uint64_t seed, uint64_t stream, uint64_t index) {
  return philox4x32_10(uint32_t(index), uint32_t(index >> 32), uint32_t(stream), uint32_t(stream >> 32),
                       uint32_t(seed), uint32_t(seed >> 32));
}

// Uniform in [0, 1): top 24 bits, exact in fp32 on every backend.
DT_HD float rng_u01(uint32_t x) { return float(x >> 8) * (1.0f / 16777216.0f); }

// Uniform in [lo, hi) for element `index`.
DT_HD float rng_uniform_at(uint64_t seed, uint64_t stream, uint64_t index, float lo, float hi) {
  return lo + (hi - lo) * rng_u01(rng_draw(seed, stream, index).v[0]);
}

// Standard normal for element `index`: Box-Muller on two 32-bit draws, computed in double
// so that CPU (glibc) and GPU (libdevice) agree to within an ulp of the float result.
DT_HD float rng_normal_at(uint64_t seed, uint64_t stream, uint64_t index, float mean, float std) {
  Philox4 r = rng_draw(seed, stream, index);
  // (x + 0.5) / 2^32 is never 0, so the log is finite.
  double u1 = (double(r.v[0]) + 0.5) * (1.0 / 4294967296.0);
  double u2 = (double(r.v[1]) + 0.5) * (1.0 / 4294967296.0);
  double z = ::sqrt(-2.0 * ::log(u1)) * ::cos(6.283185307179586476925 * u2);
  return float(double(mean) + double(std) * z);
}

}  // namespace dt
