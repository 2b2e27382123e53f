// Ahead-of-time compilation: NVRTC every kernel of a list into the disk cache, in parallel, without
// a GPU. `normjit warmup` and `normjit demo` use it; so can a program that wants no compile on its
// first call (pass the kernels explain_calls() predicts, or all_kernels() for the whole bound).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "runtime/keys.h"

namespace normjit::tools {

struct WarmupKernel {
  FusionKey fusion{};
  KernelConfig config{};
  std::string name;        // kernel_name(fusion, config)
  bool from_disk = false;  // already in the disk cache
  double ms = 0;           // wall time of this kernel (NVRTC, or the disk read)
  std::string error;       // non-empty when it failed (the NVRTC log)
};

struct WarmupSummary {
  int kernels = 0;    // distinct kernels asked for
  int compiled = 0;   // compiled by NVRTC (and stored in the disk cache when it is enabled)
  int from_disk = 0;  // already in the disk cache
  int failed = 0;
  double seconds = 0;   // wall time of the whole warm-up
  std::string slowest;  // the kernel that took longest
  double slowest_ms = 0;
  std::vector<WarmupKernel> results;  // in the order of the (deduplicated) input
};

// Compiles each distinct (fusion, config) for sm_<arch> through the disk cache (compile_kernel),
// `jobs` at a time (<= 0: one per hardware thread). Failures are reported in the results, not
// thrown. With `progress`, a progress bar on stderr: one line redrawn in place when stderr is a
// terminal, else one line per kernel.
WarmupSummary warmup_kernels(const std::vector<std::pair<FusionKey, KernelConfig>>& kernels, int arch, int jobs,
                             bool progress);

}  // namespace normjit::tools
