#include "runtime/sync_workspace.h"

#include <algorithm>
#include <atomic>
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
  int64_t counters = 0, partials = 0, scratch = 0, exchange = 0;  // exchange: 8-byte words
};

bool fits(const Buffer& b, int64_t counters, int64_t partials, int64_t scratch, int64_t exchange) {
  return b.counters >= counters && b.partials >= partials && b.scratch >= scratch && b.exchange >= exchange;
}

// Device memory for a grown buffer, zeroed in stream order: the counters read zero before the
// first kernel on this stream that uses them.
uint64_t allocate_on_device(int device, void* stream, size_t bytes) {
  const auto& cu = driver::cuda_driver();
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  driver::check_cuda(cu.cuStreamIsCapturing(static_cast<CUstream>(stream), &status), "cuStreamIsCapturing");
  if (status != CU_STREAM_CAPTURE_STATUS_NONE)
    throw Error(
        "normjit needs a larger synchronisation workspace while the stream is being captured into a CUDA "
        "graph; run the same shapes once on this stream before capturing");
  make_current(device_state(device));
  CUdeviceptr base = 0;
  driver::check_cuda(cu.cuMemAlloc(&base, bytes), "cuMemAlloc (normjit workspace)");
  driver::check_cuda(cu.cuMemsetD8Async(base, 0, bytes, static_cast<CUstream>(stream)),
                     "cuMemsetD8Async (normjit workspace)");
  return base;
}

// The buffers, their growth and the allocator: under g_mutex, on the slow path only.
std::mutex g_mutex;
std::map<std::pair<int, void*>, Buffer> g_buffers;
std::vector<CUdeviceptr> g_retired;  // outgrown buffers, possibly still in use by queued kernels
WorkspaceAllocator g_allocate = allocate_on_device;

// Bumped (under g_mutex) whenever any buffer grows. A thread's last hit is the current buffer of
// its (device, stream) while the generation it was read at is still the current one.
std::atomic<uint64_t> g_generation{1};

// The hot path: the last (device, stream) this thread asked for and the buffer it got. Checking
// it takes no lock and writes nothing shared, so threads launching at once do not contend; a grow
// anywhere sends each thread through the map once more. The generation is read relaxed: a thread
// that has not seen a grow yet launches once more on the previous buffer of its stream, as if it
// had called just before the grow, which is safe because outgrown buffers are never freed and a
// buffer's counters are back at zero after every launch on its stream.
struct LastHit {
  int device = -1;
  void* stream = nullptr;
  uint64_t generation = 0;  // 0: never valid
  Buffer buffer;
};
thread_local LastHit t_last;

int64_t round_up(int64_t n) {
  int64_t r = 1024;
  while (r < n) r *= 2;
  return r;
}

// The slow path: the current buffer of (device, stream), grown first if it does not fit.
LastHit lookup(int device, void* stream, int64_t counters, int64_t partials, int64_t scratch, int64_t exchange) {
  std::lock_guard<std::mutex> lock(g_mutex);
  Buffer& b = g_buffers[{device, stream}];
  if (!fits(b, counters, partials, scratch, exchange)) {
    Buffer grown;
    grown.counters = round_up(std::max(counters, b.counters));
    grown.partials = round_up(std::max(partials, b.partials));
    grown.scratch = round_up(std::max(scratch, b.scratch));
    grown.exchange = round_up(std::max(exchange, b.exchange));
    const size_t bytes = size_t(grown.counters) * 4 + size_t(grown.partials) * 4 + size_t(grown.scratch) * 4 +
                         size_t(grown.exchange) * 8;
    grown.base = g_allocate(device, stream, bytes);
    if (b.base) g_retired.push_back(b.base);
    b = grown;
    g_generation.fetch_add(1, std::memory_order_relaxed);  // ordered by g_mutex for the slow path
  }
  return {device, stream, g_generation.load(std::memory_order_relaxed), b};
}

Workspace carve(const Buffer& b) {
  Workspace w;
  w.counters = reinterpret_cast<unsigned*>(b.base);
  w.partials = reinterpret_cast<float*>(b.base + size_t(b.counters) * 4);
  w.scratch = reinterpret_cast<float*>(b.base + size_t(b.counters) * 4 + size_t(b.partials) * 4);
  // Last, 8-byte aligned (the other regions are powers of two of at least 1024 words).
  w.exchange = reinterpret_cast<unsigned long long*>(b.base + size_t(b.counters + b.partials + b.scratch) * 4);
  w.exchange_words = b.exchange;
  return w;
}

}  // namespace

Workspace get_workspace(int device, void* stream, int64_t counters, int64_t partials, int64_t scratch,
                        int64_t exchange) {
  LastHit& last = t_last;
  if (last.device == device && last.stream == stream &&
      last.generation == g_generation.load(std::memory_order_relaxed) &&
      fits(last.buffer, counters, partials, scratch, exchange))
    return carve(last.buffer);
  last = lookup(device, stream, counters, partials, scratch, exchange);
  return carve(last.buffer);
}

void set_workspace_allocator_for_tests(WorkspaceAllocator allocate) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_allocate = allocate ? allocate : allocate_on_device;
}

}  // namespace normjit
