// Compiling a training forward's backward kernel in the background, so that the backward finds it.
//
// The first training step of a model meets each new kernel twice: its forward calls compile the
// forward kernels one after another, and its backward calls, a moment later, the backward kernels
// of the same shapes. Both are predictable at the forward: the backward's fusion follows from the
// forward's (same dtypes, layout, affine, residual, activation) and its kernel from the same shape
// (the heuristics are pure). So on a training forward whose backward kernel is neither loaded nor
// on disk, prefetch_backward queues that kernel for a background thread, which compiles it
// (through the disk cache when enabled) into a reserved compile slot (kernel_cache.h): the
// backward call then takes the cubin, or waits for the compile in progress, instead of starting
// its own. A cubin whose backward never comes (a training forward under no_grad) stays in memory,
// one per such kernel, until clear_memory_caches().
//
// The ladder: a U-Net's first forward meets its stages one after another, each with a new kernel,
// so a cold first step would compile its forward kernels one at a time on the caller's thread.
// When a forward's kernel is neither loaded nor on disk (a process meeting the model for the first
// time), prefetch_ladder also queues the kernels of the shapes a U-Net encoder meets next (each
// stage halves the three spatial dims and doubles the channels), forward kernels first, then their
// backward kernels, so that they compile in parallel with the caller's own compile. A forward
// whose kernel a ladder queued starts no ladder of its own (its stages are queued already). A guess that
// misses costs a background compile (at most 2 x kLadderStages per cold forward kernel, most of
// them shared), and its cubin goes to the disk cache like any other. NORMJIT_PREFETCH_LADDER=0
// turns the ladder off (the backward prefetch stays).
//
// Threads: half the hardware threads, 2 to 8 (1 on a machine of fewer than 4), started on the first
// prefetch; NORMJIT_PREFETCH=N sets N (at most 16), 0 turns prefetch off. Off by default in the C++ core,
// switched on by the Python package (set_prefetch_default), which joins the threads from its
// atexit hook: measured on the H200 machine, a process that reached the C++ teardown while a
// background compile ran hung (NVRTC calls into the CUDA driver, which exit tears down), so a C++
// program that turns prefetch on must call prefetch_shutdown() before it exits. On exit the
// threads finish the compiles in progress (the queue is dropped) and are joined. A failed background compile is warned
// about and forgotten: the backward call compiles again and throws its own error.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "compile/disk_cache.h"
#include "runtime/device.h"
#include "runtime/keys.h"

namespace normjit {

// The backward kernel that a call with the forward's fusion and shape will select: nullopt unless
// the forward trains and saves its statistics (only such a forward has a backward). The backward's
// pointers are not known yet: the forward's alignment is the guess (fresh allocations agree).
std::optional<std::pair<FusionKey, KernelConfig>> backward_kernel_of(const FusionKey& forward, const ShapeKey& s,
                                                                     const DeviceProfile& dev);

// The runtime's hook (instance_norm.cpp, on an L1 miss): queues the backward kernel of a training
// forward unless it is loaded on the device, or queued, already. Never throws.
void prefetch_backward(const FusionKey& forward, const ShapeKey& s, const DeviceState& dev);

// How far the ladder reaches: nnU-Net's 6 stages are 5 steps below the first.
constexpr int kLadderStages = 5;
// The shapes after s (contiguous in `layout`): spatial / 8 and C x 2 per stage, while the volume
// keeps 2 or more elements.
std::vector<ShapeKey> ladder_after(const ShapeKey& s, Layout layout);
// The runtime's hook for a forward whose kernel (forward_config) is not loaded (instance_norm.cpp):
// queues the ladder's kernels unless the forward's own kernel is on disk. Never throws.
void prefetch_ladder(const FusionKey& forward, const ShapeKey& s, const KernelConfig& forward_config,
                     const DeviceState& dev);
bool prefetch_ladder_enabled();

// Queues compile_reserved(f, c, arch, disk) for the background threads after reserving the key (no-op
// when it is reserved already). `device` >= 0: skipped if the kernel is loaded there by then.
// Returns whether it was queued (never with prefetch off). (Also the tests' entry point: they pass
// their own cache.)
bool prefetch_compile(const FusionKey& f, const KernelConfig& c, int arch, int device, compile::DiskCache* disk);

// Blocks until the queue is empty and no background compile runs (tests, benchmarks).
void prefetch_wait_idle();
// Drops the queue and joins the threads (waiting for the compiles in progress); prefetch stays off
// afterwards. Exit does this by itself; the Python package calls it from its atexit hook, which
// runs before the C++ teardown of the process.
void prefetch_shutdown();

struct PrefetchCounters {
  uint64_t queued = 0;     // compiles queued
  uint64_t compiled = 0;   // ... compiled by NVRTC in the background
  uint64_t from_disk = 0;  // ... found in the disk cache
  uint64_t unneeded = 0;   // ... no longer needed when their turn came (compiled or loaded meanwhile)
  uint64_t failed = 0;     // ... that failed (warned; the call compiles again)
  uint64_t ladder = 0;     // of the queued, those queued by prefetch_ladder
};
PrefetchCounters prefetch_counters();

// NORMJIT_PREFETCH (read once): the number of background threads; prefetch is on unless it is 0.
int prefetch_threads();
bool prefetch_enabled();
// The default when NORMJIT_PREFETCH is not set: off (false) unless the embedding program turns it
// on and calls prefetch_shutdown() before exit (the Python package does both).
void set_prefetch_default(bool on);

}  // namespace normjit
