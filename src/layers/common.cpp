// Layer helpers shared by the mixers and the MLP (include/deltatron/layers/common.h).
#include "deltatron/layers/common.h"

#include "deltatron/ops/basic.h"

namespace dt::layers {

Tensor kept_input(Tensor lent, const TensorView& x, int64_t rows, bool sp, const RunCtx& ctx) {
  if (!sp && lent.defined()) return lent;
  Tensor t = Tensor::empty(Shape{rows, x.shape[1]}, ctx.act_dtype, ctx.device);
  if (sp) ctx.pg->tp->all_gather(t, x, ctx.stream);
  else ops::copy(t, x, ctx.stream);
  return t;
}

}  // namespace dt::layers
