// Internal: the CPU and CUDA implementations behind include/deltatron/ops/layers_ops.h. Both
// namespaces declare the same signatures; layers_ops.cpp checks shapes and picks one by device.
#pragma once
#include "deltatron/ops/layers_ops.h"

#define DT_LAYERS_OPS_DECLS                                                                                    \
  void rmsnorm1p_fwd(const TensorView& y, const TensorView& rstd, const TensorView& x, const TensorView& w,    \
                     float eps, Stream s);                                                                     \
  void rmsnorm1p_bwd(const TensorView& dx, const TensorView& dw, const TensorView& dy, const TensorView& x,    \
                     const TensorView& w, const TensorView& rstd, Stream s);                                   \
  void swiglu_fwd(const TensorView& y, const TensorView& g, const TensorView& u, Stream s);                     \
  void swiglu_bwd(const TensorView& dg, const TensorView& du, const TensorView& dy, const TensorView& g,       \
                  const TensorView& u, Stream s);                                                              \
  void embedding_fwd(const TensorView& y, const TensorView& ids, const TensorView& w, int64_t vocab_begin,     \
                     Stream s);                                                                                \
  void embedding_bwd(const TensorView& dw, const TensorView& dy, const TensorView& ids, int64_t vocab_begin,   \
                     Stream s);                                                                                \
  void ce_stats(const TensorView& m, const TensorView& se, const TensorView& tl, const TensorView& logits,     \
                const TensorView& targets, int64_t vocab_begin, Stream s);                                     \
  void ce_rescale(const TensorView& se, const TensorView& m, const TensorView& m_global, Stream s);           \
  void ce_loss(const TensorView& loss, const TensorView& m, const TensorView& se, const TensorView& tl,        \
               const TensorView& targets, Stream s);                                                           \
  void ce_bwd(const TensorView& dlogits, const TensorView& logits, const TensorView& m, const TensorView& se,  \
              const TensorView& targets, int64_t vocab_begin, float scale, Stream s);

namespace dt::ops::cpu {
DT_LAYERS_OPS_DECLS
}
namespace dt::ops::cuda {
DT_LAYERS_OPS_DECLS
}
