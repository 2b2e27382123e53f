// Device workspace for kernels whose CTAs exchange results: counters (which every launch leaves
// at zero), partial statistics and per-instance scratch. One buffer per (device, stream), so
// launches on different streams never share counters; it only grows, and a grown-out buffer is
// kept until exit because kernels queued earlier on the stream may still use it.
#pragma once

#include <cstdint>

namespace normjit {

struct Workspace {
  unsigned* counters = nullptr;
  float* partials = nullptr;
  float* scratch = nullptr;
};

// Sizes in elements. Growing allocates and zeroes synchronously, which is not allowed while the
// stream is being captured: that case throws normjit::Error asking for a warm-up call.
Workspace get_workspace(int device, void* stream, int64_t counters, int64_t partials, int64_t scratch);

}  // namespace normjit
