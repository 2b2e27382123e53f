// Process-wide cache counters (lock-free on the hot path).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "normjit/normjit.h"

namespace normjit::stats {

struct Counters {
  std::atomic<uint64_t> plan_hits{0}, plan_misses{0};
  std::atomic<uint64_t> kernel_hits{0}, kernel_misses{0};
  std::atomic<uint64_t> disk_hits{0}, disk_misses{0};
  std::atomic<uint64_t> compiles{0};
  std::atomic<uint64_t> autotune_searches{0}, autotune_records_loaded{0};
};
Counters& counters();

// Records one NVRTC compile of `name` that took `ms`.
void record_compile(const std::string& name, double ms);
CacheStats snapshot();
void reset();

}  // namespace normjit::stats
