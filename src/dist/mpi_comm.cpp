// The MPI backend (CPU tensors; what CI and reference runs use) and the backend-independent
// pieces: split / make_world and the argument checks.
//
// MPI has no bf16/f16 types: those travel as 16-bit words and reduce through user-defined
// MPI_Ops that combine two values in fp32 and round back to nearest even (core/numeric.h),
// so every pairwise combination rounds once, as a ring reduction on the GPU does.
#include <mpi.h>

#include <climits>
#include <cmath>
#include <cstring>

#include "comm_impl.h"
#include "deltatron/core/check.h"
#include "deltatron/core/numeric.h"
#include "deltatron/dist/check.h"

namespace dt::dist {
namespace detail {

void check_operand(const TensorView& x, const char* op, const char* what, Device expect) {
  DT_CHECK(x.device == expect, "{}: {} is {}, but this communicator works on {} tensors", op, what, x.str(),
           expect.str());
  DT_CHECK(x.is_contiguous(), "{}: {} must be contiguous, got {}", op, what, x.str());
  DT_CHECK(x.data != nullptr || x.numel() == 0, "{}: {} has no data ({})", op, what, x.str());
}

void check_same_dtype(const TensorView& a, const TensorView& b, const char* op) {
  DT_CHECK(a.dtype == b.dtype, "{}: out is {} but in is {}; both must have one dtype", op, dtype_name(a.dtype),
           dtype_name(b.dtype));
}

void check_disjoint(const TensorView& a, const TensorView& b, const char* op) {
  auto pa = reinterpret_cast<uintptr_t>(a.data), pb = reinterpret_cast<uintptr_t>(b.data);
  bool disjoint = pa + a.nbytes() <= pb || pb + b.nbytes() <= pa;
  DT_CHECK(disjoint, "{}: out {} and in {} overlap; use separate buffers", op, a.str(), b.str());
}

std::vector<int> group_members(MPI_Comm group) {
  int size = 0, me = 0;
  DT_MPI_CHECK(MPI_Comm_size(group, &size));
  DT_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &me));
  std::vector<int> members(size);
  DT_MPI_CHECK(MPI_Allgather(&me, 1, MPI_INT, members.data(), 1, MPI_INT, group));
  return members;
}

}  // namespace detail

namespace {

using namespace detail;

bool mpi_live() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

float max_or_nan(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return NAN;  // propagate, so a NaN is never hidden by max
  return a > b ? a : b;
}

// MPI_User_function for 16-bit floats: inout[i] = in[i] (+|max) inout[i], in fp32.
template <float (*Load)(uint16_t), uint16_t (*Store)(float), bool Max>
void half_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    float x = Load(a[i]), y = Load(b[i]);
    b[i] = Store(Max ? max_or_nan(x, y) : x + y);
  }
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::bf16:
    case DType::f16:
    case DType::u16: return MPI_UINT16_T;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
  }
  DT_FAIL("mpi backend: unhandled dtype {}", int(t));
}

int as_count(int64_t n, const char* op) {
  DT_CHECK(n <= INT_MAX, "{}: {} elements exceed MPI's int count limit {}; split the buffer", op, n, INT_MAX);
  return int(n);
}

class MpiComm final : public Communicator {
 public:
  explicit MpiComm(MPI_Comm group) : comm_(group) {
    DT_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    DT_MPI_CHECK(MPI_Comm_size(comm_, &size_));
    members_ = group_members(comm_);
    DT_MPI_CHECK(MPI_Op_create(&half_reduce<bf16_bits_to_f32, f32_to_bf16_bits, false>, 1, &bf16_sum_));
    DT_MPI_CHECK(MPI_Op_create(&half_reduce<bf16_bits_to_f32, f32_to_bf16_bits, true>, 1, &bf16_max_));
    DT_MPI_CHECK(MPI_Op_create(&half_reduce<f16_bits_to_f32, f32_to_f16_bits, false>, 1, &f16_sum_));
    DT_MPI_CHECK(MPI_Op_create(&half_reduce<f16_bits_to_f32, f32_to_f16_bits, true>, 1, &f16_max_));
  }
  ~MpiComm() override {
    if (!mpi_live()) return;  // MPI_Finalize already released everything
    for (MPI_Op* op : {&bf16_sum_, &bf16_max_, &f16_sum_, &f16_max_}) MPI_Op_free(op);
    MPI_Comm_free(&comm_);
  }
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  Backend backend() const override { return Backend::mpi; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<int>& members() const override { return members_; }

  void all_reduce(const TensorView& x, ReduceOp op, Stream) override {
    check_operand(x, "all_reduce", "x", Device::cpu());
    if (x.numel() == 0) return;
    DT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, x.data, as_count(x.numel(), "all_reduce"), mpi_type(x.dtype),
                               reduce_op(x.dtype, op), comm_));
  }

  void all_gather(const TensorView& out, const TensorView& in, Stream) override {
    check_operand(out, "all_gather", "out", Device::cpu());
    check_operand(in, "all_gather", "in", Device::cpu());
    check_same_dtype(out, in, "all_gather");
    const int64_t n = in.numel();
    DT_CHECK(out.numel() == size_ * n, "all_gather: out has {} elements, but size {} x in {} = {} are needed",
             out.numel(), size_, n, size_ * n);
    if (n == 0) return;
    const int c = as_count(n, "all_gather");
    const MPI_Datatype t = mpi_type(in.dtype);
    if (in.data == out.at_offset(rank_ * n)) {  // in place: in is this rank's block of out
      DT_MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, c, t, out.data, c, t, comm_));
      return;
    }
    check_disjoint(out, in, "all_gather");
    DT_MPI_CHECK(MPI_Allgather(in.data, c, t, out.data, c, t, comm_));
  }

  void reduce_scatter(const TensorView& out, const TensorView& in, ReduceOp op, Stream) override {
    check_operand(out, "reduce_scatter", "out", Device::cpu());
    check_operand(in, "reduce_scatter", "in", Device::cpu());
    check_same_dtype(out, in, "reduce_scatter");
    const int64_t n = out.numel();
    DT_CHECK(in.numel() == size_ * n, "reduce_scatter: in has {} elements, but size {} x out {} = {} are needed",
             in.numel(), size_, n, size_ * n);
    if (n == 0) return;
    const int c = as_count(n, "reduce_scatter");
    const MPI_Datatype t = mpi_type(in.dtype);
    const MPI_Op mop = reduce_op(in.dtype, op);
    if (out.data == in.at_offset(rank_ * n)) {
      // In place as NCCL defines it (out is this rank's block of in); MPI's MPI_IN_PLACE
      // puts the result at the start instead, so go through a scratch block.
      Tensor tmp = Tensor::empty(Shape{n}, in.dtype);
      DT_MPI_CHECK(MPI_Reduce_scatter_block(in.data, tmp.data(), c, t, mop, comm_));
      std::memcpy(out.data, tmp.data(), out.nbytes());
      return;
    }
    check_disjoint(out, in, "reduce_scatter");
    DT_MPI_CHECK(MPI_Reduce_scatter_block(in.data, out.data, c, t, mop, comm_));
  }

  void all_to_all(const TensorView& out, const TensorView& in, Stream) override {
    check_operand(out, "all_to_all", "out", Device::cpu());
    check_operand(in, "all_to_all", "in", Device::cpu());
    check_same_dtype(out, in, "all_to_all");
    DT_CHECK(out.numel() == in.numel() && in.numel() % size_ == 0,
             "all_to_all: in ({} elements) and out ({} elements) must be equal and divisible by the group size {}",
             in.numel(), out.numel(), size_);
    if (in.numel() == 0) return;
    check_disjoint(out, in, "all_to_all");
    const int c = as_count(in.numel() / size_, "all_to_all");
    const MPI_Datatype t = mpi_type(in.dtype);
    DT_MPI_CHECK(MPI_Alltoall(in.data, c, t, out.data, c, t, comm_));
  }

  void broadcast(const TensorView& x, int root, Stream) override {
    check_operand(x, "broadcast", "x", Device::cpu());
    DT_CHECK(root >= 0 && root < size_, "broadcast: root {} is not a rank of this group of size {}", root, size_);
    if (x.numel() == 0) return;
    DT_MPI_CHECK(MPI_Bcast(x.data, as_count(x.numel(), "broadcast"), mpi_type(x.dtype), root, comm_));
  }

  void barrier(Stream) override { DT_MPI_CHECK(MPI_Barrier(comm_)); }

 private:
  MPI_Op reduce_op(DType t, ReduceOp op) const {
    const bool mx = op == ReduceOp::max;
    switch (t) {
      case DType::bf16: return mx ? bf16_max_ : bf16_sum_;
      case DType::f16: return mx ? f16_max_ : f16_sum_;
      default: return mx ? MPI_MAX : MPI_SUM;
    }
  }

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::vector<int> members_;
  MPI_Op bf16_sum_ = MPI_OP_NULL, bf16_max_ = MPI_OP_NULL, f16_sum_ = MPI_OP_NULL, f16_max_ = MPI_OP_NULL;
};

std::unique_ptr<Communicator> make(Backend b, MPI_Comm group) {
  switch (b) {
    case Backend::mpi: return make_mpi_comm(group);
    case Backend::nccl: return make_nccl_comm(group);
    case Backend::staged: return make_staged_comm(group);
  }
  DT_FAIL("dist: unknown backend {}", int(b));
}

}  // namespace

namespace detail {
std::unique_ptr<Communicator> make_mpi_comm(MPI_Comm group) { return std::make_unique<MpiComm>(group); }

void check_nccl_reducible(DType t, const char* op) {
  DT_CHECK(t != DType::u16, "{}: NCCL cannot reduce {} tensors (supported: f32, bf16, f16, i32, i64, u8)", op,
           dtype_name(t));
}

void cuda_backend_unavailable(MPI_Comm group, const char* backend) {
  MPI_Comm_free(&group);
  user_error(fmt::format("dist: backend {} moves CUDA tensors, but deltatron was built without CUDA; use backend mpi "
                         "or rebuild with CUDA on",
                         backend));
}
}  // namespace detail

std::unique_ptr<Communicator> split(Backend b, int color, int key) {
  DT_CHECK(initialized(), "dist::split: call dist::init() first");
  DT_CHECK(color >= 0, "dist::split: color {} is negative; every rank must belong to a group", color);
  MPI_Comm group = MPI_COMM_NULL;
  DT_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, color, key, &group));
  return make(b, group);
}

std::unique_ptr<Communicator> make_world(Backend b) {
  DT_CHECK(initialized(), "dist::make_world: call dist::init() first");
  MPI_Comm group = MPI_COMM_NULL;
  // A duplicate, so that this communicator's traffic never matches other users of the world.
  DT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &group));
  return make(b, group);
}

std::string first_message(Communicator& c, const std::string& mine) {
  DT_CHECK(c.backend() == Backend::mpi, "dist::first_message: needs a host (MPI) communicator");
  Tensor len = Tensor::empty(Shape{1}, DType::i64);
  *len.ptr<int64_t>() = int64_t(mine.size());
  c.all_reduce(len, ReduceOp::max);
  const int64_t L = *len.ptr<int64_t>();
  if (L == 0) return "";
  Tensor in = Tensor::zeros(Shape{L}, DType::u8), all = Tensor::empty(Shape{L * c.size()}, DType::u8);
  std::memcpy(in.data(), mine.data(), mine.size());
  c.all_gather(all, in);
  int others = 0;
  std::string first;
  for (int r = 0; r < c.size(); ++r) {
    const char* p = static_cast<const char*>(all.data()) + r * L;
    std::string s(p, strnlen(p, size_t(L)));
    if (s.empty()) continue;
    if (first.empty())
      first = s;
    else if (s != first)
      ++others;
  }
  if (others) first += fmt::format(" (and {} other rank(s) report other errors)", others);
  return first;
}

std::string from_rank0(Communicator& c, const std::string& s) { return first_message(c, c.rank() == 0 ? s : ""); }

}  // namespace dt::dist
