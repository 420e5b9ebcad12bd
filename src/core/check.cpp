#include "deltatron/core/check.h"

#include <mpi.h>
#include <unistd.h>

#include <cstdlib>

namespace dt {

ProcessInfo& process_info() {
  static ProcessInfo info = [] {
    ProcessInfo p;
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    p.host = host;
    return p;
  }();
  return info;
}

namespace {
bool mpi_up() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}
}  // namespace

[[noreturn]] void fatal(const char* kind, const char* expr, const char* func, const char* file, int line,
                        const std::string& msg) {
  const ProcessInfo& p = process_info();
  std::string where = p.gpu >= 0 ? fmt::format("rank {} ({} pid {} gpu {})", p.rank, p.host, getpid(), p.gpu)
                                 : fmt::format("rank {} ({} pid {})", p.rank, p.host, getpid());
  std::string line1 = fmt::format("[deltatron] FATAL {}: {}", where, msg);
  std::string line2 = expr && *expr ? fmt::format("  {} `{}` in {} ({}:{})", kind, expr, func, file, line)
                                    : fmt::format("  in {} ({}:{})", func, file, line);
  std::fprintf(stderr, "%s\n%s\n", line1.c_str(), line2.c_str());
  std::fflush(stderr);
  if (mpi_up()) MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

[[noreturn]] void user_error(const std::string& msg, bool every_rank_knows) {
  const ProcessInfo& p = process_info();
  if (!every_rank_knows) {
    std::fprintf(stderr, "[deltatron] error on rank %d (%s): %s\n", p.rank, p.host.c_str(), msg.c_str());
    std::fflush(stderr);
    if (mpi_up()) MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
  }
  if (p.rank == 0) {
    std::fprintf(stderr, "[deltatron] error: %s\n", msg.c_str());
    std::fflush(stderr);
  }
  if (mpi_up()) MPI_Finalize();
  std::_Exit(1);
}

}  // namespace dt
