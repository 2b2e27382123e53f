#include "runtime/stats.h"

#include "compile/disk_cache.h"

namespace normjit::stats {
namespace {
std::mutex g_mutex;
std::vector<std::pair<std::string, double>> g_compile_ms;
double g_compile_total = 0;
}  // namespace

Counters& counters() {
  static Counters c;
  return c;
}

void record_compile(const std::string& name, double ms) {
  counters().compiles++;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_compile_ms.emplace_back(name, ms);
  g_compile_total += ms;
}

CacheStats snapshot() {
  CacheStats s;
  Counters& c = counters();
  s.plan_hits = c.plan_hits;
  s.plan_misses = c.plan_misses;
  s.kernel_hits = c.kernel_hits;
  s.kernel_misses = c.kernel_misses;
  s.disk_hits = c.disk_hits;
  s.disk_misses = c.disk_misses;
  s.compiles = c.compiles;
  s.autotune_searches = c.autotune_searches;
  s.autotune_records_loaded = c.autotune_records_loaded;
  const compile::DiskCache& disk = compile::DiskCache::global();
  s.disk_writes = disk.writes();
  s.disk_errors = disk.errors();
  std::lock_guard<std::mutex> lock(g_mutex);
  s.compile_ms = g_compile_ms;
  s.compile_ms_total = g_compile_total;
  return s;
}

void reset() {
  Counters& c = counters();
  c.plan_hits = c.plan_misses = c.kernel_hits = c.kernel_misses = 0;
  c.disk_hits = c.disk_misses = c.compiles = 0;
  c.autotune_searches = c.autotune_records_loaded = 0;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_compile_ms.clear();
  g_compile_total = 0;
}

}  // namespace normjit::stats
