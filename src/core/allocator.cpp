// Host allocator (64-byte aligned) and the per-device CUDA caching allocator.
//
// The caching allocator keeps freed blocks in a size-ordered free list and hands out the
// smallest one that fits a request with at most 1/8 (or 1 MiB) to spare (no splitting: a
// looser fit, such as any block up to twice the request, kept gigabytes of slack in a 0.8B
// model's step), so
// a training step that repeats the same allocation pattern performs no cudaMalloc after
// the first step (num_raw_allocs stays flat; a test checks it). Reuse is stream-ordered on
// ONE stream: a block freed by the host may be handed out again while earlier work on the
// compute stream still reads it, which is safe only if every kernel touching it is on that
// same stream. Work on other streams (collectives) must use memory it owns for the
// duration, or synchronise first.
#include "deltatron/core/allocator.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "deltatron/core/check.h"
#if DELTATRON_HAVE_CUDA
#include "core/cuda_check.h"
#endif

namespace dt {
namespace {

class HostAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    size_t rounded = (bytes + 63) & ~size_t(63);
    void* p = std::aligned_alloc(64, rounded);
    DT_CHECK(p != nullptr, "host allocation of {} bytes failed", bytes);
    std::lock_guard<std::mutex> g(mu_);
    st_.allocated_bytes += int64_t(rounded);
    st_.reserved_bytes += int64_t(rounded);
    st_.peak_bytes = std::max(st_.peak_bytes, st_.allocated_bytes);
    st_.num_raw_allocs += 1;
    st_.num_allocs += 1;
    return p;
  }
  void deallocate(void* p, size_t bytes) override {
    size_t rounded = (bytes + 63) & ~size_t(63);
    std::free(p);
    std::lock_guard<std::mutex> g(mu_);
    st_.allocated_bytes -= int64_t(rounded);
    st_.reserved_bytes -= int64_t(rounded);
  }
  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> g(mu_);
    return st_;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> g(mu_);
    st_.peak_bytes = st_.allocated_bytes;
  }

 private:
  mutable std::mutex mu_;
  AllocatorStats st_;
};

#if DELTATRON_HAVE_CUDA
class CudaCachingAllocator final : public Allocator {
 public:
  explicit CudaCachingAllocator(int device) : device_(device) {}

  static size_t round(size_t bytes) {
    if (bytes < (size_t(1) << 20)) return (bytes + 511) & ~size_t(511);  // 512 B granules below 1 MiB
    return (bytes + (size_t(1) << 20) - 1) & ~((size_t(1) << 20) - 1);     // 1 MiB granules above
  }

  void* allocate(size_t bytes) override {
    size_t want = round(bytes);
    std::lock_guard<std::mutex> g(mu_);
    st_.num_allocs += 1;
    void* p = nullptr;
    size_t got = want;
    auto it = free_.lower_bound(want);
    if (it != free_.end() && it->first - want <= std::max(want / 8, size_t(1) << 20)) {
      got = it->first;
      p = it->second;
      free_.erase(it);
    } else {
      p = raw_alloc(want);
    }
    sizes_[p] = got;
    st_.allocated_bytes += int64_t(got);
    st_.peak_bytes = std::max(st_.peak_bytes, st_.allocated_bytes);
    return p;
  }

  void deallocate(void* p, size_t) override {
    std::lock_guard<std::mutex> g(mu_);
    auto it = sizes_.find(p);
    DT_CHECK(it != sizes_.end(), "cuda:{} allocator: freeing an unknown pointer {}", device_, p);
    st_.allocated_bytes -= int64_t(it->second);
    free_.emplace(it->second, p);
    sizes_.erase(it);
  }

  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> g(mu_);
    return st_;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> g(mu_);
    st_.peak_bytes = st_.allocated_bytes;
  }
  void release_cached() override {
    std::lock_guard<std::mutex> g(mu_);
    release_locked();
  }

 private:
  void release_locked() {
    if (free_.empty()) return;
    DeviceGuard dg(device_);
    DT_CUDA_CHECK(cudaDeviceSynchronize());  // blocks may still be read by queued work
    for (auto& [size, p] : free_) {
      DT_CUDA_CHECK(cudaFree(p));
      st_.reserved_bytes -= int64_t(size);
    }
    free_.clear();
  }

  void* raw_alloc(size_t bytes) {
    DeviceGuard dg(device_);
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      release_locked();
      e = cudaMalloc(&p, bytes);
    }
    if (e != cudaSuccess) {
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      DT_FAIL("cuda:{} out of memory: asked for {} bytes; in use {} bytes (peak {}), reserved {}; device free {} of {}",
              device_, bytes, st_.allocated_bytes, st_.peak_bytes, st_.reserved_bytes, free_b, total_b);
    }
    st_.num_raw_allocs += 1;
    st_.reserved_bytes += int64_t(bytes);
    st_.peak_reserved_bytes = std::max(st_.peak_reserved_bytes, st_.reserved_bytes);
    return p;
  }

  struct DeviceGuard {
    int prev = 0;
    explicit DeviceGuard(int d) {
      DT_CUDA_CHECK(cudaGetDevice(&prev));
      if (prev != d) DT_CUDA_CHECK(cudaSetDevice(d));
    }
    ~DeviceGuard() { cudaSetDevice(prev); }
  };

  int device_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;
  std::map<void*, size_t> sizes_;
  AllocatorStats st_;
};
#endif

}  // namespace

Allocator& host_allocator() {
  static HostAllocator* a = new HostAllocator;  // leaked: tensors may outlive static destructors
  return *a;
}

Allocator& cuda_allocator(int device) {
#if DELTATRON_HAVE_CUDA
  static std::mutex mu;
  static auto* allocs = new std::vector<CudaCachingAllocator*>;  // leaked, as the host allocator
  std::lock_guard<std::mutex> g(mu);
  DT_CHECK(device >= 0 && device < 1024, "invalid CUDA device ordinal {}", device);
  if (size_t(device) >= allocs->size()) allocs->resize(device + 1, nullptr);
  if (!(*allocs)[device]) (*allocs)[device] = new CudaCachingAllocator(device);
  return *(*allocs)[device];
#else
  DT_FAIL("cuda:{} memory requested, but deltatron was built without CUDA (DELTATRON_CUDA=OFF)", device);
#endif
}

Allocator& allocator_for(Device d) { return d.is_cpu() ? host_allocator() : cuda_allocator(d.index); }

}  // namespace dt
