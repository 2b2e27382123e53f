// Device workspace for kernels whose CTAs exchange results: counters (which every launch leaves
// at zero), partial statistics, per-instance scratch, and the resident split's tagged exchange
// words (word 0: the launch generation; see kernels/resident_split.cuh), which only resident
// kernels touch. One buffer per (device, stream), so
// launches on different streams never share counters; it only grows, and a grown-out buffer is
// kept until exit because kernels queued earlier on the stream may still use it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace normjit {

struct Workspace {
  unsigned* counters = nullptr;
  float* partials = nullptr;
  float* scratch = nullptr;
  unsigned long long* exchange = nullptr;
  int64_t exchange_words = 0;  // the exchange region's whole size (at least what was asked for)
};

// Sizes in elements. Growing allocates and zeroes synchronously, which is not allowed while the
// stream is being captured: that case throws normjit::Error asking for a warm-up call.
// A call that the current buffer fits takes no lock (every call of an affine backward does one).
Workspace get_workspace(int device, void* stream, int64_t counters, int64_t partials, int64_t scratch,
                        int64_t exchange = 0);

// Tests without a GPU: `allocate` replaces what a grow does on the device (the capture check,
// then `bytes` of memory zeroed in stream order) and returns the new buffer's address; nullptr
// restores the device. Buffers grown before the swap stay in use.
using WorkspaceAllocator = uint64_t (*)(int device, void* stream, size_t bytes);
void set_workspace_allocator_for_tests(WorkspaceAllocator allocate);

}  // namespace normjit
