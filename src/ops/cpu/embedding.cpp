// CPU reference of the vocab-parallel embedding (f32). This rank owns rows
// [vocab_begin, vocab_begin + V_l) of the global table.
//   forward:  y[t] = w[ids[t] - vocab_begin] if owned, else 0                          y (=)
//   backward: dw[v] += dy[t] for every owned t, tokens in increasing t (deterministic)  dw (+=)
#include <cstring>

#include "ops/layers_ops_backends.h"

namespace dt::ops::cpu {

void embedding_fwd(const TensorView& y, const TensorView& ids, const TensorView& w, int64_t vocab_begin, Stream) {
  const int64_t T = y.shape[0], V = w.shape[0], H = w.shape[1];
  const int32_t* id = ids.ptr<int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    float* yr = y.ptr<float>() + t * y.stride[0];
    const int64_t v = int64_t(id[t]) - vocab_begin;
    if (v >= 0 && v < V) std::memcpy(yr, w.ptr<float>() + v * w.stride[0], size_t(H) * sizeof(float));
    else std::memset(yr, 0, size_t(H) * sizeof(float));
  }
}

void embedding_bwd(const TensorView& dw, const TensorView& dy, const TensorView& ids, int64_t vocab_begin, Stream) {
  const int64_t T = dy.shape[0], V = dw.shape[0], H = dw.shape[1];
  const int32_t* id = ids.ptr<int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    const int64_t v = int64_t(id[t]) - vocab_begin;
    if (v < 0 || v >= V) continue;
    const float* dyr = dy.ptr<float>() + t * dy.stride[0];
    float* dwr = dw.ptr<float>() + v * H;
    for (int64_t h = 0; h < H; ++h) dwr[h] += dyr[h];
  }
}

}  // namespace dt::ops::cpu
