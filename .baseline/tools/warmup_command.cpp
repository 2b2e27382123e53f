// `normjit warmup [explain's options] [--jobs N] SHAPE... | --all`: compile ahead of time, into the
// disk cache, the kernels `normjit explain` predicts for the shapes (or every kernel the policy
// allows with --all), so that the first training step compiles nothing. Needs NVRTC, not a GPU.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "commands.h"
#include "compile/disk_cache.h"
#include "explain.h"
#include "warmup.h"

namespace {

using namespace normjit;
using namespace normjit::tools;

void print_usage(FILE* out) {
  std::fprintf(out,
               "usage: normjit warmup [options] SHAPE... | --all\n"
               "Compiles into the disk cache the kernels `normjit explain` predicts for the shapes (or, with\n"
               "--all, every kernel config the policy allows for the fusion), for the --device's architecture.\n"
               "Needs NVRTC, not a GPU. The cache is $NORMJIT_CACHE_DIR, else $XDG_CACHE_HOME/normjit, else\n"
               "~/.cache/normjit.\n\n"
               "options:\n%s"
               "  --jobs N             compile N kernels at a time (default: one per hardware thread)\n"
               "  --arch SM            compile for sm_SM instead of the device profile's (e.g. 80, 90)\n"
               "  --quiet              no progress bar\n",
               explain_flags_help());
}

}  // namespace

int run_warmup_command(int argc, char** argv) {
  ExplainCli cli;
  int jobs = 0, arch = 0;
  bool quiet = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      print_usage(stdout);
      return 0;
    }
    if ((a == "--jobs" || a == "-j" || a == "--arch") && i + 1 < argc) {
      const std::string v = argv[++i];
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n <= 0) {
        std::fprintf(stderr, "normjit warmup: %s expects a positive integer, got '%s'\n", a.c_str(), v.c_str());
        return 2;
      }
      (a == "--arch" ? arch : jobs) = int(n);
      continue;
    }
    if (a == "--quiet" || a == "-q") {
      quiet = true;
      continue;
    }
    if (!parse_explain_flag(argc, argv, i, cli)) {
      std::fprintf(stderr, "normjit warmup: unexpected argument '%s'\n", a.c_str());
      print_usage(stderr);
      return 2;
    }
  }
  finish_explain_cli(cli);
  const ExplainOptions& o = cli.options;
  if (!cli.all && cli.shapes.empty()) {
    std::fprintf(stderr, "normjit warmup: give shapes (or --all for every kernel of the fusion)\n");
    print_usage(stderr);
    return 2;
  }
  if (arch == 0) arch = o.device.arch;
  if (jobs == 0) jobs = int(std::max(1u, std::thread::hardware_concurrency()));

  const auto kernels = cli.all ? all_kernels(o) : distinct_kernels(explain_calls(cli.shapes, o));
  compile::DiskCache& disk = compile::DiskCache::global();
  std::printf("warming up %zu kernels for sm_%d (%s policy) with %d jobs; disk cache: %s\n", kernels.size(), arch,
              policy_name(o.policy), jobs, disk.enabled() ? disk.dir().c_str() : "disabled");
  std::fflush(stdout);
  if (!disk.enabled()) std::printf("note: the disk cache is disabled, so these compiles help no later process\n");

  const WarmupSummary s = warmup_kernels(kernels, arch, jobs, !quiet);
  std::printf("kernels: %d, compiled: %d, already in the disk cache: %d", s.kernels, s.compiled, s.from_disk);
  if (s.failed) std::printf(", FAILED: %d", s.failed);
  std::printf("\ntotal: %.2f s", s.seconds);
  if (!s.slowest.empty()) std::printf(", slowest: %s (%.0f ms)", s.slowest.c_str(), s.slowest_ms);
  std::printf("\n");
  if (s.failed) {
    for (const WarmupKernel& k : s.results)
      if (!k.error.empty()) std::fprintf(stderr, "normjit warmup: %s: %s\n", k.name.c_str(), k.error.c_str());
    return 1;
  }
  return 0;
}
