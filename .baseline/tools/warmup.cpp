#include "warmup.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <mutex>
#include <thread>

#include "runtime/kernel_cache.h"

namespace normjit::tools {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

class Progress {
 public:
  Progress(bool enabled, int total) : enabled_(enabled && total > 0), tty_(isatty(STDERR_FILENO)), total_(total) {}

  void done(const WarmupKernel& k) {
    if (!enabled_) return;
    std::lock_guard<std::mutex> lock(mutex_);
    ++count_;
    const char* what = !k.error.empty() ? "FAILED" : k.from_disk ? "disk" : "compiled";
    if (tty_) {
      constexpr int kWidth = 30;
      const int filled = count_ * kWidth / total_;
      std::fprintf(stderr, "\r\033[K[%.*s%*s] %d/%d %s %s", filled, "##############################", kWidth - filled,
                   "", count_, total_, what, k.name.c_str());
      if (count_ == total_) std::fputc('\n', stderr);
    } else {
      std::fprintf(stderr, "[%d/%d] %-8s %8.1f ms  %s\n", count_, total_, what, k.ms, k.name.c_str());
    }
    std::fflush(stderr);
  }

 private:
  bool enabled_, tty_;
  int total_, count_ = 0;
  std::mutex mutex_;
};

}  // namespace

WarmupSummary warmup_kernels(const std::vector<std::pair<FusionKey, KernelConfig>>& kernels, int arch, int jobs,
                             bool progress) {
  WarmupSummary summary;
  for (const auto& [f, c] : kernels) {
    const bool dup = std::any_of(summary.results.begin(), summary.results.end(), [&](const WarmupKernel& k) {
      return bytes_equal(k.fusion, f) && bytes_equal(k.config, c);
    });
    if (dup) continue;
    WarmupKernel k;
    k.fusion = f;
    k.config = c;
    k.name = kernel_name(f, c);
    summary.results.push_back(std::move(k));
  }
  summary.kernels = int(summary.results.size());
  if (jobs <= 0) jobs = int(std::max(1u, std::thread::hardware_concurrency()));
  jobs = std::min(jobs, std::max(1, summary.kernels));

  Progress bar(progress, summary.kernels);
  std::atomic<int> next{0};
  const auto start = Clock::now();
  auto worker = [&] {
    for (int i = next++; i < summary.kernels; i = next++) {
      WarmupKernel& k = summary.results[size_t(i)];
      const auto t0 = Clock::now();
      try {
        const compile::CompileResult r = compile_kernel(k.fusion, k.config, arch);
        k.from_disk = r.from_disk;
      } catch (const std::exception& e) {
        k.error = e.what();
      }
      k.ms = ms_since(t0);
      bar.done(k);
    }
  };
  std::vector<std::thread> threads;
  for (int t = 1; t < jobs; ++t) threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads) t.join();
  summary.seconds = ms_since(start) / 1000.0;

  for (const WarmupKernel& k : summary.results) {
    if (!k.error.empty())
      ++summary.failed;
    else if (k.from_disk)
      ++summary.from_disk;
    else
      ++summary.compiled;
    if (k.ms > summary.slowest_ms) summary.slowest_ms = k.ms, summary.slowest = k.name;
  }
  return summary;
}

}  // namespace normjit::tools
