// The optimizer on the CUDA backend against the CPU reference, on fresh data each run: the
// AdamW / SGD update ops (f32, rel < 1e-6; the kernels follow the CPU's operation order, so
// they are expected to agree to the bit), the fused update with its compute copy and gradient
// reset (bit for bit, misaligned views and tails), the Optimizer with bf16 compute copies
// (fp32 master and state on the GPU), and the global grad norm.
#include <gtest/gtest.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "deltatron/ops/basic.h"
#include "deltatron/ops/optim.h"
#include "deltatron/train/optimizer.h"
#include "optim_test_util.h"
#include "test_util.h"

using namespace dt;
using dt::testing::close_rel;

namespace {
const Device kGpu = Device::cuda(0);

dist::ProcessGroups serial_groups() {
  dist::ProcessGroups pg;
  pg.dims = {1, 1, 1};
  return pg;
}
}  // namespace

TEST(OptimizerCuda, AdamWUpdateMatchesCpu) {
  for (int64_t n : {int64_t(1), int64_t(257), (int64_t(1) << 20) + 3}) {
    SCOPED_TRACE("n " + std::to_string(n));
    Tensor p = dt::testing::randn_host(Shape{n}), m = dt::testing::randn_host(Shape{n}, 1e-2f);
    Tensor v = dt::testing::rand_host(Shape{n}, 0.f, 1e-3f);
    Tensor dp = ops::to_device(p, kGpu), dm = ops::to_device(m, kGpu), dv = ops::to_device(v, kGpu);
    for (int64_t t = 1; t <= 4; ++t) {
      Tensor g = dt::testing::randn_host(Shape{n}, t % 2 ? 1.f : 1e-4f);
      Tensor dg = ops::to_device(g, kGpu);
      const ops::AdamWArgs a{1e-3f * float(t), 0.9f, 0.95f, 1e-8f, t % 2 ? 0.1f : 0.f, t, t == 3 ? 0.4f : 1.f};
      ops::adamw_update(p, m, v, g, a);
      ops::adamw_update(dp, dm, dv, dg, a);
    }
    EXPECT_TRUE(close_rel(dp, p, 1e-6)) << "p";
    EXPECT_TRUE(close_rel(dm, m, 1e-6)) << "m";
    EXPECT_TRUE(close_rel(dv, v, 1e-6)) << "v";
  }
}

TEST(OptimizerCuda, SgdUpdateMatchesCpu) {
  for (int64_t n : {int64_t(3), (int64_t(1) << 18) + 1}) {
    SCOPED_TRACE("n " + std::to_string(n));
    Tensor p = dt::testing::randn_host(Shape{n});
    Tensor dp = ops::to_device(p, kGpu);
    for (int t = 0; t < 3; ++t) {
      Tensor g = dt::testing::randn_host(Shape{n});
      Tensor dg = ops::to_device(g, kGpu);
      const ops::SgdArgs a{0.05f, t == 1 ? 0.f : 0.01f, t == 2 ? 0.5f : 1.f};
      ops::sgd_update(p, g, a);
      ops::sgd_update(dp, dg, a);
    }
    EXPECT_TRUE(close_rel(dp, p, 1e-6));
  }
}

// The fused update (compute copy + gradient reset in the same pass) on the GPU against the CPU
// reference, bit for bit, over the whole buffers: sizes with n % 4 tails, a single element and
// past a grid's worth of vectors (the grid-stride loop wraps); views at offset 0 (vector path),
// all at 1, 2 or 3 (a scalar head of 3, 2 or 1 up to the 16-byte boundary, then vectors), at
// mixed offsets (all scalar), and with only the compute copy off its boundary (1 or 2: scalar,
// as its 8-byte vector stores would be misaligned; 4: a 16-bit copy's vectors line up again).
TEST(OptimizerCuda, FusedUpdateMatchesCpuBits) {
  const std::array<int64_t, 5> offsets[] = {{0, 0, 0, 0, 0}, {1, 1, 1, 1, 1}, {2, 2, 2, 2, 2}, {3, 3, 3, 3, 3},
                                            {1, 0, 2, 3, 1}, {0, 0, 0, 0, 1}, {0, 0, 0, 0, 2}, {0, 0, 0, 0, 4}};
  for (dt::testing::UpdateKind k : {dt::testing::UpdateKind::adamw, dt::testing::UpdateKind::sgd})
    for (int64_t n : {int64_t(1), int64_t(3), int64_t(5), int64_t(1000003), int64_t(65536) * 256 * 4 + 7})
      for (const auto& off : offsets)
        for (DType cdt : {DType::bf16, DType::f16, DType::f32}) {
          if (n > 1000003 && (cdt != DType::bf16 || off[0] != 1)) continue;  // the big size once
          SCOPED_TRACE(fmt::format("{} n {} offsets {} {} {} {} {} compute {}", dt::testing::kind_name(k), n, off[0],
                                   off[1], off[2], off[3], off[4], dtype_name(cdt)));
          dt::testing::UpdateCase cpu = dt::testing::make_update_case(n, cdt, off);
          dt::testing::UpdateCase gpu = dt::testing::clone_to(cpu, kGpu);
          dt::testing::apply_update(k, cpu, true);
          dt::testing::apply_update(k, gpu, true);
          for (size_t j = 0; j < 5; ++j)
            EXPECT_TRUE(dt::testing::same_bits(gpu.buf[j], cpu.buf[j])) << "buffer of operand " << j;
        }
}

// adamw_update_multi with DT_OPTIM_MULTI=1 (batched launches of up to 48 items) against one
// adamw_update per item on the same bytes, bit for bit over whole buffers: 61 items (two launches
// and a partial third), sizes with n % 4 tails and chunk-edge sizes (4096 +- 1), every compute
// kind (none, f32, bf16, f16), weight decay and zero_grad on and off, and views off their 16-byte
// boundaries (the scalar path) between aligned ones. Then DT_OPTIM_MULTI=2 is refused.
TEST(OptimizerCuda, MultiTensorAdamWMatchesPerItemBits) {
  const char* old = std::getenv("DT_OPTIM_MULTI");
  const std::string saved = old ? old : "";
  const int64_t sizes[] = {1, 3, 4, 5, 1023, 4095, 4096, 4097, 12289, 100003, (int64_t(1) << 20) + 7};
  const DType kinds[] = {DType::f32, DType::bf16, DType::f16};
  std::vector<dt::testing::UpdateCase> per, multi;
  std::vector<ops::UpdateWrites> writes;
  std::vector<float> wds;
  for (int i = 0; i < 61; ++i) {
    const int64_t n = sizes[size_t(i) % std::size(sizes)];
    const int64_t o = i % 7 == 3 ? 1 : 0;  // every 7th item off its boundary: scalar path
    dt::testing::UpdateCase u = dt::testing::make_update_case(n, kinds[size_t(i) % 3], {o, o, o, o, o});
    per.push_back(dt::testing::clone_to(u, kGpu));
    multi.push_back(dt::testing::clone_to(u, kGpu));
    ops::UpdateWrites w;
    if (i % 4 != 1) w.compute = per.back().c();  // every 4th item without a compute copy
    w.zero_grad = i % 5 != 2;
    writes.push_back(w);
    wds.push_back(i % 3 == 0 ? 0.f : 0.1f);
  }
  const ops::AdamWArgs a{2e-3f, 0.9f, 0.95f, 1e-8f, 0.f, 3, 0.5f};
  for (size_t i = 0; i < per.size(); ++i) {
    ops::AdamWArgs ai = a;
    ai.weight_decay = wds[i];
    ops::adamw_update(per[i].p(), per[i].m(), per[i].v(), per[i].g(), ai, writes[i]);
  }
  std::vector<ops::AdamWItem> items;
  for (size_t i = 0; i < multi.size(); ++i) {
    ops::UpdateWrites w = writes[i];
    if (w.compute.data) w.compute = multi[i].c();
    items.push_back({multi[i].p(), multi[i].m(), multi[i].v(), multi[i].g(), w, wds[i]});
  }
  setenv("DT_OPTIM_MULTI", "1", 1);
  ops::adamw_update_multi(items, a);
  for (size_t i = 0; i < per.size(); ++i)
    for (size_t j = 0; j < 5; ++j)
      EXPECT_TRUE(dt::testing::same_bits(multi[i].buf[j], per[i].buf[j])) << "item " << i << " operand " << j;
  setenv("DT_OPTIM_MULTI", "2", 1);
  EXPECT_DEATH(ops::adamw_update_multi(items, a), "DT_OPTIM_MULTI='2' is not one of: 0 ");
  if (old) setenv("DT_OPTIM_MULTI", saved.c_str(), 1);
  else unsetenv("DT_OPTIM_MULTI");
}

TEST(OptimizerCuda, OptimizerWithBf16ComputeMatchesCpu) {
  const uint64_t seed = dt::testing::test_seed();
  std::vector<model::Param> cpu, gpu;
  for (const auto& s : dt::testing::small_model_specs()) {
    cpu.push_back(model::make_param(s, 1, 0, seed, Device::cpu(), DType::bf16));
    gpu.push_back(model::make_param(s, 1, 0, seed, kGpu, DType::bf16));
  }
  std::vector<model::Param*> pc, pgpu;
  for (size_t i = 0; i < cpu.size(); ++i) {
    pc.push_back(&cpu[i]);
    pgpu.push_back(&gpu[i]);
  }
  for (const char* kind : {"adamw", "sgd"}) {
    SCOPED_TRACE(kind);
    io::OptimizerConfig c;
    c.name = kind;
    c.lr = 2e-3;
    train::Optimizer oc(c, pc), og(c, pgpu);
    dist::ProcessGroups pg = serial_groups();
    for (int step = 0; step < 3; ++step) {
      for (size_t i = 0; i < cpu.size(); ++i) {
        Tensor g = dt::testing::randn_host(cpu[i].grad.shape(), 0.2f);
        ops::copy(cpu[i].grad, g);
        ops::copy(gpu[i].grad, g);
      }
      const double nc = train::global_grad_norm(pc, pg), ng = train::global_grad_norm(pgpu, pg);
      EXPECT_NEAR(ng, nc, 1e-6 * nc);
      oc.step(pc, float(c.lr), train::clip_coefficient(nc, 1.0));
      og.step(pgpu, float(c.lr), train::clip_coefficient(nc, 1.0));
    }
    for (size_t i = 0; i < cpu.size(); ++i) {
      SCOPED_TRACE(cpu[i].spec.name);
      ASSERT_EQ(gpu[i].master.device(), kGpu);
      EXPECT_TRUE(close_rel(gpu[i].master, cpu[i].master, 1e-6));
      if (oc.kind() == train::Optimizer::Kind::adamw) {
        EXPECT_EQ(og.state()[i].m.device(), kGpu);
        EXPECT_EQ(og.state()[i].m.dtype(), DType::f32);
        EXPECT_TRUE(close_rel(og.state()[i].m, oc.state()[i].m, 1e-6));
        EXPECT_TRUE(close_rel(og.state()[i].v, oc.state()[i].v, 1e-6));
      }
      ASSERT_EQ(gpu[i].compute.defined(), !cpu[i].spec.keep_fp32);
      if (gpu[i].compute.defined()) {  // the compute copy is bf16(master) of the updated weights
        Tensor want = Tensor::empty(gpu[i].master.shape(), DType::bf16);
        ops::copy(want, ops::to_host(gpu[i].master));
        Tensor got = ops::to_host(gpu[i].compute);
        EXPECT_EQ(std::memcmp(got.data(), want.data(), want.nbytes()), 0);
      }
      Tensor g = ops::to_host(gpu[i].grad);  // step() zeroed it in its pass
      for (int64_t j = 0; j < g.numel(); ++j) ASSERT_EQ(g.ptr<float>()[j], 0.f) << "grad[" << j << "]";
    }
  }
}
