// Host time of normjit's L1 hit path, on the CPU (no GPU needed): validation, FusionKey/ShapeKey
// building, the plan-cache lookup and argument packing — everything a cached call does except
// cuCtxGetCurrent and cuLaunchKernel themselves. Target: <= 0.3 us.
//   build/normjit_host_bench --benchmark_min_time=0.5s
#include <benchmark/benchmark.h>

#include "kernels/params.h"
#include "normjit/normjit.h"
#include "runtime/call_keys.h"
#include "runtime/sync_workspace.h"
#include "schedule/device_profile.h"
#include "schedule/heuristics.h"

namespace normjit {
void plant_plan_for_benchmark(const FusionKey& f, const ShapeKey& s);
void forward_host_path_for_benchmark(const ForwardArgs& a, void* params_out);
}  // namespace normjit

static void BM_L1HitForward(benchmark::State& state) {
  using namespace normjit;
  ForwardArgs a;
  a.x = contiguous_tensor(reinterpret_cast<void*>(0x100000), DType::f16, {2, 320, 4, 4, 4});
  a.y = contiguous_tensor(reinterpret_cast<void*>(0x200000), DType::f16, {2, 320, 4, 4, 4});
  a.weight = contiguous_tensor(reinterpret_cast<void*>(0x300000), DType::f32, {320});
  a.bias = contiguous_tensor(reinterpret_cast<void*>(0x400000), DType::f32, {320});
  a.save_mean = reinterpret_cast<float*>(0x500000);
  a.save_rstd = reinterpret_cast<float*>(0x600000);
  const CallKeys k = forward_keys(a);
  plant_plan_for_benchmark(k.fusion, k.shape);
  NjParams p{};
  for (auto _ : state) {
    forward_host_path_for_benchmark(a, &p);
    benchmark::DoNotOptimize(p);
  }
}
BENCHMARK(BM_L1HitForward);

static void BM_KeysOnly(benchmark::State& state) {
  using namespace normjit;
  ForwardArgs a;
  a.x = contiguous_tensor(reinterpret_cast<void*>(0x100000), DType::f16, {2, 32, 128, 128, 128});
  a.y = contiguous_tensor(reinterpret_cast<void*>(0x200000), DType::f16, {2, 32, 128, 128, 128});
  for (auto _ : state) benchmark::DoNotOptimize(forward_keys(a));
}
BENCHMARK(BM_KeysOnly);

// The heuristics on a plan miss (choose_launch: the first call of a shape class, before its
// kernel is compiled or loaded), for a channels-last deep stage and a big NCDHW volume. Session
// 24: 0.2-0.4 us on this workplace's CPU, so the helpers it calls more than once (the geometry,
// the ring's capacity) are not worth caching.
static void BM_ChooseLaunchPlanMiss(benchmark::State& state) {
  using namespace normjit;
  const bool channels_last = state.range(0) != 0;
  const std::vector<int64_t> shape = channels_last ? std::vector<int64_t>{2, 320, 8, 8, 8}
                                                   : std::vector<int64_t>{2, 32, 128, 128, 128};
  ForwardArgs a;
  auto tensor = channels_last ? channels_last_tensor : contiguous_tensor;
  a.x = tensor(reinterpret_cast<void*>(0x100000), DType::f16, shape);
  a.y = tensor(reinterpret_cast<void*>(0x200000), DType::f16, shape);
  a.weight = contiguous_tensor(reinterpret_cast<void*>(0x300000), DType::f32, {shape[1]});
  a.bias = contiguous_tensor(reinterpret_cast<void*>(0x400000), DType::f32, {shape[1]});
  a.save_mean = reinterpret_cast<float*>(0x500000);
  a.save_rstd = reinterpret_cast<float*>(0x600000);
  const CallKeys k = forward_keys(a);
  const DeviceProfile dev = builtin_profile("H100");
  for (auto _ : state) benchmark::DoNotOptimize(choose_launch(k.fusion, k.shape, dev, Policy::bounded));
}
BENCHMARK(BM_ChooseLaunchPlanMiss)->Arg(0)->Arg(1);

// get_workspace when the stream's buffer fits, as on every affine backward and running-stats
// forward call: no lock, so threads launching on their own streams do not contend. A fake
// allocator stands in for the device on the one grow.
static uint64_t fake_workspace_allocate(int, void*, size_t) { return 0x10000000; }
static void BM_WorkspaceHit(benchmark::State& state) {
  using namespace normjit;
  set_workspace_allocator_for_tests(fake_workspace_allocate);
  void* stream = reinterpret_cast<void*>(uintptr_t(0x1000 + 16 * state.thread_index()));
  for (auto _ : state) benchmark::DoNotOptimize(get_workspace(60, stream, 64, 4096, 0));
}
BENCHMARK(BM_WorkspaceHit)->Threads(1)->Threads(2);

BENCHMARK_MAIN();
