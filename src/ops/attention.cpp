// Shape/dtype/device checks of the attention-layer ops (include/deltatron/ops/attention.h), then
// routing to the backend by the device of the first view (DT_ROUTE): the fp32 CPU reference or
// the CUDA kernels (src/ops/cuda/attention.cu), which also take bf16 and need 16-byte aligned rows.
#include <cstdint>
#include <initializer_list>
#include <string>

#include "ops/attention_backends.h"
#include "ops/op_checks.h"
#include "ops/route.h"

namespace dt::ops {
namespace {
using detail::check_rows;
using detail::check_vec;

// [rows, H, D] with unit inner stride, head stride D and row stride >= H*D, on `dev`, of dtype
// `dt` (f32, or bf16 on CUDA).
void check_heads(const TensorView& v, int64_t rows, int64_t H, int64_t D, Device dev, DType dt, const char* op,
                 const char* what) {
  const std::string label = fmt::format("{} {}", op, what);
  check_shape(v, Shape{rows, H, D}, label.c_str());
  DT_CHECK(v.dtype == dt && (dt == DType::f32 || (dt == DType::bf16 && dev.is_cuda())),
           "{}: dtype {} must be f32 (or bf16 on CUDA) and match the first view's {}", label, dtype_name(v.dtype),
           dtype_name(dt));
  DT_CHECK(v.device == dev, "{}: on {}, expected {} like the first view", label, v.device.str(), dev.str());
  DT_CHECK(D <= 1 || v.stride[2] == 1, "{}: needs a unit inner stride, got {}", label, v.str());
  DT_CHECK(H <= 1 || v.stride[1] == D, "{}: needs head stride {} (heads packed in a row), got {}", label, D, v.str());
  DT_CHECK(rows <= 1 || v.stride[0] >= H * D, "{}: row stride {} < row length {}", label, v.stride[0], H * D);
}
// The CUDA attention kernels move 16-byte vectors: rows and heads must start 16-byte aligned.
void check_vectors(const TensorView& v, const char* op, const char* what) {
  if (!v.device.is_cuda()) return;
  const int64_t per16 = 16 / int64_t(dtype_size(v.dtype));
  DT_CHECK(reinterpret_cast<uintptr_t>(v.data) % 16 == 0 && v.stride[0] % per16 == 0 && v.shape[2] % per16 == 0,
           "{} {}: CUDA attention needs 16-byte aligned rows and heads (head dim and row stride multiples of {}), "
           "got {}", op, what, per16, v.str());
}
void check_same_dtype(std::initializer_list<const TensorView*> vs, const char* op) {
  for (const TensorView* v : vs)
    DT_CHECK(v->dtype == (*vs.begin())->dtype, "{}: {} must have the dtype of {}", op, v->str(), (*vs.begin())->str());
}
void check_ndim(const TensorView& v, int n, const char* op, const char* what) {
  DT_CHECK(v.ndim() == n, "{} {}: expected a {}-D view, got {}", op, what, n, v.str());
}

void check_rope(const TensorView& y, const TensorView& x, const TensorView& pos, int64_t rd, double theta,
                const char* op) {
  check_ndim(x, 3, op, "x");
  const int64_t T = x.shape[0], H = x.shape[1], D = x.shape[2];
  check_heads(x, T, H, D, x.device, x.dtype, op, "x [T, H, D]");
  check_heads(y, T, H, D, x.device, x.dtype, op, "y [T, H, D]");
  check_vec(pos, T, DType::i32, x.device, op, "pos [T]");
  DT_CHECK(rd >= 0 && rd % 2 == 0 && rd <= D, "{}: rotary_dim={} must be even and in [0, head_dim={}]", op, rd, D);
  DT_CHECK(theta > 0, "{}: rope theta must be > 0, got {}", op, theta);
}

void check_attn(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& lse,
                const AttnVarlen& m, const char* op) {
  check_ndim(q, 3, op, "q");
  check_ndim(k, 3, op, "k");
  const int64_t Tq = q.shape[0], Hq = q.shape[1], D = q.shape[2], Tk = k.shape[0], Hkv = k.shape[1];
  const Device dev = q.device;
  check_heads(q, Tq, Hq, D, dev, q.dtype, op, "q [Tq, Hq, D]");
  check_heads(k, Tk, Hkv, D, dev, q.dtype, op, "k [Tk, Hkv, D]");
  check_heads(v, Tk, Hkv, D, dev, q.dtype, op, "v [Tk, Hkv, D]");
  DT_CHECK(dev.is_cpu() || D <= 256, "{}: head dim {} > 256 is not supported by the CUDA kernels", op, D);
  for (auto [x, what] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) check_vectors(*x, op, what);
  check_shape(lse, Shape{Tq, Hq}, "attention lse [Tq, Hq]");
  check_dtype(lse, DType::f32, "attention lse [Tq, Hq]");
  check_contiguous(lse, "attention lse [Tq, Hq]");
  DT_CHECK(lse.device == dev, "{} lse: on {}, expected {}", op, lse.device.str(), dev.str());
  DT_CHECK(Hkv > 0 && Hq % Hkv == 0, "{}: query heads {} must be a multiple of key/value heads {}", op, Hq, Hkv);
  DT_CHECK(m.cu_seqlens_padded.ndim() == 1 && m.cu_seqlens_padded.shape[0] >= 2,
           "{}: cu_seqlens_padded must be [N+1] with N >= 1, got {}", op, m.cu_seqlens_padded.str());
  const int64_t N1 = m.cu_seqlens_padded.shape[0];
  check_vec(m.cu_seqlens_padded, N1, DType::i32, dev, op, "cu_seqlens_padded [N+1]");
  check_vec(m.cu_seqlens, N1, DType::i32, dev, op, "cu_seqlens [N+1]");
  check_vec(m.q_pos, Tq, DType::i32, dev, op, "q_pos [Tq]");
  DT_CHECK(m.q_div >= 1 && Tq * m.q_div == Tk, "{}: query rows {} x q_div {} must equal key rows {}", op, Tq,
           m.q_div, Tk);
}

}  // namespace

void rope_fwd(const TensorView& y, const TensorView& x, const TensorView& pos, int64_t rotary_dim, double theta,
              Stream s) {
  constexpr const char* op = "rope_fwd";
  check_rope(y, x, pos, rotary_dim, theta, op);
  if (x.shape[0] == 0) return;
  DT_ROUTE(rope_fwd, x, y, x, pos, rotary_dim, theta, s);
}
void rope_bwd(const TensorView& dx, const TensorView& dy, const TensorView& pos, int64_t rotary_dim, double theta,
              Stream s) {
  constexpr const char* op = "rope_bwd";
  check_rope(dx, dy, pos, rotary_dim, theta, op);
  if (dy.shape[0] == 0) return;
  DT_ROUTE(rope_bwd, dy, dx, dy, pos, rotary_dim, theta, s);
}

void attention_fwd(const TensorView& o, const TensorView& lse, const TensorView& q, const TensorView& k,
                   const TensorView& v, const AttnVarlen& meta, float scale, Stream s) {
  constexpr const char* op = "attention_fwd";
  check_attn(q, k, v, lse, meta, op);
  check_heads(o, q.shape[0], q.shape[1], q.shape[2], q.device, q.dtype, op, "o [Tq, Hq, D]");
  check_vectors(o, op, "o");
  if (q.shape[0] == 0) return;
#if DELTATRON_HAVE_CUDA
  if (meta.backend != AttnBackend::native && q.device.is_cuda())  // cudnn, cudnn_fwd
    return cuda::attention_fwd_cudnn(o, lse, q, k, v, meta, scale, s);
#endif
  DT_ROUTE(attention_fwd, q, o, lse, q, k, v, meta, scale, s);
}
void attention_bwd(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& d_o,
                   const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                   const TensorView& lse, const AttnVarlen& meta, float scale, Stream s) {
  constexpr const char* op = "attention_bwd";
  check_attn(q, k, v, lse, meta, op);
  const int64_t Tq = q.shape[0], Hq = q.shape[1], D = q.shape[2], Tk = k.shape[0], Hkv = k.shape[1];
  const Device dev = q.device;
  const DType dt = q.dtype;
  check_heads(o, Tq, Hq, D, dev, dt, op, "o [Tq, Hq, D]");
  check_heads(d_o, Tq, Hq, D, dev, dt, op, "do [Tq, Hq, D]");
  check_heads(dq, Tq, Hq, D, dev, dt, op, "dq [Tq, Hq, D]");
  check_heads(dk, Tk, Hkv, D, dev, dt, op, "dk [Tk, Hkv, D]");
  check_heads(dv, Tk, Hkv, D, dev, dt, op, "dv [Tk, Hkv, D]");
  for (auto [x, what] : {std::pair{&o, "o"}, {&d_o, "do"}, {&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}})
    check_vectors(*x, op, what);
  if (Tq == 0) return;
#if DELTATRON_HAVE_CUDA
  if (meta.backend == AttnBackend::cudnn && q.device.is_cuda())  // cudnn_fwd: the native backward
    return cuda::attention_bwd_cudnn(dq, dk, dv, d_o, q, k, v, o, lse, meta, scale, s);
#endif
  DT_ROUTE(attention_bwd, q, dq, dk, dv, d_o, q, k, v, o, lse, meta, scale, s);
}

void sigmoid_gate_fwd(const TensorView& y, const TensorView& o, const TensorView& g, Stream s) {
  constexpr const char* op = "sigmoid_gate_fwd";
  check_ndim(o, 2, op, "o");
  const int64_t R = o.shape[0], D = o.shape[1];
  for (auto [v, what] : {std::pair{&y, "y [R, D]"}, {&o, "o [R, D]"}, {&g, "g [R, D]"}})
    check_rows(*v, R, D, o.device, op, what, true);
  check_same_dtype({&y, &o, &g}, op);
  if (R == 0) return;
  DT_ROUTE(sigmoid_gate_fwd, o, y, o, g, s);
}
void sigmoid_gate_bwd(const TensorView& d_o, const TensorView& dg, const TensorView& dy, const TensorView& o,
                      const TensorView& g, Stream s) {
  constexpr const char* op = "sigmoid_gate_bwd";
  check_ndim(o, 2, op, "o");
  const int64_t R = o.shape[0], D = o.shape[1];
  for (auto [v, what] :
       {std::pair{&d_o, "do [R, D]"}, {&dg, "dg [R, D]"}, {&dy, "dy [R, D]"}, {&o, "o [R, D]"}, {&g, "g [R, D]"}})
    check_rows(*v, R, D, o.device, op, what, true);
  check_same_dtype({&d_o, &dg, &dy, &o, &g}, op);
  if (R == 0) return;
  DT_ROUTE(sigmoid_gate_bwd, o, d_o, dg, dy, o, g, s);
}

void gather_rows(const TensorView& out, const TensorView& in, const TensorView& idx, Stream s) {
  constexpr const char* op = "gather_rows";
  check_ndim(out, 2, op, "out");
  check_ndim(in, 2, op, "in");
  const int64_t R = out.shape[0], C = out.shape[1];
  check_rows(out, R, C, out.device, op, "out [R, C]", true);
  check_rows(in, in.shape[0], C, out.device, op, "in [Rin, C]", true);
  check_same_dtype({&out, &in}, op);
  check_vec(idx, R, DType::i32, out.device, op, "idx [R]");
  if (R == 0) return;
  DT_ROUTE(gather_rows, out, out, in, idx, s);
}

AttnBackendChoice choose_attention_backend(const std::string& requested, Device dev) {
  if (requested != "auto" && requested != "native" && requested != "cudnn" && requested != "cudnn_fwd")
    return {AttnBackend::native,
            fmt::format("config: attention.backend = '{}' is not one of: auto, native, cudnn, cudnn_fwd", requested)};
  if (requested == "native" || requested == "auto" || dev.is_cpu()) return {AttnBackend::native, ""};
#if DELTATRON_HAVE_CUDA
  std::string why = cuda::cudnn_attention_unavailable();
  if (why.empty()) return {requested == "cudnn" ? AttnBackend::cudnn : AttnBackend::cudnn_fwd, ""};
#else
  std::string why = "needs a CUDA build";
#endif
  return {AttnBackend::native, fmt::format("config: attention.backend = '{}': {} ---> hint: "
                                           "attention.backend=native (or auto)", requested, why)};
}

}  // namespace dt::ops
