// The training loop (include/deltatron/train/trainer.h; docs/training.md): the Trainer (setup, one
// step), the rank-0 step log and run_training.
#include "deltatron/train/trainer.h"

#include <chrono>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "deltatron/core/sysinfo.h"
#include "deltatron/data/packed_seq.h"
#include "deltatron/io/durable.h"
#include "deltatron/dist/comm.h"
#include "deltatron/layers/embedding.h"
#include "deltatron/layers/lm_head.h"
#include "deltatron/model/grad_reduce.h"
#include "deltatron/model/hf_io.h"
#include "deltatron/ops/attention.h"
#include "deltatron/ops/basic.h"
#include "deltatron/train/checkpoint.h"
#include "deltatron/train/metrics.h"
#if DELTATRON_HAVE_CUDA
#include "core/cuda_check.h"
#endif

namespace dt::train {
namespace {

using Clock = std::chrono::steady_clock;

// train.device -> this rank's device. Collective (auto agrees over every rank, cuda selects the
// GPU of the local rank or ends every rank with a user_error naming the host and device count).
Device resolve_device(const std::string& want, std::string* note) {
  if (want == "cpu") return Device::cpu();
  // cuda needs EVERY rank to have a GPU of its own (mixed backends cannot talk), or, with the
  // staged backend (DT_COMM_STAGED=1: CUDA collectives through MPI), a GPU it may share.
  const int gpus = cuda_device_count();
  const bool share = dist::cuda_backend() == dist::Backend::staged;
  Tensor lacking = Tensor::empty(Shape{1}, DType::i32);  // [1] ranks without a GPU
  *lacking.ptr<int32_t>() = (share ? gpus > 0 : gpus > dist::local_rank()) ? 0 : 1;
  dist::make_world(dist::Backend::mpi)->all_reduce(lacking, dist::ReduceOp::sum);
  const int n_lacking = *lacking.ptr<int32_t>();
  if (want == "auto") {
    *note = n_lacking == 0 ? "auto -> cuda" : "auto -> cpu: not every rank has a GPU of its own";
    if (n_lacking > 0) return Device::cpu();
  } else if (n_lacking > 0) {
    user_error(fmt::format(
        "train.device = 'cuda', but {} of {} rank(s) have no GPU of their own ({}) ---> hint: --set train.device=cpu "
        "(or auto), or run at most one rank per GPU (DT_COMM_STAGED=1 lets ranks share GPUs, for tests)",
        n_lacking, dist::world_size(),
        DELTATRON_HAVE_CUDA
            ? fmt::format("rank 0 sees {} CUDA device(s) for {} local rank(s)", gpus, dist::local_size())
            : std::string("this build has no CUDA backend")));
  }
  return Device::cuda(dist::select_cuda_device());
}

// A token id outside [0, vocab_size) would read past the embedding and the logits (the CPU and
// CUDA kernels do not check): the first such input token or target of a micro-batch's real
// sequences, or "". Targets are checked too: a split document's piece ends with the next piece's
// first token as its target, which another micro-batch holds.
std::string token_range_error(const data::MicroBatch& mb, int64_t vocab, const std::string& prefix) {
  auto bad = [&](const data::DocPiece& p, int32_t id, int64_t pos) {
    return fmt::format("data: {}: document {} holds token id {} at position {}, outside [0, model.vocab_size={})",
                       prefix, p.doc, id, pos, vocab);
  };
  for (size_t i = 0; i < mb.pieces.size(); ++i) {
    const data::DocPiece& p = mb.pieces[i];
    const int32_t* t = mb.tokens.data() + mb.cu_seqlens_padded[i];
    const int32_t* l = mb.labels.data() + mb.cu_seqlens_padded[i];
    for (int64_t j = 0; j < p.length; ++j) {
      if (t[j] < 0 || t[j] >= vocab) return bad(p, t[j], p.begin + j);
      if (l[j] >= vocab) return bad(p, l[j], p.begin + j + 1);  // -1: no target
    }
  }
  return "";
}

// A resumed run appends to the metrics JSONL, which may hold records past the step it resumes
// from (the run went on after its last checkpoint) and a line torn by a crash: both are dropped,
// so that each step is recorded once and the file stays JSON lines. Rewritten through path.tmp.
std::string drop_records_after(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return "";  // nothing written yet
  std::string line, kept;
  int64_t dropped = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() <= step)
      kept += line + "\n";
    else
      ++dropped;
  }
  in.close();
  if (dropped == 0) return "";
  const std::string tmp = path + ".tmp";
  if (std::string e = io::write_durable(tmp, kept); !e.empty()) return fmt::format("logging.metrics_jsonl: {}", e);
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return fmt::format("logging.metrics_jsonl = '{}': cannot replace it ({})", path, ec.message());
  std::printf("metrics: dropped %lld record(s) of %s past step %lld or cut short (the run went on after that "
              "checkpoint)\n",
              static_cast<long long>(dropped), path.c_str(), static_cast<long long>(step));
  return "";
}

// Rank 0's step line (every logging.log_interval steps and the last) and JSONL record (every step;
// appended to when the run resumes).
class StepLog {
 public:
  // Collective: rank 0 opens logging.metrics_jsonl (making its directory), and every rank stops
  // with the error if it cannot, before the first step rather than after a run without metrics.
  explicit StepLog(const Trainer& t) : t_(t), rank0_(dist::world_rank() == 0), first_(t.next_step()) {
    const std::string& path = t.config().logging.metrics_jsonl;
    if (path.empty()) return;
    std::string err;
    if (rank0_) {
      std::error_code ec;
      const std::filesystem::path dir = std::filesystem::path(path).parent_path();
      if (!dir.empty()) std::filesystem::create_directories(dir, ec);
      if (ec) {
        err = fmt::format("logging.metrics_jsonl = '{}': cannot create directory {} ({})", path, dir.string(),
                          ec.message());
      } else {
        if (first_ > 0) err = drop_records_after(path, first_);
        if (err.empty()) jsonl_.open(path, first_ > 0 ? std::ios::app : std::ios::trunc);
        if (err.empty() && !jsonl_) err = fmt::format("logging.metrics_jsonl = '{}': cannot open for writing ({})", path,
                                       std::strerror(errno));
      }
    }
    std::unique_ptr<dist::Communicator> world = dist::make_world(dist::Backend::mpi);
    if (std::string e = dist::from_rank0(*world, err); !e.empty()) user_error(e);
  }

  void record(const StepResult& r) {
    elapsed_s_ += r.ms * 1e-3;
    if (!rank0_) return;
    const int64_t total = t_.config().train.steps;
    StepMetrics m;
    m.step = r.step;
    m.total_steps = total;
    m.loss = r.loss;
    m.grad_norm = r.grad_norm;
    m.lr = r.lr;
    m.step_ms = r.ms;
    m.tokens = r.tokens;
    m.model_flops = r.flops.model();
    m.world = t_.groups().dims.world();
    m.peak_tflops = t_.peak_tflops();
    m.peak_mem_bytes = peak_memory_bytes(t_.device());
    m.skipped = t_.guard().skipped();
    m.eta_s = elapsed_s_ / double(r.step - first_) * double(total - r.step);
    if ((r.step - 1) % std::max<int64_t>(t_.config().logging.log_interval, 1) == 0 || r.step == total) {
      std::printf("%s\n", format_step_line(m).c_str());
      std::fflush(stdout);
    }
    if (jsonl_.is_open()) jsonl_ << format_step_json(m) << "\n" << std::flush;
  }

 private:
  const Trainer& t_;
  bool rank0_;
  int64_t first_;  // the first step of this process (after a resume)
  double elapsed_s_ = 0;
  std::ofstream jsonl_;
};

}  // namespace

Trainer::Trainer(const io::Config& cfg) : cfg_(cfg), guard_(cfg.train.max_nonfinite_in_a_row) {
  const int world = dist::world_size();
  if (std::string e = io::validate_config(cfg_, world); !e.empty()) user_error(e);
  // The optimizer's and schedule's own rules, as config errors before any work (their
  // constructors check them again, as a program error).
  if (std::string e = Optimizer::validate(cfg_.optimizer); !e.empty()) user_error("config: " + e);
  if (std::string e = LrSchedule::validate(cfg_.schedule, 0); !e.empty()) user_error("config: " + e);
  dims_ = {int(cfg_.parallel.tp), int(cfg_.parallel.cp), int(cfg_.parallel.dp)};
  if (std::string e = dims_.resolve(world); !e.empty()) user_error(e);
  if (cfg_.data.prefix.empty())
    user_error("config: data.prefix is empty ---> hint: --data PREFIX or --set data.prefix=...");

  // Device, groups, stream, precision.
  const Device dev = resolve_device(cfg_.train.device, &device_note_);
  pg_ = dist::ProcessGroups::build(dims_, dev.is_cuda() ? dist::cuda_backend() : dist::Backend::mpi);
  host_dp_cp_ = dist::split(dist::Backend::mpi, pg_.coord.tp, dist::world_rank());  // same tp coordinate
  host_world_ = dist::make_world(dist::Backend::mpi);
  for (int r = 0; r < world; ++r) tp_cp_group_.push_back(dist::coord_of(dims_, r).dp);
  ctx_.pg = &pg_;
  ctx_.sp = cfg_.parallel.sp;
  ctx_.device = dev;
  ctx_.seed = uint64_t(cfg_.train.seed);
  ctx_.act_dtype = dev.is_cuda() && cfg_.train.precision == "bf16" ? DType::bf16 : DType::f32;
  if (dev.is_cuda()) {
#if DELTATRON_HAVE_CUDA
    cudaStream_t st = nullptr;
    DT_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    ctx_.stream = Stream{st};
#endif
    peak_tflops_ = train::peak_tflops(device_name(dev), ctx_.act_dtype == DType::bf16);
  }

  // The gated attention kernels: a backend that cannot run is refused here, before any work.
  const ops::AttnBackendChoice attn = ops::choose_attention_backend(cfg_.attention.backend, dev);
  if (!attn.error.empty()) user_error(attn.error);
  if (attn.backend != ops::AttnBackend::native && ctx_.act_dtype != DType::bf16)
    user_error(fmt::format("config: attention.backend = '{}' runs cuDNN's SDPA, which takes bf16, but "
                           "train.precision = '{}' ---> hint: attention.backend=native (or auto) for fp32",
                           cfg_.attention.backend, cfg_.train.precision));
  ctx_.attn_backend = attn.backend;  // every GatedAttention layer runs it
  ctx_.cp_a2a = cfg_.gdn.cp_a2a == "per_sequence" ? ops::CpA2aImpl::per_sequence : ops::CpA2aImpl::fused;
  ctx_.gdn_cp_comm = gdn_cp_comm(cfg_.gdn.cp_comm, cfg_.model, dims_.tp, dims_.cp);
  ctx_.gdn_save_chunk = cfg_.gdn.save_chunk_intermediates;
  ctx_.gdn_recompute = cfg_.gdn.recompute_elementwise;
  ctx_.gdn_recompute_v = cfg_.gdn.recompute_v;

  // Data.
  pc_ = packer_config(cfg_, dims_);
  if (std::string e = data::validate_packer_config(pc_); !e.empty()) user_error(e);
  ds_ = std::make_unique<data::IndexedDataset>(data::IndexedDataset::open_or_die(cfg_.data.prefix));
  loader_ = std::make_unique<data::PackedLoader>(*ds_, pc_, pg_.coord.dp);

  // Model and optimizer.
  net_ = std::make_unique<model::Qwen35Model>(cfg_.model, ctx_);
  if (!cfg_.checkpoint.init_from_hf.empty()) {  // HF weights replace the seed's (docs/hf.md)
    hf_dtype_ = model::load_hf_weights_or_die(cfg_.checkpoint.init_from_hf, *net_, pg_).source_dtype;
    synchronize_device();  // the load copies on the default stream; the compute stream does not wait for it
  }
  params_ = net_->params();
  opt_ = std::make_unique<Optimizer>(cfg_.optimizer, params_, ctx_.stream);
  schedule_ = std::make_unique<LrSchedule>(cfg_.schedule, cfg_.optimizer.lr, cfg_.train.steps);
  for (const model::ParamSpec& s : model::Qwen35Model::param_specs(cfg_.model, cfg_.parallel.sp))
    n_params_ += s.shape.numel();

  // train.overlap_grad_reduce: which parameters each layer completes, and everything else.
  if (cfg_.train.overlap_grad_reduce) {
    std::set<const model::Param*> in_layers;
    for (int64_t i = 0; i < net_->num_layers(); ++i) {
      layer_params_.emplace_back();
      net_->layer(i).collect_params(layer_params_.back());
      in_layers.insert(layer_params_.back().begin(), layer_params_.back().end());
    }
    model::Param* embed = &net_->embedding().weight();
    const bool early_embed = cfg_.train.overlap_embedding_reduce && dims_.dp * dims_.cp > 1;
    for (model::Param* p : params_)
      if (!in_layers.count(p)) (early_embed && p == embed ? embed_params_ : other_params_).push_back(p);
#if DELTATRON_HAVE_CUDA
    if (dev.is_cuda()) {
      cudaStream_t rs = nullptr;
      cudaEvent_t a = nullptr, b = nullptr;
      DT_CUDA_CHECK(cudaStreamCreateWithFlags(&rs, cudaStreamNonBlocking));
      DT_CUDA_CHECK(cudaEventCreateWithFlags(&a, cudaEventDisableTiming));
      DT_CUDA_CHECK(cudaEventCreateWithFlags(&b, cudaEventDisableTiming));
      reduce_stream_ = rs, ev_ready_ = a, ev_done_ = b;
    }
#endif
  }
}

Trainer::~Trainer() {
#if DELTATRON_HAVE_CUDA
  if (ctx_.stream.handle) {
    synchronize_device();  // the compute stream and the reduce stream
    cudaStreamDestroy(static_cast<cudaStream_t>(ctx_.stream.handle));
  }
  if (reduce_stream_) {
    cudaStreamDestroy(static_cast<cudaStream_t>(reduce_stream_));
    cudaEventDestroy(static_cast<cudaEvent_t>(ev_ready_));
    cudaEventDestroy(static_cast<cudaEvent_t>(ev_done_));
  }
#endif
}

// The gradients of `ps` are complete on the compute stream: their TP sums go there too (the
// TP communicator also carries the layers' collectives, which must keep one order), their
// dp x cp sums on the reduce stream (its own communicator, dp_cp, which the backward never
// uses), overlapping the backward that follows. Without a second stream (CPU), in order.
void Trainer::reduce_async(const std::vector<model::Param*>& ps) {
  const Stream s = ctx_.stream;
  model::reduce_grads_tp(ps, pg_, s);
#if DELTATRON_HAVE_CUDA
  if (reduce_stream_) {
    const auto rs = static_cast<cudaStream_t>(reduce_stream_);
    const auto ready = static_cast<cudaEvent_t>(ev_ready_);
    DT_CUDA_CHECK(cudaEventRecord(ready, static_cast<cudaStream_t>(s.handle)));
    DT_CUDA_CHECK(cudaStreamWaitEvent(rs, ready, 0));
    model::reduce_grads_dp_cp(ps, pg_, Stream{rs});
    return;
  }
#endif
  model::reduce_grads_dp_cp(ps, pg_, s);
}

void Trainer::join_reductions() {
#if DELTATRON_HAVE_CUDA
  if (reduce_stream_) {
    const auto done = static_cast<cudaEvent_t>(ev_done_);
    DT_CUDA_CHECK(cudaEventRecord(done, static_cast<cudaStream_t>(reduce_stream_)));
    DT_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(ctx_.stream.handle), done, 0));
  }
#endif
}

void Trainer::synchronize() {
#if DELTATRON_HAVE_CUDA
  if (ctx_.device.is_cuda()) DT_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(ctx_.stream.handle)));
#endif
}

void Trainer::synchronize_device() {
#if DELTATRON_HAVE_CUDA
  if (ctx_.device.is_cuda()) DT_CUDA_CHECK(cudaDeviceSynchronize());
#endif
}

StepResult Trainer::step() {
  const auto t0 = Clock::now();
  const Stream s = ctx_.stream;
  const Device dev = ctx_.device;
  // The micro-batches of this step, their metadata and targets built on the host first, so the
  // global predicted-token count (the loss denominator) is known before any backward.
  struct Micro {
    data::MicroBatch mb;
    std::unique_ptr<data::PackedSeqParams> psp;  // alive until the step's end (uploads, backward)
    layers::LmTargets tg;
    Tensor ids;
  };
  std::vector<Micro> micro(size_t(cfg_.train.grad_accum));
  // Host counts, summed over dp x cp: [predicted tokens of this CP rank, then (on CP rank 0
  // only, the micro-batches being the same on every CP rank) real tokens and the FLOP parts].
  // [5]: micro-batches holding a token id outside the vocab (each rank checks its own).
  Tensor counts = Tensor::zeros(Shape{6}, DType::i64);
  int64_t* c = counts.ptr<int64_t>();
  FlopCount fl;
  std::string bad_token;
  uint64_t meta = 0;  // the micro-batches' metadata checksums, combined in order
  for (Micro& m : micro) {
    m.mb = loader_->next();
    if (bad_token.empty()) bad_token = token_range_error(m.mb, cfg_.model.vocab_size, cfg_.data.prefix);
    c[5] += !bad_token.empty();
    m.psp = std::make_unique<data::PackedSeqParams>(data::PackedSeqParams::build(m.mb.desc(pg_.coord.cp), dev, s));
    meta = meta * 1099511628211ull ^ m.psp->checksum();
    m.tg = layers::targets_from_labels(m.mb.labels, *m.psp, dev, s);  // across split documents' pieces
    m.ids = layers::local_token_ids(m.mb.tokens, *m.psp, dev, s);
    c[0] += m.tg.count;
    if (pg_.coord.cp == 0) {
      c[1] += m.mb.real_tokens();
      fl += micro_batch_flops(cfg_.model, m.mb.cu_seqlens);
    }
  }
  c[2] = std::llround(fl.gemm), c[3] = std::llround(fl.gdn), c[4] = std::llround(fl.attention);
  if (host_dp_cp_->size() > 1) host_dp_cp_->all_reduce(counts, dist::ReduceOp::sum);
  // Every rank of a TP x CP group must hold the same micro-batches (thd-context-parallel.md 2.1),
  // checked at every step: one 8-byte all-gather over the world, on the host.
  if (dims_.tp * dims_.cp > 1) {
    const std::string e = data::metadata_mismatch(*host_world_, meta, tp_cp_group_, fmt::format("step {}", step_ + 1));
    if (!e.empty()) user_error(e, /*every_rank_knows=*/true);
  }
  if (c[5] > 0) {  // every rank knows (tp peers hold the same micro-batches): stop with rank 0 printing
    std::unique_ptr<dist::Communicator> world = dist::make_world(dist::Backend::mpi);
    user_error(dist::first_message(*world, bad_token));
  }
  const int64_t global_count = c[0];

  // Forward and backward of each micro-batch; the loss sum stays on the device.
  Tensor loss_sum = Tensor::zeros(Shape{1}, DType::f32, dev, s);  // [1] f32
  const float scale = float(1.0 / double(std::max<int64_t>(global_count, 1)));
  const bool overlap = cfg_.train.overlap_grad_reduce;
  for (size_t i = 0; i < micro.size(); ++i) {
    Micro& m = micro[i];
    // The scale is known before the forward: the LM head computes its gradient right away.
    layers::LmHeadLoss::Result r = net_->forward(m.ids, *m.psp, m.tg, /*backward_scale=*/scale);
    ops::add(loss_sum, loss_sum, r.loss_sum, s);
    if (overlap && i + 1 == micro.size()) {  // the last micro-batch completes each layer's gradients
      if (!embed_params_.empty()) {
        // The embedding's gradient is complete but for this backward's rows (the tied head's
        // part came with the forward): its sum runs under the whole backward, the rows after it.
        net_->embedding().defer_next_backward(pc_.max_tokens / dims_.cp);
        reduce_async(embed_params_);
      }
      net_->backward(scale, [&](int64_t l) { reduce_async(layer_params_[size_t(l)]); });
    } else {
      net_->backward(scale);
    }
  }
  if (overlap) {
    reduce_async(other_params_);  // embedding (and the tied head) unless sent already, final norm, untied head
    join_reductions();            // before the loss all-reduce reuses the dp_cp communicator
    if (!embed_params_.empty()) net_->embedding().apply_deferred(*pg_.dp_cp, s);
  }
  if (pg_.dp_cp->size() > 1) pg_.dp_cp->all_reduce(loss_sum, dist::ReduceOp::sum, s);
  if (!overlap) model::reduce_grads(params_, pg_, s);

  // The step's one readback (the norm; the loss is complete by then), then guard, clip, update.
  StepResult r;
  r.step = step_ + 1;
  r.grad_norm = global_grad_norm(params_, pg_, s);
  r.loss = global_count > 0 ? double(ops::item(loss_sum, s)) / double(global_count) : 0.0;
  StepVerdict v = guard_.check(r.step, r.loss, r.grad_norm);  // 1-based, as the step line and JSONL
  if (!v.error.empty()) user_error(v.error);
  r.applied = v.apply;
  r.lr = schedule_->lr(step_);
  if (v.apply)  // the update also refreshes the compute copies and zeroes the gradients (one pass each)
    opt_->step(params_, float(r.lr), clip_coefficient(r.grad_norm, cfg_.optimizer.clip_grad), s);
  else
    zero_grads(params_, s);
  ++step_;
  r.tokens = c[1];
  r.flops = {double(c[2]), double(c[3]), double(c[4])};
  r.ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  return r;
}

std::string Trainer::banner() const {
  const io::ModelConfig& m = cfg_.model;
  const Device dev = ctx_.device;
  std::string precision;
  if (dev.is_cpu())
    precision = cfg_.train.precision == "fp32"
                    ? "fp32"
                    : "fp32 (train.precision=bf16 was asked: the CPU backend computes in fp32)";
  else
    precision = ctx_.act_dtype == DType::bf16 ? "bf16 compute, fp32 master weights, gradients and optimizer state"
                                              : "fp32";
  int64_t n_gdn = 0;
  for (const std::string& t : io::resolved_layer_types(m)) n_gdn += t == "linear_attention";
  const int64_t mb_per_step = cfg_.train.grad_accum * dims_.dp;
  std::string s = fmt::format(
      "deltatron train: {} parameters, {} layers ({} GDN, {} attention), hidden {}, vocab {}\n"
      "  world {} = tp {} x cp {} x dp {} (sp {})\n"
      "  device {}{}{}, precision {}\n"
      "  batch: {} tokens per micro-batch (padded, all CP ranks), grad_accum {} x dp {} = {} micro-batches, <= {} "
      "tokens per step, pad multiple {}\n"
      "  throughput counts model FLOPs of real tokens (GEMMs x3, GDN triangle-aware minimum, causal attention; "
      "docs/training.md); MFU {}\n",
      n_params_, net_->num_layers(), n_gdn, net_->num_layers() - n_gdn, m.hidden_size, m.vocab_size, dims_.world(),
      dims_.tp, dims_.cp, dims_.dp, cfg_.parallel.sp ? "on" : "off", dev.is_cuda() ? device_name(dev) + " " : "",
      dev.str(), device_note_.empty() ? "" : " (" + device_note_ + ")", precision, pc_.max_tokens,
      cfg_.train.grad_accum, dims_.dp, mb_per_step, mb_per_step * pc_.max_tokens, data::packer_pad_multiple(pc_),
      peak_tflops_ > 0 ? fmt::format("against a peak of {:.0f} TFLOP/s per GPU", peak_tflops_)
                       : std::string(dev.is_cpu() ? "not shown on the CPU" : "not shown (unknown GPU peak)"));
  if (dims_.cp > 1)
    s += fmt::format("  GDN under CP: {} (gdn.cp_comm {})\n",
                     ctx_.gdn_cp_comm == layers::GdnCpComm::all_gather ? "all_gather" : "all_to_all", cfg_.gdn.cp_comm);
  s += fmt::format("--- resolved config ---\n{}-----------------------\n", io::config_to_yaml(cfg_));
  return s;
}

TrainState Trainer::checkpoint_state() {
  return {&cfg_, &pg_, params_, opt_.get(), &guard_, loader_.get(), ds_.get(), pc_, ctx_.stream};
}

layers::GdnCpComm gdn_cp_comm(const std::string& setting, const io::ModelConfig& m, int tp, int cp) {
  if (setting == "all_gather") return layers::GdnCpComm::all_gather;
  if (setting == "all_to_all" || cp <= 1) return layers::GdnCpComm::all_to_all;
  const int64_t qk = m.linear_num_key_heads * m.linear_key_head_dim, v = m.linear_num_value_heads * m.linear_value_head_dim;
  const int64_t widths = (2 * qk + 2 * v + 2 * m.linear_num_value_heads) / tp + v / tp;  // C_tp + Cv_tp
  return widths > 2 * int64_t(cp) * m.hidden_size ? layers::GdnCpComm::all_gather : layers::GdnCpComm::all_to_all;
}

data::PackerConfig packer_config(const io::Config& cfg, const dist::ParallelDims& dims) {
  data::PackerConfig pc;
  pc.max_tokens = cfg.data.max_tokens;
  pc.pad_multiple = cfg.data.pad_multiple;
  pc.shuffle = cfg.data.shuffle;
  pc.seed = uint64_t(cfg.train.seed);
  pc.sp = cfg.parallel.sp ? dims.tp : 1;
  pc.cp = dims.cp;
  pc.dp = dims.dp;
  return pc;
}

TrainResult run_training(const io::Config& cfg) {
  Trainer trainer(cfg);
  if (dist::world_rank() == 0) {
    std::printf("%s", trainer.banner().c_str());
    std::fflush(stdout);
  }
  if (!cfg.checkpoint.export_hf.empty()) {  // written at the end by rank 0: found unusable now, not then
    std::unique_ptr<dist::Communicator> world = dist::make_world(dist::Backend::mpi);
    const std::string e = dist::world_rank() == 0 ? model::check_export_dir(cfg.checkpoint.export_hf) : "";
    if (std::string err = dist::from_rank0(*world, e); !err.empty()) user_error(err);
  }
  const TrainState ckpt = trainer.checkpoint_state();  // train/checkpoint.h
  trainer.set_next_step(resume_if_asked(ckpt));
  StepLog log(trainer);

  TrainResult out;
  while (trainer.next_step() < cfg.train.steps) {
    const StepResult r = trainer.step();
    out.losses.push_back(r.loss);
    out.grad_norms.push_back(r.grad_norm);
    log.record(r);
    maybe_save(ckpt, r.step);  // collective
  }
  out.skipped = trainer.guard().skipped();
  if (!cfg.checkpoint.export_hf.empty()) {  // HF directory of the final weights, in the source's dtype
    trainer.synchronize_device();           // the export reads on the default stream
    model::export_hf_or_die(cfg.checkpoint.export_hf, trainer.model(), trainer.groups(), trainer.hf_dtype());
  }
  return out;
}

}  // namespace dt::train
