// Each kernel of a captured step alone at its steady power: time, energy and average power per
// launch. At the power cap a step's time follows its energy (docs/perf.md v0.29.0, v0.37.0), so the
// kernels to shorten are the ones with the joules, which a one-kernel-at-a-time profile at cool
// clocks (ncu) does not rank.
//   For every kernel node of the instantiated graph: all other kernel, memcpy and memset nodes
//   disabled (cudaGraphNodeSetEnabled), the graph launched back to back for warm_ms (the power
//   settles) and then for >= min_ms with NVML's energy counter read around it (EnergyMeter; the
//   counter moves in steps of some ms, hence windows of a second). The same for the graph with
//   every node disabled gives the base: what a launch costs with no kernel in it, to be
//   subtracted for short kernels; and for the whole graph, the step itself. Kernels that accumulate (+=) into a buffer grow it; nothing
//   here reads the values. A kernel that waits on a flag another kernel sets would wait forever:
//   capture with such waits off (gdn_layer sets DT_GDN_SERIAL_PDL=0). Kernels inside child-graph
//   or conditional nodes are neither listed nor disabled (`other_nodes` counts those nodes).
// Names come from the driver (cuFuncGetName / cuKernelGetName: also cuBLASLt's kernels), through
// cudart's entry-point query, so the benches need no libcuda link.
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "energy_meter.h"

namespace dt::bench {

struct KernelEnergy {
  std::string name;  // the mangled name, or "kernel <node index>" where the driver gives none
  double ms = 0;     // per launch, back to back
  double mj = -1;    // per launch (-1: NVML unavailable)
  double watts = 0;  // average over the launches
};
struct GraphEnergy {
  std::vector<KernelEnergy> kernels;  // in the graph's node order (stream capture: launch order)
  KernelEnergy base;                  // the graph with every node disabled
  KernelEnergy whole;                 // the graph as captured, measured the same way
  int other_nodes = 0;                // child-graph and conditional nodes, not covered
};

namespace detail {
template <class P>
P driver_fn(const char* name, int version) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return reinterpret_cast<P>(fn);
}
inline std::string kernel_node_name(cudaGraphNode_t node, size_t index) {
  static const auto get = driver_fn<PFN_cuGraphKernelNodeGetParams_v12000>("cuGraphKernelNodeGetParams", 12000);
  static const auto fname = driver_fn<PFN_cuFuncGetName_v12030>("cuFuncGetName", 12030);
  static const auto kname = driver_fn<PFN_cuKernelGetName_v12030>("cuKernelGetName", 12030);
  CUDA_KERNEL_NODE_PARAMS_v2 p{};
  const char* name = nullptr;
  if (get && get(reinterpret_cast<CUgraphNode>(node), &p) == CUDA_SUCCESS) {
    if (p.func && fname) (void)fname(&name, p.func);
    else if (p.kern && kname) (void)kname(&name, p.kern);
  }
  return name ? std::string(name) : "kernel " + std::to_string(index);
}
}  // namespace detail

// g: the captured step; ge: its instantiation (left with every node enabled again).
inline GraphEnergy graph_kernel_energy(cudaGraph_t g, cudaGraphExec_t ge, cudaStream_t st, const EnergyMeter& em,
                                       double min_ms = 1000.0, double warm_ms = 200.0) {
  size_t n = 0;
  DT_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  DT_CUDA_CHECK(cudaGraphGetNodes(g, nodes.data(), &n));
  GraphEnergy out;
  std::vector<cudaGraphNode_t> work, kernels;  // the nodes that can be disabled; the kernels among them
  for (cudaGraphNode_t nd : nodes) {
    cudaGraphNodeType t;
    DT_CUDA_CHECK(cudaGraphNodeGetType(nd, &t));
    if (t == cudaGraphNodeTypeKernel || t == cudaGraphNodeTypeMemcpy || t == cudaGraphNodeTypeMemset) work.push_back(nd);
    if (t == cudaGraphNodeTypeKernel) kernels.push_back(nd);
    if (t == cudaGraphNodeTypeGraph || t == cudaGraphNodeTypeConditional) ++out.other_nodes;
  }
  auto enable_if = [&](auto on) {  // each disableable node enabled where on(node)
    for (cudaGraphNode_t nd : work) DT_CUDA_CHECK(cudaGraphNodeSetEnabled(ge, nd, on(nd)));
  };
  cudaEvent_t e0, e1;
  DT_CUDA_CHECK(cudaEventCreate(&e0));
  DT_CUDA_CHECK(cudaEventCreate(&e1));
  auto run = [&](int reps) {  // ms per launch
    DT_CUDA_CHECK(cudaEventRecord(e0, st));
    for (int i = 0; i < reps; ++i) DT_CUDA_CHECK(cudaGraphLaunch(ge, st));
    DT_CUDA_CHECK(cudaEventRecord(e1, st));
    DT_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    DT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    return double(ms) / reps;
  };
  auto measure = [&](KernelEnergy& r) {  // the graph as enabled now
    const double t1 = std::max(run(5), 1e-3);
    run(std::max(1, int(warm_ms / t1)));
    const int reps = std::max(10, int(std::ceil(min_ms / t1)));
    const long long mj = em.measure([&] { r.ms = run(reps); });
    if (mj >= 0) {
      r.mj = double(mj) / reps;
      r.watts = r.mj / r.ms;  // mJ / ms
    }
  };
  enable_if([](cudaGraphNode_t) { return false; });
  out.base.name = "(no kernel: every node disabled)";
  measure(out.base);
  for (size_t k = 0; k < kernels.size(); ++k) {
    enable_if([&](cudaGraphNode_t nd) { return nd == kernels[k]; });
    KernelEnergy r;
    r.name = detail::kernel_node_name(kernels[k], k);
    measure(r);
    out.kernels.push_back(r);
  }
  enable_if([](cudaGraphNode_t) { return true; });
  out.whole.name = "(the whole graph)";
  measure(out.whole);
  DT_CUDA_CHECK(cudaEventDestroy(e0));
  DT_CUDA_CHECK(cudaEventDestroy(e1));
  return out;
}

}  // namespace dt::bench
