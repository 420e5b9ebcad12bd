// CUDA dense-layer ops against the CPU reference on fresh random data, f32 (rel. L2 < 1e-4) and
// bf16 (< 1e-2; inputs rounded to bf16 first, so both sides see the same values), outputs
// NaN-poisoned; strided views (the halves of one [T, 2F] buffer, vocab slices of the logits,
// aligned and not: the cross entropy's grouped loads, their head and tail);
// rmsnorm1p dw and embedding dW accumulate (+=) and are bitwise repeatable; rmsnorm1p's
// warp-per-row kernels and swiglu's 16-byte path each next to their element fallbacks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "cuda_test_util.h"
#include "deltatron/ops/layers_ops.h"

using namespace dt;
using namespace dt::testing;

TEST(LayersOpsCuda, Rmsnorm1p) {
  for (DType t : {DType::f32, DType::bf16}) {
    const int64_t R = 300, D = 1040;
    Tensor x = rounded(rand_host(Shape{R, D}, -3.f, 3.f), t), dy = rounded(rand_host(Shape{R, D}), t);
    Tensor w = rand_host(Shape{D}, -0.5f, 0.5f), dw0 = rand_host(Shape{D});
    Tensor y = Tensor::empty(Shape{R, D}, DType::f32), rs = Tensor::empty(Shape{R}, DType::f32);
    Tensor dx = Tensor::empty(Shape{R, D}, DType::f32), dw = as(dw0, DType::f32);
    ops::rmsnorm1p_fwd(y, rs, x, w, 1e-6f);
    ops::rmsnorm1p_bwd(dx, dw, dy, x, w, rs);
    Tensor gx = dev(x, t), gdy = dev(dy, t), gw = dev(w, DType::f32), gdw = dev(dw0, DType::f32);
    Tensor gy = Tensor::empty(Shape{R, D}, t, kGpu), grs = Tensor::empty(Shape{R}, DType::f32, kGpu);
    Tensor gdx = Tensor::empty(Shape{R, D}, t, kGpu);
    poison(gy);
    poison(gdx);
    ops::rmsnorm1p_fwd(gy, grs, gx, gw, 1e-6f);
    ops::rmsnorm1p_bwd(gdx, gdw, gdy, gx, gw, grs);
    EXPECT_TRUE(close_rel(host32(gy), y, tol(t))) << dtype_name(t) << " y";
    EXPECT_TRUE(close_rel(host32(grs), rs, 1e-5)) << dtype_name(t) << " rstd";
    EXPECT_TRUE(close_rel(host32(gdx), dx, tol(t))) << dtype_name(t) << " dx";
    EXPECT_TRUE(close_rel(host32(gdw), dw, 1e-4)) << dtype_name(t) << " dw (+=)";
    Tensor gdw2 = dev(dw0, DType::f32);
    ops::rmsnorm1p_bwd(gdx, gdw2, gdy, gx, gw, grs);
    EXPECT_EQ(std::memcmp(host32(gdw).data(), host32(gdw2).data(), size_t(D) * 4), 0) << "dw not repeatable";
  }
}

TEST(LayersOpsCuda, SwigluOnHalvesOfOneBuffer) {
  for (DType t : {DType::f32, DType::bf16}) {
    const int64_t T = 257, F = 136;
    Tensor gu = rounded(rand_host(Shape{T, 2 * F}, -6.f, 6.f), t), dy = rounded(rand_host(Shape{T, F}), t);
    Tensor y = Tensor::empty(Shape{T, F}, DType::f32), dgu = Tensor::empty(Shape{T, 2 * F}, DType::f32);
    auto halves = [F](const TensorView& v) { return std::pair{v.slice(1, 0, F), v.slice(1, F, 2 * F)}; };
    auto [g, u] = halves(gu);
    auto [dg, du] = halves(dgu);
    ops::swiglu_fwd(y, g, u);
    ops::swiglu_bwd(dg, du, dy, g, u);
    Tensor ggu = dev(gu, t), gdy = dev(dy, t), gy = Tensor::empty(Shape{T, F}, t, kGpu),
           gdgu = Tensor::empty(Shape{T, 2 * F}, t, kGpu);
    poison(gy);
    poison(gdgu);
    auto [gg, gu2] = halves(ggu);
    auto [gdg, gdu] = halves(gdgu);
    ops::swiglu_fwd(gy, gg, gu2);
    ops::swiglu_bwd(gdg, gdu, gdy, gg, gu2);
    EXPECT_TRUE(close_rel(host32(gy), y, tol(t))) << dtype_name(t);
    EXPECT_TRUE(close_rel(host32(gdgu), dgu, tol(t))) << dtype_name(t);
  }
}

// The row kernels (one warp per row, 16-byte slots) and their fallbacks: rows of 256 as the
// strided half of a [R, 512] buffer (the attention's q heads), 1024 (the hidden size, a row
// count that leaves the last warp's rows partly past the end), a misaligned ragged row (element
// accesses inside the row kernel), a row too wide for it (the generic block kernel), and a
// tiny D; dw (+=) repeatable in bits on each.
TEST(LayersOpsCuda, Rmsnorm1pRowKernelsAndFallbacks) {
  struct Case {
    int64_t R, D, pitch, off;  // x, dy, dx, y: columns [off, off + D) of [R, pitch] buffers
  };
  for (const Case c : {Case{333, 256, 512, 0}, Case{129, 1024, 1024, 0}, Case{77, 100, 101, 1},
                       Case{5, 3000, 3000, 0}, Case{9, 6, 6, 0}}) {
    for (DType t : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " R " + std::to_string(c.R) + " D " + std::to_string(c.D));
      const int64_t R = c.R, D = c.D;
      auto cols = [&](const TensorView& v) { return v.slice(1, c.off, c.off + D); };
      Tensor xb = rounded(rand_host(Shape{R, c.pitch}, -3.f, 3.f), t), dyb = rounded(rand_host(Shape{R, c.pitch}), t);
      Tensor w = rand_host(Shape{D}, -0.5f, 0.5f), dw0 = rand_host(Shape{D});
      Tensor y = Tensor::empty(Shape{R, D}, DType::f32), rs = Tensor::empty(Shape{R}, DType::f32);
      Tensor dx = Tensor::empty(Shape{R, D}, DType::f32), dw = as(dw0, DType::f32);
      ops::rmsnorm1p_fwd(y, rs, cols(xb), w, 1e-6f);
      ops::rmsnorm1p_bwd(dx, dw, cols(dyb), cols(xb), w, rs);
      Tensor gxb = dev(xb, t), gdyb = dev(dyb, t), gw = dev(w, DType::f32), gdw = dev(dw0, DType::f32);
      Tensor gyb = Tensor::empty(Shape{R, c.pitch}, t, kGpu), gdxb = Tensor::empty(Shape{R, c.pitch}, t, kGpu);
      Tensor grs = Tensor::empty(Shape{R}, DType::f32, kGpu);
      poison(gyb);
      poison(gdxb);
      poison(grs);
      ops::rmsnorm1p_fwd(cols(gyb), grs, cols(gxb), gw, 1e-6f);
      ops::rmsnorm1p_bwd(cols(gdxb), gdw, cols(gdyb), cols(gxb), gw, grs);
      EXPECT_TRUE(close_rel(host32(cols(gyb)), y, tol(t))) << "y";
      EXPECT_TRUE(close_rel(host32(grs), rs, 1e-5)) << "rstd";
      EXPECT_TRUE(close_rel(host32(cols(gdxb)), dx, tol(t))) << "dx";
      EXPECT_TRUE(close_rel(host32(gdw), dw, 1e-4)) << "dw (+=)";
      Tensor gdw2 = dev(dw0, DType::f32);
      ops::rmsnorm1p_bwd(cols(gdxb), gdw2, cols(gdyb), cols(gxb), gw, grs);
      EXPECT_EQ(std::memcmp(host32(gdw).data(), host32(gdw2).data(), size_t(D) * 4), 0) << "dw not repeatable";
    }
  }
}

// SwiGLU's 16-byte path (F a whole number of vectors, aligned halves; the bench's F = 3584 at a
// few rows) and its element fallback (odd F; F = 132, whose bf16 u half starts 8 bytes off 16).
TEST(LayersOpsCuda, SwigluVectorAndFallbackPaths) {
  for (const int64_t F : {int64_t(135), int64_t(132), int64_t(3584)}) {
    for (DType t : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " F " + std::to_string(F));
      const int64_t T = 37;
      Tensor gu = rounded(rand_host(Shape{T, 2 * F}, -8.f, 8.f), t), dy = rounded(rand_host(Shape{T, F}), t);
      Tensor y = Tensor::empty(Shape{T, F}, DType::f32), dgu = Tensor::empty(Shape{T, 2 * F}, DType::f32);
      auto halves = [F](const TensorView& v) { return std::pair{v.slice(1, 0, F), v.slice(1, F, 2 * F)}; };
      auto [g, u] = halves(gu);
      auto [dg, du] = halves(dgu);
      ops::swiglu_fwd(y, g, u);
      ops::swiglu_bwd(dg, du, dy, g, u);
      Tensor ggu = dev(gu, t), gdy = dev(dy, t), gy = Tensor::empty(Shape{T, F}, t, kGpu),
             gdgu = Tensor::empty(Shape{T, 2 * F}, t, kGpu);
      poison(gy);
      poison(gdgu);
      auto [gg, gu2] = halves(ggu);
      auto [gdg, gdu] = halves(gdgu);
      ops::swiglu_fwd(gy, gg, gu2);
      ops::swiglu_bwd(gdg, gdu, gdy, gg, gu2);
      EXPECT_TRUE(close_rel(host32(gy), y, tol(t))) << "y";
      EXPECT_TRUE(close_rel(host32(gdgu), dgu, tol(t))) << "dg|du";
    }
  }
}

TEST(LayersOpsCuda, EmbeddingDeterministicScatterAdd) {
  for (DType t : {DType::f32, DType::bf16}) {
    const int64_t T = 3000, V = 500, H = 72, vb = 500;  // this shard owns [500, 1000); ids in [0, 1500)
    Tensor idf = rand_host(Shape{T}, 0.f, 1500.f);
    Tensor ids = Tensor::empty(Shape{T}, DType::i32);
    for (int64_t i = 0; i < T; ++i) ids.ptr<int32_t>()[i] = int32_t(idf.ptr<float>()[i]) % (i % 5 ? 1500 : 7 + 500);
    Tensor w = rounded(rand_host(Shape{V, H}), t), dy = rounded(rand_host(Shape{T, H}), t), dw0 = rand_host(Shape{V, H});
    Tensor y = Tensor::empty(Shape{T, H}, DType::f32), dw = as(dw0, DType::f32);
    ops::embedding_fwd(y, ids, w, vb);
    ops::embedding_bwd(dw, dy, ids, vb);
    Tensor gids = ops::to_device(ids, kGpu), gy = Tensor::empty(Shape{T, H}, t, kGpu);
    poison(gy);
    ops::embedding_fwd(gy, gids, dev(w, t), vb);
    Tensor gdw = dev(dw0, DType::f32), gdw2 = dev(dw0, DType::f32), gdy = dev(dy, t);
    ops::embedding_bwd(gdw, gdy, gids, vb);
    ops::embedding_bwd(gdw2, gdy, gids, vb);
    EXPECT_TRUE(close_rel(host32(gy), y, 1e-6)) << dtype_name(t);
    EXPECT_TRUE(close_rel(host32(gdw), dw, 1e-5)) << dtype_name(t);
    EXPECT_EQ(std::memcmp(host32(gdw).data(), host32(gdw2).data(), size_t(V * H) * 4), 0) << "not repeatable";
  }
}

TEST(LayersOpsCuda, CrossEntropyPieces) {
  // Vocab slices of a wider buffer: 4-aligned rows (the grouped loads throughout), and rows that
  // start 1 element past alignment with an odd width (3 elements before the first group, a tail
  // of 2); the contiguous [T, 1497] dlogits then align differently from the logits on most rows
  // (ce_bwd's element-by-element path).
  for (DType t : {DType::f32, DType::bf16})
    for (auto [vb, Vl] : {std::pair<int64_t, int64_t>{1000, 1500}, {1001, 1497}}) {
      SCOPED_TRACE(fmt::format("{} vocab slice [{}, {})", dtype_name(t), vb, vb + Vl));
      const int64_t T = 130, Vfull = 3000;
      Tensor lf = rounded(rand_host(Shape{T, Vfull}, -8.f, 8.f), t);
      TensorView l = lf.view().slice(1, vb, vb + Vl);
      Tensor tg = Tensor::empty(Shape{T}, DType::i32);
      for (int64_t i = 0; i < T; ++i) tg.ptr<int32_t>()[i] = i % 9 == 0 ? -1 : int32_t((i * 37) % Vfull);
      Tensor m = Tensor::empty(Shape{T}, DType::f32), se = Tensor::empty(Shape{T}, DType::f32),
             tl = Tensor::empty(Shape{T}, DType::f32), loss = Tensor::empty(Shape{T}, DType::f32),
             d = Tensor::empty(Shape{T, Vl}, DType::f32);
      // A global max above this shard's on odd rows, so ce_rescale changes se there.
      Tensor M = Tensor::empty(Shape{T}, DType::f32), se_r = Tensor::empty(Shape{T}, DType::f32);
      ops::ce_stats(m, se, tl, l, tg, vb);
      for (int64_t i = 0; i < T; ++i) M.ptr<float>()[i] = m.ptr<float>()[i] + (i % 2 ? 1.5f : 0.f);
      ops::copy(se_r, se);
      ops::ce_rescale(se_r, m, M);
      ops::ce_loss(loss, m, se, tl, tg);
      ops::ce_bwd(d, l, m, se, tg, vb, 0.25f);
      Tensor glf = dev(lf, t), gtg = ops::to_device(tg, kGpu);
      TensorView gl = glf.view().slice(1, vb, vb + Vl);
      Tensor gm = Tensor::empty(Shape{T}, DType::f32, kGpu), gse = Tensor::empty(Shape{T}, DType::f32, kGpu),
             gtl = Tensor::empty(Shape{T}, DType::f32, kGpu), gloss = Tensor::empty(Shape{T}, DType::f32, kGpu),
             gd = Tensor::empty(Shape{T, Vl}, t, kGpu);
      for (const Tensor* p : {&gm, &gse, &gtl, &gloss, &gd}) poison(*p);
      ops::ce_stats(gm, gse, gtl, gl, gtg, vb);
      Tensor gse_r = ops::to_device(se, kGpu);  // the CPU's se: ce_rescale alone is compared
      ops::ce_rescale(gse_r, ops::to_device(m, kGpu), ops::to_device(M, kGpu));
      ops::ce_loss(gloss, gm, gse, gtl, gtg);
      ops::ce_bwd(gd, gl, gm, gse, gtg, vb, 0.25f);
      EXPECT_TRUE(close_rel(host32(gm), m, 1e-6)) << "m";
      EXPECT_TRUE(close_rel(host32(gse), se, 1e-5)) << "se";
      EXPECT_TRUE(close_rel(host32(gtl), tl, 1e-6)) << "tl";
      EXPECT_TRUE(close_rel(host32(gse_r), se_r, 1e-6)) << "se rescaled";
      EXPECT_TRUE(close_rel(host32(gloss), loss, 1e-5)) << "loss";
      EXPECT_TRUE(close_rel(host32(gd), d, tol(t))) << "dlogits";
    }
  // Special rows against the CPU (test_layers_ops.cpp checks those): all -inf (m = -inf, se =
  // 0), -inf mixed with finite values (add exactly 0), one NaN (se NaN), f32 and bf16.
  for (DType t : {DType::f32, DType::bf16}) {
    const int64_t V = 1037;
    Tensor l = rounded(rand_host(Shape{3, V}, -5.f, 5.f), t), tg = Tensor::zeros(Shape{3}, DType::i32);
    float* p = l.ptr<float>();
    for (int64_t j = 0; j < V; ++j) p[j] = -INFINITY;
    for (int64_t j = 0; j < V; j += 3) p[V + j] = -INFINITY;
    p[2 * V + 517] = NAN;
    Tensor m = Tensor::empty(Shape{3}, DType::f32), se = Tensor::empty(Shape{3}, DType::f32),
           tl = Tensor::empty(Shape{3}, DType::f32);
    ops::ce_stats(m, se, tl, l, tg, 0);
    Tensor gm = Tensor::empty(Shape{3}, DType::f32, kGpu), gse = Tensor::empty(Shape{3}, DType::f32, kGpu),
           gtl = Tensor::empty(Shape{3}, DType::f32, kGpu);
    ops::ce_stats(gm, gse, gtl, dev(l, t), ops::to_device(tg, kGpu), 0);
    Tensor hm = host32(gm), hse = host32(gse);
    EXPECT_EQ(hm.ptr<float>()[0], -INFINITY) << dtype_name(t);
    EXPECT_EQ(hse.ptr<float>()[0], 0.f) << dtype_name(t);
    EXPECT_EQ(hm.ptr<float>()[1], m.ptr<float>()[1]) << dtype_name(t);
    EXPECT_LT(std::abs(hse.ptr<float>()[1] - se.ptr<float>()[1]) / se.ptr<float>()[1], 1e-5) << dtype_name(t);
    EXPECT_TRUE(std::isnan(hse.ptr<float>()[2])) << dtype_name(t);
  }
  // f32 logits -> bf16 dlogits (the LM head's path under bf16).
  const int64_t T = 33, V = 700;
  Tensor l = rand_host(Shape{T, V}, -8.f, 8.f), tg = Tensor::empty(Shape{T}, DType::i32);
  for (int64_t i = 0; i < T; ++i) tg.ptr<int32_t>()[i] = int32_t((i * 11) % V);
  Tensor m = Tensor::empty(Shape{T}, DType::f32), se = Tensor::empty(Shape{T}, DType::f32),
         tl = Tensor::empty(Shape{T}, DType::f32), d = Tensor::empty(Shape{T, V}, DType::f32);
  ops::ce_stats(m, se, tl, l, tg, 0);
  ops::ce_bwd(d, l, m, se, tg, 0, 1.f);
  Tensor gd = Tensor::empty(Shape{T, V}, DType::bf16, kGpu);
  poison(gd);
  ops::ce_bwd(gd, ops::to_device(l, kGpu), ops::to_device(m, kGpu), ops::to_device(se, kGpu),
              ops::to_device(tg, kGpu), 0, 1.f);
  EXPECT_TRUE(close_rel(host32(gd), d, 1e-2)) << "f32 logits -> bf16 dlogits";
}
