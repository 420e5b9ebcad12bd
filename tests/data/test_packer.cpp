// Packer and loader (include/deltatron/data/packer.h) over a dataset whose token values encode
// (document, position), for several (sp, cp, max_tokens):
//   * every real token appears exactly once per epoch, in order within each document; labels
//     are the next token of the document; pads hold pad_id;
//   * no micro-batch exceeds max_tokens; padded lengths divide by pad_multiple (2*cp); the
//     total follows C4; every batch passes validate_packed_batch and PackedSeqParams::build;
//   * per-rank views: zig-zag rows gather back to the batch, SP rows tile the CP rows;
//   * deterministic for a seed, different for another; shuffle off keeps dataset order;
//   * resuming from a saved position yields identical batches; dp shards are disjoint, cover
//     the epoch and have equal step counts; under mpirun (test_packer_np3) the same across
//     processes, one DP rank per process.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <random>

#include "deltatron/data/packer.h"
#include "deltatron/dist/comm.h"
#include "test_util.h"

namespace dt::data {
namespace {

constexpr int64_t kStride = 100000;  // token = 1 + doc * kStride + position

struct TestData {
  std::vector<int64_t> lengths;
  IndexedDataset ds;
};

// Random lengths in [0, 3*max_len], with empty, length-1 and long documents.
TestData make_data(const std::string& name, int64_t num_docs, int64_t max_len, uint64_t seed) {
  const std::string dir = ::testing::TempDir() + "dt_pack_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::string prefix = dir + "/" + name;
  std::mt19937_64 g(seed);
  TestData t;
  IndexedDatasetWriter w;
  EXPECT_EQ(w.open(prefix, TokenDType::i32), "");
  for (int64_t d = 0; d < num_docs; ++d) {
    int64_t L = int64_t(g() % uint64_t(max_len)) + 1;
    if (d % 17 == 3) L = 0;
    if (d % 23 == 5) L = 3 * max_len + 1;
    std::vector<int64_t> doc(static_cast<size_t>(L));
    for (int64_t j = 0; j < L; ++j) doc[size_t(j)] = 1 + d * kStride + j;
    EXPECT_EQ(w.add_document(doc), "");
    t.lengths.push_back(L);
  }
  EXPECT_EQ(w.finish(), "");
  EXPECT_EQ(IndexedDataset::open(prefix, &t.ds), "");
  return t;
}

std::vector<MicroBatch> epoch_batches(const TestData& t, const PackerConfig& c, int64_t epoch) {
  std::vector<MicroBatch> out;
  const auto plan = plan_epoch(t.lengths, c, epoch);
  for (size_t i = 0; i < plan.size(); ++i) out.push_back(build_micro_batch(t.ds, c, plan[i], epoch, int64_t(i)));
  return out;
}

// Checks every invariant of one epoch's batches.
void check_epoch(const TestData& t, const PackerConfig& c, const std::vector<MicroBatch>& mbs) {
  const int64_t pm = packer_pad_multiple(c), A = packer_alignment(c);
  std::map<int64_t, int64_t> next_pos;  // doc -> next expected position
  int64_t labels = 0, docs_seen = 0;
  for (const MicroBatch& mb : mbs) labels += mb.label_tokens();
  for (int64_t L : t.lengths) docs_seen += L > 0;
  int64_t total = 0;
  for (int64_t L : t.lengths) total += L;
  EXPECT_EQ(labels, total - docs_seen) << "every token but the last of each document has a label";
  std::map<int64_t, int64_t> last_batch;
  for (const MicroBatch& mb : mbs) {
    const int64_t T = mb.tokens_total();
    ASSERT_LE(T, c.max_tokens);
    ASSERT_EQ(T % A, 0) << "C4";
    ASSERT_EQ(int64_t(mb.tokens.size()), T);
    ASSERT_EQ(int64_t(mb.labels.size()), T);
    const size_t n = mb.pieces.size();
    ASSERT_TRUE(mb.cu_seqlens.size() == n + 1 || mb.cu_seqlens.size() == n + 2);
    if (mb.cu_seqlens.size() == n + 2) {  // the alignment segment: actual length 0
      EXPECT_EQ(mb.cu_seqlens[n + 1], mb.cu_seqlens[n]);
      EXPECT_GT(mb.cu_seqlens_padded[n + 1], mb.cu_seqlens_padded[n]);
    }
    for (size_t i = 0; i + 1 < mb.cu_seqlens_padded.size(); ++i)
      ASSERT_EQ((mb.cu_seqlens_padded[i + 1] - mb.cu_seqlens_padded[i]) % pm, 0) << "sequence " << i;
    for (int r = 0; r < c.cp; ++r) ASSERT_EQ(validate_packed_batch(mb.desc(r)), "");
    std::vector<char> real(size_t(T), 0);
    for (size_t i = 0; i < n; ++i) {
      const DocPiece& p = mb.pieces[i];
      ASSERT_EQ(mb.cu_seqlens[i + 1] - mb.cu_seqlens[i], p.length);
      ASSERT_EQ(p.begin, next_pos[p.doc]) << "document " << p.doc << " out of order";
      if (last_batch.count(p.doc)) ASSERT_GT(mb.index, last_batch[p.doc]);
      last_batch[p.doc] = mb.index;
      next_pos[p.doc] = p.begin + p.length;
      for (int64_t j = 0; j < p.length; ++j) {
        const int64_t x = mb.cu_seqlens_padded[i] + j, pos = p.begin + j;
        real[size_t(x)] = 1;
        ASSERT_EQ(mb.tokens[size_t(x)], 1 + p.doc * kStride + pos);
        const int64_t want = pos + 1 < t.lengths[size_t(p.doc)] ? 1 + p.doc * kStride + pos + 1 : kIgnoreLabel;
        ASSERT_EQ(mb.labels[size_t(x)], want);
      }
    }
    for (int64_t x = 0; x < T; ++x)
      if (!real[size_t(x)]) {
        ASSERT_EQ(mb.tokens[size_t(x)], c.pad_id);
        ASSERT_EQ(mb.labels[size_t(x)], kIgnoreLabel);
      }
  }
  for (size_t d = 0; d < t.lengths.size(); ++d) EXPECT_EQ(next_pos[int64_t(d)], t.lengths[d]) << "document " << d;
}

struct Layout {
  int sp, cp;
  int64_t max_tokens;
};

TEST(Packer, EveryTokenOnceAndEveryRuleHolds) {
  const uint64_t seed = dt::testing::test_seed();
  const TestData t = make_data("rules", 300, 40, seed);
  for (Layout l : {Layout{1, 1, 64}, Layout{1, 1, 37}, Layout{2, 1, 64}, Layout{1, 2, 64}, Layout{2, 2, 96},
                   Layout{4, 2, 128}, Layout{3, 2, 96}, Layout{1, 4, 64}, Layout{2, 4, 256}}) {
    SCOPED_TRACE(::testing::Message() << "sp=" << l.sp << " cp=" << l.cp << " max_tokens=" << l.max_tokens);
    PackerConfig c;
    c.sp = l.sp;
    c.cp = l.cp;
    c.max_tokens = l.max_tokens;
    c.seed = seed;
    c.pad_id = 7;
    ASSERT_EQ(validate_packer_config(c), "");
    for (int64_t epoch : {0, 1}) check_epoch(t, c, epoch_batches(t, c, epoch));
  }
}

TEST(Packer, RankViewsMatchTheBatch) {
  const TestData t = make_data("views", 60, 30, dt::testing::test_seed());
  for (Layout l : {Layout{1, 1, 64}, Layout{2, 1, 64}, Layout{1, 2, 64}, Layout{2, 2, 96}, Layout{2, 4, 128}}) {
    PackerConfig c;
    c.sp = l.sp;
    c.cp = l.cp;
    c.max_tokens = l.max_tokens;
    for (const MicroBatch& mb : epoch_batches(t, c, 0)) {
      const std::vector<int32_t> cu(mb.cu_seqlens_padded.begin(), mb.cu_seqlens_padded.end());
      const int64_t T = mb.tokens_total(), Tcp = T / l.cp;
      std::vector<std::vector<int32_t>> locals;
      for (int r = 0; r < l.cp; ++r) {
        const RankBatch rb0 = rank_view(mb, 0, r);
        ASSERT_EQ(int64_t(rb0.tokens_cp.size()), Tcp);
        std::vector<int32_t> tiled;
        for (int s = 0; s < l.sp; ++s) {
          const RankBatch rb = rank_view(mb, s, r);
          ASSERT_EQ(int64_t(rb.tokens_local.size()), rb.desc.tokens_local);
          tiled.insert(tiled.end(), rb.tokens_local.begin(), rb.tokens_local.end());
        }
        ASSERT_EQ(tiled, rb0.tokens_cp);
        // PackedSeqParams on the host: the loss mask marks exactly the non-pad rows.
        const PackedSeqParams P = PackedSeqParams::build(rb0.desc);
        for (int64_t x = 0; x < Tcp; ++x) {
          const bool real = P.loss_mask_local()[size_t(x)] != 0;
          ASSERT_EQ(real, rb0.tokens_cp[size_t(x)] != c.pad_id || false) << "row " << x;
          if (!real) ASSERT_EQ(rb0.labels_cp[size_t(x)], kIgnoreLabel);
        }
        locals.push_back(rb0.tokens_cp);
      }
      std::vector<TensorView> views;
      for (auto& v : locals) views.emplace_back(v.data(), DType::i32, Device::cpu(), Shape{Tcp});
      const Tensor g = zigzag_gather_rows(views, cu, l.cp);
      ASSERT_EQ(std::vector<int32_t>(g.ptr<int32_t>(), g.ptr<int32_t>() + T), mb.tokens);
    }
  }
}

TEST(Packer, DeterministicPerSeedAndShuffleOff) {
  const TestData t = make_data("det", 200, 30, 11);
  PackerConfig c;
  c.max_tokens = 64;
  c.seed = 5;
  const auto a = plan_epoch(t.lengths, c, 0);
  EXPECT_EQ(a, plan_epoch(t.lengths, c, 0));
  EXPECT_NE(a, plan_epoch(t.lengths, c, 1)) << "a new epoch reshuffles";
  PackerConfig c2 = c;
  c2.seed = 6;
  EXPECT_NE(a, plan_epoch(t.lengths, c2, 0));

  PackerConfig off = c;
  off.shuffle = false;
  const auto order = document_order(200, off, 3);
  for (int64_t d = 0; d < 200; ++d) ASSERT_EQ(order[size_t(d)], d);
  const auto p = plan_epoch(t.lengths, off, 0);
  EXPECT_EQ(p, plan_epoch(t.lengths, off, 1)) << "no shuffle: every epoch is the same";
  for (const auto& mb : p)
    for (size_t i = 1; i < mb.size(); ++i) ASSERT_LE(mb[i - 1].doc, mb[i].doc) << "dataset order inside a batch";
  // Documents that exactly fill half a micro-batch pack strictly in dataset order.
  std::vector<int64_t> halves(10, 32);
  const auto h = plan_epoch(halves, off, 0);
  ASSERT_EQ(h.size(), 5u);
  for (size_t b = 0; b < 5; ++b)
    EXPECT_EQ(h[b], (std::vector<DocPiece>{{int64_t(2 * b), 0, 32}, {int64_t(2 * b + 1), 0, 32}}));
  // A document of 2.5 micro-batches: the short piece first, then two full ones.
  const std::vector<int64_t> one{160};
  EXPECT_EQ(plan_epoch(one, off, 0),
            (std::vector<std::vector<DocPiece>>{{{0, 0, 32}}, {{0, 32, 64}}, {{0, 96, 64}}}));
}

TEST(Packer, ConfigErrorsNameTheField) {
  PackerConfig c;
  c.cp = 2;
  c.sp = 4;
  c.max_tokens = 100;
  EXPECT_EQ(validate_packer_config(c),
            "data: data.max_tokens=100 must be a multiple of lcm(data.pad_multiple=4, pack alignment 8)=8 (alignment: "
            "cp*lcm(2, sp) with cp=2 sp=4); next valid value 104");
  c.max_tokens = 104;
  EXPECT_EQ(validate_packer_config(c), "");
  c.pad_multiple = 6;
  EXPECT_EQ(validate_packer_config(c), "config: data.pad_multiple=6 must be a multiple of 2*parallel.cp=4");
  c = {};
  c.max_tokens = 0;
  EXPECT_EQ(validate_packer_config(c), "data: data.max_tokens=0 must be >= 1");
  c = {};
  c.dp = 0;
  EXPECT_EQ(validate_packer_config(c), "data: packer needs sp=1, cp=1 and dp=0 all >= 1");
  c = {};
  c.pad_multiple = -2;
  EXPECT_EQ(validate_packer_config(c), "data: data.pad_multiple=-2 must be >= 0 (0: the default)");
  c = {};
  c.max_tokens = int64_t(1) << 31;
  EXPECT_EQ(validate_packer_config(c), "data: data.max_tokens=2147483648 exceeds the int32 range");
  c = {};  // a huge pad multiple: its lcm with the alignment overflowed into a garbage message
  c.cp = 1;
  c.sp = 2;
  c.pad_multiple = 4611686018427387905;
  EXPECT_EQ(validate_packer_config(c),
            "data: data.pad_multiple=4611686018427387905 exceeds data.max_tokens=4096: a padded piece must fit a "
            "micro-batch");
}

TEST(Loader, ResumeGivesIdenticalBatches) {
  const TestData t = make_data("resume", 80, 30, dt::testing::test_seed());
  PackerConfig c;
  c.max_tokens = 64;
  c.cp = 2;
  c.dp = 2;
  c.seed = 99;
  PackedLoader a(t.ds, c, 1);
  const int64_t steps = a.steps_in_epoch();
  ASSERT_GT(steps, 3);
  std::string saved;
  std::vector<MicroBatch> after;
  for (int64_t s = 0; s < steps + 5; ++s) {  // crosses into epoch 1
    if (s == steps - 2) saved = a.position().to_string();
    MicroBatch mb = a.next();
    if (s >= steps - 2) after.push_back(std::move(mb));
  }
  EXPECT_EQ(a.position().epoch, 1);

  PackedLoader b(t.ds, c, 1);
  LoaderPosition p;
  ASSERT_EQ(LoaderPosition::parse(saved, &p), "");
  EXPECT_EQ(p.to_string(), saved);
  ASSERT_EQ(b.seek(p), "");
  for (const MicroBatch& want : after) {
    const MicroBatch got = b.next();
    ASSERT_EQ(got.epoch, want.epoch);
    ASSERT_EQ(got.index, want.index);
    ASSERT_EQ(got.tokens, want.tokens);
    ASSERT_EQ(got.labels, want.labels);
    ASSERT_EQ(got.cu_seqlens, want.cu_seqlens);
    ASSERT_EQ(got.cu_seqlens_padded, want.cu_seqlens_padded);
  }

  PackerConfig other = c;
  other.seed = 100;
  PackedLoader o(t.ds, other, 1);
  EXPECT_NE(o.seek(p).find("does not match this loader's"), std::string::npos);
  LoaderPosition far = p;
  far.step = 1 << 20;
  EXPECT_NE(b.seek(far).find("is past the"), std::string::npos);
  far.step = -1;
  EXPECT_NE(b.seek(far).find("loader position: epoch=0 step=-1 must be >= 0"), std::string::npos) << b.seek(far);
  EXPECT_NE(LoaderPosition::parse("epoch=1", &p).find("cannot parse 'epoch=1'"), std::string::npos);
}

TEST(Loader, DpShardsAreDisjointAndCoverTheEpoch) {
  const TestData t = make_data("dp", 90, 30, dt::testing::test_seed());
  for (int dp : {1, 2, 3, 4}) {
    PackerConfig c;
    c.max_tokens = 64;
    c.sp = 2;
    c.dp = dp;
    const int64_t B = int64_t(plan_epoch(t.lengths, c, 0).size());
    std::vector<int> seen(size_t(B), 0);
    int64_t steps = -1;
    for (int r = 0; r < dp; ++r) {
      PackedLoader l(t.ds, c, r);
      if (steps < 0) steps = l.steps_in_epoch();
      ASSERT_EQ(l.steps_in_epoch(), steps) << "every rank runs the same steps";
      ASSERT_EQ(steps, (B + dp - 1) / dp);
      for (int64_t s = 0; s < steps; ++s) {
        const MicroBatch mb = l.next();
        ASSERT_EQ(mb.index % dp, r);
        if (mb.index < B) {
          seen[size_t(mb.index)]++;
          ASSERT_FALSE(mb.pieces.empty());
        } else {  // filler: one pad-only segment
          ASSERT_TRUE(mb.pieces.empty());
          ASSERT_EQ(mb.real_tokens(), 0);
          ASSERT_EQ(validate_packed_batch(mb.desc()), "");
        }
      }
      EXPECT_EQ(l.position().epoch, 0);
      EXPECT_EQ(l.next().epoch, 1);
    }
    for (int64_t i = 0; i < B; ++i) ASSERT_EQ(seen[size_t(i)], 1) << "micro-batch " << i << " dp " << dp;
  }
}

// One DP rank per process (dp = world size; alone: dp = 1): every process takes the same
// number of steps, the micro-batch indices of all processes cover the epoch once, the real
// tokens add up to the dataset's, and every process reports the same loader position.
TEST(Loader, DpShardsAcrossProcesses) {
  const int dp = dist::world_size(), rank = dist::world_rank();
  const TestData t = make_data("mpi", 70, 30, 2024);  // fixed seed: the same data on every rank
  PackerConfig c;
  c.max_tokens = 64;
  c.cp = 2;
  c.dp = dp;
  c.seed = 31;
  PackedLoader l(t.ds, c, rank);
  const int64_t steps = l.steps_in_epoch(), B = l.micro_batches_in_epoch();
  // Per step: global index and real tokens; then the position after the epoch.
  std::vector<int64_t> mine;
  for (int64_t s = 0; s < steps; ++s) {
    const MicroBatch mb = l.next();
    mine.push_back(mb.index);
    mine.push_back(mb.real_tokens());
  }
  const LoaderPosition pos = l.position();
  mine.push_back(pos.epoch);
  mine.push_back(pos.step);
  mine.push_back(int64_t(pos.fingerprint));
  const int64_t n = int64_t(mine.size());
  std::vector<int64_t> all(size_t(n * dp));
  auto w = dist::make_world(dist::Backend::mpi);
  w->all_gather(TensorView(all.data(), DType::i64, Device::cpu(), Shape{n * dp}),
                TensorView(mine.data(), DType::i64, Device::cpu(), Shape{n}));
  std::vector<int> seen(size_t(B), 0);
  int64_t real = 0;
  for (int r = 0; r < dp; ++r) {
    const int64_t* a = all.data() + r * n;
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t idx = a[2 * s];
      ASSERT_EQ(idx, s * dp + r);
      if (idx < B) seen[size_t(idx)]++;
      else ASSERT_EQ(a[2 * s + 1], 0) << "a filler carries no real token";
      real += a[2 * s + 1];
    }
    EXPECT_EQ(a[n - 3], pos.epoch);
    EXPECT_EQ(a[n - 2], pos.step);
    EXPECT_EQ(a[n - 1], int64_t(pos.fingerprint)) << "rank " << r << " has another data config or dataset";
  }
  for (int64_t i = 0; i < B; ++i) ASSERT_EQ(seen[size_t(i)], 1) << "micro-batch " << i;
  EXPECT_EQ(real, t.ds.num_tokens());
}

}  // namespace
}  // namespace dt::data
