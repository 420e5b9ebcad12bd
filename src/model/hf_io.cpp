// HF Qwen3.5 checkpoint directories (include/deltatron/model/hf_io.h).
#include "deltatron/model/hf_io.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "deltatron/core/check.h"
#include "deltatron/dist/comm.h"
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

template <typename T>
std::string get_field(const json& j, const std::string& file, const char* key, T* out, bool required) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return fmt::format("HF checkpoint: {}: key '{}' is missing", file, key);
    return "";
  }
  try {
    *out = it->get<T>();
  } catch (const std::exception&) {
    return fmt::format("HF checkpoint: {}: key '{}' = {} has the wrong type", file, key, it->dump());
  }
  return "";
}

}  // namespace

std::string read_hf_config(const std::string& dir, io::ModelConfig* out) {
  const fs::path path = fs::path(dir) / "config.json";
  const std::string file = path.string();
  json top;
  if (std::string e = read_json(path, &top); !e.empty()) return e;
  const std::string model_type = top.value("model_type", std::string());
  json j = top;
  if (top.contains("text_config")) {  // the VL wrapper: the text model's config is nested
    j = top["text_config"];
    if (!j.is_object()) return fmt::format("HF checkpoint: {}: text_config is not an object", file);
    if (!j.contains("tie_word_embeddings") && top.contains("tie_word_embeddings"))
      j["tie_word_embeddings"] = top["tie_word_embeddings"];
  }
  const std::string text_type = j.value("model_type", model_type);
  if (text_type != "qwen3_5_text" && text_type != "qwen3_5")
    return fmt::format("HF checkpoint: {}: model_type '{}' is not a Qwen3.5 text model (expected qwen3_5_text, or "
                       "qwen3_5 with a text_config)",
                       file, text_type);
  io::ModelConfig m;
  std::string e;
  auto req = [&](const char* k, int64_t* v) {
    if (e.empty()) e = get_field(j, file, k, v, true);
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
  if (e.empty()) e = get_field(j, file, "rms_norm_eps", &m.rms_norm_eps, true);
  if (e.empty()) e = get_field(j, file, "layer_types", &m.layer_types, false);
  m.tie_word_embeddings = false;  // Qwen3_5TextConfig's default
  if (e.empty()) e = get_field(j, file, "tie_word_embeddings", &m.tie_word_embeddings, false);
  if (e.empty()) e = get_field(j, file, "initializer_range", &m.initializer_range, false);
  // RoPE: transformers 5 nests theta and the partial factor in rope_parameters; older files
  // keep them at the top level (or in rope_scaling).
  for (const char* sub : {"rope_scaling", "rope_parameters"}) {
    if (!e.empty() || !j.contains(sub) || !j[sub].is_object()) continue;
    const json& r = j[sub];
    e = get_field(r, file + ":" + sub, "rope_theta", &m.rope_theta, false);
    if (e.empty()) e = get_field(r, file + ":" + sub, "partial_rotary_factor", &m.partial_rotary_factor, false);
    std::string type = r.value("rope_type", r.value("type", std::string("default")));
    if (e.empty() && type != "default")
      e = fmt::format("HF checkpoint: {}: {}.rope_type = '{}' is not supported (only 'default' RoPE)", file, sub, type);
  }
  if (e.empty() && j.contains("rope_theta")) e = get_field(j, file, "rope_theta", &m.rope_theta, false);
  if (e.empty() && j.contains("partial_rotary_factor"))
    e = get_field(j, file, "partial_rotary_factor", &m.partial_rotary_factor, false);
  if (!e.empty()) return e;
  const std::string act = j.value("hidden_act", std::string("silu"));
  if (act != "silu")
    return fmt::format("HF checkpoint: {}: hidden_act = '{}' is not supported (the MLP is SwiGLU: silu)", file, act);
  if (j.value("attention_bias", false))
    return fmt::format("HF checkpoint: {}: attention_bias = true is not supported (Qwen3.5 has no attention bias)",
                       file);
  if (m.layer_types.empty() && j.contains("full_attention_interval")) {  // older files: the pattern by interval
    int64_t every = 0;
    if (e = get_field(j, file, "full_attention_interval", &every, false); !e.empty()) return e;
    if (every <= 0)
      return fmt::format("HF checkpoint: {}: full_attention_interval = {} must be > 0", file, every);
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
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return fmt::format("export-hf: cannot create {}: {}", dir, ec.message());
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  std::ofstream f(cfg_path, std::ios::trunc);
  f << hf_config_json(net.config(), dtype);
  f.close();
  if (!f) return fmt::format("export-hf: cannot write {}", cfg_path);
  // The single-file form: a stale index from an earlier sharded export would shadow it.
  fs::remove(fs::path(dir) / "model.safetensors.index.json", ec);
  if (std::string e = io::write_safetensors((fs::path(dir) / "model.safetensors").string(), named, {{"format", "pt"}});
      !e.empty())
    return "export-hf: " + e;
  return "";
}

void export_hf_or_die(const std::string& dir, Qwen35Model& net, const dist::ProcessGroups& pg, DType dtype) {
  if (std::string e = export_hf(dir, net, pg, dtype); !e.empty()) user_error(e, false);
  if (dist::world_rank() == 0) {
    std::printf("exported HF checkpoint to %s (Qwen3_5ForCausalLM, %s)\n", dir.c_str(), dtype_name(dtype));
    std::fflush(stdout);
  }
}

}  // namespace dt::model
