// Completes parameter gradients after backward, as each ParamSpec says
// (thd-context-parallel.md 6): a TP all-reduce for grad_sum_tp parameters (replicated weights
// used on sharded heads or tokens), then a SUM all-reduce over dp x cp for every parameter
// (each dp/cp rank saw different tokens; CP-sliced parameters hold disjoint slices).
#pragma once
#include <vector>

#include "deltatron/dist/parallel.h"
#include "deltatron/model/param.h"

namespace dt::model {
void reduce_grads(const std::vector<Param*>& params, const dist::ProcessGroups& pg, Stream s = {});
// Its two parts, for overlapping the dp x cp sums with the rest of the backward on another
// stream: the TP sums (keep them on the compute stream, whose collectives share the TP
// communicator) must precede the dp x cp sums of the same parameters.
void reduce_grads_tp(const std::vector<Param*>& params, const dist::ProcessGroups& pg, Stream s = {});
void reduce_grads_dp_cp(const std::vector<Param*>& params, const dist::ProcessGroups& pg, Stream s = {});
}  // namespace dt::model
