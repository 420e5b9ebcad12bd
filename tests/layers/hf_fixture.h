// Shared by the HF fixture tests: runs a layer (tp = cp = 1, CPU fp32) on a fixture made by
// transformers (scripts/fixtures/): loads the weights by HF name (the part of each parameter
// name after `prefix`), runs the fixture's packed batch (cu_seqlens, x, dy) and compares y, dX
// and every parameter gradient with HF's (rel. L2 < tol).
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "deltatron/data/packed_seq.h"
#include "deltatron/io/safetensors.h"
#include "deltatron/ops/basic.h"
#include "test_util.h"

namespace dt::testing {

template <typename Layer>
void check_against_hf_fixture(Layer& layer, const io::SafetensorsFile& f, const std::string& prefix, int64_t hidden,
                              double tol) {
  for (model::Param& p : layer.params()) {
    const Tensor& w = f.at(p.spec.name.substr(prefix.size()));
    ASSERT_EQ(w.shape(), p.master.shape()) << p.spec.name;
    ops::copy(p.master, w);
  }
  const Tensor& cu64 = f.at("cu_seqlens");
  std::vector<int64_t> cu(cu64.ptr<int64_t>(), cu64.ptr<int64_t>() + cu64.numel());
  const int64_t T = cu.back();
  data::PackedSeqParams psp = data::PackedSeqParams::build({cu, cu, 1, T, 1, 1, 0});
  Tensor y = Tensor::empty(Shape{T, hidden}, DType::f32), dx = Tensor::empty(Shape{T, hidden}, DType::f32);
  poison(y);  // a row the layer never writes reads NaN, not old memory
  poison(dx);
  layer.forward(y, f.at("x"), psp);
  layer.backward(dx, f.at("dy"), psp);
  EXPECT_TRUE(close_rel(y, f.at("y"), tol)) << "y";
  EXPECT_TRUE(close_rel(dx, f.at("dx"), tol)) << "dx";
  for (model::Param& p : layer.params()) {
    const std::string hf = p.spec.name.substr(prefix.size());
    EXPECT_TRUE(close_rel(p.grad, f.at("grad." + hf), tol)) << hf;
  }
}

}  // namespace dt::testing
