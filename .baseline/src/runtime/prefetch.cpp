// The background compile threads of prefetch.h.
//
// The threads only compile (NVRTC, the disk cache, no CUDA call), so they may run while the caller
// captures a CUDA graph.
//
// Exit: a static Joiner drops the queue and joins the threads, which waits for the compiles in
// progress. It must run before anything such a compile uses is destroyed, i.e. be registered
// (constructed) after all of it. Ours: built before the threads start. NVRTC's: its first compile
// in a process builds some 3,300 static objects, each registered with atexit as it is built (none
// by later compiles of any kernel: measured with a breakpoint on __cxa_atexit), and exiting while
// another thread compiles with them destroyed ends in "LLVM ERROR: out of memory". So before the
// Joiner and the threads, the calling thread compiles a trivial program (once per process, ~20 ms
// on a 2-core CI machine, NVRTC's start-up included, which the caller's own next compile is then
// spared); on a thread of its own, an exit during that compile would crash the same way. The
// Python package also calls prefetch_shutdown from its atexit hook, before any of this teardown.
//
// Fork: the Worker is never deleted. A child forked while the threads run inherits the object but
// not the threads, so the child neither joins nor queues to them (it compiles on its own thread,
// as without prefetch).
#include "runtime/prefetch.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "compile/compiler.h"
#include "driver/nvrtc.h"
#include "runtime/kernel_cache.h"
#include "runtime/log.h"
#include "runtime/stats.h"
#include "schedule/heuristics.h"

namespace normjit {
namespace {

struct Job {
  FusionKey fusion;
  KernelConfig config;
  int arch;
  int device;  // < 0: no device to check for an already loaded kernel
  compile::DiskCache* disk;
};

struct Counters {
  std::atomic<uint64_t> queued{0}, compiled{0}, from_disk{0}, unneeded{0}, failed{0}, ladder{0};
};
Counters g_counters;

std::string first_line(const char* text) {
  const char* end = std::strchr(text, '\n');
  return end ? std::string(text, end) : std::string(text);
}

void compile_one(const Job& j) {
  if (j.device >= 0 && kernel_loaded(j.fusion, j.config, j.device)) {  // its call came and loaded it
    release_compile(j.fusion, j.config, j.arch);
    g_counters.unneeded++;
    return;
  }
  try {
    switch (compile_reserved(j.fusion, j.config, j.arch, j.disk)) {
      case AheadResult::compiled:
        g_counters.compiled++;
        break;
      case AheadResult::from_disk:
        g_counters.from_disk++;
        break;
      case AheadResult::not_reserved:
      case AheadResult::already_done:
        g_counters.unneeded++;
        break;
    }
  } catch (const std::exception& e) {
    // Not thrown into whatever call runs now: the kernel's own call compiles again and throws.
    g_counters.failed++;
    log::warn("background compile of " + kernel_name(j.fusion, j.config) + " for sm_" + std::to_string(j.arch) +
              " failed; its first call will compile it again and report the error (" + first_line(e.what()) + ")");
    log::line(log::compile, std::string("background compile error: ") + e.what());
  }
}

// NVRTC's first compile of the process, of a trivial program: it builds NVRTC's static objects
// (see the top of this file) for the architecture the jobs will use.
void warm_up_nvrtc(int arch) {
  compile::CompileRequest req;
  req.name = "normjit_nvrtc_warm_up";
  req.source = "extern \"C\" __global__ void normjit_nvrtc_warm_up(float* p) { p[threadIdx.x] = 0.f; }\n";
  req.arch = arch;
  double ms = 0;
  try {
    compile::nvrtc_compile(req, &ms);
  } catch (const std::exception&) {  // the jobs will fail the same way and say so
  }
}

// The threads and their queue. More than one: a U-Net's backward kernels cost NVRTC 1.2-1.5x its
// forward kernels (bench/cold_compile_bench.cpp), so one thread would fall behind the forward.
class Worker {
 public:
  explicit Worker(int threads) : owner_(getpid()) {
    for (int t = 0; t < threads; ++t) threads_.emplace_back([this] { run(); });
  }

  // False in a forked child: the threads are the parent's.
  bool owned_here() const { return getpid() == owner_; }

  void push(const Job& j) {
    {
      std::lock_guard<std::mutex> lock(m_);
      if (stopping_) return;
      queue_.push_back(j);
    }
    cv_.notify_one();
  }

  void wait_idle() {
    std::unique_lock<std::mutex> lock(m_);
    idle_.wait(lock, [&] { return stopping_ || (queue_.empty() && busy_ == 0); });
  }

  // Idempotent; the first caller joins.
  void stop_and_join() {
    {
      std::lock_guard<std::mutex> lock(m_);
      if (stopping_) return;
      stopping_ = true;
      queue_.clear();  // their reservations stay until clear_memory_caches or exit
    }
    cv_.notify_all();
    idle_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  bool stopped() {
    std::lock_guard<std::mutex> lock(m_);
    return stopping_;
  }

 private:
  void run() {
    for (;;) {
      Job j;
      {
        std::unique_lock<std::mutex> lock(m_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (stopping_) return;
        j = queue_.front();
        queue_.pop_front();
        busy_++;
      }
      compile_one(j);
      {
        std::lock_guard<std::mutex> lock(m_);
        busy_--;
      }
      idle_.notify_all();
    }
  }

  const pid_t owner_;
  std::mutex m_;
  std::condition_variable cv_, idle_;
  std::deque<Job> queue_;
  int busy_ = 0;  // jobs being compiled
  bool stopping_ = false;
  std::vector<std::thread> threads_;  // last member: the threads start once the others exist
};

struct Joiner {
  Worker* worker;
  ~Joiner() {
    if (worker->owned_here()) worker->stop_and_join();
  }
};

std::atomic<Worker*> g_worker{nullptr};  // for prefetch_shutdown, which must not start threads

// The process's Worker; the first call (with the first job's arch) warms NVRTC up and starts it.
Worker& worker(int arch) {
  static Worker* const w = [arch] {
    // Function-local statics a compile uses, built now so that they outlive the Joiner.
    compile::default_options();
    compile::DiskCache::global();
    stats::counters();
    log::enabled(log::compile);
    driver::try_nvrtc(nullptr);
    warm_up_nvrtc(arch);  // NVRTC's statics, before the Joiner (see the top of this file)
    Worker* made = new Worker(prefetch_threads());
    g_worker = made;
    return made;
  }();
  static const Joiner joiner{w};
  return *w;
}

// Half the hardware threads, 2 to 8: a cold U-Net step queues ~10 kernels at its first norm (the
// ladder below), and NVRTC compiles scale with threads (normjit.warmup: 10 kernels in 0.47 s on 16
// cores, 4.1 s one after another); the other half stays with the training process. On a small
// machine one thread, which would otherwise slow the forward instead.
int default_threads() {
  const int hw = int(std::thread::hardware_concurrency());
  return hw >= 4 ? std::clamp(hw / 2, 2, 8) : 1;
}
std::atomic<bool> g_default_on{false};

// The runtime hooks' disk cache: the process-wide one, or none when it is disabled.
compile::DiskCache* hook_disk() {
  compile::DiskCache& disk = compile::DiskCache::global();
  return disk.enabled() ? &disk : nullptr;
}
// Queues a kernel for dev unless it is loaded there already; whether it was queued.
bool queue_unless_loaded(const FusionKey& f, const KernelConfig& c, const DeviceState& dev, compile::DiskCache* disk) {
  return !kernel_loaded(f, c, dev.ordinal) && prefetch_compile(f, c, dev.profile.arch, dev.ordinal, disk);
}

}  // namespace

void set_prefetch_default(bool on) { g_default_on.store(on, std::memory_order_relaxed); }

int prefetch_threads() {
  static const int from_env = [] {  // -1: not set
    const char* v = std::getenv("NORMJIT_PREFETCH");
    if (v && *v) {
      char* end = nullptr;
      const long n = std::strtol(v, &end, 10);
      if (*end == '\0' && n >= 0) return int(std::min(n, 16L));
      log::warn(std::string("NORMJIT_PREFETCH='") + v +
                "' is not a number of threads (0 turns prefetch off); using the default");
    }
    return -1;
  }();
  if (from_env >= 0) return from_env;
  return g_default_on.load(std::memory_order_relaxed) ? default_threads() : 0;
}

bool prefetch_enabled() { return prefetch_threads() > 0; }

std::optional<std::pair<FusionKey, KernelConfig>> backward_kernel_of(const FusionKey& forward, const ShapeKey& s,
                                                                     const DeviceProfile& dev) {
  if (forward.direction != Direction::forward || !forward.train || !forward.save) return std::nullopt;
  // What backward_keys builds for the backward of this forward (call_keys.h).
  const FusionKey b = make_fusion(Direction::backward, forward.dtype, forward.weight_dtype, forward.layout,
                                  /*train=*/true, forward.affine, forward.residual, /*running=*/false,
                                  /*save=*/false, forward.activation);
  return std::make_pair(b, choose_launch(b, s, dev, policy_from_env()).config);
}

bool prefetch_compile(const FusionKey& f, const KernelConfig& c, int arch, int device, compile::DiskCache* disk) {
  if (!prefetch_enabled() || !driver::try_nvrtc(nullptr)) return false;             // without NVRTC the call says why
  if (Worker* w = g_worker; w && (!w->owned_here() || w->stopped())) return false;  // forked child, or shut down
  if (!reserve_compile(f, c, arch)) return false;  // queued, or compiled and kept, already
  // A cubin on disk costs its call ~0.2 ms (read, verify, load): nothing to do ahead of it, and no
  // thread to start (checking costs ~0.2 ms too: generating the source for its key).
  if (disk && disk->enabled() && kernel_on_disk(f, c, arch, *disk)) {
    release_compile(f, c, arch);
    return false;
  }
  Worker* w = nullptr;
  try {
    w = &worker(arch);  // the first time: NVRTC's warm-up, then the threads
  } catch (...) {       // no thread could be started: the call compiles itself
    release_compile(f, c, arch);
    throw;
  }
  g_counters.queued++;
  log::line(log::compile, "queued " + kernel_name(f, c) + " for sm_" + std::to_string(arch) +
                              ": compiled in the background, ahead of its first call");
  w->push({f, c, arch, device, disk});
  return true;
}

void prefetch_backward(const FusionKey& forward, const ShapeKey& s, const DeviceState& dev) {
  if (forward.direction != Direction::forward || !forward.train || !forward.save || !prefetch_enabled()) return;
  try {
    const auto k = backward_kernel_of(forward, s, dev.profile);
    if (k) queue_unless_loaded(k->first, k->second, dev, hook_disk());
  } catch (const std::exception& e) {  // a prediction that fails costs the forward nothing
    log::line(log::compile, "no background compile for the backward of " + describe(forward) + ": " + e.what());
  }
}

std::vector<ShapeKey> ladder_after(const ShapeKey& s, Layout layout) {
  std::vector<ShapeKey> out;
  ShapeKey k = s;
  for (int stage = 0; stage < kLadderStages && k.spatial / 8 >= 2; ++stage) {
    k.spatial /= 8;
    k.C *= 2;
    if (layout == Layout::ndhwc)
      k.stride_c = 1, k.stride_s = k.C, k.stride_n = k.spatial * k.C;
    else
      k.stride_s = 1, k.stride_c = k.spatial, k.stride_n = k.C * k.spatial;
    out.push_back(k);
  }
  return out;
}

bool prefetch_ladder_enabled() {
  const char* v = std::getenv("NORMJIT_PREFETCH_LADDER");  // read each time: only cold forwards ask
  return !(v && std::strcmp(v, "0") == 0) && prefetch_enabled();
}

void prefetch_ladder(const FusionKey& forward, const ShapeKey& s, const KernelConfig& forward_config,
                     const DeviceState& dev) {
  if (forward.direction != Direction::forward || !prefetch_ladder_enabled()) return;
  try {
    // A forward whose kernel an earlier ladder guessed (queued, or compiled ahead) is one of that
    // ladder's stages, which queued the stages after it already. A new ladder from here would
    // reach one stage deeper than the first (measured on the H200: a channels-last 128^3 U-Net
    // compiled 2 kernels for a 2^3 stage it does not have, beside the 6 it needed). Checked
    // first: a map lookup, where the disk probe below generates and hashes the source and reads
    // a file.
    if (compile_is_reserved(forward, forward_config, dev.profile.arch)) return;
    compile::DiskCache* disk = hook_disk();
    // A kernel on disk means this process is not the first to meet the model: its ladder is on
    // disk too (or was never needed), and each call reads its kernel in ~0.5 ms.
    if (disk && kernel_on_disk(forward, forward_config, dev.profile.arch, *disk)) return;
    const Policy policy = policy_from_env();
    const std::vector<ShapeKey> ladder = ladder_after(s, forward.layout);
    // Forward kernels first: the forward pass needs them next, in this order; then the backward
    // kernels, which the backward pass needs once the forward is done.
    for (const ShapeKey& k : ladder)
      if (queue_unless_loaded(forward, choose_launch(forward, k, dev.profile, policy).config, dev, disk))
        g_counters.ladder++;
    for (const ShapeKey& k : ladder) {
      const auto b = backward_kernel_of(forward, k, dev.profile);
      if (b && queue_unless_loaded(b->first, b->second, dev, disk)) g_counters.ladder++;
    }
  } catch (const std::exception& e) {  // a guess that fails costs the call nothing
    log::line(log::compile, "no background compiles for the stages after " + describe(forward) + ": " + e.what());
  }
}

void prefetch_wait_idle() {
  Worker* w = g_worker;
  if (w && w->owned_here()) w->wait_idle();
}

void prefetch_shutdown() {
  Worker* w = g_worker;
  if (w && w->owned_here()) w->stop_and_join();
}

PrefetchCounters prefetch_counters() {
  PrefetchCounters c;
  c.queued = g_counters.queued;
  c.compiled = g_counters.compiled;
  c.from_disk = g_counters.from_disk;
  c.unneeded = g_counters.unneeded;
  c.failed = g_counters.failed;
  c.ladder = g_counters.ladder;
  return c;
}

}  // namespace normjit
