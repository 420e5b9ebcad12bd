// Experiment configuration: typed sections filled from a YAML file, with dotted
// `section.key=value` overrides merged on top (never ignored). One field table describes every
// key (name, type, default, help); loading, the unknown-key check with a did-you-mean, type
// errors, printing the resolved config and docs/config.md all read it. Errors are values
// naming the key, the value and the rule; nothing reaches the kernels but typed structs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dt::io {

struct ModelConfig {  // field names as in HF's config.json (Qwen3.5 text)
  int64_t vocab_size = 248320;
  int64_t hidden_size = 1024;
  int64_t intermediate_size = 3584;
  int64_t num_hidden_layers = 24;
  std::vector<std::string> layer_types;  // empty: 3 linear_attention then 1 full_attention, repeated
  int64_t linear_num_key_heads = 16;
  int64_t linear_num_value_heads = 16;
  int64_t linear_key_head_dim = 128;
  int64_t linear_value_head_dim = 128;
  int64_t linear_conv_kernel_dim = 4;
  int64_t num_attention_heads = 8;
  int64_t num_key_value_heads = 2;
  int64_t head_dim = 256;
  double partial_rotary_factor = 0.25;
  double rope_theta = 10000000.0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = true;
  double initializer_range = 0.02;
};

struct ParallelConfig {
  int64_t tp = 1;
  int64_t cp = 1;
  int64_t dp = -1;  // -1: inferred from the world size
  bool sp = false;
};

struct DataConfig {
  std::string prefix;         // indexed dataset PREFIX (.bin/.idx)
  int64_t max_tokens = 8192;  // physical tokens per micro-batch (all CP ranks together)
  bool shuffle = true;
  int64_t pad_multiple = 0;   // 0: 2*cp when cp > 1, else 1
};

struct OptimizerConfig {
  std::string name = "adamw";  // adamw | sgd
  double lr = 3e-4;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double clip_grad = 1.0;  // global grad-norm clip; 0 = off
};

struct ScheduleConfig {
  std::string name = "cosine";  // constant | cosine
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.1;
};

struct TrainConfig {
  int64_t steps = 100;
  int64_t seed = 1234;
  std::string device = "auto";      // auto | cpu | cuda
  std::string precision = "bf16";   // bf16 | fp32
  int64_t grad_accum = 1;
  int64_t max_nonfinite_in_a_row = 5;
  bool overlap_grad_reduce = true;  // dp x cp gradient sums of each layer during the rest of the backward
  bool overlap_embedding_reduce = false;  // with it: the embedding's sum starts after the last forward
};

struct AttentionKernelConfig {  // section `attention`: kernel choice of the gated attention layers
  std::string backend = "auto";  // auto | cudnn | native (CUDA only; the CPU has one reference)
};

struct GdnKernelConfig {  // section `gdn`: how the GatedDeltaNet layers run
  std::string cp_a2a = "fused";         // fused | per_sequence (CP all-to-all; bitwise equal)
  std::string cp_comm = "auto";   // auto | all_to_all | all_gather (CP data movement; docs/parallelism.md)
  bool save_chunk_intermediates = true;  // CUDA: the chunk kernel's forward hands W, U, Tm, h to its backward
  bool recompute_elementwise = true;     // backward recomputes conv output, l2norm(q, k) and z from hp
  bool recompute_v = true;               // with recompute_elementwise: v too (false: the forward keeps v)
};

struct CheckpointConfig {
  std::string dir;
  int64_t interval = 0;  // steps; 0 = only at the end when dir is set
  int64_t keep_last = 3;
  bool resume = true;        // start from dir/latest when it exists
  std::string load;          // a step directory to start from (any layout); overrides resume
  std::string init_from_hf;  // an HF Qwen3.5 directory whose weights initialise the model
  std::string export_hf;     // write an HF directory here at the end of the run
};

struct LoggingConfig {
  std::string metrics_jsonl;
  int64_t log_interval = 1;
};

struct Config {
  ModelConfig model;
  ParallelConfig parallel;
  DataConfig data;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  AttentionKernelConfig attention;
  GdnKernelConfig gdn;
  TrainConfig train;
  CheckpointConfig checkpoint;
  LoggingConfig logging;
};

// Reads `path` (empty: defaults only), then applies each "section.key=value" override in
// order. "" on success, else one message naming the key, the value and the rule (unknown keys
// get the nearest valid key as a hint).
std::string load_config(const std::string& path, const std::vector<std::string>& overrides, Config* out);
// The first override of the model section ("model.key=value"), or "". The CLI refuses one where
// the model comes from elsewhere (an HF directory, a checkpoint), which would drop it silently.
std::string model_override(const std::vector<std::string>& overrides);
// Cross-field rules, checked before any compute (heads divisible by tp*cp, max_tokens a
// multiple of 2*cp, enum values, ...). world_size <= 0 skips the layout product check.
std::string validate_config(const Config& c, int world_size);
// The resolved config as YAML (every key, in table order): printed in the banner and saved
// with each checkpoint; load_config of it gives the same Config.
std::string config_to_yaml(const Config& c);
// The key table as Markdown (docs/config.md is generated from it and checked by a test).
std::string config_keys_markdown();
// The layer types in effect (layer_types, or the default 3:1 pattern).
std::vector<std::string> resolved_layer_types(const ModelConfig& m);

}  // namespace dt::io
