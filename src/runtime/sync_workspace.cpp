#include "runtime/sync_workspace.h"

#include <map>
#include <mutex>
#include <vector>

#include "driver/cuda_driver.h"
#include "normjit/normjit.h"
#include "runtime/device.h"

namespace normjit {
namespace {

struct Buffer {
  CUdeviceptr base = 0;
  int64_t counters = 0, partials = 0, scratch = 0;
};

std::mutex g_mutex;
std::map<std::pair<int, void*>, Buffer> g_buffers;
std::vector<CUdeviceptr> g_retired;  // outgrown buffers, possibly still in use by queued kernels

int64_t round_up(int64_t n) {
  int64_t r = 1024;
  while (r < n) r *= 2;
  return r;
}

}  // namespace

Workspace get_workspace(int device, void* stream, int64_t counters, int64_t partials, int64_t scratch) {
  std::lock_guard<std::mutex> lock(g_mutex);
  Buffer& b = g_buffers[{device, stream}];
  if (b.counters < counters || b.partials < partials || b.scratch < scratch) {
    const auto& cu = driver::cuda_driver();
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    driver::check_cuda(cu.cuStreamIsCapturing(static_cast<CUstream>(stream), &status), "cuStreamIsCapturing");
    if (status != CU_STREAM_CAPTURE_STATUS_NONE)
      throw Error("normjit needs a larger synchronisation workspace while the stream is being captured into a CUDA "
                  "graph; run the same shapes once on this stream before capturing");
    make_current(device_state(device));
    Buffer grown;
    grown.counters = round_up(std::max(counters, b.counters));
    grown.partials = round_up(std::max(partials, b.partials));
    grown.scratch = round_up(std::max(scratch, b.scratch));
    const size_t bytes = size_t(grown.counters) * 4 + size_t(grown.partials) * 4 + size_t(grown.scratch) * 4;
    driver::check_cuda(cu.cuMemAlloc(&grown.base, bytes), "cuMemAlloc (normjit workspace)");
    // Zeroed in stream order: the counters read zero before the first kernel on this stream.
    driver::check_cuda(cu.cuMemsetD8Async(grown.base, 0, bytes, static_cast<CUstream>(stream)),
                       "cuMemsetD8Async (normjit workspace)");
    if (b.base) g_retired.push_back(b.base);
    b = grown;
  }
  Workspace w;
  w.counters = reinterpret_cast<unsigned*>(b.base);
  w.partials = reinterpret_cast<float*>(b.base + size_t(b.counters) * 4);
  w.scratch = reinterpret_cast<float*>(b.base + size_t(b.counters) * 4 + size_t(b.partials) * 4);
  return w;
}

}  // namespace normjit
