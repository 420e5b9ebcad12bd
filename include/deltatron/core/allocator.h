// Allocators. Host: 64-byte aligned. CUDA: a splitting, coalescing caching allocator (per
// device; policy in src/core/allocator.cpp) so that a steady-state step performs no
// cudaMalloc; it counts raw allocations and tracks peak bytes. Never managed memory.
#pragma once
#include <cstddef>
#include <cstdint>

#include "deltatron/core/dtype.h"

namespace dt {

struct AllocatorStats {
  int64_t allocated_bytes = 0;   // bytes handed out and not yet freed (rounded sizes)
  int64_t peak_bytes = 0;        // max of allocated_bytes since the last reset_peak
  int64_t reserved_bytes = 0;    // bytes held from the device: segments (cached + in use)
  int64_t peak_reserved_bytes = 0;  // max of reserved_bytes (not reset by reset_peak)
  int64_t num_raw_allocs = 0;    // cudaMalloc / aligned_alloc calls ever made
  int64_t num_raw_frees = 0;     // cudaFree / free calls ever made
  int64_t num_allocs = 0;        // allocate() calls
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p, size_t bytes) = 0;
  virtual AllocatorStats stats() const = 0;
  virtual void reset_peak() = 0;
  // Returns cached memory to the system (CUDA: cudaFree of every entirely free segment).
  virtual void release_cached() {}
};

Allocator& host_allocator();
// Caching allocator of one CUDA device (aborts in a build without CUDA).
Allocator& cuda_allocator(int device);
Allocator& allocator_for(Device d);

}  // namespace dt
