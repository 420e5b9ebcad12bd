// Internal to src/dist: the backend factories and the argument checks both backends share.
#pragma once
#include <mpi.h>

#include <memory>
#include <vector>

#include "deltatron/dist/comm.h"

namespace dt::dist::detail {

// Both take ownership of `group` (freed by the communicator, unless MPI is finalized first).
std::unique_ptr<Communicator> make_mpi_comm(MPI_Comm group);
// Collective over `group`: rank 0 creates the NCCL unique id and broadcasts it over `group`.
std::unique_ptr<Communicator> make_nccl_comm(MPI_Comm group);
// CUDA tensors through an MPI communicator of `group` by way of host buffers (staged_comm.cpp).
std::unique_ptr<Communicator> make_staged_comm(MPI_Comm group);
// NCCL's reducible element types (not u16), checked by both CUDA backends so that code passing the
// staged backend passes NCCL: fails naming `op` and the dtype.
void check_nccl_reducible(DType t, const char* op);
// What the CUDA backends' factories do in a build without CUDA: free `group` and stop every rank.
[[noreturn]] void cuda_backend_unavailable(MPI_Comm group, const char* backend);

// World ranks of the members of `group`, in group-rank order (collective over `group`).
std::vector<int> group_members(MPI_Comm group);

// Argument checks shared by the backends; `op` names the collective in messages.
void check_operand(const TensorView& x, const char* op, const char* what, Device expect);
void check_same_dtype(const TensorView& a, const TensorView& b, const char* op);
// Fails unless [a, a+na) and [b, b+nb) are disjoint.
void check_disjoint(const TensorView& a, const TensorView& b, const char* op);

}  // namespace dt::dist::detail
