// CUDA kernels of the cp2hp / hp2cp data movement (thd-context-parallel.md 4.3-4.6): one
// family of three gathers around the CP all-to-all.
//   gather_rows   dst[i, :] = src[idx[i], :]                   token map (cp_idx / cp_inv)
//   pack_blocks   send[j, l, m] = src[l, col(j*B + m)]          head permutation into the send buffer
//   unpack_blocks dst[l, c] = recv[k / B, l, k % B], k = inv(c) receive buffer to rows
// A column map moves runs of g columns (col(m) = map[m / g] * g + m % g; g = gcd of the
// per-rank section widths), so with the Qwen3.5 sections even the permuted pack moves 16-byte
// words.
// Layouts: 2-D views [rows, cols] with a unit inner stride and any row stride; send/recv
// [cp, rows, B] contiguous; maps int32 or empty (identity). Pure byte moves (any dtype of
// 1/2/4/8 bytes), deterministic, no atomics; every output element is written once (=).
// Threads walk the OUTPUT linearly (coalesced stores); each moves the widest word (up to 16
// bytes) that the runs, row widths, strides and addresses allow.
#include <nvtx3/nvToolsExt.h>

#include <cstdint>

#include "core/cuda_check.h"
#include "ops/cp_a2a_backends.h"

namespace dt::ops::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 65536 * 16 ? (b > 0 ? b : 1) : 65536 * 16);  // grid-stride loops cover the rest
}

// ---- kernels ----------------------------------------------------------------------------
// W: the moved word (an element type, or a wider word when no column map is used). Sizes,
// strides and offsets below are in words.

template <typename W>
__global__ void gather_rows_kernel(W* __restrict__ g_dst, int64_t dst_stride, const W* __restrict__ g_src,
                                   int64_t src_stride, const int32_t* __restrict__ g_idx, int64_t rows,
                                   int64_t width) {
  const int64_t n = rows * width;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / width, w = i - r * width;
    const int64_t sr = g_idx ? int64_t(g_idx[r]) : r;
    g_dst[r * dst_stride + w] = g_src[sr * src_stride + w];
  }
}

template <typename W>
__global__ void pack_blocks_kernel(W* __restrict__ g_send, const W* __restrict__ g_src, int64_t src_stride,
                                   const int32_t* __restrict__ g_col, int64_t unit, int64_t P, int64_t R,
                                   int64_t B) {
  const int64_t n = P * R * B;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i / (R * B), rem = i - j * (R * B);
    const int64_t l = rem / B, m = j * B + (rem - l * B);  // output column (in words)
    const int64_t u = m / unit;
    const int64_t c = g_col ? int64_t(g_col[u]) * unit + (m - u * unit) : m;
    g_send[i] = g_src[l * src_stride + c];
  }
}

template <typename W>
__global__ void unpack_blocks_kernel(W* __restrict__ g_dst, int64_t dst_stride, const W* __restrict__ g_recv,
                                     const int32_t* __restrict__ g_inv, int64_t unit, int64_t R, int64_t B,
                                     int64_t C) {
  const int64_t n = R * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t l = i / C, c = i - l * C;
    const int64_t u = c / unit;
    const int64_t k = g_inv ? int64_t(g_inv[u]) * unit + (c - u * unit) : c;
    const int64_t j = k / B;
    g_dst[l * dst_stride + c] = g_recv[(j * R + l) * B + (k - j * B)];
  }
}

// ---- launch helpers ---------------------------------------------------------------------

struct Range {  // NVTX range for the launcher's lifetime
  explicit Range(const char* name) { nvtxRangePushA(name); }
  ~Range() { nvtxRangePop(); }
};

// The widest power-of-two word (<= 16 bytes) dividing every byte quantity given.
int word_bytes(std::initializer_list<uint64_t> quantities) {
  int w = 16;
  for (uint64_t q : quantities)
    while (w > 1 && q % uint64_t(w) != 0) w /= 2;
  return w;
}
uint64_t addr(const void* p) { return reinterpret_cast<uint64_t>(p); }

// Calls f(W{}) with the word type of `bytes` bytes.
template <typename F>
void by_word(int bytes, F f) {
  switch (bytes) {
    case 1: f(uint8_t{}); return;
    case 2: f(uint16_t{}); return;
    case 4: f(uint32_t{}); return;
    case 8: f(uint2{}); return;
    case 16: f(uint4{}); return;
    default: DT_FAIL("cuda::cp_a2a: unsupported word size {}", bytes);
  }
}

// A view without data is the identity map.
const int32_t* map_or_null(const TensorView& m) { return m.data ? m.ptr<int32_t>() : nullptr; }

}  // namespace

// ---- launchers --------------------------------------------------------------------------

void cp_gather_rows(const TensorView& dst, const TensorView& src, const TensorView& idx, Stream s) {
  Range range("cp_a2a::gather_rows");
  const int64_t R = dst.shape[0], Wd = dst.shape[1];  // dst [R, W]; src [*, W]; idx [R]
  const uint64_t es = dtype_size(dst.dtype);
  if (R == 0 || Wd == 0) return;
  const int wb = word_bytes({Wd * es, dst.stride[0] * es, src.stride[0] * es, addr(dst.data), addr(src.data)});
  const int64_t words = int64_t(Wd * es) / wb;
  by_word(wb, [&](auto tag) {
    using W = decltype(tag);
    gather_rows_kernel<W><<<blocks_for(R * words), kThreads, 0, cuda_stream(s)>>>(
        static_cast<W*>(dst.data), int64_t(dst.stride[0] * es) / wb, static_cast<const W*>(src.data),
        int64_t(src.stride[0] * es) / wb, map_or_null(idx), R, words);
  });
  DT_CUDA_LAUNCH_CHECK();
}

void cp_pack_blocks(const TensorView& send, const TensorView& src, const TensorView& col, int64_t g, Stream s) {
  Range range("cp_a2a::pack_blocks");
  const int64_t P = send.shape[0], R = send.shape[1], B = send.shape[2];  // send [cp, R, B]; src [R, cp*B]
  const uint64_t es = dtype_size(send.dtype);
  if (P * R * B == 0) return;
  // Words never straddle a run of the column map (g columns) nor a block (B columns).
  const uint64_t run = col.data ? g * es : B * es;
  const int wb = word_bytes({run, B * es, src.stride[0] * es, addr(send.data), addr(src.data)});
  const int64_t bw = int64_t(B * es) / wb, unit = int64_t(run) / wb;
  by_word(wb, [&](auto tag) {
    using W = decltype(tag);
    pack_blocks_kernel<W><<<blocks_for(P * R * bw), kThreads, 0, cuda_stream(s)>>>(
        static_cast<W*>(send.data), static_cast<const W*>(src.data), int64_t(src.stride[0] * es) / wb,
        map_or_null(col), unit, P, R, bw);
  });
  DT_CUDA_LAUNCH_CHECK();
}

void cp_unpack_blocks(const TensorView& dst, const TensorView& recv, const TensorView& inv, int64_t g, Stream s) {
  Range range("cp_a2a::unpack_blocks");
  const int64_t R = recv.shape[1], B = recv.shape[2], C = dst.shape[1];  // dst [R, cp*B]; recv [cp, R, B]
  const uint64_t es = dtype_size(dst.dtype);
  if (R * C == 0) return;
  const uint64_t run = inv.data ? g * es : B * es;
  const int wb = word_bytes({run, B * es, dst.stride[0] * es, addr(dst.data), addr(recv.data)});
  const int64_t bw = int64_t(B * es) / wb, cw = int64_t(C * es) / wb, unit = int64_t(run) / wb;
  by_word(wb, [&](auto tag) {
    using W = decltype(tag);
    unpack_blocks_kernel<W><<<blocks_for(R * cw), kThreads, 0, cuda_stream(s)>>>(
        static_cast<W*>(dst.data), int64_t(dst.stride[0] * es) / wb, static_cast<const W*>(recv.data),
        map_or_null(inv), unit, R, bw, cw);
  });
  DT_CUDA_LAUNCH_CHECK();
}

}  // namespace dt::ops::cuda
