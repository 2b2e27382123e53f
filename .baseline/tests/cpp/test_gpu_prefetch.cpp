// On a GPU: a training forward's first call queues its backward kernel (runtime/prefetch.h, hooked
// into the L1-miss path of instance_norm.cpp), and the backward call then compiles nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "gpu_test_support.h"
#include "runtime/call_keys.h"
#include "runtime/kernel_cache.h"
#include "runtime/prefetch.h"
#include "runtime/stats.h"
#include "schedule/heuristics.h"

namespace {

using normjit_test::DeviceBuffer;

TEST(GpuPrefetch, ATrainingForwardCompilesItsBackwardKernelAhead) {
  REQUIRE_GPU();
  normjit::set_prefetch_default(true);  // off by default in the C++ core (the Python package turns it on)
  struct Off {
    ~Off() {
      normjit::prefetch_wait_idle();
      normjit::set_prefetch_default(false);
    }
  } off;
  if (!normjit::prefetch_enabled()) GTEST_SKIP() << "NORMJIT_PREFETCH=0";
  if (normjit::autotune_enabled()) GTEST_SKIP() << "autotune on: the backward may time other candidates";
  // A fusion and shape no other test uses (fp32 channels-last, residual, tanh).
  const std::vector<int64_t> shape{2, 24, 6, 10, 14};
  const int64_t C = shape[1], n = 2 * 24 * 6 * 10 * 14;
  DeviceBuffer x(n * 4), y(n * 4), r(n * 4), dy(n * 4), dx(n * 4), dr(n * 4);
  DeviceBuffer w(C * 4), b(C * 4), dw(C * 4), db(C * 4), mean(2 * C * 4), rstd(2 * C * 4);
  const std::vector<float> ones(static_cast<size_t>(n), 1.f);
  std::vector<float> ramp(static_cast<size_t>(n));
  for (size_t i = 0; i < ramp.size(); ++i) ramp[i] = float(i % 97) * 0.01f;
  x.upload(ramp.data()), r.upload(ones.data()), dy.upload(ones.data());
  w.upload(ones.data()), b.upload(ones.data());
  auto t = [&](const DeviceBuffer& buf) {
    return normjit::channels_last_tensor(buf.get(), normjit::DType::f32, shape);
  };
  auto v = [&](const DeviceBuffer& buf) { return normjit::contiguous_tensor(buf.get(), normjit::DType::f32, {C}); };

  normjit::ForwardArgs fa;
  fa.x = t(x), fa.y = t(y), fa.residual = t(r), fa.weight = v(w), fa.bias = v(b);
  fa.save_mean = static_cast<float*>(mean.get()), fa.save_rstd = static_cast<float*>(rstd.get());
  fa.activation = normjit::Activation::tanh;
  normjit::BackwardArgs ba;
  ba.x = t(x), ba.dy = t(dy), ba.dx = t(dx), ba.residual = t(r), ba.dresidual = t(dr);
  ba.weight = v(w), ba.bias = v(b), ba.dweight = static_cast<float*>(dw.get()),
  ba.dbias = static_cast<float*>(db.get());
  ba.save_mean = fa.save_mean, ba.save_rstd = fa.save_rstd;
  ba.activation = normjit::Activation::tanh;
  const normjit::CallKeys bk = normjit::backward_keys(ba);
  const normjit::KernelConfig bc =
      normjit::choose_launch(bk.fusion, bk.shape, normjit::device_state(0).profile, normjit::policy_from_env()).config;
  const int arch = normjit::device_state(0).profile.arch;
  auto& disk = normjit::compile::DiskCache::global();
  const bool on_disk = disk.enabled() && normjit::kernel_on_disk(bk.fusion, bc, arch, disk);

  normjit::prefetch_wait_idle();  // jobs of earlier tests in this process
  const normjit::PrefetchCounters before = normjit::prefetch_counters();
  const size_t slots_before = normjit::compile_slots_in_use();  // earlier tests' guesses, if any
  normjit::instance_norm_forward(fa);
  normjit::prefetch_wait_idle();
  const normjit::PrefetchCounters after = normjit::prefetch_counters();
  if (!on_disk)
    EXPECT_EQ((after.queued - before.queued) - (after.ladder - before.ladder), 1u)
        << "the forward did not queue its backward kernel: is prefetch_backward() called in build_plan?";
  const uint64_t compiles = normjit::stats::counters().compiles;
  normjit::instance_norm_backward(ba);
  EXPECT_EQ(normjit::stats::counters().compiles, compiles) << "the backward compiled its kernel itself";
  EXPECT_TRUE(normjit::kernel_loaded(bk.fusion, bc, 0));
  // The ladder's guesses (prefetch.h) keep their slots for calls that never come in this test;
  // dropping the reservations (theirs and any an earlier test of this process left) must leave none.
  EXPECT_LE(normjit::compile_slots_in_use(), slots_before + (after.ladder - before.ladder));
  normjit::clear_kernel_cache();
  EXPECT_EQ(normjit::compile_slots_in_use(), 0u);
  std::vector<float> out(static_cast<size_t>(n));
  dx.download(out.data());
  for (float o : out) ASSERT_TRUE(std::isfinite(o));
}

}  // namespace
