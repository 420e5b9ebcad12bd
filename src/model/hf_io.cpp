// HF Qwen3.5 checkpoint directories (include/deltatron/model/hf_io.h).
#include "deltatron/model/hf_io.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <unistd.h>

#include "deltatron/core/check.h"
#include "deltatron/dist/comm.h"
#include "deltatron/io/durable.h"
#include "deltatron/io/safetensors.h"
#include "deltatron/ops/basic.h"

namespace dt::model {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// How a checkpoint names the text model. Our names are Qwen3_5ForCausalLM's; a layout replaces
// the leading "model." (never "lm_head.") by its text prefix. Tensors under an ignored prefix
// belong to parts we do not train.
struct HfLayout {
  const char* name;
  const char* text_prefix;
  std::vector<std::string> ignored_prefixes;
};
const std::vector<HfLayout>& hf_layouts() {
  static const std::vector<HfLayout> k = {
      {"Qwen3_5ForCausalLM", "model.", {"mtp."}},
      {"Qwen3_5ForConditionalGeneration (VL wrapper, text part)", "model.language_model.", {"model.visual.", "mtp."}},
  };
  return k;
}

std::string file_name_of(const std::string& ours, const HfLayout& l) {
  static const std::string m = "model.";
  if (ours.compare(0, m.size(), m) == 0) return l.text_prefix + ours.substr(m.size());
  return ours;
}

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

// ---- config.json ----------------------------------------------------------------------------

std::string read_json(const fs::path& p, json* out) {
  std::ifstream f(p);
  if (!f) return fmt::format("HF checkpoint: cannot open {}", p.string());
  try {
    *out = json::parse(f);
  } catch (const std::exception& e) {
    return fmt::format("HF checkpoint: {} is not valid JSON: {}", p.string(), e.what());
  }
  if (!out->is_object()) return fmt::format("HF checkpoint: {} is not a JSON object", p.string());
  return "";
}

// Every value is checked for its JSON type before it is converted: nlohmann's get<int64_t>
// truncates 64.7 to 64, wraps 2**70 (a double to it) and turns true into 1.
// A missing key is an error only where `required`; null counts as missing (HF writes null for
// unset optional fields), except that a required key set to null is reported with its value.
const json* find_field(const json& j, const std::string& file, const char* key, bool required, std::string* e) {
  auto it = j.find(key);
  if (it == j.end() && required) *e = fmt::format("HF checkpoint: {}: key '{}' is missing", file, key);
  if (it == j.end() || (it->is_null() && !required)) return nullptr;
  return &*it;
}

// One value: `valid` holds for the JSON value (type and range), then it is converted; else the
// error says what `rule` asks for.
template <typename T, typename Valid>
std::string get_checked(const json& j, const std::string& file, const char* key, T* out, bool required, Valid valid,
                        const std::string& rule) {
  std::string e;
  const json* v = find_field(j, file, key, required, &e);
  if (!v) return e;
  if (!valid(*v)) return fmt::format("HF checkpoint: {}: key '{}' = {} must be {}", file, key, v->dump(), rule);
  *out = v->get<T>();
  return "";
}

// Sizes and counts: an integer JSON number (not 64.7, 64.0, "64" or true) in [lo, hi]. The
// default upper bound keeps the product of two sizes (vocab x hidden, ...) inside int64.
constexpr int64_t kMaxSize = 2147483647;
std::string get_int(const json& j, const std::string& file, const char* key, int64_t* out, bool required,
                    int64_t lo = 1, int64_t hi = kMaxSize) {
  const auto in_range = [&](const json& v) {
    if (v.is_number_unsigned()) return v.get<uint64_t>() <= uint64_t(hi) && int64_t(v.get<uint64_t>()) >= lo;
    return v.is_number_integer() && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
  };
  return get_checked(j, file, key, out, required, in_range, fmt::format("an integer in [{}, {}]", lo, hi));
}

// Real parameters: a finite JSON number (an integer is fine: HF writes rope_theta 10000) for
// which `ok` holds; `rule` says which numbers those are.
template <typename Pred>
std::string get_real(const json& j, const std::string& file, const char* key, double* out, bool required, Pred ok,
                     const char* rule) {
  const auto valid = [&](const json& v) { return v.is_number() && std::isfinite(v.get<double>()) && ok(v.get<double>()); };
  return get_checked(j, file, key, out, required, valid, rule);
}

std::string get_bool(const json& j, const std::string& file, const char* key, bool* out) {
  return get_checked(j, file, key, out, false, [](const json& v) { return v.is_boolean(); }, "true or false");
}

std::string get_string(const json& j, const std::string& file, const char* key, std::string* out) {
  return get_checked(j, file, key, out, false, [](const json& v) { return v.is_string(); }, "a string");
}

std::string get_string_list(const json& j, const std::string& file, const char* key, std::vector<std::string>* out) {
  const auto strings = [](const json& v) {
    return v.is_array() && std::all_of(v.begin(), v.end(), [](const json& x) { return x.is_string(); });
  };
  return get_checked(j, file, key, out, false, strings, "a list of strings");
}

}  // namespace

std::string read_hf_config(const std::string& dir, io::ModelConfig* out) {
  const fs::path path = fs::path(dir) / "config.json";
  const std::string file = path.string();
  json top;
  if (std::string e = read_json(path, &top); !e.empty()) return e;
  std::string model_type;
  if (std::string e = get_string(top, file, "model_type", &model_type); !e.empty()) return e;
  json j = top;
  if (top.contains("text_config")) {  // the VL wrapper: the text model's config is nested
    j = top["text_config"];
    if (!j.is_object()) return fmt::format("HF checkpoint: {}: text_config is not an object", file);
    if (!j.contains("tie_word_embeddings") && top.contains("tie_word_embeddings"))
      j["tie_word_embeddings"] = top["tie_word_embeddings"];
  }
  std::string text_type = model_type;
  if (std::string e = get_string(j, file, "model_type", &text_type); !e.empty()) return e;
  if (text_type != "qwen3_5_text" && text_type != "qwen3_5")
    return fmt::format("HF checkpoint: {}: model_type '{}' is not a Qwen3.5 text model (expected qwen3_5_text, or "
                       "qwen3_5 with a text_config)",
                       file, text_type);
  io::ModelConfig m;
  std::string e;
  // Every size and count must be >= 1 (validate_config narrows some further, e.g. the conv kernel).
  auto req = [&](const char* k, int64_t* v) {
    if (e.empty()) e = get_int(j, file, k, v, true);
  };
  req("vocab_size", &m.vocab_size);
  req("hidden_size", &m.hidden_size);
  req("intermediate_size", &m.intermediate_size);
  req("num_hidden_layers", &m.num_hidden_layers);
  req("linear_num_key_heads", &m.linear_num_key_heads);
  req("linear_num_value_heads", &m.linear_num_value_heads);
  req("linear_key_head_dim", &m.linear_key_head_dim);
  req("linear_value_head_dim", &m.linear_value_head_dim);
  req("linear_conv_kernel_dim", &m.linear_conv_kernel_dim);
  req("num_attention_heads", &m.num_attention_heads);
  req("num_key_value_heads", &m.num_key_value_heads);
  req("head_dim", &m.head_dim);
  // The rules of validate_config (src/io/config.cpp), checked here to name the file.
  const auto positive = [](double x) { return x > 0; };
  const auto fraction = [](double x) { return x >= 0 && x <= 1; };
  const auto non_negative = [](double x) { return x >= 0; };
  if (e.empty()) e = get_real(j, file, "rms_norm_eps", &m.rms_norm_eps, true, positive, "a finite number > 0");
  if (e.empty()) e = get_string_list(j, file, "layer_types", &m.layer_types);
  m.tie_word_embeddings = false;  // Qwen3_5TextConfig's default
  if (e.empty()) e = get_bool(j, file, "tie_word_embeddings", &m.tie_word_embeddings);
  if (e.empty())
    e = get_real(j, file, "initializer_range", &m.initializer_range, false, non_negative, "a finite number >= 0");
  // RoPE: transformers 5 nests theta and the partial factor in rope_parameters; older files
  // keep them at the top level (or in rope_scaling).
  for (const char* sub : {"rope_scaling", "rope_parameters"}) {
    if (!e.empty() || !j.contains(sub) || !j[sub].is_object()) continue;
    const json& r = j[sub];
    const std::string where = file + ":" + sub;
    e = get_real(r, where, "rope_theta", &m.rope_theta, false, positive, "a finite number > 0");
    if (e.empty())
      e = get_real(r, where, "partial_rotary_factor", &m.partial_rotary_factor, false, fraction, "a number in [0, 1]");
    std::string type = "default";
    if (e.empty() && r.contains("type")) e = get_string(r, where, "type", &type);
    if (e.empty() && r.contains("rope_type")) e = get_string(r, where, "rope_type", &type);
    if (e.empty() && type != "default")
      e = fmt::format("HF checkpoint: {}: {}.rope_type = '{}' is not supported (only 'default' RoPE)", file, sub, type);
  }
  if (e.empty()) e = get_real(j, file, "rope_theta", &m.rope_theta, false, positive, "a finite number > 0");
  if (e.empty())
    e = get_real(j, file, "partial_rotary_factor", &m.partial_rotary_factor, false, fraction, "a number in [0, 1]");
  if (!e.empty()) return e;
  std::string act = "silu";
  if (e = get_string(j, file, "hidden_act", &act); !e.empty()) return e;
  if (act != "silu")
    return fmt::format("HF checkpoint: {}: hidden_act = '{}' is not supported (the MLP is SwiGLU: silu)", file, act);
  bool bias = false;
  if (e = get_bool(j, file, "attention_bias", &bias); !e.empty()) return e;
  if (bias)
    return fmt::format("HF checkpoint: {}: attention_bias = true is not supported (Qwen3.5 has no attention bias)",
                       file);
  if (m.layer_types.empty() && j.contains("full_attention_interval")) {  // older files: the pattern by interval
    int64_t every = 0;
    if (e = get_int(j, file, "full_attention_interval", &every, false); !e.empty()) return e;
    if (every > 0)  // null: unset
      for (int64_t i = 0; i < m.num_hidden_layers; ++i)
        m.layer_types.push_back((i + 1) % every == 0 ? "full_attention" : "linear_attention");
  }
  if (!m.layer_types.empty() && int64_t(m.layer_types.size()) != m.num_hidden_layers)
    return fmt::format("HF checkpoint: {}: layer_types has {} entries but num_hidden_layers = {}", file,
                       m.layer_types.size(), m.num_hidden_layers);
  *out = m;
  return "";
}

std::string read_hf_dtype(const std::string& dir, DType* out) {
  const fs::path path = fs::path(dir) / "config.json";
  json top;
  if (std::string e = read_json(path, &top); !e.empty()) return e;
  const json& j = top.contains("text_config") && top["text_config"].is_object() && !top.contains("dtype") &&
                          !top.contains("torch_dtype")
                      ? top["text_config"]
                      : top;
  std::string name = "float32";
  for (const char* key : {"torch_dtype", "dtype"})
    if (j.contains(key) && j[key].is_string()) name = j[key].get<std::string>();
  const std::map<std::string, DType> known = {{"float32", DType::f32}, {"bfloat16", DType::bf16}, {"float16", DType::f16}};
  auto it = known.find(name);
  if (it == known.end())
    return fmt::format("HF checkpoint: {}: dtype '{}' is not one of float32, bfloat16, float16", path.string(), name);
  *out = it->second;
  return "";
}

std::string hf_config_json(const io::ModelConfig& m, DType dtype) {
  const char* dt = dtype == DType::bf16 ? "bfloat16" : dtype == DType::f16 ? "float16" : "float32";
  json j;
  j["architectures"] = {"Qwen3_5ForCausalLM"};
  j["model_type"] = "qwen3_5_text";
  j["dtype"] = dt;
  j["vocab_size"] = m.vocab_size;
  j["hidden_size"] = m.hidden_size;
  j["intermediate_size"] = m.intermediate_size;
  j["num_hidden_layers"] = m.num_hidden_layers;
  j["layer_types"] = io::resolved_layer_types(m);
  j["linear_num_key_heads"] = m.linear_num_key_heads;
  j["linear_num_value_heads"] = m.linear_num_value_heads;
  j["linear_key_head_dim"] = m.linear_key_head_dim;
  j["linear_value_head_dim"] = m.linear_value_head_dim;
  j["linear_conv_kernel_dim"] = m.linear_conv_kernel_dim;
  j["num_attention_heads"] = m.num_attention_heads;
  j["num_key_value_heads"] = m.num_key_value_heads;
  j["head_dim"] = m.head_dim;
  j["partial_rotary_factor"] = m.partial_rotary_factor;
  j["rope_parameters"] = {
      {"rope_type", "default"}, {"rope_theta", m.rope_theta}, {"partial_rotary_factor", m.partial_rotary_factor}};
  j["rms_norm_eps"] = m.rms_norm_eps;
  j["tie_word_embeddings"] = m.tie_word_embeddings;
  j["initializer_range"] = m.initializer_range;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  return j.dump(2) + "\n";
}

std::string compare_model_configs(const io::ModelConfig& a, const char* what_a, const io::ModelConfig& b,
                                  const char* what_b) {
  auto diff = [&](const char* key, const auto& x, const auto& y) -> std::string {
    if (x == y) return "";
    return fmt::format("model config: {} has {} = {}, but {} has {}", what_a, key, fmt::format("{}", x), what_b,
                       fmt::format("{}", y));
  };
  std::string e;
  auto chk = [&](const char* key, const auto& x, const auto& y) {
    if (e.empty()) e = diff(key, x, y);
  };
  chk("vocab_size", a.vocab_size, b.vocab_size);
  chk("hidden_size", a.hidden_size, b.hidden_size);
  chk("intermediate_size", a.intermediate_size, b.intermediate_size);
  chk("num_hidden_layers", a.num_hidden_layers, b.num_hidden_layers);
  chk("layer_types", fmt::format("{}", fmt::join(io::resolved_layer_types(a), ",")),
      fmt::format("{}", fmt::join(io::resolved_layer_types(b), ",")));
  chk("linear_num_key_heads", a.linear_num_key_heads, b.linear_num_key_heads);
  chk("linear_num_value_heads", a.linear_num_value_heads, b.linear_num_value_heads);
  chk("linear_key_head_dim", a.linear_key_head_dim, b.linear_key_head_dim);
  chk("linear_value_head_dim", a.linear_value_head_dim, b.linear_value_head_dim);
  chk("linear_conv_kernel_dim", a.linear_conv_kernel_dim, b.linear_conv_kernel_dim);
  chk("num_attention_heads", a.num_attention_heads, b.num_attention_heads);
  chk("num_key_value_heads", a.num_key_value_heads, b.num_key_value_heads);
  chk("head_dim", a.head_dim, b.head_dim);
  chk("partial_rotary_factor", a.partial_rotary_factor, b.partial_rotary_factor);
  chk("rope_theta", a.rope_theta, b.rope_theta);
  chk("rms_norm_eps", a.rms_norm_eps, b.rms_norm_eps);
  chk("tie_word_embeddings", a.tie_word_embeddings, b.tie_word_embeddings);
  return e;
}

// ---- weights --------------------------------------------------------------------------------

namespace {

// The safetensors files of `dir`: model.safetensors, or the shards named by the index.
std::string list_weight_files(const std::string& dir, std::vector<std::string>* files) {
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  files->clear();
  if (fs::exists(index)) {
    json j;
    if (std::string e = read_json(index, &j); !e.empty()) return e;
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      return fmt::format("HF checkpoint: {}: key 'weight_map' is missing or not an object", index.string());
    std::set<std::string> names;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it->is_string())
        return fmt::format("HF checkpoint: {}: weight_map['{}'] is not a file name", index.string(), it.key());
      names.insert(it->get<std::string>());
    }
    for (const std::string& n : names) files->push_back((fs::path(dir) / n).string());
    return "";
  }
  if (fs::exists(single)) {
    files->push_back(single.string());
    return "";
  }
  return fmt::format("HF checkpoint: {} holds neither model.safetensors nor model.safetensors.index.json", dir);
}

// What a safetensors header says about one tensor: enough to match names and shapes before any
// tensor data is read (the data is read file by file afterwards, by io::read_safetensors, which
// also checks the offsets).
struct TensorHeader {
  DType dtype = DType::f32;
  bool known_dtype = false;
  std::string dtype_name;
  Shape shape;
  size_t file = 0;
};

std::string read_header(const std::string& path, size_t file, std::map<std::string, TensorHeader>* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return fmt::format("HF checkpoint: cannot open {}", path);
  unsigned char lenb[8];
  if (!f.read(reinterpret_cast<char*>(lenb), 8)) return fmt::format("HF checkpoint: {}: truncated header", path);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | lenb[i];
  if (hlen > (uint64_t(1) << 30)) return fmt::format("HF checkpoint: {}: header length {} is implausible", path, hlen);
  std::string header(hlen, '\0');
  if (!f.read(header.data(), std::streamsize(hlen))) return fmt::format("HF checkpoint: {}: truncated header", path);
  json j;
  try {
    j = json::parse(header);
  } catch (const std::exception& e) {
    return fmt::format("HF checkpoint: {}: header is not valid JSON: {}", path, e.what());
  }
  if (!j.is_object()) return fmt::format("HF checkpoint: {}: header is not a JSON object", path);
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    TensorHeader h;
    h.file = file;
    if (!it->is_object() || !(*it)["dtype"].is_string() || !(*it)["shape"].is_array())
      return fmt::format("HF checkpoint: {}: tensor '{}' has no dtype or shape", path, it.key());
    h.dtype_name = (*it)["dtype"].get<std::string>();
    h.known_dtype = io::parse_safetensors_dtype(h.dtype_name, &h.dtype);
    const json& sh = (*it)["shape"];
    if (sh.size() > size_t(kMaxDims))
      return fmt::format("HF checkpoint: {}: tensor '{}' has {} dims (at most {})", path, it.key(), sh.size(), kMaxDims);
    h.shape.ndim = int(sh.size());
    for (size_t d = 0; d < sh.size(); ++d) {
      if (!sh[d].is_number_integer() || sh[d].get<int64_t>() < 0)
        return fmt::format("HF checkpoint: {}: tensor '{}' has shape {}", path, it.key(), sh.dump());
      h.shape[int(d)] = sh[d].get<int64_t>();
    }
    if (!out->emplace(it.key(), h).second)
      return fmt::format("HF checkpoint: tensor '{}' is in more than one file ({} and another)", it.key(), path);
  }
  return "";
}

}  // namespace

std::string load_hf_weights(const std::string& dir, Qwen35Model& net, const dist::ProcessGroups& pg,
                            HfLoadInfo* info) {
  io::ModelConfig hf_cfg;
  if (std::string e = read_hf_config(dir, &hf_cfg); !e.empty()) return e;
  if (std::string e = compare_model_configs(net.config(), "the run's model section", hf_cfg,
                                            (fs::path(dir) / "config.json").c_str());
      !e.empty())
    return e;
  std::vector<std::string> files;
  if (std::string e = list_weight_files(dir, &files); !e.empty()) return e;
  std::map<std::string, TensorHeader> tensors;  // checkpoint name -> header
  for (size_t i = 0; i < files.size(); ++i)
    if (std::string e = read_header(files[i], i, &tensors); !e.empty()) return e;
  // The layout whose text prefix names the embedding.
  const HfLayout* layout = nullptr;
  for (const HfLayout& l : hf_layouts())
    if (tensors.count(file_name_of("model.embed_tokens.weight", l))) layout = &l;
  if (!layout) {
    std::string known;
    for (const HfLayout& l : hf_layouts()) known += (known.empty() ? "" : ", ") + file_name_of("model.embed_tokens.weight", l);
    return fmt::format("HF checkpoint: {}: no embedding tensor under any known layout (looked for {})", dir, known);
  }
  const std::vector<Param*> params = net.params();
  std::set<std::string> used;
  std::vector<std::string> missing, bad_shape;
  for (const Param* p : params) {
    const std::string fname = file_name_of(p->spec.name, *layout);
    auto it = tensors.find(fname);
    if (it == tensors.end()) {
      missing.push_back(fname);
      continue;
    }
    used.insert(fname);
    if (it->second.shape != p->spec.shape)
      bad_shape.push_back(fmt::format("{} is {} in the checkpoint, the model expects {}", fname,
                                      it->second.shape.str(), p->spec.shape.str()));
  }
  std::vector<std::string> unexpected;
  HfLoadInfo out;
  out.layout = layout->name;
  for (const auto& [name, t] : tensors) {
    if (used.count(name)) continue;
    bool ignore = name == "lm_head.weight" && net.config().tie_word_embeddings;  // HF ignores it too
    for (const std::string& pre : layout->ignored_prefixes) ignore = ignore || starts_with(name, pre);
    (ignore ? out.ignored : unexpected).push_back(name);
  }
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size() && i < 20; ++i) s += (i ? ", " : "") + v[i];
    if (v.size() > 20) s += fmt::format(", ... ({} in all)", v.size());
    return s;
  };
  if (!missing.empty() || !unexpected.empty() || !bad_shape.empty()) {
    std::string e = fmt::format("HF checkpoint {} ({} layout) does not match the model:", dir, layout->name);
    if (!missing.empty()) e += fmt::format("\n  missing tensors: {}", list(missing));
    if (!unexpected.empty()) e += fmt::format("\n  unexpected tensors: {}", list(unexpected));
    if (!bad_shape.empty()) e += fmt::format("\n  shape mismatches: {}", list(bad_shape));
    return e;
  }
  // The source dtype: that of the parameters (one for all, as HF saves them).
  std::set<DType> dtypes;
  for (const std::string& n : used) {
    const TensorHeader& h = tensors.at(n);
    if (!h.known_dtype || (h.dtype != DType::f32 && h.dtype != DType::bf16 && h.dtype != DType::f16))
      return fmt::format("HF checkpoint: {}: tensor {} has dtype {} (supported: F32, BF16, F16)", dir, n, h.dtype_name);
    dtypes.insert(h.dtype);
  }
  out.source_dtype = dtypes.count(DType::f32) ? DType::f32 : *dtypes.begin();
  // The data, one file in memory at a time; files holding only ignored tensors are not read.
  const int tp = pg.dims.tp, tp_rank = pg.coord.tp;
  for (size_t fi = 0; fi < files.size(); ++fi) {
    std::vector<Param*> here;
    for (Param* p : params)
      if (tensors.at(file_name_of(p->spec.name, *layout)).file == fi) here.push_back(p);
    if (here.empty()) continue;
    io::SafetensorsFile st;
    if (std::string e = io::read_safetensors(files[fi], &st); !e.empty()) return "HF checkpoint: " + e;
    for (Param* p : here) {
      const Tensor& src = st.at(file_name_of(p->spec.name, *layout));
      Tensor global = src;
      if (src.dtype() != DType::f32) {  // bf16 / f16 -> fp32 master
        global = Tensor::empty(src.shape(), DType::f32);
        ops::copy(global, src);
      }
      if (p->master.device().is_cpu()) {
        shard_from_global(p->master, global, p->spec, tp, tp_rank);
      } else {
        Tensor local = Tensor::empty(p->master.shape(), DType::f32);
        shard_from_global(local, global, p->spec, tp, tp_rank);
        ops::copy(p->master, ops::to_device(local, p->master.device()));
      }
      refresh_compute(*p);
    }
  }
  std::sort(out.ignored.begin(), out.ignored.end());
  *info = out;
  return "";
}

HfLoadInfo load_hf_weights_or_die(const std::string& dir, Qwen35Model& net, const dist::ProcessGroups& pg) {
  HfLoadInfo info;
  if (std::string e = load_hf_weights(dir, net, pg, &info); !e.empty()) user_error(e);
  if (dist::world_rank() == 0) {
    std::printf("loaded HF checkpoint %s (%s layout, %s): %zu parameters, each rank its TP shard\n", dir.c_str(),
                info.layout.c_str(), dtype_name(info.source_dtype), net.params().size());
    if (!info.ignored.empty())
      std::printf("HF checkpoint: ignored %zu tensors of parts not trained here (first: %s)\n", info.ignored.size(),
                  info.ignored.front().c_str());
    std::fflush(stdout);
  }
  return info;
}

// ---- export directory -------------------------------------------------------------------------

namespace {

// What an export writes (or, for the index, removes: a stale one would shadow model.safetensors).
// Every other entry of an existing OUT is carried into the new directory.
bool export_owns(const std::string& name) {
  return name == "config.json" || name == "model.safetensors" || name == "model.safetensors.index.json";
}

// `out` as the absolute path the export replaces: no trailing separator (OUT.tmp must be a
// sibling, not a child), and a symlink resolved, so that the directory it names is replaced and
// the link kept.
std::string export_path(const std::string& out, fs::path* p) {
  if (out.empty()) return "export-hf: the output directory is empty";
  std::error_code ec;
  fs::path a = fs::absolute(out, ec).lexically_normal();
  if (ec) return fmt::format("export-hf: {}: cannot make the path absolute ({})", out, ec.message());
  if (!a.has_filename() && a.has_relative_path()) a = a.parent_path();
  if (!a.has_relative_path())
    return fmt::format("export-hf: {} is a filesystem root, not a directory an export can replace", out);
  if (fs::is_symlink(a, ec)) {
    a = fs::canonical(a, ec);
    if (ec)
      return fmt::format("export-hf: {} is a symbolic link whose target cannot be resolved ({})", out, ec.message());
  }
  *p = a;
  return "";
}

// Every other entry of the old OUT into `tmp`: hard links where the filesystem allows (cheap for
// large files; the old directory's links go when it is removed), else copies; symlinks as links.
std::string carry_other_files(const fs::path& old_dir, const fs::path& tmp) {
  std::error_code list_ec, ec;
  for (const fs::directory_entry& d : fs::directory_iterator(old_dir, list_ec)) {
    const std::string name = d.path().filename().string();
    if (export_owns(name)) continue;
    const fs::path to = tmp / name;
    constexpr auto kCopy = fs::copy_options::recursive | fs::copy_options::copy_symlinks;
    fs::copy(d.path(), to, kCopy | fs::copy_options::create_hard_links, ec);
    if (ec) {  // another filesystem below OUT, or links not supported: copy
      fs::remove_all(to, ec);
      fs::copy(d.path(), to, kCopy, ec);
    }
    if (ec)
      return fmt::format("export-hf: cannot carry {} (not written by an export) into the new directory ({}); move it "
                         "out of {} or export elsewhere",
                         d.path().string(), ec.message(), old_dir.string());
    if (fs::is_regular_file(fs::symlink_status(to)))
      if (std::string e = io::fsync_path(to, false); !e.empty()) return "export-hf: " + e;
  }
  if (list_ec) return fmt::format("export-hf: cannot list {} ({})", old_dir.string(), list_ec.message());
  return "";
}

// Fills `tmp` (an empty directory): the carried files, config.json, model.safetensors, each
// fsynced, then the directory itself.
std::string fill_export_dir(const fs::path& p, const fs::path& tmp, const std::string& config,
                            const std::map<std::string, TensorView>& named) {
  std::error_code ec;
  if (fs::is_directory(p, ec))
    if (std::string e = carry_other_files(p, tmp); !e.empty()) return e;
  if (std::string e = io::write_durable(tmp / "config.json", config); !e.empty()) return "export-hf: " + e;
  const fs::path st = tmp / "model.safetensors";
  if (std::string e = io::write_safetensors(st.string(), named, {{"format", "pt"}}); !e.empty())
    return "export-hf: " + e;
  if (std::string e = io::fsync_path(st, false); !e.empty()) return "export-hf: " + e;
  if (std::string e = io::fsync_path(tmp, true); !e.empty()) return "export-hf: " + e;
  return "";
}

// Writes the export into OUT.tmp and only then replaces OUT (as checkpoints commit their step
// directories), so that a failed write never touches a previous export.
std::string write_hf_dir(const std::string& out, const std::string& config,
                         const std::map<std::string, TensorView>& named) {
  if (std::string e = check_export_dir(out); !e.empty()) return e;
  fs::path p;
  if (std::string e = export_path(out, &p); !e.empty()) return e;
  const fs::path tmp = p.string() + ".tmp", old = p.string() + ".old", parent = p.parent_path();
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (!ec) fs::remove_all(tmp, ec);  // a stale one of an export that failed or crashed
  if (!ec) fs::create_directory(tmp, ec);
  if (ec) return fmt::format("export-hf: cannot create {} ({})", tmp.string(), ec.message());
  if (std::string e = fill_export_dir(p, tmp, config, named); !e.empty()) {
    fs::remove_all(tmp, ec);
    return fmt::format("{}; nothing was replaced: {} is as it was", e, out);
  }
  // Commit. Where a crash (or a failed rename) leaves things:
  //  * before (1): OUT as it was; OUT.tmp, complete or not, is removed by the next export;
  //  * between (1) and (2): no OUT; OUT.old is the previous export and OUT.tmp the new one, both
  //    complete: rename either to OUT (check_export_dir refuses to go on until one is);
  //  * after (2): OUT is the new export; an OUT.old left beside it is removed by the next export.
  const bool had = fs::exists(p, ec);
  if (had) {
    fs::remove_all(old, ec);
    if (!ec) fs::rename(p, old, ec);  // (1)
    if (ec) {
      const std::string why = ec.message();
      fs::remove_all(tmp, ec);
      return fmt::format("export-hf: cannot move {} aside to {} ({}); {} is as it was", p.string(), old.string(), why,
                         out);
    }
  }
  fs::rename(tmp, p, ec);  // (2)
  if (ec) {
    const std::string why = fmt::format("export-hf: cannot rename {} to {} ({})", tmp.string(), p.string(), ec.message());
    if (had) fs::rename(old, p, ec);  // put the previous export back
    if (had && ec)
      return fmt::format("{}; nor move the previous export back ({}): it is {}, the new one {}", why, ec.message(),
                         old.string(), tmp.string());
    fs::remove_all(tmp, ec);
    return fmt::format("{}; {} is as it was", why, out);
  }
  if (std::string e = io::fsync_path(parent, true); !e.empty()) return "export-hf: " + e;
  if (had) fs::remove_all(old, ec);
  if (had && ec)  // the export is in place: a leftover costs only space
    std::fprintf(stderr, "export-hf: warning: cannot remove the previous export %s (%s)\n", old.c_str(),
                 ec.message().c_str());
  return "";
}

}  // namespace

std::string check_export_dir(const std::string& out) {
  fs::path p;
  if (std::string e = export_path(out, &p); !e.empty()) return e;
  std::error_code ec;
  // ENOTDIR: a component above is a file, which the walk up below names.
  const auto absent = [](const std::error_code& c) {
    return c == std::errc::no_such_file_or_directory || c == std::errc::not_a_directory;
  };
  const fs::file_status st = fs::status(p, ec);
  if (ec && !absent(ec))
    return fmt::format("export-hf: cannot inspect {} ({})", out, ec.message());
  const fs::path old = p.string() + ".old";
  if (fs::exists(st)) {
    if (!fs::is_directory(st))
      return fmt::format("export-hf: {} exists and is not a directory (an HF export is a directory holding config.json "
                         "and model.safetensors); remove it or choose another path",
                         out);
    if (::access(p.c_str(), R_OK | X_OK) != 0)
      return fmt::format("export-hf: cannot read the directory {} ({}); the files in it that an export does not write "
                         "are carried into the new export",
                         out, std::strerror(errno));
  } else if (fs::exists(old, ec)) {
    return fmt::format("export-hf: {} is missing but {} exists: an earlier export stopped between its two renames. {} "
                       "is the previous export (and {}.tmp the new one, if present): rename one of them to {}, or "
                       "remove {}, then export again",
                       out, old.string(), old.string(), p.string(), out, old.string());
  }
  // The new export is made as the sibling OUT.tmp and renamed into place: the nearest existing
  // directory above OUT (its parent, or the ancestor from which the parent will be created) must
  // be writable.
  fs::path anc = p.parent_path();
  for (;;) {
    const fs::file_status s = fs::status(anc, ec);
    if (ec && !absent(ec))
      return fmt::format("export-hf: cannot inspect {} ({})", anc.string(), ec.message());
    if (fs::exists(s)) {
      if (!fs::is_directory(s))
        return fmt::format("export-hf: cannot create {}: {} is not a directory", out, anc.string());
      break;
    }
    if (anc == anc.parent_path()) return fmt::format("export-hf: cannot create {}: no directory above it exists", out);
    anc = anc.parent_path();
  }
  if (::access(anc.c_str(), W_OK | X_OK) != 0)
    return fmt::format("export-hf: cannot write {}: the directory {} is not writable ({}); an export is written "
                       "beside OUT as OUT.tmp, then renamed",
                       out, anc.string(), std::strerror(errno));
  return "";
}

std::string export_hf(const std::string& dir, Qwen35Model& net, const dist::ProcessGroups& pg, DType dtype) {
  DT_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16, "export_hf: dtype {} is not a float",
           dtype_name(dtype));
  const int tp = pg.dims.tp;
  const bool writer = dist::world_rank() == 0;
  std::vector<Tensor> globals;  // [spec.shape] dtype, host (writer only)
  std::map<std::string, TensorView> named;
  for (const Param* p : net.params()) {
    const ParamSpec& s = p->spec;
    Tensor local = ops::to_host(p->master);  // [local shape] f32
    Tensor global = Tensor::empty(s.shape, DType::f32);
    if (s.tp_dim < 0 || tp == 1) {
      ops::copy(global, local);
    } else {
      // Every TP rank's shard, then each rank's pieces back to their global rows.
      Tensor all = Tensor::empty(Shape{int64_t(tp) * local.numel()}, DType::f32);
      if (p->master.device().is_cpu()) {
        pg.tp->all_gather(all, local);
      } else {
        Tensor all_dev = Tensor::empty(all.shape(), DType::f32, p->master.device());
        pg.tp->all_gather(all_dev, p->master);
        all = ops::to_host(all_dev);
      }
      for (int t = 0; t < tp; ++t) {
        TensorView shard = all.view().slice(0, t * local.numel(), (t + 1) * local.numel()).reshape(local.shape());
        for (const ShardPiece& pc : shard_pieces(s, tp, t))
          ops::copy(global.view().slice(s.tp_dim, pc.global_off, pc.global_off + pc.len),
                    shard.slice(s.tp_dim, pc.local_off, pc.local_off + pc.len));
      }
    }
    if (!writer) continue;
    if (dtype != DType::f32) {
      Tensor cast = Tensor::empty(s.shape, dtype);
      ops::copy(cast, global);
      global = cast;
    }
    globals.push_back(global);
    named.emplace(s.name, globals.back().view());
  }
  if (!writer) return "";
  return write_hf_dir(dir, hf_config_json(net.config(), dtype), named);
}

void export_hf_or_die(const std::string& dir, Qwen35Model& net, const dist::ProcessGroups& pg, DType dtype) {
  if (std::string e = export_hf(dir, net, pg, dtype); !e.empty()) user_error(e, false);
  if (dist::world_rank() == 0) {
    std::printf("exported HF checkpoint to %s (Qwen3_5ForCausalLM, %s)\n", dir.c_str(), dtype_name(dtype));
    std::fflush(stdout);
  }
}

}  // namespace dt::model
