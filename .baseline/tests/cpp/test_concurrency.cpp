// Many threads at once on the compile path (no GPU needed): one compile per kernel key, shared by
// every waiting caller; different keys in parallel; key building and heuristics from many threads.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "driver/nvrtc.h"
#include "runtime/call_keys.h"
#include "runtime/kernel_cache.h"
#include "runtime/stats.h"
#include "schedule/heuristics.h"

namespace normjit {
namespace {

bool have_nvrtc() {
  std::string why;
  return driver::try_nvrtc(&why) != nullptr;
}

TEST(Concurrency, SameKeyCompilesOnceAndIsShared) {
  if (!have_nvrtc()) GTEST_SKIP() << "NVRTC not loadable: skipped";
  // A fusion no other test uses, so the counters below belong to this test alone.
  const FusionKey f = make_fusion(Direction::forward, DType::bf16, DType::bf16, Layout::ncdhw, true, true, true,
                                  false, false, Activation::sigmoid);
  const KernelConfig c = make_config(256, 8, 2, 1, 4, true, true);
  // Without a disk cache every caller would need NVRTC; sharing leaves exactly one compile.
  const uint64_t before = stats::counters().compiles;
  std::vector<std::thread> threads;
  std::vector<size_t> sizes(8);
  std::atomic<int> ready{0};
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      ready++;
      while (ready.load() < 8) std::this_thread::yield();  // start together
      sizes[t] = compile_kernel(f, c, 90, nullptr).cubin.size();
    });
  for (auto& th : threads) th.join();
  const uint64_t after = stats::counters().compiles;
  EXPECT_EQ(after - before, 1u) << "eight concurrent callers of one key must share one compile";
  for (size_t s : sizes) EXPECT_EQ(s, sizes[0]);
  EXPECT_GT(sizes[0], 0u);
  EXPECT_EQ(compile_slots_in_use(), 0u) << "every caller has its cubin: the shared one must be released";
}

TEST(Concurrency, FailedCompileReleasesItsSlot) {
  if (!have_nvrtc()) GTEST_SKIP() << "NVRTC not loadable: skipped";
  // sm_1 is no architecture: NVRTC rejects the option at once. Every waiter retries and fails.
  const FusionKey f = make_fusion(Direction::forward, DType::f32, DType::f32, Layout::ncdhw, true, false, false,
                                  false, false, Activation::identity);
  const KernelConfig c = make_config(256, 8, 2, 1, 4, true, true);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      try {
        compile_kernel(f, c, 1, nullptr);
      } catch (const Error&) {
        failures++;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 4);
  EXPECT_EQ(compile_slots_in_use(), 0u);
}

TEST(Concurrency, MixedShapesFromManyThreads) {
  // Key building and heuristics are pure: many threads with mixed shapes must agree with a
  // single-threaded run of the same calls.
  std::mt19937 rng(11);
  std::vector<std::vector<int64_t>> shapes;
  for (int i = 0; i < 400; ++i)
    shapes.push_back({1 + int64_t(rng() % 4), 1 + int64_t(rng() % 320), 1 + int64_t(rng() % 97),
                      2 + int64_t(rng() % 61), 1 + int64_t(rng() % 13)});
  auto plan_of = [](const std::vector<int64_t>& shape) {
    ForwardArgs a;
    a.x = contiguous_tensor(reinterpret_cast<void*>(0x10000), DType::f16, shape);
    a.y = contiguous_tensor(reinterpret_cast<void*>(0x20000), DType::f16, shape);
    const CallKeys k = forward_keys(a);
    return kernel_name(k.fusion, choose_launch(k.fusion, k.shape, builtin_profile("H200"), Policy::bounded).config);
  };
  std::vector<std::string> expected;
  for (const auto& s : shapes) expected.push_back(plan_of(s));
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      for (size_t i = t; i < shapes.size() * 4; i += 8)
        if (plan_of(shapes[i % shapes.size()]) != expected[i % shapes.size()]) mismatches++;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(Concurrency, DifferentKeysCompileConcurrently) {
  // Six threads, three keys: every thread gets a cubin, and threads that asked for the same key
  // get the same binary (compiled once, or read back from the disk cache).
  if (!have_nvrtc()) GTEST_SKIP() << "NVRTC not loadable: skipped";
  const FusionKey f = make_fusion(Direction::backward, DType::bf16, DType::bf16, Layout::ncdhw, true, true, true,
                                  false, false, Activation::tanh);
  const std::vector<KernelConfig> configs = {make_config(256, 8, 2, 1, 2, true, true),
                                             make_config(256, 32, 2, 1, 2, true, true),
                                             make_config(128, 128, 2, 1, 4, true, true)};
  std::vector<std::vector<char>> cubins(6);
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t)
    threads.emplace_back([&, t] { cubins[t] = compile_kernel(f, configs[t % configs.size()], 80).cubin; });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 6; ++t) {
    EXPECT_FALSE(cubins[t].empty()) << "thread " << t;
    EXPECT_EQ(cubins[t], cubins[t % configs.size()]) << "thread " << t << " and thread " << t % configs.size();
  }
  EXPECT_NE(cubins[0], cubins[1]);
  EXPECT_NE(cubins[1], cubins[2]);
  EXPECT_EQ(compile_slots_in_use(), 0u) << "no cubin kept once every caller has returned";
}

}  // namespace
}  // namespace normjit
