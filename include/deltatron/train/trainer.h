// The training loop (issue 6; docs/training.md): config -> device and process groups -> dataset
// -> packed loader -> Qwen35Model -> optimizer; per step grad_accum micro-batches (forward,
// backward with 1 / global predicted-token count), gradient reduction per ParamSpec, global grad
// norm, non-finite guard, clip, optimizer step; a rank-0 log line and a JSONL record per step.
//
// Devices (train.device): cpu = fp32 throughout, MPI collectives; cuda = one GPU per rank
// (dist::select_cuda_device), NCCL groups (or, with DT_COMM_STAGED=1, ranks sharing GPUs and
// collectives through MPI: for tests), every kernel on one compute stream, activations in
// bf16 under train.precision=bf16 (fp32 master weights, gradients and optimizer state; the
// layers read bf16 compute copies that the optimizer refreshes); auto = cuda when every rank
// has a GPU of its own, else cpu. A step reads the device back twice at most: the loss and
// the grad norm, together at its end (the loss denominator and the token/FLOP counts are
// host numbers, all-reduced over MPI).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "deltatron/data/indexed_dataset.h"
#include "deltatron/data/packer.h"
#include "deltatron/dist/parallel.h"
#include "deltatron/io/config.h"
#include "deltatron/layers/common.h"
#include "deltatron/model/qwen35.h"
#include "deltatron/train/checkpoint.h"
#include "deltatron/train/flops.h"
#include "deltatron/train/optimizer.h"
#include "deltatron/train/schedule.h"

namespace dt::train {

// What one optimizer step did; the same on every rank.
struct StepResult {
  int64_t step = 0;       // 1-based number of the step just run
  double loss = 0;        // mean over the predicted tokens of the global batch
  double grad_norm = 0;   // global, before clipping
  double lr = 0;
  bool applied = true;    // false: skipped as non-finite (StepGuard)
  int64_t tokens = 0;     // real tokens of the global batch
  FlopCount flops;        // of the global batch (flops.h)
  double ms = 0;          // wall time of step(), from its start to the optimizer's launch
};

// One run: built from a validated config, then step() until config().train.steps.
// checkpoint.init_from_hf loads in the constructor, checkpoint.export_hf writes at the end of
// run_training (docs/hf.md); checkpoints (docs/checkpoints.md) resume after construction and
// save after each step through checkpoint_state() and set_next_step().
class Trainer {
 public:
  // Validates the config against the world size, picks the device, builds the process groups,
  // opens the dataset, the loader, the model (initialised from train.seed) and the optimizer.
  // Input errors end every rank through dt::user_error. Collective: every rank calls it.
  explicit Trainer(const io::Config& cfg);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One optimizer step over grad_accum micro-batches per DP rank. Collective.
  StepResult step();
  // Waits until the compute stream has finished every queued kernel (CUDA); no-op on the CPU.
  void synchronize();
  // Waits for the whole device, every stream (CUDA): around code that works on the default stream
  // (HF load / export). No-op on the CPU.
  void synchronize_device();
  // The startup banner (rank 0 prints it): layout, device and precision, batch arithmetic,
  // parameter count, the FLOP convention and the resolved config.
  std::string banner() const;

  const io::Config& config() const { return cfg_; }
  Device device() const { return ctx_.device; }
  DType act_dtype() const { return ctx_.act_dtype; }
  Stream stream() const { return ctx_.stream; }
  const layers::RunCtx& run_ctx() const { return ctx_; }
  const dist::ProcessGroups& groups() const { return pg_; }
  model::Qwen35Model& model() { return *net_; }
  const std::vector<model::Param*>& params() const { return params_; }
  Optimizer& optimizer() { return *opt_; }
  data::PackedLoader& loader() { return *loader_; }
  const StepGuard& guard() const { return guard_; }
  int64_t num_parameters() const { return n_params_; }
  double peak_tflops() const { return peak_tflops_; }  // for MFU; 0 on the CPU / unknown GPU
  // dtype of the checkpoint.init_from_hf weights (f32 without one): what checkpoint.export_hf writes.
  DType hf_dtype() const { return hf_dtype_; }
  // Views of the state a checkpoint saves and restores (train/checkpoint.h).
  TrainState checkpoint_state();
  // 0-based index of the next step (the LR schedule and the guard read it); a resume sets it.
  int64_t next_step() const { return step_; }
  void set_next_step(int64_t s) { step_ = s; }

 private:
  io::Config cfg_;
  std::string device_note_;  // how train.device was resolved (banner)
  dist::ParallelDims dims_;
  dist::ProcessGroups pg_;
  std::unique_ptr<dist::Communicator> host_dp_cp_;  // MPI, for host counts over dp x cp
  std::unique_ptr<dist::Communicator> host_world_;  // MPI, for the per-step metadata check
  std::vector<int> tp_cp_group_;                    // [world] each rank's TP x CP group (its dp coordinate)
  // train.overlap_grad_reduce: the layers' parameters and the rest (embedding, final norm, untied
  // head); on CUDA the dp x cp sums run on reduce_stream_, joined before the loss all-reduce.
  std::vector<std::vector<model::Param*>> layer_params_;
  std::vector<model::Param*> other_params_;
  // train.overlap_embedding_reduce (dp x cp > 1): the embedding weight, out of other_params_.
  std::vector<model::Param*> embed_params_;
  void* reduce_stream_ = nullptr;  // cudaStream_t
  void* ev_ready_ = nullptr;       // cudaEvent_t: compute -> reduce stream
  void* ev_done_ = nullptr;        // cudaEvent_t: reduce stream -> compute
  void reduce_async(const std::vector<model::Param*>& ps);  // TP sums here, dp x cp sums overlapped
  void join_reductions();                                    // the compute stream waits for them
  layers::RunCtx ctx_;
  data::PackerConfig pc_;
  std::unique_ptr<data::IndexedDataset> ds_;
  std::unique_ptr<data::PackedLoader> loader_;
  std::unique_ptr<model::Qwen35Model> net_;
  std::vector<model::Param*> params_;
  std::unique_ptr<Optimizer> opt_;
  std::unique_ptr<LrSchedule> schedule_;
  StepGuard guard_;
  int64_t n_params_ = 0;
  double peak_tflops_ = 0;
  DType hf_dtype_ = DType::f32;
  int64_t step_ = 0;
};

struct TrainResult {
  std::vector<double> losses;      // mean loss of every step run, in order
  std::vector<double> grad_norms;  // global grad norm of every step run
  int64_t skipped = 0;
};

// Runs the whole loop: Trainer, banner, train.steps steps with the rank-0 line every
// logging.log_interval steps and a JSONL record per step (logging.metrics_jsonl). Input errors
// (config, layout, device, data) end every rank through dt::user_error; the returned values
// are the same on every rank.
TrainResult run_training(const io::Config& cfg);

// The packer settings of a run: data.* and train.seed, with sp / cp / dp from the resolved layout.
data::PackerConfig packer_config(const io::Config& cfg, const dist::ParallelDims& dims);

// gdn.cp_comm -> the GDN layers' CP scheme. auto: all_gather when it moves fewer bytes per rank
// than all_to_all, i.e. when the TP-local in_proj + out_proj widths exceed 2 * cp * hidden
// (docs/parallelism.md); all_to_all otherwise (also on a tie: it keeps [T/cp, H] inputs, not [T, H]).
layers::GdnCpComm gdn_cp_comm(const std::string& setting, const io::ModelConfig& m, int tp, int cp);

}  // namespace dt::train
