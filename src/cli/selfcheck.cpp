// `deltatron env` and `deltatron selfcheck`: collective checks with exactly checkable data
// (nccl-tests style). Values are small integers, exact in every float dtype, so a wrong
// element is a wrong element, never a rounding question.
#include "cli/selfcheck.h"

#include <cstdio>

#include "deltatron/core/log.h"
#include "deltatron/core/sysinfo.h"
#include "deltatron/dist/parallel.h"
#include "deltatron/ops/basic.h"

namespace dt::cli {
namespace {

using dist::Communicator;

Tensor host_from(const std::vector<float>& v, DType dt) {
  Tensor f = Tensor::empty(Shape{int64_t(v.size())}, DType::f32);
  std::copy(v.begin(), v.end(), f.ptr<float>());
  Tensor out = Tensor::empty(f.shape(), dt);
  if (dt == DType::f32 || dtype_is_float(dt)) {
    ops::copy(out, f);
  } else {  // integer dtypes: convert by hand
    for (size_t i = 0; i < v.size(); ++i) {
      if (dt == DType::i32) out.ptr<int32_t>()[i] = int32_t(v[i]);
      else if (dt == DType::i64) out.ptr<int64_t>()[i] = int64_t(v[i]);
      else DT_FAIL("selfcheck: dtype {} is not supported", dtype_name(dt));
    }
  }
  return out;
}

std::vector<float> host_values(const TensorView& x) {
  Tensor h = ops::to_host(x);
  std::vector<float> v(size_t(h.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    if (h.dtype() == DType::i32) v[i] = float(h.ptr<int32_t>()[i]);
    else if (h.dtype() == DType::i64) v[i] = float(h.ptr<int64_t>()[i]);
  }
  if (dtype_is_float(h.dtype())) {
    Tensor f = Tensor::empty(h.shape(), DType::f32);
    ops::copy(f, h);
    std::copy(f.ptr<float>(), f.ptr<float>() + v.size(), v.begin());
  }
  return v;
}

struct Checker {
  Device dev;
  DType dt;
  Tensor put(const std::vector<float>& v) {
    Tensor h = host_from(v, dt);
    return dev.is_cpu() ? h : ops::to_device(h, dev);
  }
  int64_t wrong(const TensorView& got, const std::vector<float>& want) {
    std::vector<float> g = host_values(got);
    int64_t bad = 0;
    for (size_t i = 0; i < want.size(); ++i) bad += g[i] != want[i];
    return bad;
  }
};

int64_t check_group(Communicator& c, Checker& ck) {
  const int P = c.size(), r = c.rank();
  const int64_t n = 1031;  // odd, so no power-of-two luck
  int64_t bad = 0;
  {  // all_reduce sum
    std::vector<float> x(n), want(n);
    for (int64_t i = 0; i < n; ++i) {
      x[i] = float(r + 1 + i % 7);
      want[i] = float(P * (P + 1) / 2 + P * (i % 7));
    }
    Tensor t = ck.put(x);
    c.all_reduce(t, dist::ReduceOp::sum);
    bad += ck.wrong(t, want);
  }
  {  // all_reduce max
    std::vector<float> x(n), want(n);
    for (int64_t i = 0; i < n; ++i) {
      x[i] = float(3 * ((r + i) % P) + i % 5);
      want[i] = float(3 * (P - 1) + i % 5);
    }
    Tensor t = ck.put(x);
    c.all_reduce(t, dist::ReduceOp::max);
    bad += ck.wrong(t, want);
  }
  {  // all_gather
    std::vector<float> x(n), want(n * P);
    for (int64_t i = 0; i < n; ++i) x[i] = float(10 * r + i % 9);
    for (int j = 0; j < P; ++j)
      for (int64_t i = 0; i < n; ++i) want[j * n + i] = float(10 * j + i % 9);
    Tensor in = ck.put(x), out = ck.put(std::vector<float>(n * P, -1.f));
    c.all_gather(out, in);
    bad += ck.wrong(out, want);
  }
  {  // reduce_scatter (sum)
    std::vector<float> x(n * P), want(n);
    for (int j = 0; j < P; ++j)
      for (int64_t i = 0; i < n; ++i) x[j * n + i] = float(r + j + i % 5);
    for (int64_t i = 0; i < n; ++i) want[i] = float(P * (P - 1) / 2 + P * (r + i % 5));
    Tensor in = ck.put(x), out = ck.put(std::vector<float>(n, -1.f));
    c.reduce_scatter(out, in, dist::ReduceOp::sum);
    bad += ck.wrong(out, want);
  }
  {  // all_to_all: block j of rank r carries (r, j); block i received comes from rank i
    std::vector<float> x(n * P), want(n * P);
    for (int j = 0; j < P; ++j)
      for (int64_t i = 0; i < n; ++i) {
        x[j * n + i] = float(16 * r + j + i % 3);
        want[j * n + i] = float(16 * j + r + i % 3);
      }
    Tensor in = ck.put(x), out = ck.put(std::vector<float>(n * P, -1.f));
    c.all_to_all(out, in);
    bad += ck.wrong(out, want);
  }
  {  // broadcast from the last group rank
    std::vector<float> x(n), want(n);
    for (int64_t i = 0; i < n; ++i) {
      want[i] = float(5 + i % 11);
      x[i] = r == P - 1 ? want[i] : -1.f;
    }
    Tensor t = ck.put(x);
    c.broadcast(t, P - 1);
    bad += ck.wrong(t, want);
  }
  c.barrier();
  return bad;
}

}  // namespace

int print_env() {
  // Each rank's line, in rank order (ranks take turns between barriers).
  auto world = dist::make_world(dist::Backend::mpi);
  for (int r = 0; r < world->size(); ++r) {
    if (r == world->rank()) {
      std::printf("[rank %d/%d, local %d] %s", r, world->size(), dist::local_rank(), sysinfo().c_str());
      std::fflush(stdout);
    }
    world->barrier();
  }
  return 0;
}

int selfcheck(const SelfcheckOptions& o) {
  const std::optional<dist::Backend> named = dist::backend_from_name(o.backend);
  if (!named) user_error(fmt::format("selfcheck: --backend '{}' is not one of: mpi, nccl, staged", o.backend));
  const dist::Backend backend = *named;
  DType dt = parse_dtype(o.dtype);
  dist::ParallelDims dims{o.tp, o.cp, o.dp};
  if (std::string err = dims.resolve(dist::world_size()); !err.empty()) user_error(err);
  Device dev = Device::cpu();
  if (backend != dist::Backend::mpi) dev = Device::cuda(dist::select_cuda_device(backend));
  if (dist::world_rank() == 0) std::printf("%s", dist::describe_layout(dims).c_str());

  dist::ProcessGroups pg = dist::ProcessGroups::build(dims, backend);
  Checker ck{dev, dt};
  struct Named { const char* name; Communicator* c; };
  Named groups[] = {{"world", pg.world.get()}, {"tp", pg.tp.get()},       {"cp", pg.cp.get()},
                    {"dp", pg.dp.get()},       {"tp_cp", pg.tp_cp.get()}, {"dp_cp", pg.dp_cp.get()}};
  auto world = dist::make_world(dist::Backend::mpi);
  int64_t total_bad = 0;
  for (const Named& g : groups) {
    Tensor bad = Tensor::empty(Shape{1}, DType::i64);
    *bad.ptr<int64_t>() = check_group(*g.c, ck);
    world->all_reduce(bad, dist::ReduceOp::sum);
    total_bad += *bad.ptr<int64_t>();
    if (dist::world_rank() == 0)
      std::printf("selfcheck %-5s (size %d, %s, %s): %s (%lld wrong elements over all ranks)\n", g.name, g.c->size(),
                  dist::backend_name(backend), dtype_name(dt), *bad.ptr<int64_t>() ? "FAIL" : "ok",
                  static_cast<long long>(*bad.ptr<int64_t>()));
  }
  if (dist::world_rank() == 0) std::printf("selfcheck: %s\n", total_bad ? "FAILED" : "all collectives correct");
  return total_bad ? 1 : 0;
}

}  // namespace dt::cli
