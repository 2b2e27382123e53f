// `normjit stats [--dir PATH]`: the cache counters of this process and a summary of the disk cache.
//
// The counters are per process: in a fresh CLI process nothing has run, so they are zero apart from
// what the command itself did. The disk cache summary is what persists between processes (entries
// per GPU architecture, sizes, damaged entries). A program reads its own counters with
// normjit::cache_stats() (Python: normjit.cache_stats()).
#include <cstdio>
#include <map>
#include <string>

#include "commands.h"
#include "compile/compiler.h"
#include "compile/disk_cache.h"
#include "driver/nvrtc.h"
#include "normjit/normjit.h"
#include "runtime/autotune_record.h"
#include "schedule/heuristics.h"

namespace {

using normjit::compile::DiskCache;

std::string key_field(const std::string& key, const std::string& field) {
  return normjit::compile::disk_key_field(key, field);
}

void print_usage(FILE* out) {
  std::fprintf(out,
               "usage: normjit stats [--dir PATH]\n"
               "Prints this process's cache counters (L1 plans, L2 kernels, L3 disk, NVRTC compiles, autotune)\n"
               "and a summary of the disk cache: kernels per GPU architecture and autotune choices (--dir:\n"
               "another directory than the one normjit would use).\n");
}

}  // namespace

int run_stats_command(int argc, char** argv) {
  std::string dir = DiskCache::default_dir();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      print_usage(stdout);
      return 0;
    } else if (a == "--dir" && i + 1 < argc) {
      dir = argv[++i];
    } else if (a.rfind("--dir=", 0) == 0) {
      dir = a.substr(6);
    } else {
      std::fprintf(stderr, "normjit stats: unexpected argument '%s'\n", a.c_str());
      print_usage(stderr);
      return 2;
    }
  }

  std::printf("normjit %s, policy %s\n", normjit::version().c_str(), normjit::policy_name(normjit::policy_from_env()));
  std::string why;
  if (const auto* lib = normjit::driver::try_nvrtc(&why))
    std::printf("NVRTC %d.%d (%s)\n", lib->major, lib->minor, lib->path.c_str());
  else
    std::printf("NVRTC: not available: %s\n", why.c_str());
  const normjit::Availability av = normjit::availability();
  std::printf("GPU: %s\n", av.available ? "available" : ("not available: " + av.reason).c_str());

  const normjit::CacheStats s = normjit::cache_stats();
  std::printf("\ncounters of this process (zero in a fresh process; programs read theirs with cache_stats()):\n");
  std::printf("  L1 launch plans:   %llu hits, %llu misses\n", (unsigned long long)s.plan_hits,
              (unsigned long long)s.plan_misses);
  std::printf("  L2 loaded kernels: %llu hits, %llu misses\n", (unsigned long long)s.kernel_hits,
              (unsigned long long)s.kernel_misses);
  std::printf("  L3 disk cache:     %llu hits, %llu misses, %llu writes, %llu errors\n",
              (unsigned long long)s.disk_hits, (unsigned long long)s.disk_misses, (unsigned long long)s.disk_writes,
              (unsigned long long)s.disk_errors);
  std::printf("  NVRTC compiles:    %llu (%.0f ms)\n", (unsigned long long)s.compiles, s.compile_ms_total);
  std::printf("  autotune:          %s; %llu searches, %llu records loaded\n",
              normjit::autotune_enabled() ? "on" : "off (NORMJIT_AUTOTUNE=1 turns it on)",
              (unsigned long long)s.autotune_searches, (unsigned long long)s.autotune_records_loaded);
  for (const auto& [name, ms] : s.compile_ms) std::printf("    %8.1f ms  %s\n", ms, name.c_str());

  std::printf("\ndisk cache: ");
  if (dir.empty()) {
    std::printf("disabled (NORMJIT_DISABLE_DISK_CACHE is set, or no HOME)\n");
    return 0;
  }
  DiskCache cache(dir);
  std::printf("%s%s\n", dir.c_str(), cache.enabled() ? "" : " (not usable)");
  uint64_t bytes = 0;
  size_t invalid = 0;
  std::map<std::string, size_t> per_arch;
  const auto entries = cache.list();
  for (const auto& e : entries) {
    bytes += e.bytes;
    if (!e.valid) {
      ++invalid;
      continue;
    }
    if (normjit::autotune::is_record_key(e.key)) {
      ++per_arch["autotune choices"];
      continue;
    }
    const std::string arch = key_field(e.key, "arch");
    ++per_arch[arch.empty() ? std::string("other records") : arch];
  }
  std::printf("  entries: %zu (%.1f MiB)", entries.size(), double(bytes) / (1024.0 * 1024.0));
  if (invalid) std::printf(", %zu damaged (`normjit cache verify` deletes them)", invalid);
  std::printf("\n");
  for (const auto& [arch, n] : per_arch) std::printf("  %-17s %zu entries\n", arch.c_str(), n);
  return 0;
}
