// choose_attention_backend without a GPU (any build): the CPU always runs the native reference,
// whatever attention.backend says; an unknown value is an error that names the field and the
// value; auto and native are native everywhere.
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
  for (const char* v : {"auto", "native"}) {
    const ops::AttnBackendChoice c = ops::choose_attention_backend(v, Device::cuda(0));
    EXPECT_EQ(c.backend, ops::AttnBackend::native) << v;
    EXPECT_EQ(c.error, "") << v;
  }
  const ops::AttnBackendChoice bogus = ops::choose_attention_backend("bogus", Device::cuda(0));
  EXPECT_NE(bogus.error.find("attention.backend = 'bogus'"), std::string::npos) << bogus.error;
  EXPECT_NE(bogus.error.find("auto, native, cudnn, cudnn_fwd"), std::string::npos) << bogus.error;
}
