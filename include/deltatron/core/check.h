// Fatal checks. Every failure prints rank, host, pid, the failing statement, function,
// file:line and a message, then aborts every rank (MPI_Abort when MPI is up). Checks stay
// on in release builds.
#pragma once
#include <cstdio>
#include <string>

#include <fmt/format.h>

namespace dt {

[[noreturn]] void fatal(const char* kind, const char* expr, const char* func, const char* file, int line,
                        const std::string& msg);

// Process identity used in error lines and log prefixes; set by dist::init (defaults: rank 0).
struct ProcessInfo {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  int gpu = -1;
  std::string host;
};
ProcessInfo& process_info();

// An input error (bad config, bad world size, bad dtype name): one clear line, no stack of
// internals. every_rank_knows = true: the error is detected identically on every rank, so
// rank 0 prints it and every rank exits with status 1 after MPI_Finalize. false: only this
// rank knows (a rank without a GPU): it prints with its rank and host and aborts the job
// (MPI_Abort), so every rank exits non-zero.
[[noreturn]] void user_error(const std::string& msg, bool every_rank_knows = true);

namespace detail {
// nvcc cannot evaluate fmt's consteval format-string checks, so CUDA translation units
// format at run time; host code keeps the compile-time checks.
template <typename... A>
std::string format_rt(fmt::string_view f, const A&... a) {
  return fmt::vformat(f, fmt::make_format_args(a...));
}
}  // namespace detail
}  // namespace dt

#if defined(__CUDACC__)
#define DT_FORMAT(...) ::dt::detail::format_rt(__VA_ARGS__)
#else
#define DT_FORMAT(...) ::fmt::format(__VA_ARGS__)
#endif

#define DT_CHECK(cond, ...)                                                                   \
  do {                                                                                        \
    if (!(cond)) [[unlikely]]                                                                 \
      ::dt::fatal("check failed", #cond, __func__, __FILE__, __LINE__, DT_FORMAT(__VA_ARGS__)); \
  } while (0)

#define DT_FAIL(...) ::dt::fatal("error", "", __func__, __FILE__, __LINE__, DT_FORMAT(__VA_ARGS__))
