#include "deltatron/model/param.h"

#include <cmath>
#include <optional>

#include "deltatron/ops/basic.h"

namespace dt::model {

uint64_t rng_stream_of(const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string check_splittable(const ParamSpec& s, int tp) {
  if (s.tp_dim < 0 || tp == 1) return "";
  if (s.tp_dim >= s.shape.ndim) return fmt::format("{}: tp_dim {} out of range for shape {}", s.name, s.tp_dim, s.shape.str());
  std::vector<int64_t> secs = s.sections.empty() ? std::vector<int64_t>{s.shape[s.tp_dim]} : s.sections;
  int64_t total = 0;
  for (size_t i = 0; i < secs.size(); ++i) {
    total += secs[i];
    if (secs[i] % tp)
      return fmt::format("{}: section {} of dim {} has {} rows, not divisible by tp={}", s.name, i, s.tp_dim, secs[i],
                         tp);
  }
  if (total != s.shape[s.tp_dim])
    return fmt::format("{}: sections sum to {}, but dim {} of {} has {}", s.name, total, s.tp_dim, s.shape.str(),
                       s.shape[s.tp_dim]);
  return "";
}

std::vector<ShardPiece> shard_pieces(const ParamSpec& s, int tp, int tp_rank) {
  std::string err = check_splittable(s, tp);
  DT_CHECK(err.empty(), "{}", err);
  if (s.tp_dim < 0) return {{0, 0, s.shape.ndim ? s.shape[0] : 1}};
  std::vector<int64_t> secs = s.sections.empty() ? std::vector<int64_t>{s.shape[s.tp_dim]} : s.sections;
  std::vector<ShardPiece> out;
  int64_t goff = 0, loff = 0;
  for (int64_t sec : secs) {
    int64_t len = sec / tp;
    out.push_back({goff + tp_rank * len, loff, len});
    goff += sec;
    loff += len;
  }
  return out;
}

Shape local_shape(const ParamSpec& s, int tp) {
  Shape l = s.shape;
  if (s.tp_dim >= 0) l[s.tp_dim] = s.shape[s.tp_dim] / tp;
  return l;
}

namespace {
// A box of the global tensor: `len` along tp_dim from `off`, everything else whole.
TensorView piece_view(const TensorView& t, int dim, int64_t off, int64_t len) {
  return dim < 0 ? t : t.slice(dim, off, off + len);
}

void init_piece(const TensorView& local, const ParamSpec& s, const ShardPiece& p, uint64_t seed, Stream st) {
  const InitRule& r = s.init;
  if (r.kind == Init::zeros || r.kind == Init::ones) {
    ops::fill(local, r.kind == Init::ones ? 1.0 : 0.0, st);
    return;
  }
  ops::RngSlice where{s.shape, {}};
  if (s.tp_dim >= 0) where.offset[s.tp_dim] = p.global_off;
  uint64_t stream = rng_stream_of(s.name);
  if (r.kind == Init::normal) {
    ops::rng_normal(local, seed, stream, 0.f, r.a, where, st);
  } else if (r.kind == Init::uniform) {
    ops::rng_uniform(local, seed, stream, r.a, r.b, where, st);
  } else {  // log(U(a, b)): A_log, never log(0) (thd-context-parallel.md R4)
    DT_CHECK(r.a > 0.f && r.b > r.a, "{}: log_uniform init needs 0 < a < b, got ({}, {})", s.name, r.a, r.b);
    Tensor h = Tensor::empty(local.shape, DType::f32);
    ops::rng_uniform(h, seed, stream, r.a, r.b, where);
    for (int64_t i = 0; i < h.numel(); ++i) h.ptr<float>()[i] = std::log(h.ptr<float>()[i]);
    // Host -> device from pageable memory: the copy has read `h` when it returns.
    ops::copy(local, h, st);
  }
}

// p.master from the seed (p.spec set, p.master allocated).
void init_master(Param& p, int tp, int tp_rank, uint64_t seed, Device dev, Stream st) {
  const ParamSpec& s = p.spec;
  for (const ShardPiece& piece : shard_pieces(s, tp, tp_rank)) {
    TensorView local = piece_view(p.master, s.tp_dim, piece.local_off, piece.len);
    // Pieces along dim > 0 are strided: initialise a contiguous temporary, then copy.
    if (local.is_contiguous()) {
      init_piece(local, s, piece, seed, st);
    } else {
      Tensor tmp = Tensor::empty(local.shape, DType::f32, dev);
      init_piece(tmp, s, piece, seed, st);
      ops::copy(local, tmp, st);
    }
  }
}
bool wants_compute(const ParamSpec& s, DType compute_dtype) { return compute_dtype != DType::f32 && !s.keep_fp32; }
}  // namespace

Param make_param(const ParamSpec& s, int tp, int tp_rank, uint64_t seed, Device dev, DType compute_dtype, Stream st) {
  Param p;
  p.spec = s;
  Shape ls = local_shape(s, tp);
  p.master = Tensor::empty(ls, DType::f32, dev);
  p.grad = Tensor::zeros(ls, DType::f32, dev, st);
  init_master(p, tp, tp_rank, seed, dev, st);
  if (wants_compute(s, compute_dtype)) {
    p.compute = Tensor::empty(ls, compute_dtype, dev);
    refresh_compute(p, st);
  }
  return p;
}

std::vector<Param> make_params_rows(const std::vector<ParamSpec>& specs, int tp, int tp_rank, uint64_t seed, Device dev,
                                    DType compute_dtype, Stream st) {
  DT_CHECK(!specs.empty(), "make_params_rows: no parameters");
  const Shape first = local_shape(specs[0], tp);
  int64_t rows = 0;
  for (const ParamSpec& s : specs) {
    const Shape ls = local_shape(s, tp);
    DT_CHECK(ls.ndim == 2 && ls[1] == first[1] && wants_compute(s, compute_dtype) ==
                                                        wants_compute(specs[0], compute_dtype),
             "make_params_rows: {} has local shape {} ({}); every parameter needs [rows, {}] and the dtype policy of {}",
             s.name, ls.str(), s.keep_fp32 ? "keep_fp32" : "compute dtype", first.ndim == 2 ? first[1] : 0,
             specs[0].name);
    rows += ls[0];
  }
  const Shape joint{rows, first[1]};
  const Tensor master = Tensor::empty(joint, DType::f32, dev), grad = Tensor::zeros(joint, DType::f32, dev, st);
  const bool comp = wants_compute(specs[0], compute_dtype);
  const Tensor compute = comp ? Tensor::empty(joint, compute_dtype, dev) : Tensor();
  std::vector<Param> out;
  int64_t r0 = 0;
  for (const ParamSpec& s : specs) {
    const int64_t n = local_shape(s, tp)[0];
    Param p;
    p.spec = s;
    p.master = master.rows(r0, r0 + n);
    p.grad = grad.rows(r0, r0 + n);
    init_master(p, tp, tp_rank, seed, dev, st);
    if (comp) {
      p.compute = compute.rows(r0, r0 + n);
      refresh_compute(p, st);
    }
    out.push_back(std::move(p));
    r0 += n;
  }
  return out;
}

namespace {
// [sum rows, C] over views that follow each other in memory (same dtype, device, C; contiguous).
std::optional<TensorView> join(const TensorView* const* v, size_t n) {
  TensorView j = *v[0];
  if (j.ndim() != 2 || !j.is_contiguous()) return std::nullopt;
  for (size_t i = 1; i < n; ++i) {
    const TensorView& x = *v[i];
    if (x.ndim() != 2 || !x.is_contiguous() || x.dtype != j.dtype || x.device != j.device || x.shape[1] != j.shape[1] ||
        x.data != static_cast<char*>(j.data) + j.nbytes())
      return std::nullopt;
    j.shape[0] += x.shape[0];
  }
  return j;
}
}  // namespace

JoinedRows rows_joined(const Param* params, size_t n) {
  DT_CHECK(n > 0, "rows_joined: no parameters");
  std::vector<const TensorView*> w(n), g(n);
  for (size_t i = 0; i < n; ++i) w[i] = &params[i].w(), g[i] = &params[i].grad.view();
  const std::optional<TensorView> jw = join(w.data(), n), jg = join(g.data(), n);
  DT_CHECK(jw && jg, "rows_joined: {} and the {} params after it are not consecutive rows of one allocation "
                     "(make_params_rows)",
           params[0].spec.name, n - 1);
  return JoinedRows{*jw, *jg};
}

void refresh_compute(Param& p, Stream st) {
  if (p.compute.defined()) ops::copy(p.compute, p.master, st);
}

void shard_from_global(const TensorView& local, const TensorView& global, const ParamSpec& s, int tp, int tp_rank,
                       Stream st) {
  check_shape(global, s.shape, s.name.c_str());
  check_shape(local, local_shape(s, tp), s.name.c_str());
  for (const ShardPiece& p : shard_pieces(s, tp, tp_rank))
    ops::copy(piece_view(local, s.tp_dim, p.local_off, p.len), piece_view(global, s.tp_dim, p.global_off, p.len), st);
}

}  // namespace dt::model
