// Autotune on the GPU, through the C++ API: with it on, forward and backward still match the
// double-precision reference; a training forward updates the running statistics exactly once
// (as without autotune); an in-place call is not timed; a second lookup after the memory caches
// are dropped loads the stored choice instead of searching. Skipped, with a message, without a GPU.
//
// A record left in the disk cache by an earlier run would turn a search into a load, so each test
// first plants a stale record (naming no current candidate) under its calls' keys: the lookup
// ignores it and searches, which also exercises the stale-record path end to end. Each test uses
// its own shapes or fusions: ctest may run them as parallel processes sharing one disk cache.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "compile/disk_cache.h"
#include "gpu_test_support.h"
#include "normjit/normjit.h"
#include "runtime/autotune_record.h"
#include "runtime/call_keys.h"
#include "runtime/device.h"
#include "schedule/heuristics.h"

namespace {

using namespace normjit_test;

// Autotune on for one test; the previous setting (and plans made under it) restored after.
struct AutotuneOn {
  bool before = normjit::autotune_enabled();
  AutotuneOn() {
    normjit::set_autotune(true);
    normjit::clear_memory_caches();
  }
  ~AutotuneOn() { normjit::set_autotune(before); }
};

// Aligned like a fresh allocation; only read for alignment.
void* fake(int i) { return reinterpret_cast<void*>(uintptr_t(i + 1) << 32); }

normjit::TensorArg fake_arg(int i, const Case& c) {
  return c.channels_last ? normjit::channels_last_tensor(fake(i), c.dtype, c.shape)
                         : normjit::contiguous_tensor(fake(i), c.dtype, c.shape);
}

// The keys of the forward and backward calls check_case makes for `c`.
std::vector<normjit::CallKeys> keys_of(const Case& c) {
  const int64_t C = c.shape[1];
  normjit::ForwardArgs fa;
  fa.x = fake_arg(0, c);
  fa.y = fake_arg(1, c);
  if (c.affine) {
    fa.weight = normjit::contiguous_tensor(fake(2), DType::f32, {C});
    fa.bias = normjit::contiguous_tensor(fake(3), DType::f32, {C});
  }
  if (c.residual) fa.residual = fake_arg(4, c);
  fa.save_mean = static_cast<float*>(fake(5));
  fa.save_rstd = static_cast<float*>(fake(6));
  fa.activation = c.act;
  normjit::BackwardArgs ba;
  ba.x = fa.x;
  ba.dy = fake_arg(7, c);
  ba.dx = fake_arg(8, c);
  ba.weight = fa.weight;
  ba.bias = fa.bias;
  ba.residual = fa.residual;
  if (c.residual) ba.dresidual = fake_arg(9, c);
  ba.save_mean = fa.save_mean;
  ba.save_rstd = fa.save_rstd;
  if (c.affine) ba.dweight = static_cast<float*>(fake(10)), ba.dbias = static_cast<float*>(fake(11));
  ba.activation = c.act;
  return {normjit::forward_keys(fa), normjit::backward_keys(ba)};
}

size_t candidates_of(const normjit::CallKeys& k) {
  const normjit::DeviceProfile& dev = normjit::device_state(k.shape.device).profile;
  return normjit::candidate_launches(k.fusion, k.shape, dev, normjit::policy_from_env()).size();
}

// Plants a record that names no current candidate under the key of `k`, so that the next lookup
// ignores it and searches. (A no-op when the disk cache is disabled: then every lookup searches.)
void plant_stale_record(const normjit::CallKeys& k) {
  auto& disk = normjit::compile::DiskCache::global();
  if (!disk.enabled()) return;
  const normjit::DeviceProfile& dev = normjit::device_state(k.shape.device).profile;
  normjit::Launch stale = normjit::choose_launch(k.fusion, k.shape, dev, normjit::policy_from_env());
  stale.chunks += 100000;
  ASSERT_TRUE(normjit::autotune::store_choice(
      &disk, normjit::autotune::record_key(k.fusion, k.shape, dev, normjit::policy_from_env()), stale, {}));
}

std::vector<Case> tuned_cases() {
  using A = normjit::Activation;
  return {
      {{1, 2, 128, 128, 128}, DType::f16, false},  // split: chunk counts, registers
      {{2, 32, 16, 16, 16}, DType::f16, true},     // channels-last: register-held splits
      {{2, 320, 4, 4, 4}, DType::f16, false},      // tiny instances: larger tiers
      {{1, 2, 32, 32, 32}, DType::f32, false},     // few medium instances: splits
      {{1, 32, 64, 64, 64}, DType::bf16, true},    // channels-last split
      {{3, 16, 33, 17, 9}, DType::f16, false, true, A::leaky_relu, true},
  };
}

}  // namespace

TEST(GpuAutotune, ResultsMatchReferenceAndEachShapeIsSearchedOnce) {
  REQUIRE_GPU();
  AutotuneOn on;
  for (const Case& c : tuned_cases()) {
    SCOPED_TRACE(::testing::PrintToString(c));
    uint64_t expected = 0;
    for (const normjit::CallKeys& k : keys_of(c)) {
      plant_stale_record(k);
      expected += candidates_of(k) > 1 ? 1 : 0;
    }
    normjit::reset_cache_stats();
    check_case(c);
    const normjit::CacheStats s = normjit::cache_stats();
    EXPECT_EQ(s.autotune_searches, expected);
    EXPECT_EQ(s.autotune_records_loaded, 0u);
    // The same calls again: L1 plans, no second search.
    check_case(c, 2);
    EXPECT_EQ(normjit::cache_stats().autotune_searches, expected);
  }
}

TEST(GpuAutotune, SecondLookupLoadsTheRecordInsteadOfSearching) {
  REQUIRE_GPU();
  if (!normjit::compile::DiskCache::global().enabled())
    GTEST_SKIP() << "the disk cache is disabled (NORMJIT_DISABLE_DISK_CACHE): no records to load";
  AutotuneOn on;
  // A shape no other test uses: ctest may run the tests in parallel processes on one disk cache.
  const Case c{{1, 2, 96, 128, 128}, DType::f16, false};
  const auto keys = keys_of(c);
  for (const auto& k : keys) {
    ASSERT_GT(candidates_of(k), 1u);
    plant_stale_record(k);
  }
  normjit::reset_cache_stats();
  check_case(c);
  EXPECT_EQ(normjit::cache_stats().autotune_searches, keys.size());

  // What a new process sees: empty memory caches, the same disk cache.
  normjit::clear_memory_caches();
  normjit::reset_cache_stats();
  check_case(c);
  const normjit::CacheStats s = normjit::cache_stats();
  EXPECT_EQ(s.autotune_searches, 0u);
  EXPECT_EQ(s.autotune_records_loaded, keys.size());
}

namespace {

struct RunningResult {
  std::vector<float> y, rm, rv;
};

// One training forward with running statistics (momentum 0.1 from rm = 0.5, rv = 2), fp32.
RunningResult train_forward_with_running_stats(const std::vector<int64_t>& shape, bool channels_last,
                                               const std::vector<float>& x) {
  const int64_t C = shape[1];
  DeviceBuffer xb(x.size() * 4), yb(x.size() * 4), rmb(C * 4), rvb(C * 4), mb(shape[0] * C * 4), sb(shape[0] * C * 4);
  xb.upload(x.data());
  const std::vector<float> rm(C, 0.5f), rv(C, 2.f);
  rmb.upload(rm.data());
  rvb.upload(rv.data());
  normjit::ForwardArgs fa;
  auto t = [&](const DeviceBuffer& b) {
    return channels_last ? normjit::channels_last_tensor(b.get(), DType::f32, shape)
                         : normjit::contiguous_tensor(b.get(), DType::f32, shape);
  };
  fa.x = t(xb);
  fa.y = t(yb);
  fa.running_mean = static_cast<float*>(rmb.get());
  fa.running_var = static_cast<float*>(rvb.get());
  fa.save_mean = static_cast<float*>(mb.get());
  fa.save_rstd = static_cast<float*>(sb.get());
  fa.momentum = 0.1;
  normjit::instance_norm_forward(fa);
  RunningResult r;
  r.y.resize(x.size()), r.rm.resize(C), r.rv.resize(C);
  yb.download(r.y.data());
  rmb.download(r.rm.data());
  rvb.download(r.rv.data());
  return r;
}

normjit::CallKeys running_keys(const std::vector<int64_t>& shape, bool channels_last) {
  Case c{shape, DType::f32, channels_last};
  normjit::ForwardArgs fa;
  fa.x = fake_arg(0, c);
  fa.y = fake_arg(1, c);
  fa.running_mean = static_cast<float*>(fake(2));
  fa.running_var = static_cast<float*>(fake(3));
  fa.save_mean = static_cast<float*>(fake(4));
  fa.save_rstd = static_cast<float*>(fake(5));
  return normjit::forward_keys(fa);
}

}  // namespace

TEST(GpuAutotune, RunningStatsAreUpdatedExactlyOnce) {
  REQUIRE_GPU();
  for (bool cl : {false, true}) {
    const std::vector<int64_t> shape =
        cl ? std::vector<int64_t>{2, 32, 16, 16, 16} : std::vector<int64_t>{2, 4, 32, 32, 32};
    SCOPED_TRACE(cl ? "channels-last" : "ncdhw");
    int64_t total = 1;
    for (int64_t d : shape) total *= d;
    std::vector<float> x(static_cast<size_t>(total));
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.f, 1.f);
    for (auto& v : x) v = 3.f + 2.f * normal(rng);

    normjit::set_autotune(false);
    const RunningResult ref = train_forward_with_running_stats(shape, cl, x);

    AutotuneOn on;
    const normjit::CallKeys k = running_keys(shape, cl);
    ASSERT_GT(candidates_of(k), 1u) << "the test needs a shape with alternatives";
    plant_stale_record(k);
    normjit::reset_cache_stats();
    const RunningResult tuned = train_forward_with_running_stats(shape, cl, x);
    EXPECT_EQ(normjit::cache_stats().autotune_searches, 1u);
    for (size_t c = 0; c < ref.rm.size(); ++c) {
      // Twice would give 0.81 * 0.5 + ...: off by ~0.05 or more.
      EXPECT_NEAR(tuned.rm[c], ref.rm[c], 1e-5) << "running_mean " << c;
      EXPECT_NEAR(tuned.rv[c], ref.rv[c], 1e-4) << "running_var " << c;
    }
    double max_err = 0;
    for (size_t i = 0; i < x.size(); ++i) max_err = std::max(max_err, double(std::fabs(tuned.y[i] - ref.y[i])));
    EXPECT_LT(max_err, 1e-4);
  }
}

TEST(GpuAutotune, InPlaceCallIsNotTimedAndStillCorrect) {
  REQUIRE_GPU();
  AutotuneOn on;
  const std::vector<int64_t> shape{2, 4, 32, 32, 32};
  const int64_t N = 2, C = 4, S = 32 * 32 * 32;
  std::vector<float> x(size_t(N * C * S));
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (auto& v : x) v = 1.f + normal(rng);

  Case c{shape, DType::f32, false};
  normjit::ForwardArgs keys_args;
  keys_args.x = fake_arg(0, c);
  keys_args.y = keys_args.x;
  const normjit::CallKeys k = normjit::forward_keys(keys_args);
  ASSERT_GT(candidates_of(k), 1u);
  plant_stale_record(k);

  DeviceBuffer xb(x.size() * 4);
  xb.upload(x.data());
  normjit::ForwardArgs fa;
  fa.x = normjit::contiguous_tensor(xb.get(), DType::f32, shape);
  fa.y = fa.x;  // in place
  normjit::reset_cache_stats();
  normjit::instance_norm_forward(fa);
  EXPECT_EQ(normjit::cache_stats().autotune_searches, 0u);
  std::vector<float> y(x.size());
  xb.download(y.data());
  for (int64_t i = 0; i < N * C; ++i) {
    double m = 0, v = 0;
    for (int64_t s = 0; s < S; ++s) m += x[i * S + s];
    m /= S;
    for (int64_t s = 0; s < S; ++s) v += (x[i * S + s] - m) * (x[i * S + s] - m);
    const double rs = 1 / std::sqrt(v / S + 1e-5);
    for (int64_t s = 0; s < S; s += 97) EXPECT_NEAR(y[i * S + s], (x[i * S + s] - m) * rs, 1e-4);
  }
}
