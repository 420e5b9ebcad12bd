// Process bootstrap and communicators.
//
// dist::init() starts MPI (works under mpirun or as one plain process), fills
// core's ProcessInfo (rank, world, local rank, host) and sets up logging.
// A Communicator is a group of ranks with collectives on tensors of one backend:
//   MPI  - CPU tensors (the reference backend CI runs),
//   NCCL - CUDA tensors, ordered on an explicit stream; the unique id is broadcast over
//          the group's MPI communicator.
//   staged - CUDA tensors through MPI by way of host buffers, for ranks that share a GPU (which
//          NCCL refuses): the multi-rank CUDA paths on a one-GPU machine. Slow; for tests.
// Collectives are blocking for MPI and staged, and stream-ordered for NCCL (no host sync).
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "deltatron/core/tensor.h"

namespace dt::dist {

enum class ReduceOp { sum, max };
enum class Backend { mpi, nccl, staged };
const char* backend_name(Backend b);
// The backend named `name` ("mpi", "nccl", "staged"; backend_name's inverse), or nullopt.
std::optional<Backend> backend_from_name(std::string_view name);

struct InitOptions {
  bool log_all_ranks = false;
};
// Idempotent. Registers MPI_Finalize at exit.
void init(int* argc, char*** argv, const InitOptions& o = {});
void finalize();
bool initialized();
int world_rank();
int world_size();
int local_rank();   // from MPI_COMM_TYPE_SHARED, falling back to OMPI_COMM_WORLD_LOCAL_RANK
int local_size();

// The backend for CUDA tensors: nccl, or staged when DT_COMM_STAGED=1 (read at every call).
Backend cuda_backend();

// Selects the CUDA device of this rank (local rank) and checks that it exists: a rank
// without a GPU is a clear error (dt::user_error) naming the host, rank and device count.
// For the staged backend (DT_COMM_STAGED=1 by default) ranks may share GPUs: local rank modulo
// the node's device count.
int select_cuda_device(Backend b = cuda_backend());

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual Backend backend() const = 0;
  virtual int rank() const = 0;  // rank inside this group
  virtual int size() const = 0;
  // Global ranks of the members, in group-rank order.
  virtual const std::vector<int>& members() const = 0;

  // In place. x: any shape, contiguous.
  virtual void all_reduce(const TensorView& x, ReduceOp op, Stream s = {}) = 0;
  // out = concat over ranks of in along dim 0: out.numel() == size() * in.numel().
  virtual void all_gather(const TensorView& out, const TensorView& in, Stream s = {}) = 0;
  // out = (reduce over ranks of in)[chunk rank] along dim 0: in.numel() == size() * out.numel().
  virtual void reduce_scatter(const TensorView& out, const TensorView& in, ReduceOp op, Stream s = {}) = 0;
  // Equal splits: in and out hold size() contiguous blocks; block j of in goes to rank j,
  // block i of out comes from rank i.
  virtual void all_to_all(const TensorView& out, const TensorView& in, Stream s = {}) = 0;
  virtual void broadcast(const TensorView& x, int root, Stream s = {}) = 0;
  // Host barrier (MPI) / stream-ordered barrier (NCCL: a 1-element all-reduce).
  virtual void barrier(Stream s = {}) = 0;
};

// Collective over MPI_COMM_WORLD: every rank calls it; ranks with the same color form one
// group, ordered by key (MPI_Comm_split semantics). NCCL: one ncclCommInitRank per group,
// on the device selected before the call.
std::unique_ptr<Communicator> split(Backend b, int color, int key);
std::unique_ptr<Communicator> make_world(Backend b);

// Collective over a host (MPI backend) communicator: the first non-empty string in rank order,
// the same on every rank ("" when all are empty), so that one rank's error reaches the rank that
// prints it. "(and N other rank(s) report other errors)" is appended when others differ.
std::string first_message(Communicator& c, const std::string& mine);
// Collective, as first_message: the string of the communicator's rank 0, on every rank (what a
// check that only rank 0 makes, such as one on a file it alone writes, hands the others).
std::string from_rank0(Communicator& c, const std::string& s);

}  // namespace dt::dist
