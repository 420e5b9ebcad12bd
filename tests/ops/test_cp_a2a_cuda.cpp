// cp2hp / hp2cp on GPUs (NCCL backend, a non-blocking stream): the suite of
// tests/data/cp_a2a_checks.h (bitwise against host references, fused == per_sequence, round
// trips, adjoints) with CUDA tensors. Labelled gpu; exits 77 (skipped) without a GPU.
// tests/data/CMakeLists.txt runs it on 2 GPUs (cp = 2) as test_cp_a2a_cuda_np2; the
// single-process entry covers cp = 1, plus the kernels against the CPU backend. It also
// compiles in a CPU-only build, where it always skips.
#if DELTATRON_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <numeric>
#include <random>

#include "data/cp_a2a_checks.h"
#include "ops/cp_a2a_backends.h"

namespace dt::testing {
namespace {

class CpA2aCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (process_info().gpu < 0) dist::select_cuda_device();
#if DELTATRON_HAVE_CUDA
    cudaStream_t st = nullptr;  // a non-default stream: NCCL and the kernels must order on it
    ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    stream_ = st;
#endif
    where_ = Where{Device::cuda(process_info().gpu), Stream{stream_}};
  }
  void TearDown() override {
#if DELTATRON_HAVE_CUDA
    if (stream_) {
      cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
      cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
    }
#endif
  }
  void* stream_ = nullptr;
  Where where_;
};

TEST_F(CpA2aCuda, EveryLayoutPackDtypeAndImpl) { cpa2a::run_suite(dist::cuda_backend(), where_); }

// The three kernels alone against the CPU backend, bitwise, on one GPU: element sizes 1-8,
// widths that allow 16-byte words and widths that do not, strided rows, random maps with
// runs of 1 and 4 columns.
#if DELTATRON_HAVE_CUDA
TEST_F(CpA2aCuda, KernelsMatchTheCpuBitwise) {
  std::mt19937_64 rng(test_seed());
  const Stream s = where_.stream;
  auto rand_map = [&](int64_t n) {  // a random permutation of [0, n), host int32
    Tensor m = Tensor::empty(Shape{n}, DType::i32);
    std::vector<int32_t> v(static_cast<size_t>(n));
    std::iota(v.begin(), v.end(), 0);
    std::shuffle(v.begin(), v.end(), rng);
    std::copy(v.begin(), v.end(), m.ptr<int32_t>());
    return m;
  };
  auto rand_bytes = [&](Shape sh, DType t) {
    Tensor h = Tensor::empty(sh, t);
    for (size_t i = 0; i < h.nbytes(); ++i) static_cast<uint8_t*>(h.data())[i] = uint8_t(rng());
    return h;
  };
  // A [rows, cols] view with row stride cols + pad over fresh random bytes (host and device).
  auto rows_view = [&](int64_t rows, int64_t cols, int64_t pad, DType t, Tensor* host, Tensor* dev) {
    *host = rand_bytes(Shape{rows, cols + pad}, t);
    *dev = cpa2a::on(*host, where_);
    return std::pair{host->view().slice(1, 0, cols), dev->view().slice(1, 0, cols)};
  };
  for (DType t : {DType::u8, DType::bf16, DType::f32, DType::i64}) {
    for (int64_t B : {1, 5, 8, 64}) {
      for (int64_t pad : {0, 3}) {
        for (int64_t g : {0, 1, 4}) {  // 0: no column map; else a random map of runs of g columns
          if (g && B % g) continue;
          const bool use_map = g > 0;
          SCOPED_TRACE(fmt::format("{} B={} pad={} map run={}", dtype_name(t), B, pad, g));
          const int64_t P = 3, R = 11, C = P * B;
          Tensor cmap_h = use_map ? rand_map(C / g) : Tensor(), cmap_d = use_map ? cpa2a::on(cmap_h, where_) : Tensor();
          Tensor rmap_h = use_map ? rand_map(P * R) : Tensor(), rmap_d = use_map ? cpa2a::on(rmap_h, where_) : Tensor();
          const TensorView cm_h = use_map ? cmap_h.view() : TensorView{}, cm_d = use_map ? cmap_d.view() : TensorView{};
          const TensorView rm_h = use_map ? rmap_h.view() : TensorView{}, rm_d = use_map ? rmap_d.view() : TensorView{};

          // pack: send [P, R, B] <- src [R, C]
          Tensor src_h, src_d;
          auto [src_hv, src_dv] = rows_view(R, C, pad, t, &src_h, &src_d);
          Tensor send_h = Tensor::empty(Shape{P, R, B}, t), send_d = Tensor::empty(Shape{P, R, B}, t, where_.device);
          ops::cpu::cp_pack_blocks(send_h, src_hv, cm_h, std::max<int64_t>(g, 1), {});
          ops::cuda::cp_pack_blocks(send_d, src_dv, cm_d, std::max<int64_t>(g, 1), s);
          EXPECT_TRUE(cpa2a::same_bytes(send_d, send_h, where_)) << "pack_blocks";

          // unpack: dst [R, C] <- recv [P, R, B]
          Tensor recv_h = rand_bytes(Shape{P, R, B}, t), recv_d = cpa2a::on(recv_h, where_);
          Tensor dst_h, dst_d;
          auto [dst_hv, dst_dv] = rows_view(R, C, pad, t, &dst_h, &dst_d);
          ops::cpu::cp_unpack_blocks(dst_hv, recv_h, cm_h, std::max<int64_t>(g, 1), {});
          ops::cuda::cp_unpack_blocks(dst_dv, recv_d, cm_d, std::max<int64_t>(g, 1), s);
          EXPECT_TRUE(cpa2a::same_bytes(dst_d, dst_h, where_)) << "unpack_blocks (padding columns included)";

          // gather rows: g [P*R, B] <- src2 [P*R, B]
          Tensor g_src_h, g_src_d, g_h, g_d;
          auto [gs_hv, gs_dv] = rows_view(P * R, B, pad, t, &g_src_h, &g_src_d);
          auto [g_hv, g_dv] = rows_view(P * R, B, pad, t, &g_h, &g_d);
          ops::cpu::cp_gather_rows(g_hv, gs_hv, rm_h, {});
          ops::cuda::cp_gather_rows(g_dv, gs_dv, rm_d, s);
          EXPECT_TRUE(cpa2a::same_bytes(g_d, g_h, where_)) << "gather_rows (padding columns included)";
        }
      }
    }
  }
}
#endif

}  // namespace
}  // namespace dt::testing
