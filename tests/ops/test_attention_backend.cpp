// choose_attention_backend without a GPU (any build): the CPU always runs the native reference,
// whatever attention.backend says; an unknown value is an error that names the field and the
// value; native is native everywhere, auto on CUDA is native or cudnn_fwd, never an error.
// (cudnn and cudnn_fwd on a CUDA device are checked against the runtime in
// test_attention_cudnn_cuda.cpp.)
#include <gtest/gtest.h>

#include "deltatron/ops/attention.h"

using namespace dt;

TEST(AttentionBackendChoice, CpuIsNativeAndBogusIsAnError) {
  for (const char* v : {"auto", "native", "cudnn", "cudnn_fwd"}) {
    const ops::AttnBackendChoice c = ops::choose_attention_backend(v, Device::cpu());
    EXPECT_EQ(c.backend, ops::AttnBackend::native) << v;
    EXPECT_EQ(c.error, "") << v;
  }
  const ops::AttnBackendChoice native = ops::choose_attention_backend("native", Device::cuda(0));
  EXPECT_EQ(native.backend, ops::AttnBackend::native);
  EXPECT_EQ(native.error, "");
  // auto never fails: cuDNN's forward where the runtime allows it (test_attention_cudnn_cuda
  // checks which), else native.
  const ops::AttnBackendChoice a = ops::choose_attention_backend("auto", Device::cuda(0));
  EXPECT_TRUE(a.backend == ops::AttnBackend::native || a.backend == ops::AttnBackend::cudnn_fwd);
  EXPECT_EQ(a.error, "");
  const ops::AttnBackendChoice bogus = ops::choose_attention_backend("bogus", Device::cuda(0));
  EXPECT_NE(bogus.error.find("attention.backend = 'bogus'"), std::string::npos) << bogus.error;
  EXPECT_NE(bogus.error.find("auto, native, cudnn, cudnn_fwd"), std::string::npos) << bogus.error;
}
