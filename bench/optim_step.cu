// The optimizer phase of a training step, piece by piece, on one 256M-element fp32 tensor (the
// size of bench-0.8b's tied embedding): AdamW update, the bf16 compute-copy refresh (f32 -> bf16
// cast), zeroing the gradient, and the squared-norm reduction; then the fused pass the optimizer
// runs (AdamW + bf16 refresh + zeroing in one launch: reads p, m, v, g, writes p, m, v, the bf16
// copy and g, 34 B per element) against the sum of the three separate rows. Reports ms and GB/s
// against the bytes each must move (median of 20 after warm-up). Last, the grad norm over g cut
// into 220 views (the bench model's parameter count; every 4th a 1024-element norm weight): one
// sum_squares per view (the launch-bound loop global_grad_norm ran before) against one
// sum_squares_list; and the fused AdamW over the same views, one launch each against
// adamw_update_multi (DT_OPTIM_MULTI=1).
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_util.h"
#include "deltatron/core/tensor.h"
#include "deltatron/ops/basic.h"
#include "deltatron/ops/optim.h"

using dt::DType;
using dt::Shape;
using dt::Tensor;

int main() {
  const int64_t n = int64_t(1) << 28;
  const dt::Device dev = dt::Device::cuda();
  dt::Stream s{};
  auto st = static_cast<cudaStream_t>(s.handle);
  auto mk = [&](DType t) {
    Tensor x = Tensor::empty(Shape{n}, t, dev);
    dt::ops::rng_uniform(x, 1, 2, -1.f, 1.f, dt::ops::RngSlice::whole(x), s);
    return x;
  };
  Tensor p = mk(DType::f32), m = mk(DType::f32), v = mk(DType::f32), g = mk(DType::f32), c = mk(DType::bf16);
  dt::ops::fill(v, 0.5, s);
  dt::ops::AdamWArgs a;
  a.lr = 1e-5f;
  a.step = 10;
  Tensor out = Tensor::empty(Shape{1}, DType::f32, dev);
  struct Row {
    const char* name;
    double bytes;
    float ms;
  };
  Row rows[] = {
      {"adamw_update (p, m, v rw; g r)", 28.0 * double(n),
       dt::bench::median_ms([&] { dt::ops::adamw_update(p, m, v, g, a, s); }, st)},
      {"copy f32 -> bf16 (refresh)", 6.0 * double(n), dt::bench::median_ms([&] { dt::ops::copy(c, p, s); }, st)},
      {"fill 0 (zero grads)", 4.0 * double(n), dt::bench::median_ms([&] { dt::ops::fill(g, 0.0, s); }, st)},
      {"sum_squares (grad norm)", 4.0 * double(n), dt::bench::median_ms([&] { dt::ops::sum_squares(out, g, s); }, st)},
      // g is zero after the first run; the arithmetic's cost does not depend on the values.
      {"fused adamw + bf16 refresh + zero g", 34.0 * double(n),
       dt::bench::median_ms([&] { dt::ops::adamw_update(p, m, v, g, a, dt::ops::UpdateWrites{c, true}, s); }, st)},
  };
  std::printf("optimizer pieces on %lld fp32 elements\n", static_cast<long long>(n));
  for (const Row& r : rows) std::printf("%-36s %8.3f ms %8.0f GB/s\n", r.name, r.ms, r.bytes / (r.ms * 1e6));
  const float separate = rows[0].ms + rows[1].ms + rows[2].ms;
  std::printf("%-36s %8.3f ms %8.0f GB/s (38 B/elem moved in 3 launches)\n", "separate adamw + cast + fill (sum)",
              separate, 38.0 * double(n) / (separate * 1e6));
  std::printf("fused / separate: %.2fx faster; fused at %.0f%% of the 34 B/elem byte time at 4.3 TB/s\n",
              separate / rows[4].ms, 100.0 * (34.0 * double(n) / 4.3e12 * 1e3) / rows[4].ms);

  // Views 16-byte aligned like separately allocated parameters (big: a multiple of 4 elements).
  const int64_t kViews = 220, small = 1024, nsmall = kViews / 4, big = (n - nsmall * small) / (kViews - nsmall) / 4 * 4;
  std::vector<dt::TensorView> views;
  for (int64_t i = 0, at = 0; i < kViews; ++i) {
    const int64_t len = i % 4 == 3 ? small : i + 1 == kViews ? n - at : big;
    views.push_back(g.view().slice(0, at, at + len));
    at += len;
  }
  Tensor partial = Tensor::empty(Shape{kViews}, DType::f32, dev);  // [kViews] f32
  const float per_view = dt::bench::median_ms(
      [&] {
        for (int64_t i = 0; i < kViews; ++i) dt::ops::sum_squares(partial.view().slice(0, i, i + 1), views[size_t(i)], s);
        dt::ops::sum(out, partial, s);
      },
      st);
  const float list = dt::bench::median_ms([&] { dt::ops::sum_squares_list(out, views, s); }, st);
  std::printf("grad norm over %lld views of g:\n", static_cast<long long>(kViews));
  std::printf("%-36s %8.3f ms %8.0f GB/s\n", "sum_squares per view + sum", per_view, 4.0 * double(n) / (per_view * 1e6));
  std::printf("%-36s %8.3f ms %8.0f GB/s (%.2fx)\n", "sum_squares_list", list, 4.0 * double(n) / (list * 1e6),
              per_view / list);

  // The optimizer pass over the same 220 parameters: one launch each against adamw_update_multi's
  // batches of 48 (DT_OPTIM_MULTI=1).
  std::vector<dt::ops::AdamWItem> items;
  for (const dt::TensorView& gv : views) {
    const int64_t at = (static_cast<const float*>(gv.data) - g.ptr<float>()), len = gv.numel();
    auto cut = [&](const Tensor& t) { return t.view().slice(0, at, at + len); };
    items.push_back({cut(p), cut(m), cut(v), gv, dt::ops::UpdateWrites{cut(c), true}, len == small ? 0.f : 0.1f});
  }
  setenv("DT_OPTIM_MULTI", "0", 1);
  const float per_param = dt::bench::median_ms([&] { dt::ops::adamw_update_multi(items, a, s); }, st);
  setenv("DT_OPTIM_MULTI", "1", 1);
  const float batched = dt::bench::median_ms([&] { dt::ops::adamw_update_multi(items, a, s); }, st);
  std::printf("fused adamw over %lld views (34 B/elem):\n", static_cast<long long>(kViews));
  std::printf("%-36s %8.3f ms %8.0f GB/s\n", "one launch per view", per_param, 34.0 * double(n) / (per_param * 1e6));
  std::printf("%-36s %8.3f ms %8.0f GB/s (%.2fx)\n", "adamw_update_multi (48 per launch)", batched,
              34.0 * double(n) / (batched * 1e6), per_param / batched);
  return 0;
}
