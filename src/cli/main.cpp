// deltatron: the command-line entry point. Until the trainer exists it offers
//   deltatron env                                  environment banner (every rank's host and devices)
//   deltatron selfcheck [--tp N --cp N --dp N]     builds the process groups and checks every collective
//                       [--backend mpi|nccl|staged] [--dtype f32|bf16|...]
//   deltatron train [--config FILE] [--set section.key=value]... [--data PREFIX] [--steps N]
//                   [--init-from-hf DIR] [--export-hf DIR]
//                                                  trains on the CPU or GPUs (docs/training.md); HF interop: docs/hf.md
//   deltatron eval --hf-model DIR | --checkpoint PATH --data PREFIX [--max-tokens N] [--dump-logits FILE]
//                  [--config FILE] [--set ...]    mean next-token loss, one JSON line (docs/hf.md)
//   deltatron export-hf --checkpoint PATH --out DIR [--dtype f32|bf16|f16]
//                                                  a checkpoint's model as an HF directory (docs/hf.md)
//   deltatron make-corpus --prefix P [--docs N --seed S --vocab V]
//                                                  writes the synthetic quickstart corpus (indexed dataset)
#include <CLI/CLI.hpp>

#include <cstdio>
#include <new>
#include <string>
#include <vector>

#include "cli/eval.h"
#include "cli/selfcheck.h"
#include "deltatron/core/check.h"
#include "deltatron/core/sysinfo.h"
#include "deltatron/data/indexed_dataset.h"
#include "deltatron/data/synthetic.h"
#include "deltatron/io/config.h"
#include "deltatron/model/hf_io.h"
#include "deltatron/train/trainer.h"
#include "deltatron/dist/comm.h"

namespace {
// An integer option's lower bound (its default may be a "not given" sentinel below it, so a value
// under it must be an error, not silently the default).
CLI::Validator at_least(int64_t lo) {
  return CLI::Validator(
      [lo](std::string& s) {
        int64_t v = 0;
        if (!CLI::detail::lexical_cast(s, v)) return "'" + s + "' is not an integer";
        return v < lo ? "must be >= " + std::to_string(lo) + ", got " + s : std::string();
      },
      ">=" + std::to_string(lo));
}
}  // namespace

int main(int argc, char** argv) {
  dt::dist::init(&argc, &argv);
  CLI::App app{"deltatron: packed-sequence training runtime for hybrid Gated DeltaNet models"};
  app.require_subcommand(1);

  auto* env = app.add_subcommand("env", "print the environment banner");
  dt::cli::SelfcheckOptions sc;
  auto* self = app.add_subcommand("selfcheck", "build the process groups and check every collective on each");
  self->add_option("--tp", sc.tp, "tensor-parallel size");
  self->add_option("--cp", sc.cp, "context-parallel size");
  self->add_option("--dp", sc.dp, "data-parallel size (-1: inferred)");
  self->add_option("--backend", sc.backend,
                   "mpi (CPU tensors), nccl (CUDA tensors) or staged (CUDA tensors through MPI; ranks may share a GPU)");
  self->add_option("--dtype", sc.dtype, "element type of the checked tensors");

  std::string train_config, train_data, train_init_hf, train_export_hf;
  std::vector<std::string> train_sets;
  int64_t train_steps = -1;
  auto* train = app.add_subcommand("train", "train a hybrid model from a YAML experiment");
  train->add_option("--config", train_config, "YAML experiment file (default: the defaults of docs/config.md)");
  train->add_option("--set", train_sets, "override section.key=value (repeatable, applied in order)");
  train->add_option("--data", train_data, "dataset PREFIX (same as --set data.prefix=PREFIX)");
  train->add_option("--steps", train_steps, "optimizer steps (same as --set train.steps=N)")
      ->check(at_least(0));
  train->add_option("--init-from-hf", train_init_hf,
                    "initialise from an HF Qwen3.5 directory; its config.json sets the model section "
                    "(same as --set checkpoint.init_from_hf=DIR)");
  train->add_option("--export-hf", train_export_hf,
                    "write an HF directory at the end of the run (same as --set checkpoint.export_hf=DIR)");

  dt::cli::EvalOptions ev;
  auto* eval = app.add_subcommand("eval", "mean next-token loss of a model on a dataset (one JSON line)");
  eval->add_option("--hf-model", ev.hf_model, "HF Qwen3.5 directory to evaluate");
  eval->add_option("--checkpoint", ev.checkpoint, "deltatron checkpoint to evaluate (step dir or checkpoint.dir)");
  eval->add_option("--data", ev.data, "dataset PREFIX (same as --set data.prefix=PREFIX)");
  eval->add_option("--max-tokens", ev.max_tokens, "tokens per micro-batch (same as --set data.max_tokens=N)")
      ->check(at_least(1));
  eval->add_option("--dump-logits", ev.dump_logits, "write the logits [T_real, vocab] f32 of every real token here");
  eval->add_option("--config", ev.config, "YAML file for the parallel and data sections");
  eval->add_option("--set", ev.sets, "override section.key=value (repeatable, applied in order)");

  dt::cli::ExportHfOptions ex;
  auto* export_hf = app.add_subcommand("export-hf", "write a checkpoint's model as an HF Qwen3.5 directory");
  export_hf->add_option("--checkpoint", ex.checkpoint, "step directory, or checkpoint.dir (its latest)")->required();
  export_hf->add_option("--out", ex.out, "HF directory to write (config.json, model.safetensors)")->required();
  export_hf->add_option("--dtype", ex.dtype, "f32 | bf16 | f16 (default: the source dtype)");

  std::string corpus_prefix;
  int64_t corpus_docs = 20000, corpus_seed = 1234, corpus_vocab = 64;
  auto* corpus = app.add_subcommand("make-corpus", "write the synthetic corpus (copy / sort / add documents)");
  corpus->add_option("--prefix", corpus_prefix, "output PREFIX (PREFIX.bin, PREFIX.idx)")->required();
  corpus->add_option("--docs", corpus_docs, "number of documents");
  corpus->add_option("--seed", corpus_seed, "seed");
  corpus->add_option("--vocab", corpus_vocab, "vocabulary size");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = dt::dist::world_rank() == 0 ? app.exit(e) : (e.get_exit_code() ? 1 : 0);
    dt::dist::finalize();
    return rc;
  }
  // An exception that escapes (std::bad_alloc from a size far too large, a library's throw) ends
  // the job with one line naming it instead of std::terminate's core dump, on every rank.
  int rc = 0;
  try {
    if (*env) rc = dt::cli::print_env();
    if (*self) rc = dt::cli::selfcheck(sc);
    if (*train) {
      if (!train_data.empty()) train_sets.push_back("data.prefix=" + train_data);
      if (train_steps >= 0) train_sets.push_back("train.steps=" + std::to_string(train_steps));
      if (!train_init_hf.empty()) train_sets.push_back("checkpoint.init_from_hf=" + train_init_hf);
      if (!train_export_hf.empty()) train_sets.push_back("checkpoint.export_hf=" + train_export_hf);
      dt::io::Config cfg;
      if (std::string e = dt::io::load_config(train_config, train_sets, &cfg); !e.empty()) dt::user_error(e);
      if (!cfg.checkpoint.init_from_hf.empty()) {  // the HF directory's architecture replaces the model section
        if (std::string o = dt::io::model_override(train_sets); !o.empty())
          dt::user_error(fmt::format("--set {}: the model section comes from {}/config.json (checkpoint.init_from_hf), "
                                     "so a model.* override would be ignored ---> hint: drop it, or edit config.json",
                                     o, cfg.checkpoint.init_from_hf));
        if (std::string e = dt::model::read_hf_config(cfg.checkpoint.init_from_hf, &cfg.model); !e.empty())
          dt::user_error(e);
        if (dt::dist::world_rank() == 0)
          std::printf("model section from %s/config.json (checkpoint.init_from_hf)\n",
                      cfg.checkpoint.init_from_hf.c_str());
      }
      dt::train::run_training(cfg);
    }
    if (*eval) rc = dt::cli::run_eval(ev);
    if (*export_hf) rc = dt::cli::run_export_hf(ex);
    if (*corpus && dt::dist::world_rank() == 0) {  // one writer
      std::string err = dt::data::write_synthetic_corpus(corpus_prefix, corpus_docs, uint64_t(corpus_seed), corpus_vocab);
      if (!err.empty()) dt::user_error(err, false);
      // Read it back through the indexed-dataset reader and check every document's structure.
      dt::data::IndexedDataset ds;
      if (std::string e = dt::data::IndexedDataset::open(corpus_prefix, &ds); !e.empty()) dt::user_error(e, false);
      for (int64_t d = 0; d < ds.num_documents(); ++d)
        if (std::string e = dt::data::check_synthetic_document(ds.document(d), corpus_vocab); !e.empty())
          dt::user_error(fmt::format("{}: document {}: {}", corpus_prefix, d, e), false);
      std::printf("wrote %lld synthetic documents to %s.bin / .idx (vocab %lld, seed %lld); read back and checked\n",
                  static_cast<long long>(corpus_docs), corpus_prefix.c_str(), static_cast<long long>(corpus_vocab),
                  static_cast<long long>(corpus_seed));
    }
  } catch (const std::bad_alloc&) {
    dt::user_error("out of host memory (std::bad_alloc): a size in the config or the data may be far too large", false);
  } catch (const std::exception& e) {
    dt::user_error(fmt::format("unexpected exception: {}", e.what()), false);
  }
  dt::dist::finalize();
  return rc;
}
