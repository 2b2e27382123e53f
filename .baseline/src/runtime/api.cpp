// The small public entry points besides the kernels: availability, counters, autotune switch, version.
#include "compile/disk_cache.h"
#include "driver/cuda_driver.h"
#include "driver/nvrtc.h"
#include "normjit/normjit.h"
#include "runtime/autotune.h"
#include "runtime/kernel_cache.h"
#include "runtime/stats.h"

namespace normjit {

void clear_plan_cache();  // instance_norm.cpp

int64_t TensorArg::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= sizes[i];
  return n;
}

namespace {
TensorArg tensor_of(void* data, DType dtype, const std::vector<int64_t>& sizes, const char* what) {
  if (sizes.empty() || sizes.size() > size_t(kMaxDims))
    throw Error(std::string(what) + ": expected 1 to " + std::to_string(kMaxDims) + " sizes, got " +
                std::to_string(sizes.size()));
  TensorArg t;
  t.data = data;
  t.dtype = dtype;
  t.ndim = int(sizes.size());
  for (int d = 0; d < t.ndim; ++d) t.sizes[d] = sizes[d];
  return t;
}
// Strides ignore zero sizes (a zero-size tensor has no addresses to get wrong).
int64_t extent(int64_t size) { return size > 1 ? size : 1; }
}  // namespace

TensorArg contiguous_tensor(void* data, DType dtype, std::vector<int64_t> sizes) {
  TensorArg t = tensor_of(data, dtype, sizes, "contiguous_tensor");
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) t.strides[d] = stride, stride *= extent(t.sizes[d]);
  return t;
}

TensorArg channels_last_tensor(void* data, DType dtype, std::vector<int64_t> sizes) {
  TensorArg t = tensor_of(data, dtype, sizes, "channels_last_tensor");
  if (t.ndim < 3) throw Error("channels_last_tensor: expected (N, C, spatial...), got " + std::to_string(t.ndim) + " dims");
  int64_t stride = 1;
  t.strides[1] = stride;
  stride *= extent(t.sizes[1]);
  for (int d = t.ndim - 1; d >= 2; --d) t.strides[d] = stride, stride *= extent(t.sizes[d]);
  t.strides[0] = stride;
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

void set_autotune(bool enabled) {
  if (autotune::enabled() == enabled) return;
  autotune::set_enabled(enabled);
  clear_plan_cache();  // plans made under the other setting would otherwise stay in use
}
bool autotune_enabled() { return autotune::enabled(); }

std::string version() { return NORMJIT_VERSION; }

}  // namespace normjit
