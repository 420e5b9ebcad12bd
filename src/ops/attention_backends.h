// Internal: the backends behind include/deltatron/ops/attention.h, declared with one macro for
// ops::cpu (src/ops/cpu/attention.cpp) and ops::cuda (src/ops/cuda/attention.cu), so the two
// signatures cannot drift.
#pragma once
#include "deltatron/ops/attention.h"

#define DT_ATTENTION_OPS_DECLS                                                                                  \
  void rope_fwd(const TensorView& y, const TensorView& x, const TensorView& pos, int64_t rotary_dim,           \
                double theta, Stream s);                                                                       \
  void rope_bwd(const TensorView& dx, const TensorView& dy, const TensorView& pos, int64_t rotary_dim,         \
                double theta, Stream s);                                                                       \
  void attention_fwd(const TensorView& o, const TensorView& lse, const TensorView& q, const TensorView& k,     \
                     const TensorView& v, const AttnVarlen& meta, float scale, Stream s);                      \
  void attention_bwd(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& d_o,  \
                     const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,       \
                     const TensorView& lse, const AttnVarlen& meta, float scale, Stream s);                    \
  void sigmoid_gate_fwd(const TensorView& y, const TensorView& o, const TensorView& g, Stream s);              \
  void sigmoid_gate_bwd(const TensorView& d_o, const TensorView& dg, const TensorView& dy, const TensorView& o, \
                        const TensorView& g, Stream s);                                                        \
  void gather_rows(const TensorView& out, const TensorView& in, const TensorView& idx, Stream s);

namespace dt::ops::cpu {
DT_ATTENTION_OPS_DECLS
}
namespace dt::ops::cuda {
DT_ATTENTION_OPS_DECLS
// cuDNN SDPA with ragged offsets (src/ops/cuda/attention_cudnn.cpp); same contract as
// attention_fwd / attention_bwd above.
void attention_fwd_cudnn(const TensorView& o, const TensorView& lse, const TensorView& q, const TensorView& k,
                         const TensorView& v, const AttnVarlen& meta, float scale, Stream s);
void attention_bwd_cudnn(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& d_o,
                         const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                         const TensorView& lse, const AttnVarlen& meta, float scale, Stream s);
// "" when the cuDNN path can run here (built with cudnn_frontend, runtime cuDNN >= 9.19), else
// why not, naming the versions found.
std::string cudnn_attention_unavailable();
}
