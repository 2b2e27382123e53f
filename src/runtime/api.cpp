// The small public entry points besides the kernels: availability, counters, version.
#include "compile/disk_cache.h"
#include "driver/cuda_driver.h"
#include "driver/nvrtc.h"
#include "normjit/normjit.h"
#include "runtime/kernel_cache.h"
#include "runtime/stats.h"

namespace normjit {

void clear_plan_cache();  // instance_norm.cpp

int64_t TensorArg::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= sizes[i];
  return n;
}

TensorArg contiguous_tensor(void* data, DType dtype, std::vector<int64_t> sizes) {
  if (sizes.empty() || sizes.size() > size_t(kMaxDims))
    throw Error("contiguous_tensor: expected 1 to " + std::to_string(kMaxDims) + " sizes, got " +
                std::to_string(sizes.size()));
  TensorArg t;
  t.data = data;
  t.dtype = dtype;
  t.ndim = int(sizes.size());
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.sizes[d] = sizes[d];
    t.strides[d] = stride;
    stride *= sizes[d];
  }
  return t;
}

Availability availability() {
  Availability a;
  std::string why;
  if (!driver::try_nvrtc(&why)) {
    a.reason = why;
    return a;
  }
  const driver::CudaDriver* cu = driver::try_cuda_driver(&why);
  if (!cu) {
    a.reason = why;
    return a;
  }
  int count = 0;
  if (cu->cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) {
    a.reason = "the NVIDIA driver is loaded but reports no CUDA device";
    return a;
  }
  a.available = true;
  return a;
}

CacheStats cache_stats() { return stats::snapshot(); }
void reset_cache_stats() { stats::reset(); }

void clear_memory_caches() {
  clear_plan_cache();
  clear_kernel_cache();
}

std::string version() { return NORMJIT_VERSION; }

}  // namespace normjit
