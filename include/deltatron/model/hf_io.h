// HF Qwen3.5 checkpoint directories (docs/hf.md): reading config.json and the weights into a
// Qwen35Model (each rank loads only its TP shard), and writing a directory transformers loads.
//
// Reading accepts
//   * config.json of Qwen3_5ForCausalLM (model_type qwen3_5_text) or of the VL wrapper
//     (model_type qwen3_5, the text model under `text_config`);
//   * model.safetensors, or model.safetensors.index.json and its shards; f32, bf16 or f16
//     tensors (cast to the fp32 master weights).
// Names come from one table of layouts (kHfLayouts in hf_io.cpp): our ParamSpec names are HF's
// Qwen3_5ForCausalLM names, and the VL wrapper moves `model.` to `model.language_model.`;
// tensors of the parts we do not train (vision tower, MTP head) are ignored and said so once.
// Every error names the tensors: missing ones, unexpected ones, shape mismatches with both
// shapes, a config field that differs with both values.
// Writing gathers every parameter over TP and world rank 0 writes config.json
// (architectures ["Qwen3_5ForCausalLM"]) and model.safetensors in the requested dtype into a
// temporary directory, renamed into place once complete.
#pragma once
#include <string>
#include <vector>

#include "deltatron/core/dtype.h"
#include "deltatron/dist/parallel.h"
#include "deltatron/io/config.h"
#include "deltatron/model/qwen35.h"

namespace dt::model {

// config.json of `dir` -> the model config. "" on success, else the error (file, key, value, rule).
std::string read_hf_config(const std::string& dir, io::ModelConfig* out);
// The dtype config.json declares ("dtype", or the older "torch_dtype": float32 | bfloat16 |
// float16). "" on success; a file without either key gives f32.
std::string read_hf_dtype(const std::string& dir, DType* out);
// The config.json we write for `m` (Qwen3_5ForCausalLM, model_type qwen3_5_text, dtype named).
std::string hf_config_json(const io::ModelConfig& m, DType dtype);
// "" when the two configs describe the same architecture, else the first differing field
// with both values (`what_a`, `what_b` name the sources in the message).
std::string compare_model_configs(const io::ModelConfig& a, const char* what_a, const io::ModelConfig& b,
                                  const char* what_b);

// What load_hf_weights found.
struct HfLoadInfo {
  DType source_dtype = DType::f32;  // dtype of the checkpoint's tensors (the export default)
  std::string layout;               // which name layout matched (kHfLayouts)
  std::vector<std::string> ignored;  // tensors skipped on purpose (vision, MTP, a tied lm_head)
};

// Loads the HF checkpoint in `dir` into `net`: each rank matches names and shapes from the
// safetensors headers first, then reads the files one at a time (skipping those that hold only
// ignored tensors) and copies its TP shard of every parameter into the fp32 master (and
// refreshes the compute copy; CUDA copies run on the default stream). The config must match
// net.config(). "" on success, else the error (the same on every rank: the inputs are).
std::string load_hf_weights(const std::string& dir, Qwen35Model& net, const dist::ProcessGroups& pg,
                            HfLoadInfo* info);
// The same; an error ends every rank (dt::user_error). Rank 0 says what was loaded and ignored.
HfLoadInfo load_hf_weights_or_die(const std::string& dir, Qwen35Model& net, const dist::ProcessGroups& pg);

// Writes `dir`/config.json and `dir`/model.safetensors (every parameter gathered over TP, cast
// to `dtype`: f32, bf16 or f16) from world rank 0. Collective over pg.tp (every rank calls it).
// Rank 0 writes everything into the sibling `dir`.tmp, fsyncs it, and only then replaces `dir`
// (renamed aside to `dir`.old, the new one renamed in, the old one removed), so a failed export
// leaves an existing `dir` as it was. Files of an existing `dir` other than config.json,
// model.safetensors and model.safetensors.index.json (tokenizer files, ...) are carried into the
// new directory; the index is dropped (it would shadow model.safetensors). docs/hf.md.
// "" on success; a write error is known on rank 0 only.
std::string export_hf(const std::string& dir, Qwen35Model& net, const dist::ProcessGroups& pg, DType dtype);
// Whether an export to `out` can be written, checked without writing and without collectives
// (call it at startup, before training): `out` is not a file, an existing `out` is readable,
// and the nearest existing directory above it (where `out`.tmp is made) is writable. "" if so,
// else the error naming the path and the reason. export_hf checks it again itself.
std::string check_export_dir(const std::string& out);
// The same; an error aborts every rank (dt::user_error(..., false) on rank 0).
void export_hf_or_die(const std::string& dir, Qwen35Model& net, const dist::ProcessGroups& pg, DType dtype);

}  // namespace dt::model
