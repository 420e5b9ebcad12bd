// CUDA optimizer updates (ops/optim.h): AdamW with bias correction and decoupled weight
// decay, and SGD with L2 weight decay, each one pass per parameter that can also write the
// compute copy of the weights and zero the gradient (UpdateWrites), so the whole optimizer
// phase of a parameter is one launch. Layouts: p, m, v, g are contiguous f32 [n] (any shape,
// flattened); compute is contiguous bf16 / f16 / f32 [n]. p, m, v are overwritten (=) in
// place; compute is overwritten with cast(p) (round to nearest even, through the bit functions
// ops::copy uses); g is read, then set to 0 when zero_grad. Deterministic (elementwise).
// Arithmetic uses explicit round-to-nearest intrinsics (no FMA contraction) in the CPU
// reference's order, and sqrt / division are IEEE-rounded (__fsqrt_rn, __fdiv_rn), so the
// result matches src/ops/cpu/optim.cpp bit for bit.
//
// Vectorised: four elements per thread through 16-byte loads / stores of p, m, v, g (8 bytes
// for a bf16 / f16 compute copy). Views that start off a 16-byte boundary peel a scalar head
// up to it, when every view reaches its own boundary at the same element; otherwise, and for
// the n % 4 tail, elements go one at a time. The arithmetic per element is the same on both
// paths.
//
// adamw_update_multi: up to kMultiItems parameters per launch (the item table travels in the
// kernel's parameter space), each cut into chunks of kChunk elements, one block per chunk, with
// adamw_elem per element: the bits of adamw_kernel. The default (DT_OPTIM_MULTI unset or 1);
// DT_OPTIM_MULTI=0 sends the items one adamw_update launch each (bench-0.8b AdamW + zero grads
// 7.94 -> 6.98 ms on an H200, docs/perf.md v0.8.0).
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string>

#include "core/cuda_check.h"
#include "core/env_knob.h"
#include "deltatron/core/numeric.h"
#include "ops/optim_backends.h"

namespace dt::ops::cuda {
namespace {

// ---- kernels --------------------------------------------------------------------------
// Which compute copy a kernel writes (a template parameter: no per-element dtype branch).
enum ComputeKind { kNone = 0, kF32 = 1, kBf16 = 2, kF16 = 3 };

template <int kC>
__device__ __forceinline__ uint16_t half_bits(float x) {
  return kC == kBf16 ? f32_to_bf16_bits(x) : f32_to_f16_bits(x);
}
template <int kC>
__device__ __forceinline__ void store_compute(void* g_c, int64_t i, float x) {
  if constexpr (kC == kF32) static_cast<float*>(g_c)[i] = x;
  else if constexpr (kC != kNone) static_cast<uint16_t*>(g_c)[i] = half_bits<kC>(x);
}
template <int kC>
__device__ __forceinline__ void store_compute4(void* g_c, int64_t i, float4 x) {  // i: 4-aligned in the vector body
  if constexpr (kC == kF32) *reinterpret_cast<float4*>(static_cast<float*>(g_c) + i) = x;
  else if constexpr (kC != kNone)
    *reinterpret_cast<ushort4*>(static_cast<uint16_t*>(g_c) + i) =
        make_ushort4(half_bits<kC>(x.x), half_bits<kC>(x.y), half_bits<kC>(x.z), half_bits<kC>(x.w));
}
__device__ __forceinline__ float4 ld4(const float* a, int64_t i) { return *reinterpret_cast<const float4*>(a + i); }
__device__ __forceinline__ void st4(float* a, int64_t i, float4 x) { *reinterpret_cast<float4*>(a + i) = x; }

// One element, in the CPU reference's order.
__device__ __forceinline__ void adamw_elem(float& r_p, float& r_m, float& r_v, float r_gin, const AdamWConsts& c) {
  const float r_g = __fmul_rn(c.grad_scale, r_gin);
  r_m = __fadd_rn(__fmul_rn(c.beta1, r_m), __fmul_rn(c.one_minus_beta1, r_g));
  r_v = __fadd_rn(__fmul_rn(c.beta2, r_v), __fmul_rn(__fmul_rn(c.one_minus_beta2, r_g), r_g));
  const float r_denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(r_v), c.bc2_sqrt), c.eps);
  r_p = __fsub_rn(__fmul_rn(r_p, c.decay), __fmul_rn(c.step_size, __fdiv_rn(r_m, r_denom)));
}
// AdamW on four elements at i (4-aligned, 16-byte views) and on one, with the optional writes:
// the per-element work of adamw_kernel and adamw_multi_kernel alike.
template <int kC>
__device__ __forceinline__ void adamw_four(float* g_p, float* g_m, float* g_v, float* g_g, void* g_c, bool zero_g,
                                           const AdamWConsts& c, int64_t i) {
  float4 r_p = ld4(g_p, i), r_m = ld4(g_m, i), r_v = ld4(g_v, i);
  const float4 r_g = ld4(g_g, i);
  adamw_elem(r_p.x, r_m.x, r_v.x, r_g.x, c);
  adamw_elem(r_p.y, r_m.y, r_v.y, r_g.y, c);
  adamw_elem(r_p.z, r_m.z, r_v.z, r_g.z, c);
  adamw_elem(r_p.w, r_m.w, r_v.w, r_g.w, c);
  st4(g_p, i, r_p);
  st4(g_m, i, r_m);
  st4(g_v, i, r_v);
  store_compute4<kC>(g_c, i, r_p);
  if (zero_g) st4(g_g, i, make_float4(0.f, 0.f, 0.f, 0.f));
}
template <int kC>
__device__ __forceinline__ void adamw_one(float* g_p, float* g_m, float* g_v, float* g_g, void* g_c, bool zero_g,
                                          const AdamWConsts& c, int64_t i) {
  float r_p = g_p[i], r_m = g_m[i], r_v = g_v[i];
  adamw_elem(r_p, r_m, r_v, g_g[i], c);
  g_p[i] = r_p;
  g_m[i] = r_m;
  g_v[i] = r_v;
  store_compute<kC>(g_c, i, r_p);
  if (zero_g) g_g[i] = 0.f;
}
__device__ __forceinline__ void sgd_elem(float& r_p, float r_gin, const SgdConsts& c) {
  const float r_g = __fadd_rn(__fmul_rn(c.grad_scale, r_gin), __fmul_rn(c.weight_decay, r_p));
  r_p = __fsub_rn(r_p, __fmul_rn(c.lr, r_g));
}

// The split of [0, n): scalar head [0, head), vector body of n4 groups of four from head,
// scalar tail after it. Scalar element j of n - 4 n4 maps to j (head) or j + 4 n4 (tail).
struct Split {
  int64_t head, n4, n;
};
__device__ __forceinline__ int64_t scalar_index(const Split& sp, int64_t j) { return j < sp.head ? j : j + 4 * sp.n4; }

template <int kC>
__global__ void adamw_kernel(float* g_p, float* g_m, float* g_v, float* g_g, void* g_c, bool zero_g, AdamWConsts c,
                             Split sp) {
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t j = first; j < sp.n4; j += stride) adamw_four<kC>(g_p, g_m, g_v, g_g, g_c, zero_g, c, sp.head + 4 * j);
  for (int64_t j = first; j < sp.n - 4 * sp.n4; j += stride)
    adamw_one<kC>(g_p, g_m, g_v, g_g, g_c, zero_g, c, scalar_index(sp, j));
}

template <int kC>
__global__ void sgd_kernel(float* g_p, float* g_g, void* g_c, bool zero_g, SgdConsts c, Split sp) {
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t j = first; j < sp.n4; j += stride) {
    const int64_t i = sp.head + 4 * j;
    float4 r_p = ld4(g_p, i);
    const float4 r_g = ld4(g_g, i);
    sgd_elem(r_p.x, r_g.x, c);
    sgd_elem(r_p.y, r_g.y, c);
    sgd_elem(r_p.z, r_g.z, c);
    sgd_elem(r_p.w, r_g.w, c);
    st4(g_p, i, r_p);
    store_compute4<kC>(g_c, i, r_p);
    if (zero_g) st4(g_g, i, make_float4(0.f, 0.f, 0.f, 0.f));
  }
  for (int64_t j = first; j < sp.n - 4 * sp.n4; j += stride) {
    const int64_t i = scalar_index(sp, j);
    float r_p = g_p[i];
    sgd_elem(r_p, g_g[i], c);
    g_p[i] = r_p;
    store_compute<kC>(g_c, i, r_p);
    if (zero_g) g_g[i] = 0.f;
  }
}

constexpr int kThreads = 256;

// ---- multi-tensor AdamW -----------------------------------------------------------------------
constexpr int kMultiItems = 48;                       // items per launch: 64 B each, ~3.1 KB of parameters
constexpr int64_t kChunk = int64_t(4) * 4 * kThreads;  // elements per block: four float4 per thread
struct MultiItem {
  float *p, *m, *v, *g;
  void* c;       // compute copy or null
  int64_t n;
  float decay;   // 1 - lr * weight_decay of this item
  int kind;      // ComputeKind
  int flags;     // kVec: p, m, v, g 16-byte aligned and the compute copy 4-element aligned; kZero: zero g
  int chunk0;    // the item's first chunk (block) in the launch
};
constexpr int kVec = 1, kZero = 2;
struct MultiArgs {
  MultiItem item[kMultiItems];
  AdamWConsts c;  // shared by every item but for decay
  int nitems;
};

// Elements [e0, e1) of one item (e0 a multiple of 4): float4 groups, then the scalar rest.
template <int kC>
__device__ __forceinline__ void adamw_chunk(const MultiItem& it, const AdamWConsts& c, int64_t e0, int64_t e1) {
  const bool zero_g = it.flags & kZero;
  int64_t s0 = e0;
  if (it.flags & kVec) {
    s0 = e0 + ((e1 - e0) & ~int64_t(3));
    for (int64_t i = e0 + 4 * int64_t(threadIdx.x); i < s0; i += 4 * int64_t(blockDim.x))
      adamw_four<kC>(it.p, it.m, it.v, it.g, it.c, zero_g, c, i);
  }
  for (int64_t i = s0 + threadIdx.x; i < e1; i += blockDim.x)
    adamw_one<kC>(it.p, it.m, it.v, it.g, it.c, zero_g, c, i);
}

__global__ __launch_bounds__(kThreads) void adamw_multi_kernel(const __grid_constant__ MultiArgs a) {
  int k = 0;  // the item of this block: the last whose first chunk is <= blockIdx.x (uniform walk)
  while (k + 1 < a.nitems && a.item[k + 1].chunk0 <= int(blockIdx.x)) ++k;
  const MultiItem& it = a.item[k];
  AdamWConsts c = a.c;
  c.decay = it.decay;
  const int64_t e0 = int64_t(int(blockIdx.x) - it.chunk0) * kChunk, e1 = min(e0 + kChunk, it.n);
  switch (it.kind) {
    case kNone: adamw_chunk<kNone>(it, c, e0, e1); break;
    case kF32: adamw_chunk<kF32>(it, c, e0, e1); break;
    case kBf16: adamw_chunk<kBf16>(it, c, e0, e1); break;
    default: adamw_chunk<kF16>(it, c, e0, e1); break;
  }
}

// DT_OPTIM_MULTI: 1 or unset = batched launches, 0 = one adamw_update per item. Read per call.
bool multi_enabled() {
  static_assert(kMultiItems == 48, "DT_OPTIM_MULTI's choice text names 48 parameters per launch");
  return env::choice("DT_OPTIM_MULTI", {{"0", "one launch per parameter"}, {"1", "up to 48 parameters per launch"}}) !=
         0;
}

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 65536 ? (b > 0 ? b : 1) : 65536);  // grid-stride loops cover the rest
}

// The vector split for f32 views `f32s` and an optional compute copy `c`: the head is the
// number of elements before p (the first view) reaches a 16-byte boundary; the body needs every
// f32 view on its boundary at that element and the compute copy on a 4-element boundary there.
// Otherwise everything is scalar (head = n).
Split split_for(std::initializer_list<const TensorView*> f32s, const TensorView& c, int64_t n) {
  const auto addr = [](const TensorView& x, int64_t e) {
    return reinterpret_cast<uintptr_t>(x.data) + uintptr_t(e) * dtype_size(x.dtype);
  };
  const TensorView& p = **f32s.begin();
  int64_t head = int64_t((16 - addr(p, 0) % 16) % 16) / 4;  // f32 views are 4-byte aligned
  bool ok = addr(p, 0) % 4 == 0 && head <= n;
  for (const TensorView* x : f32s) ok = ok && addr(*x, head) % 16 == 0;
  if (c.data) ok = ok && addr(c, head) % (4 * dtype_size(c.dtype)) == 0;
  if (!ok) return Split{n, 0, n};
  return Split{head, (n - head) / 4, n};
}

int compute_kind(const TensorView& c) {
  if (!c.data) return kNone;
  return c.dtype == DType::f32 ? kF32 : c.dtype == DType::bf16 ? kBf16 : kF16;
}

struct Range {  // NVTX range for the launcher's lifetime
  explicit Range(const char* name) { nvtxRangePushA(name); }
  ~Range() { nvtxRangePop(); }
};

}  // namespace

// ---- launchers (no workspace) ---------------------------------------------------------
void adamw_update(const TensorView& p, const TensorView& m, const TensorView& v, const TensorView& g,
                  const AdamWConsts& c, const UpdateWrites& w, Stream s) {
  const int64_t n = p.numel();
  if (!n) return;
  Range r("dt::adamw_update");
  const Split sp = split_for({&p, &m, &v, &g}, w.compute, n);
  const unsigned grid = blocks_for(std::max(sp.n4, n - 4 * sp.n4));
  auto launch = [&](auto kernel) {
    kernel<<<grid, kThreads, 0, cuda_stream(s)>>>(p.ptr<float>(), m.ptr<float>(), v.ptr<float>(), g.ptr<float>(),
                                                  w.compute.data, w.zero_grad, c, sp);
  };
  switch (compute_kind(w.compute)) {
    case kNone: launch(adamw_kernel<kNone>); break;
    case kF32: launch(adamw_kernel<kF32>); break;
    case kBf16: launch(adamw_kernel<kBf16>); break;
    default: launch(adamw_kernel<kF16>); break;
  }
  DT_CUDA_LAUNCH_CHECK();
}

void adamw_update_multi(std::span<const AdamWItem> items, std::span<const AdamWConsts> c, Stream s) {
  if (!multi_enabled()) {
    for (size_t i = 0; i < items.size(); ++i)
      adamw_update(items[i].p, items[i].m, items[i].v, items[i].g, c[i], items[i].w, s);
    return;
  }
  Range r("dt::adamw_update_multi");
  const auto aligned = [](const void* x, size_t bytes) { return reinterpret_cast<uintptr_t>(x) % bytes == 0; };
  for (size_t i = 0; i < items.size();) {
    MultiArgs a{};
    a.c = c[i];  // optim.cpp derived every item's constants from one AdamWArgs: only decay differs
    int64_t chunks = 0;
    while (i < items.size() && a.nitems < kMultiItems) {
      const AdamWItem& x = items[i];
      const int64_t n = x.p.numel(), nch = (n + kChunk - 1) / kChunk;
      DT_CHECK(nch < (int64_t(1) << 31), "adamw_update_multi: item {} of {} elements exceeds one grid", i, n);
      if (a.nitems > 0 && chunks + nch >= (int64_t(1) << 31)) break;  // the grid's x range
      MultiItem& it = a.item[a.nitems++];
      it = MultiItem{x.p.ptr<float>(), x.m.ptr<float>(), x.v.ptr<float>(), x.g.ptr<float>(), x.w.compute.data, n,
                     c[i].decay, compute_kind(x.w.compute), 0, int(chunks)};
      const bool vec = aligned(it.p, 16) && aligned(it.m, 16) && aligned(it.v, 16) && aligned(it.g, 16) &&
                       (!it.c || aligned(it.c, 4 * dtype_size(x.w.compute.dtype)));
      it.flags = (vec ? kVec : 0) | (x.w.zero_grad ? kZero : 0);
      chunks += nch;
      ++i;
    }
    adamw_multi_kernel<<<unsigned(chunks), kThreads, 0, cuda_stream(s)>>>(a);
    DT_CUDA_LAUNCH_CHECK();
  }
}

void sgd_update(const TensorView& p, const TensorView& g, const SgdConsts& c, const UpdateWrites& w, Stream s) {
  const int64_t n = p.numel();
  if (!n) return;
  Range r("dt::sgd_update");
  const Split sp = split_for({&p, &g}, w.compute, n);
  const unsigned grid = blocks_for(std::max(sp.n4, n - 4 * sp.n4));
  auto launch = [&](auto kernel) {
    kernel<<<grid, kThreads, 0, cuda_stream(s)>>>(p.ptr<float>(), g.ptr<float>(), w.compute.data, w.zero_grad, c,
                                                  sp);
  };
  switch (compute_kind(w.compute)) {
    case kNone: launch(sgd_kernel<kNone>); break;
    case kF32: launch(sgd_kernel<kF32>); break;
    case kBf16: launch(sgd_kernel<kBf16>); break;
    default: launch(sgd_kernel<kF16>); break;
  }
  DT_CUDA_LAUNCH_CHECK();
}

}  // namespace dt::ops::cuda
