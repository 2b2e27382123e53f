// Loading libcuda.so.1 at run time.
//
// Functions are resolved with cuGetProcAddress_v2 where the driver has it (CUDA >= 12.0): it returns
// the entry point of the ABI version we ask for, which is how NVIDIA wants driver functions found.
// Older drivers fall back to dlsym of the versioned export names (cuMemAlloc_v2, ...), which is what
// cuda.h's #defines would have linked against. The names in the table are spelled out as strings
// because cuda.h turns some identifiers into macros (cuMemAlloc -> cuMemAlloc_v2).
#include "driver/cuda_driver.h"

#include <dlfcn.h>

#include <string>

#include "normjit/normjit.h"

namespace normjit::driver {
namespace {

// The ABI version we request from cuGetProcAddress. Every signature in CudaDriver is identical in
// CUDA 12.0 and the 13.x headers, and asking for 12.0 keeps 12.x drivers working.
constexpr int kRequestedAbi = 12000;

using GetProcAddressFn = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

struct Entry {
  const char* base;      // name for cuGetProcAddress (no version suffix)
  const char* exported;  // versioned export for dlsym
  void (*set)(CudaDriver&, void*);
};

// POSIX guarantees that dlsym's void* converts to a function pointer.
#define NORMJIT_CU_ENTRY(member, base, exported)                                                   \
  Entry {                                                                                          \
    base, exported, [](CudaDriver& d, void* fn) { d.member = reinterpret_cast<decltype(d.member)>(fn); } \
  }

// `member` goes through cuda.h's macros exactly like the declaration in the header does.
const Entry kEntries[] = {
    NORMJIT_CU_ENTRY(cuInit, "cuInit", "cuInit"),
    NORMJIT_CU_ENTRY(cuGetErrorString, "cuGetErrorString", "cuGetErrorString"),
    NORMJIT_CU_ENTRY(cuGetErrorName, "cuGetErrorName", "cuGetErrorName"),
    NORMJIT_CU_ENTRY(cuDeviceGet, "cuDeviceGet", "cuDeviceGet"),
    NORMJIT_CU_ENTRY(cuDeviceGetCount, "cuDeviceGetCount", "cuDeviceGetCount"),
    NORMJIT_CU_ENTRY(cuDeviceGetAttribute, "cuDeviceGetAttribute", "cuDeviceGetAttribute"),
    NORMJIT_CU_ENTRY(cuDeviceGetName, "cuDeviceGetName", "cuDeviceGetName"),
    NORMJIT_CU_ENTRY(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain"),
    NORMJIT_CU_ENTRY(cuCtxGetCurrent, "cuCtxGetCurrent", "cuCtxGetCurrent"),
    NORMJIT_CU_ENTRY(cuCtxSetCurrent, "cuCtxSetCurrent", "cuCtxSetCurrent"),
    NORMJIT_CU_ENTRY(cuModuleLoadData, "cuModuleLoadData", "cuModuleLoadData"),
    NORMJIT_CU_ENTRY(cuModuleGetFunction, "cuModuleGetFunction", "cuModuleGetFunction"),
    NORMJIT_CU_ENTRY(cuFuncSetAttribute, "cuFuncSetAttribute", "cuFuncSetAttribute"),
    NORMJIT_CU_ENTRY(cuFuncGetAttribute, "cuFuncGetAttribute", "cuFuncGetAttribute"),
    NORMJIT_CU_ENTRY(cuOccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                     "cuOccupancyMaxActiveBlocksPerMultiprocessor"),
    NORMJIT_CU_ENTRY(cuLaunchKernel, "cuLaunchKernel", "cuLaunchKernel"),
    NORMJIT_CU_ENTRY(cuLaunchKernelEx, "cuLaunchKernelEx", "cuLaunchKernelEx"),
    NORMJIT_CU_ENTRY(cuMemAlloc, "cuMemAlloc", "cuMemAlloc_v2"),
    NORMJIT_CU_ENTRY(cuMemFree, "cuMemFree", "cuMemFree_v2"),
    NORMJIT_CU_ENTRY(cuMemsetD8, "cuMemsetD8", "cuMemsetD8_v2"),
    NORMJIT_CU_ENTRY(cuStreamIsCapturing, "cuStreamIsCapturing", "cuStreamIsCapturing"),
    NORMJIT_CU_ENTRY(cuDriverGetVersion, "cuDriverGetVersion", "cuDriverGetVersion"),
    NORMJIT_CU_ENTRY(cuMemsetD8Async, "cuMemsetD8Async", "cuMemsetD8Async"),
    NORMJIT_CU_ENTRY(cuMemcpyHtoD, "cuMemcpyHtoD", "cuMemcpyHtoD_v2"),
    NORMJIT_CU_ENTRY(cuMemcpyDtoH, "cuMemcpyDtoH", "cuMemcpyDtoH_v2"),
    NORMJIT_CU_ENTRY(cuCtxSynchronize, "cuCtxSynchronize", "cuCtxSynchronize"),
    NORMJIT_CU_ENTRY(cuStreamSynchronize, "cuStreamSynchronize", "cuStreamSynchronize"),
    NORMJIT_CU_ENTRY(cuEventCreate, "cuEventCreate", "cuEventCreate"),
    NORMJIT_CU_ENTRY(cuEventDestroy, "cuEventDestroy", "cuEventDestroy_v2"),
    NORMJIT_CU_ENTRY(cuEventRecord, "cuEventRecord", "cuEventRecord"),
    NORMJIT_CU_ENTRY(cuEventSynchronize, "cuEventSynchronize", "cuEventSynchronize"),
    NORMJIT_CU_ENTRY(cuEventElapsedTime, "cuEventElapsedTime", "cuEventElapsedTime"),
};
#undef NORMJIT_CU_ENTRY

const char* kNoDriverHint =
    "normjit needs an NVIDIA GPU and driver to run kernels; explain/compile/cache work without one.";

// Fills every slot of `d` from `lib`; returns the name of the first symbol that is missing.
std::string resolve_all(void* lib, CudaDriver& d) {
  auto get_proc = reinterpret_cast<GetProcAddressFn>(dlsym(lib, "cuGetProcAddress_v2"));
  for (const Entry& e : kEntries) {
    void* fn = nullptr;
    if (get_proc) {
      CUdriverProcAddressQueryResult status{};
      // Legacy default stream semantics: a null CUstream means the legacy stream (see normjit.h).
      if (get_proc(e.base, &fn, kRequestedAbi, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status) != CUDA_SUCCESS ||
          status != CU_GET_PROC_ADDRESS_SUCCESS)
        fn = nullptr;
    }
    if (!fn) fn = dlsym(lib, e.exported);
    if (!fn) return e.exported;
    e.set(d, fn);
  }
  return {};
}

struct LoadResult {
  CudaDriver table{};
  bool ok = false;
  std::string error;
};

// Error text for a failing CUresult, usable before the table is complete.
std::string describe(const CudaDriver& d, CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (d.cuGetErrorName) d.cuGetErrorName(r, &name);
  if (d.cuGetErrorString) d.cuGetErrorString(r, &text);
  std::string s = name ? name : "CUDA error " + std::to_string(static_cast<int>(r));
  if (text) s += std::string(" (") + text + ")";
  return s;
}

LoadResult load_driver() {
  LoadResult out;
  // RTLD_LOCAL: the driver's symbols must not leak into the global namespace of the host process.
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* err = dlerror();
    out.error = std::string("libcuda.so.1 (the NVIDIA driver) could not be loaded: ") + (err ? err : "unknown error") +
                ". " + kNoDriverHint;
    return out;
  }
  // The library stays loaded for the life of the process: modules and functions point into it.
  if (std::string missing = resolve_all(lib, out.table); !missing.empty()) {
    out.error = "libcuda.so.1 was loaded but has no " + missing +
                "; the NVIDIA driver is too old for normjit. Install a driver that supports CUDA 12 or newer.";
    return out;
  }
  if (CUresult r = out.table.cuInit(0); r != CUDA_SUCCESS) {
    out.error = "cuInit(0) failed: " + describe(out.table, r) + ". " + kNoDriverHint +
                " Check that a GPU is visible (nvidia-smi, CUDA_VISIBLE_DEVICES).";
    return out;
  }
  out.ok = true;
  return out;
}

// Loaded once per process; the outcome (including a failure) is remembered, so a machine without a
// driver pays the dlopen attempt only once.
const LoadResult& loaded() {
  static const LoadResult result = load_driver();  // thread-safe static initialisation
  return result;
}

}  // namespace

const CudaDriver* try_cuda_driver(std::string* why_not) {
  try {
    const LoadResult& r = loaded();
    if (r.ok) return &r.table;
    if (why_not) *why_not = r.error;
  } catch (const std::exception& e) {  // e.g. bad_alloc while building the message
    if (why_not) *why_not = e.what();
  }
  return nullptr;
}

const CudaDriver& cuda_driver() {
  const LoadResult& r = loaded();
  if (!r.ok) throw Error(r.error);
  return r.table;
}

void check_cuda(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  std::string text;
  if (const CudaDriver* d = try_cuda_driver(nullptr))
    text = describe(*d, r);
  else
    text = "CUDA error " + std::to_string(static_cast<int>(r));
  throw Error(std::string(what) + " failed: " + text);
}

}  // namespace normjit::driver
