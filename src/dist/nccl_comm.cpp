// The NCCL backend: CUDA tensors on this rank's device, collectives ordered on the caller's
// stream (no host sync). Each communicator is made by ncclCommInitRank with a unique id that
// group rank 0 creates and broadcasts over the group's MPI communicator.
// Data-movement collectives (all_gather, all_to_all, broadcast) move bytes, so every dtype
// works; reductions need an NCCL element type (not u16).
#include <mpi.h>

#include "comm_impl.h"
#include "deltatron/core/check.h"
#include "deltatron/dist/check.h"

#if DELTATRON_HAVE_CUDA
#include <nccl.h>
#include <nvtx3/nvToolsExt.h>

#include "core/cuda_check.h"
#endif

namespace dt::dist {

#if DELTATRON_HAVE_CUDA

void nccl_check_failed(int code, const char* expr, const char* func, const char* file, int line) {
  const char* last = ncclGetLastError(nullptr);
  fatal("NCCL error", expr, func, file, line,
        fmt::format("NCCL error {} '{}'  last: {}", code, ncclGetErrorString(static_cast<ncclResult_t>(code)),
                    last && *last ? last : "<none>"));
}

namespace {

using namespace detail;

ncclDataType_t nccl_type(DType t, const char* op) {
  check_nccl_reducible(t, op);
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8: return ncclUint8;
    case DType::u16: break;  // refused by check_nccl_reducible above
  }
  DT_FAIL("{}: no NCCL type for {}", op, dtype_name(t));
}

// An NVTX range around each collective, so that nsys timelines show the communication.
struct NvtxRange {
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::max ? ncclMax : ncclSum; }


class NcclComm final : public Communicator {
 public:
  explicit NcclComm(MPI_Comm group) : mpi_(group) {
    DT_MPI_CHECK(MPI_Comm_rank(mpi_, &rank_));
    DT_MPI_CHECK(MPI_Comm_size(mpi_, &size_));
    members_ = group_members(mpi_);
    const ProcessInfo& pi = process_info();
    DT_CHECK(pi.gpu >= 0,
             "nccl communicator: rank {} has no selected GPU; call dist::select_cuda_device() before creating NCCL "
             "communicators",
             pi.rank);
    device_ = pi.gpu;
    DT_CUDA_CHECK(cudaSetDevice(device_));
    ncclUniqueId id{};
    if (rank_ == 0) DT_NCCL_CHECK(ncclGetUniqueId(&id));
    DT_MPI_CHECK(MPI_Bcast(&id, int(sizeof(id)), MPI_BYTE, 0, mpi_));
    DT_NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_));
    scratch_ = Tensor::zeros(Shape{1}, DType::f32, Device::cuda(device_));
  }
  ~NcclComm() override {
    if (comm_) ncclCommDestroy(comm_);
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin) MPI_Comm_free(&mpi_);
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  Backend backend() const override { return Backend::nccl; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<int>& members() const override { return members_; }

  void all_reduce(const TensorView& x, ReduceOp op, Stream s) override {
    NvtxRange range("nccl all_reduce");
    check_operand(x, "all_reduce", "x", dev());
    if (x.numel() == 0) return;
    DT_NCCL_CHECK(ncclAllReduce(x.data, x.data, size_t(x.numel()), nccl_type(x.dtype, "all_reduce"), nccl_op(op),
                                comm_, cuda_stream(s)));
  }

  void all_gather(const TensorView& out, const TensorView& in, Stream s) override {
    NvtxRange range("nccl all_gather");
    check_operand(out, "all_gather", "out", dev());
    check_operand(in, "all_gather", "in", dev());
    check_same_dtype(out, in, "all_gather");
    const int64_t n = in.numel();
    DT_CHECK(out.numel() == size_ * n, "all_gather: out has {} elements, but size {} x in {} = {} are needed",
             out.numel(), size_, n, size_ * n);
    if (n == 0) return;
    if (in.data != out.at_offset(rank_ * n)) check_disjoint(out, in, "all_gather");  // else NCCL's in-place form
    DT_NCCL_CHECK(ncclAllGather(in.data, out.data, in.nbytes(), ncclInt8, comm_, cuda_stream(s)));
  }

  void reduce_scatter(const TensorView& out, const TensorView& in, ReduceOp op, Stream s) override {
    NvtxRange range("nccl reduce_scatter");
    check_operand(out, "reduce_scatter", "out", dev());
    check_operand(in, "reduce_scatter", "in", dev());
    check_same_dtype(out, in, "reduce_scatter");
    const int64_t n = out.numel();
    DT_CHECK(in.numel() == size_ * n, "reduce_scatter: in has {} elements, but size {} x out {} = {} are needed",
             in.numel(), size_, n, size_ * n);
    if (n == 0) return;
    if (out.data != in.at_offset(rank_ * n)) check_disjoint(out, in, "reduce_scatter");
    DT_NCCL_CHECK(ncclReduceScatter(in.data, out.data, size_t(n), nccl_type(in.dtype, "reduce_scatter"),
                                    nccl_op(op), comm_, cuda_stream(s)));
  }

  void all_to_all(const TensorView& out, const TensorView& in, Stream s) override {
    NvtxRange range("nccl all_to_all");
    check_operand(out, "all_to_all", "out", dev());
    check_operand(in, "all_to_all", "in", dev());
    check_same_dtype(out, in, "all_to_all");
    DT_CHECK(out.numel() == in.numel() && in.numel() % size_ == 0,
             "all_to_all: in ({} elements) and out ({} elements) must be equal and divisible by the group size {}",
             in.numel(), out.numel(), size_);
    if (in.numel() == 0) return;
    check_disjoint(out, in, "all_to_all");
    const size_t block = in.nbytes() / size_t(size_);
    const auto* src = static_cast<const char*>(in.data);
    auto* dst = static_cast<char*>(out.data);
    DT_NCCL_CHECK(ncclGroupStart());
    for (int peer = 0; peer < size_; ++peer) {
      DT_NCCL_CHECK(ncclSend(src + peer * block, block, ncclInt8, peer, comm_, cuda_stream(s)));
      DT_NCCL_CHECK(ncclRecv(dst + peer * block, block, ncclInt8, peer, comm_, cuda_stream(s)));
    }
    DT_NCCL_CHECK(ncclGroupEnd());
  }

  void broadcast(const TensorView& x, int root, Stream s) override {
    NvtxRange range("nccl broadcast");
    check_operand(x, "broadcast", "x", dev());
    DT_CHECK(root >= 0 && root < size_, "broadcast: root {} is not a rank of this group of size {}", root, size_);
    if (x.numel() == 0) return;
    DT_NCCL_CHECK(ncclBroadcast(x.data, x.data, x.nbytes(), ncclInt8, root, comm_, cuda_stream(s)));
  }

  void barrier(Stream s) override {
    NvtxRange range("nccl barrier");
    DT_NCCL_CHECK(ncclAllReduce(scratch_.data(), scratch_.data(), 1, ncclFloat32, ncclSum, comm_, cuda_stream(s)));
  }

 private:
  Device dev() const { return Device::cuda(device_); }

  MPI_Comm mpi_;
  ncclComm_t comm_ = nullptr;
  int rank_ = 0, size_ = 1, device_ = -1;
  std::vector<int> members_;
  Tensor scratch_;  // [1] f32, the barrier's all-reduce operand
};

}  // namespace

namespace detail {
std::unique_ptr<Communicator> make_nccl_comm(MPI_Comm group) { return std::make_unique<NcclComm>(group); }
}  // namespace detail

#else  // !DELTATRON_HAVE_CUDA

namespace detail {
std::unique_ptr<Communicator> make_nccl_comm(MPI_Comm group) { cuda_backend_unavailable(group, "nccl"); }
}  // namespace detail

#endif

}  // namespace dt::dist
