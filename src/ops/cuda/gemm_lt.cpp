// CUDA GEMM through cuBLASLt (host code only, so the host compiler builds it): C = alpha op(A)
// op(B) + beta C on row-major views, the algorithm per shape from cuBLASLt's heuristic, a pin
// (DT_GEMM_ALGO, DT_GEMM_CONFIG), the per-device tuned table (gemm_tuned.h) or an autotune
// (DT_GEMM_AUTOTUNE), cached per problem.
#if DELTATRON_HAVE_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <nvtx3/nvtx3.hpp>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "core/cuda_check.h"
#include "core/env_knob.h"
#include "deltatron/core/allocator.h"
#include "deltatron/core/log.h"
#include "ops/basic_backends.h"
#include "ops/gemm_tuned.h"

namespace dt::ops::cuda {
// ---- GEMM (cuBLASLt) ------------------------------------------------------------------
// Row-major C[M,N] = A[M,K] B[K,N] is column-major C^T[N,M] = B^T A^T: cuBLASLt gets B as its
// first operand and A as its second, so no data is transposed.
namespace {
constexpr size_t kLtWorkspace = size_t(32) << 20;

struct LtDevice {
  cublasLtHandle_t handle = nullptr;
  Tensor workspace;  // from the caching allocator
  std::string name;  // cudaDeviceProp::name, for the tuned table (gemm_tuned.h)
};
LtDevice& lt_device(int dev) {
  static std::mutex mu;
  static auto* per_dev = new std::map<int, LtDevice>;  // leaked: handles outlive static destructors
  std::lock_guard<std::mutex> g(mu);
  LtDevice& d = (*per_dev)[dev];
  if (!d.handle) {
    DT_CUBLAS_CHECK(cublasLtCreate(&d.handle));
    d.workspace = Tensor::empty(Shape{int64_t(kLtWorkspace)}, DType::u8, Device::cuda(dev));
    cudaDeviceProp prop{};
    DT_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    d.name = prop.name;
  }
  return d;
}

using AlgoKey = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, int, int, int, int,
                           std::vector<int64_t>>;
struct AlgoEntry {
  cublasLtMatmulAlgo_t algo;
};

int alignment(const void* p, int64_t ld, size_t es) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p) | uintptr_t(ld * int64_t(es));
  int al = 256;
  while (al > 1 && (a % al)) al >>= 1;
  return al;
}

cudaDataType_t lt_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: DT_FAIL("gemm: unsupported dtype {}", dtype_name(t));
  }
}
// The candidate's kernel configuration as cuBLASLt names it (0 where an attribute is not set), so
// the autotune log tells which tile, stage count and cluster shape won.
uint64_t algo_attr(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  uint64_t v = 0;  // 16- to 64-bit unsigned attributes, asked with their own size (little-endian)
  size_t size = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, nullptr, 0, &size) != CUBLAS_STATUS_SUCCESS ||
      size > sizeof(v) || cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, size, &size) != CUBLAS_STATUS_SUCCESS)
    return 0;
  return v;
}
std::string algo_ids(const cublasLtMatmulAlgo_t& algo) {
  auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr) { return algo_attr(algo, attr); };
  return fmt::format("(id {} tile {} stages {} cluster {} splitk {} swizzle {} custom {} inner {})",
                     get(CUBLASLT_ALGO_CONFIG_ID), get(CUBLASLT_ALGO_CONFIG_TILE_ID), get(CUBLASLT_ALGO_CONFIG_STAGES_ID),
                     get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID), get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                     get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING), get(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION),
                     get(CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID));
}
// The configuration as DT_GEMM_CONFIG writes it: tile.stages.cluster.custom
std::string algo_config(const cublasLtMatmulAlgo_t& algo) {
  return fmt::format("{}.{}.{}.{}", algo_attr(algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                     algo_attr(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID), algo_attr(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID),
                     algo_attr(algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION));
}

// One GEMM problem as cuBLASLt sees it, for building algorithms outside its heuristic's list.
struct LtProblem {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t l1, l2, lc;
  cublasComputeType_t compute;
  cudaDataType_t in_t, c_t;
};
// Algorithm `id` for the problem's types, unconfigured.
bool init_algo(LtDevice& dev, const LtProblem& pb, uint32_t id, cublasLtMatmulAlgo_t* algo) {
  return cublasLtMatmulAlgoInit(dev.handle, pb.compute, CUDA_R_32F, pb.in_t, pb.in_t, pb.c_t, pb.c_t, int(id), algo) ==
         CUBLAS_STATUS_SUCCESS;
}
// Algorithm `id` with a configuration (tile.stages.cluster.custom; split-k 1, no swizzle), if
// cuBLASLt accepts it for the problem within the workspace (a cluster id past its 16-bit
// attribute is not accepted).
bool configured_algo(LtDevice& dev, const LtProblem& pb, uint32_t id, uint32_t tile, uint32_t stages, uint32_t cluster_id,
                     uint32_t custom, cublasLtMatmulAlgo_t* out) {
  cublasLtMatmulAlgo_t algo;
  if (cluster_id > 0xFFFF || !init_algo(dev, pb, id, &algo)) return false;
  const uint16_t cluster = uint16_t(cluster_id);
  const int32_t splitk = 1;
  const uint32_t zero = 0;
  const auto set = [&](cublasLtMatmulAlgoConfigAttributes_t a, const void* v, size_t n) {
    return cublasLtMatmulAlgoConfigSetAttribute(&algo, a, v, n) == CUBLAS_STATUS_SUCCESS;
  };
  if (!set(CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile)) || !set(CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages)) ||
      !set(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof(cluster)) ||
      !set(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom, sizeof(custom)) ||
      !set(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk)) ||
      !set(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &zero, sizeof(zero)) ||
      !set(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &zero, sizeof(zero)))
    return false;
  cublasLtMatmulHeuristicResult_t r{};
  if (cublasLtMatmulAlgoCheck(dev.handle, pb.desc, pb.l1, pb.l2, pb.lc, pb.lc, &algo, &r) != CUBLAS_STATUS_SUCCESS ||
      r.workspaceSize > kLtWorkspace)
    return false;
  *out = algo;
  return true;
}
// An algorithm capability that is an array of uint32 (tile or stage ids).
std::vector<uint32_t> cap_ids(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attr) {
  size_t size = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, nullptr, 0, &size) != CUBLAS_STATUS_SUCCESS || size == 0) return {};
  std::vector<uint32_t> ids(size / sizeof(uint32_t));
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, ids.data(), size, &size) != CUBLAS_STATUS_SUCCESS) return {};
  return ids;
}
// Every configuration of algorithm `id` that cuBLASLt accepts for the problem: its tile ids x
// stage ids x cluster shapes (1x1 to 4x4) x custom options (DT_GEMM_AUTOTUNE=2's search space).
std::vector<cublasLtMatmulAlgo_t> all_configs(LtDevice& dev, const LtProblem& pb, uint32_t id) {
  cublasLtMatmulAlgo_t base;
  if (!init_algo(dev, pb, id, &base)) return {};
  const std::vector<uint32_t> tiles = cap_ids(base, CUBLASLT_ALGO_CAP_TILE_IDS), stages = cap_ids(base, CUBLASLT_ALGO_CAP_STAGES_IDS);
  int32_t custom_max = 0;
  size_t size = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &custom_max, sizeof(custom_max),
                                        &size) != CUBLAS_STATUS_SUCCESS)
    custom_max = 0;
  std::vector<cublasLtMatmulAlgo_t> out;
  int64_t tried = 0;
  for (uint32_t t : tiles)
    for (uint32_t st : stages)
      for (uint32_t cl = CUBLASLT_CLUSTER_SHAPE_1x1x1; cl <= CUBLASLT_CLUSTER_SHAPE_4x4x1; ++cl)
        for (int32_t cu = 0; cu <= custom_max; ++cu) {
          cublasLtMatmulAlgo_t a;
          ++tried;
          if (configured_algo(dev, pb, id, t, st, cl, uint32_t(cu), &a)) out.push_back(a);
        }
  spdlog::info("gemm autotune: algorithm {} has {} tile ids, {} stage ids, custom options 0-{}: {} of {} "
               "configurations accepted", id, tiles.size(), stages.size(), custom_max, out.size(), tried);
  return out;
}

// Returns the fastest candidate and logs the table (beta 0 into a scratch C, so C is untouched).
// sustained == false: each candidate timed over 5 runs after a warm-up (DT_GEMM_AUTOTUNE=1).
// sustained == true (DT_GEMM_AUTOTUNE=2): every candidate over 2 runs after a warm-up (none for
// one whose warm-up took over 3x the first's), then the 16 fastest and the
// heuristic's first again, each run back to back for ~100 ms and timed over the next ~100 ms, so
// that the power cap settles on the candidate's own draw: at the cap a GEMM's time is its energy
// over the cap, which is what it costs inside the layer (docs/perf.md v0.29.0, v0.30.0), and a
// few runs at a cool GPU's clock rank candidates otherwise.
cublasLtMatmulAlgo_t fastest_algo(LtDevice& dev, const LtProblem& pb, const std::vector<cublasLtMatmulAlgo_t>& cand,
                                  const TensorView& c, const TensorView& a, const TensorView& b, Stream s, int64_t M,
                                  int64_t N, int64_t K, bool sustained) {
  const cudaStream_t st = cuda_stream(s);
  Tensor scratch = Tensor::empty(Shape{c.shape[0], c.stride[0]}, c.dtype, c.device);
  cudaEvent_t e0, e1;
  DT_CUDA_CHECK(cudaEventCreate(&e0));
  DT_CUDA_CHECK(cudaEventCreate(&e1));
  const float alpha = 1.f, beta = 0.f;
  const auto time_runs = [&](int i, int reps) {  // ms per run, or -1 when cuBLASLt refuses the candidate
    DT_CUDA_CHECK(cudaEventRecord(e0, st));
    for (int r = 0; r < reps; ++r)
      if (cublasLtMatmul(dev.handle, pb.desc, &alpha, b.data, pb.l1, a.data, pb.l2, &beta, scratch.data(), pb.lc,
                         scratch.data(), pb.lc, &cand[i], dev.workspace.data(), kLtWorkspace, st) != CUBLAS_STATUS_SUCCESS)
        return -1.f;
    DT_CUDA_CHECK(cudaEventRecord(e1, st));
    DT_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0.f;
    DT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    return ms / reps;
  };
  const int n = int(cand.size());
  std::vector<float> quick(n, -1.f);
  for (int i = 0; i < n; ++i) {
    const float first = time_runs(i, 1);  // a warm-up (it includes loading the kernel), timed
    if (first < 0.f) continue;
    // The search's thousands of configurations are mostly small tiles, several times slower: one
    // that takes over 3x the heuristic's first (loading included) keeps its warm-up time.
    quick[i] = sustained && i > 0 && first > 3.f * quick[0] ? first : time_runs(i, sustained ? 2 : 5);
  }
  std::vector<int> order;
  for (int i = 0; i < n; ++i)
    if (quick[i] >= 0.f) order.push_back(i);
  DT_CHECK(!order.empty() && quick[0] >= 0.f, "gemm autotune M {} N {} K {}: cuBLASLt ran none of {} candidates", M, N,
           K, n);
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return quick[x] < quick[y]; });
  std::vector<float> ms = quick;
  if (sustained) {
    if (order.size() > 16) order.resize(16);
    if (std::find(order.begin(), order.end(), 0) == order.end()) order.push_back(0);
    for (int i : order) {
      const int reps = std::max(1, int(100.f / quick[i]));
      time_runs(i, reps);          // ~100 ms: the clock settles under the cap
      ms[i] = time_runs(i, reps);  // ~100 ms timed
    }
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return ms[x] < ms[y]; });
  }
  std::string table;
  for (int i : order)
    table += sustained ? fmt::format(" {}:{:.3f} (quick {:.3f}) {}{}", i, ms[i], quick[i], algo_config(cand[i]),
                                     i == 0 ? " (first)" : "")
                       : fmt::format(" {}:{:.3f}{}", i, ms[i], algo_ids(cand[i]));
  const int best = order[0];
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  spdlog::info("gemm autotune{} M {} N {} K {}: candidate:ms{} -> {} {} ({:.0f} TFLOP/s; to pin it: "
               "DT_GEMM_CONFIG={}x{}x{}:{})",
               sustained ? " sustained" : "", M, N, K, table, best, algo_ids(cand[best]),
               2e-9 * double(M) * double(N) * double(K) / ms[best], M, N, K, algo_config(cand[best]));
  return cand[best];
}
}  // namespace

void gemm(const TensorView& c, const TensorView& a, const TensorView& b, const GemmOpts& o, Stream s) {
  int64_t M = c.shape[0], N = c.shape[1], K = o.trans_a ? a.shape[0] : a.shape[1];
  if (M == 0 || N == 0) return;
  if (K == 0) {  // nothing to multiply: C = beta * C
    if (o.beta == 0.f) fill(c, 0.0, s);
    else scale(c, o.beta, s);
    return;
  }
  nvtx3::scoped_range r("dt::gemm");
  DT_CHECK(a.dtype == DType::bf16 || a.dtype == DType::f32 || a.dtype == DType::f16,
           "CUDA gemm: inputs must be bf16, f16 or f32, got {}", a.str());
  DT_CHECK(c.dtype == a.dtype || c.dtype == DType::f32, "CUDA gemm: C must be f32 or the input dtype ({}), got {}",
           dtype_name(a.dtype), c.str());
  LtDevice& dev = lt_device(c.device.index);
  cudaDataType_t in_t = lt_type(a.dtype), c_t = lt_type(c.dtype);
  cublasComputeType_t compute =
      a.dtype == DType::f32 ? (o.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F) : CUBLAS_COMPUTE_32F;
  cublasOperation_t op1 = o.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // first operand: B
  cublasOperation_t op2 = o.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // second operand: A
  int64_t ldb = b.stride[0], lda = a.stride[0], ldc = c.stride[0];
  size_t es = dtype_size(a.dtype);
  int al_b = alignment(b.data, ldb, es), al_a = alignment(a.data, lda, es), al_c = alignment(c.data, ldc, dtype_size(c.dtype));

  cublasLtMatmulDesc_t desc;
  DT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F));
  DT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op1, sizeof(op1)));
  DT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op2, sizeof(op2)));
  cublasLtMatrixLayout_t l1, l2, lc;
  // Column-major shapes as stored: B (row-major [K,N] or [N,K]) is [N,K] or [K,N] column-major.
  DT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l1, in_t, o.trans_b ? K : N, o.trans_b ? N : K, ldb));
  DT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l2, in_t, o.trans_a ? M : K, o.trans_a ? K : M, lda));
  DT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, c_t, N, M, ldc));

  // DT_GEMM_ALGO="MxNxK:i,...": this shape's i-th heuristic candidate instead of the first (read at
  // every call and part of the cache key, so an A/B may flip it between calls).
  constexpr int kMaxCandidates = 32;
  const int pin = env::shape_index("DT_GEMM_ALGO", M, N, K, kMaxCandidates - 1,
                                   "the shape's cuBLASLt heuristic candidate, 0 its first");
  // DT_GEMM_CONFIG="MxNxK:tile.stages.cluster.custom": the heuristic's first algorithm with that
  // configuration (what DT_GEMM_AUTOTUNE=2 logs), so a configuration outside the heuristic's list
  // can be A/B'd inside the layer. Before DT_GEMM_ALGO; read at every call, part of the cache key.
  std::vector<int64_t> config;
  if (pin < 0)
    config = env::shape_tuple("DT_GEMM_CONFIG", M, N, K, 4, "tile.stages.cluster.custom",
                              "a cuBLASLt configuration of the heuristic's first algorithm, as DT_GEMM_AUTOTUNE=2 logs it");
  // DT_GEMM_AUTOTUNE=1: time the heuristic's first candidates once per shape and keep the
  // fastest (off by default: the choice then depends on timing, so two runs may differ in bits).
  // =2: also every configuration of its first algorithm, ranked at the power cap (fastest_algo).
  const int tune_level = std::max(0, env::choice("DT_GEMM_AUTOTUNE",
                                                 {{"0", "cuBLASLt's first heuristic (default)"},
                                                  {"1", "time up to 32 candidates per shape"},
                                                  {"2", "time every configuration of the first algorithm, sustained"}}));
  bool tune = tune_level > 0 && pin < 0 && config.empty();
  if (tune) {  // no timing inside a capture (asked only when autotuning)
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    DT_CUDA_CHECK(cudaStreamIsCapturing(cuda_stream(s), &cap));
    tune = cap == cudaStreamCaptureStatusNone;
  }
  // Else the tuned table's candidate (gemm_tuned.h) where this device, shape and bf16 GEMM match.
  const int trans = int(o.trans_a) | (int(o.trans_b) << 1);
  const TunedGemm* tuned = pin < 0 && config.empty() && !tune && a.dtype == DType::bf16 && c.dtype == DType::bf16
                               ? tuned_gemm(dev.name, M, N, K, trans)
                               : nullptr;
  if (tuned && tuned->candidate >= kMaxCandidates) tuned = nullptr;  // (the table's test bounds it too)
  static std::mutex mu;
  static std::map<AlgoKey, AlgoEntry> cache;
  // The choice's part of the key: a pin's index, or -2 table, -3 / -4 autotune 1 / 2, -5 a
  // configuration (its four numbers in the last field), -1 the heuristic's first.
  const int how = pin >= 0 ? pin : !config.empty() ? -5 : tuned ? -2 : tune ? -2 - tune_level : -1;
  AlgoKey key{c.device.index, M, N, K, lda, ldb, ldc, int(a.dtype), int(c.dtype),
              trans | (int(o.allow_tf32) << 2), al_a, al_b, al_c, how, config};
  cublasLtMatmulAlgo_t algo;
  {
    std::lock_guard<std::mutex> g(mu);
    auto it = cache.find(key);
    if (it != cache.end()) {
      algo = it->second.algo;
    } else {
      cublasLtMatmulPreference_t pref;
      DT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      uint64_t ws = kLtWorkspace;
      uint32_t a1 = al_b, a2 = al_a, a3 = al_c;
      DT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
      DT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a1, sizeof(a1)));
      DT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &a2, sizeof(a2)));
      DT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &a3, sizeof(a3)));
      DT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &a3, sizeof(a3)));
      const int want = pin >= 0 ? pin + 1 : tuned ? tuned->candidate + 1 : tune ? kMaxCandidates : 1;
      const LtProblem pb{desc, l1, l2, lc, compute, in_t, c_t};
      cublasLtMatmulHeuristicResult_t res[kMaxCandidates] = {};
      int found = 0;
      DT_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(dev.handle, desc, l1, l2, lc, lc, pref, want, res, &found));
      cublasLtMatmulPreferenceDestroy(pref);
      DT_CHECK(found > 0, "cuBLASLt found no algorithm for C {} = op(A) {} op(B) {} (trans_a {}, trans_b {})", c.str(),
               a.str(), b.str(), o.trans_a, o.trans_b);
      const uint32_t first_id = uint32_t(algo_attr(res[0].algo, CUBLASLT_ALGO_CONFIG_ID));
      if (!config.empty()) {
        const std::string cfg = fmt::format("{}.{}.{}.{}", config[0], config[1], config[2], config[3]);
        if (!configured_algo(dev, pb, first_id, uint32_t(config[0]), uint32_t(config[1]), uint32_t(config[2]),
                             uint32_t(config[3]), &algo))
          user_error(fmt::format("DT_GEMM_CONFIG names {} for M {} N {} K {}, but cuBLASLt does not accept that "
                                 "configuration of algorithm {} there (DT_GEMM_AUTOTUNE=2 logs the ones it does); "
                                 "pick one of them or unset it",
                                 cfg, M, N, K, first_id));
        spdlog::info("gemm M {} N {} K {}: configuration {} {} (DT_GEMM_CONFIG)", M, N, K, cfg, algo_ids(algo));
      } else if (pin >= 0) {
        if (found <= pin)
          user_error(fmt::format("DT_GEMM_ALGO pins candidate {} for M {} N {} K {}, but cuBLASLt offers {} (0 to {}); "
                                 "pick one of them or unset it",
                                 pin, M, N, K, found, found - 1));
        algo = res[pin].algo;
        spdlog::info("gemm M {} N {} K {}: candidate {} {} (DT_GEMM_ALGO)", M, N, K, pin, algo_ids(algo));
      } else if (tuned) {
        // The table's candidate only while the heuristic still offers the kernel that was measured.
        const int i = tuned->candidate;
        const bool same = found > i && algo_attr(res[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID) == uint64_t(tuned->tile) &&
                          algo_attr(res[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID) == uint64_t(tuned->stages) &&
                          algo_attr(res[i].algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID) == uint64_t(tuned->cluster) &&
                          (tuned->custom < 0 ||
                           algo_attr(res[i].algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION) == uint64_t(tuned->custom));
        algo = res[same ? i : 0].algo;
        if (same)
          spdlog::info("gemm M {} N {} K {}: tuned candidate {} {} (DT_GEMM_TUNED=0 for the first)", M, N, K, i,
                       algo_ids(algo));
        else
          spdlog::warn("gemm M {} N {} K {}: the tuned table's candidate {} (tile {} stages {} cluster {} custom {}) is "
                       "not what this cuBLASLt offers there ({}); using its first",
                       M, N, K, i, tuned->tile, tuned->stages, tuned->cluster, tuned->custom,
                       found > i ? algo_ids(res[i].algo) : fmt::format("{} candidates", found));
      } else {
        algo = res[0].algo;
        if (tune) {
          std::vector<cublasLtMatmulAlgo_t> cand;
          for (int i = 0; i < found; ++i) cand.push_back(res[i].algo);
          if (tune_level == 2)
            for (const auto& x : all_configs(dev, pb, first_id))
              cand.push_back(x);
          if (cand.size() > 1) algo = fastest_algo(dev, pb, cand, c, a, b, s, M, N, K, tune_level == 2);
        }
      }
      cache.emplace(key, AlgoEntry{algo});
    }
  }
  float alpha = o.alpha, beta = o.beta;
  DT_CUBLAS_CHECK(cublasLtMatmul(dev.handle, desc, &alpha, b.data, l1, a.data, l2, &beta, c.data, lc, c.data, lc, &algo,
                                 dev.workspace.data(), kLtWorkspace, cuda_stream(s)));
  cublasLtMatrixLayoutDestroy(l1);
  cublasLtMatrixLayoutDestroy(l2);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(desc);
  if (DT_SYNC_CHECK) DT_CUDA_CHECK(cudaStreamSynchronize(cuda_stream(s)));
}

}  // namespace dt::ops::cuda
#endif  // DELTATRON_HAVE_CUDA
