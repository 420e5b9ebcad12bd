// Host allocator (64-byte aligned) and the per-device CUDA caching allocator.
//
// The caching allocator (CachingAllocator, src/core/caching_allocator.h) takes segments from
// a RawMemory (cudaMalloc/cudaFree/cudaDeviceSynchronize for a device; host memory in the
// CPU tests) and carves blocks from them. Policy:
// * A request is rounded to 512 B granules below 1 MiB and to 1 MiB granules from 1 MiB up
//   (one just under 1 MiB that rounds to 1 MiB is a large one); a block always has exactly
//   the rounded size (below), so allocated_bytes counts rounded sizes.
// * Two pools of free blocks, each ordered by (size, address): small blocks (< 1 MiB) come
//   from 2 MiB segments, large ones from segments of the rounded request rounded up to 2 MiB
//   (the usual granularity of cudaMalloc itself, so the rounding mostly makes usable what
//   the device would reserve anyway). A request takes the smallest free block of its pool
//   that fits, lowest address first, and is split off its front when the remainder is at
//   least 512 B (small pool) or 1 MiB (large pool); the remainder stays free. Since every
//   size in a pool is a multiple of that granule, a taken block is never larger than the
//   rounded request.
// * A freed block merges with its free address neighbours in the same segment (blocks never
//   span segments), so a segment whose blocks are all free is one free block again.
// * A new segment is allocated only when no free block fits. If the raw allocation fails,
//   the allocator synchronises (if any segment is entirely free), frees every such segment,
//   and retries once; if that fails too it aborts with the request, the bytes in use (and
//   peak), the bytes reserved and the device's free/total memory. release_cached() frees
//   entirely free segments only; blocks in use never move.
// A step that repeats the same allocation pattern settles: once a repeat makes no raw
// allocation, its end state equals its start, so no later repeat makes one. Usually that is
// the second run; best fit may place blocks differently in a repeat than in the first run
// and add a segment in the second or third (tests/core/test_allocator.cpp checks both).
// Reuse is stream-ordered on ONE stream: a block freed by the host may be handed out again
// (whole or as part of a merged block) while earlier work on the compute stream still reads
// it, which is safe only if every kernel touching it is on that same stream. Work on other
// streams (collectives) must use memory it owns for the duration, or synchronise first.
// One mutex guards each allocator; raw allocations happen under it.
#include "deltatron/core/allocator.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/caching_allocator.h"
#include "deltatron/core/check.h"
#if DELTATRON_HAVE_CUDA
#include "core/cuda_check.h"
#endif

namespace dt {
namespace detail {

size_t CachingAllocator::round_size(size_t bytes) {
  if (bytes < kLargeGranule) return std::max(kMinBlock, (bytes + kMinBlock - 1) & ~(kMinBlock - 1));
  return (bytes + kLargeGranule - 1) & ~(kLargeGranule - 1);
}

size_t CachingAllocator::segment_size(size_t rounded) {
  if (rounded < kLargeGranule) return kSegmentGranule;
  return (rounded + kSegmentGranule - 1) & ~(kSegmentGranule - 1);
}

CachingAllocator::CachingAllocator(std::unique_ptr<RawMemory> raw) : raw_(std::move(raw)) {}

CachingAllocator::~CachingAllocator() {
  if (!segments_.empty()) raw_->synchronize();
  for (auto& [base, head] : segments_) {
    raw_->raw_free(head->ptr);
    for (Block* b = head; b;) {
      Block* n = b->next;
      delete b;
      b = n;
    }
  }
}

void* CachingAllocator::allocate(size_t bytes) {
  const size_t want = round_size(bytes);
  const bool small = want < kLargeGranule;
  std::lock_guard<std::mutex> g(mu_);
  st_.num_allocs += 1;
  Pool& avail = pool(small);
  Block key{nullptr, want, small};  // orders before every free block of size >= want
  auto it = avail.lower_bound(&key);
  Block* b = nullptr;
  if (it != avail.end()) {
    b = *it;
    avail.erase(it);
  } else {
    b = new_segment_locked(want, small);
  }
  DT_CHECK(b->size >= want && !b->in_use, "{} allocator: block of {} bytes for a request of {}", raw_->name(),
           b->size, want);
  if (b->size - want >= (small ? kMinBlock : kLargeGranule)) {
    Block* rest = new Block{b->ptr + want, b->size - want, small};
    rest->prev = b;
    rest->next = b->next;
    if (b->next) b->next->prev = rest;
    b->next = rest;
    b->size = want;
    avail.insert(rest);
  }
  b->in_use = true;
  live_.emplace(b->ptr, b);
  st_.allocated_bytes += int64_t(b->size);
  st_.peak_bytes = std::max(st_.peak_bytes, st_.allocated_bytes);
  return b->ptr;
}

void CachingAllocator::deallocate(void* p, size_t bytes) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = live_.find(p);
  DT_CHECK(it != live_.end(), "{} allocator: freeing an unknown pointer {}", raw_->name(), p);
  Block* b = it->second;
  DT_CHECK(b->size == round_size(bytes), "{} allocator: freeing {} as {} bytes, but it was allocated as {}",
           raw_->name(), p, bytes, b->size);
  live_.erase(it);
  st_.allocated_bytes -= int64_t(b->size);
  b->in_use = false;
  Pool& avail = pool(b->small);
  if (Block* pr = b->prev; pr && !pr->in_use) {  // absorb b into its free predecessor
    avail.erase(pr);  // before its size (the set's key) changes
    pr->size += b->size;
    pr->next = b->next;
    if (b->next) b->next->prev = pr;
    delete b;
    b = pr;
  }
  if (Block* nx = b->next; nx && !nx->in_use) {  // absorb the free successor
    avail.erase(nx);
    b->size += nx->size;
    b->next = nx->next;
    if (nx->next) nx->next->prev = b;
    delete nx;
  }
  avail.insert(b);
}

CachingAllocator::Block* CachingAllocator::new_segment_locked(size_t rounded, bool small) {
  const size_t bytes = segment_size(rounded);
  void* p = raw_->raw_alloc(bytes);
  if (!p) {
    release_locked();  // cached segments no request fits may be what is missing
    p = raw_->raw_alloc(bytes);
  }
  if (!p)
    DT_FAIL("{} out of memory: asked for {} bytes (a {} byte segment); in use {} bytes (peak {}), reserved {} "
            "after freeing the cached segments; {}",
            raw_->name(), rounded, bytes, st_.allocated_bytes, st_.peak_bytes, st_.reserved_bytes,
            raw_->memory_info());
  Block* head = new Block{static_cast<char*>(p), bytes, small};
  segments_.emplace(head->ptr, head);
  st_.num_raw_allocs += 1;
  st_.reserved_bytes += int64_t(bytes);
  st_.peak_reserved_bytes = std::max(st_.peak_reserved_bytes, st_.reserved_bytes);
  return head;
}

int64_t CachingAllocator::release_locked() {
  std::vector<Block*> idle;  // segments that are one free block
  for (auto& [base, head] : segments_)
    if (!head->in_use && !head->next) idle.push_back(head);
  if (idle.empty()) return 0;
  raw_->synchronize();  // queued work on the compute stream may still read these blocks
  int64_t freed = 0;
  for (Block* head : idle) {
    pool(head->small).erase(head);
    segments_.erase(head->ptr);
    raw_->raw_free(head->ptr);
    st_.num_raw_frees += 1;
    freed += int64_t(head->size);
    delete head;
  }
  st_.reserved_bytes -= freed;
  return freed;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  return st_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> g(mu_);
  st_.peak_bytes = st_.allocated_bytes;
}

void CachingAllocator::release_cached() {
  std::lock_guard<std::mutex> g(mu_);
  release_locked();
}

std::vector<CachingAllocator::SegmentInfo> CachingAllocator::snapshot() const {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<SegmentInfo> out;
  size_t free_blocks = 0, live_blocks = 0;
  for (auto& [base, head] : segments_) {
    SegmentInfo s{uintptr_t(head->ptr), 0, head->small, {}};
    DT_CHECK(head->prev == nullptr, "{} allocator: segment head has a predecessor", raw_->name());
    for (const Block* b = head; b; b = b->next) {
      s.blocks.push_back({uintptr_t(b->ptr), b->size, b->in_use});
      s.bytes += b->size;
      if (b->in_use) {
        live_blocks += 1;
        auto it = live_.find(b->ptr);
        DT_CHECK(it != live_.end() && it->second == b, "{} allocator: block in use is not in the live map",
                 raw_->name());
      } else {
        free_blocks += 1;
        const Pool& avail = head->small ? small_free_ : large_free_;
        DT_CHECK(avail.count(const_cast<Block*>(b)) == 1, "{} allocator: free block missing from its pool",
                 raw_->name());
      }
      DT_CHECK(b->small == head->small, "{} allocator: block of the other pool in a segment", raw_->name());
    }
    out.push_back(std::move(s));
  }
  DT_CHECK(live_blocks == live_.size() && free_blocks == small_free_.size() + large_free_.size(),
           "{} allocator: {} live and {} free blocks in segments, but {} live and {} free in the maps",
           raw_->name(), live_blocks, free_blocks, live_.size(), small_free_.size() + large_free_.size());
  return out;
}

}  // namespace detail

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
    st_.peak_reserved_bytes = std::max(st_.peak_reserved_bytes, st_.reserved_bytes);
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
    st_.num_raw_frees += 1;
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
class CudaMemory final : public detail::RawMemory {
 public:
  explicit CudaMemory(int device) : device_(device) {}

  void* raw_alloc(size_t bytes) override {
    DeviceGuard dg(device_);
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // not sticky; clear it so later launch checks do not see it
      return nullptr;
    }
    DT_CUDA_CHECK(e);  // anything else is a real fault, not a full device
    return p;
  }
  void raw_free(void* p) override {
    DeviceGuard dg(device_);
    DT_CUDA_CHECK(cudaFree(p));
  }
  void synchronize() override {
    DeviceGuard dg(device_);
    DT_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::string name() const override { return fmt::format("cuda:{}", device_); }
  std::string memory_info() const override {
    DeviceGuard dg(device_);
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
      (void)cudaGetLastError();
      return "device free/total unknown";
    }
    return fmt::format("device free {} of {}", free_b, total_b);
  }

 private:
  struct DeviceGuard {
    int prev = 0;
    explicit DeviceGuard(int d) {
      DT_CUDA_CHECK(cudaGetDevice(&prev));
      if (prev != d) DT_CUDA_CHECK(cudaSetDevice(d));
    }
    ~DeviceGuard() { cudaSetDevice(prev); }
  };
  int device_;
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
  static auto* allocs = new std::vector<detail::CachingAllocator*>;  // leaked, as the host allocator
  std::lock_guard<std::mutex> g(mu);
  DT_CHECK(device >= 0 && device < 1024, "invalid CUDA device ordinal {}", device);
  if (size_t(device) >= allocs->size()) allocs->resize(device + 1, nullptr);
  if (!(*allocs)[device]) (*allocs)[device] = new detail::CachingAllocator(std::make_unique<CudaMemory>(device));
  return *(*allocs)[device];
#else
  DT_FAIL("cuda:{} memory requested, but deltatron was built without CUDA (DELTATRON_CUDA=OFF)", device);
#endif
}

Allocator& allocator_for(Device d) { return d.is_cpu() ? host_allocator() : cuda_allocator(d.index); }

}  // namespace dt
