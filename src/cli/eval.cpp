// deltatron eval and export-hf (src/cli/eval.h): HF weights or a checkpoint -> Qwen35Model ->
// every document of the dataset once, in dataset order -> one JSON line, optionally the logits of
// every real token; or -> an HF directory.
#include "cli/eval.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "deltatron/core/check.h"
#include "deltatron/data/indexed_dataset.h"
#include "deltatron/data/packed_seq.h"
#include "deltatron/data/packer.h"
#include "deltatron/dist/comm.h"
#include "deltatron/dist/parallel.h"
#include "deltatron/io/config.h"
#include "deltatron/io/safetensors.h"
#include "deltatron/layers/embedding.h"
#include "deltatron/layers/lm_head.h"
#include "deltatron/model/hf_io.h"
#include "deltatron/model/qwen35.h"
#include "deltatron/ops/basic.h"
#include "deltatron/train/checkpoint.h"
#include "deltatron/train/trainer.h"

namespace dt::cli {

namespace {

// Sum over the dp x cp group of one double per rank, in group-rank order (deterministic, exact
// inputs: the bits travel as i64).
double sum_over(dist::Communicator* g, double v) {
  if (!g || g->size() == 1) return v;
  Tensor in = Tensor::empty(Shape{1}, DType::i64), out = Tensor::empty(Shape{g->size()}, DType::i64);
  std::memcpy(in.ptr<int64_t>(), &v, sizeof v);
  g->all_gather(out, in);
  double s = 0;
  for (int r = 0; r < g->size(); ++r) {
    double x;
    std::memcpy(&x, out.ptr<int64_t>() + r, sizeof x);
    s += x;
  }
  return s;
}

// PATH: a step directory (holds metadata.json), or a checkpoint.dir whose `latest` names one.
train::CheckpointInfo read_checkpoint_or_die(const std::string& path) {
  std::string step_dir = path;
  if (!std::filesystem::exists(std::filesystem::path(path) / "metadata.json")) {
    if (std::string e = train::read_latest(path, &step_dir); !e.empty()) user_error("--checkpoint: " + e);
    if (step_dir.empty())
      user_error(fmt::format("--checkpoint {}: neither a step directory (no metadata.json) nor a checkpoint.dir with "
                             "a `latest` file",
                             path));
  }
  train::CheckpointInfo ck;
  if (std::string e = train::read_checkpoint_info(step_dir, &ck); !e.empty()) user_error(e);
  for (const train::CheckpointInfo::File& f : ck.files)
    if (std::string e = train::verify_checkpoint_file(ck, f); !e.empty()) user_error(e);
  return ck;
}

// The model parameters of a checkpoint (neither optimizer state nor data position), whatever
// layout saved them: each parameter is assembled globally from the saved TP files (one file in
// memory at a time), then this rank's shard is cut from it. Every rank reads the same files, so
// every rank meets the same error.
void load_checkpoint_params_or_die(const train::CheckpointInfo& ck, model::Qwen35Model& net,
                                   const dist::ProcessGroups& pg) {
  const std::vector<model::Param*> params = net.params();
  std::map<std::string, const train::CheckpointInfo::ParamEntry*> saved;
  for (const auto& e : ck.params) saved[e.name] = &e;
  std::vector<Tensor> global(params.size());  // [spec.shape] f32 host
  for (size_t i = 0; i < params.size(); ++i) {
    const model::ParamSpec& s = params[i]->spec;
    auto it = saved.find(s.name);
    if (it == saved.end()) user_error(fmt::format("checkpoint {} has no parameter {}", ck.dir, s.name));
    if (it->second->tp_dim != s.tp_dim)
      user_error(fmt::format("checkpoint {}: parameter {} was split along dim {}, this model splits dim {}", ck.dir,
                             s.name, it->second->tp_dim, s.tp_dim));
    global[i] = Tensor::empty(s.shape, DType::f32);
  }
  for (int q = 0; q < ck.tp; ++q) {
    const std::string path = (std::filesystem::path(ck.dir) / train::shard_file_name(q, ck.tp)).string();
    io::SafetensorsFile f;
    if (std::string e = io::read_safetensors(path, &f); !e.empty()) user_error(e);
    for (size_t i = 0; i < params.size(); ++i) {
      const model::ParamSpec& s = params[i]->spec;
      if (s.tp_dim < 0 && q > 0) continue;  // replicated: every file holds it whole
      const Shape want = model::local_shape(s, ck.tp);
      auto it = f.tensors.find(s.name);
      if (it == f.tensors.end()) user_error(fmt::format("{}: tensor {} is missing", path, s.name));
      if (it->second.dtype() != DType::f32 || it->second.shape() != want)
        user_error(fmt::format("{}: tensor {} is {} {}, expected f32 {}", path, s.name, dtype_name(it->second.dtype()),
                               it->second.shape().str(), want.str()));
      if (s.tp_dim < 0) {
        ops::copy(global[i], it->second);
        continue;
      }
      for (const model::ShardPiece& pc : model::shard_pieces(s, ck.tp, q))
        ops::copy(global[i].view().slice(s.tp_dim, pc.global_off, pc.global_off + pc.len),
                  it->second.view().slice(s.tp_dim, pc.local_off, pc.local_off + pc.len));
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    model::Param& p = *params[i];
    Tensor local = Tensor::empty(p.master.shape(), DType::f32);
    model::shard_from_global(local, global[i], p.spec, pg.dims.tp, pg.coord.tp);
    ops::copy(p.master, p.master.device().is_cpu() ? local : ops::to_device(local, p.master.device()));
    model::refresh_compute(p);
  }
  if (dist::world_rank() == 0) {
    std::printf("loaded checkpoint %s (step %lld, saved at tp %d): %zu parameters\n", ck.dir.c_str(),
                static_cast<long long>(ck.step), ck.tp, params.size());
    std::fflush(stdout);
  }
}

}  // namespace

int run_export_hf(const ExportHfOptions& o) {
  const train::CheckpointInfo ck = read_checkpoint_or_die(o.checkpoint);
  DType dtype = DType::f32;
  std::string why = "no checkpoint.init_from_hf in the saved config";
  if (!o.dtype.empty()) {
    if (!try_parse_dtype(o.dtype, &dtype) || !(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16))
      user_error(fmt::format("export-hf: --dtype {} is not one of f32, bf16, f16", o.dtype));
    why = "--dtype";
  } else if (const std::string& src = ck.config.checkpoint.init_from_hf; !src.empty()) {
    if (std::string e = model::read_hf_dtype(src, &dtype); e.empty()) {
      why = "the dtype of checkpoint.init_from_hf " + src;
    } else {
      dtype = DType::f32;
      why = fmt::format("checkpoint.init_from_hf {} is unreadable ({}) ---> hint: --dtype", src, e);
    }
  }
  // Every rank holds the whole model (tp 1); rank 0 writes.
  dist::ParallelDims dims{1, 1, -1};
  if (std::string e = dims.resolve(dist::world_size()); !e.empty()) user_error(e);
  dist::ProcessGroups pg = dist::ProcessGroups::build(dims, dist::Backend::mpi);
  layers::RunCtx ctx;
  ctx.pg = &pg;
  ctx.device = Device::cpu();
  ctx.act_dtype = DType::f32;
  ctx.seed = ck.seed;
  model::Qwen35Model net(ck.config.model, ctx);
  load_checkpoint_params_or_die(ck, net, pg);
  if (dist::world_rank() == 0) std::printf("export-hf: dtype %s (%s)\n", dtype_name(dtype), why.c_str());
  model::export_hf_or_die(o.out, net, pg, dtype);
  return 0;
}

int run_eval(const EvalOptions& o) {
  std::vector<std::string> sets = o.sets;
  if (!o.data.empty()) sets.push_back("data.prefix=" + o.data);
  if (o.max_tokens >= 0) sets.push_back("data.max_tokens=" + std::to_string(o.max_tokens));
  io::Config cfg;
  if (std::string e = io::load_config(o.config, sets, &cfg); !e.empty()) user_error(e);
  if (o.hf_model.empty() == o.checkpoint.empty())
    user_error("eval: give exactly one of --hf-model DIR and --checkpoint PATH (the model to evaluate)");
  if (std::string ov = io::model_override(sets); !ov.empty())
    user_error(fmt::format("eval: --set {}: the model section comes from {}, so a model.* override would be ignored "
                           "---> hint: drop it",
                           ov, o.checkpoint.empty() ? o.hf_model + "/config.json" : "the checkpoint " + o.checkpoint));
  train::CheckpointInfo ck;
  if (!o.checkpoint.empty()) {
    ck = read_checkpoint_or_die(o.checkpoint);
    cfg.model = ck.config.model;
  } else if (std::string e = model::read_hf_config(o.hf_model, &cfg.model); !e.empty()) {
    user_error(e);
  }
  cfg.data.shuffle = false;           // dataset order
  cfg.optimizer.name = "sgd";          // eval takes no step: no optimizer state to allocate
  cfg.checkpoint.init_from_hf = o.hf_model;
  cfg.checkpoint.export_hf.clear();
  cfg.checkpoint.dir.clear();
  // The trainer's setup: device (train.device), process groups (NCCL on GPUs), compute stream,
  // precision (train.precision), the model with the HF weights loaded (checkpoint.init_from_hf).
  train::Trainer trainer(cfg);
  model::Qwen35Model& net = trainer.model();
  const dist::ProcessGroups& pg = trainer.groups();
  const dist::ParallelDims dims = pg.dims;
  const Device dev = trainer.device();
  const Stream st = trainer.stream();
  if (!o.checkpoint.empty()) {
    load_checkpoint_params_or_die(ck, net, pg);
    trainer.synchronize_device();  // the load copies on the default stream
  }
  // Host sums over dp x cp (MPI, whatever the device groups are): ranks of one tp coordinate.
  std::unique_ptr<dist::Communicator> host_dp_cp = dist::split(dist::Backend::mpi, pg.coord.tp, dist::world_rank());
  // The TP x CP group on the host: its ranks must pack the same micro-batches (checked per
  // micro-batch; DP ranks may run different counts of them, so not over the world).
  std::unique_ptr<dist::Communicator> host_tp_cp = dist::split(dist::Backend::mpi, pg.coord.dp, dist::world_rank());
  const std::vector<int> one_group(size_t(host_tp_cp->size()), 0);

  data::PackerConfig pc = train::packer_config(cfg, dims);
  pc.shuffle = false;  // documents in dataset order
  data::IndexedDataset ds = data::IndexedDataset::open_or_die(cfg.data.prefix);

  // Where each document's tokens start in the dump: documents back to back, in dataset order.
  const int64_t D = ds.num_documents(), V = cfg.model.vocab_size;
  std::vector<int64_t> lengths(static_cast<size_t>(D)), doc_row(static_cast<size_t>(D) + 1, 0);
  for (int64_t d = 0; d < D; ++d) {
    lengths[size_t(d)] = ds.document_length(d);
    doc_row[size_t(d) + 1] = doc_row[size_t(d)] + lengths[size_t(d)];
  }
  // A token id past the vocab would index outside the embedding: every rank checks every
  // document up front, so every rank stops with the same message.
  for (int64_t d = 0; d < D; ++d) {
    const std::vector<int32_t> doc = ds.document(d);
    for (size_t k = 0; k < doc.size(); ++k)
      if (doc[k] >= V)
        user_error(fmt::format("eval: {}: document {} holds token id {} at position {}, outside the model's "
                               "vocab_size {}",
                               cfg.data.prefix, d, doc[k], k, V));
  }
  const bool dump = !o.dump_logits.empty();
  Tensor all_logits;  // [T_real, V] f32 host; rows of other ranks stay 0 until the reduction
  if (dump) all_logits = Tensor::zeros(Shape{doc_row.back(), V}, DType::f32);

  const std::vector<std::vector<data::DocPiece>> plan = data::plan_epoch(lengths, pc, 0);
  double loss_sum = 0;
  int64_t count = 0;
  for (size_t g = size_t(pg.coord.dp); g < plan.size(); g += size_t(dims.dp)) {  // DP rank r: r, r+dp, ...
    const data::MicroBatch mb = data::build_micro_batch(ds, pc, plan[g], 0, int64_t(g));
    data::PackedSeqParams psp = data::PackedSeqParams::build(mb.desc(pg.coord.cp), dev, st);
    const std::string mismatch =
        data::metadata_mismatch(*host_tp_cp, psp.checksum(), one_group, fmt::format("eval micro-batch {}", g));
    if (!mismatch.empty()) {  // group rank 0 prints it and aborts the job; its peers wait for that
      if (host_tp_cp->rank() == 0) user_error(mismatch, /*every_rank_knows=*/false);
      host_tp_cp->barrier();
    }
    layers::LmTargets tg = layers::targets_from_labels(mb.labels, psp, dev, st);
    Tensor ids = layers::local_token_ids(mb.tokens, psp, dev, st);
    layers::LmHeadLoss::Result r = net.forward(ids, psp, tg);
    loss_sum += double(ops::item(r.loss_sum, st));
    count += r.count;
    if (!dump) continue;
    Tensor lg = ops::to_host(net.logits(ids, psp), st);  // [T/cp, V] this CP rank's zig-zag rows
    const std::vector<int32_t>& cu_pad = psp.cu_seqlens_padded();
    const std::vector<int32_t>& cu = psp.cu_seqlens();
    for (int64_t l = 0; l < psp.tokens_cp(); ++l) {
      const int64_t x = psp.cp() == 1 ? l : data::zigzag_local_to_global(cu_pad, psp.cp(), psp.cp_rank(), l);
      const size_t i = size_t(std::upper_bound(cu_pad.begin(), cu_pad.end(), int32_t(x)) - cu_pad.begin() - 1);
      const int64_t off = x - cu_pad[i];
      if (i >= mb.pieces.size() || off >= cu[i + 1] - cu[i]) continue;  // padding
      const data::DocPiece& p = mb.pieces[i];
      std::memcpy(all_logits.ptr<float>() + (doc_row[size_t(p.doc)] + p.begin + off) * V, lg.ptr<float>() + l * V,
                  size_t(V) * sizeof(float));
    }
  }
  // TP ranks of a group hold the same sums and rows: reduce over dp x cp only.
  loss_sum = sum_over(host_dp_cp.get(), loss_sum);
  const int64_t predicted = int64_t(std::llround(sum_over(host_dp_cp.get(), double(count))));
  if (dump && host_dp_cp->size() > 1) host_dp_cp->all_reduce(all_logits, dist::ReduceOp::sum);
  const double loss = predicted > 0 ? loss_sum / double(predicted) : 0.0;
  const std::string line = fmt::format("{{\"loss\": {:.9g}, \"predicted_tokens\": {}, \"perplexity\": {:.9g}}}", loss,
                                       predicted, std::exp(loss));
  if (dist::world_rank() == 0) {
    if (dump) {
      const std::map<std::string, std::string> meta = {
          {"loss", fmt::format("{:.17g}", loss)},
          {"loss_sum", fmt::format("{:.17g}", loss_sum)},
          {"predicted_tokens", std::to_string(predicted)},
          {"documents", std::to_string(D)},
          {"data", cfg.data.prefix},
          {"model", o.checkpoint.empty() ? o.hf_model : ck.dir}};
      if (std::string e = io::write_safetensors(o.dump_logits, {{"logits", all_logits.view()}}, meta); !e.empty())
        user_error("eval: --dump-logits: " + e, false);
    }
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace dt::cli
