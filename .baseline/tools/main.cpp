// `normjit`: the command line. Each subcommand lives in its own file (commands.h).
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "commands.h"
#include "normjit/normjit.h"

// tools/demo_command.cpp (declared here until commands.h lists it).
int run_demo_command(int argc, char** argv);

namespace {

void print_usage(FILE* out) {
  std::fprintf(out,
               "usage: normjit [command] [options]\n"
               "\n"
               "commands:\n"
               "  demo      (default) explain, compile and cache the nnU-Net ladder; run it when a GPU is here\n"
               "  explain   which kernel each shape would use and why, without a GPU\n"
               "  warmup    compile the kernels for some shapes (or --all) into the disk cache ahead of time\n"
               "  cache     show | verify | clear the disk cache\n"
               "  stats     cache counters and a disk cache summary\n"
               "  --version print the version\n"
               "  --help    this text; `normjit <command> --help` for a command's options\n"
               "\n"
               "environment (all optional): NORMJIT_CACHE_DIR, NORMJIT_DISABLE_DISK_CACHE, NORMJIT_LOG,\n"
               "NORMJIT_NVRTC_PATH, NORMJIT_NVRTC_OPTIONS, NORMJIT_POLICY\n");
}

int dispatch(int argc, char** argv) {
  // argv[0] of a subcommand is its name.
  if (argc < 2) {
    char name[] = "demo";
    char* args[] = {name, nullptr};
    return run_demo_command(1, args);
  }
  const std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    print_usage(stdout);
    return 0;
  }
  if (cmd == "--version" || cmd == "-V" || cmd == "version") {
    std::printf("normjit %s\n", normjit::version().c_str());
    return 0;
  }
  if (cmd == "demo") return run_demo_command(argc - 1, argv + 1);
  if (cmd == "explain") return run_explain_command(argc - 1, argv + 1);
  if (cmd == "warmup") return run_warmup_command(argc - 1, argv + 1);
  if (cmd == "cache") return run_cache_command(argc - 1, argv + 1);
  if (cmd == "stats") return run_stats_command(argc - 1, argv + 1);
  std::fprintf(stderr, "normjit: unknown command '%s'\n\n", cmd.c_str());
  print_usage(stderr);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return dispatch(argc, argv);
  } catch (const normjit::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "normjit: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "normjit: internal error: %s\n", e.what());
    return 1;
  }
}
