// CPU implementation of the cp2hp / hp2cp data movement (thd-context-parallel.md 4.3-4.6):
// row gather by a token map, and packing / unpacking of the per-destination column blocks
// of the all-to-all buffers with an optional column map (the head permutation). Pure byte
// moves: bitwise exact for every dtype; every output element written once (=).
// Layouts: see src/ops/cp_a2a_backends.h.
#include <cstring>

#include "ops/cp_a2a_backends.h"

namespace dt::ops::cpu {
namespace {

// Element types by size: the moves never interpret the bits.
template <typename F>
void by_size(DType t, F f) {
  switch (dtype_size(t)) {
    case 1: f(uint8_t{}); return;
    case 2: f(uint16_t{}); return;
    case 4: f(uint32_t{}); return;
    case 8: f(uint64_t{}); return;
    default: DT_FAIL("cp_a2a: unsupported element size {} ({})", dtype_size(t), dtype_name(t));
  }
}

// A view without data is the identity map.
const int32_t* map_or_null(const TensorView& m) { return m.data ? m.ptr<int32_t>() : nullptr; }

}  // namespace

void cp_gather_rows(const TensorView& dst, const TensorView& src, const TensorView& idx, Stream) {
  const int64_t R = dst.shape[0], W = dst.shape[1];  // dst [R, W], src [*, W]
  const size_t es = dtype_size(dst.dtype), row_bytes = size_t(W) * es;
  const int32_t* ix = map_or_null(idx);  // [R]
  auto* d = static_cast<char*>(dst.data);
  const auto* s = static_cast<const char*>(src.data);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t sr = ix ? ix[r] : r;
    std::memcpy(d + r * dst.stride[0] * int64_t(es), s + sr * src.stride[0] * int64_t(es), row_bytes);
  }
}

void cp_pack_blocks(const TensorView& send, const TensorView& src, const TensorView& col, int64_t g, Stream) {
  const int64_t P = send.shape[0], R = send.shape[1], B = send.shape[2];  // send [cp, R, B]; src [R, cp*B]
  const int32_t* cm = map_or_null(col);                                    // [cp*B/g]
  by_size(send.dtype, [&](auto tag) {
    using E = decltype(tag);
    E* g_send = send.ptr<E>();
    const E* g_src = src.ptr<E>();
    for (int64_t j = 0; j < P; ++j)
      for (int64_t l = 0; l < R; ++l) {
        E* out = g_send + (j * R + l) * B;
        const E* in = g_src + l * src.stride[0];
        if (cm) {
          for (int64_t m = 0; m < B; m += g)  // runs of g columns
            std::memcpy(out + m, in + int64_t(cm[(j * B + m) / g]) * g, size_t(g) * sizeof(E));
        } else {
          std::memcpy(out, in + j * B, size_t(B) * sizeof(E));
        }
      }
  });
}

void cp_unpack_blocks(const TensorView& dst, const TensorView& recv, const TensorView& inv, int64_t g, Stream) {
  const int64_t R = recv.shape[1], B = recv.shape[2], C = dst.shape[1];  // dst [R, cp*B]; recv [cp, R, B]
  const int32_t* im = map_or_null(inv);                                   // [cp*B/g]
  by_size(dst.dtype, [&](auto tag) {
    using E = decltype(tag);
    E* g_dst = dst.ptr<E>();
    const E* g_recv = recv.ptr<E>();
    for (int64_t l = 0; l < R; ++l) {
      E* out = g_dst + l * dst.stride[0];
      if (im) {
        for (int64_t c = 0; c < C; c += g) {  // runs of g columns, never crossing a block (g | B)
          const int64_t k = int64_t(im[c / g]) * g;
          std::memcpy(out + c, g_recv + ((k / B) * R + l) * B + k % B, size_t(g) * sizeof(E));
        }
      } else {
        for (int64_t j = 0; j * B < C; ++j) std::memcpy(out + j * B, g_recv + (j * R + l) * B, size_t(B) * sizeof(E));
      }
    }
  });
}

}  // namespace dt::ops::cpu
