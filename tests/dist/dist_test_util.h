// Helpers for the distributed tests: the layouts exercised at each world size, and
// nccl-tests style exact checks of every collective on one communicator. Data are small
// integers depending on (global rank, index), exact in every dtype after summing over up to
// 8 ranks; each check counts wrong elements and reports the first few.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "deltatron/core/numeric.h"
#include "deltatron/core/tensor.h"
#include "deltatron/dist/comm.h"
#include "deltatron/dist/parallel.h"
#include "deltatron/ops/basic.h"

namespace dt::testing {

// Layouts exercised at a given world size (tp, cp, dp).
inline std::vector<dist::ParallelDims> layouts_for(int world) {
  switch (world) {
    case 1: return {{1, 1, 1}};
    case 2: return {{2, 1, 1}, {1, 2, 1}, {1, 1, 2}};
    case 4: return {{2, 2, 1}, {4, 1, 1}, {1, 4, 1}, {1, 1, 4}, {2, 1, 2}, {1, 2, 2}};
    case 8: return {{2, 2, 2}, {4, 1, 2}, {1, 4, 2}, {2, 1, 4}};
    default: return {{world, 1, 1}, {1, 1, world}};
  }
}

inline std::string layout_name(const dist::ParallelDims& d) {
  return "tp" + std::to_string(d.tp) + "_cp" + std::to_string(d.cp) + "_dp" + std::to_string(d.dp);
}

// Every group of a ProcessGroups value, named.
inline std::vector<std::pair<const char*, dist::Communicator*>> all_groups(const dist::ProcessGroups& g) {
  return {{"world", g.world.get()}, {"tp", g.tp.get()},       {"cp", g.cp.get()},
          {"dp", g.dp.get()},       {"tp_cp", g.tp_cp.get()}, {"dp_cp", g.dp_cp.get()}};
}

inline const DType kCollectiveDtypes[] = {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64};

// An integer in [-8, 8] from (global rank, index), plus for integer types a large offset
// depending on the index only (checks that the high bits travel; sums stay exact in double).
inline double value(DType t, int grank, int64_t i) {
  double v = double(((grank + 1) * (i % 11 + 1) + 3 * i + 5 * grank) % 17) - 8;
  if (t == DType::i32) v += double(int64_t(1) << 20) * double(i % 3);
  if (t == DType::i64) v += double(int64_t(1) << 40) * double(i % 3);
  return v;
}
inline constexpr double kPoison = 99;  // never an expected value

inline void set_elem(const TensorView& h, int64_t i, double v) {
  switch (h.dtype) {
    case DType::f32: h.ptr<float>()[i] = float(v); return;
    case DType::bf16: h.ptr<uint16_t>()[i] = f32_to_bf16_bits(float(v)); return;
    case DType::f16: h.ptr<uint16_t>()[i] = f32_to_f16_bits(float(v)); return;
    case DType::i32: h.ptr<int32_t>()[i] = int32_t(v); return;
    case DType::i64: h.ptr<int64_t>()[i] = int64_t(v); return;
    default: FAIL() << "unsupported dtype " << dtype_name(h.dtype);
  }
}
inline double get_elem(const TensorView& h, int64_t i) {
  switch (h.dtype) {
    case DType::f32: return h.ptr<float>()[i];
    case DType::bf16: return bf16_bits_to_f32(h.ptr<uint16_t>()[i]);
    case DType::f16: return f16_bits_to_f32(h.ptr<uint16_t>()[i]);
    case DType::i32: return h.ptr<int32_t>()[i];
    case DType::i64: return double(h.ptr<int64_t>()[i]);
    default: return kPoison;
  }
}

// Where tensors live for one backend: CPU for MPI, this rank's GPU and a stream for NCCL.
struct Where {
  Device device = Device::cpu();
  Stream stream{};
};

// A tensor on `w.device` holding f(i) for each element.
inline Tensor make_filled(int64_t n, DType t, const Where& w, const std::function<double(int64_t)>& f) {
  Tensor h = Tensor::empty(Shape{n}, t);
  for (int64_t i = 0; i < n; ++i) set_elem(h, i, f(i));
  if (w.device.is_cpu()) return h;
  return ops::to_device(h, w.device, w.stream);
}

// Counts elements of `got` (any device) that differ from want(i); reports the first few.
inline ::testing::AssertionResult exact(const TensorView& got, const Where& w,
                                        const std::function<double(int64_t)>& want) {
  Tensor h = ops::to_host(got, w.stream);
  int64_t wrong = 0;
  std::string first;
  for (int64_t i = 0; i < h.numel(); ++i) {
    const double g = get_elem(h, i), e = want(i);
    if (g == e) continue;
    if (wrong++ < 5) first += " [" + std::to_string(i) + "] got " + std::to_string(g) + " want " + std::to_string(e) + ";";
  }
  if (wrong == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << wrong << " of " << h.numel() << " elements wrong:" << first;
}

// Runs every collective of `c` on dtype t with n elements per block, checking exactly.
// `label` names the case in failure messages. Every rank of `c` must call this.
inline void check_collectives(dist::Communicator& c, DType t, int64_t n, const Where& w, const std::string& label) {
  SCOPED_TRACE(label + " " + dtype_name(t) + " n=" + std::to_string(n) + " group rank " + std::to_string(c.rank()) +
               "/" + std::to_string(c.size()));
  const int P = c.size(), me = c.rank();
  const std::vector<int>& m = c.members();
  const int gme = m[me];

  // Element j of the reduction over the group of every member's value(., j).
  auto reduced = [&](dist::ReduceOp op, int64_t j) {
    double acc = value(t, m[0], j);
    for (int r = 1; r < P; ++r)
      acc = op == dist::ReduceOp::sum ? acc + value(t, m[r], j) : std::max(acc, value(t, m[r], j));
    return acc;
  };

  // all_reduce sum / max, in place.
  for (dist::ReduceOp op : {dist::ReduceOp::sum, dist::ReduceOp::max}) {
    Tensor x = make_filled(n, t, w, [&](int64_t i) { return value(t, gme, i); });
    c.all_reduce(x, op, w.stream);
    auto want = [&](int64_t i) { return reduced(op, i); };
    EXPECT_TRUE(exact(x, w, want)) << "all_reduce " << (op == dist::ReduceOp::sum ? "sum" : "max");
  }

  // all_gather, out of place and in place (in = this rank's block of out).
  {
    auto want = [&](int64_t j) { return value(t, m[j / n], j % n); };
    Tensor in = make_filled(n, t, w, [&](int64_t i) { return value(t, gme, i); });
    Tensor out = make_filled(P * n, t, w, [](int64_t) { return kPoison; });
    c.all_gather(out, in, w.stream);
    EXPECT_TRUE(exact(out, w, want)) << "all_gather";
    Tensor buf = make_filled(P * n, t, w, [&](int64_t j) { return j / n == me ? value(t, gme, j % n) : kPoison; });
    c.all_gather(buf, buf.view().slice(0, me * n, (me + 1) * n), w.stream);
    EXPECT_TRUE(exact(buf, w, want)) << "all_gather in place";
  }

  // reduce_scatter sum / max, out of place and in place (out = this rank's block of in).
  for (dist::ReduceOp op : {dist::ReduceOp::sum, dist::ReduceOp::max}) {
    const char* opn = op == dist::ReduceOp::sum ? "sum" : "max";
    auto want = [&](int64_t i) { return reduced(op, me * n + i); };
    Tensor in = make_filled(P * n, t, w, [&](int64_t j) { return value(t, gme, j); });
    Tensor out = make_filled(n, t, w, [](int64_t) { return kPoison; });
    c.reduce_scatter(out, in, op, w.stream);
    EXPECT_TRUE(exact(out, w, want)) << "reduce_scatter " << opn;
    TensorView mine = in.view().slice(0, me * n, (me + 1) * n);
    c.reduce_scatter(mine, in, op, w.stream);
    EXPECT_TRUE(exact(mine, w, want)) << "reduce_scatter in place " << opn;
  }

  // all_to_all: block j of rank s's input is tagged (s, j); block s of rank j's output must
  // hold it.
  {
    auto tag = [&](int src, int dst, int64_t i) { return value(t, src * 17 + dst, i); };
    Tensor in = make_filled(P * n, t, w, [&](int64_t j) { return tag(gme, m[j / n], j % n); });
    Tensor out = make_filled(P * n, t, w, [](int64_t) { return kPoison; });
    c.all_to_all(out, in, w.stream);
    auto want = [&](int64_t j) { return tag(m[j / n], gme, j % n); };
    EXPECT_TRUE(exact(out, w, want)) << "all_to_all";
  }

  // broadcast from the first and the last group rank.
  for (int root : {0, P - 1}) {
    Tensor x = make_filled(n, t, w, [&](int64_t i) { return me == root ? value(t, gme, i) : kPoison; });
    c.broadcast(x, root, w.stream);
    auto want = [&](int64_t i) { return value(t, m[root], i); };
    EXPECT_TRUE(exact(x, w, want)) << "broadcast root " << root;
  }

  c.barrier(w.stream);
}

}  // namespace dt::testing
