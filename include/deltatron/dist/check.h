// DT_MPI_CHECK and DT_NCCL_CHECK: a failing MPI or NCCL call reports rank, host, pid, GPU,
// the call, function and file:line (plus the library's own error text) through dt::fatal,
// which then aborts every rank with MPI_Abort(MPI_COMM_WORLD, 1).
//
// Include <mpi.h> / <nccl.h> before using the macros; this header stays free of both so
// that it can be included anywhere. DT_MPI_CHECK only sees errors because dist::init sets
// MPI_ERRORS_RETURN on MPI_COMM_WORLD (communicators split from it inherit the handler).
#pragma once

namespace dt::dist {

// `code` is the MPI error code; the message carries MPI_Error_string(code).
[[noreturn]] void mpi_check_failed(int code, const char* expr, const char* func, const char* file, int line);
// `code` is the ncclResult_t; the message carries ncclGetErrorString(code) and
// ncclGetLastError(). Defined only in builds with CUDA (DELTATRON_HAVE_CUDA=1).
[[noreturn]] void nccl_check_failed(int code, const char* expr, const char* func, const char* file, int line);

}  // namespace dt::dist

#define DT_MPI_CHECK(call)                                                                    \
  do {                                                                                        \
    const int dt_mpi_rc_ = (call);                                                            \
    if (dt_mpi_rc_ != MPI_SUCCESS) [[unlikely]]                                               \
      ::dt::dist::mpi_check_failed(dt_mpi_rc_, #call, __func__, __FILE__, __LINE__);          \
  } while (0)

#define DT_NCCL_CHECK(call)                                                                   \
  do {                                                                                        \
    const ncclResult_t dt_nccl_rc_ = (call);                                                  \
    if (dt_nccl_rc_ != ncclSuccess) [[unlikely]]                                              \
      ::dt::dist::nccl_check_failed(static_cast<int>(dt_nccl_rc_), #call, __func__, __FILE__, __LINE__); \
  } while (0)
