// What the kernels of a U-Net's first training step cost NVRTC, one at a time or in parallel
// (CPU only; issue 6, the empty-disk-cache cold start).
//
// The kernels are the ones `normjit explain` predicts for the nnU-Net ladder at a patch (batch 2,
// fp16 under autocast, fp32 affine, fused leaky_relu): forward kernels in the order the forward
// meets them, then the backward kernels. Each is compiled with NVRTC without any cache:
//   serial    one after another on the main thread (what a lazy first step does)
//   thread    one after another on one std::thread
//   parallel  J std::threads taking kernels from a shared counter (what normjit.warmup does)
//   step      a lazy first training step through the runtime's compile path (compile_kernel, no
//             disk cache): each forward call compiles its new kernel, then each backward call
//   step-prefetch  the same with the runtime's prefetch: each forward call first queues its
//             backward kernel for the background threads (runtime/prefetch.h)
//   step-ladder  step-prefetch plus the ladder: a forward call that compiles also queues the
//             kernels of the stages after it (prefetch_ladder), as the runtime does
// NVRTC's use of the driver's compute cache is switched off (CUDA_CACHE_DISABLE=1, unless set).
// Before them a trivial program is compiled twice: the difference is NVRTC's one-time start-up.
// Each compile reports its wall time and the CPU time of its thread (NVRTC compiles on the calling
// thread): wall >> CPU means the compile waited (for a core, a lock, the driver), not worked.
// With --minimal every kernel is compiled again with -minimal and the cubins are compared. With
// --ptxas-info every compile also gets -Xptxas=-v, and each kernel's registers, spill stores and
// stack frame are printed beside its time (an option that compiles faster may spill).
// With --context (GPU machines) every compiling thread first makes GPU 0's primary context current,
// as it is on the thread of a PyTorch training step: NVRTC calls into libcuda (cuInit, and the
// driver's tools callbacks around each nvrtcCreateProgram/nvrtcCompileProgram).
//   build/normjit_cold_compile_bench [--layout ncdhw|ndhwc] [--patch 128] [--arch 90]
//                                    [--mode serial|thread|parallel|step|step-prefetch|step-ladder] [--jobs J]
//                                    [--minimal] [--ptxas-info]
//                                    [--context] [--no-prime]
//                                    [--option O]... (an extra NVRTC option for every kernel, e.g.
//                                    -Ofc=min) [--dump DIR] (write each kernel's source)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "codegen/codegen.h"
#include "compile/compiler.h"
#include "explain.h"
#include "ptxas_report.h"
#include "runtime/device.h"
#include "runtime/kernel_cache.h"
#include "runtime/prefetch.h"
#include "runtime/stats.h"

using namespace normjit;

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

struct Item {
  std::string name, tier;
  Direction direction = Direction::forward;
  compile::CompileRequest req;
  double ms = 0, cpu_ms = 0, minimal_ms = 0;
  std::vector<char> cubin, minimal_cubin;
  std::string log;  // NVRTC's program log (ptxas' report with --ptxas-info)
};

double compile_ms(compile::CompileRequest req, std::vector<char>* cubin, double* cpu_ms = nullptr,
                  std::string* log = nullptr) {
  double ms = 0;
  std::vector<char> out = compile::nvrtc_compile(req, &ms, cpu_ms, log);
  if (cubin) *cubin = std::move(out);
  return ms;
}

// The compiles of a lazy first step (modes step and step-prefetch). explain_calls lists each shape's
// forward call, then its backward call; the backward pass meets the shapes in the same order.
int lazy_step(const std::vector<tools::ExplainCall>& calls, int arch, bool prefetch, bool ladder) {
  if (prefetch) set_prefetch_default(true);
  DeviceState dev;  // for prefetch_ladder: nothing is ever loaded on it
  dev.ordinal = 0;
  dev.profile = builtin_profile("H200");
  dev.profile.arch = arch;
  const uint64_t compiles0 = stats::counters().compiles;
  const auto start = Clock::now();
  for (size_t i = 0; i < calls.size(); ++i) {
    const tools::ExplainCall& c = calls[i];
    if (c.empty || c.direction != Direction::forward) continue;
    const bool bwd_next = i + 1 < calls.size() && calls[i + 1].direction == Direction::backward;
    if (prefetch && bwd_next && calls[i + 1].new_kernel)  // what the hook queues: a kernel not loaded yet
      prefetch_compile(calls[i + 1].fusion, calls[i + 1].config, arch, -1, nullptr);
    if (ladder && c.new_kernel) prefetch_ladder(c.fusion, c.key, c.config, dev);
    if (c.new_kernel) compile_kernel(c.fusion, c.config, arch, nullptr);
  }
  const double forward_ms = ms_since(start);
  const auto backward_start = Clock::now();
  for (const tools::ExplainCall& c : calls)
    if (!c.empty && c.direction == Direction::backward && c.new_kernel)
      compile_kernel(c.fusion, c.config, arch, nullptr);
  const double backward_ms = ms_since(backward_start);
  prefetch_wait_idle();  // a queued job whose call came first is counted once the thread reaches it
  const PrefetchCounters p = prefetch_counters();
  std::printf(
      "forward calls %.1f ms, then backward calls %.1f ms: %.1f ms of compiling in the step (%llu NVRTC "
      "compiles; background: %llu queued, %llu compiled, %llu found compiled by their call)\n",
      forward_ms, backward_ms, forward_ms + backward_ms,
      static_cast<unsigned long long>(stats::counters().compiles - compiles0),
      static_cast<unsigned long long>(p.queued), static_cast<unsigned long long>(p.compiled),
      static_cast<unsigned long long>(p.unneeded));
  if (ladder) std::printf("the ladder queued %llu of them\n", static_cast<unsigned long long>(p.ladder));
  prefetch_shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // NVRTC 12.9+ keeps its outputs in the driver's compute cache whenever it finds libcuda (a GPU
  // machine), so a second run of this bench would time cache hits (~30 ms a kernel on the H200
  // machine instead of 0.4-0.8 s). Off unless the caller set CUDA_CACHE_DISABLE itself.
  setenv("CUDA_CACHE_DISABLE", "1", /*overwrite=*/0);
  tools::ExplainOptions o;
  o.activation = Activation::leaky_relu;
  int patch = 128, arch = 90, jobs = int(std::max(1u, std::thread::hardware_concurrency()));
  std::string mode = "serial";
  bool minimal = false, prime = true, context = false, ptxas_info = false;
  std::vector<std::string> extra_options;
  std::string dump_dir;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--layout")
      o.layout = next() == "ndhwc" ? Layout::ndhwc : Layout::ncdhw;
    else if (a == "--patch")
      patch = std::atoi(next().c_str());
    else if (a == "--arch")
      arch = std::atoi(next().c_str());
    else if (a == "--mode")
      mode = next();
    else if (a == "--jobs")
      jobs = std::atoi(next().c_str());
    else if (a == "--minimal")
      minimal = true;
    else if (a == "--ptxas-info")
      ptxas_info = true;
    else if (a == "--no-prime")
      prime = false;
    else if (a == "--context")
      context = true;
    else if (a == "--option")
      extra_options.push_back(next());
    else if (a == "--dump")
      dump_dir = next();
    else {
      std::fprintf(stderr, "unknown argument %s (see the comment at the top of bench/cold_compile_bench.cpp)\n",
                   a.c_str());
      return 2;
    }
  }
  // nnU-Net's PlainConvUNet (bench/bench_unet.py): 6 stages, features 32..320, stride 2 below.
  const int features[] = {32, 64, 128, 256, 320, 320};
  std::vector<tools::Shape> shapes;
  for (int s = 0; s < 6; ++s) {
    const int64_t p = patch >> s;
    if (p >= 2) shapes.push_back({2, features[s], p, p, p});  // a training norm needs 2+ elements
  }
  const std::vector<tools::ExplainCall> calls = tools::explain_calls(shapes, o);

  // Forward kernels first (the forward pass), then backward ones, as a lazy first step meets them.
  std::vector<Item> items;
  for (Direction d : {Direction::forward, Direction::backward})
    for (const tools::ExplainCall& c : calls) {
      if (c.empty || !c.new_kernel || c.direction != d) continue;
      Item it;
      it.req = compile_request(c.fusion, c.config, arch);  // what the runtime compiles
      it.name = it.req.name;
      it.tier = c.launch.tier;
      it.direction = d;
      it.req.options = extra_options;
      if (ptxas_info) it.req.options.push_back("-Xptxas=-v");
      if (!dump_dir.empty()) std::ofstream(dump_dir + "/" + it.name + ".cu") << it.req.source;
      items.push_back(std::move(it));
    }

  std::printf("patch %d, %s, sm_%d, mode %s%s%s, %zu kernels\n", patch, layout_name(o.layout), arch, mode.c_str(),
              mode == "parallel" ? (", jobs " + std::to_string(jobs)).c_str() : "",
              context ? ", GPU 0's context current" : "", items.size());
  if (prime) {
    compile::CompileRequest trivial;
    trivial.name = "trivial";
    trivial.source = "extern \"C\" __global__ void k(float* p) { p[threadIdx.x] = 1.f; }\n";
    trivial.arch = arch;
    const double first = compile_ms(trivial, nullptr), second = compile_ms(trivial, nullptr);
    std::printf("trivial program: first compile %.1f ms, second %.1f ms (NVRTC start-up ~%.1f ms)\n", first, second,
                first - second);
  }

  if (mode == "step-ladder") setenv("NORMJIT_DISABLE_DISK_CACHE", "1", 1);  // the ladder's disk check: none
  if (mode == "step" || mode == "step-prefetch" || mode == "step-ladder")
    return lazy_step(calls, arch, mode != "step", mode == "step-ladder");
  if (context) {
    try {
      device_state(0);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "--context needs GPU 0: %s\n", e.what());
      return 1;
    }
  }

  const auto start = Clock::now();
  std::atomic<int> next{0};
  auto worker = [&] {
    if (context) make_current(device_state(0));
    for (int i = next++; i < int(items.size()); i = next++) {
      Item& it = items[size_t(i)];
      it.ms = compile_ms(it.req, &it.cubin, &it.cpu_ms, &it.log);
    }
  };
  if (mode == "serial") {
    worker();
  } else if (mode == "thread") {
    std::thread(worker).join();
  } else if (mode == "parallel") {
    std::vector<std::thread> threads;
    for (int t = 0; t < jobs; ++t) threads.emplace_back(worker);
    for (std::thread& t : threads) t.join();
  } else {
    std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
  }
  const double wall = ms_since(start);

  if (minimal)
    for (Item& it : items) {
      compile::CompileRequest r = it.req;
      r.options = {"-minimal"};
      it.minimal_ms = compile_ms(r, &it.minimal_cubin);
    }

  double sum = 0, sum_cpu = 0, sum_minimal = 0;
  std::printf("%-4s %-62s %-24s %9s %7s%s%s\n", "dir", "kernel", "tier", "NVRTC ms", "CPU ms",
              ptxas_info ? "  regs  spill B  stack B" : "", minimal ? "  -minimal ms  same cubin" : "");
  for (const Item& it : items) {
    sum += it.ms, sum_cpu += it.cpu_ms, sum_minimal += it.minimal_ms;
    std::printf("%-4s %-62s %-24.24s %9.1f %7.1f", it.direction == Direction::forward ? "fwd" : "bwd", it.name.c_str(),
                it.tier.c_str(), it.ms, it.cpu_ms);
    if (ptxas_info) {
      const tools::PtxasReport r = tools::parse_ptxas_report(it.log);
      if (r.found)
        std::printf("  %4d  %7d  %7d", r.registers, r.spill_store_bytes, r.stack_frame_bytes);
      else
        std::printf("  %22s", "no ptxas report");
    }
    if (minimal) std::printf("  %11.1f  %s", it.minimal_ms, it.cubin == it.minimal_cubin ? "yes" : "NO");
    std::printf("\n");
  }
  std::printf("sum of NVRTC ms %.1f (%.1f per kernel; CPU %.1f ms), wall %.1f ms", sum,
              sum / double(std::max<size_t>(1, items.size())), sum_cpu, wall);
  if (minimal) std::printf("; -minimal sum %.1f ms", sum_minimal);
  std::printf("\n");
  return 0;
}
