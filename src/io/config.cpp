#include "deltatron/io/config.h"

#include "deltatron/dist/parallel.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <fmt/format.h>
#include <sstream>

namespace dt::io {
namespace {

enum class Kind { i64, f64, boolean, str, str_list };
const char* kind_name(Kind k) {
  switch (k) {
    case Kind::i64: return "integer";
    case Kind::f64: return "number";
    case Kind::boolean: return "bool";
    case Kind::str: return "string";
    case Kind::str_list: return "list of strings";
  }
  return "?";
}

struct Field {
  const char* key;  // "section.name"
  Kind kind;
  void* (*addr)(Config&);
  const char* help;
};

#define DT_FIELD(sec, name, kind, help) \
  Field { #sec "." #name, Kind::kind, [](Config& c) -> void* { return &c.sec.name; }, help }

const std::vector<Field>& fields() {
  static const std::vector<Field> f = {
      DT_FIELD(model, vocab_size, i64, "vocabulary size (a multiple of parallel.tp: the LM head and embedding are vocab-parallel)"),
      DT_FIELD(model, hidden_size, i64, "model width H"),
      DT_FIELD(model, intermediate_size, i64, "SwiGLU MLP width (a multiple of parallel.tp)"),
      DT_FIELD(model, num_hidden_layers, i64, "decoder layers"),
      DT_FIELD(model, layer_types, str_list, "per layer: linear_attention (GDN) or full_attention; empty: 3 GDN then 1 attention, repeated"),
      DT_FIELD(model, linear_num_key_heads, i64, "GDN q/k heads Hk (a multiple of tp*cp)"),
      DT_FIELD(model, linear_num_value_heads, i64, "GDN v heads Hv (a multiple of Hk and of tp*cp)"),
      DT_FIELD(model, linear_key_head_dim, i64, "GDN dk"),
      DT_FIELD(model, linear_value_head_dim, i64, "GDN dv"),
      DT_FIELD(model, linear_conv_kernel_dim, i64, "GDN causal conv width W (2..8)"),
      DT_FIELD(model, num_attention_heads, i64, "gated attention query heads (a multiple of tp)"),
      DT_FIELD(model, num_key_value_heads, i64, "gated attention KV heads (a multiple of tp, dividing the query heads)"),
      DT_FIELD(model, head_dim, i64, "gated attention head dim"),
      DT_FIELD(model, partial_rotary_factor, f64, "fraction of head_dim rotated by RoPE"),
      DT_FIELD(model, rope_theta, f64, "RoPE base"),
      DT_FIELD(model, rms_norm_eps, f64, "RMSNorm epsilon (decoder norms, q/k norms, GDN gated norm)"),
      DT_FIELD(model, tie_word_embeddings, boolean, "LM head shares the embedding weight"),
      DT_FIELD(model, initializer_range, f64, "std of the normal init of projection weights"),
      DT_FIELD(parallel, tp, i64, "tensor-parallel size"),
      DT_FIELD(parallel, cp, i64, "context-parallel size"),
      DT_FIELD(parallel, dp, i64, "data-parallel size; -1 infers world / (tp*cp)"),
      DT_FIELD(parallel, sp, boolean, "sequence parallelism over the tp group"),
      DT_FIELD(data, prefix, str, "indexed dataset PREFIX (PREFIX.bin, PREFIX.idx)"),
      DT_FIELD(data, max_tokens, i64, "physical tokens per micro-batch over all CP ranks (a multiple of 2*cp when cp > 1)"),
      DT_FIELD(data, shuffle, boolean, "shuffle documents (seeded by train.seed); off keeps dataset order"),
      DT_FIELD(data, pad_multiple, i64, "pad each sequence to a multiple of this; 0 = 2*cp when cp > 1, else 1"),
      DT_FIELD(optimizer, name, str, "adamw | sgd"),
      DT_FIELD(optimizer, lr, f64, "peak learning rate"),
      DT_FIELD(optimizer, weight_decay, f64, "decoupled weight decay (AdamW) / L2 (SGD)"),
      DT_FIELD(optimizer, beta1, f64, "AdamW beta1"),
      DT_FIELD(optimizer, beta2, f64, "AdamW beta2"),
      DT_FIELD(optimizer, eps, f64, "AdamW epsilon"),
      DT_FIELD(optimizer, clip_grad, f64, "clip the global grad norm to this; 0 = off"),
      DT_FIELD(schedule, name, str, "constant | cosine"),
      DT_FIELD(schedule, warmup_steps, i64, "linear warm-up steps"),
      DT_FIELD(schedule, min_lr_ratio, f64, "cosine floor as a fraction of optimizer.lr"),
      DT_FIELD(attention, backend, str, "gated attention kernels on CUDA: auto | native | cudnn | cudnn_fwd (cuDNN forward, native backward; both deterministic). cudnn and cudnn_fwd need cuDNN >= 9.19 and train.precision bf16; auto picks native"),
      DT_FIELD(gdn, cp_a2a, str, "CP all-to-all of the GDN layers: fused (the packed batch in one all-to-all each way) | per_sequence (one per sequence: the plain reference); bitwise equal"),
      DT_FIELD(gdn, cp_comm, str, "CP communication of the GDN layers: auto (all_gather when it moves fewer bytes: in_proj + out_proj widths per TP rank > 2*cp*hidden; else all_to_all) | all_to_all (cp2hp/hp2cp of the projections; implementation gdn.cp_a2a) | all_gather (all-gather x, reduce-scatter the out_proj partials; fewer bytes when the in_proj + out_proj widths per TP rank exceed 2*cp*hidden, see docs/parallelism.md); equal up to fp32 summation order (under bf16 the cp partials are rounded before their sum, as for TP)"),
      DT_FIELD(gdn, save_chunk_intermediates, boolean, "CUDA: the chunk kernel's forward keeps W, Tm, Delta, the chunk states and P for its backward (~20% faster, ~5x the bytes of v per GDN layer); false recomputes them"),
      DT_FIELD(gdn, recompute_elementwise, boolean, "the backward recomputes the conv output, l2norm(q, k) and z from the kept projections instead of keeping them (~200 MB less per GDN layer of the bench model at 8192 tokens for ~0.23 ms more per GDN layer backward, ~4 ms a step, measured on an H200); bitwise equal"),
      DT_FIELD(gdn, recompute_v, boolean, "with recompute_elementwise: the conv output's v columns are recomputed too; false keeps them from the forward ([T, Hv*dv] more per GDN layer, about half of what recompute_elementwise saves) so that the backward rebuilds only l2norm(q, k) from the projections' q|k columns, reading and writing half the bytes; bitwise equal"),
      DT_FIELD(train, steps, i64, "optimizer steps"),
      DT_FIELD(train, seed, i64, "seed of init, data order and every RNG"),
      DT_FIELD(train, device, str, "auto | cpu | cuda"),
      DT_FIELD(train, precision, str, "bf16 | fp32 (bf16: bf16 compute, fp32 master weights and optimizer state)"),
      DT_FIELD(train, grad_accum, i64, "micro-batches per optimizer step"),
      DT_FIELD(train, max_nonfinite_in_a_row, i64, "stop after this many skipped non-finite steps in a row"),
      DT_FIELD(train, overlap_grad_reduce, boolean, "start each layer's dp x cp gradient all-reduce as soon as its backward is done (CUDA: on a second stream, overlapping the rest of the backward); the same sums, up to the order NCCL's algorithm choice gives"),
      DT_FIELD(train, overlap_embedding_reduce, boolean, "with overlap_grad_reduce and dp x cp > 1: the embedding's dp x cp gradient all-reduce starts right after the last forward (the tied LM head's part is complete there) and overlaps the whole backward; the last backward's embedding rows are all-gathered and added after it in rank order (the same sums in another order)"),
      DT_FIELD(checkpoint, dir, str, "checkpoint directory (empty: no checkpoints)"),
      DT_FIELD(checkpoint, interval, i64, "save every N steps; 0 = only at the end"),
      DT_FIELD(checkpoint, keep_last, i64, "checkpoints kept"),
      DT_FIELD(checkpoint, resume, boolean, "resume from checkpoint.dir/latest when it exists (without latest: from the newest complete step directory, with a warning)"),
      DT_FIELD(checkpoint, load, str, "a checkpoint step directory to start from, saved under any layout (overrides resume)"),
      DT_FIELD(checkpoint, init_from_hf, str, "HF Qwen3.5 directory whose weights initialise the model (--init-from-hf)"),
      DT_FIELD(checkpoint, export_hf, str, "write an HF directory here at the end of the run (--export-hf)"),
      DT_FIELD(logging, metrics_jsonl, str, "one JSON object per step to this file (empty: off)"),
      DT_FIELD(logging, log_interval, i64, "steps between log lines"),
  };
  return f;
}
#undef DT_FIELD

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string unknown_key(const std::string& key) {
  const Field* best = nullptr;
  size_t bd = SIZE_MAX;
  for (const Field& f : fields()) {
    size_t d = edit_distance(key, f.key);
    // Also match on the name alone, for a key put under the wrong section.
    std::string name = std::string(f.key).substr(std::string(f.key).find('.') + 1);
    std::string kname = key.find('.') == std::string::npos ? key : key.substr(key.find('.') + 1);
    d = std::min(d, edit_distance(kname, name) + 1);
    if (d < bd) {
      bd = d;
      best = &f;
    }
  }
  std::string msg = fmt::format("config: unknown key '{}'", key);
  if (best && bd <= std::max<size_t>(3, key.size() / 3)) msg += fmt::format(" (did you mean '{}'?)", best->key);
  return msg + " ---> hint: docs/config.md lists every key";
}

const Field* find(const std::string& key) {
  for (const Field& f : fields())
    if (key == f.key) return &f;
  return nullptr;
}

std::string set_value(Config& c, const Field& f, const YAML::Node& v, const std::string& shown) {
  auto bad = [&] { return fmt::format("config: {} = {}: expected {}", f.key, shown, kind_name(f.kind)); };
  try {
    switch (f.kind) {
      case Kind::i64: {
        if (!v.IsScalar()) return bad();
        *static_cast<int64_t*>(f.addr(c)) = v.as<int64_t>();
        return "";
      }
      case Kind::f64:
        if (!v.IsScalar()) return bad();
        *static_cast<double*>(f.addr(c)) = v.as<double>();
        return "";
      case Kind::boolean:
        if (!v.IsScalar()) return bad();
        *static_cast<bool*>(f.addr(c)) = v.as<bool>();
        return "";
      case Kind::str:
        if (!v.IsScalar() && !v.IsNull()) return bad();
        *static_cast<std::string*>(f.addr(c)) = v.IsNull() ? "" : v.as<std::string>();
        return "";
      case Kind::str_list: {
        auto* out = static_cast<std::vector<std::string>*>(f.addr(c));
        out->clear();
        if (v.IsNull()) return "";
        if (!v.IsSequence()) return bad();
        for (const auto& e : v) {
          if (!e.IsScalar()) return bad();
          out->push_back(e.as<std::string>());
        }
        return "";
      }
    }
  } catch (const YAML::Exception&) {
    return bad();
  }
  return bad();
}

std::string shown_value(const YAML::Node& v) {
  YAML::Emitter e;
  e << YAML::Flow << v;
  return e.c_str();
}

}  // namespace

std::string model_override(const std::vector<std::string>& overrides) {
  for (const std::string& o : overrides)
    if (o.rfind("model.", 0) == 0) return o;
  return "";
}

std::string load_config(const std::string& path, const std::vector<std::string>& overrides, Config* out) {
  Config c;
  if (!path.empty()) {
    std::vector<YAML::Node> docs;
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) return fmt::format("config: '{}' is a directory, not a YAML file", path);
    try {
      docs = YAML::LoadAllFromFile(path);
    } catch (const YAML::BadFile&) {
      return fmt::format("config: cannot read '{}'", path);
    } catch (const YAML::Exception& e) {
      return fmt::format("config: {}: not valid YAML: {}", path, e.what());
    } catch (const std::exception& e) {
      return fmt::format("config: cannot read '{}': {}", path, e.what());
    }
    if (docs.size() > 1)
      return fmt::format("config: {} holds {} YAML documents ('---'); one experiment file is one document", path,
                         docs.size());
    const YAML::Node root = docs.empty() ? YAML::Node() : docs[0];
    if (!root.IsNull() && !root.IsMap()) return fmt::format("config: {}: the top level must be a map of sections", path);
    // A key must be a plain name, and each at most once (YAML parsers keep the last of two).
    std::set<std::string> seen;
    auto name_of = [&](const YAML::Node& k, const std::string& where, std::string* out) {
      if (!k.IsScalar()) return fmt::format("config: {}: {} must be a plain name, got '{}'", path, where, YAML::Dump(k));
      *out = k.Scalar();
      return std::string();
    };
    for (auto sec = root.begin(); sec != root.end(); ++sec) {
      std::string s;
      if (std::string e = name_of(sec->first, "a section name", &s); !e.empty()) return e;
      if (!seen.insert(s).second) return fmt::format("config: {}: section '{}' appears twice", path, s);
      if (!sec->second.IsMap()) {
        const bool known = std::any_of(fields().begin(), fields().end(),
                                       [&](const Field& f) { return std::string(f.key).rfind(s + ".", 0) == 0; });
        return known ? fmt::format("config: {}: section '{}' must be a map of keys", path, s)
                     : fmt::format("{}: {}", path, unknown_key(s));
      }
      for (auto kv = sec->second.begin(); kv != sec->second.end(); ++kv) {
        std::string name;
        if (std::string e = name_of(kv->first, "a key of section '" + s + "'", &name); !e.empty()) return e;
        const std::string key = s + "." + name;
        const Field* f = find(key);
        if (!f) return fmt::format("{}: {}", path, unknown_key(key));
        if (!seen.insert(key).second) return fmt::format("config: {}: key '{}' appears twice", path, key);
        std::string err = set_value(c, *f, kv->second, shown_value(kv->second));
        if (!err.empty()) return fmt::format("{}: {}", path, err);
      }
    }
  }
  for (const std::string& o : overrides) {
    size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0)
      return fmt::format("config: override '{}' must look like section.key=value", o);
    const std::string key = o.substr(0, eq), value = o.substr(eq + 1);
    const Field* f = find(key);
    if (!f) return fmt::format("--set {}: {}", o, unknown_key(key));
    YAML::Node v;
    try {
      v = YAML::Load(value);
    } catch (const YAML::Exception&) {
      return fmt::format("config: --set {}: '{}' is not a valid value", key, value);
    }
    std::string err = set_value(c, *f, v, value);
    if (!err.empty()) return "--set: " + err;
  }
  *out = c;
  return "";
}

std::vector<std::string> resolved_layer_types(const ModelConfig& m) {
  if (!m.layer_types.empty()) return m.layer_types;
  std::vector<std::string> t;
  for (int64_t i = 0; i < m.num_hidden_layers; ++i)
    t.push_back((i + 1) % 4 == 0 ? "full_attention" : "linear_attention");  // HF's default pattern
  return t;
}

std::string validate_config(const Config& c, int world_size) {
  const auto& m = c.model;
  const auto& p = c.parallel;
  auto one_of = [](const std::string& key, const std::string& v, std::initializer_list<const char*> ok) {
    for (const char* o : ok)
      if (v == o) return std::string();
    std::string list;
    for (const char* o : ok) list += (list.empty() ? "" : ", ") + std::string(o);
    return fmt::format("config: {} = '{}' is not one of: {}", key, v, list);
  };
  for (const std::string& e : {one_of("optimizer.name", c.optimizer.name, {"adamw", "sgd"}),
                               one_of("schedule.name", c.schedule.name, {"constant", "cosine"}),
                               one_of("train.device", c.train.device, {"auto", "cpu", "cuda"}),
                               one_of("train.precision", c.train.precision, {"bf16", "fp32"}),
                               one_of("attention.backend", c.attention.backend, {"auto", "native", "cudnn", "cudnn_fwd"}),
                               one_of("gdn.cp_a2a", c.gdn.cp_a2a, {"fused", "per_sequence"}),
                               one_of("gdn.cp_comm", c.gdn.cp_comm, {"auto", "all_to_all", "all_gather"})})
    if (!e.empty()) return e;
  // Sizes first: every rule below divides by them.
  for (auto [key, v] : std::initializer_list<std::pair<const char*, int64_t>>{
           {"vocab_size", m.vocab_size},
           {"hidden_size", m.hidden_size},
           {"intermediate_size", m.intermediate_size},
           {"num_hidden_layers", m.num_hidden_layers},
           {"linear_num_key_heads", m.linear_num_key_heads},
           {"linear_num_value_heads", m.linear_num_value_heads},
           {"linear_key_head_dim", m.linear_key_head_dim},
           {"linear_value_head_dim", m.linear_value_head_dim},
           {"num_attention_heads", m.num_attention_heads},
           {"num_key_value_heads", m.num_key_value_heads},
           {"head_dim", m.head_dim}})
    if (v < 1) return fmt::format("config: model.{}={} must be >= 1", key, v);
  if (!(m.rms_norm_eps > 0) || !std::isfinite(m.rms_norm_eps))
    return fmt::format("config: model.rms_norm_eps={} must be finite and > 0", m.rms_norm_eps);
  if (!(m.rope_theta > 0) || !std::isfinite(m.rope_theta))
    return fmt::format("config: model.rope_theta={} must be finite and > 0", m.rope_theta);
  if (!(m.partial_rotary_factor >= 0 && m.partial_rotary_factor <= 1))
    return fmt::format("config: model.partial_rotary_factor={} must be in [0, 1]", m.partial_rotary_factor);
  if (!(m.initializer_range >= 0) || !std::isfinite(m.initializer_range))
    return fmt::format("config: model.initializer_range={} must be finite and >= 0", m.initializer_range);
  if (p.tp < 1 || p.cp < 1 || (p.dp != -1 && p.dp < 1))
    return fmt::format("config: parallel.tp={}, parallel.cp={}, parallel.dp={}: sizes must be >= 1 (dp may be -1)", p.tp,
                       p.cp, p.dp);
  if (world_size > 0) {  // the same message as the trainer's ParallelDims::resolve (docs/parallelism.md)
    dist::ParallelDims dims{int(p.tp), int(p.cp), int(p.dp)};
    if (std::string e = dims.resolve(world_size); !e.empty()) return e;
  }
  const int64_t tpcp = p.tp * p.cp;
  if (m.linear_num_value_heads % m.linear_num_key_heads)
    return fmt::format("config: model.linear_num_value_heads={} is not a multiple of model.linear_num_key_heads={}",
                       m.linear_num_value_heads, m.linear_num_key_heads);
  if (m.linear_num_key_heads % tpcp || m.linear_num_value_heads % tpcp)
    return fmt::format(
        "config: GDN head-parallel CP needs tp*cp={} to divide linear_num_key_heads={} and linear_num_value_heads={}",
        tpcp, m.linear_num_key_heads, m.linear_num_value_heads);
  if (m.num_attention_heads % m.num_key_value_heads)
    return fmt::format("config: model.num_attention_heads={} is not a multiple of model.num_key_value_heads={}",
                       m.num_attention_heads, m.num_key_value_heads);
  if (m.num_key_value_heads % p.tp)
    return fmt::format("config: parallel.tp={} must divide model.num_key_value_heads={} (attention heads split over tp)",
                       p.tp, m.num_key_value_heads);
  if (m.intermediate_size % p.tp)
    return fmt::format("config: parallel.tp={} must divide model.intermediate_size={}", p.tp, m.intermediate_size);
  if (m.vocab_size % p.tp)
    return fmt::format("config: parallel.tp={} must divide model.vocab_size={} (next valid size {})", p.tp, m.vocab_size,
                       (m.vocab_size + p.tp - 1) / p.tp * p.tp);
  if (m.linear_conv_kernel_dim < 2 || m.linear_conv_kernel_dim > 8)
    return fmt::format("config: model.linear_conv_kernel_dim={} must be in 2..8", m.linear_conv_kernel_dim);
  if (!m.layer_types.empty() && int64_t(m.layer_types.size()) != m.num_hidden_layers)
    return fmt::format("config: model.layer_types has {} entries but model.num_hidden_layers={}", m.layer_types.size(),
                       m.num_hidden_layers);
  for (size_t i = 0; i < m.layer_types.size(); ++i)
    if (m.layer_types[i] != "linear_attention" && m.layer_types[i] != "full_attention")
      return fmt::format("config: model.layer_types[{}] = '{}' is not one of: linear_attention, full_attention", i,
                         m.layer_types[i]);
  const int64_t D = 2 * p.cp;
  if (c.data.max_tokens <= 0) return fmt::format("config: data.max_tokens={} must be > 0", c.data.max_tokens);
  if (p.cp > 1 && c.data.max_tokens % D)
    return fmt::format("config: data.max_tokens={} must be a multiple of 2*parallel.cp={} (next valid {})",
                       c.data.max_tokens, D, (c.data.max_tokens + D - 1) / D * D);
  if (p.cp > 1 && c.data.pad_multiple != 0 && c.data.pad_multiple % D)
    return fmt::format("config: data.pad_multiple={} must be a multiple of 2*parallel.cp={}", c.data.pad_multiple, D);
  if (c.optimizer.lr <= 0) return fmt::format("config: optimizer.lr={} must be > 0", c.optimizer.lr);
  if (c.optimizer.clip_grad < 0) return fmt::format("config: optimizer.clip_grad={} must be >= 0 (0 = off)", c.optimizer.clip_grad);
  if (c.train.steps < 0) return fmt::format("config: train.steps={} must be >= 0", c.train.steps);
  if (c.train.grad_accum < 1) return fmt::format("config: train.grad_accum={} must be >= 1", c.train.grad_accum);
  if (c.train.max_nonfinite_in_a_row < 1)
    return fmt::format("config: train.max_nonfinite_in_a_row={} must be >= 1", c.train.max_nonfinite_in_a_row);
  if (c.checkpoint.interval < 0)
    return fmt::format("config: checkpoint.interval={} must be >= 0 (0 = only at the end)", c.checkpoint.interval);
  if (c.checkpoint.keep_last < 1) return fmt::format("config: checkpoint.keep_last={} must be >= 1", c.checkpoint.keep_last);
  return "";
}

std::string config_to_yaml(const Config& cin) {
  Config c = cin;
  YAML::Emitter e;
  e << YAML::BeginMap;
  std::string section;
  for (const Field& f : fields()) {
    std::string key(f.key), sec = key.substr(0, key.find('.')), name = key.substr(key.find('.') + 1);
    if (sec != section) {
      if (!section.empty()) e << YAML::EndMap;
      e << YAML::Key << sec << YAML::Value << YAML::BeginMap;
      section = sec;
    }
    e << YAML::Key << name << YAML::Value;
    void* a = f.addr(c);
    switch (f.kind) {
      case Kind::i64: e << *static_cast<int64_t*>(a); break;
      case Kind::f64: e << YAML::Precision(17) << *static_cast<double*>(a); break;
      case Kind::boolean: e << *static_cast<bool*>(a); break;
      case Kind::str: e << YAML::DoubleQuoted << *static_cast<std::string*>(a); break;
      case Kind::str_list: e << YAML::Flow << *static_cast<std::vector<std::string>*>(a); break;
    }
  }
  e << YAML::EndMap << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

std::string config_keys_markdown() {
  Config d;
  std::string out = "| key | type | default | meaning |\n|---|---|---|---|\n";
  for (const Field& f : fields()) {
    void* a = f.addr(d);
    std::string def;
    switch (f.kind) {
      case Kind::i64: def = std::to_string(*static_cast<int64_t*>(a)); break;
      case Kind::f64: def = fmt::format("{}", *static_cast<double*>(a)); break;
      case Kind::boolean: def = *static_cast<bool*>(a) ? "true" : "false"; break;
      case Kind::str: def = "\"" + *static_cast<std::string*>(a) + "\""; break;
      case Kind::str_list: def = "[]"; break;
    }
    std::string help;  // a '|' inside a cell would end it
    for (const char* c = f.help; *c; ++c) help += *c == '|' ? std::string("\\|") : std::string(1, *c);
    out += fmt::format("| `{}` | {} | `{}` | {} |\n", f.key, kind_name(f.kind), def, help);
  }
  return out;
}

}  // namespace dt::io
