#include "deltatron/model/grad_reduce.h"

namespace dt::model {

void reduce_grads(const std::vector<Param*>& params, const dist::ProcessGroups& pg, Stream s) {
  reduce_grads_tp(params, pg, s);
  reduce_grads_dp_cp(params, pg, s);
}

void reduce_grads_tp(const std::vector<Param*>& params, const dist::ProcessGroups& pg, Stream s) {
  if (pg.dims.tp == 1) return;
  for (Param* p : params)
    if (p->spec.grad_sum_tp) pg.tp->all_reduce(p->grad, dist::ReduceOp::sum, s);
}

void reduce_grads_dp_cp(const std::vector<Param*>& params, const dist::ProcessGroups& pg, Stream s) {
  if (pg.dims.dp * pg.dims.cp == 1) return;
  for (Param* p : params) pg.dp_cp->all_reduce(p->grad, dist::ReduceOp::sum, s);
}

}  // namespace dt::model
