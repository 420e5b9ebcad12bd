#include "deltatron/train/checkpoint.h"

#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "deltatron/core/sha256.h"
#include "deltatron/dist/comm.h"
#include "deltatron/io/durable.h"
#include "deltatron/io/safetensors.h"
#include "deltatron/ops/basic.h"

namespace dt::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "deltatron-checkpoint v1";
constexpr const char* kShardFormat = "deltatron-checkpoint-shard v1";
const std::string kM = "optim.m.", kV = "optim.v.";  // AdamW moment tensors: prefix + parameter name

// ---- files (agreement over the ranks: dist::first_message / from_rank0 on a host MPI world) ----

std::string read_text(const fs::path& p, std::string* out) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return fmt::format("{}: cannot open ({})", p.string(), std::strerror(errno));
  std::stringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  return "";
}

// ---- names --------------------------------------------------------------------------------

bool parse_step_name(const std::string& name, int64_t* step) {
  static const std::regex re("step_([0-9]{7,18})");
  std::smatch m;
  if (!std::regex_match(name, m, re)) return false;
  *step = std::stoll(m[1].str());
  return true;
}

// ---- the config saved in metadata.json ------------------------------------------------------

// config_to_yaml text -> Config, through the same key table as every other config.
std::string parse_saved_config(const std::string& yaml, io::Config* out) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return fmt::format("the saved config is not valid YAML: {}", e.what());
  }
  if (!root.IsMap()) return "the saved config is not a map of sections";
  std::vector<std::string> sets;
  for (auto sec = root.begin(); sec != root.end(); ++sec) {
    if (!sec->second.IsMap()) return fmt::format("the saved config section '{}' is not a map", sec->first.as<std::string>());
    for (auto kv = sec->second.begin(); kv != sec->second.end(); ++kv) {
      YAML::Emitter e;
      e << YAML::Flow << kv->second;
      sets.push_back(sec->first.as<std::string>() + "." + kv->first.as<std::string>() + "=" + e.c_str());
    }
  }
  std::string err = io::load_config("", sets, out);
  if (!err.empty()) return "the saved config does not load: " + err;
  if (io::config_to_yaml(*out) != yaml) return "the saved config does not read back to the same text";
  return "";
}

// ---- parameter pieces -------------------------------------------------------------------------

TensorView along(const TensorView& t, int dim, int64_t off, int64_t len) {
  return dim < 0 ? t : t.slice(dim, off, off + len);
}

// Copies into `dst` (this rank's shard under tp_new) every element of `src` (tp rank q's shard
// under tp_old) that belongs to it; returns the number of elements copied.
int64_t copy_overlap(const TensorView& dst, int tp_new, int r_new, const TensorView& src, int tp_old, int q,
                     const model::ParamSpec& s) {
  if (s.tp_dim < 0) {
    ops::copy(dst, src);
    return dst.numel();
  }
  int64_t copied = 0;
  const int64_t row = dst.numel() / std::max<int64_t>(dst.shape[s.tp_dim], 1);  // elements per tp_dim index
  for (const model::ShardPiece& a : model::shard_pieces(s, tp_new, r_new))
    for (const model::ShardPiece& b : model::shard_pieces(s, tp_old, q)) {
      const int64_t lo = std::max(a.global_off, b.global_off), hi = std::min(a.global_off + a.len, b.global_off + b.len);
      if (lo >= hi) continue;
      ops::copy(along(dst, s.tp_dim, a.local_off + lo - a.global_off, hi - lo),
                along(src, s.tp_dim, b.local_off + lo - b.global_off, hi - lo));
      copied += (hi - lo) * row;
    }
  return copied;
}

bool overlaps(const model::ParamSpec& s, int tp_new, int r_new, int tp_old, int q) {
  for (const model::ShardPiece& a : model::shard_pieces(s, tp_new, r_new))
    for (const model::ShardPiece& b : model::shard_pieces(s, tp_old, q))
      if (std::max(a.global_off, b.global_off) < std::min(a.global_off + a.len, b.global_off + b.len)) return true;
  return false;
}

// The dims of a shape (the JSON form of metadata.json).
std::vector<int64_t> dims_of(const Shape& s) { return std::vector<int64_t>(s.d.begin(), s.d.begin() + s.ndim); }

}  // namespace

// ---- names and listing -------------------------------------------------------------------------

std::string step_dir_name(int64_t step) { return fmt::format("step_{:07d}", step); }
std::string tmp_dir_name(int64_t step) { return step_dir_name(step) + ".tmp"; }
std::string shard_file_name(int tp_rank, int tp) { return fmt::format("shard_tp{:02d}-of-{:02d}.safetensors", tp_rank, tp); }

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& ckpt_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(ckpt_dir, ec)) {
    int64_t step;
    if (!e.is_directory(ec) || !parse_step_name(e.path().filename().string(), &step)) continue;
    if (fs::exists(e.path() / "metadata.json", ec)) out.push_back({step, e.path().string()});
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string read_latest(const std::string& ckpt_dir, std::string* step_dir) {
  step_dir->clear();
  const fs::path latest = fs::path(ckpt_dir) / "latest";
  std::error_code ec;
  if (!fs::exists(latest, ec)) return "";
  std::string text;
  if (std::string e = read_text(latest, &text); !e.empty()) return "checkpoint.dir: " + e;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  int64_t step;
  if (!parse_step_name(text, &step))
    return fmt::format("checkpoint.dir: {} holds '{}', not a step directory name like {}", latest.string(), text,
                       step_dir_name(0));
  const fs::path dir = fs::path(ckpt_dir) / text;
  if (!fs::exists(dir / "metadata.json", ec))
    return fmt::format("checkpoint.dir: {} names {}, which is not a complete checkpoint (no {})", latest.string(), text,
                       (dir / "metadata.json").string());
  *step_dir = dir.string();
  return "";
}

std::string resume_step_dir(const std::string& ckpt_dir, std::string* step_dir, std::string* note) {
  note->clear();
  if (std::string e = read_latest(ckpt_dir, step_dir); !e.empty() || !step_dir->empty()) return e;
  // No `latest`, yet complete step directories: a crash in the first save between its rename and
  // the write of `latest` leaves this. Starting fresh would replace them at the next saves.
  const std::vector<std::pair<int64_t, std::string>> done = list_checkpoints(ckpt_dir);
  if (done.empty()) return "";  // nothing saved yet
  CheckpointInfo ck;
  if (std::string e = read_checkpoint_info(done.back().second, &ck); !e.empty())
    return fmt::format("checkpoint.dir = '{}' has no `latest`, and its newest step directory {} does not read: {}{}",
                       ckpt_dir, done.back().second, e,
                       done.size() > 1 ? fmt::format(" ---> hint: --set checkpoint.load={} starts from the one before",
                                                     done[done.size() - 2].second)
                                       : std::string());
  *step_dir = done.back().second;
  *note = fmt::format(
      "checkpoint.dir = '{}' has no `latest` (a crash during the first save, after its step directory was "
      "renamed into place and before `latest` was written, leaves this): resuming from the newest complete "
      "checkpoint, {} (step {})",
      ckpt_dir, *step_dir, ck.step);
  return "";
}

std::string prepare_checkpoint_dir(const std::string& ckpt_dir) {
  std::unique_ptr<dist::Communicator> world = dist::make_world(dist::Backend::mpi);
  std::string err;
  if (world->rank() == 0) {
    std::error_code ec;
    if (fs::exists(ckpt_dir, ec) && !fs::is_directory(ckpt_dir, ec)) {
      err = fmt::format("checkpoint.dir = '{}': cannot save there (it exists and is not a directory)", ckpt_dir);
    } else if (fs::create_directories(ckpt_dir, ec); ec) {
      err = fmt::format("checkpoint.dir = '{}': cannot create the directory ({})", ckpt_dir, ec.message());
    } else {
      // A file made and removed, as a save writes its files: permissions, a read-only mount or a
      // full inode table show here, before the first step, rather than at the first save after
      // the training time is spent.
      const fs::path probe = fs::path(ckpt_dir) / ".deltatron-write-probe";
      if (std::string e = io::write_durable(probe, "probe\n"); !e.empty())
        err = fmt::format("checkpoint.dir = '{}': cannot write there ({})", ckpt_dir, e);
      if (fs::remove(probe, ec); ec && err.empty())
        err = fmt::format("checkpoint.dir = '{}': cannot remove files there ({}: {})", ckpt_dir, probe.string(),
                          ec.message());
    }
  }
  return dist::from_rank0(*world, err);
}

// ---- metadata -------------------------------------------------------------------------------

std::string read_checkpoint_info(const std::string& step_dir, CheckpointInfo* out) {
  const fs::path meta = fs::path(step_dir) / "metadata.json";
  std::error_code ec;
  if (!fs::is_directory(step_dir, ec)) return fmt::format("checkpoint {}: no such directory", step_dir);
  if (!fs::exists(meta, ec)) {
    if (fs::exists(fs::path(step_dir) / "latest", ec))
      return fmt::format(
          "checkpoint {}: no metadata.json: this is a checkpoint.dir, not a step directory ---> hint: "
          "checkpoint.load takes {}/step_NNNNNNN (the file latest names the newest), or set checkpoint.dir={} "
          "with checkpoint.resume=true",
          step_dir, step_dir, step_dir);
    return fmt::format("checkpoint {}: no metadata.json (not a complete checkpoint: a save that did not finish?)",
                       step_dir);
  }
  std::string text;
  if (std::string e = read_text(meta, &text); !e.empty()) return "checkpoint " + e;
  CheckpointInfo ck;
  ck.dir = step_dir;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    if (j.value("format", "") != kFormat)
      return fmt::format("{}: format '{}' is not '{}'", meta.string(), j.value("format", ""), kFormat);
    ck.step = j.at("step").get<int64_t>();
    const auto& L = j.at("layout");
    ck.tp = L.at("tp").get<int>();
    ck.cp = L.at("cp").get<int>();
    ck.dp = L.at("dp").get<int>();
    ck.sp = L.at("sp").get<bool>();
    ck.seed = j.at("rng").at("seed").get<uint64_t>();
    ck.optimizer = j.at("optimizer").at("name").get<std::string>();
    ck.num_updates = j.at("optimizer").at("num_updates").get<int64_t>();
    ck.guard_skipped = j.at("step_guard").at("skipped").get<int64_t>();
    ck.guard_in_a_row = j.at("step_guard").at("in_a_row").get<int64_t>();
    for (const auto& p : j.at("loader")) {
      data::LoaderPosition pos;
      if (std::string e = data::LoaderPosition::parse(p.get<std::string>(), &pos); !e.empty())
        return fmt::format("{}: {}", meta.string(), e);
      ck.loader.push_back(pos);
    }
    for (const auto& p : j.at("params"))
      ck.params.push_back({p.at("name").get<std::string>(), p.at("shape").get<std::vector<int64_t>>(),
                           p.at("tp_dim").get<int>()});
    for (const auto& f : j.at("files"))
      ck.files.push_back({f.at("name").get<std::string>(), f.at("bytes").get<uint64_t>(), f.at("sha256").get<std::string>()});
    if (std::string e = parse_saved_config(j.at("config").get<std::string>(), &ck.config); !e.empty())
      return fmt::format("{}: {}", meta.string(), e);
  } catch (const std::exception& e) {
    return fmt::format("{}: not a valid checkpoint metadata file: {}", meta.string(), e.what());
  }
  if (ck.step < 0 || ck.tp < 1 || ck.cp < 1 || ck.dp < 1 || ck.num_updates < 0)
    return fmt::format("{}: step {} / layout tp {} cp {} dp {} / num_updates {} out of range", meta.string(), ck.step,
                       ck.tp, ck.cp, ck.dp, ck.num_updates);
  if (int64_t(ck.loader.size()) != ck.dp)
    return fmt::format("{}: {} loader positions for dp {}", meta.string(), ck.loader.size(), ck.dp);
  for (const data::LoaderPosition& p : ck.loader)
    if (!(p == ck.loader[0]))
      return fmt::format("{}: the dp ranks' loader positions differ ({} vs {})", meta.string(), p.to_string(),
                         ck.loader[0].to_string());
  if (ck.optimizer != "adamw" && ck.optimizer != "sgd")
    return fmt::format("{}: optimizer '{}' is not adamw | sgd", meta.string(), ck.optimizer);
  std::vector<std::string> want;
  for (int q = 0; q < ck.tp; ++q) want.push_back(shard_file_name(q, ck.tp));
  std::vector<std::string> have;
  for (const auto& f : ck.files) {
    if (f.name.find('/') != std::string::npos || f.sha256.size() != 64)
      return fmt::format("{}: bad file entry '{}' (sha256 '{}')", meta.string(), f.name, f.sha256);
    have.push_back(f.name);
  }
  if (have != want)
    return fmt::format("{}: lists files [{}], expected the {} tp shards [{}]", meta.string(), fmt::join(have, ", "),
                       ck.tp, fmt::join(want, ", "));
  *out = std::move(ck);
  return "";
}

std::string verify_checkpoint_file(const CheckpointInfo& ck, const CheckpointInfo::File& f) {
  const fs::path p = fs::path(ck.dir) / f.name;
  std::error_code ec;
  if (!fs::exists(p, ec)) return fmt::format("checkpoint {}: file {} is missing", ck.dir, f.name);
  const uint64_t size = fs::file_size(p, ec);
  if (ec) return fmt::format("checkpoint {}: cannot stat {} ({})", ck.dir, f.name, ec.message());
  if (size != f.bytes)
    return fmt::format("checkpoint {}: file {} has {} bytes, metadata.json says {} ({})", ck.dir, f.name, size, f.bytes,
                       size < f.bytes ? "truncated" : "grown");
  std::string hex;
  uint64_t n = 0;
  if (std::string e = sha256_file(p.string(), &hex, &n); !e.empty()) return "checkpoint " + e;
  if (hex != f.sha256)
    return fmt::format("checkpoint {}: SHA-256 mismatch in {}: expected {}, actual {} (the file is corrupt)", ck.dir,
                       f.name, f.sha256, hex);
  return "";
}

std::string check_model_compatible(const io::Config& saved, const io::Config& run, std::vector<std::string>* warnings) {
  const io::ModelConfig &a = saved.model, &b = run.model;
  auto differ = [](const std::string& key, auto x, auto y) {
    return x == y ? std::string()
                  : fmt::format("checkpoint model.{} = {}, but this run has model.{} = {}: the parameter shapes differ",
                                key, x, key, y);
  };
  const std::vector<std::string> shape_errors = {
      differ("vocab_size", a.vocab_size, b.vocab_size),
      differ("hidden_size", a.hidden_size, b.hidden_size),
      differ("intermediate_size", a.intermediate_size, b.intermediate_size),
      differ("num_hidden_layers", a.num_hidden_layers, b.num_hidden_layers),
      differ("layer_types", fmt::format("[{}]", fmt::join(io::resolved_layer_types(a), ", ")),
             fmt::format("[{}]", fmt::join(io::resolved_layer_types(b), ", "))),
      differ("linear_num_key_heads", a.linear_num_key_heads, b.linear_num_key_heads),
      differ("linear_num_value_heads", a.linear_num_value_heads, b.linear_num_value_heads),
      differ("linear_key_head_dim", a.linear_key_head_dim, b.linear_key_head_dim),
      differ("linear_value_head_dim", a.linear_value_head_dim, b.linear_value_head_dim),
      differ("linear_conv_kernel_dim", a.linear_conv_kernel_dim, b.linear_conv_kernel_dim),
      differ("num_attention_heads", a.num_attention_heads, b.num_attention_heads),
      differ("num_key_value_heads", a.num_key_value_heads, b.num_key_value_heads),
      differ("head_dim", a.head_dim, b.head_dim),
      differ("tie_word_embeddings", a.tie_word_embeddings, b.tie_word_embeddings)};
  for (const std::string& e : shape_errors)
    if (!e.empty()) return e;
  if (warnings) {
    auto note = [&](const std::string& key, double x, double y) {
      if (x != y)
        warnings->push_back(
            fmt::format("checkpoint model.{} = {}, this run has {}: using the run's value", key, x, y));
    };
    note("partial_rotary_factor", a.partial_rotary_factor, b.partial_rotary_factor);
    note("rope_theta", a.rope_theta, b.rope_theta);
    note("rms_norm_eps", a.rms_norm_eps, b.rms_norm_eps);
    note("initializer_range", a.initializer_range, b.initializer_range);
  }
  return "";
}

// ---- the loader position ---------------------------------------------------------------------

namespace {
// The seek the load will make, tried on a copy of the loader: a position it would refuse (a step
// past its epoch in an edited metadata.json) is an error now, before any state changes.
std::string try_seek(const CheckpointInfo& ck, const TrainState& st, const data::LoaderPosition& p) {
  data::PackedLoader probe = *st.loader;
  if (std::string e = probe.seek(p); !e.empty())
    return fmt::format("checkpoint {}: the saved data position ({}) cannot be continued here: {}", ck.dir,
                       p.to_string(), e);
  return "";
}
}  // namespace

std::string resume_loader_position(const CheckpointInfo& ck, const TrainState& st, data::LoaderPosition* out) {
  const data::LoaderPosition& saved = ck.loader.at(0);
  const uint64_t fp = st.loader->fingerprint();
  if (saved.fingerprint == fp) {  // same data config, dataset and layout
    *out = saved;
    return try_seek(ck, st, *out);
  }
  if (saved.epoch < 0 || saved.step < 0)
    return fmt::format("checkpoint {}: the saved data position ({}) has a negative epoch or step", ck.dir,
                       saved.to_string());
  const io::Config& run = *st.cfg;
  auto key_differs = [&](const std::string& key, auto x, auto y) {
    return fmt::format(
        "checkpoint {}: {} = {} when saved, {} in this run: the data order would change, so the run cannot "
        "continue the saved data stream ---> hint: --set {}={}",
        ck.dir, key, x, y, key, x);
  };
  if (ck.config.data.max_tokens != run.data.max_tokens)
    return key_differs("data.max_tokens", ck.config.data.max_tokens, run.data.max_tokens);
  if (ck.config.data.shuffle != run.data.shuffle) return key_differs("data.shuffle", ck.config.data.shuffle, run.data.shuffle);
  if (ck.config.train.seed != run.train.seed) return key_differs("train.seed", ck.config.train.seed, run.train.seed);
  data::PackerConfig old = st.packer;
  old.max_tokens = ck.config.data.max_tokens;
  old.pad_multiple = ck.config.data.pad_multiple;
  old.shuffle = ck.config.data.shuffle;
  old.seed = uint64_t(ck.config.train.seed);
  old.sp = ck.sp ? ck.tp : 1;
  old.cp = ck.cp;
  old.dp = ck.dp;
  if (std::string e = data::validate_packer_config(old); !e.empty())
    return fmt::format("checkpoint {}: the saved data config is not valid: {}", ck.dir, e);
  data::PackedLoader ref(*st.ds, old, 0);
  if (ref.fingerprint() != saved.fingerprint)
    return fmt::format(
        "checkpoint {}: the dataset {} is not the one the checkpoint was trained on (documents, lengths or the data "
        "config differ; loader fingerprint {:016x} when saved, {:016x} now)",
        ck.dir, run.data.prefix, saved.fingerprint, ref.fingerprint());
  // Another layout: continue the global micro-batch stream of the saved epoch, when it is the same.
  std::vector<int64_t> lengths(size_t(st.ds->num_documents()));
  for (int64_t d = 0; d < st.ds->num_documents(); ++d) lengths[size_t(d)] = st.ds->document_length(d);
  const auto plan_old = data::plan_epoch(lengths, old, saved.epoch), plan_new = data::plan_epoch(lengths, st.packer, saved.epoch);
  if (plan_old != plan_new) {
    // Hint the saved pad multiple only where this layout accepts it and it packs the same.
    data::PackerConfig same = st.packer;
    same.pad_multiple = data::packer_pad_multiple(old);
    const bool works =
        data::validate_packer_config(same).empty() && data::plan_epoch(lengths, same, saved.epoch) == plan_old;
    const std::string hint =
        works ? fmt::format("--set data.pad_multiple={}", same.pad_multiple)
              : fmt::format("this layout does not accept the saved data.pad_multiple {} or packs differently "
                            "with it; save with a data.pad_multiple that every layout to load under accepts (a "
                            "multiple of 2*parallel.cp and of the pack alignment, e.g. 8 for cp <= 4 without SP)",
                            same.pad_multiple);
    return fmt::format(
        "checkpoint {}: epoch {} packs into other micro-batches under this layout (data.pad_multiple {} and "
        "alignment {} when saved, {} and {} now), so the saved data position has no equivalent ---> hint: {}",
        ck.dir, saved.epoch, data::packer_pad_multiple(old), data::packer_alignment(old),
        data::packer_pad_multiple(st.packer), data::packer_alignment(st.packer), hint);
  }
  const int64_t consumed = saved.step * ck.dp;  // global micro-batches of the epoch already trained on
  const int64_t steps_old = (int64_t(plan_old.size()) + ck.dp - 1) / ck.dp;  // with the dp fillers
  if (saved.step > steps_old)
    return fmt::format("checkpoint {}: the saved data position ({}) is past the {} steps of epoch {} under the saved "
                       "layout (dp {})",
                       ck.dir, saved.to_string(), steps_old, saved.epoch, ck.dp);
  if (consumed >= int64_t(plan_old.size())) {
    *out = {saved.epoch + 1, 0, fp};
    return try_seek(ck, st, *out);
  }
  const int dp = st.packer.dp;
  if (consumed % dp)
    return fmt::format(
        "checkpoint {}: {} global micro-batches of epoch {} were consumed under dp {}, not a multiple of this run's "
        "dp {} ---> hint: keep train.grad_accum x dp the same as when saved ({} x {})",
        ck.dir, consumed, saved.epoch, ck.dp, dp, ck.config.train.grad_accum, ck.dp);
  *out = {saved.epoch, consumed / dp, fp};
  return try_seek(ck, st, *out);
}

// ---- save ------------------------------------------------------------------------------------

std::string save_checkpoint(const TrainState& st, int64_t step) {
  const io::Config& cfg = *st.cfg;
  const dist::ProcessGroups& pg = *st.pg;
  std::unique_ptr<dist::Communicator> world = dist::make_world(dist::Backend::mpi);
  const fs::path root = cfg.checkpoint.dir, tmp = root / tmp_dir_name(step), final_dir = root / step_dir_name(step);
  std::error_code ec;

  // 1. rank 0 makes a fresh temporary directory (a crashed save of this step may have left one).
  std::string err;
  if (world->rank() == 0) {
    fs::create_directories(root, ec);
    if (!ec) fs::remove_all(tmp, ec);
    if (!ec) fs::create_directory(tmp, ec);
    if (ec) err = fmt::format("checkpoint.dir: cannot create {} ({})", tmp.string(), ec.message());
  }
  if (err = dist::from_rank0(*world, err); !err.empty()) return err;

  // 2. the tp ranks of (dp 0, cp 0) write their shard: master weights and optimizer state.
  const int tp = pg.dims.tp, q = pg.coord.tp;
  const bool writer = pg.coord.dp == 0 && pg.coord.cp == 0;
  uint64_t bytes = 0;
  std::string sha(64, '0');
  if (writer) {
    std::map<std::string, TensorView> tensors;
    std::vector<Tensor> host;  // device tensors copied to the host on the trainer's stream
    auto add = [&](const std::string& name, const Tensor& t) {
      if (t.device().is_cpu()) {
        tensors[name] = t.view();
      } else {
        host.push_back(ops::to_host(t, st.stream));
        tensors[name] = host.back().view();
      }
    };
    const auto& state = st.opt->state();
    for (size_t i = 0; i < st.params.size(); ++i) {
      const model::Param& p = *st.params[i];
      add(p.spec.name, p.master);
      if (st.opt->kind() == Optimizer::Kind::adamw) {
        add(kM + p.spec.name, state[i].m);
        add(kV + p.spec.name, state[i].v);
      }
    }
    const fs::path file = tmp / shard_file_name(q, tp);
    err = io::write_safetensors(file.string(), tensors,
                                {{"format", kShardFormat}, {"step", std::to_string(step)}, {"tp", std::to_string(tp)},
                                 {"tp_rank", std::to_string(q)}});
    if (err.empty()) err = io::fsync_path(file, false);
    if (err.empty()) err = sha256_file(file.string(), &sha, &bytes);  // what is on disk is what load checks
  }
  // A failed save leaves nothing behind: rank 0 drops the temporary directory.
  auto failed = [&](const std::string& e) {
    if (world->rank() == 0) fs::remove_all(tmp, ec);
    return e;
  };
  if (err = dist::first_message(*world, err); !err.empty()) return failed(err);

  // 3. every rank's loader position and file record to rank 0.
  constexpr int64_t kRec = 3 * 8 + 8 + 64;  // epoch, step, fingerprint, bytes, sha256 hex
  const data::LoaderPosition pos = st.loader->position();
  Tensor rec = Tensor::zeros(Shape{kRec}, DType::u8), all = Tensor::empty(Shape{kRec * world->size()}, DType::u8);
  {
    auto* r = static_cast<char*>(rec.data());
    const int64_t vals[4] = {pos.epoch, pos.step, int64_t(pos.fingerprint), int64_t(bytes)};
    std::memcpy(r, vals, sizeof(vals));
    std::memcpy(r + 32, sha.data(), 64);
  }
  world->all_gather(all, rec);

  // 4. rank 0 writes metadata.json last, then commits: fsync, rename, `latest`, keep_last.
  if (world->rank() == 0) {
    auto record = [&](int rank, int64_t vals[4], std::string* hex) {
      const char* r = static_cast<const char*>(all.data()) + rank * kRec;
      std::memcpy(vals, r, 32);
      hex->assign(r + 32, 64);
    };
    nlohmann::json j;
    j["format"] = kFormat;
    j["step"] = step;
    j["config"] = io::config_to_yaml(cfg);
    j["layout"] = {{"tp", tp}, {"cp", pg.dims.cp}, {"dp", pg.dims.dp}, {"sp", cfg.parallel.sp}, {"world", world->size()}};
    j["rng"] = {{"seed", uint64_t(cfg.train.seed)},
                {"generator", "Philox4x32-10, counter-based: init draws by (seed, name, global element index), the "
                              "data order by (seed, epoch); no other random state exists"}};
    j["optimizer"] = {{"name", cfg.optimizer.name}, {"num_updates", st.opt->num_updates()}};
    j["step_guard"] = {{"skipped", st.guard->skipped()}, {"in_a_row", st.guard->in_a_row()}};
    j["loader"] = nlohmann::json::array();
    for (int d = 0; d < pg.dims.dp; ++d) {
      int64_t v[4];
      std::string hex;
      record(dist::rank_of(pg.dims, {0, 0, d}), v, &hex);
      j["loader"].push_back(data::LoaderPosition{v[0], v[1], uint64_t(v[2])}.to_string());
    }
    j["params"] = nlohmann::json::array();
    for (const model::Param* p : st.params)
      j["params"].push_back({{"name", p->spec.name},
                             {"shape", dims_of(p->spec.shape)},
                             {"tp_dim", p->spec.tp_dim},
                             {"sections", p->spec.sections}});
    j["files"] = nlohmann::json::array();
    for (int t = 0; t < tp; ++t) {
      int64_t v[4];
      std::string hex;
      record(dist::rank_of(pg.dims, {t, 0, 0}), v, &hex);
      j["files"].push_back({{"name", shard_file_name(t, tp)}, {"bytes", uint64_t(v[3])}, {"sha256", hex}});
    }
    err = io::write_durable(tmp / "metadata.json", j.dump(1) + "\n");
    if (err.empty()) err = io::fsync_path(tmp, true);
    if (err.empty() && fs::exists(final_dir, ec)) fs::remove_all(final_dir, ec);  // a stale save of this step
    if (err.empty() && !ec) fs::rename(tmp, final_dir, ec);
    if (err.empty() && ec) err = fmt::format("checkpoint: cannot rename {} to {} ({})", tmp.string(), final_dir.string(), ec.message());
    if (err.empty()) err = io::fsync_path(root, true);
    if (err.empty()) err = io::write_durable(root / "latest.tmp", step_dir_name(step) + "\n");
    if (err.empty()) {
      fs::rename(root / "latest.tmp", root / "latest", ec);
      if (ec) err = fmt::format("checkpoint: cannot rename {} ({})", (root / "latest.tmp").string(), ec.message());
    }
    if (err.empty()) err = io::fsync_path(root, true);
    if (err.empty()) {
      // keep_last: the newest complete checkpoints up to this step stay; later ones (another
      // history of the run) are left alone. Temporary directories of earlier saves are dropped.
      std::vector<std::pair<int64_t, std::string>> done;
      for (const auto& c : list_checkpoints(root.string()))
        if (c.first <= step) done.push_back(c);
      for (size_t i = 0; i + size_t(cfg.checkpoint.keep_last) < done.size(); ++i) fs::remove_all(done[i].second, ec);
      for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
        const std::string name = e.path().filename().string();
        int64_t s;
        if (name.size() > 4 && name.ends_with(".tmp") && parse_step_name(name.substr(0, name.size() - 4), &s) &&
            s <= step)
          fs::remove_all(e.path(), ec);
      }
    }
  }
  err = dist::from_rank0(*world, err);
  return err.empty() ? err : failed(err);
}

// ---- load ------------------------------------------------------------------------------------

namespace {
struct Verified {
  CheckpointInfo ck;
  data::LoaderPosition pos;
};

std::string verify_all(dist::Communicator& world, const std::string& step_dir, const TrainState& st, Verified* v) {
  std::string err = read_checkpoint_info(step_dir, &v->ck);
  if (err = dist::first_message(world, err); !err.empty()) return err;
  const CheckpointInfo& ck = v->ck;
  // Every file's size and SHA-256, spread over the ranks.
  for (size_t i = size_t(world.rank()); i < ck.files.size() && err.empty(); i += size_t(world.size()))
    err = verify_checkpoint_file(ck, ck.files[i]);
  if (err = dist::first_message(world, err); !err.empty()) return err;
  // Model and optimizer.
  std::vector<std::string> warnings;
  err = check_model_compatible(ck.config, *st.cfg, &warnings);
  if (err.empty() && st.opt->kind() == Optimizer::Kind::adamw && ck.optimizer != "adamw")
    err = fmt::format(
        "checkpoint {} was saved with optimizer.name = {}, which keeps no AdamW moments; this run has "
        "optimizer.name = adamw ---> hint: --set optimizer.name={}",
        ck.dir, ck.optimizer, ck.optimizer);
  if (err.empty() && st.opt->kind() == Optimizer::Kind::sgd && ck.optimizer == "adamw")
    warnings.push_back(fmt::format("checkpoint {} holds AdamW moments; this run uses SGD and ignores them", ck.dir));
  // Legal, but the run then does not continue the saved one's curve: say so.
  const io::Config& run = *st.cfg;
  if (run.schedule.name == "cosine" && ck.config.train.steps != run.train.steps)
    warnings.push_back(fmt::format(
        "checkpoint {}: train.steps = {} when saved, {} now: the cosine schedule spans the new total, so the learning "
        "rate jumps at the resumed step",
        ck.dir, ck.config.train.steps, run.train.steps));
  const int64_t batch_saved = ck.config.train.grad_accum * ck.dp, batch_now = run.train.grad_accum * st.pg->dims.dp;
  if (batch_saved != batch_now)
    warnings.push_back(fmt::format(
        "checkpoint {}: the global batch is {} micro-batches now (train.grad_accum {} x dp {}), {} when saved ({} x "
        "{}){}",
        ck.dir, batch_now, run.train.grad_accum, st.pg->dims.dp, batch_saved, ck.config.train.grad_accum, ck.dp,
        batch_saved % st.pg->dims.dp == 0
            ? fmt::format(" ---> hint: --set train.grad_accum={} keeps it", batch_saved / st.pg->dims.dp)
            : std::string()));
  if (err.empty()) {
    std::map<std::string, const CheckpointInfo::ParamEntry*> saved;
    for (const auto& e : ck.params) saved[e.name] = &e;
    for (const model::Param* p : st.params) {
      auto it = saved.find(p->spec.name);
      if (it == saved.end()) {
        err = fmt::format("checkpoint {} has no parameter {}", ck.dir, p->spec.name);
        break;
      }
      if (it->second->shape != dims_of(p->spec.shape) || it->second->tp_dim != p->spec.tp_dim) {
        err = fmt::format("checkpoint {}: parameter {} has shape [{}] (tp_dim {}), this run [{}] (tp_dim {})", ck.dir,
                          p->spec.name, fmt::join(it->second->shape, ", "), it->second->tp_dim,
                          fmt::join(dims_of(p->spec.shape), ", "), p->spec.tp_dim);
        break;
      }
      if (std::string e = model::check_splittable(p->spec, ck.tp); !e.empty()) {
        err = fmt::format("checkpoint {}: {}", ck.dir, e);
        break;
      }
      saved.erase(it);
    }
    if (err.empty() && !saved.empty())
      err = fmt::format("checkpoint {} holds parameter {} that this model does not have", ck.dir, saved.begin()->first);
  }
  if (err.empty()) err = resume_loader_position(ck, st, &v->pos);
  if (err = dist::first_message(world, err); !err.empty()) return err;
  if (world.rank() == 0)
    for (const std::string& w : warnings) spdlog::warn("{}", w);
  return "";
}
}  // namespace

std::string check_checkpoint(const std::string& step_dir, const TrainState& st, CheckpointInfo* out) {
  std::unique_ptr<dist::Communicator> world = dist::make_world(dist::Backend::mpi);
  Verified v;
  std::string err = verify_all(*world, step_dir, st, &v);
  if (err.empty() && out) *out = v.ck;
  return err;
}

std::string load_checkpoint(const std::string& step_dir, const TrainState& st, int64_t* step) {
  std::unique_ptr<dist::Communicator> world = dist::make_world(dist::Backend::mpi);
  Verified v;
  if (std::string err = verify_all(*world, step_dir, st, &v); !err.empty()) return err;
  const CheckpointInfo& ck = v.ck;
  const int tp = st.pg->dims.tp, r = st.pg->coord.tp;
  const bool adamw = st.opt->kind() == Optimizer::Kind::adamw;
  const int replicated_from = r % ck.tp;  // the saved file this rank takes TP-replicated tensors from

  // Host staging of this rank's shards, filled file by file (one saved file in memory at a time).
  struct Stage {
    Tensor w, m, v;
    int64_t filled = 0;
  };
  std::vector<Stage> stage(st.params.size());
  for (size_t i = 0; i < st.params.size(); ++i) {
    const Shape ls = st.params[i]->master.shape();
    stage[i].w = Tensor::empty(ls, DType::f32);
    if (adamw) {
      stage[i].m = Tensor::empty(ls, DType::f32);
      stage[i].v = Tensor::empty(ls, DType::f32);
    }
  }
  std::string err;
  for (int q = 0; q < ck.tp && err.empty(); ++q) {
    bool need = false;
    for (const model::Param* p : st.params)
      need = need || (p->spec.tp_dim < 0 ? q == replicated_from : overlaps(p->spec, tp, r, ck.tp, q));
    if (!need) continue;
    const std::string path = (fs::path(ck.dir) / shard_file_name(q, ck.tp)).string();
    io::SafetensorsFile f;
    if (err = io::read_safetensors(path, &f); !err.empty()) break;
    auto meta = [&](const char* k) { return f.metadata.count(k) ? f.metadata.at(k) : std::string("?"); };
    if (meta("format") != kShardFormat || meta("tp") != std::to_string(ck.tp) || meta("tp_rank") != std::to_string(q) ||
        meta("step") != std::to_string(ck.step)) {
      err = fmt::format("{}: shard metadata (format {}, step {}, tp {}, tp_rank {}) does not match metadata.json", path,
                        meta("format"), meta("step"), meta("tp"), meta("tp_rank"));
      break;
    }
    for (size_t i = 0; i < st.params.size() && err.empty(); ++i) {
      const model::ParamSpec& s = st.params[i]->spec;
      if (s.tp_dim < 0 ? q != replicated_from : !overlaps(s, tp, r, ck.tp, q)) continue;
      const Shape saved_shape = model::local_shape(s, ck.tp);
      std::vector<std::pair<std::string, Tensor*>> parts = {{s.name, &stage[i].w}};
      if (adamw) {
        parts.push_back({kM + s.name, &stage[i].m});
        parts.push_back({kV + s.name, &stage[i].v});
      }
      int64_t copied = 0;
      for (auto& [name, dst] : parts) {
        auto it = f.tensors.find(name);
        if (it == f.tensors.end() || it->second.dtype() != DType::f32 || it->second.shape() != saved_shape) {
          err = it == f.tensors.end()
                    ? fmt::format("{}: tensor {} is missing", path, name)
                    : fmt::format("{}: tensor {} is {} {}, expected f32 {}", path, name, dtype_name(it->second.dtype()),
                                  it->second.shape().str(), saved_shape.str());
          break;
        }
        copied = copy_overlap(*dst, tp, r, it->second, ck.tp, q, s);
      }
      stage[i].filled += copied;
    }
  }
  for (size_t i = 0; i < st.params.size() && err.empty(); ++i)
    if (stage[i].filled != st.params[i]->master.numel())
      err = fmt::format("checkpoint {}: {} of the {} elements of this rank's shard of {} were found in the saved files",
                        ck.dir, stage[i].filled, st.params[i]->master.numel(), st.params[i]->spec.name);
  if (err = dist::first_message(*world, err); !err.empty()) return err;

  // Nothing below can fail on input: the state changes only after everything was read.
  const auto& state = st.opt->state();
  for (size_t i = 0; i < st.params.size(); ++i) {
    model::Param& p = *st.params[i];
    ops::copy(p.master, stage[i].w, st.stream);  // host -> device from pageable memory: synchronous
    if (adamw) {
      ops::copy(state[i].m, stage[i].m, st.stream);
      ops::copy(state[i].v, stage[i].v, st.stream);
    }
    model::refresh_compute(p, st.stream);
  }
  st.opt->set_num_updates(ck.num_updates);
  st.guard->restore(ck.guard_skipped, ck.guard_in_a_row);
  err = st.loader->seek(v.pos);
  DT_CHECK(err.empty(), "checkpoint {}: loader seek to {} failed after verification: {}", ck.dir, v.pos.to_string(), err);
  *step = ck.step;
  return "";
}

// ---- trainer hooks -----------------------------------------------------------------------------

int64_t resume_if_asked(const TrainState& st) {
  const io::CheckpointConfig& c = st.cfg->checkpoint;
  // An unusable checkpoint.dir ends the run now, not at the first save after the steps are spent.
  if (!c.dir.empty())
    if (std::string e = prepare_checkpoint_dir(c.dir); !e.empty()) user_error(e);
  std::string dir = c.load;
  if (dir.empty()) {
    if (!c.resume || c.dir.empty()) return 0;
    std::unique_ptr<dist::Communicator> world = dist::make_world(dist::Backend::mpi);
    std::string note;
    std::string err = dist::world_rank() == 0 ? resume_step_dir(c.dir, &dir, &note) : std::string();
    if (err = dist::from_rank0(*world, err); !err.empty()) user_error(err);
    dir = dist::from_rank0(*world, dir);  // every rank follows rank 0's choice
    if (!note.empty()) spdlog::warn("{}", note);  // only rank 0 has one
    if (dir.empty()) return 0;
  }
  const auto t0 = std::chrono::steady_clock::now();
  int64_t step = 0;
  if (std::string e = load_checkpoint(dir, st, &step); !e.empty()) user_error(e);
  if (dist::world_rank() == 0) {
    std::printf("checkpoint: resumed from %s at step %lld (loader %s) in %.2f s\n", dir.c_str(),
                static_cast<long long>(step), st.loader->position().to_string().c_str(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (step >= st.cfg->train.steps)
      std::printf("checkpoint: nothing to train: resumed at step %lld and train.steps = %lld (train.steps counts "
                  "every step of the run, not the steps to add)\n",
                  static_cast<long long>(step), static_cast<long long>(st.cfg->train.steps));
    std::fflush(stdout);
  }
  return step;
}

void maybe_save(const TrainState& st, int64_t steps_done) {
  const io::CheckpointConfig& c = st.cfg->checkpoint;
  if (c.dir.empty()) return;
  const bool due = (c.interval > 0 && steps_done % c.interval == 0) || steps_done == st.cfg->train.steps;
  if (!due) return;
  const auto t0 = std::chrono::steady_clock::now();
  if (std::string e = save_checkpoint(st, steps_done); !e.empty()) user_error(e);
  if (dist::world_rank() == 0) {
    std::printf("checkpoint: saved %s in %.2f s\n", (fs::path(c.dir) / step_dir_name(steps_done)).c_str(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    std::fflush(stdout);
  }
}

}  // namespace dt::train
