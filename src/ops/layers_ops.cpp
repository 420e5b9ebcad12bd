// Shape/dtype/device checks of the dense-layer ops (include/deltatron/ops/layers_ops.h), then
// routing by the device of the first view to ops::cpu:: or ops::cuda::. The backends trust
// these checks.
#include <string>

#include "ops/layers_ops_backends.h"
#include "ops/op_checks.h"
#include "ops/route.h"

namespace dt::ops {
namespace {
using detail::check_rows;
using detail::check_vec;

void check_2d(const TensorView& v, const char* op, const char* what) {
  DT_CHECK(v.ndim() == 2, "{} {}: expected a 2-D view, got {}", op, what, v.str());
}
}  // namespace


void rmsnorm1p_fwd(const TensorView& y, const TensorView& rstd, const TensorView& x, const TensorView& w, float eps,
                   Stream s) {
  constexpr const char* op = "rmsnorm1p_fwd";
  check_2d(x, op, "x");
  const int64_t R = x.shape[0], D = x.shape[1];
  const Device d = x.device;
  check_rows(x, R, D, d, op, "x [rows, D]", true);
  check_rows(y, R, D, d, op, "y [rows, D]", true);
  check_vec(rstd, R, DType::f32, d, op, "rstd [rows]");
  check_vec(w, D, DType::f32, d, op, "w [D]");
  DT_CHECK(eps > 0.f, "{}: eps must be > 0, got {}", op, eps);
  if (R == 0) return;
  DT_ROUTE(rmsnorm1p_fwd, y, y, rstd, x, w, eps, s);
}
void rmsnorm1p_bwd(const TensorView& dx, const TensorView& dw, const TensorView& dy, const TensorView& x,
                   const TensorView& w, const TensorView& rstd, Stream s) {
  constexpr const char* op = "rmsnorm1p_bwd";
  check_2d(x, op, "x");
  const int64_t R = x.shape[0], D = x.shape[1];
  const Device d = x.device;
  check_rows(x, R, D, d, op, "x [rows, D]", true);
  check_rows(dy, R, D, d, op, "dy [rows, D]", true);
  check_rows(dx, R, D, d, op, "dx [rows, D]", true);
  check_vec(rstd, R, DType::f32, d, op, "rstd [rows]");
  check_vec(w, D, DType::f32, d, op, "w [D]");
  check_vec(dw, D, DType::f32, d, op, "dw [D]");
  if (R == 0) return;
  DT_ROUTE(rmsnorm1p_bwd, dx, dx, dw, dy, x, w, rstd, s);
}

void swiglu_fwd(const TensorView& y, const TensorView& g, const TensorView& u, Stream s) {
  constexpr const char* op = "swiglu_fwd";
  check_2d(g, op, "g");
  const int64_t T = g.shape[0], F = g.shape[1];
  for (auto [v, what] : {std::pair{&y, "y [T, F]"}, {&g, "g [T, F]"}, {&u, "u [T, F]"}})
    check_rows(*v, T, F, g.device, op, what, true);
  if (T == 0) return;
  DT_ROUTE(swiglu_fwd, y, y, g, u, s);
}
void swiglu_bwd(const TensorView& dg, const TensorView& du, const TensorView& dy, const TensorView& g,
                const TensorView& u, Stream s) {
  constexpr const char* op = "swiglu_bwd";
  check_2d(g, op, "g");
  const int64_t T = g.shape[0], F = g.shape[1];
  for (auto [v, what] :
       {std::pair{&dg, "dg [T, F]"}, {&du, "du [T, F]"}, {&dy, "dy [T, F]"}, {&g, "g [T, F]"}, {&u, "u [T, F]"}})
    check_rows(*v, T, F, g.device, op, what, true);
  if (T == 0) return;
  DT_ROUTE(swiglu_bwd, dg, dg, du, dy, g, u, s);
}

void embedding_fwd(const TensorView& y, const TensorView& ids, const TensorView& w, int64_t vocab_begin, Stream s) {
  constexpr const char* op = "embedding_fwd";
  check_2d(w, op, "w");
  check_2d(y, op, "y");
  const int64_t T = y.shape[0], V = w.shape[0], H = w.shape[1];
  check_rows(y, T, H, y.device, op, "y [T, H]", true);
  check_rows(w, V, H, y.device, op, "w [V_local, H]", true);
  check_vec(ids, T, DType::i32, y.device, op, "ids [T]");
  DT_CHECK(vocab_begin >= 0, "{}: vocab_begin={} < 0", op, vocab_begin);
  if (T == 0) return;
  DT_ROUTE(embedding_fwd, y, y, ids, w, vocab_begin, s);
}
void embedding_bwd(const TensorView& dw, const TensorView& dy, const TensorView& ids, int64_t vocab_begin, Stream s) {
  constexpr const char* op = "embedding_bwd";
  check_2d(dw, op, "dw");
  check_2d(dy, op, "dy");
  const int64_t T = dy.shape[0], V = dw.shape[0], H = dw.shape[1];
  check_rows(dy, T, H, dw.device, op, "dy [T, H]", true);
  check_rows(dw, V, H, dw.device, op, "dw [V_local, H]", true);
  check_dtype(dw, DType::f32, "embedding_bwd dw");
  check_contiguous(dw, "embedding_bwd dw");
  check_vec(ids, T, DType::i32, dw.device, op, "ids [T]");
  DT_CHECK(vocab_begin >= 0, "{}: vocab_begin={} < 0", op, vocab_begin);
  if (T == 0 || V == 0) return;
  DT_ROUTE(embedding_bwd, dw, dw, dy, ids, vocab_begin, s);
}

void ce_stats(const TensorView& m, const TensorView& se, const TensorView& tl, const TensorView& logits,
              const TensorView& targets, int64_t vocab_begin, Stream s) {
  constexpr const char* op = "ce_stats";
  check_2d(logits, op, "logits");
  const int64_t T = logits.shape[0], V = logits.shape[1];
  const Device d = logits.device;
  check_rows(logits, T, V, d, op, "logits [T, V_local]", true);
  check_vec(m, T, DType::f32, d, op, "m [T]");
  check_vec(se, T, DType::f32, d, op, "se [T]");
  check_vec(tl, T, DType::f32, d, op, "tl [T]");
  check_vec(targets, T, DType::i32, d, op, "targets [T]");
  DT_CHECK(V > 0, "{}: the local vocab shard is empty ({})", op, logits.str());
  if (T == 0) return;
  DT_ROUTE(ce_stats, logits, m, se, tl, logits, targets, vocab_begin, s);
}
void ce_rescale(const TensorView& se, const TensorView& m, const TensorView& m_global, Stream s) {
  constexpr const char* op = "ce_rescale";
  const int64_t T = se.numel();
  const Device d = se.device;
  check_vec(se, T, DType::f32, d, op, "se [T]");
  check_vec(m, T, DType::f32, d, op, "m [T]");
  check_vec(m_global, T, DType::f32, d, op, "m_global [T]");
  if (T == 0) return;
  DT_ROUTE(ce_rescale, se, se, m, m_global, s);
}
void ce_loss(const TensorView& loss, const TensorView& m, const TensorView& se, const TensorView& tl,
             const TensorView& targets, Stream s) {
  constexpr const char* op = "ce_loss";
  const int64_t T = loss.numel();
  const Device d = loss.device;
  check_vec(loss, T, DType::f32, d, op, "loss [T]");
  check_vec(m, T, DType::f32, d, op, "m [T]");
  check_vec(se, T, DType::f32, d, op, "se [T]");
  check_vec(tl, T, DType::f32, d, op, "tl [T]");
  check_vec(targets, T, DType::i32, d, op, "targets [T]");
  if (T == 0) return;
  DT_ROUTE(ce_loss, loss, loss, m, se, tl, targets, s);
}
void ce_bwd(const TensorView& dlogits, const TensorView& logits, const TensorView& m, const TensorView& se,
            const TensorView& targets, int64_t vocab_begin, float scale, Stream s) {
  constexpr const char* op = "ce_bwd";
  check_2d(logits, op, "logits");
  const int64_t T = logits.shape[0], V = logits.shape[1];
  const Device d = logits.device;
  check_rows(logits, T, V, d, op, "logits [T, V_local]", true);
  check_rows(dlogits, T, V, d, op, "dlogits [T, V_local]", true);
  check_vec(m, T, DType::f32, d, op, "m [T]");
  check_vec(se, T, DType::f32, d, op, "se [T]");
  check_vec(targets, T, DType::i32, d, op, "targets [T]");
  if (T == 0) return;
  DT_ROUTE(ce_bwd, dlogits, dlogits, logits, m, se, targets, vocab_begin, scale, s);
}

}  // namespace dt::ops
