// What ptxas says about a compiled kernel's resources, read from an NVRTC program log compiled
// with -Xptxas=-v: registers per thread, bytes spilled to local memory, stack frame. The
// compile-time benches print it beside each kernel's NVRTC time, since an option that compiles
// faster (-Ofc=min) may do it by spilling (docs/PERF_NOTES.md).
#pragma once

#include <string>

namespace normjit::tools {

struct PtxasReport {
  bool found = false;  // the log held a "Used N registers" line
  int registers = 0;
  int spill_store_bytes = 0;
  int stack_frame_bytes = 0;
};

// The first entry function's figures (normjit programs hold one kernel each).
PtxasReport parse_ptxas_report(const std::string& log);

}  // namespace normjit::tools
