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
}  // namespace dt::model
