// The staged backend: CUDA tensors through the MPI backend by way of host buffers. Each collective
// waits for the caller's stream, copies its operands to the host, runs the MPI collective there
// and copies the result back before it returns, so it is blocking (as MPI's) and slow: it exists
// for ranks that share a GPU, which NCCL refuses ("Duplicate GPU detected"), so that the
// multi-rank CUDA paths (TP, SP, CP layers, the trainer) run and are tested on one GPU
// (DT_COMM_STAGED=1 selects it wherever dist::cuda_backend() picks the CUDA backend).
// The arithmetic is the MPI backend's: bf16 / f16 sums combine pairwise in fp32, as NCCL's ring
// does, in MPI's order (and a max keeps NaN, where NCCL's may not). The argument rules are NCCL's
// (reducible types, in-place forms), so that code passing here passes there. A group of one rank
// copies on the stream, with no host round trip, so it can be captured into a CUDA graph as NCCL's.
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
    check_nccl_reducible(x.dtype, "all_reduce");
    if (size() == 1) return;
    Tensor h = to_host(x, s, "all_reduce");
    host_->all_reduce(h, op);
    from_host(x, h, s);
  }

  void all_gather(const TensorView& out, const TensorView& in, Stream s) override {
    check_operand(out, "all_gather", "out", dev());
    check_operand(in, "all_gather", "in", dev());
    if (in.data != out.at_offset(int64_t(rank()) * in.numel())) check_disjoint(out, in, "all_gather");
    if (size() == 1) return copy_local(out, in, s, "all_gather");
    // in may be this rank's block of out (the in-place form): its bytes are on the host before
    // out is written.
    Tensor hin = to_host(in, s, "all_gather"), hout = Tensor::empty(out.shape, out.dtype);
    host_->all_gather(hout, hin);
    from_host(out, hout, s);
  }

  void reduce_scatter(const TensorView& out, const TensorView& in, ReduceOp op, Stream s) override {
    check_operand(out, "reduce_scatter", "out", dev());
    check_operand(in, "reduce_scatter", "in", dev());
    check_nccl_reducible(in.dtype, "reduce_scatter");
    if (out.data != in.at_offset(int64_t(rank()) * out.numel())) check_disjoint(out, in, "reduce_scatter");
    if (size() == 1) return copy_local(out, in, s, "reduce_scatter");
    Tensor hin = to_host(in, s, "reduce_scatter"), hout = Tensor::empty(out.shape, out.dtype);
    host_->reduce_scatter(hout, hin, op);
    from_host(out, hout, s);
  }

  void all_to_all(const TensorView& out, const TensorView& in, Stream s) override {
    check_operand(out, "all_to_all", "out", dev());
    check_operand(in, "all_to_all", "in", dev());
    if (in.numel() > 0) check_disjoint(out, in, "all_to_all");  // as NCCL's: no in-place form
    if (size() == 1) return copy_local(out, in, s, "all_to_all");
    Tensor hin = to_host(in, s, "all_to_all"), hout = Tensor::empty(out.shape, out.dtype);
    host_->all_to_all(hout, hin);
    from_host(out, hout, s);
  }

  void broadcast(const TensorView& x, int root, Stream s) override {
    check_operand(x, "broadcast", "x", dev());
    DT_CHECK(root >= 0 && root < size(), "broadcast: root {} is not a rank of this group of size {}", root, size());
    if (size() == 1) return;
    Tensor h = to_host(x, s, "broadcast");
    host_->broadcast(h, root);
    from_host(x, h, s);
  }

  void barrier(Stream s) override {
    if (size() == 1) return;
    no_capture(s, "barrier");
    DT_CUDA_CHECK(cudaStreamSynchronize(cuda_stream(s)));
    host_->barrier();
  }

 private:
  Device dev() const { return Device::cuda(device_); }
  // The host round trip synchronises the stream, which CUDA graph capture forbids (NCCL's
  // stream-ordered collectives can be captured): say so instead of invalidating the capture.
  static void no_capture(Stream s, const char* op) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    DT_CUDA_CHECK(cudaStreamIsCapturing(cuda_stream(s), &st));
    DT_CHECK(st == cudaStreamCaptureStatusNone,
             "{}: the staged backend (DT_COMM_STAGED=1) synchronises the stream, so it cannot run inside CUDA graph "
             "capture; capture with NCCL (unset DT_COMM_STAGED)",
             op);
  }
  // A group of one rank: the collective is a copy (none in place), on the stream, as NCCL's.
  static void copy_local(const TensorView& out, const TensorView& in, Stream s, const char* op) {
    check_same_dtype(out, in, op);
    DT_CHECK(out.numel() == in.numel(),
             "{}: out has {} elements and in has {}; in a group of one rank they must be equal", op, out.numel(),
             in.numel());
    if (out.data != in.data && in.numel() > 0)
      DT_CUDA_CHECK(cudaMemcpyAsync(out.data, in.data, in.nbytes(), cudaMemcpyDeviceToDevice, cuda_stream(s)));
  }
  // x's bytes in a host tensor of its shape, once the work before this call on s has finished.
  static Tensor to_host(const TensorView& x, Stream s, const char* op) {
    no_capture(s, op);
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
std::unique_ptr<Communicator> make_staged_comm(MPI_Comm group) { cuda_backend_unavailable(group, "staged"); }
}  // namespace detail

#endif

}  // namespace dt::dist
