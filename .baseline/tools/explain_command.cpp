// `normjit explain [options] SHAPE...`: which kernel each call would use, why a kernel is new, and
// how many kernels a stream of shapes costs compared with the bound the policy promises.
// Offline: the built-in device profiles need no GPU.
#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "commands.h"
#include "explain.h"

namespace {

using namespace normjit;
using namespace normjit::tools;

void print_usage(FILE* out) {
  std::fprintf(out,
               "usage: normjit explain [options] SHAPE...\n"
               "Predicts, without a GPU, the kernel each call would use, its launch, and which calls share a\n"
               "kernel. The prediction runs the runtime's own validation and heuristics.\n\n"
               "options:\n%s"
               "  --verbose            with --random: print every call (default: only the new kernels)\n\n"
               "examples:\n"
               "  normjit explain 2x32x128x128x128 2x64x64x64x64\n"
               "  normjit explain --layout ndhwc --dtype bf16 --direction fwd 1x320x7x9x11\n"
               "  normjit explain --random 200 --seed 1\n"
               "  normjit explain --all --direction fwd\n",
               explain_flags_help());
}

std::string fusion_label(const FusionKey& f) { return describe(f); }

int print_all(const ExplainCli& cli) {
  const ExplainOptions& o = cli.options;
  std::printf("every kernel config the %s policy allows (the bound on compiles per fusion and GPU arch):\n",
              policy_name(o.policy));
  for (const FusionKey& f : explain_fusions(o)) {
    const std::vector<KernelConfig> configs = enumerate_configs(f, o.policy, o.device);
    std::printf("\n%s: %zu configs\n", fusion_label(f).c_str(), configs.size());
    int i = 0;
    for (const KernelConfig& c : configs)
      std::printf("  %3d  %-58s %s\n", ++i, kernel_name(f, c).c_str(), describe(c).c_str());
  }
  return 0;
}

}  // namespace

int run_explain_command(int argc, char** argv) {
  ExplainCli cli;
  bool verbose = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      print_usage(stdout);
      return 0;
    }
    if (a == "--verbose" || a == "-v") {
      verbose = true;
      continue;
    }
    if (!parse_explain_flag(argc, argv, i, cli)) {
      std::fprintf(stderr, "normjit explain: unexpected argument '%s'\n", a.c_str());
      print_usage(stderr);
      return 2;
    }
  }
  finish_explain_cli(cli);
  const ExplainOptions& o = cli.options;
  if (cli.all) return print_all(cli);
  if (cli.shapes.empty()) {
    std::fprintf(stderr, "normjit explain: no shapes given\n");
    print_usage(stderr);
    return 2;
  }

  std::printf("device %s (sm_%d, %d SMs), policy %s, pointers aligned to %d bytes\n", o.device.name.c_str(),
              o.device.arch, o.device.sms, policy_name(o.policy), o.align_bytes);
  if (o.eval && o.backward && o.forward) std::printf("(eval: forward only, there is no eval backward kernel)\n");
  const std::vector<ExplainCall> calls = explain_calls(cli.shapes, o);
  const bool brief = cli.random > 0 && !verbose;
  size_t hidden = 0;
  for (size_t i = 0; i < calls.size(); ++i) {
    if (brief && !calls[i].new_kernel) {
      ++hidden;
      continue;
    }
    std::printf("%s\n", format_call(calls, i).c_str());
  }
  if (hidden) std::printf("... %zu calls that share a kernel not shown (--verbose shows them)\n", hidden);

  // Totals.
  std::printf("\n%zu calls", calls.size());
  std::set<std::vector<int64_t>> distinct_shapes(cli.shapes.begin(), cli.shapes.end());
  std::printf(" (%zu shapes, %zu distinct)\n", cli.shapes.size(), distinct_shapes.size());
  size_t total_kernels = 0;
  for (const FusionKey& f : explain_fusions(o)) {
    size_t kernels = 0;
    for (const ExplainCall& c : calls)
      if (c.new_kernel && bytes_equal(c.fusion, f)) ++kernels;
    total_kernels += kernels;
    std::printf("  %s: %zu distinct kernel%s (the %s policy's bound for this fusion: %zu)\n", fusion_label(f).c_str(),
                kernels, kernels == 1 ? "" : "s", policy_name(o.policy), enumerate_configs(f, o.policy, o.device).size());
  }
  if (cli.random > 0) {
    std::printf(
        "\nrandom crop stream (%d shapes, seed %llu): %zu distinct shapes, each a recompile for "
        "torch.compile(dynamic=False); normjit: %zu kernels in all\n",
        cli.random, static_cast<unsigned long long>(cli.seed), distinct_shapes.size(), total_kernels);
  }
  return 0;
}
