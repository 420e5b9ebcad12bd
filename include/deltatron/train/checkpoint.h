// Crash-safe checkpoints with bit-exact resume and resharding at load (issue 7;
// docs/checkpoints.md has the layout, the protocol and the rules).
//
//   checkpoint.dir/
//     latest                          "step_0000040\n": the newest complete checkpoint
//     step_0000040/
//       shard_tp00-of-02.safetensors  tp rank 0 of (dp 0, cp 0): fp32 master shards (HF names) and
//       shard_tp01-of-02.safetensors  AdamW state ("optim.m." / "optim.v." + name)
//       metadata.json                 config, layout, step, loader positions, seed, optimizer
//                                     update count, step guard counters, parameter table,
//                                     file list with sizes and SHA-256
//     step_0000050.tmp/               a save in progress (or a crashed one): never read
//
// Parameters are replicated over dp and cp and split over tp, so the tp shards of (dp 0, cp 0)
// are the distinct ones: tp files per checkpoint. Save: every file is written into the .tmp
// sibling and fsynced, then metadata.json (written last), the directory is fsynced and renamed to
// step_NNNNNNN, and `latest` is replaced atomically (tmp file, fsync, rename, fsync of the
// directory). A directory named step_NNNNNNN is therefore always complete; `latest` is what
// resume reads. Load: metadata.json, then every file's size and SHA-256 (split over the ranks),
// the model keys that decide shapes, then each rank reads the global pieces of its shards
// (model::shard_pieces) from the saved tp files, whatever the saved (tp, cp, dp) was.
// The collective functions return "" or one error that is the same on every rank (the
// callers end the run with dt::user_error, which rank 0 prints and every rank exits 1).
// Every rank must see checkpoint.dir (one node, or a shared file system).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "deltatron/core/dtype.h"
#include "deltatron/data/indexed_dataset.h"
#include "deltatron/data/packer.h"
#include "deltatron/dist/parallel.h"
#include "deltatron/io/config.h"
#include "deltatron/model/param.h"
#include "deltatron/train/optimizer.h"

namespace dt::train {

// What a checkpoint saves and restores: views of the trainer's objects (it owns them).
struct TrainState {
  const io::Config* cfg = nullptr;  // the run's resolved config
  const dist::ProcessGroups* pg = nullptr;
  std::vector<model::Param*> params;  // Qwen35Model::params() order
  Optimizer* opt = nullptr;
  StepGuard* guard = nullptr;
  data::PackedLoader* loader = nullptr;
  const data::IndexedDataset* ds = nullptr;
  data::PackerConfig packer;  // the loader's config
  Stream stream;              // where the parameters and optimizer state are updated
};

std::string step_dir_name(int64_t step);      // "step_0000040"
std::string tmp_dir_name(int64_t step);       // "step_0000040.tmp"
std::string shard_file_name(int tp_rank, int tp);  // "shard_tp01-of-02.safetensors"

// metadata.json of one checkpoint, parsed.
struct CheckpointInfo {
  struct File {
    std::string name;  // relative to the step directory
    uint64_t bytes = 0;
    std::string sha256;  // 64 hex digits
  };
  struct ParamEntry {
    std::string name;
    std::vector<int64_t> shape;  // global
    int tp_dim = -1;
  };
  std::string dir;  // the step directory
  int64_t step = 0;  // optimizer steps done
  io::Config config;  // the saved run's resolved config
  int tp = 1, cp = 1, dp = 1;
  bool sp = false;
  uint64_t seed = 0;
  std::string optimizer;  // adamw | sgd
  int64_t num_updates = 0;
  int64_t guard_skipped = 0, guard_in_a_row = 0;
  std::vector<data::LoaderPosition> loader;  // one per dp rank
  std::vector<ParamEntry> params;
  std::vector<File> files;
};

// Reads and checks metadata.json of `step_dir` (no MPI). "" on success.
std::string read_checkpoint_info(const std::string& step_dir, CheckpointInfo* out);
// Checks one listed file: present, its size, its SHA-256. "" when intact, else the error
// naming the file (and the expected and actual digest on a mismatch).
std::string verify_checkpoint_file(const CheckpointInfo& ck, const CheckpointInfo::File& f);
// "" when the model keys that decide parameter shapes agree, else the first differing key with
// both values. `warnings` (optional) gets the other model keys that differ (the run's value is used).
std::string check_model_compatible(const io::Config& saved, const io::Config& run,
                                   std::vector<std::string>* warnings = nullptr);
// The step directory `ckpt_dir/latest` names: "" on success with *step_dir set, or set to ""
// when there is no `latest` (nothing saved yet, or a crash in the first save: resume_step_dir);
// an error when it is unreadable or names no complete checkpoint.
std::string read_latest(const std::string& ckpt_dir, std::string* step_dir);
// What checkpoint.resume takes (no MPI; rank 0 calls it): what `latest` names; without `latest`,
// the newest complete step directory (its metadata.json read), with *note set to the warning
// that says so; *step_dir "" when nothing was saved. An error as read_latest's, or naming the
// newest step directory when its metadata.json does not read (no silent fallback to an older one).
std::string resume_step_dir(const std::string& ckpt_dir, std::string* step_dir, std::string* note);
// Collective: rank 0 creates `ckpt_dir` if needed and creates and removes a file in it, so an
// unusable checkpoint.dir is an error before the first step, not at the first save.
std::string prepare_checkpoint_dir(const std::string& ckpt_dir);
// Step directories under ckpt_dir that are complete (name step_NNNNNNN with a metadata.json),
// sorted by step. Temporary siblings are never listed.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& ckpt_dir);

// Collective over every rank: writes checkpoint.dir/step_NNNNNNN after `step` optimizer steps,
// points `latest` at it and applies checkpoint.keep_last.
std::string save_checkpoint(const TrainState& st, int64_t step);
// Collective: verifies `step_dir` (metadata, every file's size and SHA-256, model shape keys,
// optimizer kind), loads this rank's parameter and optimizer shards from the saved tp files
// (resharding when the layout differs), restores the update count, the step guard and the
// loader position, and sets *step to the saved step.
std::string load_checkpoint(const std::string& step_dir, const TrainState& st, int64_t* step);
// Collective: verification only (what load_checkpoint checks before touching any state).
std::string check_checkpoint(const std::string& step_dir, const TrainState& st, CheckpointInfo* out);

// The loader position of this run from the saved one. Same layout: the saved position. Another
// layout: the same place in the global micro-batch stream of the saved epoch (the saved dp
// ranks consumed `step * dp_saved` global micro-batches; this run continues at that index,
// which must be a multiple of its dp), provided the epoch packs into the same global
// micro-batches under both layouts. "" on success.
std::string resume_loader_position(const CheckpointInfo& ck, const TrainState& st, data::LoaderPosition* out);

// Trainer hooks (every error ends the run on every rank through dt::user_error):
// prepare_checkpoint_dir when checkpoint.dir is set; then checkpoint.load, else checkpoint.resume
// with resume_step_dir (checkpoint.dir/latest, or the newest step directory when `latest` is
// missing), else nothing. Returns the first step to run (0 when starting fresh).
int64_t resume_if_asked(const TrainState& st);
// After `steps_done` optimizer steps: saves when checkpoint.dir is set and steps_done is a
// multiple of checkpoint.interval (> 0) or the last step of the run.
void maybe_save(const TrainState& st, int64_t steps_done);

}  // namespace dt::train
