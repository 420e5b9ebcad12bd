// Process bootstrap: MPI start-up (under mpirun or as one plain process), rank / world /
// local rank, the CUDA device of this rank, and the MPI error-check reporter.
#include <mpi.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/env_knob.h"
#include "deltatron/core/check.h"
#include "deltatron/core/log.h"
#include "deltatron/dist/check.h"
#include "deltatron/dist/comm.h"

#if DELTATRON_HAVE_CUDA
#include "core/cuda_check.h"
#endif

namespace dt::dist {
namespace {

// The bootstrap record of this process: like MPI's own init state, it exists once per
// process and is written only by init(). Everything else is passed explicitly.
struct Bootstrap {
  bool done = false;
  bool own_mpi = false;  // we called MPI_Init, so we finalize
  int local_size = 1;
};
Bootstrap& boot() {
  static Bootstrap b;
  return b;
}

bool mpi_live() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

// Fixed-size host names so that they can be all-gathered.
constexpr int kHostLen = 128;
std::vector<char> gather_hosts(const std::string& mine, int world) {
  std::vector<char> me(kHostLen, '\0');
  std::strncpy(me.data(), mine.c_str(), kHostLen - 1);
  std::vector<char> all(size_t(kHostLen) * world);
  DT_MPI_CHECK(MPI_Allgather(me.data(), kHostLen, MPI_CHAR, all.data(), kHostLen, MPI_CHAR, MPI_COMM_WORLD));
  return all;
}

// Local rank and size: ranks sharing memory with this one. Fallbacks, in order:
// OpenMPI's environment, then ranks reporting the same host name.
void find_local(int rank, int world, const std::string& host, int* local_rank, int* local_size) {
  MPI_Comm node = MPI_COMM_NULL;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node) == MPI_SUCCESS &&
      node != MPI_COMM_NULL) {
    DT_MPI_CHECK(MPI_Comm_rank(node, local_rank));
    DT_MPI_CHECK(MPI_Comm_size(node, local_size));
    DT_MPI_CHECK(MPI_Comm_free(&node));
    return;
  }
  const char* lr = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const char* ls = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  // Every rank must take the same fallback, or the collective below would hang.
  int have_env = (lr && ls) ? 1 : 0, all_have_env = 0;
  DT_MPI_CHECK(MPI_Allreduce(&have_env, &all_have_env, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (all_have_env) {
    *local_rank = std::atoi(lr);
    *local_size = std::atoi(ls);
    return;
  }
  std::vector<char> hosts = gather_hosts(host, world);
  *local_rank = 0;
  *local_size = 0;
  for (int r = 0; r < world; ++r) {
    if (std::strncmp(&hosts[size_t(r) * kHostLen], host.c_str(), kHostLen) != 0) continue;
    if (r < rank) ++*local_rank;
    ++*local_size;
  }
}

void finalize_at_exit() { finalize(); }

}  // namespace

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::mpi: return "mpi";
    case Backend::nccl: return "nccl";
    case Backend::staged: return "staged";
  }
  return "?";
}

std::optional<Backend> backend_from_name(std::string_view name) {
  for (Backend b : {Backend::mpi, Backend::nccl, Backend::staged})
    if (name == backend_name(b)) return b;
  return std::nullopt;
}

void init(int* argc, char*** argv, const InitOptions& o) {
  Bootstrap& b = boot();
  if (b.done) return;
  int already = 0;
  MPI_Initialized(&already);
  if (!already) {
    int provided = 0;
    // Only the thread that called init makes MPI calls (data loaders never do).
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
      std::fprintf(stderr, "[deltatron] FATAL: MPI_Init_thread failed on host %s pid %d\n", host_name().c_str(),
                   int(getpid()));
      std::exit(1);
    }
    b.own_mpi = true;
    std::atexit(finalize_at_exit);
  }
  // Errors come back as codes, so that DT_MPI_CHECK can report them with rank and call site.
  DT_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));

  ProcessInfo& pi = process_info();
  DT_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &pi.rank));
  DT_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &pi.world));
  pi.host = host_name();
  find_local(pi.rank, pi.world, pi.host, &pi.local_rank, &b.local_size);
  b.done = true;
  init_logging(pi.rank, o.log_all_ranks);
}

void finalize() {
  // Idempotent: user_error and the atexit hook may both get here.
  if (boot().own_mpi && mpi_live()) MPI_Finalize();
}

bool initialized() { return boot().done && mpi_live(); }

int world_rank() { return process_info().rank; }
int world_size() { return process_info().world; }
int local_rank() { return process_info().local_rank; }
int local_size() { return boot().local_size; }

Backend cuda_backend() {
  const int i = env::choice("DT_COMM_STAGED", {{"0", "NCCL for CUDA tensors (default)"},
                                               {"1", "CUDA tensors through MPI by way of host buffers; ranks may "
                                                     "share a GPU"}});
  return i == 1 ? Backend::staged : Backend::nccl;
}

int select_cuda_device(Backend b) {
  DT_CHECK(initialized(), "select_cuda_device: call dist::init() first");
  ProcessInfo& pi = process_info();
  // Every rank learns about every other rank's problem, so that all exit together through
  // user_error with the same message (rank 0 prints it) instead of some ranks hanging.
  std::string problem;
#if DELTATRON_HAVE_CUDA
  const bool share = b == Backend::staged;
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    problem = fmt::format("rank {} (host {}, local rank {}) has no GPU: cudaGetDeviceCount says '{}'", pi.rank,
                          pi.host, pi.local_rank, cudaGetErrorString(e));
    (void)cudaGetLastError();  // clear it, so that later CUDA calls report their own errors
  } else if (count == 0) {
    problem = fmt::format("rank {} (host {}, local rank {}) has no GPU: no CUDA device is visible", pi.rank, pi.host,
                          pi.local_rank);
  } else if (pi.local_rank >= count && !share) {
    const char* vis = std::getenv("CUDA_VISIBLE_DEVICES");
    problem = fmt::format(
        "rank {} (host {}, local rank {}) has no GPU: {} CUDA device(s) visible on {} (CUDA_VISIBLE_DEVICES={}) for {} "
        "local ranks; run at most {} ranks per node (or set DT_COMM_STAGED=1 to share GPUs, for tests)",
        pi.rank, pi.host, pi.local_rank, count, pi.host, vis ? vis : "<unset>", local_size(), count);
  }
#else
  problem = fmt::format(
      "rank {} (host {}) has no GPU backend: deltatron was built without CUDA; rebuild with CUDA on or use the "
      "mpi backend",
      pi.rank, pi.host);
#endif
  constexpr int kLen = 512;
  std::vector<char> mine(kLen, '\0');
  std::strncpy(mine.data(), problem.c_str(), kLen - 1);
  std::vector<char> all(size_t(kLen) * pi.world);
  DT_MPI_CHECK(MPI_Allgather(mine.data(), kLen, MPI_CHAR, all.data(), kLen, MPI_CHAR, MPI_COMM_WORLD));
  int bad = 0;
  std::string first;
  for (int r = 0; r < pi.world; ++r) {
    const char* p = &all[size_t(r) * kLen];
    if (!*p) continue;
    if (bad++ == 0) first = p;
  }
  if (bad > 0)
    user_error(bad == 1 ? "dist: " + first
                        : fmt::format("dist: {} (and {} more rank(s) without a GPU)", first, bad - 1));
#if DELTATRON_HAVE_CUDA
  pi.gpu = pi.local_rank % count;  // == local_rank unless ranks share GPUs (checked above)
  DT_CUDA_CHECK(cudaSetDevice(pi.gpu));
  return pi.gpu;
#else
  return -1;  // unreachable: user_error above
#endif
}

void mpi_check_failed(int code, const char* expr, const char* func, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) std::snprintf(text, sizeof(text), "unknown MPI error");
  fatal("MPI error", expr, func, file, line, fmt::format("MPI error {} '{}'", code, text));
}

}  // namespace dt::dist
