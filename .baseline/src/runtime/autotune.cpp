// The autotuner: record lookup, safety checks and the timed search. See autotune.h.
#include "runtime/autotune.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "compile/disk_cache.h"
#include "driver/cuda_driver.h"
#include "normjit/normjit.h"
#include "runtime/autotune_record.h"
#include "runtime/kernel_cache.h"
#include "runtime/log.h"
#include "runtime/stats.h"

namespace normjit::autotune {
namespace {

// -1: not decided yet (read NORMJIT_AUTOTUNE on first use), else 0 / 1.
std::atomic<int> g_enabled{-1};

bool env_enabled() {
  const char* v = std::getenv("NORMJIT_AUTOTUNE");
  if (!v) return false;
  const std::string s = v;
  return s == "1" || s == "true" || s == "TRUE" || s == "on" || s == "ON" || s == "yes";
}

// One search at a time: concurrent searches on other streams would distort each other's timings.
std::mutex g_search_mutex;

// An alternative must beat the default by this fraction to replace it: event timings of
// identical kernels differ by a percent or two between runs.
constexpr double kMargin = 0.03;
constexpr int kRounds = 3;                // timed rounds after the sizing round
constexpr double kBatchTargetUs = 200.0;  // launches per timed batch: about this long in all
constexpr int kMaxBatch = 16;

// "instance_norm fwd f16 ... N=2 C=32 spatial=4096 on NVIDIA H200 (sm_90)": the key's first line
// without its "autotune " prefix, for logs.
std::string what(const std::string& key) {
  const std::string first = key.substr(0, key.find('\n'));
  return first.substr(std::min(first.size(), first.find(' ') + 1));
}

std::string launch_text(const Launch& l) {
  std::ostringstream o;
  o << "'" << l.tier << "' " << describe(l.config) << ", chunks " << l.chunks << ", grid " << l.grid;
  return o.str();
}

// ---- device resources, released on every path --------------------------------------------------

// Freed only once the stream has finished with it (an error may leave launches queued).
struct DeviceScratch {
  CUstream stream = nullptr;
  CUdeviceptr ptr = 0;
  ~DeviceScratch() {
    if (!ptr) return;
    const auto& cu = driver::cuda_driver();
    cu.cuStreamSynchronize(stream);
    cu.cuMemFree(ptr);
  }
};

struct Events {
  std::vector<CUevent> events;
  explicit Events(size_t n) {
    const auto& cu = driver::cuda_driver();
    events.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      CUevent e = nullptr;
      driver::check_cuda(cu.cuEventCreate(&e, CU_EVENT_DEFAULT), "cuEventCreate (normjit autotune)");
      events.push_back(e);
    }
  }
  ~Events() {
    for (CUevent e : events) driver::cuda_driver().cuEventDestroy(e);
  }
};

// ---- overlap of the buffers a call writes and reads --------------------------------------------

struct Range {
  uintptr_t begin = 0, end = 0;
};

Range range_of(const void* p, int64_t bytes) {
  Range r;
  if (p && bytes > 0) r.begin = reinterpret_cast<uintptr_t>(p), r.end = r.begin + uintptr_t(bytes);
  return r;
}

bool overlap(const Range& a, const Range& b) {
  return a.begin != a.end && b.begin != b.end && a.begin < b.end && b.begin < a.end;
}

// ---- the timed search -------------------------------------------------------------------------------

// Times every candidate on the call's stream; returns the index of the chosen one.
size_t search(const FusionKey& f, const std::vector<Launch>& candidates, const NjParams& real, void* stream,
              const LaunchFn& launch, Timing* timing) {
  const auto& cu = driver::cuda_driver();
  CUstream st = static_cast<CUstream>(stream);
  NjParams p = real;

  // A training forward updates running_mean/var in place: the timing launches update a scratch
  // copy instead (zeros: the values do not change the time), so the real state is updated once.
  DeviceScratch running;
  running.stream = st;
  if (f.direction == Direction::forward && f.train && f.running && p.running_mean) {
    const size_t bytes = size_t(p.C) * 2 * sizeof(float);
    driver::check_cuda(cu.cuMemAlloc(&running.ptr, bytes), "cuMemAlloc (normjit autotune scratch)");
    driver::check_cuda(cu.cuMemsetD8Async(running.ptr, 0, bytes, st), "cuMemsetD8Async (normjit autotune scratch)");
    p.running_mean = reinterpret_cast<float*>(running.ptr);
    p.running_var = reinterpret_cast<float*>(running.ptr) + p.C;
  }

  // Warm-up: compiles or loads each kernel and touches the data. A candidate that cannot run here
  // (e.g. occupancy lower than its config promises) drops out; the default must run.
  const size_t n = candidates.size();
  std::vector<bool> usable(n, true);
  for (size_t i = 0; i < n; ++i) {
    try {
      NjParams q = p;
      launch(candidates[i], q);
    } catch (const Error& e) {
      if (i == 0) throw;
      usable[i] = false;
      log::line(log::autotune, "autotune: candidate " + launch_text(candidates[i]) + " cannot run: " + e.what());
    }
  }
  driver::check_cuda(cu.cuStreamSynchronize(st), "cuStreamSynchronize (normjit autotune warm-up)");

  // Timed rounds, candidates interleaved within each so that clock and thermal drift hit them
  // alike. Round 0 (one launch each) sizes the batches of the others; each candidate keeps its
  // best batch (the least disturbed one).
  Events ev(2 * n);
  std::vector<double> best(n, std::numeric_limits<double>::infinity());
  int batch = 1;
  for (int round = 0; round <= kRounds; ++round) {
    for (size_t i = 0; i < n; ++i) {
      if (!usable[i]) continue;
      driver::check_cuda(cu.cuEventRecord(ev.events[2 * i], st), "cuEventRecord (normjit autotune)");
      for (int r = 0; r < batch; ++r) {
        NjParams q = p;
        launch(candidates[i], q);
      }
      driver::check_cuda(cu.cuEventRecord(ev.events[2 * i + 1], st), "cuEventRecord (normjit autotune)");
    }
    driver::check_cuda(cu.cuStreamSynchronize(st), "cuStreamSynchronize (normjit autotune)");
    for (size_t i = 0; i < n; ++i) {
      if (!usable[i]) continue;
      float ms = 0;
      driver::check_cuda(cu.cuEventElapsedTime(&ms, ev.events[2 * i], ev.events[2 * i + 1]),
                         "cuEventElapsedTime (normjit autotune)");
      best[i] = std::min(best[i], double(ms) * 1000.0 / batch);
    }
    if (round == 0) batch = int(std::clamp(std::ceil(kBatchTargetUs / std::max(best[0], 1.0)), 1.0, double(kMaxBatch)));
  }

  size_t chosen = 0;
  for (size_t i = 1; i < n; ++i)
    if (usable[i] && best[i] < best[chosen]) chosen = i;
  if (chosen != 0 && !(best[chosen] < best[0] * (1.0 - kMargin))) chosen = 0;

  timing->chosen_us = best[chosen];
  timing->default_us = best[0];
  timing->candidates = int(std::count(usable.begin(), usable.end(), true));
  if (log::enabled(log::autotune)) {
    std::ostringstream o;
    o << "autotune: timed " << timing->candidates << " candidates (batches of " << batch << "):";
    for (size_t i = 0; i < n; ++i)
      if (usable[i])
        o << "\n[normjit]   " << (i == chosen ? "* " : "  ") << best[i] << " us  " << launch_text(candidates[i]);
    log::line(log::autotune, o.str());
  }
  return chosen;
}

}  // namespace

bool enabled() {
  int v = g_enabled.load(std::memory_order_relaxed);
  if (v < 0) {
    int expected = -1;
    g_enabled.compare_exchange_strong(expected, env_enabled() ? 1 : 0);
    v = g_enabled.load();
  }
  return v == 1;
}

void set_enabled(bool on) { g_enabled.store(on ? 1 : 0); }

bool writes_overlap_reads(const FusionKey& f, const NjParams& p) {
  const int64_t last = (p.N - 1) * p.stride_n + (p.C - 1) * p.stride_c + (p.spatial - 1) * p.stride_s;
  const int64_t tensor = (last + 1) * dtype_size(f.dtype);
  const int64_t per_channel = p.C * int64_t(sizeof(float));
  const int64_t per_instance = p.N * p.C * int64_t(sizeof(float));
  const int64_t params = p.C * dtype_size(f.weight_dtype);
  std::vector<Range> writes, reads{range_of(p.x, tensor)};
  if (f.residual) reads.push_back(range_of(p.residual, tensor));
  if (f.affine) reads.push_back(range_of(p.weight, params)), reads.push_back(range_of(p.bias, params));
  writes.push_back(range_of(p.y, tensor));  // y, or dx in the backward
  if (f.direction == Direction::forward) {
    if (f.save)
      writes.push_back(range_of(p.save_mean, per_instance)), writes.push_back(range_of(p.save_rstd, per_instance));
    if (!f.train)
      reads.push_back(range_of(p.running_mean, per_channel)), reads.push_back(range_of(p.running_var, per_channel));
  } else {
    reads.push_back(range_of(p.dy, tensor));
    reads.push_back(range_of(p.save_mean, per_instance));
    reads.push_back(range_of(p.save_rstd, per_instance));
    writes.push_back(range_of(p.dresidual, tensor));
    writes.push_back(range_of(p.dweight, per_channel));
    writes.push_back(range_of(p.dbias, per_channel));
  }
  for (const Range& w : writes)
    for (const Range& r : reads)
      if (overlap(w, r)) return true;
  return false;
}

Choice choose(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev, Policy policy, const NjParams& params,
              void* stream, const LaunchFn& launch) {
  const std::vector<Launch> candidates = candidate_launches(f, s, dev, policy);
  const Launch& fallback = candidates.front();
  if (candidates.size() == 1) return {fallback, true};  // nothing to choose from

  compile::DiskCache& global = compile::DiskCache::global();
  compile::DiskCache* disk = global.enabled() ? &global : nullptr;
  const std::string key = record_key(f, s, dev, policy);
  auto loaded = [&](const Launch& l) {
    stats::counters().autotune_records_loaded++;
    log::line(log::autotune, "autotune: record for " + what(key) + ": " + launch_text(l));
    return Choice{l, true};
  };

  // During CUDA-graph capture nothing may be timed (or synchronised, or allocated), and nothing
  // may be compiled: a stored choice is used only when its kernel is loaded already.
  const auto& cu = driver::cuda_driver();
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  const bool capturing = cu.cuStreamIsCapturing(static_cast<CUstream>(stream), &status) != CUDA_SUCCESS ||
                         status != CU_STREAM_CAPTURE_STATUS_NONE;
  const auto hit = load_choice(disk, key, candidates);
  if (hit && (!capturing || kernel_loaded(f, hit->config, s.device))) return loaded(*hit);
  if (capturing) {
    log::line(log::autotune, "autotune: stream is being captured into a CUDA graph: default launch for " + what(key) +
                                 ", tuned on the first call outside capture");
    return {fallback, false};
  }
  if (writes_overlap_reads(f, params)) {
    log::line(log::autotune,
              "autotune: " + what(key) + " is in place (outputs overlap inputs): not timed, default launch");
    return {fallback, true};
  }

  std::lock_guard<std::mutex> lock(g_search_mutex);
  if (const auto again = load_choice(disk, key, candidates)) return loaded(*again);  // searched while we waited
  Timing timing;
  size_t chosen = 0;
  try {
    chosen = search(f, candidates, params, stream, launch, &timing);
  } catch (const Error& e) {
    // Tuning is an optimisation: a failure (out of memory for the scratch buffer, say) must not
    // fail the call. Said once per shape class, which keeps the default for this process.
    log::warn("autotune of " + what(key) + " failed, using the default launch: " + e.what());
    return {fallback, true};
  }
  stats::counters().autotune_searches++;
  store_choice(disk, key, candidates[chosen], timing);
  return {candidates[chosen], true};
}

}  // namespace normjit::autotune
