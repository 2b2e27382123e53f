// The autotune candidates, offline: for representative shapes and a random shape stream, every
// candidate is a launch the kernels can run (grid in range, a cooperative grid within the
// co-resident CTAs its config guarantees, the chunks of an instance in one round, chunks that
// cover the instance with none empty, a register-held chunk within the tile) built from a config
// that enumerate_configs lists (the documented bound holds with autotune on), the default first.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "normjit/normjit.h"
#include "runtime/keys.h"
#include "schedule/device_profile.h"
#include "schedule/heuristics.h"

using namespace normjit;

namespace {

ShapeKey shape(Layout layout, int64_t N, int64_t C, int64_t spatial, int align = 16) {
  ShapeKey s = zeroed<ShapeKey>();
  s.N = N, s.C = C, s.spatial = spatial;
  if (layout == Layout::ncdhw)
    s.stride_s = 1, s.stride_c = spatial, s.stride_n = spatial * C;
  else
    s.stride_c = 1, s.stride_s = C, s.stride_n = spatial * C;
  s.align_bytes = uint16_t(align);
  return s;
}

FusionKey fusion(Direction d, DType dt, Layout layout, bool train = true, bool running = false) {
  return make_fusion(d, dt, DType::f32, layout, d == Direction::backward || train, true, false,
                     running && d == Direction::forward && train, d == Direction::forward && train,
                     Activation::identity);
}

// Checks one candidate; returns "" or what is wrong.
std::string problem(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev, const Launch& l,
                    const std::vector<KernelConfig>& enumerated) {
  if (std::none_of(enumerated.begin(), enumerated.end(),
                   [&](const KernelConfig& c) { return bytes_equal(c, l.config); }))
    return "config not enumerated: " + describe(l.config);
  if (l.grid < 1 || l.grid > 0x7fffffff) return "grid " + std::to_string(l.grid);
  if (l.chunks < 1) return "chunks " + std::to_string(l.chunks);
  // Flat channels-last configs walk super-rows of lcm(C, vec) elements: C / gcd lanes wide, each
  // vec / gcd positions.
  const int64_t gcd = std::gcd<int64_t>(s.C, l.config.vec);
  const int64_t lanes = l.config.flat ? s.C / gcd : l.config.group;
  if (l.config.flat && (lanes > 32 || s.spatial % (l.config.vec / gcd) != 0 || s.C % l.config.vec == 0))
    return "flat where the super-rows do not apply";
  const int64_t extent = f.layout == Layout::ncdhw ? s.spatial / l.config.vec
                         : l.config.flat           ? s.spatial / (l.config.vec / gcd)
                                                   : s.spatial;
  if (int64_t(l.chunks) * l.chunk_vectors < extent) return "chunks do not cover the instance";
  if (int64_t(l.chunks - 1) * l.chunk_vectors >= extent) return "an empty chunk";
  if (l.chunk_vectors > 0x7fffffff) return "chunk_vectors overflows int";
  const bool ncdhw_resident = l.config.resident && f.layout == Layout::ncdhw;
  if (l.cooperative) {
    if (l.grid > int64_t(dev.sms) * l.config.min_blocks) return "cooperative grid exceeds the co-resident CTAs";
    if (!ncdhw_resident && l.grid % l.chunks != 0) return "cooperative grid not a multiple of chunks";
    if ((ncdhw_resident ? l.exchange : l.partials) <= 0 || l.counters <= 0) return "cooperative without workspace";
  }
  if (f.train && l.chunks > 1 && !l.cooperative) return "training chunks that cannot exchange";
  if (l.chunks == 1 && l.cooperative) return "cooperative with one chunk";
  if (l.config.resident && f.layout == Layout::ndhwc) {
    // The kept channels-last split (kernels/nhwc_ring.cuh): a chunk of at most `stages` tiles.
    if (l.config.cached || !f.train) return "kept split off training";
    if (l.chunk_vectors > int64_t(l.config.stages) * (l.config.threads / lanes) * l.config.items)
      return "kept chunk larger than its slots";
  } else if (l.config.resident) {
    // One chunk per slot, and the pipeline's deadlock-freedom condition (kernels/resident_split.cuh).
    if (l.chunk_vectors > int64_t(l.config.threads) * l.config.items) return "resident chunk larger than a slot";
    if (l.chunks - 1 > int64_t(l.config.stages - 2) * l.grid) return "resident instance spans too many steps";
    // Thread j merges chunk j; the backward's (plain sums) also chunk j + threads.
    const int64_t merged = int64_t(l.config.threads) * (f.direction == Direction::backward ? 2 : 1);
    if (l.chunks > merged) return "more resident chunks than its threads merge";
    if (!l.cooperative || l.config.cached || !f.train) return "resident split without co-residency or training";
  }
  if (l.config.cached && f.train) {
    const int64_t rows = f.layout == Layout::ncdhw ? l.config.group : l.config.threads / lanes;
    if (l.chunk_vectors > rows * l.config.items) return "register-held chunk larger than the tile";
  }
  // The channels-last cached kernels are tiers without the split's exchange.
  if (l.config.cached && f.layout == Layout::ndhwc && l.chunks > 1) return "channels-last cached kernel split";
  // An NCDHW split is one instance a CTA (kernels/common.cuh NJ_NCDHW_SPLITS).
  if (f.layout == Layout::ncdhw && f.train && l.config.group != l.config.threads && l.chunks > 1)
    return "NCDHW split of several instances a CTA";
  return "";
}

std::string text(const ShapeKey& s, const Launch& l) {
  return "N=" + std::to_string(s.N) + " C=" + std::to_string(s.C) + " spatial=" + std::to_string(s.spatial) + ": " +
         l.tier + " " + describe(l.config) + " chunks " + std::to_string(l.chunks) + " grid " + std::to_string(l.grid);
}

void check_all(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev, Policy p = Policy::bounded) {
  const std::vector<Launch> c = candidate_launches(f, s, dev, p);
  ASSERT_FALSE(c.empty());
  EXPECT_LE(c.size(), 6u);
  EXPECT_TRUE(same_launch(c[0], choose_launch(f, s, dev, p))) << "the default comes first";
  const std::vector<KernelConfig> all = enumerate_configs(f, p, dev);
  for (size_t i = 0; i < c.size(); ++i) {
    EXPECT_EQ(problem(f, s, dev, c[i], all), "")
        << describe(f) << " on " << dev.name << ", candidate " << i << " " << text(s, c[i]);
    for (size_t j = 0; j < i; ++j) EXPECT_FALSE(same_launch(c[i], c[j])) << "duplicate " << text(s, c[i]);
  }
}

}  // namespace

TEST(AutotuneCandidates, RepresentativeShapesGiveValidAlternatives) {
  const DeviceProfile h200 = builtin_profile("H200");
  struct Row {
    int64_t N, C, spatial;
    size_t ncdhw_at_least;  // candidates expected for NCDHW (the default plus alternatives)
  };
  const Row rows[] = {
      {2, 32, 128 * 128 * 128, 3},                             // nnU-Net stage 0: split, several chunk counts
      {2, 64, 64 * 64 * 64, 3},    {2, 128, 32 * 32 * 32, 2},  // large tier, or a register-held split
      {2, 320, 4 * 4 * 4, 3},                                  // many tiny instances: larger tiers
      {1, 2, 32 * 32 * 32, 3},                                 // few medium instances: splits fill the SMs
      {2, 32, 80 * 192 * 160, 3},  {2, 32, 16 * 16 * 16, 3},
      // C not a multiple of 8: channels-last takes the flat super-rows (positions 4, 2 and 8 per row)
      {2, 30, 128 * 128 * 128, 3}, {2, 20, 64 * 64 * 64, 3},  {1, 3, 24 * 24 * 24, 3},
  };
  for (Layout layout : {Layout::ncdhw, Layout::ndhwc})
    for (Direction d : {Direction::forward, Direction::backward})
      for (const Row& r : rows) {
        const ShapeKey s = shape(layout, r.N, r.C, r.spatial);
        const FusionKey f = fusion(d, DType::f16, layout);
        SCOPED_TRACE(describe(f) + " N=" + std::to_string(r.N) + " C=" + std::to_string(r.C) +
                     " S=" + std::to_string(r.spatial));
        check_all(f, s, h200);
        if (layout == Layout::ncdhw)
          EXPECT_GE(candidate_launches(f, s, h200, Policy::bounded).size(), r.ncdhw_at_least);
      }
  // Channels-last with few (n, channel tile) pairs: (streamed) splits that fill the SMs.
  const FusionKey f = fusion(Direction::forward, DType::f16, Layout::ndhwc);
  const std::vector<Launch> c = candidate_launches(f, shape(Layout::ndhwc, 2, 32, 16 * 16 * 16), h200, Policy::bounded);
  ASSERT_GE(c.size(), 3u);
  EXPECT_TRUE(std::any_of(c.begin() + 1, c.end(), [&](const Launch& l) { return l.grid > c[0].grid; }));
}

TEST(AutotuneCandidates, BigSplitTriesOtherChunkCountsOfOneKernel) {
  // The default is the resident split; the streamed split's alternatives differ in chunk count
  // only: one more kernel for all of them.
  const DeviceProfile h200 = builtin_profile("H200");
  const FusionKey f = fusion(Direction::forward, DType::f16, Layout::ncdhw);
  const ShapeKey s = shape(Layout::ncdhw, 2, 32, 128 * 128 * 128);
  const std::vector<Launch> c = candidate_launches(f, s, h200, Policy::bounded);
  ASSERT_GE(c.size(), 3u);
  EXPECT_TRUE(c[0].config.resident);
  const auto streamed = std::find_if(c.begin(), c.end(), [](const Launch& l) {
    return !l.config.resident && !l.config.cached;
  });
  ASSERT_NE(streamed, c.end());
  int same_kernel = 0;
  bool registers = false;
  for (const Launch& l : c) {
    same_kernel += bytes_equal(l.config, streamed->config) ? 1 : 0;
    registers = registers || l.config.cached;
  }
  EXPECT_GE(same_kernel, 2) << "streamed rounds sized to other fractions of the L2";
  EXPECT_TRUE(registers) << "the register-held split fits 132 SMs";
}

TEST(AutotuneCandidates, EvalAndRunningStatsAndEveryDtype) {
  for (const DeviceProfile& dev : builtin_profiles())
    for (DType dt : {DType::f32, DType::f16, DType::bf16})
      for (Layout layout : {Layout::ncdhw, Layout::ndhwc})
        for (int64_t spatial : {int64_t(2), int64_t(77), int64_t(4096), int64_t(33 * 33 * 33), int64_t(1) << 21}) {
          SCOPED_TRACE(dev.name + " spatial " + std::to_string(spatial));
          check_all(fusion(Direction::forward, dt, layout, /*train=*/false), shape(layout, 2, 24, spatial), dev);
          check_all(fusion(Direction::forward, dt, layout, true, /*running=*/true), shape(layout, 3, 5, spatial), dev);
          check_all(fusion(Direction::backward, dt, layout), shape(layout, 1, 1, spatial, 2), dev);
        }
}

TEST(AutotuneCandidates, RandomShapeStreamBothPolicies) {
  std::mt19937_64 g(99);
  auto U = [&](int64_t lo, int64_t hi) { return lo + int64_t(g() % uint64_t(hi - lo + 1)); };
  const std::vector<DeviceProfile> devices = builtin_profiles();
  size_t total = 0, alternatives = 0;
  for (int i = 0; i < 3000; ++i) {
    const Layout layout = U(0, 1) ? Layout::ncdhw : Layout::ndhwc;
    const Direction d = U(0, 1) ? Direction::forward : Direction::backward;
    const bool train = d == Direction::backward || U(0, 4) != 0;
    const FusionKey f = fusion(d, DType(U(0, 2)), layout, train, U(0, 1) != 0);
    const int kind = int(U(0, 3));
    const int64_t spatial = kind == 0   ? U(2, 5000)
                            : kind == 1 ? int64_t(1) << U(1, 24)
                            : kind == 2 ? U(2, 3000000)
                                        : U(1000, 1400) * U(1000, 1400) * U(100, 1400);
    const ShapeKey s = shape(layout, U(1, 4), U(0, 1) ? U(1, 400) : int64_t(1) << U(0, 9), spatial, 16 >> U(0, 4));
    const DeviceProfile& dev = devices[size_t(i) % devices.size()];
    for (Policy p : {Policy::bounded, Policy::exact}) {
      check_all(f, s, dev, p);
      const size_t n = candidate_launches(f, s, dev, p).size();
      total += n;
      alternatives += n - 1;
    }
    if (::testing::Test::HasFailure()) break;
  }
  std::printf("[ stream   ] %zu candidates, %zu of them alternatives to the default\n", total, alternatives);
  EXPECT_GT(alternatives, total / 4);
}
