// Packed THD metadata (include/deltatron/data/packed_seq.h), host only:
//   * every validation rule V1-V8 and C1-C3 fires with its exact message; valid edge cases
//     pass (cp = 1 with odd lengths, zero-length placeholders, a trailing alignment segment);
//   * the worked example of thd-context-parallel.md 4.5 is reproduced exactly;
//   * the zig-zag maps are inverse bijections, agree with zigzag_slice_rows / gather_rows;
//   * cp_idx / cp_inv equal a per-sequence reference loop (the receive-buffer order) bitwise;
//   * masks, positions and the SP split are consistent with the global layout.
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "data/cp_a2a_checks.h"
#include "deltatron/data/packed_seq.h"
#include "test_util.h"

namespace dt::data {
namespace {

using dt::testing::cpa2a::make_pack;

PackedBatchDesc desc(std::vector<int64_t> cu, std::vector<int64_t> cu_pad, int64_t t_local, int sp = 1, int cp = 1,
                     int cp_rank = 0) {
  PackedBatchDesc d;
  d.cu_seqlens = std::move(cu);
  d.cu_seqlens_padded = std::move(cu_pad);
  d.tokens_local = t_local;
  d.sp = sp;
  d.cp = cp;
  d.cp_rank = cp_rank;
  return d;
}

// ---- validation ---------------------------------------------------------------------------

TEST(PackedValidation, EachRuleFiresWithItsMessage) {
  PackedBatchDesc ok = desc({0, 7, 10}, {0, 8, 12}, 6, 1, 2);  // the worked example
  EXPECT_EQ(validate_packed_batch(ok), "");

  PackedBatchDesc d = ok;
  d.batch = 2;
  EXPECT_EQ(validate_packed_batch(d), "packed batch: batch dimension must be 1, got batch=2");  // V1

  d = ok;
  d.cu_seqlens = {0, 7};
  EXPECT_EQ(validate_packed_batch(d),
            "packed batch: cu_seqlens has 2 entries and cu_seqlens_padded has 3; both must be N+1 with N >= 1");  // V2
  d = desc({0}, {0}, 0);
  EXPECT_EQ(validate_packed_batch(d),
            "packed batch: cu_seqlens has 1 entries and cu_seqlens_padded has 1; both must be N+1 with N >= 1");
  d = desc({}, {}, 0);  // empty arrays: the same rule
  EXPECT_EQ(validate_packed_batch(d),
            "packed batch: cu_seqlens has 0 entries and cu_seqlens_padded has 0; both must be N+1 with N >= 1");

  d = ok;
  d.cu_seqlens = {1, 7, 10};
  EXPECT_EQ(validate_packed_batch(d), "packed batch: cu_seqlens[0]=1, must be 0");  // V3
  d = ok;
  d.cu_seqlens_padded = {4, 8, 12};
  EXPECT_EQ(validate_packed_batch(d), "packed batch: cu_seqlens_padded[0]=4, must be 0");

  d = desc({0, 7, 5, 10}, {0, 8, 8, 12}, 6, 1, 2);  // V4
  EXPECT_EQ(validate_packed_batch(d), "packed batch: cu_seqlens decreases at i=1: cu_seqlens[1]=7, cu_seqlens[2]=5");
  d = desc({0, 3, 3, 6}, {0, 8, 4, 12}, 6, 1, 2);
  EXPECT_EQ(validate_packed_batch(d),
            "packed batch: cu_seqlens_padded decreases at i=1: cu_seqlens_padded[1]=8, cu_seqlens_padded[2]=4");
  d = desc({0, -3, 6}, {0, 4, 12}, 6, 1, 2);  // a negative entry fails as a decrease
  EXPECT_EQ(validate_packed_batch(d), "packed batch: cu_seqlens decreases at i=0: cu_seqlens[0]=0, cu_seqlens[1]=-3");

  d = desc({0, 7, 13}, {0, 8, 12}, 6, 1, 2);  // V5
  EXPECT_EQ(validate_packed_batch(d),
            "packed batch: sequence 1 has actual length 6 > padded length 4 (cu_seqlens[1..2]=7..13, "
            "cu_seqlens_padded[1..2]=8..12)");

  d = ok;
  d.tokens_local = 5;  // V6
  EXPECT_EQ(validate_packed_batch(d),
            "packed batch: cu_seqlens_padded[2]=12 but local tokens 5 × sp 1 × cp 2 = 10; whole-pack padding must be "
            "an explicit last segment");
  d = desc({0, 7, 10}, {0, 8, 12}, 3, 2, 2);  // sp counts too: 3 x 2 x 2 = 12 is valid
  EXPECT_EQ(validate_packed_batch(d), "");
  d.tokens_local = 2;
  EXPECT_EQ(validate_packed_batch(d),
            "packed batch: cu_seqlens_padded[2]=12 but local tokens 2 × sp 2 × cp 2 = 8; whole-pack padding must be "
            "an explicit last segment");

  d = desc({0, 7, 10}, {0, 8, 14}, 7, 1, 2);  // V7: p_1 = 6 is a multiple of cp but not of 2*cp
  EXPECT_EQ(validate_packed_batch(d),
            "packed batch: padded length of sequence 1 is 6, not a multiple of 2*cp=4 (next valid length 8); set "
            "data.pad_multiple to 4");
  d = desc({0, 130, 131}, {0, 130, 132}, 33, 1, 4);  // the style guide's example shape
  EXPECT_EQ(validate_packed_batch(d),
            "packed batch: padded length of sequence 0 is 130, not a multiple of 2*cp=8 (next valid length 136); set "
            "data.pad_multiple to 8");

  const int64_t big = int64_t(1) << 31;  // V8
  d = desc({0, 5, 5}, {0, 8, big}, big / 2, 1, 2);
  EXPECT_EQ(validate_packed_batch(d), "packed batch: 2147483648 tokens exceed the int32 range of cu_seqlens_padded");
  d = desc({0, 5}, {0, big - 1}, big - 1);  // 2^31 - 1 itself is fine
  EXPECT_EQ(validate_packed_batch(d), "");
}

TEST(PackedValidation, CallerArguments) {
  PackedBatchDesc d = desc({0, 7, 10}, {0, 8, 12}, 6, 1, 2);
  d.cp_rank = 2;
  EXPECT_EQ(validate_packed_batch(d), "packed batch: cp_rank=2 is outside [0, cp=2)");
  d.cp_rank = 0;
  d.sp = 0;
  EXPECT_EQ(validate_packed_batch(d), "packed batch: sp=0 and cp=2 must both be >= 1");
  d.sp = 1;
  d.tokens_local = -6;
  EXPECT_EQ(validate_packed_batch(d), "packed batch: local tokens -6 must be >= 0");
  // V6 with a product past int64 (it wrapped to the last boundary and passed)
  PackedBatchDesc o = desc({0, 8}, {0, 8}, (int64_t(1) << 62) + 2, 1, 1);
  o.sp = 4;
  EXPECT_EQ(validate_packed_batch(o), "packed batch: local tokens 4611686018427387906 × sp 4 × cp 1 overflows int64");
}

TEST(PackedValidation, ValidEdgeCases) {
  // cp = 1: any lengths (odd, 1), no 2*cp rule.
  EXPECT_EQ(validate_packed_batch(desc({0, 1, 4, 8}, {0, 1, 5, 9}, 9)), "");
  // cp = 1 with SP: T divisible by sp only.
  EXPECT_EQ(validate_packed_batch(desc({0, 3, 5}, {0, 3, 6}, 3, 2)), "");
  // Zero-length placeholders anywhere (first, middle, last), with cp = 2.
  EXPECT_EQ(validate_packed_batch(desc({0, 0, 3, 3, 7, 7}, {0, 0, 4, 4, 8, 8}, 4, 1, 2)), "");
  // A trailing alignment segment of actual length 0.
  EXPECT_EQ(validate_packed_batch(desc({0, 5, 5}, {0, 8, 16}, 4, 2, 2)), "");
  // Nothing padded: the two arrays are equal (both still required).
  EXPECT_EQ(validate_packed_batch(desc({0, 4, 12}, {0, 4, 12}, 6, 1, 2)), "");
  // An empty micro-batch (only placeholders) is consistent: T = 0.
  EXPECT_EQ(validate_packed_batch(desc({0, 0}, {0, 0}, 0, 1, 4)), "");
  // make_pack (the C4 packer rule) always produces valid batches.
  for (int cp : {1, 2, 3, 4, 8})
    for (int sp : {1, 2, 4})
      for (int r = 0; r < cp; ++r)
        EXPECT_EQ(validate_packed_batch(make_pack({1, 2, 3, 17, 0, 64, 65}, cp, sp, r)), "")
            << "cp " << cp << " sp " << sp;
}

TEST(GdnCpConfig, EachRuleFiresWithItsMessage) {
  for (int tc : {1, 2, 4, 8, 16})  // Qwen3.5 / Qwen3-Next: Hk = 16, Hv = 32
    for (int tp = 1; tp <= tc; tp *= 2) EXPECT_EQ(validate_gdn_cp_config(16, 32, tp, tc / tp, 2 * (tc / tp)), "");
  EXPECT_EQ(validate_gdn_cp_config(16, 40, 1, 1, 1),
            "config: model.linear_num_value_heads=40 is not a multiple of model.linear_num_key_heads=16");  // C1
  EXPECT_EQ(validate_gdn_cp_config(16, 32, 3, 2, 4),
            "config: GDN head-parallel CP needs tp*cp=6 to divide linear_num_key_heads=16 and "
            "linear_num_value_heads=32");  // C2
  EXPECT_EQ(validate_gdn_cp_config(16, 32, 1, 32, 64),
            "config: GDN head-parallel CP needs tp*cp=32 to divide linear_num_key_heads=16 and "
            "linear_num_value_heads=32");
  EXPECT_EQ(validate_gdn_cp_config(16, 32, 1, 4, 4),
            "config: data.pad_multiple=4 must be a multiple of 2*parallel.cp=8");  // C3
  EXPECT_EQ(validate_gdn_cp_config(16, 32, 2, 2, 8), "");
  EXPECT_EQ(validate_gdn_cp_config(16, 32, 2, 1, 3), "");  // cp = 1: any pad multiple
  EXPECT_EQ(validate_gdn_cp_config(0, 32, 1, 1, 1),
            "config: model.linear_num_key_heads=0 and model.linear_num_value_heads=32 must be >= 1");
  EXPECT_EQ(validate_gdn_cp_config(16, 32, 1, 2, 0), "config: data.pad_multiple=0 must be >= 1");
  EXPECT_EQ(validate_gdn_cp_config(16, 32, 0, 2, 4), "config: parallel.tp=0 and parallel.cp=2 must be >= 1");
}

// ---- the worked example (section 4.5) -----------------------------------------------------

TEST(PackedSeqParams, WorkedExample) {
  const std::vector<int32_t> want_idx = {0, 1, 6, 7, 8, 9, 2, 3, 4, 10, 11, 5};
  const std::vector<int32_t> want_inv = {0, 1, 6, 7, 8, 11, 2, 3, 4, 5, 9, 10};
  const std::vector<std::vector<int32_t>> want_mask = {{1, 1, 1, 0, 1, 0}, {1, 1, 1, 1, 1, 1}};
  const std::vector<std::vector<int32_t>> want_pos = {{0, 1, 6, 7, 0, 3}, {2, 3, 4, 5, 1, 2}};
  const std::vector<std::vector<int64_t>> want_global = {{0, 1, 6, 7, 8, 11}, {2, 3, 4, 5, 9, 10}};
  int64_t real = 0;
  for (int r = 0; r < 2; ++r) {
    const PackedSeqParams p = PackedSeqParams::build(desc({0, 7, 10}, {0, 8, 12}, 6, 1, 2, r));
    EXPECT_EQ(p.tokens(), 12);
    EXPECT_EQ(p.tokens_cp(), 6);
    EXPECT_EQ(p.tokens_local(), 6);
    EXPECT_EQ(p.max_seqlen(), 8);
    EXPECT_EQ(p.real_tokens(), 10);
    EXPECT_EQ(p.cp_idx(), want_idx);
    EXPECT_EQ(p.cp_inv(), want_inv);
    EXPECT_EQ(p.loss_mask_local(), want_mask[r]) << "rank " << r;
    EXPECT_EQ(p.position_ids_local(), want_pos[r]) << "rank " << r;
    for (int64_t l = 0; l < 6; ++l)
      EXPECT_EQ(zigzag_local_to_global(p.cu_seqlens_padded(), 2, r, l), want_global[r][l]) << "rank " << r;
    real += p.real_tokens_cp();
    // Kernels see the global padded boundaries; the device views are the host arrays on CPU.
    EXPECT_EQ(p.varlen_meta().num_seqs, 2);
    EXPECT_EQ(p.varlen_meta().total, 12);
    EXPECT_EQ(std::vector<int32_t>(p.varlen_meta().cu_host, p.varlen_meta().cu_host + 3),
              (std::vector<int32_t>{0, 8, 12}));
    EXPECT_EQ(p.cp_idx_dev().ptr<int32_t>(), p.cp_idx().data());
    EXPECT_EQ(p.cu_seqlens_dev().numel(), 3);
    EXPECT_EQ(p.cu_seqlens_padded_dev().ptr<int32_t>()[1], 8);
    const ops::CpTokenMap m = p.cp_map();
    EXPECT_EQ(m.cp, 2);
    EXPECT_EQ(m.tokens, 12);
    EXPECT_EQ(m.cu_padded.size(), 3u);
    EXPECT_EQ(m.cp_inv.numel(), 12);
  }
  EXPECT_EQ(real, 10);  // = cu_seqlens[N]
  // The spot checks of the text.
  const std::vector<int32_t> cu = {0, 8, 12};
  for (auto [x, r, l] : {std::tuple{5, 1, 3}, {11, 0, 5}, {9, 1, 4}}) {
    const ZigzagSlot z = zigzag_global_to_local(cu, 2, x);
    EXPECT_EQ(z.rank, r) << "x=" << x;
    EXPECT_EQ(z.row, l) << "x=" << x;
  }
}

// ---- zig-zag maps -------------------------------------------------------------------------

// Random valid pack for cp (with placeholders and a trailing alignment segment).
PackedBatchDesc random_pack(std::mt19937_64& rng, int cp, int sp, int r) {
  std::vector<int64_t> a(1 + rng() % 9);
  for (int64_t& v : a) v = int64_t(rng() % 5 == 0 ? 0 : rng() % 150);
  return make_pack(a, cp, sp, r, rng() % 2 == 0);
}

TEST(Zigzag, MapsAreInverseBijections) {
  std::mt19937_64 rng(dt::testing::test_seed());
  for (int cp : {1, 2, 3, 4, 8}) {
    for (int trial = 0; trial < 20; ++trial) {
      const PackedBatchDesc d = random_pack(rng, cp, 1, 0);
      std::vector<int32_t> cu(d.cu_seqlens_padded.begin(), d.cu_seqlens_padded.end());
      const int64_t T = cu.back();
      std::vector<int> hit(size_t(T), 0);
      for (int r = 0; r < cp; ++r)
        for (int64_t l = 0; l < T / cp; ++l) {
          const int64_t x = zigzag_local_to_global(cu, cp, r, l);
          ASSERT_GE(x, 0);
          ASSERT_LT(x, T);
          ++hit[size_t(x)];
          const ZigzagSlot z = zigzag_global_to_local(cu, cp, x);
          ASSERT_EQ(z.rank, r) << "cp " << cp << " x " << x;
          ASSERT_EQ(z.row, l) << "cp " << cp << " x " << x;
        }
      for (int64_t x = 0; x < T; ++x) ASSERT_EQ(hit[size_t(x)], 1) << "position " << x << " cp " << cp;
      // Each sequence keeps its local rows [c_i/cp, c_{i+1}/cp) on every rank (section 3.1).
      for (size_t i = 0; i + 1 < cu.size(); ++i)
        for (int64_t x = cu[i]; x < cu[i + 1]; ++x) {
          const int64_t row = zigzag_global_to_local(cu, cp, x).row;
          ASSERT_GE(row, cu[i] / cp);
          ASSERT_LT(row, cu[i + 1] / cp);
        }
    }
  }
}

TEST(Zigzag, TwoPiecesPerRankForOneSequence) {
  // cp = 2, one sequence c0 c1 c2 c3 (section 3.2): rank 0 holds [c0, c3], rank 1 [c1, c2].
  Tensor g = Tensor::empty(Shape{8, 3}, DType::i32);
  for (int i = 0; i < 24; ++i) g.ptr<int32_t>()[i] = i;
  const std::vector<int32_t> cu = {0, 8};
  Tensor r0 = zigzag_slice_rows(g, cu, 2, 0), r1 = zigzag_slice_rows(g, cu, 2, 1);
  const std::vector<int32_t> rows0 = {0, 1, 6, 7}, rows1 = {2, 3, 4, 5};
  for (int l = 0; l < 4; ++l)
    for (int c = 0; c < 3; ++c) {
      EXPECT_EQ(r0.ptr<int32_t>()[l * 3 + c], rows0[l] * 3 + c);
      EXPECT_EQ(r1.ptr<int32_t>()[l * 3 + c], rows1[l] * 3 + c);
    }
}

TEST(Zigzag, SliceAndGatherRowsAreInverse) {
  std::mt19937_64 rng(dt::testing::test_seed() + 1);
  for (int cp : {1, 2, 4}) {
    const PackedBatchDesc d = random_pack(rng, cp, 1, 0);
    std::vector<int32_t> cu(d.cu_seqlens_padded.begin(), d.cu_seqlens_padded.end());
    const int64_t T = cu.back();
    Tensor g = Tensor::empty(Shape{T, 2, 3}, DType::f32);  // trailing dims travel with the row
    for (int64_t i = 0; i < g.numel(); ++i) g.ptr<float>()[i] = float(i);
    std::vector<Tensor> locals;
    std::vector<TensorView> views;
    for (int r = 0; r < cp; ++r) {
      locals.push_back(zigzag_slice_rows(g, cu, cp, r));
      views.push_back(locals.back());
      ASSERT_EQ(locals.back().shape(), (Shape{T / cp, 2, 3}));
      for (int64_t l = 0; l < T / cp; ++l)  // row l of rank r is global row local_to_global
        ASSERT_EQ(locals.back().ptr<float>()[l * 6], float(zigzag_local_to_global(cu, cp, r, l) * 6));
    }
    Tensor back = zigzag_gather_rows(views, cu, cp);
    ASSERT_EQ(back.shape(), g.shape());
    EXPECT_EQ(std::memcmp(back.data(), g.data(), g.nbytes()), 0) << "cp " << cp;
  }
}

// ---- cp_idx / cp_inv ----------------------------------------------------------------------

// The reference: walk the rank-major receive buffer in order (source rank, then its local
// rows: sequence by sequence, piece r then piece 2cp-1-r), recording each global position.
std::vector<int32_t> reference_cp_inv(const std::vector<int32_t>& cu, int cp) {
  std::vector<int32_t> inv;
  for (int r = 0; r < cp; ++r)
    for (size_t i = 0; i + 1 < cu.size(); ++i) {
      const int64_t h = (cu[i + 1] - cu[i]) / (2 * cp);
      for (int64_t piece : {int64_t(r), 2 * int64_t(cp) - 1 - r})
        for (int64_t off = 0; off < h; ++off) inv.push_back(int32_t(cu[i] + piece * h + off));
    }
  return inv;
}

TEST(CpIndexMaps, EqualAPerSequenceReferenceLoopBitwise) {
  std::mt19937_64 rng(dt::testing::test_seed() + 2);
  for (int cp : {2, 3, 4, 8}) {
    for (int trial = 0; trial < 20; ++trial) {
      const int sp = 1 << (rng() % 3);
      PackedBatchDesc d = random_pack(rng, cp, sp, int(rng() % uint64_t(cp)));
      const PackedSeqParams p = PackedSeqParams::build(d);
      const std::vector<int32_t>& cu = p.cu_seqlens_padded();
      const std::vector<int32_t> inv = reference_cp_inv(cu, cp);
      ASSERT_EQ(p.cp_inv(), inv) << "cp " << cp;
      std::vector<int32_t> idx(inv.size());
      for (size_t q = 0; q < inv.size(); ++q) idx[size_t(inv[q])] = int32_t(q);
      ASSERT_EQ(p.cp_idx(), idx) << "cp " << cp;
      // Permutation property, and agreement with the zig-zag map.
      const int64_t T = p.tokens(), Tcp = T / cp;
      for (int64_t x = 0; x < T; ++x) {
        ASSERT_EQ(p.cp_inv()[size_t(p.cp_idx()[size_t(x)])], x);
        const ZigzagSlot z = zigzag_global_to_local(cu, cp, x);
        ASSERT_EQ(p.cp_idx()[size_t(x)], z.rank * Tcp + z.row);
      }
    }
  }
}

TEST(CpIndexMaps, AbsentAtCp1) {
  const PackedSeqParams p = PackedSeqParams::build(desc({0, 3, 10}, {0, 3, 11}, 11));
  EXPECT_TRUE(p.cp_idx().empty());
  EXPECT_TRUE(p.cp_inv().empty());
  EXPECT_EQ(p.cp_idx_dev().data, nullptr);
  EXPECT_EQ(p.cp_map().cp_idx.data, nullptr);
  EXPECT_EQ(p.position_ids_local(), (std::vector<int32_t>{0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(p.loss_mask_local(), (std::vector<int32_t>{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0}));
  EXPECT_EQ(p.max_seqlen(), 8);
}

// ---- masks, positions and the SP split ----------------------------------------------------

TEST(PackedSeqParams, MasksPositionsAndSpSplitFollowTheGlobalLayout) {
  std::mt19937_64 rng(dt::testing::test_seed() + 3);
  for (int cp : {1, 2, 4}) {
    for (int sp : {1, 2}) {
      const PackedBatchDesc base = random_pack(rng, cp, sp, 0);
      int64_t real = 0;
      for (int r = 0; r < cp; ++r) {
        PackedBatchDesc d = base;
        d.cp_rank = r;
        const PackedSeqParams p = PackedSeqParams::build(d);
        const std::vector<int32_t>& cu = p.cu_seqlens_padded();
        const std::vector<int32_t>& ca = p.cu_seqlens();
        ASSERT_EQ(int64_t(p.loss_mask_local().size()), p.tokens_cp());
        for (int64_t l = 0; l < p.tokens_cp(); ++l) {
          const int64_t x = zigzag_local_to_global(cu, cp, r, l);
          const size_t i = size_t(std::upper_bound(cu.begin(), cu.end(), int32_t(x)) - cu.begin()) - 1;
          ASSERT_EQ(p.position_ids_local()[size_t(l)], x - cu[i]);
          ASSERT_EQ(p.loss_mask_local()[size_t(l)], x - cu[i] < ca[i + 1] - ca[i] ? 1 : 0);
        }
        real += p.real_tokens_cp();
        // SP: contiguous shards of T_local rows covering [0, T/cp).
        int64_t next = 0;
        for (int t = 0; t < sp; ++t) {
          auto [b, e] = p.sp_rows(t);
          EXPECT_EQ(b, next);
          EXPECT_EQ(e - b, p.tokens_local());
          next = e;
        }
        EXPECT_EQ(next, p.tokens_cp());
      }
      EXPECT_EQ(real, base.cu_seqlens.back()) << "the real tokens of all ranks add up to cu_seqlens[N]";
    }
  }
}

TEST(PackedSeqParams, RevalidateAndChecksum) {
  const PackedSeqParams a = PackedSeqParams::build(desc({0, 7, 10}, {0, 8, 12}, 6, 1, 2, 0));
  const PackedSeqParams b = PackedSeqParams::build(desc({0, 7, 10}, {0, 8, 12}, 6, 1, 2, 1));
  const PackedSeqParams c = PackedSeqParams::build(desc({0, 6, 10}, {0, 8, 12}, 6, 1, 2, 0));
  const PackedSeqParams e = PackedSeqParams::build(desc({0, 7, 10}, {0, 8, 12}, 3, 2, 2, 0));
  EXPECT_EQ(a.revalidate(), "");
  EXPECT_EQ(e.revalidate(), "");
  EXPECT_EQ(a.checksum(), b.checksum()) << "the CP rank is not part of the shared metadata";
  EXPECT_NE(a.checksum(), c.checksum()) << "actual lengths differ";
  EXPECT_NE(a.checksum(), e.checksum()) << "sp differs";
  EXPECT_EQ(PackedSeqParams().revalidate(), "packed batch: PackedSeqParams was never built");
}

TEST(PackedSeqParamsDeathTest, BuildRejectsAnInvalidBatch) {
  EXPECT_DEATH(PackedSeqParams::build(desc({0, 7, 10}, {0, 8, 14}, 7, 1, 2)),
               "packed batch: padded length of sequence 1 is 6, not a multiple of 2\\*cp=4");
}

}  // namespace
}  // namespace dt::data
