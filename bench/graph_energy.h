// Each kernel of a captured step alone at its steady power: time, energy and average power per
// launch. At the power cap a step's time follows its energy (docs/perf.md v0.29.0, v0.37.0), so the
// kernels to shorten are the ones with the joules, which a one-kernel-at-a-time profile at cool
// clocks (ncu) does not rank.
//   For every kernel node of the captured graph: a clone of the graph with every other node
//   destroyed (so the kernel keeps its launch attributes: cluster shape, shared memory), except
//   the memset and memcpy nodes captured right before it (cuBLASLt's persistent GEMMs come with a
//   memset of their workspace; without it they ran in 1-10% of their time, perf.md v0.38.0), launched
//   back to back for warm_ms (the power settles) and then for >= min_ms with NVML's energy counter
//   read around it (EnergyMeter; the counter moves in steps of some ms, hence windows of a second).
//   The same for the clone with no node at all gives the base: what a launch costs with no kernel
//   in it, to be subtracted for short kernels; and the instantiated graph itself gives the step.
//   Disabling nodes in place (cudaGraphNodeSetEnabled) instead segfaulted inside cuGraphLaunch
//   (H100, CUDA 13.0), probably on the step's programmatic (PDL) edges.
//   Kernels that accumulate (+=) into a buffer grow it; nothing here reads the values. A kernel
//   that waits on a flag another kernel sets would wait forever: capture with such waits off
//   (gdn_layer sets DT_GDN_SERIAL_PDL=0). Kernels inside child-graph or conditional nodes are not
//   listed (`other_nodes` counts those nodes).
// Names come from the driver (cuFuncGetName / cuKernelGetName: also cuBLASLt's kernels), through
// cudart's entry-point query, so the benches need no libcuda link.
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cxxabi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "energy_meter.h"

namespace dt::bench {

struct KernelEnergy {
  std::string name;  // short_kernel_name of the driver's name, or "kernel <node index>" where it gives none
  int setup = 0;     // memset / memcpy nodes launched with it (those captured right before it)
  double ms = 0;     // per launch, back to back
  double mj = -1;    // per launch (-1: NVML unavailable)
  double watts = 0;  // average over the launches
};
struct GraphEnergy {
  std::vector<KernelEnergy> kernels;  // in the graph's node order (stream capture: launch order)
  KernelEnergy base;                  // an empty graph
  KernelEnergy whole;                 // the graph as captured, measured the same way
  int other_nodes = 0;                // child-graph and conditional nodes, not covered
  int setup_nodes = 0;                // memset and memcpy nodes
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
// "ns::(anonymous namespace)::gck::prep_kernel<__nv_bfloat16>(Params, ...)" -> "prep_kernel<__nv_bfloat16>":
// the demangled name without its arguments and scopes; names that do not demangle (cuBLASLt's) as given.
inline std::string short_kernel_name(const char* mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  if (status != 0 || !d) return mangled;
  std::string full(d), out;
  std::free(d);
  int depth = 0;  // <> and () nesting: a scope's "::" counts only at depth 0, the arguments end the name
  for (size_t i = 0; i < full.size(); ++i) {
    const char ch = full[i];
    if (depth == 0 && ch == '(' && full.compare(i, 21, "(anonymous namespace)") != 0) break;
    if (ch == '<' || ch == '(') ++depth;
    if (ch == '>' || ch == ')') --depth;
    out += ch;
    if (depth == 0 && ch == ':' && i > 0 && full[i - 1] == ':') out.clear();
  }
  return out.empty() ? full : out;
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
  return name ? short_kernel_name(name) : "kernel " + std::to_string(index);
}
}  // namespace detail

// g: the captured step; ge: its instantiation.
inline GraphEnergy graph_kernel_energy(cudaGraph_t g, cudaGraphExec_t ge, cudaStream_t st, const EnergyMeter& em,
                                       double min_ms = 1000.0, double warm_ms = 200.0) {
  size_t n = 0;
  DT_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  DT_CUDA_CHECK(cudaGraphGetNodes(g, nodes.data(), &n));
  GraphEnergy out;
  // kernels[k] with the memset / memcpy nodes right before it (node order is capture order; a
  // single-stream capture chains them by edges, which the clone keeps)
  std::vector<std::vector<cudaGraphNode_t>> kernels;
  std::vector<cudaGraphNode_t> setup;
  for (cudaGraphNode_t nd : nodes) {
    cudaGraphNodeType t;
    DT_CUDA_CHECK(cudaGraphNodeGetType(nd, &t));
    if (t == cudaGraphNodeTypeMemset || t == cudaGraphNodeTypeMemcpy) {
      setup.push_back(nd);
      ++out.setup_nodes;
      continue;
    }
    if (t == cudaGraphNodeTypeKernel) {
      setup.push_back(nd);
      kernels.push_back(setup);
    }
    if (t == cudaGraphNodeTypeGraph || t == cudaGraphNodeTypeConditional) ++out.other_nodes;
    setup.clear();
  }
  auto alone = [&](const std::vector<cudaGraphNode_t>& keep) {  // g with only `keep`, instantiated
    cudaGraph_t c;
    DT_CUDA_CHECK(cudaGraphClone(&c, g));
    std::vector<cudaGraphNode_t> kept(keep.size());
    for (size_t i = 0; i < keep.size(); ++i) DT_CUDA_CHECK(cudaGraphNodeFindInClone(&kept[i], keep[i], c));
    size_t m = 0;
    DT_CUDA_CHECK(cudaGraphGetNodes(c, nullptr, &m));
    std::vector<cudaGraphNode_t> cn(m);
    DT_CUDA_CHECK(cudaGraphGetNodes(c, cn.data(), &m));
    for (cudaGraphNode_t nd : cn)
      if (std::find(kept.begin(), kept.end(), nd) == kept.end()) DT_CUDA_CHECK(cudaGraphDestroyNode(nd));
    cudaGraphExec_t e;
    DT_CUDA_CHECK(cudaGraphInstantiate(&e, c, 0));
    DT_CUDA_CHECK(cudaGraphDestroy(c));
    return e;
  };
  cudaEvent_t e0, e1;
  DT_CUDA_CHECK(cudaEventCreate(&e0));
  DT_CUDA_CHECK(cudaEventCreate(&e1));
  auto run = [&](cudaGraphExec_t x, int reps) {  // ms per launch
    DT_CUDA_CHECK(cudaEventRecord(e0, st));
    for (int i = 0; i < reps; ++i) DT_CUDA_CHECK(cudaGraphLaunch(x, st));
    DT_CUDA_CHECK(cudaEventRecord(e1, st));
    DT_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    DT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    return double(ms) / reps;
  };
  auto measure = [&](cudaGraphExec_t x, KernelEnergy& r) {
    const double t1 = std::max(run(x, 5), 1e-3);
    run(x, std::max(1, int(warm_ms / t1)));
    const int reps = std::max(10, int(std::ceil(min_ms / t1)));
    const long long mj = em.measure([&] { r.ms = run(x, reps); });
    if (mj >= 0) {
      r.mj = double(mj) / reps;
      r.watts = r.mj / r.ms;  // mJ / ms
    }
  };
  auto measure_alone = [&](const std::vector<cudaGraphNode_t>& keep, KernelEnergy& r) {
    cudaGraphExec_t x = alone(keep);
    measure(x, r);
    DT_CUDA_CHECK(cudaGraphExecDestroy(x));
  };
  out.base.name = "(no kernel: an empty graph)";
  measure_alone({}, out.base);
  for (size_t k = 0; k < kernels.size(); ++k) {
    KernelEnergy r;
    r.name = detail::kernel_node_name(kernels[k].back(), k);
    r.setup = int(kernels[k].size()) - 1;
    measure_alone(kernels[k], r);
    out.kernels.push_back(r);
  }
  out.whole.name = "(the whole graph)";
  measure(ge, out.whole);
  DT_CUDA_CHECK(cudaEventDestroy(e0));
  DT_CUDA_CHECK(cudaEventDestroy(e1));
  return out;
}

}  // namespace dt::bench
