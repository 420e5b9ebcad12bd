#include "deltatron/train/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>

#include "deltatron/core/log.h"
#include "deltatron/data/indexed_dataset.h"
#include "deltatron/data/packed_seq.h"
#include "deltatron/data/packer.h"
#include "deltatron/dist/comm.h"
#include "deltatron/dist/parallel.h"
#include "deltatron/layers/embedding.h"
#include "deltatron/layers/lm_head.h"
#include "deltatron/model/grad_reduce.h"
#include "deltatron/model/hf_io.h"
#include "deltatron/model/qwen35.h"
#include "deltatron/ops/basic.h"
#include "deltatron/train/checkpoint.h"
#include "deltatron/train/optimizer.h"
#include "deltatron/train/schedule.h"

namespace dt::train {

TrainResult run_training(const io::Config& cfg) {
  const int world = dist::world_size();
  if (std::string e = io::validate_config(cfg, world); !e.empty()) user_error(e);
  if (cfg.train.device == "cuda")
    user_error("train.device = 'cuda': the CUDA training path needs the gated-attention CUDA kernels (issue 5); "
               "---> hint: --set train.device=cpu");
  const Device dev = Device::cpu();  // auto -> cpu until the CUDA path exists
  dist::ParallelDims dims{int(cfg.parallel.tp), int(cfg.parallel.cp), int(cfg.parallel.dp)};
  if (std::string e = dims.resolve(world); !e.empty()) user_error(e);
  dist::ProcessGroups pg = dist::ProcessGroups::build(dims, dist::Backend::mpi);
  const int sp = cfg.parallel.sp ? dims.tp : 1;

  data::PackerConfig pc;
  pc.max_tokens = cfg.data.max_tokens;
  pc.pad_multiple = cfg.data.pad_multiple;
  pc.shuffle = cfg.data.shuffle;
  pc.seed = uint64_t(cfg.train.seed);
  pc.sp = sp;
  pc.cp = dims.cp;
  pc.dp = dims.dp;
  if (std::string e = data::validate_packer_config(pc); !e.empty()) user_error(e);
  if (cfg.data.prefix.empty()) user_error("config: data.prefix is empty ---> hint: --data PREFIX or --set data.prefix=...");
  data::IndexedDataset ds = data::IndexedDataset::open_or_die(cfg.data.prefix);
  data::PackedLoader loader(ds, pc, pg.coord.dp);

  layers::RunCtx ctx;
  ctx.pg = &pg;
  ctx.sp = cfg.parallel.sp;
  ctx.device = dev;
  ctx.act_dtype = DType::f32;  // fp32 throughout on the CPU
  ctx.seed = uint64_t(cfg.train.seed);
  model::Qwen35Model net(cfg.model, ctx);
  const DType hf_dtype = cfg.checkpoint.init_from_hf.empty()  // the export keeps the source dtype
                             ? DType::f32 : model::load_hf_weights_or_die(cfg.checkpoint.init_from_hf, net, pg).source_dtype;
  std::vector<model::Param*> params = net.params();
  Optimizer opt(cfg.optimizer, params);
  LrSchedule schedule(cfg.schedule, cfg.optimizer.lr, cfg.train.steps);
  StepGuard guard(cfg.train.max_nonfinite_in_a_row);

  int64_t n_params = 0;
  for (const model::ParamSpec& s : model::Qwen35Model::param_specs(cfg.model, cfg.parallel.sp)) n_params += s.shape.numel();
  const bool rank0 = dist::world_rank() == 0;
  if (rank0) {
    std::printf("deltatron train: %lld parameters, %zu layers, world %d = tp %d x cp %d x dp %d (sp %s), %s fp32\n",
                static_cast<long long>(n_params), size_t(net.num_layers()), world, dims.tp, dims.cp, dims.dp,
                cfg.parallel.sp ? "on" : "off", dev.str().c_str());
    std::printf("--- resolved config ---\n%s-----------------------\n", io::config_to_yaml(cfg).c_str());
  }
  std::ofstream jsonl;
  if (rank0 && !cfg.logging.metrics_jsonl.empty()) jsonl.open(cfg.logging.metrics_jsonl, std::ios::trunc);

  const TrainState ckpt{&cfg, &pg, params, &opt, &guard, &loader, &ds, pc, {}};  // train/checkpoint.h
  const int64_t first_step = resume_if_asked(ckpt);

  TrainResult out;
  const auto t_start = std::chrono::steady_clock::now();
  for (int64_t step = first_step; step < cfg.train.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    // The micro-batches of this step, their metadata and targets built on the host first, so
    // the global predicted-token count (the loss denominator) is known before any backward.
    struct Micro {
      data::MicroBatch mb;
      std::unique_ptr<data::PackedSeqParams> psp;
      layers::LmTargets tg;
      Tensor ids;
    };
    std::vector<Micro> micro(size_t(cfg.train.grad_accum));
    Tensor count = Tensor::zeros(Shape{1}, DType::i64);
    int64_t tokens = 0;
    for (Micro& m : micro) {
      m.mb = loader.next();
      m.psp = std::make_unique<data::PackedSeqParams>(data::PackedSeqParams::build(m.mb.desc(pg.coord.cp), dev));
      m.tg = layers::next_token_targets(m.mb.tokens, *m.psp, dev);
      m.ids = layers::local_token_ids(m.mb.tokens, *m.psp, dev);
      *count.ptr<int64_t>() += m.tg.count;
      tokens += m.mb.real_tokens();
    }
    if (dims.dp * dims.cp > 1) pg.dp_cp->all_reduce(count, dist::ReduceOp::sum);
    const int64_t global_count = *count.ptr<int64_t>();
    double loss_sum = 0;
    for (Micro& m : micro) {
      layers::LmHeadLoss::Result r = net.forward(m.ids, *m.psp, m.tg);
      loss_sum += model::global_loss(r, pg).sum;
      net.backward(float(1.0 / double(std::max<int64_t>(global_count, 1))));
    }
    const double loss = global_count > 0 ? loss_sum / double(global_count) : 0.0;
    model::reduce_grads(params, pg);
    const double norm = global_grad_norm(params, pg);
    StepVerdict v = guard.check(step, loss, norm);
    if (!v.error.empty()) user_error(v.error);
    const double lr = schedule.lr(step);
    if (v.apply) opt.step(params, float(lr), clip_coefficient(norm, cfg.optimizer.clip_grad));
    zero_grads(params);
    out.losses.push_back(loss);

    Tensor tok = Tensor::empty(Shape{1}, DType::i64);
    *tok.ptr<int64_t>() = tokens;
    if (dims.dp > 1) pg.dp->all_reduce(tok, dist::ReduceOp::sum);  // real tokens of the global batch
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const double tok_s = double(*tok.ptr<int64_t>()) / (ms * 1e-3);
    if (rank0 && (step % std::max<int64_t>(cfg.logging.log_interval, 1) == 0 || step + 1 == cfg.train.steps)) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
      const double eta = elapsed / double(step + 1) * double(cfg.train.steps - step - 1);
      std::printf("step %5lld/%lld | loss %.4f | grad_norm %.3f | lr %.3e | %.0f ms | %.0f tok/s | skipped %lld | "
                  "ETA %.0f s\n",
                  static_cast<long long>(step + 1), static_cast<long long>(cfg.train.steps), loss, norm, lr, ms, tok_s,
                  static_cast<long long>(guard.skipped()), eta);
      std::fflush(stdout);
    }
    if (jsonl.is_open())
      jsonl << fmt::format(
          "{{\"step\": {}, \"loss\": {:.6f}, \"grad_norm\": {:.6f}, \"lr\": {:.6e}, \"step_ms\": {:.3f}, "
          "\"tokens_per_s\": {:.1f}, \"skipped\": {}}}\n",
          step + 1, loss, norm, lr, ms, tok_s, guard.skipped())
            << std::flush;
    maybe_save(ckpt, step + 1);
  }
  out.skipped = guard.skipped();
  if (!cfg.checkpoint.export_hf.empty()) model::export_hf_or_die(cfg.checkpoint.export_hf, net, pg, hf_dtype);
  return out;
}

}  // namespace dt::train
