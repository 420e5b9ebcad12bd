// deltatron eval: the mean next-token loss of a model on an indexed dataset (docs/hf.md).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dt::cli {

struct EvalOptions {
  std::string hf_model;                  // an HF Qwen3.5 directory (weights and model config)
  std::string config;                    // optional YAML (parallel, data sections); "" = defaults
  std::vector<std::string> sets;         // section.key=value overrides, in order
  std::string data;                      // dataset PREFIX (data.prefix)
  int64_t max_tokens = -1;               // data.max_tokens (tokens per micro-batch); -1: the config's
  std::string dump_logits;               // safetensors file for the logits of every real token
};

// Evaluates every document once, in dataset order, packed as training packs them (documents
// longer than data.max_tokens are split into pieces: the recurrence and the targets restart at
// each piece). Rank 0 prints one JSON line {"loss", "predicted_tokens", "perplexity"}; loss is
// the mean next-token loss inside documents (layers::next_token_targets, the training
// definition). --dump-logits writes `logits` [T_real, vocab] f32: every real token in dataset
// order (document after document), with the result in the file's metadata. Returns the exit code.
int run_eval(const EvalOptions& o);

}  // namespace dt::cli
