// Compiling a training forward's backward kernel in the background (runtime/prefetch.h), on the
// compile path only (no GPU): the prediction matches what the backward call selects, the cubin
// reaches the disk cache (or, without one, the backward call) with exactly one compile, concurrent
// callers share it, failures are retried by the call, and exit and fork stay clean.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "compile/compiler.h"
#include "compile/disk_cache.h"
#include "driver/cuda_driver.h"
#include "driver/nvrtc.h"
#include "runtime/call_keys.h"
#include "runtime/kernel_cache.h"
#include "runtime/prefetch.h"
#include "runtime/stats.h"
#include "schedule/heuristics.h"
#include "test_helpers.h"

namespace normjit {
namespace {

using normjit_test::TempDir;

bool have_nvrtc() {
  std::string why;
  return driver::try_nvrtc(&why) != nullptr;
}
// Prefetch is off by default in the C++ core (prefetch.h); these tests turn it on, as the Python
// package does.
struct PrefetchOn {
  PrefetchOn() { set_prefetch_default(true); }
  ~PrefetchOn() { set_prefetch_default(false); }
};
#define REQUIRE_NVRTC()                                             \
  if (!have_nvrtc()) GTEST_SKIP() << "NVRTC not loadable: skipped"; \
  const PrefetchOn prefetch_on
// Whether a CUDA driver loads here: then NVRTC calls into it, and an exit during a background
// compile hangs in the driver's teardown (seen on the H200 machine), so a program must call
// prefetch_shutdown() before it exits.
bool have_cuda_driver() {
  std::string why;
  return driver::try_cuda_driver(&why) != nullptr;
}

void* fake(int i) { return reinterpret_cast<void*>(uintptr_t(i) << 32); }  // 256-byte aligned, distinct

TensorArg like_x(int i, DType dt, const std::vector<int64_t>& sizes, Layout layout) {
  return layout == Layout::ncdhw ? contiguous_tensor(fake(i), dt, sizes) : channels_last_tensor(fake(i), dt, sizes);
}

struct Call {
  std::vector<int64_t> sizes;
  DType dtype = DType::f16;
  Layout layout = Layout::ncdhw;
  bool affine = true, residual = false;
  Activation act = Activation::leaky_relu;
};

// The training forward of a call, as the PyTorch operator builds it (statistics saved).
CallKeys forward_of(const Call& c) {
  ForwardArgs a;
  a.x = like_x(1, c.dtype, c.sizes, c.layout);
  a.y = like_x(2, c.dtype, c.sizes, c.layout);
  if (c.affine) {
    a.weight = contiguous_tensor(fake(3), DType::f32, {c.sizes[1]});
    a.bias = contiguous_tensor(fake(4), DType::f32, {c.sizes[1]});
  }
  if (c.residual) a.residual = like_x(5, c.dtype, c.sizes, c.layout);
  a.save_mean = static_cast<float*>(fake(6));
  a.save_rstd = static_cast<float*>(fake(7));
  a.activation = c.act;
  return forward_keys(a);
}

CallKeys backward_of(const Call& c) {
  BackwardArgs a;
  a.x = like_x(1, c.dtype, c.sizes, c.layout);
  a.dy = like_x(8, c.dtype, c.sizes, c.layout);
  a.dx = like_x(9, c.dtype, c.sizes, c.layout);
  if (c.affine) {
    a.weight = contiguous_tensor(fake(3), DType::f32, {c.sizes[1]});
    a.bias = contiguous_tensor(fake(4), DType::f32, {c.sizes[1]});
    a.dweight = static_cast<float*>(fake(10));
    a.dbias = static_cast<float*>(fake(11));
  }
  if (c.residual)
    a.residual = like_x(5, c.dtype, c.sizes, c.layout), a.dresidual = like_x(12, c.dtype, c.sizes, c.layout);
  a.save_mean = static_cast<float*>(fake(6));
  a.save_rstd = static_cast<float*>(fake(7));
  a.activation = c.act;
  return backward_keys(a);
}

// The backward kernel prefetch predicts for the call's forward (it must have one).
std::pair<FusionKey, KernelConfig> predicted(const Call& c) {
  const CallKeys f = forward_of(c);
  const auto k = backward_kernel_of(f.fusion, f.shape, builtin_profile("H200"));
  if (!k) throw std::runtime_error("no backward predicted");
  return *k;
}

// A DeviceState for the hook without a GPU: the H200 profile, device 0 (nothing is loaded there).
DeviceState h200_state() {
  DeviceState d;
  d.ordinal = 0;
  d.profile = builtin_profile("H200");
  return d;
}

// A directory shared by a death test and its child. The child (threadsafe style) runs the test again
// from the start: it finds the parent's directory in the environment instead of making its own.
class DeathTestDir {
 public:
  explicit DeathTestDir(const char* var) : var_(var) {
    if (const char* p = std::getenv(var)) {
      path_ = p;
      return;
    }
    own_.emplace();
    path_ = own_->path();
    setenv(var, path_.c_str(), 1);
  }
  ~DeathTestDir() {
    if (own_) unsetenv(var_);
  }
  const std::string& path() const { return path_; }

 private:
  const char* var_;
  std::optional<TempDir> own_;
  std::string path_;
};

size_t entries_named(compile::DiskCache& cache, const std::string& name) {
  size_t n = 0;
  for (const auto& e : cache.list()) n += e.valid && compile::disk_key_field(e.key, "name") == name;
  return n;
}

TEST(Prefetch, PredictsTheKernelTheBackwardCallSelects) {
  // The U-Net ladder in both layouts, and fusions with residual, other activations and dtypes.
  std::vector<Call> calls;
  for (Layout layout : {Layout::ncdhw, Layout::ndhwc})
    for (auto [c, s] : {std::pair{32, 128}, {64, 64}, {128, 32}, {256, 16}, {320, 8}, {320, 4}})
      calls.push_back({{2, c, s, s, s}, DType::f16, layout});
  calls.push_back({{2, 32, 40, 56, 48}, DType::bf16, Layout::ncdhw, true, true, Activation::silu});
  calls.push_back({{1, 64, 24, 24, 24}, DType::f32, Layout::ndhwc, false, true, Activation::gelu_erf});
  calls.push_back({{3, 20, 7, 9, 11}, DType::f16, Layout::ncdhw, true, false, Activation::identity});
  for (const Call& c : calls) {
    const auto [pf, pc] = predicted(c);
    const CallKeys b = backward_of(c);
    const KernelConfig real = choose_launch(b.fusion, b.shape, builtin_profile("H200"), policy_from_env()).config;
    EXPECT_EQ(kernel_name(pf, pc), kernel_name(b.fusion, real));
    EXPECT_TRUE(bytes_equal(pf, b.fusion)) << describe(pf) << " vs " << describe(b.fusion);
  }
}

TEST(Prefetch, OnlyATrainingForwardThatSavesHasABackward) {
  const Call c{{2, 32, 16, 16, 16}};
  const CallKeys f = forward_of(c);
  FusionKey no_save = f.fusion;
  no_save.save = false;
  FusionKey eval = f.fusion;
  eval.train = false, eval.save = false;
  const DeviceProfile dev = builtin_profile("H200");
  EXPECT_TRUE(backward_kernel_of(f.fusion, f.shape, dev).has_value());
  EXPECT_FALSE(backward_kernel_of(no_save, f.shape, dev).has_value());
  EXPECT_FALSE(backward_kernel_of(eval, f.shape, dev).has_value());
  const auto b = backward_kernel_of(f.fusion, f.shape, dev);
  EXPECT_FALSE(backward_kernel_of(b->first, f.shape, dev).has_value()) << "a backward has no backward";
}

TEST(Prefetch, CompilesIntoTheDiskCacheAndHandsTheCubinToItsCall) {
  REQUIRE_NVRTC();
  TempDir dir;
  compile::DiskCache cache(dir.path());
  const auto [f, c] = predicted({{2, 256, 16, 16, 16}, DType::bf16, Layout::ncdhw, true, false, Activation::tanh});
  const uint64_t compiles = stats::counters().compiles;
  const PrefetchCounters before = prefetch_counters();
  ASSERT_TRUE(prefetch_compile(f, c, 90, -1, &cache));
  EXPECT_FALSE(prefetch_compile(f, c, 90, -1, &cache)) << "a key already queued is not queued twice";
  prefetch_wait_idle();
  EXPECT_EQ(prefetch_counters().compiled - before.compiled, 1u);
  EXPECT_EQ(stats::counters().compiles - compiles, 1u);
  EXPECT_EQ(entries_named(cache, kernel_name(f, c)), 1u) << "the background compile must store the cubin";
  EXPECT_EQ(compile_slots_in_use(), 1u) << "the cubin is kept for the call it was compiled for";

  // The call: takes the cubin compiled ahead, no second compile and no disk read.
  const compile::CompileResult r = compile_kernel(f, c, 90, &cache);
  EXPECT_FALSE(r.cubin.empty());
  EXPECT_FALSE(r.from_disk);
  EXPECT_EQ(stats::counters().compiles - compiles, 1u);
  EXPECT_EQ(compile_slots_in_use(), 0u) << "once its call has it, nothing is kept";
  // A later call of the key (another device of the arch) reads the same bytes from disk.
  const compile::CompileResult again = compile_kernel(f, c, 90, &cache);
  EXPECT_TRUE(again.from_disk);
  EXPECT_EQ(again.cubin, r.cubin);
  // Now on disk: its next first call reads it in ~0.2 ms, so nothing is queued for it.
  EXPECT_FALSE(prefetch_compile(f, c, 90, -1, &cache));
  EXPECT_EQ(compile_slots_in_use(), 0u);
}

TEST(Prefetch, WithoutADiskCacheTheCubinStillReachesItsCall) {
  REQUIRE_NVRTC();
  const auto [f, c] = predicted({{2, 128, 8, 8, 8}, DType::bf16, Layout::ncdhw, true, true, Activation::sigmoid});
  const uint64_t compiles = stats::counters().compiles;
  ASSERT_TRUE(prefetch_compile(f, c, 90, -1, nullptr));
  prefetch_wait_idle();
  const compile::CompileResult r = compile_kernel(f, c, 90, nullptr);
  EXPECT_FALSE(r.cubin.empty());
  EXPECT_EQ(stats::counters().compiles - compiles, 1u) << "the call must not compile again";
  EXPECT_EQ(compile_slots_in_use(), 0u);
}

TEST(Prefetch, CallsDuringTheBackgroundCompileShareIt) {
  REQUIRE_NVRTC();
  const auto [f, c] = predicted({{2, 64, 12, 12, 12}, DType::bf16, Layout::ndhwc, true, false, Activation::gelu_tanh});
  const uint64_t compiles = stats::counters().compiles;
  const PrefetchCounters before = prefetch_counters();
  ASSERT_TRUE(prefetch_compile(f, c, 90, -1, nullptr));
  // Four calls arrive at once, while the background compile runs (or before it starts).
  std::vector<std::vector<char>> cubins(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([&, t] { cubins[t] = compile_kernel(f, c, 90, nullptr).cubin; });
  for (auto& t : threads) t.join();
  prefetch_wait_idle();
  EXPECT_EQ(stats::counters().compiles - compiles, 1u) << "one compile, whoever ran it";
  for (const auto& b : cubins) EXPECT_EQ(b, cubins[0]);
  EXPECT_FALSE(cubins[0].empty());
  const PrefetchCounters after = prefetch_counters();
  EXPECT_EQ((after.compiled - before.compiled) + (after.unneeded - before.unneeded), 1u);
  EXPECT_EQ(compile_slots_in_use(), 0u);
}

TEST(Prefetch, AFailedBackgroundCompileIsWarnedAndRetriedByItsCall) {
  REQUIRE_NVRTC();
  // sm_1 is no architecture: NVRTC rejects it at once.
  const auto [f, c] = predicted({{2, 32, 8, 8, 8}, DType::f32, Layout::ncdhw, false, false, Activation::relu});
  const PrefetchCounters before = prefetch_counters();
  testing::internal::CaptureStderr();
  ASSERT_TRUE(prefetch_compile(f, c, 1, -1, nullptr));
  prefetch_wait_idle();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(prefetch_counters().failed - before.failed, 1u);
  EXPECT_NE(err.find("background compile of " + kernel_name(f, c)), std::string::npos) << err;
  EXPECT_EQ(compile_slots_in_use(), 0u) << "a failed compile keeps nothing";
  EXPECT_THROW(compile_kernel(f, c, 1, nullptr), Error) << "the call compiles again and reports the error";
}

TEST(Prefetch, ClearingTheMemoryCachesDropsReservations) {
  REQUIRE_NVRTC();
  const auto [f, c] = predicted({{1, 32, 8, 8, 8}, DType::f32, Layout::ndhwc, true, true, Activation::tanh});
  ASSERT_TRUE(prefetch_compile(f, c, 90, -1, nullptr));
  prefetch_wait_idle();
  EXPECT_EQ(compile_slots_in_use(), 1u);
  clear_kernel_cache();
  EXPECT_EQ(compile_slots_in_use(), 0u);
}

// The hook as the runtime calls it, in a fresh process whose process-wide disk cache is a new
// directory (NORMJIT_CACHE_DIR is read when the cache is first used).
TEST(PrefetchDeathTest, TheForwardHookFillsTheDiskCacheWithTheBackwardKernel) {
  REQUIRE_NVRTC();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const DeathTestDir dir("NORMJIT_TEST_HOOK_DIR");
  const Call call{{2, 320, 4, 4, 4}, DType::f16, Layout::ncdhw, true, false, Activation::leaky_relu};
  const auto [bf, bc] = predicted(call);
  auto body = [&] {
    setenv("NORMJIT_CACHE_DIR", dir.path().c_str(), 1);
    const CallKeys f = forward_of(call);
    prefetch_backward(f.fusion, f.shape, h200_state());
    prefetch_backward(f.fusion, f.shape, h200_state());  // the next shape of the same kernel: queued once
    prefetch_wait_idle();
    compile::DiskCache& disk = compile::DiskCache::global();
    const bool ok = disk.dir() == dir.path() && entries_named(disk, kernel_name(bf, bc)) == 1 &&
                    prefetch_counters().queued == 1 && prefetch_counters().compiled == 1 &&
                    stats::counters().compiles == 1 && compile_slots_in_use() == 1;
    const bool handed =
        !compile_kernel(bf, bc, 90).cubin.empty() && stats::counters().compiles == 1 && compile_slots_in_use() == 0;
    std::exit(ok && handed ? 0 : 1);
  };
  EXPECT_EXIT(body(), testing::ExitedWithCode(0), "");
  compile::DiskCache cache(dir.path());
  EXPECT_EQ(entries_named(cache, kernel_name(bf, bc)), 1u) << "the child's background compile stored the cubin";
}

TEST(PrefetchDeathTest, TheHookRespectsADisabledDiskCache) {
  REQUIRE_NVRTC();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const DeathTestDir dir("NORMJIT_TEST_NODISK_DIR");
  const Call call{{2, 320, 4, 4, 4}, DType::f16, Layout::ndhwc, true, false, Activation::leaky_relu};
  const auto [bf, bc] = predicted(call);
  auto body = [&] {
    setenv("NORMJIT_CACHE_DIR", dir.path().c_str(), 1);
    setenv("NORMJIT_DISABLE_DISK_CACHE", "1", 1);
    const CallKeys f = forward_of(call);
    prefetch_backward(f.fusion, f.shape, h200_state());
    prefetch_wait_idle();
    const bool nothing_written = std::filesystem::is_empty(dir.path());
    const bool handed = !compile_kernel(bf, bc, 90).cubin.empty() && stats::counters().compiles == 1 &&
                        prefetch_counters().compiled == 1;
    std::exit(nothing_written && handed ? 0 : 1);
  };
  EXPECT_EXIT(body(), testing::ExitedWithCode(0), "");
}

TEST(PrefetchDeathTest, ExitWithCompilesQueuedIsClean) {
  REQUIRE_NVRTC();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const DeathTestDir dir("NORMJIT_TEST_EXIT_DIR");
  auto body = [&] {
    auto* cache = new compile::DiskCache(dir.path());  // never deleted: a compile may use it during exit
    for (int c : {32, 48, 64, 96, 128, 256}) {
      const auto [f, k] = predicted({{2, c, 64, 64, 64}});
      prefetch_compile(f, k, 90, -1, cache);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // a compile is under way (~150+ ms each)
    // The compiles in progress finish, the queue is dropped, the threads are joined: by exit itself
    // where no CUDA driver loads, else by the shutdown every program must call first (prefetch.h).
    if (have_cuda_driver()) prefetch_shutdown();
    std::exit(0);
  };
  EXPECT_EXIT(body(), testing::ExitedWithCode(0), "");
  compile::DiskCache cache(dir.path());
  // One compile per thread was in progress at most (one more if the exit was slow to come).
  EXPECT_LE(cache.list().size(), size_t(prefetch_threads()) + 1) << "queued compiles must be dropped at exit";
}

TEST(PrefetchDeathTest, TwoThreadsCompileEachQueuedKernelOnce) {
  REQUIRE_NVRTC();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const DeathTestDir dir("NORMJIT_TEST_TWO_DIR");
  auto body = [&] {
    setenv("NORMJIT_PREFETCH", "2", 1);
    setenv("NORMJIT_CACHE_DIR", dir.path().c_str(), 1);  // empty: every kernel needs NVRTC
    // The U-Net ladder's training forwards, each queueing its backward kernel (some shared).
    std::vector<std::pair<FusionKey, KernelConfig>> kernels;
    std::set<std::string> distinct;
    for (auto [c, s] : {std::pair{32, 128}, {64, 64}, {128, 32}, {256, 16}, {320, 8}, {320, 4}}) {
      const CallKeys f = forward_of({{2, c, s, s, s}});
      prefetch_backward(f.fusion, f.shape, h200_state());
      kernels.push_back(*backward_kernel_of(f.fusion, f.shape, builtin_profile("H200")));
      distinct.insert(kernel_name(kernels.back().first, kernels.back().second));
    }
    prefetch_wait_idle();
    const PrefetchCounters p = prefetch_counters();
    const uint64_t n = distinct.size();
    bool ok = prefetch_threads() == 2 && n >= 5 && p.queued == n && p.compiled + p.from_disk == n && p.failed == 0;
    for (const auto& [f, c] : kernels) ok = ok && !compile_kernel(f, c, 90).cubin.empty();
    ok = ok && stats::counters().compiles == p.compiled && compile_slots_in_use() == 0;
    std::exit(ok ? 0 : 1);
  };
  EXPECT_EXIT(body(), testing::ExitedWithCode(0), "");
}

TEST(PrefetchDeathTest, ZeroTurnsItOff) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const DeathTestDir dir("NORMJIT_TEST_OFF_DIR");
  auto body = [&] {
    setenv("NORMJIT_PREFETCH", "0", 1);
    setenv("NORMJIT_CACHE_DIR", dir.path().c_str(), 1);
    const CallKeys f = forward_of({{2, 32, 16, 16, 16}});
    prefetch_backward(f.fusion, f.shape, h200_state());
    const auto [bf, bc] = *backward_kernel_of(f.fusion, f.shape, builtin_profile("H200"));
    const bool off = !prefetch_enabled() && !prefetch_compile(bf, bc, 90, -1, nullptr) &&
                     prefetch_counters().queued == 0 && compile_slots_in_use() == 0;
    std::exit(off ? 0 : 1);
  };
  EXPECT_EXIT(body(), testing::ExitedWithCode(0), "");
}

TEST(Prefetch, AForkedChildNeitherQueuesNorJoinsTheParentsThread) {
  REQUIRE_NVRTC();
  const auto [f, c] = predicted({{2, 32, 8, 8, 8}, DType::bf16, Layout::ndhwc, false, false, Activation::silu});
  ASSERT_TRUE(prefetch_compile(f, c, 90, -1, nullptr));  // the thread exists in this process
  prefetch_wait_idle();
  const auto [f2, c2] = predicted({{2, 64, 8, 8, 8}, DType::bf16, Layout::ndhwc, false, false, Activation::silu});
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(60);  // a hang fails the test instead of blocking it
    const bool queued = prefetch_compile(f2, c2, 90, -1, nullptr);
    std::exit(queued ? 1 : 0);  // static destructors run: the Joiner must not join a thread it lacks
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status)) << "child status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  compile_kernel(f, c, 90, nullptr);  // claim the parent's reservation
  EXPECT_EQ(compile_slots_in_use(), 0u);
}

// ---------------------------------------------------------------- the ladder (prefetch.h)
std::vector<Call> unet_ladder(int patch, Layout layout) {
  const int features[] = {32, 64, 128, 256, 320, 320};  // nnU-Net's PlainConvUNet
  std::vector<Call> calls;
  for (int s = 0; s < 6 && (patch >> s) >= 2; ++s) {
    const int64_t p = patch >> s;
    calls.push_back({{2, features[s], p, p, p}, DType::f16, layout});
  }
  return calls;
}

TEST(PrefetchLadder, HalvesEachSpatialDimAndDoublesTheChannels) {
  const ShapeKey s = forward_of({{2, 32, 128, 128, 128}}).shape;
  const std::vector<ShapeKey> ladder = ladder_after(s, Layout::ncdhw);
  ASSERT_EQ(ladder.size(), size_t(kLadderStages));
  for (size_t i = 0; i < ladder.size(); ++i) {
    const int64_t p = 128 >> (i + 1), c = 32 << (i + 1);
    const ShapeKey want = forward_of({{2, c, p, p, p}}).shape;  // a contiguous tensor of that shape
    EXPECT_TRUE(bytes_equal(ladder[i], want)) << "stage " << i + 1;
  }
  const std::vector<ShapeKey> last = ladder_after(forward_of({{2, 320, 4, 4, 4}, DType::f16, Layout::ndhwc}).shape,
                                                  Layout::ndhwc);
  ASSERT_EQ(last.size(), 1u) << "4^3 -> 2^3, then a volume of 1 (not a training shape): stop";
  EXPECT_TRUE(bytes_equal(last[0], forward_of({{2, 640, 2, 2, 2}, DType::f16, Layout::ndhwc}).shape));
  EXPECT_TRUE(ladder_after(forward_of({{2, 8, 2, 2, 2}}).shape, Layout::ncdhw).empty());
}

// The guess is good enough where it matters: from the first norm of an nnU-Net, the ladder's
// kernels (and the first norm's own) are every kernel the network's forward and backward select.
TEST(PrefetchLadder, CoversTheKernelsOfAnNnUNet) {
  const DeviceProfile dev = builtin_profile("H200");
  for (Layout layout : {Layout::ncdhw, Layout::ndhwc})
    for (int patch : {128, 96, 64}) {
      const std::vector<Call> net = unet_ladder(patch, layout);
      const CallKeys first = forward_of(net[0]);
      std::set<std::string> guessed{
          kernel_name(first.fusion, choose_launch(first.fusion, first.shape, dev, Policy::bounded).config)};
      std::vector<ShapeKey> shapes = ladder_after(first.shape, layout);
      shapes.push_back(first.shape);
      for (const ShapeKey& k : shapes) {
        guessed.insert(kernel_name(first.fusion, choose_launch(first.fusion, k, dev, Policy::bounded).config));
        const auto b = backward_kernel_of(first.fusion, k, dev);
        guessed.insert(kernel_name(b->first, b->second));
      }
      for (const Call& c : net) {
        const CallKeys f = forward_of(c), b = backward_of(c);
        for (const CallKeys* k : {&f, &b}) {
          const std::string name = kernel_name(k->fusion, choose_launch(k->fusion, k->shape, dev, Policy::bounded).config);
          EXPECT_TRUE(guessed.count(name)) << layout_name(layout) << " patch " << patch << ": " << name
                                           << " (of " << c.sizes[1] << "x" << c.sizes[2] << "^3) is not guessed";
        }
      }
    }
}

TEST(PrefetchLadder, OffWithTheVariable) {
  const PrefetchOn prefetch_on;
  setenv("NORMJIT_PREFETCH_LADDER", "0", 1);
  EXPECT_FALSE(prefetch_ladder_enabled());
  const CallKeys f = forward_of({{2, 32, 32, 32, 32}});
  const uint64_t queued = prefetch_counters().queued;
  prefetch_ladder(f.fusion, f.shape, choose_launch(f.fusion, f.shape, builtin_profile("H200"), Policy::bounded).config,
                  h200_state());
  EXPECT_EQ(prefetch_counters().queued, queued);
  unsetenv("NORMJIT_PREFETCH_LADDER");
  EXPECT_TRUE(prefetch_ladder_enabled());
}

// A cold forward (its kernel on no disk) queues the next stages' kernels, forward then backward,
// each once; they land in the disk cache. Once its own kernel is on disk, the same forward queues
// nothing (a warm cache: the process is not the model's first).
TEST(PrefetchLadderDeathTest, AColdForwardCompilesTheNextStagesIntoTheDiskCache) {
  REQUIRE_NVRTC();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const DeathTestDir dir("NORMJIT_TEST_LADDER_DIR");
  const DeviceProfile dev = builtin_profile("H200");
  const CallKeys f = forward_of({{2, 32, 32, 32, 32}});  // 32^3 .. 2^3: a short ladder, ~8 kernels
  const KernelConfig own = choose_launch(f.fusion, f.shape, dev, Policy::bounded).config;
  std::set<std::string> expected;  // the ladder's kernels, less the forward's own
  for (const ShapeKey& k : ladder_after(f.shape, Layout::ncdhw)) {
    expected.insert(kernel_name(f.fusion, choose_launch(f.fusion, k, dev, Policy::bounded).config));
    const auto b = backward_kernel_of(f.fusion, k, dev);
    expected.insert(kernel_name(b->first, b->second));
  }
  expected.erase(kernel_name(f.fusion, own));
  ASSERT_GE(expected.size(), 5u) << "32^3 .. 2^3 need several tiers";
  auto body = [&] {
    setenv("NORMJIT_CACHE_DIR", dir.path().c_str(), 1);
    prefetch_ladder(f.fusion, f.shape, own, h200_state());
    prefetch_ladder(f.fusion, f.shape, own, h200_state());  // the next call of the same kernel: nothing new
    prefetch_wait_idle();
    compile::DiskCache& disk = compile::DiskCache::global();
    bool ok = prefetch_counters().ladder == expected.size() && prefetch_counters().queued == expected.size() &&
              prefetch_counters().failed == 0;
    for (const std::string& name : expected) ok = ok && entries_named(disk, name) == 1;
    ok = ok && entries_named(disk, kernel_name(f.fusion, own)) == 0;  // the call compiles its own
    compile_kernel(f.fusion, own, 90);
    clear_kernel_cache();  // drops the reservations the ladder's guesses hold
    prefetch_ladder(f.fusion, f.shape, own, h200_state());
    ok = ok && prefetch_counters().queued == expected.size();  // own kernel on disk: a warm cache
    if (have_cuda_driver()) prefetch_shutdown();
    std::exit(ok ? 0 : 1);
  };
  EXPECT_EXIT(body(), testing::ExitedWithCode(0), "");
}

// The forward of a stage the ladder guessed (its kernel queued) starts no ladder of its own: from
// it, a ladder would reach a stage deeper than the network (2^3 below a 4^3 bottleneck). A forward
// nothing guessed (here a second network's first norm, in bf16) still starts its own.
TEST(PrefetchLadderDeathTest, AGuessedStageStartsNoLadder) {
  REQUIRE_NVRTC();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const DeathTestDir dir("NORMJIT_TEST_LADDER_DIR");
  const DeviceProfile dev = builtin_profile("H200");
  // The measured case: from 128^3 the ladder reaches 4^3 (kLadderStages); from its first stage,
  // 64^3, it would reach 2^3, whose channels-last kernels no other stage shares.
  const CallKeys top = forward_of({{2, 32, 128, 128, 128}, DType::f16, Layout::ndhwc});
  const CallKeys next = forward_of({{2, 64, 64, 64, 64}, DType::f16, Layout::ndhwc});
  const CallKeys other = forward_of({{2, 32, 64, 64, 64}, DType::bf16, Layout::ndhwc});
  auto config_of = [&](const CallKeys& k) { return choose_launch(k.fusion, k.shape, dev, Policy::bounded).config; };
  auto body = [&] {
    setenv("NORMJIT_CACHE_DIR", dir.path().c_str(), 1);
    prefetch_ladder(top.fusion, top.shape, config_of(top), h200_state());
    const uint64_t ladder = prefetch_counters().ladder;
    bool ok = ladder > 0 && compile_is_reserved(next.fusion, config_of(next), 90);
    prefetch_ladder(next.fusion, next.shape, config_of(next), h200_state());
    ok = ok && prefetch_counters().ladder == ladder;  // nothing new: its stages are queued
    prefetch_ladder(other.fusion, other.shape, config_of(other), h200_state());
    ok = ok && prefetch_counters().ladder > ladder;  // not guessed: its own ladder
    prefetch_wait_idle();
    if (have_cuda_driver()) prefetch_shutdown();
    std::exit(ok ? 0 : 1);
  };
  EXPECT_EXIT(body(), testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace normjit
