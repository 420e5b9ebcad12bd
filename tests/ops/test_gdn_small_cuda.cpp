// CUDA conv1d_varlen, l2norm (also from y), gdn_gate, gated_rmsnorm (forward and backward) and
// the fused conv + gates and conv + l2norm launches (against the separate ops, bitwise) against the CPU
// reference (dt::ops::<op> on CPU f32 views) on fresh random data every run (DT_TEST_SEED
// replays one), packed batches of lengths {1, 2, 63, 64, 65, 127, 1000, 4097} in a random order.
//   f32 inputs: rel. L2 < 1e-4 for outputs and every gradient;
//   bf16 inputs: < 1e-2, against the CPU run on the SAME bf16-rounded inputs upcast to f32.
// Every output buffer is NaN-poisoned before each launch; results must be finite, and the
// padding around strided views must still be NaN afterwards (no write outside the view).
// Layouts: contiguous, strided rows (16-byte aligned: vector path) and strided rows with an
// odd element offset (unaligned: element path), plus 3D [T, H, d] views for the row norms; the
// row norms also run at H = 32 rows per token, where each persistent block streams ~20 tiles.
// Determinism: two backward runs from the same accumulators give bitwise-identical results.
// Each comparison prints one line: family, dtype, case, quantity, rel_l2, max_abs, tol.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "deltatron/ops/basic.h"
#include "deltatron/ops/gdn.h"
#include "deltatron/ops/varlen.h"
#include "test_util.h"

using namespace dt;
using dt::testing::rand_host;

namespace {

const Device kGpu = Device::cuda(0);

double tol_for(DType t) { return t == DType::f32 ? 1e-4 : 1e-2; }

Tensor as(const TensorView& x, DType t) {
  Tensor o = Tensor::empty(x.shape, t, x.device);
  ops::copy(o, x);
  return o;
}
Tensor clone(const TensorView& x) { return as(x, x.dtype); }

// Any-device, any-stride view -> contiguous host f32 copy.
Tensor host_f32(const TensorView& v) {
  Tensor h = ops::to_host(v);
  return as(h, DType::f32);
}

// Packed lengths in a fresh random order.
std::vector<int32_t> packed_cu() {
  std::vector<int32_t> lens = {1, 2, 63, 64, 65, 127, 1000, 4097};
  std::mt19937_64 g(dt::testing::test_seed());
  std::shuffle(lens.begin(), lens.end(), g);
  std::vector<int32_t> cu = {0};
  for (int32_t l : lens) cu.push_back(cu.back() + l);
  return cu;
}

enum class Layout { Contig, Strided, Unaligned };
const char* layout_name(Layout l) {
  return l == Layout::Contig ? "contig" : l == Layout::Strided ? "strided" : "unaligned";
}

// A [R, C] device view inside a wider NaN-filled buffer [R, C + pad] (columns off..off+C).
struct DevAct {
  Tensor buf;
  TensorView view;
  int64_t off = 0, C = 0, pad = 0;
};
DevAct dev_alloc(int64_t R, int64_t C, DType t, Layout L) {
  DevAct a;
  a.pad = L == Layout::Contig ? 0 : L == Layout::Strided ? 16 : 5;
  a.off = L == Layout::Contig ? 0 : L == Layout::Strided ? 8 : 1;
  a.C = C;
  a.buf = Tensor::empty(Shape{R, C + a.pad}, t, kGpu);
  dt::testing::poison(a.buf);
  a.view = a.buf.view().slice(1, a.off, a.off + C);
  return a;
}
// Fresh uniform(lo, hi) values rounded to the view's dtype; every `zero_every`-th row zeroed.
// Returns the host f32 copy of exactly what the device holds.
Tensor fill_random(const DevAct& a, float lo, float hi, int64_t zero_every = 0) {
  Tensor h = rand_host(a.view.shape, lo, hi);  // [R, C] f32
  if (zero_every > 0)
    for (int64_t r = 0; r < h.shape()[0]; r += zero_every)
      std::fill(h.ptr<float>() + r * a.C, h.ptr<float>() + (r + 1) * a.C, 0.f);
  Tensor ht = as(h, a.view.dtype);
  Tensor d = ops::to_device(ht, kGpu);
  ops::copy(a.view, d);
  return as(ht, DType::f32);
}

::testing::AssertionResult pads_untouched(const DevAct& a) {
  if (a.pad == 0) return ::testing::AssertionSuccess();
  Tensor h = host_f32(a.buf);
  const int64_t R = h.shape()[0], W = h.shape()[1];
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < W; ++c) {
      if (c >= a.off && c < a.off + a.C) continue;
      if (!std::isnan(h.ptr<float>()[r * W + c]))
        return ::testing::AssertionFailure() << "wrote outside the view: row " << r << ", buffer column " << c;
    }
  return ::testing::AssertionSuccess();
}

bool same_bits(const TensorView& a, const TensorView& b) {
  Tensor ha = ops::to_host(a), hb = ops::to_host(b);
  return ha.nbytes() == hb.nbytes() && std::memcmp(ha.data(), hb.data(), ha.nbytes()) == 0;
}

// One line per comparison, then the gtest assertion (NaN/Inf first, then rel. L2).
void expect_close(const std::string& what, const TensorView& got, const TensorView& ref, double tol) {
  Tensor g = host_f32(got), r = host_f32(ref);
  const dt::testing::ErrStats e = dt::testing::compare(g, r);
  const bool ok = e.non_finite == 0 && e.rel_l2 < tol;
  std::printf("[gdn-small] %-62s rel_l2 %.2e  max_abs %.2e  non-finite %lld  tol %.0e  %s\n", what.c_str(), e.rel_l2,
              e.max_abs, static_cast<long long>(e.non_finite), tol, ok ? "ok" : "FAIL");
  EXPECT_TRUE(dt::testing::close_rel(g, r, tol)) << what;
}

// [R, C] view seen as [R / H, H, C] (same bytes; collapses back to rows in the kernels).
TensorView as_3d(const TensorView& v, int64_t H) {
  TensorView o = v;
  o.shape = Shape{v.shape[0] / H, H, v.shape[1]};
  o.stride[0] = v.stride[0] * H;
  o.stride[1] = v.stride[0];
  o.stride[2] = 1;
  return o;
}
// A copy of [R, C] as a genuinely 3D view [R / H, H, C] inside [R / H, H * C + 8] rows (like q/k
// heads inside the conv output): the kernels must split the row index (the 3D path).
struct Dev3 {
  Tensor buf;
  TensorView view;
};
Dev3 spread_3d(const TensorView& v, int64_t H) {
  const int64_t T = v.shape[0] / H, C = v.shape[1];
  Dev3 o;
  o.buf = Tensor::empty(Shape{T, H * C + 8}, v.dtype, kGpu);
  dt::testing::poison(o.buf);
  o.view = o.buf.view();
  o.view.shape = Shape{T, H, C};
  o.view.stride[0] = H * C + 8;
  o.view.stride[1] = C;
  o.view.stride[2] = 1;
  ops::copy(o.view, as_3d(v, H));
  return o;
}

// ============================================================== 1. causal conv1d, varlen
struct ConvCase {
  int64_t D;
  int W;
  bool silu, bias;
  Layout L;
};

void run_conv(DType t, const ConvCase& cc) {
  const std::string tag = fmt::format("conv {} D={} W={} silu={} bias={} {}", dtype_name(t), cc.D, cc.W,
                                      int(cc.silu), int(cc.bias), layout_name(cc.L));
  SCOPED_TRACE(tag);
  const std::vector<int32_t> cu = packed_cu();
  ops::VarlenBatch batch(cu, kGpu);
  const ops::VarlenMeta& m = batch.meta();
  const int64_t T = cu.back(), D = cc.D;
  const double tol = tol_for(t);

  DevAct x = dev_alloc(T, D, t, cc.L);                       // [T, D]
  Tensor xh = fill_random(x, -1.f, 1.f);                     // [T, D] f32 host
  Tensor wh = rand_host(Shape{D, cc.W}, -0.5f, 0.5f);        // [D, W] f32
  Tensor wd = ops::to_device(wh, kGpu);
  Tensor bh, bd;                                             // [D] f32 or absent
  if (cc.bias) bh = rand_host(Shape{D}, -0.5f, 0.5f), bd = ops::to_device(bh, kGpu);

  // Forward.
  DevAct y = dev_alloc(T, D, t, cc.L);
  ops::causal_conv1d_fwd(y.view, x.view, wd, bd, cc.silu, m);
  Tensor yref = Tensor::empty(Shape{T, D}, DType::f32);
  ops::causal_conv1d_fwd(yref, xh, wh, bh, cc.silu, m);
  expect_close(tag + " | y", y.view, yref, tol);
  EXPECT_TRUE(pads_untouched(y)) << "y";
  // An unaligned y takes the element stores (never the kernel's FAST step): the same bits.
  DevAct yu = dev_alloc(T, D, t, Layout::Unaligned);
  ops::causal_conv1d_fwd(yu.view, x.view, wd, bd, cc.silu, m);
  EXPECT_TRUE(same_bits(y.view, yu.view)) << "y: aligned and unaligned outputs differ";

  // Backward: dw, dbias accumulate into random initial values.
  DevAct dy = dev_alloc(T, D, t, cc.L);
  Tensor dyh = fill_random(dy, -1.f, 1.f);
  Tensor dw0 = rand_host(Shape{D, cc.W}, -1.f, 1.f);
  Tensor db0 = cc.bias ? rand_host(Shape{D}, -1.f, 1.f) : Tensor();
  Tensor dxref = Tensor::empty(Shape{T, D}, DType::f32), dwref = clone(dw0), dbref = cc.bias ? clone(db0) : Tensor();
  ops::causal_conv1d_bwd(dxref, dwref, dbref, dyh, xh, wh, bh, cc.silu, m);

  Tensor first_dx, first_dw, first_db;
  for (int rep = 0; rep < 2; ++rep) {
    DevAct dx = dev_alloc(T, D, t, cc.L);
    Tensor dwd = ops::to_device(dw0, kGpu);
    Tensor dbd = cc.bias ? ops::to_device(db0, kGpu) : Tensor();
    ops::causal_conv1d_bwd(dx.view, dwd, dbd, dy.view, x.view, wd, bd, cc.silu, m);
    if (rep == 0) {
      expect_close(tag + " | dx", dx.view, dxref, tol);
      expect_close(tag + " | dw (+=)", dwd, dwref, tol);
      if (cc.bias) expect_close(tag + " | dbias (+=)", dbd, dbref, tol);
      EXPECT_TRUE(pads_untouched(dx)) << "dx";
      first_dx = clone(dx.view), first_dw = clone(dwd), first_db = cc.bias ? clone(dbd) : Tensor();
    } else {
      EXPECT_TRUE(same_bits(dx.view, first_dx)) << "dx differs between two identical backward runs";
      DevAct dxu = dev_alloc(T, D, t, Layout::Unaligned);  // element stores, as for y above
      Tensor dwu = ops::to_device(dw0, kGpu), dbu = cc.bias ? ops::to_device(db0, kGpu) : Tensor();
      ops::causal_conv1d_bwd(dxu.view, dwu, dbu, dy.view, x.view, wd, bd, cc.silu, m);
      EXPECT_TRUE(same_bits(dxu.view, first_dx)) << "dx: aligned and unaligned outputs differ";
      EXPECT_TRUE(same_bits(dwd, first_dw)) << "dw differs between two identical backward runs";
      if (cc.bias) EXPECT_TRUE(same_bits(dbd, first_db)) << "dbias differs between two identical backward runs";
    }
  }
}

const std::vector<ConvCase> kConvCases = {
    {264, 4, true, false, Layout::Strided},     // the Qwen setting (W = 4, SiLU, no bias), 2 channel blocks
    {100, 3, true, true, Layout::Unaligned},    // ragged D, element path, W < 4
    {256, 2, false, false, Layout::Contig},     // W = 2, no activation
    {520, 6, true, true, Layout::Strided},      // the W' = 8 kernel with zero taps
    {40, 8, false, true, Layout::Contig},       // W = 8, D < one channel block
};

TEST(GdnSmallCuda, Conv1dVarlenF32) {
  for (const ConvCase& cc : kConvCases) run_conv(DType::f32, cc);
}
TEST(GdnSmallCuda, Conv1dVarlenBf16) {
  for (const ConvCase& cc : kConvCases) run_conv(DType::bf16, cc);
}

// ============================================================== 2. l2norm
struct RowCase {
  int64_t H, d;
  Layout L;
};
const std::vector<RowCase> kRowCases = {
    {4, 128, Layout::Strided},    // dk = 128 (the Qwen setting)
    {3, 64, Layout::Contig},      // 8 lanes per row in bf16
    {2, 256, Layout::Unaligned},  // the largest d; two slots per lane in f32; element path
    {5, 100, Layout::Strided},    // ragged d
    {32, 128, Layout::Strided},   // Hv = 32: ~20 tiles per block, so the cp.async ring wraps around
};

void run_l2norm(DType t, const RowCase& rc) {
  const std::string tag = fmt::format("l2norm {} H={} d={} {}", dtype_name(t), rc.H, rc.d, layout_name(rc.L));
  SCOPED_TRACE(tag);
  const int64_t T = packed_cu().back(), R = T * rc.H, d = rc.d;
  const double tol = tol_for(t);
  const float eps = 1e-6f;

  DevAct x = dev_alloc(R, d, t, rc.L);
  Tensor xh = fill_random(x, -1.f, 1.f, /*zero_every=*/997);  // some all-zero (pad-like) rows
  DevAct y = dev_alloc(R, d, t, rc.L);
  Tensor rstd = Tensor::empty(Shape{R}, DType::f32, kGpu);
  dt::testing::poison(rstd);
  ops::l2norm_fwd(y.view, rstd, x.view, eps);
  Tensor yref = Tensor::empty(Shape{R, d}, DType::f32), rref = Tensor::empty(Shape{R}, DType::f32);
  ops::l2norm_fwd(yref, rref, xh, eps);
  expect_close(tag + " | y", y.view, yref, tol);
  expect_close(tag + " | rstd", rstd, rref, 1e-5);
  EXPECT_TRUE(pads_untouched(y)) << "y";

  DevAct dy = dev_alloc(R, d, t, rc.L);
  Tensor dyh = fill_random(dy, -1.f, 1.f);
  DevAct dx = dev_alloc(R, d, t, rc.L);
  ops::l2norm_bwd(dx.view, dy.view, x.view, rstd);
  Tensor dxref = Tensor::empty(Shape{R, d}, DType::f32);
  ops::l2norm_bwd(dxref, dyh, xh, rref);
  expect_close(tag + " | dx", dx.view, dxref, tol);
  EXPECT_TRUE(pads_untouched(dx)) << "dx";
  // From y (l2norm_bwd_y): against the CPU on the same y; f32: l2norm_bwd's bits (it recomputes
  // y = x * rstd exactly as the forward stored it).
  DevAct dxy = dev_alloc(R, d, t, rc.L);
  ops::l2norm_bwd_y(dxy.view, dy.view, y.view, rstd);
  Tensor dxyref = Tensor::empty(Shape{R, d}, DType::f32);
  ops::l2norm_bwd_y(dxyref, dyh, host_f32(y.view), host_f32(rstd));
  expect_close(tag + " | dx from y", dxy.view, dxyref, tol);
  EXPECT_TRUE(pads_untouched(dxy)) << "dx from y";
  if (t == DType::f32) EXPECT_TRUE(same_bits(dxy.view, dx.view)) << "f32 dx from y vs from x";

  // A genuinely 3D x [T, H, d] (rows not evenly strided) gives the same bits.
  Tensor y3 = Tensor::empty(Shape{T, rc.H, d}, t, kGpu), r3 = Tensor::empty(Shape{R}, DType::f32, kGpu);
  Tensor dx3 = Tensor::empty(Shape{T, rc.H, d}, t, kGpu);
  dt::testing::poison(y3), dt::testing::poison(r3), dt::testing::poison(dx3);
  const Dev3 x3 = spread_3d(x.view, rc.H), dy3 = spread_3d(dy.view, rc.H);
  ops::l2norm_fwd(y3, r3, x3.view, eps);
  ops::l2norm_bwd(dx3, dy3.view, x3.view, r3);
  EXPECT_TRUE(same_bits(y3.view().reshape(Shape{R, d}), clone(y.view))) << "3D view y";
  EXPECT_TRUE(same_bits(dx3.view().reshape(Shape{R, d}), clone(dx.view))) << "3D view dx";
}

TEST(GdnSmallCuda, L2NormF32) {
  for (const RowCase& rc : kRowCases) run_l2norm(DType::f32, rc);
}
TEST(GdnSmallCuda, L2NormBf16) {
  for (const RowCase& rc : kRowCases) run_l2norm(DType::bf16, rc);
}

// ============================================================== 3. gates
struct GateCase {
  int64_t H;
  Layout L;
};
const std::vector<GateCase> kGateCases = {
    {32, Layout::Strided},    // Hv = 32 (Qwen3.5-35B)
    {12, Layout::Unaligned},  // ragged, element path
    {64, Layout::Contig},     // Hv = 64
    {6, Layout::Strided},     // fewer heads than one 4-head chunk per thread
    {160, Layout::Strided},   // 40 chunks per row (64 threads per row, 4 rows per block)
};

void run_gate(DType t, const GateCase& gc) {
  const std::string tag = fmt::format("gate {} Hv={} {}", dtype_name(t), gc.H, layout_name(gc.L));
  SCOPED_TRACE(tag);
  const int64_t T = packed_cu().back(), H = gc.H;
  const double tol = tol_for(t);

  DevAct a = dev_alloc(T, H, t, gc.L), b = dev_alloc(T, H, t, gc.L);
  Tensor ah = fill_random(a, -10.f, 10.f), bh = fill_random(b, -6.f, 6.f);
  Tensor Ah = rand_host(Shape{H}, 1.f, 16.f);  // A_log = log(U(1, 16))
  for (int64_t h = 0; h < H; ++h) Ah.ptr<float>()[h] = std::log(Ah.ptr<float>()[h]);
  Tensor dth = rand_host(Shape{H}, -2.f, 14.f);  // a + dt_bias reaches past the softplus threshold 20
  Tensor Ad = ops::to_device(Ah, kGpu), dtd = ops::to_device(dth, kGpu);

  DevAct g = dev_alloc(T, H, DType::f32, gc.L), beta = dev_alloc(T, H, DType::f32, gc.L);
  ops::gdn_gate_fwd(g.view, beta.view, a.view, b.view, Ad, dtd);
  Tensor gref = Tensor::empty(Shape{T, H}, DType::f32), betaref = Tensor::empty(Shape{T, H}, DType::f32);
  ops::gdn_gate_fwd(gref, betaref, ah, bh, Ah, dth);
  expect_close(tag + " | g", g.view, gref, tol);
  expect_close(tag + " | beta", beta.view, betaref, tol);
  EXPECT_TRUE(pads_untouched(g)) << "g";
  EXPECT_TRUE(pads_untouched(beta)) << "beta";

  DevAct dg = dev_alloc(T, H, DType::f32, gc.L), dbeta = dev_alloc(T, H, DType::f32, gc.L);
  Tensor dgh = fill_random(dg, -1.f, 1.f), dbetah = fill_random(dbeta, -1.f, 1.f);
  Tensor dA0 = rand_host(Shape{H}, -1.f, 1.f), ddt0 = rand_host(Shape{H}, -1.f, 1.f);
  Tensor daref = Tensor::empty(Shape{T, H}, DType::f32), dbref = Tensor::empty(Shape{T, H}, DType::f32);
  Tensor dAref = clone(dA0), ddtref = clone(ddt0);
  ops::gdn_gate_bwd(daref, dbref, dAref, ddtref, dgh, dbetah, ah, bh, Ah, dth);

  Tensor first_da, first_db, first_dA, first_ddt;
  for (int rep = 0; rep < 2; ++rep) {
    DevAct da = dev_alloc(T, H, t, gc.L), db = dev_alloc(T, H, t, gc.L);
    Tensor dAd = ops::to_device(dA0, kGpu), ddtd = ops::to_device(ddt0, kGpu);
    ops::gdn_gate_bwd(da.view, db.view, dAd, ddtd, dg.view, dbeta.view, a.view, b.view, Ad, dtd);
    if (rep == 0) {
      expect_close(tag + " | da", da.view, daref, tol);
      expect_close(tag + " | db", db.view, dbref, tol);
      expect_close(tag + " | dA_log (+=)", dAd, dAref, tol);
      expect_close(tag + " | ddt_bias (+=)", ddtd, ddtref, tol);
      EXPECT_TRUE(pads_untouched(da)) << "da";
      EXPECT_TRUE(pads_untouched(db)) << "db";
      first_da = clone(da.view), first_db = clone(db.view), first_dA = clone(dAd), first_ddt = clone(ddtd);
    } else {
      EXPECT_TRUE(same_bits(da.view, first_da)) << "da differs between two identical backward runs";
      EXPECT_TRUE(same_bits(db.view, first_db)) << "db differs between two identical backward runs";
      EXPECT_TRUE(same_bits(dAd, first_dA)) << "dA_log differs between two identical backward runs";
      EXPECT_TRUE(same_bits(ddtd, first_ddt)) << "ddt_bias differs between two identical backward runs";
    }
  }
}

TEST(GdnSmallCuda, GateF32) {
  for (const GateCase& gc : kGateCases) run_gate(DType::f32, gc);
}
TEST(GdnSmallCuda, GateBf16) {
  for (const GateCase& gc : kGateCases) run_gate(DType::bf16, gc);
}


// ============================================================== 1 + 3. conv1d and gates in one launch
// causal_conv1d_gate_fwd/bwd against the two ops run separately on the same device inputs:
// y, dx, dw, g, beta, da, db bitwise equal (the same per-element code); dA_log and ddt_bias are
// summed over another fixed block tiling, so within 1e-5 of the separate ops (and < tol of the
// CPU reference). Hv = 160 makes the backward's gate blocks loop over several row tiles.
struct ConvGateCase {
  int64_t D, H;
  int W;
  Layout L;
};
const std::vector<ConvGateCase> kConvGateCases = {
    {264, 32, 4, Layout::Strided},    // the Qwen setting (2 channel blocks), Hv = 32
    {100, 12, 3, Layout::Unaligned},  // element paths of both
    {520, 160, 6, Layout::Strided},   // W' = 8; 40 gate chunks per row, > 512 backward tiles
};

void run_conv_gate(DType t, const ConvGateCase& cc) {
  const std::string tag =
      fmt::format("conv+gate {} D={} Hv={} W={} {}", dtype_name(t), cc.D, cc.H, cc.W, layout_name(cc.L));
  SCOPED_TRACE(tag);
  const std::vector<int32_t> cu = packed_cu();
  ops::VarlenBatch batch(cu, kGpu);
  const ops::VarlenMeta& m = batch.meta();
  const int64_t T = cu.back(), D = cc.D, H = cc.H;
  const double tol = tol_for(t);

  DevAct x = dev_alloc(T, D, t, cc.L), a = dev_alloc(T, H, t, cc.L), b = dev_alloc(T, H, t, cc.L);
  Tensor xh = fill_random(x, -1.f, 1.f), ah = fill_random(a, -10.f, 10.f), bh = fill_random(b, -6.f, 6.f);
  Tensor wd = ops::to_device(rand_host(Shape{D, cc.W}, -0.5f, 0.5f), kGpu);
  Tensor Ah = rand_host(Shape{H}, 1.f, 16.f);
  for (int64_t h = 0; h < H; ++h) Ah.ptr<float>()[h] = std::log(Ah.ptr<float>()[h]);
  Tensor Ad = ops::to_device(Ah, kGpu), dtd = ops::to_device(rand_host(Shape{H}, -2.f, 14.f), kGpu);

  // Forward: separate, then fused.
  DevAct y0 = dev_alloc(T, D, t, cc.L), g0 = dev_alloc(T, H, DType::f32, cc.L), be0 = dev_alloc(T, H, DType::f32, cc.L);
  ops::causal_conv1d_fwd(y0.view, x.view, wd, TensorView{}, true, m);
  ops::gdn_gate_fwd(g0.view, be0.view, a.view, b.view, Ad, dtd);
  DevAct y1 = dev_alloc(T, D, t, cc.L), g1 = dev_alloc(T, H, DType::f32, cc.L), be1 = dev_alloc(T, H, DType::f32, cc.L);
  ops::causal_conv1d_gate_fwd(y1.view, x.view, wd, TensorView{}, true, m,
                              ops::GdnGateFwdViews{g1.view, be1.view, a.view, b.view, Ad, dtd});
  EXPECT_TRUE(same_bits(y1.view, y0.view)) << "y";
  EXPECT_TRUE(same_bits(g1.view, g0.view)) << "g";
  EXPECT_TRUE(same_bits(be1.view, be0.view)) << "beta";
  EXPECT_TRUE(pads_untouched(y1) && pads_untouched(g1) && pads_untouched(be1));

  // Backward from the same accumulators.
  DevAct dy = dev_alloc(T, D, t, cc.L), dg = dev_alloc(T, H, DType::f32, cc.L), dbe = dev_alloc(T, H, DType::f32, cc.L);
  Tensor dgh = fill_random(dg, -1.f, 1.f), dbeh = fill_random(dbe, -1.f, 1.f);
  fill_random(dy, -1.f, 1.f);
  const Tensor dw0 = rand_host(Shape{D, cc.W}, -1.f, 1.f), dA0 = rand_host(Shape{H}, -1.f, 1.f),
               ddt0 = rand_host(Shape{H}, -1.f, 1.f);
  struct Out {
    DevAct dx, da, db;
    Tensor dw, dA, ddt;
  };
  auto alloc_out = [&]() {
    return Out{dev_alloc(T, D, t, cc.L), dev_alloc(T, H, t, cc.L), dev_alloc(T, H, t, cc.L), ops::to_device(dw0, kGpu),
               ops::to_device(dA0, kGpu), ops::to_device(ddt0, kGpu)};
  };
  Out sep = alloc_out();
  ops::causal_conv1d_bwd(sep.dx.view, sep.dw, TensorView{}, dy.view, x.view, wd, TensorView{}, true, m);
  ops::gdn_gate_bwd(sep.da.view, sep.db.view, sep.dA, sep.ddt, dg.view, dbe.view, a.view, b.view, Ad, dtd);
  Tensor dAref = clone(dA0), ddtref = clone(ddt0);  // CPU reference of the two sums
  Tensor daref = Tensor::empty(Shape{T, H}, DType::f32), dbref = Tensor::empty(Shape{T, H}, DType::f32);
  ops::gdn_gate_bwd(daref, dbref, dAref, ddtref, dgh, dbeh, ah, bh, Ah, ops::to_host(dtd));
  Tensor first_dA, first_ddt;
  for (int rep = 0; rep < 2; ++rep) {
    Out fu = alloc_out();
    ops::causal_conv1d_gate_bwd(fu.dx.view, fu.dw, TensorView{}, dy.view, x.view, wd, TensorView{}, true, m,
                                ops::GdnGateBwdViews{fu.da.view, fu.db.view, fu.dA, fu.ddt, dg.view, dbe.view, a.view,
                                                     b.view, Ad, dtd});
    EXPECT_TRUE(same_bits(fu.dx.view, sep.dx.view)) << "dx";
    EXPECT_TRUE(same_bits(fu.dw, sep.dw)) << "dw";
    EXPECT_TRUE(same_bits(fu.da.view, sep.da.view)) << "da";
    EXPECT_TRUE(same_bits(fu.db.view, sep.db.view)) << "db";
    EXPECT_TRUE(pads_untouched(fu.dx) && pads_untouched(fu.da) && pads_untouched(fu.db));
    if (rep == 0) {
      expect_close(tag + " | dA_log (+=) vs separate", fu.dA, sep.dA, 1e-5);
      expect_close(tag + " | ddt_bias (+=) vs separate", fu.ddt, sep.ddt, 1e-5);
      expect_close(tag + " | dA_log (+=) vs cpu", fu.dA, dAref, tol);
      expect_close(tag + " | ddt_bias (+=) vs cpu", fu.ddt, ddtref, tol);
      expect_close(tag + " | da vs cpu", fu.da.view, daref, tol);
      first_dA = clone(fu.dA), first_ddt = clone(fu.ddt);
    } else {
      EXPECT_TRUE(same_bits(fu.dA, first_dA)) << "dA_log differs between two identical backward runs";
      EXPECT_TRUE(same_bits(fu.ddt, first_ddt)) << "ddt_bias differs between two identical backward runs";
    }
  }
}

// ============================================================== 1 (+ 3) + 2. conv1d with the q, k L2 norm
// causal_conv1d_l2norm_fwd / _bwd against the separate ops on the same device inputs (conv, with
// or without the gates, into c; l2norm_fwd of c's q and k heads; c's v columns; backward:
// l2norm_bwd_y into dc, then the conv backward): qn, kn, rq, rk, v, dx, dw and the gates bitwise
// equal; the CPU op within tol. Cases: the Qwen block layout (q|k blocks
// normed, v blocks plain); a 256-channel block holding both q|k heads and v columns (mixed);
// dk = 256 (f32: two slots per lane); dk = 96 (not a divisor of 256: the composed path).
struct ConvNormCase {
  int64_t H, dk, Dv;
  int W;
  bool gate;
  Layout L;
};
const std::vector<ConvNormCase> kConvNormCases = {
    {2, 128, 264, 4, true, Layout::Strided},   // blocks 0-1 q|k, 2-3 v (the last partial)
    {1, 64, 100, 3, false, Layout::Unaligned}, // one mixed block (q|k 0..127, v 128..227); element path
    {3, 32, 40, 6, true, Layout::Contig},      // W' = 8; mixed block; 8 heads per block
    {1, 256, 256, 4, false, Layout::Strided},  // dk = 256
    {2, 96, 72, 4, true, Layout::Strided},     // dk = 96: composed
};

void run_conv_norm(DType t, const ConvNormCase& cc) {
  const std::string tag = fmt::format("conv+l2norm {} Hk={} dk={} Dv={} W={} gate={} {}", dtype_name(t), cc.H, cc.dk,
                                      cc.Dv, cc.W, int(cc.gate), layout_name(cc.L));
  SCOPED_TRACE(tag);
  const std::vector<int32_t> cu = packed_cu();
  ops::VarlenBatch batch(cu, kGpu);
  const ops::VarlenMeta& m = batch.meta();
  const int64_t T = cu.back(), qk = cc.H * cc.dk, D = 2 * qk + cc.Dv, Hv = 12;
  const float eps = 1e-6f;
  DevAct x = dev_alloc(T, D, t, cc.L), a = dev_alloc(T, Hv, t, cc.L), b = dev_alloc(T, Hv, t, cc.L);
  Tensor xh = fill_random(x, -1.f, 1.f, /*zero_every=*/997);
  fill_random(a, -10.f, 10.f), fill_random(b, -6.f, 6.f);
  Tensor wh = rand_host(Shape{D, cc.W}, -0.5f, 0.5f), wd = ops::to_device(wh, kGpu);
  Tensor Ad = ops::to_device(rand_host(Shape{Hv}, 0.f, 2.f), kGpu), dtd = ops::to_device(rand_host(Shape{Hv}), kGpu);
  struct Out {
    Tensor qn, kn, rq, rk, g, beta;
    DevAct v;
  };
  auto alloc_out = [&]() {
    Out o{Tensor::empty(Shape{T, cc.H, cc.dk}, t, kGpu),   Tensor::empty(Shape{T, cc.H, cc.dk}, t, kGpu),
          Tensor::empty(Shape{T * cc.H}, DType::f32, kGpu), Tensor::empty(Shape{T * cc.H}, DType::f32, kGpu),
          Tensor::empty(Shape{T, Hv}, DType::f32, kGpu),    Tensor::empty(Shape{T, Hv}, DType::f32, kGpu),
          dev_alloc(T, cc.Dv, t, cc.L)};
    for (Tensor* e : {&o.qn, &o.kn, &o.rq, &o.rk, &o.g, &o.beta}) dt::testing::poison(*e);
    return o;
  };
  // Separate ops.
  Out sep = alloc_out();
  Tensor c = Tensor::empty(Shape{T, D}, t, kGpu);
  const ops::GdnGateFwdViews gsep{sep.g, sep.beta, a.view, b.view, Ad, dtd};
  if (cc.gate) ops::causal_conv1d_gate_fwd(c, x.view, wd, TensorView{}, true, m, gsep);
  else ops::causal_conv1d_fwd(c, x.view, wd, TensorView{}, true, m);
  Tensor* ys[2] = {&sep.qn, &sep.kn};
  Tensor* rs[2] = {&sep.rq, &sep.rk};
  auto heads_of = [&](const Tensor& buf, int i) {  // section i's head rows in place: [T, H, dk], row stride D
    TensorView v = buf.view().slice(1, i * qk, (i + 1) * qk);
    v.shape = Shape{T, cc.H, cc.dk};
    v.stride[0] = D, v.stride[1] = cc.dk, v.stride[2] = 1;
    return v;
  };
  for (int i = 0; i < 2; ++i) ops::l2norm_fwd(*ys[i], *rs[i], heads_of(c, i), eps);
  ops::copy(sep.v.view, c.view().slice(1, 2 * qk, D));
  // Fused.
  Out fu = alloc_out();
  const ops::GdnGateFwdViews gfu{fu.g, fu.beta, a.view, b.view, Ad, dtd};
  ops::causal_conv1d_l2norm_fwd({fu.qn, fu.kn, fu.rq, fu.rk, fu.v.view}, x.view, wd, TensorView{}, true, eps, m,
                                cc.gate ? &gfu : nullptr);
  EXPECT_TRUE(same_bits(fu.qn, sep.qn)) << "qn";
  EXPECT_TRUE(same_bits(fu.kn, sep.kn)) << "kn";
  EXPECT_TRUE(same_bits(fu.rq, sep.rq)) << "rq";
  EXPECT_TRUE(same_bits(fu.rk, sep.rk)) << "rk";
  EXPECT_TRUE(same_bits(fu.v.view, sep.v.view)) << "v";
  EXPECT_TRUE(pads_untouched(fu.v)) << "v";
  if (cc.gate) EXPECT_TRUE(same_bits(fu.g, sep.g) && same_bits(fu.beta, sep.beta)) << "gates";
  // The CPU op on the same (dtype-rounded) inputs.
  Tensor qr = Tensor::empty(Shape{T, cc.H, cc.dk}, DType::f32), kr = Tensor::empty(Shape{T, cc.H, cc.dk}, DType::f32);
  Tensor rqr = Tensor::empty(Shape{T * cc.H}, DType::f32), rkr = Tensor::empty(Shape{T * cc.H}, DType::f32);
  Tensor vr = Tensor::empty(Shape{T, cc.Dv}, DType::f32);
  ops::VarlenBatch hbatch(cu);
  ops::causal_conv1d_l2norm_fwd({qr, kr, rqr, rkr, vr}, xh, wh, TensorView{}, true, eps, hbatch.meta(), nullptr);
  const double tol = tol_for(t);
  expect_close(tag + " | qn", fu.qn, qr, tol);
  expect_close(tag + " | kn", fu.kn, kr, tol);
  expect_close(tag + " | rq", fu.rq, rqr, tol);
  expect_close(tag + " | v", fu.v.view, vr, tol);

  // Backward (causal_conv1d_l2norm_bwd) from the forward's qn, kn, rstd and fresh dq, dk, dv,
  // against l2norm_bwd_y into dc's q|k heads, dv into its v columns, then the conv (+ gates)
  // backward on dc: dx, dw and the gates' gradients bitwise; dx, dw against the CPU op.
  Tensor dq = Tensor::empty(Shape{T, cc.H, cc.dk}, t, kGpu), dk = Tensor::empty(Shape{T, cc.H, cc.dk}, t, kGpu);
  DevAct dv = dev_alloc(T, cc.Dv, t, cc.L), dg = dev_alloc(T, Hv, DType::f32, cc.L), dbe = dev_alloc(T, Hv, DType::f32, cc.L);
  ops::copy(dq, ops::to_device(as(rand_host(Shape{T, cc.H, cc.dk}), t), kGpu));
  ops::copy(dk, ops::to_device(as(rand_host(Shape{T, cc.H, cc.dk}), t), kGpu));
  fill_random(dv, -1.f, 1.f), fill_random(dg, -1.f, 1.f), fill_random(dbe, -1.f, 1.f);
  const Tensor dw0 = rand_host(Shape{D, cc.W}, -1.f, 1.f), dA0 = rand_host(Shape{Hv}), ddt0 = rand_host(Shape{Hv});
  struct Grad {
    DevAct dx, da, db;
    Tensor dw, dA, ddt;
  };
  auto alloc_grad = [&]() {
    return Grad{dev_alloc(T, D, t, cc.L), dev_alloc(T, Hv, t, cc.L), dev_alloc(T, Hv, t, cc.L),
                ops::to_device(dw0, kGpu), ops::to_device(dA0, kGpu), ops::to_device(ddt0, kGpu)};
  };
  auto gates_of = [&](Grad& gr) {
    return ops::GdnGateBwdViews{gr.da.view, gr.db.view, gr.dA, gr.ddt, dg.view, dbe.view, a.view, b.view, Ad, dtd};
  };
  Grad gs = alloc_grad();
  Tensor dc = Tensor::empty(Shape{T, D}, t, kGpu);
  const Tensor* dqk[2] = {&dq, &dk};
  for (int i = 0; i < 2; ++i) ops::l2norm_bwd_y(heads_of(dc, i), *dqk[i], *ys[i], *rs[i]);
  ops::copy(dc.view().slice(1, 2 * qk, D), dv.view);
  if (cc.gate) ops::causal_conv1d_gate_bwd(gs.dx.view, gs.dw, TensorView{}, dc, x.view, wd, TensorView{}, true, m, gates_of(gs));
  else ops::causal_conv1d_bwd(gs.dx.view, gs.dw, TensorView{}, dc, x.view, wd, TensorView{}, true, m);
  Grad gf = alloc_grad();
  const ops::GdnGateBwdViews gfv = gates_of(gf);
  ops::causal_conv1d_l2norm_bwd(gf.dx.view, gf.dw, TensorView{}, {dq, dk, fu.qn, fu.kn, fu.rq, fu.rk, dv.view}, x.view,
                                wd, TensorView{}, true, m, cc.gate ? &gfv : nullptr);
  EXPECT_TRUE(same_bits(gf.dx.view, gs.dx.view)) << "dx";
  EXPECT_TRUE(same_bits(gf.dw, gs.dw)) << "dw";
  EXPECT_TRUE(pads_untouched(gf.dx)) << "dx";
  if (cc.gate)
    EXPECT_TRUE(same_bits(gf.da.view, gs.da.view) && same_bits(gf.db.view, gs.db.view) && same_bits(gf.dA, gs.dA) &&
                same_bits(gf.ddt, gs.ddt))
        << "gates' gradients";
  Tensor dxr = Tensor::empty(Shape{T, D}, DType::f32), dwr = clone(dw0);
  ops::causal_conv1d_l2norm_bwd(dxr, dwr, TensorView{},
                                {host_f32(dq), host_f32(dk), qr, kr, rqr, rkr, host_f32(dv.view)}, xh, wh, TensorView{},
                                true, hbatch.meta(), nullptr);
  expect_close(tag + " | dx", gf.dx.view, dxr, tol);
  expect_close(tag + " | dw (+=)", gf.dw, dwr, tol);
}

TEST(GdnSmallCuda, ConvL2NormEqualsSeparateF32) {
  for (const ConvNormCase& cc : kConvNormCases) run_conv_norm(DType::f32, cc);
}
TEST(GdnSmallCuda, ConvL2NormEqualsSeparateBf16) {
  for (const ConvNormCase& cc : kConvNormCases) run_conv_norm(DType::bf16, cc);
}

TEST(GdnSmallCuda, ConvGateEqualsSeparateF32) {
  for (const ConvGateCase& cc : kConvGateCases) run_conv_gate(DType::f32, cc);
}
TEST(GdnSmallCuda, ConvGateEqualsSeparateBf16) {
  for (const ConvGateCase& cc : kConvGateCases) run_conv_gate(DType::bf16, cc);
}

// ============================================================== 4. gated RMSNorm
void run_gated_rmsnorm(DType t, const RowCase& rc) {
  const std::string tag = fmt::format("gated_rmsnorm {} H={} dv={} {}", dtype_name(t), rc.H, rc.d,
                                      layout_name(rc.L));
  SCOPED_TRACE(tag);
  const int64_t T = packed_cu().back(), R = T * rc.H, d = rc.d;
  const double tol = tol_for(t);
  const float eps = 1e-6f;

  DevAct o = dev_alloc(R, d, t, rc.L), z = dev_alloc(R, d, t, rc.L);
  Tensor oh = fill_random(o, -2.f, 2.f, /*zero_every=*/997), zh = fill_random(z, -6.f, 6.f);
  Tensor wh = rand_host(Shape{d}, 0.5f, 1.5f);  // [dv] f32
  Tensor wd = ops::to_device(wh, kGpu);

  DevAct y = dev_alloc(R, d, t, rc.L);
  Tensor rstd = Tensor::empty(Shape{R}, DType::f32, kGpu);
  dt::testing::poison(rstd);
  ops::gated_rmsnorm_fwd(y.view, rstd, o.view, z.view, wd, eps);
  Tensor yref = Tensor::empty(Shape{R, d}, DType::f32), rref = Tensor::empty(Shape{R}, DType::f32);
  ops::gated_rmsnorm_fwd(yref, rref, oh, zh, wh, eps);
  expect_close(tag + " | y", y.view, yref, tol);
  expect_close(tag + " | rstd", rstd, rref, 1e-5);
  EXPECT_TRUE(pads_untouched(y)) << "y";

  DevAct dy = dev_alloc(R, d, t, rc.L);
  Tensor dyh = fill_random(dy, -1.f, 1.f);
  Tensor dw0 = rand_host(Shape{d}, -1.f, 1.f);
  Tensor doref = Tensor::empty(Shape{R, d}, DType::f32), dzref = Tensor::empty(Shape{R, d}, DType::f32);
  Tensor dwref = clone(dw0);
  ops::gated_rmsnorm_bwd(doref, dzref, dwref, dyh, oh, zh, wh, rref);

  Tensor first_do, first_dz, first_dw;
  for (int rep = 0; rep < 2; ++rep) {
    DevAct do_ = dev_alloc(R, d, t, rc.L), dz = dev_alloc(R, d, t, rc.L);
    Tensor dwd = ops::to_device(dw0, kGpu);
    ops::gated_rmsnorm_bwd(do_.view, dz.view, dwd, dy.view, o.view, z.view, wd, rstd);
    if (rep == 0) {
      expect_close(tag + " | do", do_.view, doref, tol);
      expect_close(tag + " | dz", dz.view, dzref, tol);
      expect_close(tag + " | dw (+=)", dwd, dwref, tol);
      EXPECT_TRUE(pads_untouched(do_)) << "do";
      EXPECT_TRUE(pads_untouched(dz)) << "dz";
      first_do = clone(do_.view), first_dz = clone(dz.view), first_dw = clone(dwd);
    } else {
      EXPECT_TRUE(same_bits(do_.view, first_do)) << "do differs between two identical backward runs";
      EXPECT_TRUE(same_bits(dz.view, first_dz)) << "dz differs between two identical backward runs";
      EXPECT_TRUE(same_bits(dwd, first_dw)) << "dw differs between two identical backward runs";
    }
  }

  // A genuinely 3D z [T, H, dv] (rows not evenly strided) gives the same bits.
  Tensor y3 = Tensor::empty(Shape{T, rc.H, d}, t, kGpu), r3 = Tensor::empty(Shape{R}, DType::f32, kGpu);
  dt::testing::poison(y3), dt::testing::poison(r3);
  const Dev3 z3 = spread_3d(z.view, rc.H);
  ops::gated_rmsnorm_fwd(y3, r3, as_3d(o.view, rc.H), z3.view, wd, eps);
  EXPECT_TRUE(same_bits(y3.view().reshape(Shape{R, d}), clone(y.view))) << "3D view y";
}

TEST(GdnSmallCuda, GatedRmsNormF32) {
  for (const RowCase& rc : kRowCases) run_gated_rmsnorm(DType::f32, rc);
}
TEST(GdnSmallCuda, GatedRmsNormBf16) {
  for (const RowCase& rc : kRowCases) run_gated_rmsnorm(DType::bf16, rc);
}

}  // namespace
