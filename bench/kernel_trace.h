// Kernel times of a real run, without ncu's serialisation: CUPTI's activity API records each
// kernel's (and memcpy's, memset's) start and end as the GPU runs it (concurrent-kernel records
// do not serialise launches), so the per-kernel sums can be set beside ncu's one-kernel-at-a-time
// times. The difference shows which kernels run slower inside the run (clocks under load, cache
// state left by the previous kernel) and how much of the run is gaps between kernels.
//   bench::KernelTrace tr;
//   if (tr.start()) { for (int i = 0; i < reps; ++i) work(); sync; tr.stop_and_print(reps, rank == 0); }
// Built where CMake finds CUPTI (CUDA::cupti: DT_HAVE_CUPTI); elsewhere start() says so and
// returns false.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#if DT_HAVE_CUPTI
#include <cupti.h>
#include <cxxabi.h>
#endif

namespace dt::bench {

class KernelTrace {
 public:
  // Starts recording every kernel of this process; false (with the reason on stderr) where CUPTI
  // is missing or refuses (e.g. a runtime without profiler access).
  bool start() {
#if DT_HAVE_CUPTI
    recs().clear();
    if (!ok(cuptiActivityRegisterCallbacks(&buffer_requested, &buffer_completed), "register callbacks")) return false;
    // Every kind enabled so far is disabled again if a later one fails (no record may arrive
    // after this object is gone).
    on_ = true;
    for (CUpti_ActivityKind k : kKinds)
      if (!ok(cuptiActivityEnable(k), "enable activity records")) {
        stop();
        return false;
      }
    return true;
#else
    std::fprintf(stderr, "kernel trace: built without CUPTI (CMake found no CUDA::cupti)\n");
    return false;
#endif
  }

  // Stops recording (the caller has synchronised the device) and, with print, prints per kernel
  // name in the order of first launch: launches, microseconds, and the gap before it (from the
  // last end of the kernels started before it), per repetition; then the sum of all kernels and
  // the span from the first start to the last end, per repetition. Every process
  // that started a trace stops it (no CUPTI callback may outlive the record store at exit).
  void stop_and_print(int reps, bool print = true) {
#if DT_HAVE_CUPTI
    if (!stop() || !print) return;
    const std::vector<Rec>& r = recs();
    if (r.empty()) {
      std::printf("kernel trace: no kernel records\n");
      return;
    }
    std::vector<std::string> order;
    struct Sum {
      int64_t launches = 0;
      double ns = 0, gap_ns = 0;  // time inside; time from the previous kernels' last end to its start
    };
    std::map<std::string, Sum> by_name;
    std::vector<const Rec*> by_start;
    for (const Rec& x : r) by_start.push_back(&x);
    std::sort(by_start.begin(), by_start.end(), [](const Rec* a, const Rec* b) { return a->start < b->start; });
    uint64_t first = by_start[0]->start, last = by_start[0]->end;
    double sum_ns = 0;
    for (const Rec* x : by_start) {
      auto [it, fresh] = by_name.try_emplace(x->name);
      if (fresh) order.push_back(x->name);
      it->second.launches += 1;
      it->second.ns += double(x->end - x->start);
      if (x != by_start[0]) it->second.gap_ns += double(int64_t(x->start) - int64_t(last));  // < 0: overlapped
      sum_ns += double(x->end - x->start);
      last = std::max(last, x->end);
    }
    std::printf("kernel trace (CUPTI, not serialised), per repetition of %d (gap: from the end of the kernels "
                "before to its start; < 0 overlapped):\n", reps);
    for (const std::string& n : order) {
      const Sum& t = by_name[n];
      std::printf("  %9.1f us  gap %7.1f us  x%-3lld %s\n", t.ns / reps / 1e3, t.gap_ns / reps / 1e3,
                  (long long)(t.launches / reps), n.c_str());
    }
    const double span_ns = double(last - first);
    std::printf("  kernels and copies %.3f ms | span %.3f ms | idle %.3f ms (per repetition)\n", sum_ns / reps / 1e6,
                span_ns / reps / 1e6, (span_ns - sum_ns) / reps / 1e6);
#else
    (void)reps, (void)print;
#endif
  }
  ~KernelTrace() {
#if DT_HAVE_CUPTI
    stop();
#endif
  }

 private:
  bool on_ = false;
#if DT_HAVE_CUPTI
  bool stop() {
    if (!on_) return false;
    ok(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "flush");
    for (CUpti_ActivityKind k : kKinds) cuptiActivityDisable(k);  // also kinds never enabled: harmless
    on_ = false;
    return true;
  }
  static constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                                   CUPTI_ACTIVITY_KIND_MEMSET};
  struct Rec {
    std::string name;
    uint64_t start, end;  // ns
  };
  static std::vector<Rec>& recs() {
    static std::vector<Rec> v;
    return v;
  }
  static bool ok(CUptiResult r, const char* what) {
    if (r == CUPTI_SUCCESS) return true;
    const char* msg = nullptr;
    cuptiGetResultString(r, &msg);
    std::fprintf(stderr, "kernel trace: CUPTI %s failed: %s\n", what, msg ? msg : "?");
    return false;
  }
  // "dt::(anonymous namespace)::gck::dqk_kernel<__nv_bfloat16>(...)" -> "dqk_kernel<__nv_bfloat16>";
  // names that are not mangled C++ (cuBLASLt's nvjet kernels) stay as they are.
  static std::string short_name(const char* mangled) {
    if (!mangled) return "?";
    int status = 0;
    char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
    std::string s = status == 0 && d ? d : mangled;
    std::free(d);
    for (size_t p; (p = s.find("(anonymous namespace)")) != std::string::npos;) s.replace(p, 21, "anon");
    if (s.rfind("void ", 0) == 0) s = s.substr(5);
    int depth = 0;  // outside template brackets: the last "::" before the parameter list
    size_t cut = 0, end = s.size();
    for (size_t i = 0; i < s.size() && end == s.size(); ++i) {
      if (s[i] == '<') ++depth;
      else if (s[i] == '>') --depth;
      else if (depth == 0 && s[i] == '(') end = i;
      else if (depth == 0 && s[i] == ':' && i + 1 < s.size() && s[i + 1] == ':') cut = i + 2;
    }
    return s.substr(cut, end - cut);
  }
  static void CUPTIAPI buffer_requested(uint8_t** buf, size_t* size, size_t* max_records) {
    *size = size_t(8) << 20;
    *buf = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
    *max_records = 0;
  }
  static void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buf, size_t, size_t valid) {
    CUpti_Activity* a = nullptr;
    while (cuptiActivityGetNextRecord(buf, valid, &a) == CUPTI_SUCCESS)
      if (a->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(a);
        recs().push_back({short_name(k->name), k->start, k->end});
      } else if (a->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {  // copies run between kernels too
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(a);
        const char* kinds[] = {"?", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "DtoD", "HtoH", "PtoP"};
        recs().push_back({std::string("memcpy ") + (m->copyKind <= 10 ? kinds[m->copyKind] : "?") + " " +
                              std::to_string(m->bytes) + " B",
                          m->start, m->end});
      } else if (a->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(a);
        recs().push_back({"memset " + std::to_string(m->bytes) + " B", m->start, m->end});
      }
    std::free(buf);
  }
#endif
};

}  // namespace dt::bench
