#include "runtime/kernel_cache.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "codegen/codegen.h"
#include "schedule/heuristics.h"
#include "compile/disk_cache.h"
#include "driver/cuda_driver.h"
#include "runtime/device.h"
#include "runtime/log.h"
#include "runtime/stats.h"

namespace normjit {
namespace {

struct L2Key {
  FusionKey fusion;
  KernelConfig config;
  int32_t device;
  int32_t pad;
};

// One loaded kernel. The first caller builds it under `build`; concurrent callers of the same key
// block on that mutex and then find it ready. (A plain mutex rather than std::call_once: simpler,
// and a failed build simply leaves the slot for the next caller to retry.)
struct Slot {
  std::mutex build;
  std::atomic<bool> ready{false};
  LoadedKernel kernel;
};

std::mutex g_mutex;
std::unordered_map<L2Key, std::shared_ptr<Slot>, BytesHash<L2Key>, BytesEqual<L2Key>> g_kernels;

// Configs compiled (or read from disk) per fusion and arch in this process, to explain recompiles.
std::mutex g_history_mutex;
std::map<std::pair<std::string, int>, std::vector<KernelConfig>> g_history;

std::string compile_reason(const FusionKey& f, const KernelConfig& c, int arch) {
  std::lock_guard<std::mutex> lock(g_history_mutex);
  auto& seen = g_history[{describe(f), arch}];
  // compile_kernel keeps no cubin once its callers have it, so a second device of the same arch,
  // or a load after clear_memory_caches, asks again (normally a disk hit).
  if (std::any_of(seen.begin(), seen.end(), [&](const KernelConfig& old) { return bytes_equal(old, c); }))
    return "the same kernel again (for another device, or after clear_memory_caches)";
  std::string reason;
  if (seen.empty()) {
    reason = "new fusion";
  } else {
    // The nearest compiled config: the one with the fewest differing fields.
    std::string best;
    size_t best_count = ~size_t(0);
    for (const KernelConfig& old : seen) {
      const std::string d = config_diff(old, c);
      const size_t count = d.empty() ? 0 : 1 + std::count(d.begin(), d.end(), ',');
      if (count < best_count) best_count = count, best = d;
    }
    reason = "new kernel config (" + best + " vs the nearest compiled one)";
  }
  seen.push_back(c);
  return reason;
}

L2Key make_key(const FusionKey& f, const KernelConfig& c, int device) {
  L2Key k = zeroed<L2Key>();
  k.fusion = f;
  k.config = c;
  k.device = device;
  return k;
}

}  // namespace

// One compile per (kernel, arch) at a time: the first caller of a key compiles under the key's
// mutex; concurrent callers of the same key wait for it and share its result. Different keys
// compile in parallel. (A mutex per key rather than std::promise: the least machinery.)
// A slot lives only while calls for its key are inside compile_kernel, or while it is reserved
// for a call that a background compile runs ahead of (prefetch.h): the last one to leave erases
// it, cubin and all, so no cubin outlives the calls that asked for it (the loaded module and the
// disk cache keep what has to last). A failed compile leaves `done` false: the next waiter retries.
namespace {

struct CompileSlot {
  std::mutex m;
  bool done = false;              // guarded by m
  compile::CompileResult result;  // guarded by m
  int users = 0;                  // calls holding the slot; guarded by g_compile_slots_mutex
  bool reserved = false;          // kept for the next compile_kernel call; guarded by g_compile_slots_mutex
};
using CompileSlotKey = std::pair<std::string, int>;  // (kernel name, arch)
std::mutex g_compile_slots_mutex;
std::map<CompileSlotKey, CompileSlot> g_compile_slots;  // a node-based map: a slot never moves

CompileSlotKey slot_key(const FusionKey& f, const KernelConfig& c, int arch) { return {kernel_name(f, c), arch}; }

// Erases a slot that no call holds and no reservation keeps. Caller holds g_compile_slots_mutex.
void erase_if_unused(std::map<CompileSlotKey, CompileSlot>::iterator it) {
  if (it->second.users == 0 && !it->second.reserved) g_compile_slots.erase(it);
}

// A call's hold on the slot of its key, from arrival to return. A claiming hold (a call that needs
// the kernel) ends the key's reservation when it lets go: the cubin compiled ahead has reached it.
class CompileSlotHold {
 public:
  CompileSlotHold(CompileSlotKey key, bool claim) : claim_(claim), held_(true) {
    std::lock_guard<std::mutex> lock(g_compile_slots_mutex);
    it_ = g_compile_slots.try_emplace(std::move(key)).first;
    it_->second.users++;
  }
  // A hold on the slot only if it is reserved (else `held()` is false): checked and taken under one
  // lock, so a reservation claimed meanwhile cannot leave a fresh slot compiled for nobody.
  struct IfReserved {};
  CompileSlotHold(const CompileSlotKey& key, IfReserved) : claim_(false) {
    std::lock_guard<std::mutex> lock(g_compile_slots_mutex);
    auto it = g_compile_slots.find(key);
    if (it == g_compile_slots.end() || !it->second.reserved) return;
    it_ = it;
    held_ = true;
    it_->second.users++;
  }
  ~CompileSlotHold() {
    if (!held_) return;
    std::lock_guard<std::mutex> lock(g_compile_slots_mutex);
    if (claim_) it_->second.reserved = false;
    it_->second.users--;
    erase_if_unused(it_);
  }
  CompileSlotHold(const CompileSlotHold&) = delete;
  CompileSlotHold& operator=(const CompileSlotHold&) = delete;
  bool held() const { return held_; }
  CompileSlot* operator->() const { return &it_->second; }
  // Drops the reservation now (a failed compile ahead: nothing to keep).
  void unreserve() const {
    std::lock_guard<std::mutex> lock(g_compile_slots_mutex);
    it_->second.reserved = false;
  }

 private:
  bool claim_;
  bool held_ = false;
  std::map<CompileSlotKey, CompileSlot>::iterator it_{};
};

}  // namespace

compile::CompileResult compile_kernel_uncached(const FusionKey& f, const KernelConfig& c, int arch,
                                               compile::DiskCache* disk, bool ahead);

compile::CompileResult compile_kernel(const FusionKey& f, const KernelConfig& c, int arch) {
  compile::DiskCache& disk = compile::DiskCache::global();
  return compile_kernel(f, c, arch, disk.enabled() ? &disk : nullptr);
}

compile::CompileResult compile_kernel(const FusionKey& f, const KernelConfig& c, int arch, compile::DiskCache* disk) {
  const CompileSlotHold slot(slot_key(f, c, arch), /*claim=*/true);
  std::lock_guard<std::mutex> lock(slot->m);  // released before `slot` lets go of the slot
  if (!slot->done) {
    // on error: nothing kept, next caller retries
    slot->result = compile_kernel_uncached(f, c, arch, disk, /*ahead=*/false);
    slot->done = true;
  }
  return slot->result;
}

compile::CompileRequest compile_request(const FusionKey& f, const KernelConfig& c, int arch) {
  const codegen::KernelSource src = codegen::generate(f, c);
  compile::CompileRequest req;
  req.name = src.name;
  req.source = src.source;
  req.arch = arch;
  return req;
}

bool kernel_on_disk(const FusionKey& f, const KernelConfig& c, int arch, compile::DiskCache& disk) {
  return disk.load(compile::disk_key(compile_request(f, c, arch))).has_value();
}

size_t compile_slots_in_use() {
  std::lock_guard<std::mutex> lock(g_compile_slots_mutex);
  return g_compile_slots.size();
}

bool reserve_compile(const FusionKey& f, const KernelConfig& c, int arch) {
  std::lock_guard<std::mutex> lock(g_compile_slots_mutex);
  CompileSlot& slot = g_compile_slots[slot_key(f, c, arch)];
  if (slot.reserved) return false;
  slot.reserved = true;
  return true;
}

void release_compile(const FusionKey& f, const KernelConfig& c, int arch) {
  std::lock_guard<std::mutex> lock(g_compile_slots_mutex);
  auto it = g_compile_slots.find(slot_key(f, c, arch));
  if (it == g_compile_slots.end()) return;
  it->second.reserved = false;
  erase_if_unused(it);
}

bool compile_is_reserved(const FusionKey& f, const KernelConfig& c, int arch) {
  std::lock_guard<std::mutex> lock(g_compile_slots_mutex);
  auto it = g_compile_slots.find(slot_key(f, c, arch));
  return it != g_compile_slots.end() && it->second.reserved;
}

AheadResult compile_reserved(const FusionKey& f, const KernelConfig& c, int arch, compile::DiskCache* disk) {
  const CompileSlotHold slot(slot_key(f, c, arch), CompileSlotHold::IfReserved{});
  if (!slot.held()) return AheadResult::not_reserved;
  std::lock_guard<std::mutex> lock(slot->m);
  if (slot->done) return AheadResult::already_done;
  try {
    slot->result = compile_kernel_uncached(f, c, arch, disk, /*ahead=*/true);
  } catch (...) {
    slot.unreserve();  // the slot goes with this hold; the call it was for compiles and throws itself
    throw;
  }
  slot->done = true;
  return slot->result.from_disk ? AheadResult::from_disk : AheadResult::compiled;
}

compile::CompileResult compile_kernel_uncached(const FusionKey& f, const KernelConfig& c, int arch,
                                               compile::DiskCache* disk, bool ahead) {
  const compile::CompileRequest req = compile_request(f, c, arch);
  compile::CompileResult r = compile::compile_cubin(req, disk);
  const std::string reason = compile_reason(f, c, arch);
  // Said of kernels compiled by prefetch.cpp before any call needs them.
  const char* when = ahead ? " (ahead of its first call, in the background)" : "";
  auto& counters = stats::counters();
  if (r.from_disk) {
    counters.disk_hits++;
    log::line(log::disk, "disk hit " + req.name + when + " (" + reason + ")");
  } else {
    counters.disk_misses++;
    stats::record_compile(req.name, r.compile_ms);
    std::ostringstream s;
    s.setf(std::ios::fixed);
    s.precision(1);
    // The CPU time tells a compile that worked from one that waited (for a core, a lock).
    s << "compiled " << req.name << " for sm_" << arch << when << " in " << r.compile_ms << " ms (" << r.compile_cpu_ms
      << " ms CPU): " << reason << (disk ? "; not in the disk cache" : "; disk cache disabled");
    log::line(reason == "new fusion" ? log::compile : log::Topic(log::compile | log::recompile), s.str());
  }
  return r;
}

const LoadedKernel& get_kernel(const FusionKey& f, const KernelConfig& c, int device) {
  std::shared_ptr<Slot> slot;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto& s = g_kernels[make_key(f, c, device)];
    if (!s) s = std::make_shared<Slot>();
    slot = s;
  }
  if (slot->ready.load(std::memory_order_acquire)) {
    stats::counters().kernel_hits++;
    return slot->kernel;
  }
  std::lock_guard<std::mutex> building(slot->build);
  if (slot->ready.load(std::memory_order_acquire)) {  // built by the caller we waited for
    stats::counters().kernel_hits++;
    return slot->kernel;
  }
  {
    stats::counters().kernel_misses++;
    const DeviceState& dev = device_state(device);
    const compile::CompileResult r = compile_kernel(f, c, dev.profile.arch);
    const auto& cu = driver::cuda_driver();
    make_current(dev);
    CUmodule module;
    driver::check_cuda(cu.cuModuleLoadData(&module, r.cubin.data()), "cuModuleLoadData");
    LoadedKernel& k = slot->kernel;
    k.name = kernel_name(f, c);
    driver::check_cuda(cu.cuModuleGetFunction(&k.function, module, codegen::entry_point(f)), "cuModuleGetFunction");
    driver::check_cuda(cu.cuFuncGetAttribute(&k.registers, CU_FUNC_ATTRIBUTE_NUM_REGS, k.function),
                       "cuFuncGetAttribute");
    // Shared-memory slots (a streamed kernel's tile ring, a split's kept chunks, the backward tier's
    // dy) are dynamic shared memory; above 48 KB it must be allowed.
    k.dynamic_smem = int(ring_bytes(f, c));
    if (k.dynamic_smem > 0)
      driver::check_cuda(
          cu.cuFuncSetAttribute(k.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, k.dynamic_smem),
          "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
    driver::check_cuda(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(&k.max_blocks_per_sm, k.function, c.threads,
                                                                      size_t(k.dynamic_smem)),
                       "cuOccupancyMaxActiveBlocksPerMultiprocessor");
    slot->ready.store(true, std::memory_order_release);
  }
  return slot->kernel;
}

bool kernel_loaded(const FusionKey& f, const KernelConfig& c, int device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_kernels.find(make_key(f, c, device));
  return it != g_kernels.end() && it->second->ready.load();
}

void clear_kernel_cache() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_kernels.clear();
  }
  std::lock_guard<std::mutex> lock(g_compile_slots_mutex);
  for (auto it = g_compile_slots.begin(); it != g_compile_slots.end();) {
    auto next = std::next(it);
    it->second.reserved = false;
    erase_if_unused(it);
    it = next;
  }
}

}  // namespace normjit
