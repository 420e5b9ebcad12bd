// The staged backend: CUDA tensors through the MPI backend by way of host buffers. Each collective
// waits for the caller's stream, copies its operands to the host, runs the MPI collective there
// and copies the result back before it returns, so it is blocking (as MPI's) and slow: it exists
// for ranks that share a GPU, which NCCL refuses ("Duplicate GPU detected"), so that the
// multi-rank CUDA paths (TP, SP, CP layers, the trainer) run and are tested on one GPU
// (DT_COMM_STAGED=1 selects it wherever dist::cuda_backend() picks the CUDA backend).
// The arithmetic is the MPI backend's: bf16 / f16 sums combine pairwise in fp32, as NCCL's ring
// does, in MPI's order.
#include <mpi.h>

#include "comm_impl.h"
#include "deltatron/core/check.h"
#include "deltatron/dist/check.h"

#if DELTATRON_HAVE_CUDA
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#endif

namespace dt::dist {

#if DELTATRON_HAVE_CUDA

namespace {

using namespace detail;

class StagedComm final : public Communicator {
 public:
  explicit StagedComm(MPI_Comm group) {
    const ProcessInfo& pi = process_info();
    DT_CHECK(pi.gpu >= 0,
             "staged communicator: rank {} has no selected GPU; call dist::select_cuda_device() before creating "
             "communicators for CUDA tensors",
             pi.rank);
    device_ = pi.gpu;
    host_ = make_mpi_comm(group);
  }

  Backend backend() const override { return Backend::staged; }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const std::vector<int>& members() const override { return host_->members(); }

  void all_reduce(const TensorView& x, ReduceOp op, Stream s) override {
    check_operand(x, "all_reduce", "x", dev());
    Tensor h = to_host(x, s);
    host_->all_reduce(h, op);
    from_host(x, h, s);
  }

  void all_gather(const TensorView& out, const TensorView& in, Stream s) override {
    check_operand(out, "all_gather", "out", dev());
    check_operand(in, "all_gather", "in", dev());
    // in may be this rank's block of out (the in-place form): its bytes are on the host before
    // out is written.
    Tensor hin = to_host(in, s), hout = Tensor::empty(out.shape, out.dtype);
    host_->all_gather(hout, hin);
    from_host(out, hout, s);
  }

  void reduce_scatter(const TensorView& out, const TensorView& in, ReduceOp op, Stream s) override {
    check_operand(out, "reduce_scatter", "out", dev());
    check_operand(in, "reduce_scatter", "in", dev());
    Tensor hin = to_host(in, s), hout = Tensor::empty(out.shape, out.dtype);
    host_->reduce_scatter(hout, hin, op);
    from_host(out, hout, s);
  }

  void all_to_all(const TensorView& out, const TensorView& in, Stream s) override {
    check_operand(out, "all_to_all", "out", dev());
    check_operand(in, "all_to_all", "in", dev());
    if (in.numel() > 0) check_disjoint(out, in, "all_to_all");  // as NCCL's: no in-place form
    Tensor hin = to_host(in, s), hout = Tensor::empty(out.shape, out.dtype);
    host_->all_to_all(hout, hin);
    from_host(out, hout, s);
  }

  void broadcast(const TensorView& x, int root, Stream s) override {
    check_operand(x, "broadcast", "x", dev());
    Tensor h = to_host(x, s);
    host_->broadcast(h, root);
    from_host(x, h, s);
  }

  void barrier(Stream s) override {
    DT_CUDA_CHECK(cudaStreamSynchronize(cuda_stream(s)));
    host_->barrier();
  }

 private:
  Device dev() const { return Device::cuda(device_); }
  // x's bytes in a host tensor of its shape, once the work before this call on s has finished.
  static Tensor to_host(const TensorView& x, Stream s) {
    Tensor h = Tensor::empty(x.shape, x.dtype);
    if (x.numel() > 0)
      DT_CUDA_CHECK(cudaMemcpyAsync(h.data(), x.data, x.nbytes(), cudaMemcpyDeviceToHost, cuda_stream(s)));
    DT_CUDA_CHECK(cudaStreamSynchronize(cuda_stream(s)));
    return h;
  }
  // h's bytes into x, complete on return (h is freed by the caller).
  static void from_host(const TensorView& x, const Tensor& h, Stream s) {
    if (x.numel() == 0) return;
    DT_CUDA_CHECK(cudaMemcpyAsync(x.data, h.data(), x.nbytes(), cudaMemcpyHostToDevice, cuda_stream(s)));
    DT_CUDA_CHECK(cudaStreamSynchronize(cuda_stream(s)));
  }

  int device_ = -1;
  std::unique_ptr<Communicator> host_;  // the MPI communicator of the same group
};

}  // namespace

namespace detail {
std::unique_ptr<Communicator> make_staged_comm(MPI_Comm group) { return std::make_unique<StagedComm>(group); }
}  // namespace detail

#else  // !DELTATRON_HAVE_CUDA

namespace detail {
std::unique_ptr<Communicator> make_staged_comm(MPI_Comm group) {
  MPI_Comm_free(&group);
  user_error("dist: backend staged moves CUDA tensors, but deltatron was built without CUDA; use backend mpi or "
             "rebuild with CUDA on");
}
}  // namespace detail

#endif

}  // namespace dt::dist
