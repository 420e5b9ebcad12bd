// attention.backend=cudnn: varlen causal attention (contract in include/deltatron/ops/attention.h)
// through cuDNN's SDPA graphs (cudnn_frontend graph API) with ragged (THD) offsets, bf16 only.
//
// Layout. Every view is [rows, H, D] with head stride D and any row stride rs, so each is a
// ragged BSHD tensor: dims [B, H, S, D], strides [S rs, D, rs, 1], and a ragged offset per batch
// (first row * rs, in elements). lse [Tq, H] f32 is the ragged Stats [B, H, S, 1] with strides
// [S H, 1, H, 1] (natural log, as the op wants). The batches are the query chunks of
// attention_cudnn_meta.h (one per sequence, two per sequence for CP zig-zag rows), masked with
// the padding mask (actual lengths) and a bottom-right causal diagonal; their lengths and offsets
// are built on the device (attention_cudnn_meta.cu), so a call needs no host sync when
// AttnVarlen::max_seqlen is given (else one: cu_seqlens_padded is read back to bound S).
// cuDNN does not touch rows past a batch's length: fix-up kernels write o = 0, lse = 0, dq = 0
// on rows that are not live and dk = dv = 0 on padding keys.
// Backward of zig-zag rows: the two chunks of a sequence see overlapping keys and cuDNN writes
// (does not accumulate) dK/dV per batch, so each chunk runs as its own call into scratch and a
// fix-up kernel sums the two dK/dV (and picks dq rows) into the outputs.
// Graphs: built once per (device, direction, Hq, Hkv, D, B, S_q, S_kv, Tq, Tk, row strides,
// offset width, scale) and cached; B, S_q, S_kv and the token totals Tq, Tk (graph bounds: cuDNN's
// max total sequence lengths) are rounded up to powers of two so that packs of varying sequence
// counts, lengths and totals reuse a few graphs (with the exact totals in the key, a training run
// built new graphs for nearly every micro-batch: docs/perf.md v0.4.0). Workspace comes from the caching
// allocator. Not bitwise deterministic: cuDNN's dQ accumulates with fp32 atomics (its
// deterministic Hopper mode needs a B H S_q S_kv workspace).
// Runtime: cuDNN >= 9.19 (9.18 and older give NaN gradients for THD attention on Hopper) on
// sm_90 or newer.
#if DELTATRON_HAVE_CUDA
#include <cudnn.h>
#include <fmt/format.h>
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/cuda_check.h"
#include "core/env_knob.h"
#include "ops/attention_backends.h"

#if DELTATRON_HAVE_CUDNN_FRONTEND
#include <cudnn_frontend.h>

#include "ops/cuda/attention_cudnn_meta.h"
#endif

namespace dt::ops::cuda {
namespace {
constexpr size_t kMinCudnn = 91900;
std::string version_str(size_t v) { return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100); }
}  // namespace

#if !DELTATRON_HAVE_CUDNN_FRONTEND

std::string cudnn_attention_unavailable() {
  return fmt::format("deltatron was built without cudnn_frontend (runtime cuDNN {}) ---> hint: "
                     "bash scripts/fetch_cudnn_frontend.sh, then reconfigure (DELTATRON_CUDNN_FRONTEND=ON)",
                     version_str(cudnnGetVersion()));
}
void attention_fwd_cudnn(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                         const TensorView&, const AttnVarlen&, float, Stream) {
  DT_FAIL("attention_fwd_cudnn: {}", cudnn_attention_unavailable());
}
void attention_bwd_cudnn(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                         const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                         const TensorView&, const AttnVarlen&, float, Stream) {
  DT_FAIL("attention_bwd_cudnn: {}", cudnn_attention_unavailable());
}

#else  // DELTATRON_HAVE_CUDNN_FRONTEND

namespace {
namespace fe = cudnn_frontend;
namespace meta = cudnn_meta;

// Graph tensor uids; the ragged offset of tensor t has uid kOff + t.
enum Tid : int { kQ, kK, kV, kO, kDO, kStats, kDQ, kDK, kDV, kNumT };
constexpr int64_t kSeqQ = 100, kSeqKv = 101, kOff = 200;
constexpr int kSide[kNumT] = {0, 1, 1, 0, 0, 0, 0, 1, 1};  // 0: query rows, 1: key rows

struct Dev {
  cudnnHandle_t handle = nullptr;
};
std::mutex g_mu;  // guards the handles and the graph cache (graphs are built and run under it)
Dev& device_handle(int dev) {
  static auto* per_dev = new std::map<int, Dev>;  // leaked: handles outlive static destructors
  Dev& d = (*per_dev)[dev];
  if (!d.handle) DT_CUDNN_CHECK(cudnnCreate(&d.handle));
  return d;
}

int64_t pow2_at_least(int64_t x) {
  int64_t p = 1;
  while (p < x) p *= 2;
  return p;
}

// What a graph depends on. rs[t]: row stride of tensor t (0 when the graph has no such tensor).
struct Shape7 {
  bool bwd = false;
  int64_t Hq = 0, Hkv = 0, D = 0, B = 0, Sq = 0, Skv = 0, Tq = 0, Tk = 0;  // Tq, Tk: bounds (powers of two)
  std::array<int64_t, kNumT> rs{};
  bool i64 = false;
  float scale = 0.f;
  std::vector<int64_t> key(int dev) const {
    uint32_t sb;
    std::memcpy(&sb, &scale, 4);
    std::vector<int64_t> k{dev, bwd, Hq, Hkv, D, B, Sq, Skv, Tq, Tk, i64, int64_t(sb)};
    k.insert(k.end(), rs.begin(), rs.end());
    return k;
  }
};

struct Built {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
  bool tuned = false;  // DT_CUDNN_SDPA_TUNE: timed every plan on its first call
};

// DT_CUDNN_SDPA_TUNE=1, an investigation switch (off by default: the heuristics' first plan):
// every graph builds all the plans the heuristics list and times them on its first call (cuDNN
// frontend's autotune, which synchronises the device), then keeps the fastest; the chosen plan of
// each graph is logged. For finding out why the ragged backward is slow (docs/perf.md v0.2.0).
bool tune_plans() {
  static const bool on =
      env::choice("DT_CUDNN_SDPA_TUNE", {{"0", "the heuristics' first plan"}, {"1", "time every plan once"}}) == 1;
  return on;
}

void fe_check(fe::error_t e, const Shape7& s, const char* what) {
  if (e.is_good()) return;
  DT_FAIL("cuDNN SDPA {} ({}: Hq {} Hkv {} D {} batches {} S_q {} S_kv {} Tq {} Tk {}): {}", what,
          s.bwd ? "backward" : "forward", s.Hq, s.Hkv, s.D, s.B, s.Sq, s.Skv, s.Tq, s.Tk, e.get_message());
}

std::shared_ptr<fe::graph::Graph> make_graph(const Shape7& s) {
  using TA = fe::graph::Tensor_attributes;
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const auto odt = s.i64 ? fe::DataType_t::INT64 : fe::DataType_t::INT32;
  std::array<std::shared_ptr<TA>, kNumT> off;
  for (int t = 0; t < kNumT; ++t)
    if (s.rs[size_t(t)])
      off[size_t(t)] = g->tensor(TA().set_name(fmt::format("off{}", t)).set_uid(kOff + t).set_dim({s.B + 1, 1, 1, 1})
                                     .set_stride({1, 1, 1, 1}).set_data_type(odt));
  auto heads = [&](Tid t) { return kSide[t] == 0 || t == kStats ? s.Hq : s.Hkv; };
  auto seqs = [&](Tid t) { return kSide[t] == 0 ? s.Sq : s.Skv; };
  // [B, H, S, D] with strides [S rs, D, rs, 1] and its ragged offset.
  auto describe = [&](TA& a, Tid t) -> TA& {
    const int64_t H = heads(t), S = seqs(t), rs = s.rs[size_t(t)];
    return a.set_uid(t + 1).set_dim({s.B, H, S, s.D}).set_stride({S * rs, s.D, rs, 1}).set_ragged_offset(off[size_t(t)]);
  };
  auto input = [&](Tid t, const char* name) { return g->tensor(describe(TA().set_name(name), t)); };
  auto stats_like = [&](TA& a) -> TA& {
    return a.set_uid(kStats + 1).set_data_type(fe::DataType_t::FLOAT).set_dim({s.B, s.Hq, s.Sq, 1})
        .set_stride({s.Sq * s.Hq, 1, s.Hq, 1}).set_ragged_offset(off[kStats]);
  };
  auto seq = [&](int64_t uid, const char* name) {
    return g->tensor(TA().set_name(name).set_uid(uid).set_dim({s.B, 1, 1, 1}).set_stride({1, 1, 1, 1})
                         .set_data_type(fe::DataType_t::INT32));
  };
  auto Q = input(kQ, "Q"), K = input(kK, "K"), V = input(kV, "V");
  auto sq = seq(kSeqQ, "seq_q"), skv = seq(kSeqKv, "seq_kv");
  // What both directions share: the scale, the actual lengths (padding mask), the causal
  // diagonal aligned bottom-right and the packed token totals.
  auto causal_ragged = [&](auto& a) {
    a.set_attn_scale(s.scale)
        .set_padding_mask(true)
        .set_seq_len_q(sq)
        .set_seq_len_kv(skv)
        .set_diagonal_alignment(fe::DiagonalAlignment_t::BOTTOM_RIGHT)
        .set_diagonal_band_right_bound(0)
        .set_max_total_seq_len_q(s.Tq)
        .set_max_total_seq_len_kv(s.Tk);
  };
  if (!s.bwd) {
    fe::graph::SDPA_attributes o;
    o.set_name("sdpa_fwd").set_generate_stats(true);
    causal_ragged(o);
    auto [O, Stats] = g->sdpa(Q, K, V, o);
    describe(O->set_output(true).set_name("O"), kO);
    stats_like(Stats->set_output(true).set_name("Stats"));
  } else {
    auto O = input(kO, "O"), dO = input(kDO, "dO");
    auto Stats = g->tensor(stats_like(TA().set_name("Stats")));
    fe::graph::SDPA_backward_attributes o;
    o.set_name("sdpa_bwd");
    causal_ragged(o);
    auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, Stats, o);
    describe(dQ->set_output(true).set_name("dQ"), kDQ);
    describe(dK->set_output(true).set_name("dK"), kDK);
    describe(dV->set_output(true).set_name("dV"), kDV);
  }
  return g;
}

// The cached graph for `s` (built on first use; callers hold g_mu).
Built& graph_for(const Shape7& s, int dev, cudnnHandle_t h) {
  static auto* cache = new std::map<std::vector<int64_t>, Built>;
  auto key = s.key(dev);
  auto it = cache->find(key);
  if (it != cache->end()) return it->second;
  Built b{make_graph(s), 0};
  fe_check(b.graph->validate(), s, "graph validation");
  fe_check(b.graph->build_operation_graph(h), s, "operation graph");
  fe_check(b.graph->create_execution_plans({fe::HeurMode_t::A}), s, "execution plans");
  fe_check(b.graph->check_support(h), s, "support check");
  fe_check(b.graph->build_plans(h, tune_plans() ? fe::BuildPlanPolicy_t::ALL : fe::BuildPlanPolicy_t::HEURISTICS_CHOICE),
           s, "plan build");
  fe_check(b.graph->get_workspace_size(b.workspace), s, "workspace size");
  if (tune_plans()) b.workspace = std::max(b.workspace, b.graph->get_autotune_workspace_size());
  return cache->emplace(std::move(key), std::move(b)).first->second;
}

struct Nvtx {
  explicit Nvtx(const char* name) { nvtxRangePushA(name); }
  ~Nvtx() { nvtxRangePop(); }
};

// One cuDNN call: builds its batch table on the device, then runs the cached graph.
// ptr[t]: data of tensor t (nullptr when the graph has none).
struct Call {
  Shape7 shape;
  meta::Batches batches;
  std::array<void*, kNumT> ptr{};
};

void run(const Call& c, Device dev, cudaStream_t st) {
  const Shape7& s = c.shape;
  int side[kNumT], n = 0;
  int64_t mult[kNumT];
  std::array<int, kNumT> slot{};
  for (int t = 0; t < kNumT; ++t) {
    if (!s.rs[size_t(t)]) continue;
    slot[size_t(t)] = n;
    side[n] = kSide[t];
    mult[n++] = t == kStats ? s.Hq : s.rs[size_t(t)];
  }
  const int64_t B1 = s.B + 1, ob = s.i64 ? 8 : 4;
  // [n, B+1] offsets, then seq_q [B], seq_kv [B]; one allocation from the caching allocator.
  Tensor tab = Tensor::empty(Shape{n * B1 * ob + 2 * s.B * 4}, DType::u8, dev);
  char* off = static_cast<char*>(tab.data());
  int32_t* seq_q = reinterpret_cast<int32_t*>(off + n * B1 * ob);
  int32_t* seq_kv = seq_q + s.B;
  meta::build(c.batches, n, side, mult, s.i64, seq_q, seq_kv, off, st);

  std::lock_guard<std::mutex> lk(g_mu);
  Dev& d = device_handle(dev.index);
  Built& b = graph_for(s, dev.index, d.handle);
  Tensor ws = Tensor::empty(Shape{std::max<int64_t>(b.workspace, 1)}, DType::u8, dev);
  std::unordered_map<int64_t, void*> pack{{kSeqQ, seq_q}, {kSeqKv, seq_kv}};
  for (int t = 0; t < kNumT; ++t) {
    if (!s.rs[size_t(t)]) continue;
    pack[t + 1] = c.ptr[size_t(t)];
    pack[kOff + t] = off + slot[size_t(t)] * B1 * ob;
  }
  DT_CUDNN_CHECK(cudnnSetStream(d.handle, st));
  if (tune_plans() && !b.tuned) {  // outputs are overwritten (=) by every run, so trial runs are harmless
    fe_check(b.graph->autotune(d.handle, pack, ws.data()), s, "autotune");
    b.tuned = true;
    std::string name;
    fe_check(b.graph->get_plan_name(name), s, "plan name");
    std::fprintf(stderr, "[cudnn sdpa] %s Hq %lld Hkv %lld D %lld B %lld S_q %lld S_kv %lld: fastest of %lld plans: %s\n",
                 s.bwd ? "backward" : "forward", (long long)s.Hq, (long long)s.Hkv, (long long)s.D, (long long)s.B,
                 (long long)s.Sq, (long long)s.Skv, (long long)b.graph->get_execution_plan_count(), name.c_str());
  }
  fe_check(b.graph->execute(d.handle, pack, ws.data()), s, "execute");
}

// The shape and batch table shared by the calls of one op.
struct Plan {
  Shape7 shape;
  meta::Batches batches;
};
// The largest padded sequence length: AttnVarlen::max_seqlen, else read back (one host sync).
int64_t max_padded(const AttnVarlen& m, const TensorView& q, cudaStream_t st, const char* op) {
  static const std::string why = cudnn_attention_unavailable();  // the runtime cannot change in a process
  DT_CHECK(why.empty(), "{}: {}", op, why);
  DT_CHECK(q.dtype == DType::bf16,
           "{}: the cuDNN path takes bf16 views, got {} ---> hint: attention.backend=native for f32", op, q.str());
  if (m.max_seqlen > 0) return m.max_seqlen;
  const int N = int(m.cu_seqlens_padded.shape[0] - 1);
  std::vector<int32_t> cu(size_t(N) + 1);
  DT_CUDA_CHECK(cudaMemcpyAsync(cu.data(), m.cu_seqlens_padded.data, cu.size() * 4, cudaMemcpyDeviceToHost, st));
  DT_CUDA_CHECK(cudaStreamSynchronize(st));
  int64_t mx = 0;
  for (int i = 0; i < N; ++i) mx = std::max<int64_t>(mx, cu[size_t(i) + 1] - cu[size_t(i)]);
  return mx;
}
Plan plan(const TensorView& q, const TensorView& k, const AttnVarlen& m, int64_t maxp, float scale, bool bwd,
          int chunk) {
  const int N = int(m.cu_seqlens_padded.shape[0] - 1), nc = meta::nchunk(m.q_div);
  Plan p;
  Shape7& s = p.shape;
  s.bwd = bwd;
  s.Hq = q.shape[1];
  s.Hkv = k.shape[1];
  s.D = q.shape[2];
  s.Tq = pow2_at_least(q.shape[0]);
  s.Tk = pow2_at_least(k.shape[0]);
  s.B = pow2_at_least(chunk < 0 ? int64_t(N) * nc : N);
  s.Skv = pow2_at_least(std::max<int64_t>(maxp, 1));
  s.Sq = pow2_at_least(std::max<int64_t>(maxp / (int64_t(m.q_div) * nc), 1));
  s.scale = scale;
  meta::Batches& b = p.batches;
  b.cu_pad = m.cu_seqlens_padded.ptr<int32_t>();
  b.cu = m.cu_seqlens.ptr<int32_t>();
  b.q_pos = m.q_pos.ptr<int32_t>();
  b.N = N;
  b.q_div = m.q_div;
  b.chunk = chunk;
  b.B = int(s.B);
  b.Tq = q.shape[0];  // the actual rows (the fix-up kernels and the offsets of empty batches)
  b.Tk = k.shape[0];
  b.max_padded = int(std::min<int64_t>(maxp, INT32_MAX));
  return p;
}
void set_offsets_width(Shape7& s) {
  int64_t mx = s.Tq * s.Hq;  // Stats
  for (int t = 0; t < kNumT; ++t) mx = std::max(mx, (kSide[t] == 0 ? s.Tq : s.Tk) * s.rs[size_t(t)]);
  s.i64 = mx > INT32_MAX;
}

}  // namespace

std::string cudnn_attention_unavailable() {
  const size_t v = cudnnGetVersion();
  if (v < kMinCudnn)
    return fmt::format("runtime cuDNN {} is older than {} (cuDNN up to 9.18 gives NaN gradients for THD attention "
                       "on Hopper) ---> hint: put a cuDNN >= 9.19 first on LD_LIBRARY_PATH, e.g. the PyTorch venv's "
                       "<venv>/lib/python3.*/site-packages/nvidia/cudnn/lib",
                       version_str(v), version_str(kMinCudnn));
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) !=
                                                cudaSuccess) {
    cudaGetLastError();
    return fmt::format("no usable CUDA device for the cuDNN SDPA path (runtime cuDNN {})", version_str(v));
  }
  if (major < 9)
    return fmt::format("cuDNN SDPA with ragged (THD) offsets needs sm_90 or newer, device {} is sm_{}x", dev, major);
  return "";
}

void attention_fwd_cudnn(const TensorView& o, const TensorView& lse, const TensorView& q, const TensorView& k,
                         const TensorView& v, const AttnVarlen& m, float scale, Stream s) {
  Nvtx nv("attention_fwd_cudnn");
  const cudaStream_t st = cuda_stream(s);
  const int64_t maxp = max_padded(m, q, st, "attention_fwd (cudnn)");
  Plan p = plan(q, k, m, maxp, scale, false, -1);
  Call c{p.shape, p.batches, {}};
  c.shape.rs[kQ] = q.stride[0];
  c.shape.rs[kK] = k.stride[0];
  c.shape.rs[kV] = v.stride[0];
  c.shape.rs[kO] = o.stride[0];
  c.shape.rs[kStats] = 1;  // present; its offsets use Hq
  set_offsets_width(c.shape);
  c.ptr[kQ] = q.data;
  c.ptr[kK] = k.data;
  c.ptr[kV] = v.data;
  c.ptr[kO] = o.data;
  c.ptr[kStats] = lse.data;
  run(c, q.device, st);
  meta::fix_q_rows(p.batches, o.data, o.stride[0], q.shape[1] * q.shape[2], nullptr, nullptr, st);
  meta::fix_lse(p.batches, lse.ptr<float>(), q.shape[1], st);
}

void attention_bwd_cudnn(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& d_o,
                         const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                         const TensorView& lse, const AttnVarlen& m, float scale, Stream s) {
  Nvtx nv("attention_bwd_cudnn");
  const cudaStream_t st = cuda_stream(s);
  const int64_t Tq = q.shape[0], Tk = k.shape[0], Wq = q.shape[1] * q.shape[2], Wk = k.shape[1] * k.shape[2];
  const bool zigzag = m.q_div > 1;
  // Zig-zag rows: one call per chunk into contiguous scratch, merged below.
  Tensor scratch[2][3];
  if (zigzag)
    for (auto& sc : scratch) {
      sc[0] = Tensor::empty(Shape{Tq, Wq}, DType::bf16, q.device);
      sc[1] = Tensor::empty(Shape{Tk, Wk}, DType::bf16, q.device);
      sc[2] = Tensor::empty(Shape{Tk, Wk}, DType::bf16, q.device);
    }
  const int64_t maxp = max_padded(m, q, st, "attention_bwd (cudnn)");
  meta::Batches all{};
  for (int chunk = 0; chunk < (zigzag ? 2 : 1); ++chunk) {
    Plan p = plan(q, k, m, maxp, scale, true, zigzag ? chunk : -1);
    all = p.batches;
    Call c{p.shape, p.batches, {}};
    const TensorView in[] = {q, k, v, o, d_o};
    for (int t = kQ; t <= kDO; ++t) {
      c.shape.rs[size_t(t)] = in[t].stride[0];
      c.ptr[size_t(t)] = in[t].data;
    }
    c.shape.rs[kStats] = 1;
    c.ptr[kStats] = lse.data;
    if (zigzag) {
      c.shape.rs[kDQ] = Wq;
      c.shape.rs[kDK] = c.shape.rs[kDV] = Wk;
      for (int t = 0; t < 3; ++t) c.ptr[size_t(kDQ + t)] = scratch[chunk][t].data();
    } else {
      c.shape.rs[kDQ] = dq.stride[0];
      c.shape.rs[kDK] = dk.stride[0];
      c.shape.rs[kDV] = dv.stride[0];
      c.ptr[kDQ] = dq.data;
      c.ptr[kDK] = dk.data;
      c.ptr[kDV] = dv.data;
    }
    set_offsets_width(c.shape);
    run(c, q.device, st);
  }
  all.chunk = -1;  // the fix-ups look at both chunks
  auto src = [&](int chunk, int t) -> const void* { return zigzag ? scratch[chunk][t].data() : nullptr; };
  meta::fix_q_rows(all, dq.data, dq.stride[0], Wq, src(0, 0), src(1, 0), st);
  meta::fix_k_rows(all, dk.data, dk.stride[0], Wk, src(0, 1), src(1, 1), st);
  meta::fix_k_rows(all, dv.data, dv.stride[0], Wk, src(0, 2), src(1, 2), st);
}

#endif  // DELTATRON_HAVE_CUDNN_FRONTEND

}  // namespace dt::ops::cuda
#endif  // DELTATRON_HAVE_CUDA
