// Internal: the data-movement primitives behind include/deltatron/ops/cp_a2a.h, one CPU and
// one CUDA implementation with the same signatures. src/ops/cp_a2a.cpp checks the views,
// composes the primitives with the all-to-alls and routes by device. All outputs are
// overwritten; every output element is written exactly once (gathers only).
//
//   2-D views ([rows, cols]) have a unit inner stride and any row stride; the 3-D send /
//   receive buffers ([cp, rows, B]) are contiguous. Index maps are int32 views on the same
//   device, or views without data (TensorView{}) meaning the identity. A column map moves
//   runs of g columns: col(m) = map[m / g] * g + m % g (g divides B).
#pragma once
#include "deltatron/ops/cp_a2a.h"

#define DT_CP_A2A_DECLS                                                                                  \
  /* dst[i, :] = src[idx[i], :].  dst [R, W]; src [*, W]; idx [R] */                                     \
  void cp_gather_rows(const TensorView& dst, const TensorView& src, const TensorView& idx, Stream s);    \
  /* send[j, l, m] = src[l, col(j*B + m)].  send [cp, R, B]; src [R, cp*B]; col [cp*B/g] */             \
  void cp_pack_blocks(const TensorView& send, const TensorView& src, const TensorView& col, int64_t g,   \
                      Stream s);                                                                         \
  /* dst[l, c] = recv[k / B, l, k % B], k = inv(c).  dst [R, cp*B]; recv [cp, R, B]; inv [cp*B/g] */     \
  void cp_unpack_blocks(const TensorView& dst, const TensorView& recv, const TensorView& inv, int64_t g, \
                        Stream s);

namespace dt::ops::cpu {
DT_CP_A2A_DECLS
}
namespace dt::ops::cuda {
DT_CP_A2A_DECLS
}
