// deltatron eval (src/cli/eval.h): HF weights -> Qwen35Model -> every document of the dataset
// once, in dataset order -> one JSON line, optionally the logits of every real token.
#include "cli/eval.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
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

}  // namespace

int run_eval(const EvalOptions& o) {
  const int world = dist::world_size();
  std::vector<std::string> sets = o.sets;
  if (!o.data.empty()) sets.push_back("data.prefix=" + o.data);
  if (o.max_tokens >= 0) sets.push_back("data.max_tokens=" + std::to_string(o.max_tokens));
  io::Config cfg;
  if (std::string e = io::load_config(o.config, sets, &cfg); !e.empty()) user_error(e);
  if (o.hf_model.empty()) user_error("eval: --hf-model DIR is required (the model to evaluate)");
  if (std::string e = model::read_hf_config(o.hf_model, &cfg.model); !e.empty()) user_error(e);
  cfg.data.shuffle = false;  // dataset order
  if (std::string e = io::validate_config(cfg, world); !e.empty()) user_error(e);
  if (cfg.data.prefix.empty()) user_error("eval: data.prefix is empty ---> hint: --data PREFIX");
  if (cfg.train.device == "cuda")
    user_error("train.device = 'cuda': eval runs on the CPU backend for now ---> hint: --set train.device=cpu");
  const Device dev = Device::cpu();
  dist::ParallelDims dims{int(cfg.parallel.tp), int(cfg.parallel.cp), int(cfg.parallel.dp)};
  if (std::string e = dims.resolve(world); !e.empty()) user_error(e);
  dist::ProcessGroups pg = dist::ProcessGroups::build(dims, dist::Backend::mpi);

  data::PackerConfig pc;
  pc.max_tokens = cfg.data.max_tokens;
  pc.pad_multiple = cfg.data.pad_multiple;
  pc.shuffle = false;
  pc.seed = uint64_t(cfg.train.seed);
  pc.sp = cfg.parallel.sp ? dims.tp : 1;
  pc.cp = dims.cp;
  pc.dp = dims.dp;
  if (std::string e = data::validate_packer_config(pc); !e.empty()) user_error(e);
  data::IndexedDataset ds = data::IndexedDataset::open_or_die(cfg.data.prefix);

  layers::RunCtx ctx;
  ctx.pg = &pg;
  ctx.sp = cfg.parallel.sp;
  ctx.device = dev;
  ctx.act_dtype = DType::f32;
  ctx.seed = uint64_t(cfg.train.seed);
  model::Qwen35Model net(cfg.model, ctx);
  model::load_hf_weights_or_die(o.hf_model, net, pg);

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
    data::PackedSeqParams psp = data::PackedSeqParams::build(mb.desc(pg.coord.cp), dev);
    layers::LmTargets tg = layers::next_token_targets(mb.tokens, psp, dev);
    Tensor ids = layers::local_token_ids(mb.tokens, psp, dev);
    layers::LmHeadLoss::Result r = net.forward(ids, psp, tg);
    loss_sum += double(ops::item(r.loss_sum));
    count += r.count;
    if (!dump) continue;
    Tensor lg = ops::to_host(net.logits(ids, psp));  // [T/cp, V] this CP rank's zig-zag rows
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
  loss_sum = sum_over(pg.dp_cp.get(), loss_sum);
  const int64_t predicted = int64_t(std::llround(sum_over(pg.dp_cp.get(), double(count))));
  if (dump && pg.dp_cp && pg.dp_cp->size() > 1) pg.dp_cp->all_reduce(all_logits, dist::ReduceOp::sum);
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
          {"model", o.hf_model}};
      if (std::string e = io::write_safetensors(o.dump_logits, {{"logits", all_logits.view()}}, meta); !e.empty())
        user_error("eval: --dump-logits: " + e, false);
    }
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace dt::cli
