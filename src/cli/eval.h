// deltatron eval: the mean next-token loss of a model on an indexed dataset, and deltatron
// export-hf: a checkpoint as an HF directory (docs/hf.md). The model comes from an HF directory
// or from a deltatron checkpoint (train/checkpoint.h) saved under any layout.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dt::cli {

struct EvalOptions {
  std::string hf_model;                  // an HF Qwen3.5 directory (weights and model config), or
  std::string checkpoint;                // a deltatron checkpoint: a step directory or a checkpoint.dir
  std::string config;                    // optional YAML (parallel, data sections); "" = defaults
  std::vector<std::string> sets;         // section.key=value overrides, in order
  std::string data;                      // dataset PREFIX (data.prefix)
  int64_t max_tokens = -1;               // data.max_tokens (tokens per micro-batch); -1: the config's
  std::string dump_logits;               // safetensors file for the logits of every real token
};

// Evaluates every document once, in dataset order, packed as training packs them (documents
// longer than data.max_tokens are split into pieces: the recurrence restarts at each piece, and
// a piece's last token predicts the next piece's first). Rank 0 prints one JSON line {"loss",
// "predicted_tokens", "perplexity"}; loss is the mean next-token loss inside documents
// (layers::targets_from_labels of the packer's labels, the training definition), so
// predicted_tokens is the dataset's tokens minus one per document whatever data.max_tokens is. --dump-logits writes `logits` [T_real, vocab] f32: every real token in dataset
// order (document after document), with the result in the file's metadata. Returns the exit code.
int run_eval(const EvalOptions& o);

struct ExportHfOptions {
  std::string checkpoint;  // a step directory, or a checkpoint.dir whose `latest` names one
  std::string out;         // the HF directory to write
  std::string dtype;       // f32 | bf16 | f16; "": the source dtype (below)
};
// Writes the checkpoint's model as an HF directory (config.json, model.safetensors). The dtype by
// default is the source dtype: that of the HF directory the run was initialised from
// (checkpoint.init_from_hf of the saved config, when its config.json is still there), else f32.
int run_export_hf(const ExportHfOptions& o);

}  // namespace dt::cli
