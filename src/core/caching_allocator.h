// Internal: the splitting, coalescing caching allocator, separated from the memory it takes
// segments from (RawMemory), so that the CUDA allocator backs it with cudaMalloc/cudaFree and
// the CPU tests with host memory. Policy and stream semantics: src/core/allocator.cpp.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "deltatron/core/allocator.h"

namespace dt::detail {

// Where segments come from.
class RawMemory {
 public:
  virtual ~RawMemory() = default;
  virtual void* raw_alloc(size_t bytes) = 0;  // nullptr when the memory is exhausted
  virtual void raw_free(void* p) = 0;
  virtual void synchronize() = 0;             // waits for queued work that may still touch blocks
  virtual std::string name() const = 0;       // "cuda:0": prefixes messages
  virtual std::string memory_info() const = 0;  // appended to the out-of-memory message
};

class CachingAllocator final : public Allocator {
 public:
  static constexpr size_t kMinBlock = 512;             // small-pool granule
  static constexpr size_t kLargeGranule = 1 << 20;     // large-pool granule; requests below go small
  static constexpr size_t kSegmentGranule = 2 << 20;   // small segments; large ones round up to it

  static size_t round_size(size_t bytes);            // the block size a request gets
  static size_t segment_size(size_t rounded_bytes);  // the raw allocation a new segment takes

  explicit CachingAllocator(std::unique_ptr<RawMemory> raw);
  // Synchronises and frees every segment; blocks still in use dangle. The process-wide CUDA
  // allocators are never destroyed (tensors may outlive static destructors).
  ~CachingAllocator() override;

  void* allocate(size_t bytes) override;
  void deallocate(void* p, size_t bytes) override;
  AllocatorStats stats() const override;
  void reset_peak() override;
  void release_cached() override;  // frees entirely free segments only

  // For tests: every segment by base address with its blocks in address order. Checks that
  // the free lists hold exactly the free blocks (DT_CHECK).
  struct BlockInfo {
    uintptr_t addr;
    size_t bytes;
    bool in_use;
  };
  struct SegmentInfo {
    uintptr_t base;
    size_t bytes;
    bool small;
    std::vector<BlockInfo> blocks;
  };
  std::vector<SegmentInfo> snapshot() const;

 private:
  struct Block {
    char* ptr;
    size_t size;
    bool small;            // pool (and segment kind) it belongs to
    bool in_use = false;
    Block* prev = nullptr;  // address neighbours inside the same segment
    Block* next = nullptr;
  };
  struct BySizeThenAddr {
    bool operator()(const Block* a, const Block* b) const {
      if (a->size != b->size) return a->size < b->size;
      return std::less<const char*>()(a->ptr, b->ptr);
    }
  };
  using Pool = std::set<Block*, BySizeThenAddr>;

  Pool& pool(bool small) { return small ? small_free_ : large_free_; }
  Block* new_segment_locked(size_t rounded, bool small);
  int64_t release_locked();  // frees entirely free segments; returns their bytes

  std::unique_ptr<RawMemory> raw_;
  mutable std::mutex mu_;
  Pool small_free_, large_free_;
  std::unordered_map<const void*, Block*> live_;  // blocks in use by address
  std::map<const char*, Block*> segments_;        // segment base -> its first block (never merged away)
  AllocatorStats st_;
};

}  // namespace dt::detail
