// CUDA vocab-parallel embedding. This rank owns rows [vocab_begin, vocab_begin + V_l).
//   forward:  y[t] = w[ids[t] - vocab_begin] if owned, else 0        y [T, H] f32 | bf16 (=)
//   backward: dw[v] += sum_{t: ids[t] = vocab_begin + v} dy[t]        dw [V_l, H] f32 (+=)
// Backward without atomics: keys k_t = ids[t] - vocab_begin (V_l for tokens owned elsewhere) are
// sorted with their token index by cub's stable LSD radix sort, which keeps equal keys in
// increasing t; then one block per segment start of the sorted keys sums the dy rows of its
// segment in that order (fp32) and adds them to its dw row. The bits depend only on the inputs.
// Scratch (keys, values, cub temp) comes from the caching allocator.
#include <cub/device/device_radix_sort.cuh>

#include "ops/cuda/layers_common.cuh"
#include "ops/layers_ops_backends.h"

namespace dt::ops::cuda {
namespace {

template <typename T, typename W>
__global__ __launch_bounds__(lc::kThreads) void embedding_fwd_kernel(T* g_y, int64_t ldy, const int32_t* g_ids,
                                                                      const W* g_w, int64_t ldw, int64_t T_,
                                                                      int64_t V, int64_t H, int64_t vb) {
  for (int64_t t = blockIdx.x; t < T_; t += gridDim.x) {
    const int64_t v = int64_t(g_ids[t]) - vb;
    T* y = g_y + t * ldy;
    if (v >= 0 && v < V) {
      const W* w = g_w + v * ldw;
      for (int64_t h = threadIdx.x; h < H; h += blockDim.x) lc::st(y, h, lc::ld(w, h));
    } else {
      for (int64_t h = threadIdx.x; h < H; h += blockDim.x) lc::st(y, h, 0.f);
    }
  }
}

__global__ void embedding_keys_kernel(int32_t* g_keys, int32_t* g_vals, const int32_t* g_ids, int64_t T_, int64_t V,
                                      int64_t vb) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < T_; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t v = int64_t(g_ids[t]) - vb;
    g_keys[t] = int32_t(v >= 0 && v < V ? v : V);
    g_vals[t] = int32_t(t);
  }
}

template <typename T>
__global__ __launch_bounds__(lc::kThreads) void embedding_bwd_kernel(float* g_dw, const T* g_dy, int64_t lddy,
                                                                      const int32_t* g_keys, const int32_t* g_vals,
                                                                      int64_t T_, int64_t V, int64_t H) {
  for (int64_t i = blockIdx.x; i < T_; i += gridDim.x) {
    const int32_t k = g_keys[i];
    if (k >= V || (i > 0 && g_keys[i - 1] == k)) continue;  // not a segment start of an owned row
    int64_t e = i + 1;
    while (e < T_ && g_keys[e] == k) ++e;
    float* dw = g_dw + int64_t(k) * H;
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
      float acc = 0.f;
      for (int64_t p = i; p < e; ++p) acc += lc::ld(g_dy, int64_t(g_vals[p]) * lddy + h);
      dw[h] += acc;
    }
  }
}

}  // namespace

void embedding_fwd(const TensorView& y, const TensorView& ids, const TensorView& w, int64_t vocab_begin, Stream s) {
  lc::Nvtx nv("embedding_fwd");
  const int64_t T = y.shape[0], V = w.shape[0], H = w.shape[1];
  auto st = static_cast<cudaStream_t>(s.handle);
  auto launch = [&](auto* wp) {
    using W = std::remove_const_t<std::remove_pointer_t<decltype(wp)>>;
    DT_LC_DISPATCH(y.dtype, embedding_fwd_kernel<E, W><<<lc::grid_for(T), lc::kThreads, 0, st>>>(
                                y.ptr<E>(), y.stride[0], ids.ptr<int32_t>(), wp, w.stride[0], T, V, H, vocab_begin));
  };
  if (w.dtype == DType::bf16) launch(w.ptr<__nv_bfloat16>());
  else launch(w.ptr<float>());
  DT_CUDA_LAUNCH_CHECK();
}

void embedding_bwd(const TensorView& dw, const TensorView& dy, const TensorView& ids, int64_t vocab_begin, Stream s) {
  lc::Nvtx nv("embedding_bwd");
  const int64_t T = dy.shape[0], V = dw.shape[0], H = dw.shape[1];
  DT_CHECK(T < (int64_t(1) << 31) && V < (int64_t(1) << 31) - 1, "cuda::embedding_bwd: T={} or V_local={} too large",
           T, V);
  auto st = static_cast<cudaStream_t>(s.handle);
  const Device dev = dw.device;
  Tensor kv = Tensor::empty(Shape{4, T}, DType::i32, dev);  // keys in | vals in | keys out | vals out
  int32_t* k_in = kv.ptr<int32_t>();
  int32_t *v_in = k_in + T, *k_out = k_in + 2 * T, *v_out = k_in + 3 * T;
  embedding_keys_kernel<<<lc::grid_for((T + 255) / 256, 65535), 256, 0, st>>>(k_in, v_in, ids.ptr<int32_t>(), T, V,
                                                                              vocab_begin);
  DT_CUDA_LAUNCH_CHECK();
  int end_bit = 1;
  while ((int64_t(1) << end_bit) <= V) ++end_bit;  // keys in [0, V]
  size_t temp_bytes = 0;
  DT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, k_in, k_out, v_in, v_out, int(T), 0, end_bit, st));
  Tensor temp = Tensor::empty(Shape{int64_t(temp_bytes) + 1}, DType::u8, dev);
  DT_CUDA_CHECK(
      cub::DeviceRadixSort::SortPairs(temp.data(), temp_bytes, k_in, k_out, v_in, v_out, int(T), 0, end_bit, st));
  DT_LC_DISPATCH(dy.dtype, embedding_bwd_kernel<E><<<lc::grid_for(T), lc::kThreads, 0, st>>>(
                               dw.ptr<float>(), dy.ptr<E>(), dy.stride[0], k_out, v_out, T, V, H));
  DT_CUDA_LAUNCH_CHECK();
}

}  // namespace dt::ops::cuda
