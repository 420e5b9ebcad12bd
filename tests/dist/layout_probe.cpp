// layout_probe: validates --tp/--cp/--dp against the world size, builds ProcessGroups on the
// chosen backend and checks one all-reduce per group. Used by the expected-failure CTest
// entries (a wrong world size, a rank without a GPU) and, with --dry-run, to print the
// layout table of docs/parallelism.md without launching ranks. --inject-mpi-error makes a
// deliberately mismatched broadcast, to check DT_MPI_CHECK's report and job abort.
//
//   mpirun -np 8 layout_probe --tp 2 --cp 2 [--dp 2] [--backend mpi|nccl]
//   layout_probe --tp 2 --cp 2 --dp 2 --dry-run
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <mpi.h>

#include "deltatron/core/check.h"
#include "deltatron/dist/check.h"
#include "deltatron/dist/comm.h"
#include "deltatron/dist/parallel.h"
#include "deltatron/ops/basic.h"

namespace {

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "layout_probe: %s\nusage: layout_probe [--tp N] [--cp N] [--dp N|-1] [--backend mpi|nccl] "
               "[--dry-run] [--inject-mpi-error]\n",
               why);
  std::exit(2);
}

int parse_int(const char* flag, const char* v) {
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (!*v || *end) usage((std::string(flag) + " takes an integer, got '" + v + "'").c_str());
  return int(x);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dt;
  dist::ParallelDims dims;
  dist::Backend backend = dist::Backend::mpi;
  bool dry_run = false, inject_mpi_error = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) usage((a + " needs a value").c_str());
      return argv[++i];
    };
    if (a == "--tp") dims.tp = parse_int("--tp", next());
    else if (a == "--cp") dims.cp = parse_int("--cp", next());
    else if (a == "--dp") dims.dp = parse_int("--dp", next());
    else if (a == "--dry-run") dry_run = true;
    else if (a == "--inject-mpi-error") inject_mpi_error = true;
    else if (a == "--backend") {
      const std::string b = next();
      const std::optional<dist::Backend> named = dist::backend_from_name(b);
      if (!named) usage(("--backend must be mpi, nccl or staged, got '" + b + "'").c_str());
      backend = *named;
    } else usage(("unknown argument '" + a + "'").c_str());
  }

  if (dry_run) {  // no ranks needed: the layout of a world of exactly tp*cp*dp
    if (dims.dp == -1) usage("--dry-run needs an explicit --dp");
    const std::string err = dims.resolve(dims.tp * dims.cp * dims.dp);
    if (!err.empty()) usage(err.c_str());
    std::fputs(dist::describe_layout(dims).c_str(), stdout);
    return 0;
  }

  dist::init(&argc, &argv);
  // The layout is checked before anything else touches a GPU or builds a group.
  if (std::string err = dims.resolve(dist::world_size()); !err.empty()) user_error(err);
  Device dev = Device::cpu();
  if (backend != dist::Backend::mpi) dev = Device::cuda(dist::select_cuda_device(backend));
  dist::ProcessGroups pg = dist::ProcessGroups::build(dims, backend);
  if (dist::world_rank() == 0) std::fputs(dist::describe_layout(dims).c_str(), stdout);

  for (dist::Communicator* c : {pg.world.get(), pg.tp.get(), pg.cp.get(), pg.dp.get(), pg.tp_cp.get(), pg.dp_cp.get()}) {
    Tensor one = Tensor::empty(Shape{1}, DType::i32);
    one.ptr<int32_t>()[0] = 1;
    Tensor x = dev.is_cpu() ? one : ops::to_device(one, dev);
    c->all_reduce(x, dist::ReduceOp::sum);
    const int got = dev.is_cpu() ? x.ptr<int32_t>()[0] : ops::to_host(x).ptr<int32_t>()[0];
    DT_CHECK(got == c->size(), "layout_probe: all_reduce of 1 over a group of {} gave {}", c->size(), got);
  }
  pg.world->barrier();
  if (inject_mpi_error) {  // rank 0 sends 4 ints, the others expect 2: MPI_ERR_TRUNCATE there
    int buf[4] = {};
    DT_MPI_CHECK(MPI_Bcast(buf, dist::world_rank() == 0 ? 4 : 2, MPI_INT, 0, MPI_COMM_WORLD));
  }
  if (dist::world_rank() == 0)
    std::printf("layout_probe: ok (%d ranks, backend %s)\n", dist::world_size(), dist::backend_name(backend));
  return 0;
}
