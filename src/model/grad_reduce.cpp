#include "deltatron/model/grad_reduce.h"

namespace dt::model {

void reduce_grads(const std::vector<Param*>& params, const dist::ProcessGroups& pg, Stream s) {
  for (Param* p : params) {
    if (p->spec.grad_sum_tp && pg.dims.tp > 1) pg.tp->all_reduce(p->grad, dist::ReduceOp::sum, s);
    if (pg.dims.dp * pg.dims.cp > 1) pg.dp_cp->all_reduce(p->grad, dist::ReduceOp::sum, s);
  }
}

}  // namespace dt::model
