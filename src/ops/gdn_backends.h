// Internal: the CPU and CUDA implementations behind include/deltatron/ops/gdn.h. Both
// namespaces declare the same signatures; gdn_dispatch.cpp picks one by device.
#pragma once
#include "deltatron/ops/gdn.h"

#define DT_GDN_DECLS                                                                                              \
  void causal_conv1d_fwd(const TensorView& y, const TensorView& x, const TensorView& w, const TensorView& bias,    \
                         bool silu, const VarlenMeta& m, Stream s);                                              \
  void causal_conv1d_bwd(const TensorView& dx, const TensorView& dw, const TensorView& dbias, const TensorView& dy, \
                         const TensorView& x, const TensorView& w, const TensorView& bias, bool silu,            \
                         const VarlenMeta& m, Stream s);                                                         \
  void l2norm_fwd(const TensorView& y, const TensorView& rstd, const TensorView& x, float eps, Stream s);          \
  void l2norm_bwd(const TensorView& dx, const TensorView& dy, const TensorView& x, const TensorView& rstd,        \
                  Stream s);                                                                                     \
  void l2norm_bwd_y(const TensorView& dx, const TensorView& dy, const TensorView& y, const TensorView& rstd,      \
                    Stream s);                                                                                   \
  void causal_conv1d_l2norm_fwd(const ConvNormOut& out, const TensorView& x, const TensorView& w,                \
                                const TensorView& bias, bool silu, float eps, const VarlenMeta& m,               \
                                const GdnGateFwdViews* gate, Stream s);                                          \
  void causal_conv1d_l2norm_bwd(const TensorView& dx, const TensorView& dw, const TensorView& dbias,           \
                                const ConvNormGrad& grad, const TensorView& x, const TensorView& w,              \
                                const TensorView& bias, bool silu, const VarlenMeta& m,                          \
                                const GdnGateBwdViews* gate, Stream s);                                          \
  void gdn_gate_fwd(const TensorView& g, const TensorView& beta, const TensorView& a, const TensorView& b,        \
                    const TensorView& A_log, const TensorView& dt_bias, Stream s);                               \
  void gdn_gate_bwd(const TensorView& da, const TensorView& db, const TensorView& dA_log,                        \
                    const TensorView& ddt_bias, const TensorView& dg, const TensorView& dbeta, const TensorView& a, \
                    const TensorView& b, const TensorView& A_log, const TensorView& dt_bias, Stream s);          \
  void causal_conv1d_gate_fwd(const TensorView& y, const TensorView& x, const TensorView& w,                       \
                              const TensorView& bias, bool silu, const VarlenMeta& m, const GdnGateFwdViews& gate, \
                              Stream s);                                                                         \
  void causal_conv1d_gate_bwd(const TensorView& dx, const TensorView& dw, const TensorView& dbias,                \
                              const TensorView& dy, const TensorView& x, const TensorView& w,                   \
                              const TensorView& bias, bool silu, const VarlenMeta& m, const GdnGateBwdViews& gate, \
                              Stream s);                                                                         \
  void gdn_chunk_fwd(const TensorView& o, const TensorView& ht, const TensorView& q, const TensorView& k,         \
                     const TensorView& v, const TensorView& g, const TensorView& beta, const TensorView& h0,     \
                     const GdnArgs& args, const VarlenMeta& m, Stream s);                                        \
  void gdn_chunk_bwd(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dg,      \
                     const TensorView& dbeta, const TensorView& dh0, const TensorView& do_, const TensorView& dht, \
                     const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,         \
                     const TensorView& beta, const TensorView& h0, const GdnArgs& args, const VarlenMeta& m,     \
                     Stream s);                                                                                  \
  void gated_rmsnorm_fwd(const TensorView& y, const TensorView& rstd, const TensorView& o, const TensorView& z,   \
                         const TensorView& w, float eps, Stream s);                                              \
  void gated_rmsnorm_bwd(const TensorView& do_, const TensorView& dz, const TensorView& dw, const TensorView& dy, \
                         const TensorView& o, const TensorView& z, const TensorView& w, const TensorView& rstd,  \
                         Stream s);

namespace dt::ops::cpu {
DT_GDN_DECLS
}
namespace dt::ops::cuda {
DT_GDN_DECLS
}

namespace dt::ops::detail {
// causal_conv1d_l2norm_fwd as the three ops in turn through a [T, D] temporary on x's device
// (the CPU's form, and CUDA's when dk does not divide the conv's 256-channel blocks).
void conv_l2norm_composed(const ConvNormOut& out, const TensorView& x, const TensorView& w, const TensorView& bias,
                          bool silu, float eps, const VarlenMeta& m, const GdnGateFwdViews* gate, Stream s);
void conv_l2norm_bwd_composed(const TensorView& dx, const TensorView& dw, const TensorView& dbias,
                              const ConvNormGrad& grad, const TensorView& x, const TensorView& w,
                              const TensorView& bias, bool silu, const VarlenMeta& m, const GdnGateBwdViews* gate,
                              Stream s);
}  // namespace dt::ops::detail

#if DELTATRON_HAVE_CUDA
namespace dt::ops::cuda {
// How many times gdn_chunk_bwd launched wy_wg_kernel (DT_GDN_WY=wgmma, the default) in this process: tests
// check that the form they compare actually ran.
int64_t wy_wg_launches();
// The same for dqk_wg_kernel (DT_GDN_DQK=wgmma, the default).
int64_t dqk_wg_launches();
// The same for out_wg_kernel (gdn_chunk_fwd's out kernel, DT_GDN_OUT=wgmma, the default).
int64_t out_wg_launches();
}  // namespace dt::ops::cuda
#endif
