// Placeholder until the cuDNN SDPA path is written: reports the path as unavailable, so
// choose_attention_backend refuses attention.backend=cudnn with a clear message and the
// native kernels run. (Being replaced by the cuDNN frontend implementation.)
#if DELTATRON_HAVE_CUDA
#include <cudnn.h>
#include <fmt/format.h>

#include "ops/attention_backends.h"

namespace dt::ops::cuda {

std::string cudnn_attention_unavailable() {
  const size_t v = cudnnGetVersion();
  return fmt::format("the cuDNN SDPA path is not built in this version (runtime cuDNN {}.{}.{})", v / 10000,
                     (v / 100) % 100, v % 100);
}
void attention_fwd_cudnn(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                         const TensorView&, const AttnVarlen&, float, Stream) {
  DT_FAIL("attention_fwd_cudnn: {}", cudnn_attention_unavailable());
}
void attention_bwd_cudnn(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                         const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                         const TensorView&, const AttnVarlen&, float, Stream) {
  DT_FAIL("attention_bwd_cudnn: {}", cudnn_attention_unavailable());
}

}  // namespace dt::ops::cuda
#endif  // DELTATRON_HAVE_CUDA
