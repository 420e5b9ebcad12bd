// One table describes every parameter (architecture principle 3). A ParamSpec gives the HF
// name, the GLOBAL shape, the init rule, how the tensor is split over TP, its dtype policy
// and whether its gradient is a partial sum over TP. Init, sharding, gradient reduction,
// the grad norm, checkpoints and HF import/export read this table.
//
// TP splits one dim (`tp_dim`) into `sections` (e.g. in_proj_qkv rows [q | k | v]); each
// section is split evenly over the TP ranks and a rank's shard is the concatenation of its
// pieces, section by section: the block layout [q_t | k_t | v_t] of thd-context-parallel.md 5.
// Every element is initialised from its GLOBAL index (Philox, stream = hash of the name),
// so weights never depend on the parallel layout.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "deltatron/core/tensor.h"

namespace dt::model {

enum class Init { zeros, ones, normal, uniform, log_uniform };
struct InitRule {
  Init kind = Init::normal;
  float a = 0.02f;  // normal: std; uniform / log_uniform: low
  float b = 0.f;    // uniform / log_uniform: high (log_uniform draws log(U(a, b)), for A_log)
  static InitRule normal(float std) { return {Init::normal, std, 0.f}; }
  static InitRule zeros() { return {Init::zeros, 0.f, 0.f}; }
  static InitRule ones() { return {Init::ones, 0.f, 0.f}; }
  static InitRule uniform(float lo, float hi) { return {Init::uniform, lo, hi}; }
  static InitRule log_uniform(float lo, float hi) { return {Init::log_uniform, lo, hi}; }
};

struct ParamSpec {
  std::string name;               // HF name, e.g. "model.layers.0.linear_attn.in_proj_qkv.weight"
  Shape shape;                    // global shape
  InitRule init;
  int tp_dim = -1;                // dim split over TP; -1: replicated on every TP rank
  std::vector<int64_t> sections;  // sizes along tp_dim, each split over TP; empty: one section
  bool keep_fp32 = false;         // compute in fp32 even under bf16 (A_log, dt_bias, norm weights)
  bool grad_sum_tp = false;       // grad is a partial sum over TP (replicated weight, sharded work)
};

// One contiguous run of a shard along tp_dim: rows [global_off, global_off + len) of the
// global tensor are rows [local_off, local_off + len) of the shard.
struct ShardPiece {
  int64_t global_off, local_off, len;
};
std::vector<ShardPiece> shard_pieces(const ParamSpec& s, int tp, int tp_rank);
Shape local_shape(const ParamSpec& s, int tp);
// "" when the spec can be split over tp, else a message naming the parameter and sizes.
std::string check_splittable(const ParamSpec& s, int tp);
uint64_t rng_stream_of(const std::string& name);  // FNV-1a of the name

struct Param {
  ParamSpec spec;
  Tensor master;   // fp32 local shard
  Tensor grad;     // fp32 local shard, accumulated (+=) by backward
  Tensor compute;  // bf16 copy for compute (CUDA, bf16 precision, !keep_fp32); else undefined
  // The weight as the layers read it.
  const TensorView& w() const { return compute.defined() ? compute.view() : master.view(); }
};

// Allocates master/grad (zeroed) on `dev` and initialises master from the seed. With
// compute_dtype bf16 and !keep_fp32, also allocates the compute copy and refreshes it.
Param make_param(const ParamSpec& s, int tp, int tp_rank, uint64_t seed, Device dev, DType compute_dtype,
                 Stream st = {});
// The same parameters (each initialised exactly as make_param does), whose master, grad and
// compute shards are consecutive row blocks of one allocation each, in the order of `specs`: a
// layer can then run one GEMM over their concatenation (rows_joined). Every spec must have a
// local shape [rows_i, C] with the same C and the same dtype policy (keep_fp32).
std::vector<Param> make_params_rows(const std::vector<ParamSpec>& specs, int tp, int tp_rank, uint64_t seed, Device dev,
                                    DType compute_dtype, Stream st = {});
// [sum rows_i, C] views of the weights as the layers read them (w()) and of the gradients of n
// params made by make_params_rows (consecutive rows of one allocation); anything else is a
// programming error (a check naming the first param).
struct JoinedRows {
  TensorView w, grad;
};
JoinedRows rows_joined(const Param* params, size_t n);
// compute = cast(master) (after init, load or an optimizer step).
void refresh_compute(Param& p, Stream st = {});
// local = this rank's shard of `global` (same dtype and device class; copies piece by piece).
void shard_from_global(const TensorView& local, const TensorView& global, const ParamSpec& s, int tp, int tp_rank,
                       Stream st = {});

}  // namespace dt::model
