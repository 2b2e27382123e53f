// L2: loaded kernels keyed by (fusion, kernel config, device), and the compile step behind it.
//
// A miss generates the source, asks the disk cache (L3), else compiles with NVRTC, then loads the
// cubin into the device's primary context. One compile per key at a time: concurrent callers of
// the same key wait for the first and share its result; different keys compile in parallel. The
// cubin is dropped once every caller has it (L2 keeps the loaded module, L3 the file).
#pragma once

#include <cuda.h>

#include <string>

#include "compile/compiler.h"
#include "compile/disk_cache.h"
#include "runtime/keys.h"

namespace normjit {

struct LoadedKernel {
  CUfunction function = nullptr;
  std::string name;
  int registers = 0;
  int max_blocks_per_sm = 0;  // occupancy at the kernel's block size and dynamic shared memory
  int dynamic_smem = 0;       // bytes of dynamic shared memory every launch passes (the tile ring)
};

// Source -> cubin through the disk cache, without a GPU. Logs the reason when NORMJIT_LOG asks.
compile::CompileResult compile_kernel(const FusionKey& f, const KernelConfig& c, int arch);
// Same, through a given disk cache (null: none) instead of the process-wide one (tests).
compile::CompileResult compile_kernel(const FusionKey& f, const KernelConfig& c, int arch, compile::DiskCache* disk);

// What compile_kernel hands the compiler for the kernel: its generated source, name and options.
compile::CompileRequest compile_request(const FusionKey& f, const KernelConfig& c, int arch);

// Whether `disk` holds the kernel's cubin (a verified entry), without compiling.
bool kernel_on_disk(const FusionKey& f, const KernelConfig& c, int arch, compile::DiskCache& disk);

// Keys with a compile_kernel call in progress or a reservation: each holds a slot (and, once
// compiled, its cubin) only until its last caller returns, so this is 0 whenever no call is in
// progress and nothing is reserved (tests).
size_t compile_slots_in_use();

// Compiling ahead of a call (runtime/prefetch.h). reserve_compile keeps the key's slot, and the
// cubin compiled into it, until the next compile_kernel call of the key has returned: that call
// then takes the cubin without compiling, with or without a disk cache. Returns false when the key
// is reserved already.
bool reserve_compile(const FusionKey& f, const KernelConfig& c, int arch);
// Drops a reservation (the slot goes once no call holds it).
void release_compile(const FusionKey& f, const KernelConfig& c, int arch);
// Whether the key is reserved: queued or compiled ahead, its call not yet come.
bool compile_is_reserved(const FusionKey& f, const KernelConfig& c, int arch);
enum class AheadResult { not_reserved, already_done, compiled, from_disk };
// Compiles into a reserved slot, on this thread; concurrent compile_kernel callers of the key wait
// for it. Does nothing when the key is no longer reserved (its call came and compiled) or is
// compiled already. A failed compile drops the reservation and throws; the call it was for then
// compiles again and throws its own error.
AheadResult compile_reserved(const FusionKey& f, const KernelConfig& c, int arch, compile::DiskCache* disk);

// The loaded kernel (compiling on a miss).
const LoadedKernel& get_kernel(const FusionKey& f, const KernelConfig& c, int device);
// Whether the kernel is loaded already (no compile), e.g. during CUDA-graph capture.
bool kernel_loaded(const FusionKey& f, const KernelConfig& c, int device);

// Forgets the L2 entries (their modules stay loaded: a plan may still use them) and the
// reservations of compile slots.
void clear_kernel_cache();

}  // namespace normjit
