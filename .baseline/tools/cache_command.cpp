// `normjit cache show|verify|clear [--dir PATH]`: inspect and maintain the disk cache.
// (`normjit stats` reports the counters; it lives in its own command.)
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "compile/compiler.h"
#include "compile/disk_cache.h"
#include "commands.h"
#include "runtime/autotune_record.h"

namespace {

using normjit::compile::DiskCache;

void print_usage(FILE* out) {
  std::fprintf(out,
               "usage: normjit cache <show|verify|clear|stats> [--dir PATH]\n"
               "  show    list the entries of the disk cache and whether each one is intact\n"
               "  verify  check every entry and delete the damaged ones\n"
               "  clear   delete every entry\n"
               "  --dir   use PATH instead of the directory normjit would use\n"
               "           ($NORMJIT_CACHE_DIR, else $XDG_CACHE_HOME/normjit, else ~/.cache/normjit)\n");
}

std::string key_field(const std::string& key, const std::string& field) {
  return normjit::compile::disk_key_field(key, field);
}

// "<kernel> (sm_90)" for compiled kernels; other records show their first line (for autotune
// choices: "autotune <fusion> N=.. C=.. spatial=.. on <GPU> (sm_XX)").
std::string describe_key(const std::string& key) {
  const std::string name = key_field(key, "name");
  if (name.empty()) return key.substr(0, key.find('\n'));
  const std::string arch = key_field(key, "arch");
  return arch.empty() ? name : name + " (" + arch + ")";
}

int show(DiskCache& cache) {
  const std::vector<DiskCache::Entry> entries = cache.list();
  uint64_t total = 0;
  for (const auto& e : entries) total += e.bytes;
  std::printf("directory: %s\n", cache.dir().c_str());
  std::printf("enabled:   %s\n", cache.enabled() ? "yes" : "no");
  std::printf("entries:   %zu (%llu bytes)\n", entries.size(), static_cast<unsigned long long>(total));
  for (const auto& e : entries) {
    const std::string state = e.valid ? "valid" : "INVALID (" + e.problem + ")";
    std::printf("  %s  %10llu  %s  %s\n", e.file.c_str(), static_cast<unsigned long long>(e.bytes), state.c_str(),
                e.valid ? describe_key(e.key).c_str() : "");
    // An autotune record also says what was chosen, and what it measured.
    if (e.valid && normjit::autotune::is_record_key(e.key))
      if (const auto payload = cache.load(e.key))
        std::printf("  %32s  %10s  -> %s\n", "", "", normjit::autotune::describe_payload(*payload).c_str());
  }
  return 0;
}

// Exit status 0 once the cache is healthy (damaged entries are expected after crashes and are
// repaired), 1 when some damaged entry could not be deleted.
int verify(DiskCache& cache) {
  const std::vector<DiskCache::Entry> entries = cache.list();
  size_t bad = 0;
  for (const auto& e : entries) {
    if (e.valid) continue;
    ++bad;
    std::printf("deleting %s: %s\n", e.file.c_str(), e.problem.c_str());
  }
  cache.remove_invalid();
  size_t still_bad = 0;
  for (const auto& e : cache.list()) still_bad += e.valid ? 0 : 1;
  std::printf("%zu entries checked in %s: %zu valid, %zu damaged and deleted\n", entries.size(), cache.dir().c_str(),
              entries.size() - bad, bad - std::min(bad, still_bad));
  if (still_bad > 0) {
    std::fprintf(stderr, "normjit: %zu damaged entries could not be deleted (check permissions on %s)\n", still_bad,
                 cache.dir().c_str());
    return 1;
  }
  return 0;
}

int clear(DiskCache& cache) {
  const size_t n = cache.clear();
  std::printf("deleted %zu files from %s\n", n, cache.dir().c_str());
  return 0;
}

}  // namespace

int run_cache_command(int argc, char** argv) {
  // `normjit cache stats` is the same as `normjit stats`.
  if (argc >= 2 && std::string(argv[1]) == "stats") return run_stats_command(argc - 1, argv + 1);
  std::string sub, dir;
  bool dir_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      print_usage(stdout);
      return 0;
    } else if (a == "--dir" && i + 1 < argc) {
      dir = argv[++i];
      dir_given = true;
    } else if (a.rfind("--dir=", 0) == 0) {
      dir = a.substr(6);
      dir_given = true;
    } else if (sub.empty() && !a.empty() && a[0] != '-') {
      sub = a;
    } else {
      std::fprintf(stderr, "normjit cache: unexpected argument '%s'\n", a.c_str());
      print_usage(stderr);
      return 2;
    }
  }
  if (sub != "show" && sub != "verify" && sub != "clear") {
    if (!sub.empty()) std::fprintf(stderr, "normjit cache: unknown subcommand '%s'\n", sub.c_str());
    print_usage(stderr);
    return 2;
  }
  if (dir_given && dir.empty()) {
    std::fprintf(stderr, "normjit cache: --dir needs a directory\n");
    return 2;
  }
  if (!dir_given) dir = DiskCache::default_dir();
  if (dir.empty()) {
    std::printf("the disk cache is disabled (NORMJIT_DISABLE_DISK_CACHE is set, or no HOME); use --dir PATH\n");
    return sub == "show" ? 0 : 1;
  }

  DiskCache cache(dir);
  if (sub == "show") return show(cache);
  if (sub == "verify") return verify(cache);
  return clear(cache);
}
