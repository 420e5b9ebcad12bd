// Shared body of the cp2hp / hp2cp tests (tests/ops/test_cp_a2a.cpp on the CPU with MPI,
// tests/ops/test_cp_a2a_cuda.cpp on GPUs with NCCL). For every layout exercised at this world
// size (tp x cp x dp), every pack (unequal lengths: 1, 2*cp, odd multiples of 2*cp, several
// long ones, zero-length placeholders, a trailing alignment segment, the worked example of
// section 4.5 and a random pack) and element sizes 2, 4 and 8 bytes, each CP rank checks
// bitwise:
//   * cp2hp output == the natural-order head-sliced reference built from the full data;
//   * hp2cp output == the zig-zag slice of the full data;
//   * fused == per_sequence (forward and backward), also on row-strided views;
//   * cp2hp_bwd(cp2hp(x)) == x, hp2cp_bwd(hp2cp(o)) == o, hp2cp(cp2hp(x)) == x[:, perm];
//   * adjoints: <dY, cp2hp(X)> == <cp2hp_bwd(dY), X> and <dZ, hp2cp(O)> == <hp2cp_bwd(dZ), O>
//     summed over the CP group, exact in double for small integers.
// Data differ per TP and DP rank, so a mix-up between CP groups cannot pass. No ASSERT after
// the groups exist: a rank leaving early would leave the others waiting in a collective.
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "deltatron/core/numeric.h"
#include "deltatron/data/packed_seq.h"
#include "deltatron/dist/comm.h"
#include "deltatron/dist/parallel.h"
#include "deltatron/ops/basic.h"
#include "deltatron/ops/cp_a2a.h"
#include "dist/dist_test_util.h"
#include "test_util.h"

namespace dt::testing::cpa2a {

// Layouts per world size; each includes a cp > 1 case where possible, and a tp = 2 one.
inline std::vector<dist::ParallelDims> a2a_layouts(int world) {
  switch (world) {
    case 1: return {{1, 1, 1}};
    case 2: return {{1, 2, 1}, {2, 1, 1}};
    case 4: return {{1, 4, 1}, {2, 2, 1}, {1, 2, 2}};
    case 8: return {{1, 4, 2}, {2, 4, 1}, {2, 2, 2}};
    default: return {{1, world, 1}};
  }
}

// A packer in miniature: pads each actual length to a multiple of 2*cp (1 when cp = 1), then
// appends an explicit alignment segment (actual length 0) so that T % (cp*lcm(2, sp)) == 0
// (of sp when cp = 1), rule C4. `force_trailing` appends a 2*cp segment even when aligned.
inline data::PackedBatchDesc make_pack(const std::vector<int64_t>& actual, int cp, int sp, int cp_rank,
                                       bool force_trailing = false) {
  data::PackedBatchDesc d;
  d.sp = sp;
  d.cp = cp;
  d.cp_rank = cp_rank;
  const int64_t D = cp > 1 ? 2 * cp : 1;
  const int64_t M = cp > 1 ? int64_t(cp) * std::lcm(2, sp) : sp;
  d.cu_seqlens = {0};
  d.cu_seqlens_padded = {0};
  for (int64_t a : actual) {
    d.cu_seqlens.push_back(d.cu_seqlens.back() + a);
    d.cu_seqlens_padded.push_back(d.cu_seqlens_padded.back() + (a + D - 1) / D * D);
  }
  int64_t T = d.cu_seqlens_padded.back();
  int64_t extra = (M - T % M) % M;
  if (force_trailing && extra == 0) extra = M;
  if (extra) {
    d.cu_seqlens.push_back(d.cu_seqlens.back());
    d.cu_seqlens_padded.push_back(T + extra);
    T += extra;
  }
  d.tokens_local = T / (int64_t(cp) * sp);
  return d;
}

struct NamedPack {
  std::string name;
  std::vector<int64_t> actual;
  bool force_trailing = false;
};

inline std::vector<NamedPack> packs_for(int cp, uint64_t seed) {
  const int64_t D = 2 * cp;
  std::vector<NamedPack> p = {
      {"mixed", {1, D, 3 * D, 5 * D + 1, 0, 7, 2 * D - 1}, true},
      {"long", {130, 257, 515, 64, 63, 65}},
      {"single_token", {1}},
  };
  if (cp == 2) p.push_back({"worked_example", {7, 3}});
  std::mt19937_64 rng(seed ^ (0x9e3779b97f4a7c15ull * uint64_t(cp)));
  std::vector<int64_t> r(1 + rng() % 7);
  for (int64_t& a : r) a = int64_t(rng() % 97);
  p.push_back({"random", r});
  return p;
}

// Sections [q | k | v | z | b | a] of the TP-local projection, each a multiple of cp. Set 0
// moves single columns (runs g = 1), set 1 runs of g = 4 columns (as real head sizes do).
inline std::vector<int64_t> sections_for(int cp, int set) {
  if (set == 0) return {2 * cp, 2 * cp, 4 * cp, 4 * cp, cp, cp};
  return {8 * cp, 8 * cp, 16 * cp, 16 * cp, 4 * cp, 4 * cp};
}

// Bytes of element e of a tag: unique per (tag, x, c) for 4- and 8-byte elements; a hash
// for 2-byte ones. Never interpreted as numbers (the ops move bytes).
inline uint64_t pattern(uint64_t tag, int64_t x, int64_t c, int64_t C) {
  uint64_t v = (tag << 40) ^ (uint64_t(x) * uint64_t(C) + uint64_t(c) + 1);
  return v;
}
inline void store_bits(const TensorView& h, int64_t i, uint64_t v) {
  switch (dtype_size(h.dtype)) {
    case 2: h.ptr<uint16_t>()[i] = uint16_t((v * 0x9E3779B97F4A7C15ull) >> 48); return;
    case 4: h.ptr<uint32_t>()[i] = uint32_t(v & 0xffffffffu) ^ uint32_t(v >> 40) << 24; return;
    default: h.ptr<uint64_t>()[i] = v; return;
  }
}

// Host [T, C] filled with pattern(tag, x, c).
inline Tensor global_data(int64_t T, int64_t C, DType t, uint64_t tag) {
  Tensor g = Tensor::empty(Shape{T, C}, t);
  for (int64_t x = 0; x < T; ++x)
    for (int64_t c = 0; c < C; ++c) store_bits(g, x * C + c, pattern(tag, x, c, C));
  return g;
}

// Host [rows, cols] of small integers in [-8, 8] (f32), different per tag.
inline Tensor small_ints(int64_t rows, int64_t cols, uint64_t tag) {
  Tensor h = Tensor::empty(Shape{rows, cols}, DType::f32);
  std::mt19937_64 rng(tag * 0x2545F4914F6CDD1Dull + 17);
  for (int64_t i = 0; i < h.numel(); ++i) h.ptr<float>()[i] = float(int64_t(rng() % 17) - 8);
  return h;
}

inline Tensor on(const TensorView& host, const Where& w) {
  return w.device.is_cpu() ? ops::to_host(host) : ops::to_device(host, w.device, w.stream);
}

// Number of rows of `got` whose bytes differ from `want` (host copies), first few described.
inline ::testing::AssertionResult same_bytes(const TensorView& got_any, const TensorView& want_host, const Where& w) {
  Tensor got = ops::to_host(got_any, w.stream);
  if (got.shape() != want_host.shape)
    return ::testing::AssertionFailure() << "shape " << got.shape().str() << " vs " << want_host.shape.str();
  const int64_t rows = want_host.shape[0];
  const size_t rb = rows ? want_host.nbytes() / size_t(rows) : 0;
  int64_t wrong = 0;
  std::string first;
  for (int64_t r = 0; r < rows; ++r) {
    if (std::memcmp(static_cast<const char*>(got.data()) + size_t(r) * rb,
                    static_cast<const char*>(want_host.data) + size_t(r) * rb, rb) == 0)
      continue;
    if (wrong++ < 5) first += " " + std::to_string(r);
  }
  if (wrong == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << wrong << " of " << rows << " rows differ; first rows:" << first;
}

// A row-strided [rows, cols] view inside a wider scratch tensor, filled from `src` (any device).
struct Strided {
  Tensor storage;
  TensorView view;
};
inline Strided strided_like(const TensorView& src, int64_t pad, const Where& w) {
  const int64_t rows = src.shape[0], cols = src.shape[1];
  Strided s;
  s.storage = Tensor::empty(Shape{rows, cols + pad}, src.dtype, w.device);
  s.view = s.storage.view().slice(1, pad / 2, pad / 2 + cols);
  ops::copy(s.view, src, w.stream);
  return s;
}

inline double dot(const TensorView& a_any, const TensorView& b_any, const Where& w) {
  Tensor a = ops::to_host(a_any, w.stream), b = ops::to_host(b_any, w.stream);
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += double(a.ptr<float>()[i]) * double(b.ptr<float>()[i]);
  return s;
}

// Sum over the CP group of two host doubles that are exact integers.
inline std::pair<double, double> group_sum(dist::Communicator& cp, double a, double b, const Where& w) {
  Tensor h = Tensor::empty(Shape{2}, DType::i64);
  h.ptr<int64_t>()[0] = int64_t(a);
  h.ptr<int64_t>()[1] = int64_t(b);
  Tensor d = on(h, w);
  cp.all_reduce(d, dist::ReduceOp::sum, w.stream);
  Tensor r = ops::to_host(d, w.stream);
  return {double(r.ptr<int64_t>()[0]), double(r.ptr<int64_t>()[1])};
}

constexpr ops::CpA2aImpl kImpls[] = {ops::CpA2aImpl::fused, ops::CpA2aImpl::per_sequence};
constexpr DType kDtypes[] = {DType::bf16, DType::f32, DType::i64};

// The whole suite on one backend. Every rank of the world must call it.
inline void run_suite(dist::Backend backend, const Where& w) {
  const uint64_t seed = test_seed();  // collective on first use: same value on every rank
  for (const dist::ParallelDims& dims : a2a_layouts(dist::world_size())) {
    dist::ProcessGroups pg = dist::ProcessGroups::build(dims, backend);
    dist::Communicator& cpc = *pg.cp;
    const int cp = dims.cp, r = pg.coord.cp, sp = dims.tp;  // sequence parallelism on: sp = tp
    ASSERT_EQ(cpc.size(), cp);
    ASSERT_EQ(cpc.rank(), r);
    const ops::CpHeadLayout layouts[2] = {ops::CpHeadLayout(sections_for(cp, 0), cp, w.device, w.stream),
                                          ops::CpHeadLayout(sections_for(cp, 1), cp, w.device, w.stream)};
    // Data differ per (tp, dp): the tag of this rank's CP group.
    const uint64_t group_tag = 1 + uint64_t(pg.coord.tp) + 8 * uint64_t(pg.coord.dp);

    int pack_no = 0;
    for (const NamedPack& np : packs_for(cp, seed)) {
      const ops::CpHeadLayout& heads = layouts[pack_no++ % 2];
      const std::vector<int64_t>& sections = heads.sections();
      const int64_t C = heads.width(), B = C / cp, Cv = 6 * cp, Bv = Cv / cp;
      const data::PackedBatchDesc desc = make_pack(np.actual, cp, sp, r, np.force_trailing);
      const data::PackedSeqParams psp = data::PackedSeqParams::build(desc, w.device, w.stream);
      const ops::CpTokenMap map = psp.cp_map();
      const std::span<const int32_t> cu = psp.cu_seqlens_padded();
      const int64_t T = psp.tokens(), R = psp.tokens_cp();
      const std::string where = layout_name(dims) + " pack " + np.name + " cp_rank " + std::to_string(r);
      SCOPED_TRACE(where + " T=" + std::to_string(T) + " C=" + std::to_string(C));

      for (DType t : kDtypes) {
        SCOPED_TRACE(std::string("dtype ") + dtype_name(t));
        // cp2hp: x = this rank's zig-zag rows of the global [T, C]; reference = natural order,
        // columns [x_r for every section x].
        Tensor G = global_data(T, C, t, group_tag);
        Tensor x_host = data::zigzag_slice_rows(G, cu, cp, r);
        Tensor y_ref = Tensor::empty(Shape{T, B}, t);
        {
          const size_t es = dtype_size(t);
          int64_t m = 0, O = 0;
          for (int64_t S : sections) {
            for (int64_t j = 0; j < S / cp; ++j, ++m)
              for (int64_t xx = 0; xx < T; ++xx)
                std::memcpy(static_cast<char*>(y_ref.data()) + size_t(xx * B + m) * es,
                            static_cast<const char*>(G.data()) + size_t(xx * C + O + r * (S / cp) + j) * es, es);
            O += S;
          }
        }
        // hp2cp: o = columns [r*Bv, (r+1)*Bv) of the global natural [T, Cv]; reference =
        // the zig-zag rows of all of it.
        Tensor V = global_data(T, Cv, t, group_tag + 1000);
        Tensor o_host = Tensor::empty(Shape{T, Bv}, t);
        ops::copy(o_host, V.view().slice(1, r * Bv, (r + 1) * Bv));
        Tensor out_ref = data::zigzag_slice_rows(V, cu, cp, r);
        // x[:, perm] (what hp2cp(cp2hp(x)) gives with the 6 sections).
        Tensor x_perm = Tensor::empty(Shape{R, C}, t);
        {
          const size_t es = dtype_size(t);
          for (int64_t l = 0; l < R; ++l)
            for (int64_t c = 0; c < C; ++c)
              std::memcpy(static_cast<char*>(x_perm.data()) + size_t(l * C + c) * es,
                          static_cast<const char*>(x_host.data()) + size_t(l * C + heads.perm_host()[c]) * es, es);
        }

        Tensor x = on(x_host, w), o = on(o_host, w);
        for (ops::CpA2aImpl impl : kImpls) {
          SCOPED_TRACE(std::string("impl ") + ops::cp_a2a_impl_name(impl));
          Tensor y = Tensor::empty(Shape{T, B}, t, w.device);
          ops::cp2hp_fwd(y, x, heads, map, cpc, impl, w.stream);
          EXPECT_TRUE(same_bytes(y, y_ref, w)) << "cp2hp output vs the head-sliced natural-order reference";

          Tensor xb = Tensor::empty(Shape{R, C}, t, w.device);
          ops::cp2hp_bwd(xb, y, heads, map, cpc, impl, w.stream);
          EXPECT_TRUE(same_bytes(xb, x_host, w)) << "cp2hp_bwd(cp2hp(x)) != x";

          // With one section per rank slice the op pair is hp2cp; with the six sections it
          // returns the permuted columns.
          Tensor back = Tensor::empty(Shape{R, C}, t, w.device);
          ops::hp2cp_fwd(back, y, map, cpc, impl, w.stream);
          EXPECT_TRUE(same_bytes(back, x_perm, w)) << "hp2cp(cp2hp(x)) != x[:, perm]";

          Tensor out = Tensor::empty(Shape{R, Cv}, t, w.device);
          ops::hp2cp_fwd(out, o, map, cpc, impl, w.stream);
          EXPECT_TRUE(same_bytes(out, out_ref, w)) << "hp2cp output vs the zig-zag slice of the full data";

          Tensor ob = Tensor::empty(Shape{T, Bv}, t, w.device);
          ops::hp2cp_bwd(ob, out, map, cpc, impl, w.stream);
          EXPECT_TRUE(same_bytes(ob, o_host, w)) << "hp2cp_bwd(hp2cp(o)) != o";
        }

        // Row-strided operands: fused and per_sequence into strided outputs, bitwise.
        if (t == DType::bf16) {
          Strided xs = strided_like(x, 3, w);
          for (ops::CpA2aImpl impl : kImpls) {
            SCOPED_TRACE(std::string("strided, impl ") + ops::cp_a2a_impl_name(impl));
            Strided ys = strided_like(on(y_ref, w), 4, w);
            ops::fill(ys.view, 0.0, w.stream);
            ops::cp2hp_fwd(ys.view, xs.view, heads, map, cpc, impl, w.stream);
            EXPECT_TRUE(same_bytes(ys.view, y_ref, w));
            Strided xb = strided_like(x, 5, w);
            ops::fill(xb.view, 0.0, w.stream);
            ops::cp2hp_bwd(xb.view, ys.view, heads, map, cpc, impl, w.stream);
            EXPECT_TRUE(same_bytes(xb.view, x_host, w));
          }
        }
      }

      // Adjoints in double (small integers: every product and sum exact), and fused ==
      // per_sequence on the backward with data that are not a round trip.
      {
        const uint64_t tag = seed + 7919 * uint64_t(dist::world_rank() + 1);
        Tensor X = on(small_ints(R, C, tag), w), dY = on(small_ints(T, B, tag + 1), w);
        Tensor O = on(small_ints(T, Bv, tag + 2), w), dZ = on(small_ints(R, Cv, tag + 3), w);
        Tensor ref_dx, ref_do;
        for (ops::CpA2aImpl impl : kImpls) {
          SCOPED_TRACE(std::string("adjoint, impl ") + ops::cp_a2a_impl_name(impl));
          Tensor Y = Tensor::empty(Shape{T, B}, DType::f32, w.device);
          Tensor dX = Tensor::empty(Shape{R, C}, DType::f32, w.device);
          ops::cp2hp_fwd(Y, X, heads, map, cpc, impl, w.stream);
          ops::cp2hp_bwd(dX, dY, heads, map, cpc, impl, w.stream);
          auto [lhs, rhs] = group_sum(cpc, dot(dY, Y, w), dot(dX, X, w), w);
          EXPECT_EQ(lhs, rhs) << "<dY, cp2hp(X)> != <cp2hp_bwd(dY), X>";

          Tensor Z = Tensor::empty(Shape{R, Cv}, DType::f32, w.device);
          Tensor dO = Tensor::empty(Shape{T, Bv}, DType::f32, w.device);
          ops::hp2cp_fwd(Z, O, map, cpc, impl, w.stream);
          ops::hp2cp_bwd(dO, dZ, map, cpc, impl, w.stream);
          auto [lhs2, rhs2] = group_sum(cpc, dot(dZ, Z, w), dot(dO, O, w), w);
          EXPECT_EQ(lhs2, rhs2) << "<dZ, hp2cp(O)> != <hp2cp_bwd(dZ), O>";

          if (impl == ops::CpA2aImpl::fused) {
            ref_dx = ops::to_host(dX, w.stream);
            ref_do = ops::to_host(dO, w.stream);
          } else {
            EXPECT_TRUE(same_bytes(dX, ref_dx, w)) << "cp2hp_bwd: per_sequence != fused";
            EXPECT_TRUE(same_bytes(dO, ref_do, w)) << "hp2cp_bwd: per_sequence != fused";
          }
        }
      }
    }
  }
}

}  // namespace dt::testing::cpa2a
