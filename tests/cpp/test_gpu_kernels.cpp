// GPU tests of the kernels through the C++ API alone (no PyTorch): every layout, dtype and size
// tier against a double-precision CPU reference. Skipped, with a message, where no GPU exists.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "gpu_test_support.h"
#include "normjit/normjit.h"
#include "runtime/call_keys.h"
#include "runtime/sync_workspace.h"
#include "schedule/device_profile.h"
#include "schedule/heuristics.h"

namespace {

using namespace normjit_test;

class GpuKernels : public ::testing::TestWithParam<Case> {};

// NORMJIT_SPLIT=mode for one test, e.g. "resident": the resident split for the backward too (the
// default takes it for the forward only). Plans made before or after keep their own choice: the
// L1 cache is cleared on both ends.
struct SplitModeForBothDirections {
  explicit SplitModeForBothDirections(const char* mode) {
    setenv("NORMJIT_SPLIT", mode, 1);
    normjit::clear_memory_caches();
  }
  ~SplitModeForBothDirections() {
    unsetenv("NORMJIT_SPLIT");
    normjit::clear_memory_caches();
  }
};

TEST_P(GpuKernels, MatchesDoubleReference) {
  REQUIRE_GPU();
  check_case(GetParam());
}

std::vector<Case> cases() {
  using A = normjit::Activation;
  std::vector<Case> out;
  for (DType d : {DType::f32, DType::f16, DType::bf16})
    for (bool cl : {false, true}) {
      out.push_back({{2, 3, 5, 7, 11}, d, cl});               // primes: vector width 1
      out.push_back({{1, 1, 2}, d, cl});                      // smallest trainable
      out.push_back({{2, 32, 16, 16, 16}, d, cl});            // 16-byte vectors
      out.push_back({{2, 8, 40, 40}, d, cl, false});          // 2D, no affine
      out.push_back({{3, 16, 33, 17, 9}, d, cl, true, A::leaky_relu, true});
    }
  out.push_back({{2, 4, 16, 16, 16}, DType::f32, false, true, A::identity, false, 1000.f});  // mean >> std
  out.push_back({{2, 4, 16, 16, 16}, DType::f32, true, true, A::identity, false, 1000.f});
  for (A a : {A::relu, A::gelu_erf, A::gelu_tanh, A::silu, A::sigmoid, A::tanh})
    out.push_back({{2, 8, 6, 6, 6}, DType::f32, false, true, a, true});
  out.push_back({{1, 2, 128, 128, 128}, DType::f32, false});      // split across CTAs, cached
  out.push_back({{1, 2, 128, 128, 128}, DType::f16, false});      // split, cached
  out.push_back({{1, 1, 256, 256, 256}, DType::f32, false});      // split, streamed twice
  out.push_back({{1, 32, 64, 64, 64}, DType::f16, true});         // channels-last split
  out.push_back({{1, 30, 48, 48, 48}, DType::f16, true});         // channels-last flat super-rows (C = 30)
  out.push_back({{1, 20, 40, 48, 37}, DType::f16, true, true, normjit::Activation::leaky_relu, true});  // C = 20
  out.push_back({{2, 320, 4, 4, 4}, DType::f16, false});          // nnU-Net deep stage
  out.push_back({{2, 320, 4, 4, 4}, DType::f16, true});
  // Backward walking channel by channel (dweight/dbias summed in the CTA): N = 4, 8 per CTA.
  out.push_back({{4, 24, 8, 8, 8}, DType::bf16, false});
  out.push_back({{2, 320, 8, 8, 8}, DType::f32, false, true, A::silu, true});
  return out;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string s = std::to_string(info.index) + "_";
  for (size_t i = 0; i < c.shape.size(); ++i) s += (i ? "x" : "") + std::to_string(c.shape[i]);
  s += std::string("_") + normjit::dtype_name(c.dtype) + (c.channels_last ? "_ndhwc" : "_ncdhw");
  if (!c.affine) s += "_noaffine";
  if (c.residual) s += "_res";
  if (c.act != normjit::Activation::identity) s += std::string("_") + normjit::activation_name(c.act);
  if (c.offset != 0.f) s += "_offset";
  return s;
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuKernels, ::testing::ValuesIn(cases()), case_name);

// The launch the heuristics give case c's forward (or backward) on `dev`.
normjit::Launch default_launch(const Case& c, bool forward, const normjit::DeviceProfile& dev) {
  DeviceBuffer probe(16);
  const auto t = arg(probe, c.dtype, c);
  normjit::CallKeys k;
  if (forward) {
    normjit::ForwardArgs a;
    a.x = a.y = t;
    a.save_mean = a.save_rstd = static_cast<float*>(probe.get());
    k = normjit::forward_keys(a);
  } else {
    normjit::BackwardArgs a;
    a.x = a.dy = a.dx = t;
    if (c.residual && c.act != normjit::Activation::identity) a.residual = t;
    if (c.affine) {  // as check_case: fp32 parameters, with their gradients (with_workspace's clusters)
      a.weight = a.bias = normjit::contiguous_tensor(probe.get(), DType::f32, {c.shape[1]});
      a.dweight = a.dbias = static_cast<float*>(probe.get());
    }
    a.activation = c.act;
    a.save_mean = a.save_rstd = static_cast<float*>(probe.get());
    k = normjit::backward_keys(a);
  }
  return normjit::choose_launch(k.fusion, k.shape, dev, normjit::policy_from_env());
}

bool uses_resident(const Case& c, bool forward, const normjit::DeviceProfile& dev) {
  return default_launch(c, forward, dev).config.resident;
}

// The resident split (kernels/resident_split.cuh) on this GPU, forced for both directions
// (NORMJIT_SPLIT=resident): each case must select it in at least one direction (the forward's
// also by default) and match the double reference. The shapes probe its edges: chunks that are not
// a whole number of vectors per thread, an instance whose chunks reach 2 steps past the first
// (chunks = 2 * grid + 1: the most the pipeline allows), fused epilogues with the residual held
// in the slots, mean >> std, and bf16/fp32.
TEST(GpuKernelsResident, EdgeShapesMatchDoubleReference) {
  REQUIRE_GPU();
  const SplitModeForBothDirections resident("resident");
  using A = normjit::Activation;
  const normjit::DeviceProfile dev = normjit::live_profile(0);
  // fp16 forward, 7 vectors per thread (H200, H100): in one CTA of 512 an SM, or two of 256, whose
  // CTA merges at most 256 chunks an instance (larger instances take the CTA of 512).
  const int64_t slot_vectors = 512 * 7;
  const int64_t edge = (2 * int64_t(dev.sms)) * slot_vectors + 1;  // vectors of 8: chunks = 2 * sms + 1
  const int64_t edge256 = 256 * (256 * 7);                          // chunks = 256 of a CTA of 256
  const std::vector<Case> cases = {
      {{2, 8, 40, 40, 56}, DType::f16, false},                             // 4 chunks of 2800 vectors
      {{2, 16, 64, 64, 64}, DType::f16, false, true, A::leaky_relu, true},  // 10 / 22 chunks
      {{1, 2, 64, 64, 64}, DType::f32, false, true, A::identity, false, 1000.f},
      {{2, 4, 48, 48, 48}, DType::bf16, false, true, A::gelu_erf, true},   // x, dy, residual in the slots
      {{1, 3, 8, 405505}, DType::f16, false},                              // backward: 2 * 132 + 1 chunks
      {{1, 1, 8, edge}, DType::f16, false, false},                         // forward: 2 * sms + 1 chunks (512)
      {{1, 2, 8, edge256}, DType::f16, false, true, A::leaky_relu},        // forward: 256 chunks (256)
      // backward at two CTAs of 256 (3 vectors a thread), whose threads merge two chunks each:
      {{1, 2, 8, 393216}, DType::f16, false},  // 512 chunks, the most a CTA of 256 merges
      {{1, 3, 8, 300001}, DType::bf16, false, true, A::leaky_relu, true},  // 391, the last one partial
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c));
    const bool fwd_resident = uses_resident(c, true, dev), bwd_resident = uses_resident(c, false, dev);
    EXPECT_TRUE(fwd_resident || bwd_resident) << "neither direction uses the resident split";
    if (fwd_resident) {  // the forward's default too (this test forces NORMJIT_SPLIT=resident)
      unsetenv("NORMJIT_SPLIT");
      EXPECT_TRUE(uses_resident(c, true, dev));
      setenv("NORMJIT_SPLIT", "resident", 1);
    }
    check_case(c);
  }
}

// The channels-last streamed split, its forward through the cp.async ring (kernels/nhwc_ring.cuh;
// NORMJIT_SPLIT=l2 turns the kept split off, which would hold the smaller of these on chip):
// chunks that are not a whole number of tiles, channel tiles that C does not fill (lanes without
// channels), a residual and an activation, 4-wide fp32 vectors with mean >> std, bf16. The
// backward of each streams too (through registers).
TEST(GpuKernelsChannelsLastRing, EdgeShapesMatchDoubleReference) {
  REQUIRE_GPU();
  const SplitModeForBothDirections streamed("l2");
  using A = normjit::Activation;
  const normjit::DeviceProfile dev = normjit::live_profile(0);
  const std::vector<Case> cases = {
      {{1, 24, 40, 48, 37}, DType::f16, true, true, A::leaky_relu, true},  // 40 chunks of 1776 positions
      {{2, 40, 41, 43, 47}, DType::bf16, true},                            // C = 40 of a 64-channel tile
      {{1, 32, 67, 67, 67}, DType::f32, true, true, A::identity, false, 1000.f},
      {{2, 64, 64, 64, 64}, DType::f16, true, true, A::silu, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c));
    for (bool forward : {true, false}) {
      const normjit::Launch l = default_launch(c, forward, dev);
      EXPECT_TRUE(!l.config.cached && !l.config.resident && l.chunks > 1 && (l.config.stages >= 2) == forward)
          << (forward ? "forward" : "backward") << ": " << l.tier << ", stages " << int(l.config.stages);
    }
    check_case(c);
  }
}

// The kept channels-last split (kernels/nhwc_ring.cuh): the training forward's default where every
// chunk of at most `stages` tiles fits in its CTA's shared memory at once (forced here with
// NORMJIT_SPLIT=resident, which keeps the same shapes, so that a heuristics change cannot quietly
// turn the cases away from it).
// Chunks of 1 to 6 tiles, the last one partly filled; prime volumes; channel tiles that C does not
// fill; a residual and an activation; fp32 (4-wide vectors) with mean >> std; bf16; the fp16
// (2,128,32^3) stage, kept by default.
TEST(GpuKernelsChannelsLastKept, EdgeShapesMatchDoubleReference) {
  REQUIRE_GPU();
  using A = normjit::Activation;
  const normjit::DeviceProfile dev = normjit::live_profile(0);
  EXPECT_TRUE(default_launch({{2, 128, 32, 32, 32}, DType::f16, true}, true, dev).config.resident);
  const SplitModeForBothDirections kept("resident");
  const std::vector<Case> cases = {
      {{2, 128, 32, 32, 32}, DType::f16, true},                            // 66 chunks of 4 tiles
      {{1, 64, 17, 19, 23}, DType::f16, true},                             // primes: one partial tile a chunk
      {{3, 72, 20, 21, 22}, DType::bf16, true, true, A::leaky_relu, true},  // C = 72: 16-channel tiles, the last half full
      {{1, 32, 40, 40, 40}, DType::f32, true, true, A::identity, false, 1000.f},
      {{1, 24, 40, 48, 37}, DType::f16, true, true, A::gelu_erf, false},    // C = 24 of a 32-channel tile
      {{1, 64, 58, 58, 60}, DType::f16, true, false},                      // 264 chunks of 6 tiles: every slot
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c));
    const normjit::Launch l = default_launch(c, true, dev);
    EXPECT_TRUE(l.config.resident && l.config.stages >= 1 && l.chunks > 1) << l.tier;
    check_case(c);
  }
  // The backward's kept split (x and dy in the slots, the exchange between chunks): (2,256,16^3)'s
  // 16 chunks of 2 tiles, C = 72 in bf16 with a residual under leaky_relu (3 tensors a slot, tiles
  // of 32-byte rows), and prime volumes.
  const std::vector<Case> backward_cases = {
      {{2, 256, 16, 16, 16}, DType::f16, true},
      {{3, 72, 20, 21, 22}, DType::bf16, true, true, A::leaky_relu, true},
      {{1, 64, 17, 19, 23}, DType::f16, true, false, A::silu, false},
  };
  for (const Case& c : backward_cases) {
    SCOPED_TRACE(::testing::PrintToString(c));
    const normjit::Launch l = default_launch(c, false, dev);
    EXPECT_TRUE(l.config.resident && l.config.stages >= 1 && l.chunks > 1 && l.cooperative) << l.tier;
    check_case(c);
  }
}

// The kept channels-last forward and backward with one chunk a unit (heuristics nhwc_kept_whole):
// tiles of one 16-byte vector, a CTA's slots holding every position of its unit (the backward's x
// and dy), no exchange. Covers fp16 with two tiles a unit, C = 200 in bf16 with a residual and
// leaky_relu (three tensors a slot), fp32 (4-channel tiles) with mean >> std, prime volumes
// without affine, a unit of 1309 positions (1001 fit a register tier), and the backward's weight
// gradients through clusters of 2 and 5 samples, one sample's CTAs and, for 9 samples (more than
// a portable cluster), the last CTA's pass.
TEST(GpuKernelsChannelsLastKept, WholeUnitsMatchDoubleReference) {
  REQUIRE_GPU();
  using A = normjit::Activation;
  const normjit::DeviceProfile dev = normjit::live_profile(0);
  const std::vector<Case> cases = {
      {{2, 256, 12, 12, 12}, DType::f16, true},
      {{3, 200, 11, 12, 13}, DType::bf16, true, true, A::leaky_relu, true},
      {{1, 24, 12, 12, 12}, DType::f32, true, true, A::identity, false, 1000.f},
      {{1, 64, 7, 11, 17}, DType::f16, true, false, A::gelu_erf, false},
      {{2, 40, 12, 12, 12}, DType::f16, true, true, A::silu, false},
      {{5, 16, 11, 12, 13}, DType::f16, true},
      {{9, 8, 11, 11, 11}, DType::bf16, true, true, A::identity, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c));
    for (bool forward : {true, false}) {
      const normjit::Launch l = default_launch(c, forward, dev);
      EXPECT_TRUE(l.config.resident && l.chunks == 1 && !l.cooperative &&
                  std::string(l.tier).find("kept whole") != std::string::npos)
          << (forward ? "forward: " : "backward: ") << l.tier << ", chunks " << l.chunks;
    }
    const bool clusters = dev.arch >= 90 && c.affine && !c.residual && c.shape[0] > 1 && c.shape[0] <= 8;
    EXPECT_EQ(default_launch(c, false, dev).config.cluster, clusters);
    check_case(c);
  }
}

// Channels-last deep stages: channel tiles narrower than the natural 8 vectors, each (sample,
// tile) unit held whole by one CTA (nhwc_deep_tier in heuristics.cpp). Covers two-lane tiles in a
// CTA of 256 (128 rows: the column sums shared by 8-16 threads a column) and of 64, fp32 rows of
// two 4-wide vectors with mean >> std, 2-byte vectors (16 lanes, the last tile with one channel),
// 8 channels (one lane, 256 rows: 16-32 threads a column), bf16, a residual with leaky_relu and
// no affine, and units that only tiles of one 16-byte vector hold.
TEST(GpuKernelsChannelsLastDeep, NarrowTilesMatchDoubleReference) {
  REQUIRE_GPU();
  using A = normjit::Activation;
  const normjit::DeviceProfile dev = normjit::live_profile(0);
  const std::vector<Case> cases = {
      {{2, 320, 8, 8, 8}, DType::f16, true, true, A::leaky_relu, true},
      {{2, 320, 4, 4, 4}, DType::bf16, true},
      {{2, 320, 8, 8, 8}, DType::f32, true, true, A::identity, false, 1000.f},
      {{32, 320, 8, 8, 8}, DType::f16, true},
      {{2, 321, 4, 4, 4}, DType::f16, true},
      {{3, 64, 7, 8, 9}, DType::f16, true, false, A::gelu_erf, false},
      {{3, 8, 8, 8, 8}, DType::f16, true, true, A::leaky_relu, true},
      // Tiles of one 16-byte vector where none of 32-byte rows holds a unit (600 and 990 positions).
      {{2, 320, 5, 12, 10}, DType::f16, true, true, A::leaky_relu, false},
      {{3, 200, 9, 10, 11}, DType::bf16, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c));
    for (bool forward : {true, false}) {
      const normjit::Launch l = default_launch(c, forward, dev);
      EXPECT_TRUE(l.config.cached && l.chunks == 1 && !l.cooperative)
          << (forward ? "forward: " : "backward: ") << l.tier << ", chunks " << l.chunks;
    }
    check_case(c);
  }
}

// Why the thread-block cluster weight-gradient sums cannot run here, or "" where they can.
std::string cluster_weight_grads_unavailable(const normjit::DeviceProfile& dev) {
  if (dev.arch < 90) return "thread-block clusters need sm_90; this GPU is sm_" + std::to_string(dev.arch);
  if (!normjit::cluster_weight_grads_enabled()) return "NORMJIT_CLUSTER_WEIGHT_GRADS=0";
  return "";
}

// Channels-last backward of 2-8 samples with one CTA per (sample, channel tile) on sm_90: the
// weight gradients are summed by a thread-block cluster of the tile's N CTAs (heuristics
// with_workspace, kernels/instance_norm_nhwc.cuh cluster_weight_grads). Covers N = 2, 3, 5 and 8,
// a partial last tile (C = 200 and 321), tiles of 2 and 8 lanes, fp32 with mean >> std, bf16, an
// activation, and the same bits on a second run; N = 9 stays with the last CTA's pass.
TEST(GpuKernelsChannelsLastDeep, ClusterWeightGradsMatchDoubleReference) {
  REQUIRE_GPU();
  using A = normjit::Activation;
  const normjit::DeviceProfile dev = normjit::live_profile(0);
  if (const std::string why = cluster_weight_grads_unavailable(dev); !why.empty()) GTEST_SKIP() << why;
  const std::vector<Case> cases = {
      {{2, 320, 8, 8, 8}, DType::f16, true},
      {{3, 200, 5, 7, 11}, DType::f16, true, true, A::leaky_relu, false},
      {{5, 321, 4, 4, 4}, DType::bf16, true},
      {{8, 64, 4, 4, 4}, DType::f32, true, true, A::identity, false, 1000.f},
      {{2, 256, 3, 3, 3}, DType::f32, true},
      {{9, 64, 4, 4, 4}, DType::f16, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c));
    const normjit::Launch l = default_launch(c, false, dev);
    EXPECT_EQ(l.cluster, c.shape[0] <= 8 ? c.shape[0] : 1) << l.tier << ", chunks " << l.chunks;
    EXPECT_EQ(check_case(c, 3), check_case(c, 3));
  }
}

// The NCDHW backward of one instance a CTA with 2-8 samples: dweight/dbias summed in a
// thread-block cluster of the channel's N CTAs (heuristics ncdhw_cluster_fits), the same bits on
// every run. The medium and large tiers, N = 2, 3, 5 and 8, prime volumes (vectors of 1 and 2),
// bf16 with a residual under leaky_relu, fp32 with mean >> std; N = 9 keeps the last CTA's pass.
TEST(GpuKernelsNcdhw, ClusterWeightGradsMatchDoubleReference) {
  REQUIRE_GPU();
  using A = normjit::Activation;
  const normjit::DeviceProfile dev = normjit::live_profile(0);
  if (const std::string why = cluster_weight_grads_unavailable(dev); !why.empty()) GTEST_SKIP() << why;
  const std::vector<Case> cases = {
      {{2, 64, 16, 16, 16}, DType::f16, false},                                 // medium (CTA of 128)
      {{3, 17, 11, 13, 17}, DType::bf16, false, true, A::leaky_relu, true},     // large, vectors of 1
      {{5, 8, 9, 10, 11}, DType::f32, false, true, A::identity, false, 1000.f},  // vectors of 2
      {{8, 6, 32, 32, 32}, DType::f16, false},                                  // large, 8 vectors a thread
      {{9, 4, 16, 16, 16}, DType::f16, false},                                  // N = 9: no cluster
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c));
    const normjit::Launch l = default_launch(c, false, dev);
    EXPECT_EQ(l.config.group, l.config.threads) << l.tier;
    EXPECT_EQ(l.cluster, c.shape[0] <= 8 ? c.shape[0] : 1) << l.tier << ", chunks " << l.chunks;
    EXPECT_EQ(check_case(c, 3), check_case(c, 3));
  }
}

// The NCDHW backward's register tier that keeps dy in shared memory (x in registers; heuristics
// shared_dy_tier_fits): more instances than one wave of the CTA of 512 x 8 vectors, 16-byte vectors.
// The nnU-Net 32^3 stage; volumes that are not a whole number of the CTA's 4096 vectors (2697,
// 2744, 2560); clusters of 2 and 3 samples, N = 9 (the last CTA's pass) and N = 1 (a channel a
// CTA); leaky_relu and silu, a residual (identity: the backward reads none), mean >> std, bf16, no
// affine; the same bits on every run.
TEST(GpuKernelsNcdhw, SharedDyTierMatchesDoubleReference) {
  REQUIRE_GPU();
  using A = normjit::Activation;
  const normjit::DeviceProfile dev = normjit::live_profile(0);
  if (dev.arch < 80) GTEST_SKIP() << "the tier needs cp.async (sm_80 or newer); this GPU is sm_" << dev.arch;
  if (!normjit::shared_dy_tier_enabled()) GTEST_SKIP() << "NORMJIT_SHARED_DY=0 turns the tier off";
  const std::vector<Case> cases = {
      {{2, 128, 32, 32, 32}, DType::f16, false},
      {{3, 47, 24, 29, 31}, DType::bf16, false, true, A::leaky_relu},
      {{2, 80, 28, 28, 28}, DType::f16, false, true, A::identity, true, 1000.f},
      {{9, 16, 32, 32, 32}, DType::f16, false, false},
      {{1, 140, 16, 32, 40}, DType::f16, false, true, A::silu},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c));
    const normjit::Launch l = default_launch(c, false, dev);
    EXPECT_TRUE(normjit::keeps_dy_in_shared_memory(l.config) && l.config.stages == 1) << l.tier;
    EXPECT_EQ(check_case(c, 3), check_case(c, 3));
  }
}

// Channels-last with C not a multiple of the 16-byte vector: the flat super-rows of lcm(C, vec)
// elements (kernels/nhwc_tile.cuh) where positions per super-row divide the volume and the lanes
// fit 32, else the narrow vectors. Covers 3, 8 and 15 lanes (spare threads in the CTA), 2, 4 and 8
// positions per super-row, each tier (CTA of 64, register-held split, streamed split through the
// ring with chunks that are not whole tiles), fp32 with mean >> std, bf16, a residual with
// leaky_relu, and the fallbacks (an odd volume; 125 lanes).
TEST(GpuKernelsChannelsLastFlat, EdgeShapesMatchDoubleReference) {
  REQUIRE_GPU();
  using A = normjit::Activation;
  const normjit::DeviceProfile dev = normjit::live_profile(0);
  struct FlatCase {
    Case c;
    bool flat;
  };
  const std::vector<FlatCase> cases = {
      {{{2, 30, 4, 4, 4}, DType::f16, true}, true},                             // 15 lanes, CTA of 64
      {{{2, 12, 8, 8, 8}, DType::f16, true, false}, true},                      // CTA of 256, no affine
      {{{4, 12, 16, 16, 16}, DType::f16, true, true, A::silu, false}, true},    // 3 lanes, 2 positions
      {{{2, 3, 24, 24, 24}, DType::f16, true}, true},                           // 3 lanes, 8 positions
      {{{2, 60, 20, 20, 20}, DType::bf16, true, true, A::leaky_relu, true}, true},
      {{{1, 6, 64, 64, 64}, DType::f32, true, true, A::identity, false, 1000.f}, true},  // fp32: 4-wide
      {{{1, 30, 96, 96, 96}, DType::f16, true}, true},                          // streamed, ring
      {{{1, 20, 96, 96, 90}, DType::f16, true, true, A::leaky_relu, true}, true},
      {{{2, 30, 5, 7, 11}, DType::f16, true}, false},                           // 385 positions: odd
      {{{2, 250, 8, 8, 8}, DType::f16, true}, false},                           // 125 lanes
  };
  for (const FlatCase& k : cases) {
    SCOPED_TRACE(::testing::PrintToString(k.c));
    for (bool forward : {true, false}) {
      const normjit::Launch l = default_launch(k.c, forward, dev);
      EXPECT_EQ(l.config.flat, k.flat) << (forward ? "forward: " : "backward: ") << l.tier;
      if (k.flat) EXPECT_EQ(int(l.config.vec) * normjit::dtype_size(k.c.dtype), 16);
    }
    check_case(k.c);
  }
  // NORMJIT_SPLIT=registers: no channels-last split holds its chunk in registers (the cached
  // kernels are the tiers, without the exchange: heuristics nhwc_split), so it streams.
  const SplitModeForBothDirections registers("registers");
  for (const Case& c : {Case{{2, 30, 32, 32, 32}, DType::f16, true, true, A::leaky_relu, true},
                        Case{{1, 3, 40, 40, 40}, DType::bf16, true}}) {
    SCOPED_TRACE(::testing::PrintToString(c));
    const normjit::Launch l = default_launch(c, true, dev);
    EXPECT_TRUE(l.config.flat && !l.config.cached && l.chunks > 1) << l.tier;
    check_case(c);
  }
}

// The tag of the resident split's exchange wraps after 2^32 - 1 launches on one stream: the last
// CTA then clears the exchange words. Forced here by setting the generation just below the wrap.
TEST(GpuKernelsResident, TagWrapClearsTheExchange) {
  REQUIRE_GPU();
  const SplitModeForBothDirections resident("resident");
  const Case c{{2, 16, 64, 64, 64}, DType::f16, false};  // forward and backward both resident
  check_case(c);
  const normjit::Workspace w = normjit::get_workspace(0, nullptr, 0, 0, 0, 1);  // the default stream's
  const auto& cu = normjit::driver::cuda_driver();
  const CUdeviceptr gen = reinterpret_cast<CUdeviceptr>(w.exchange);
  const uint64_t before_wrap = 0xfffffffeull;
  normjit::driver::check_cuda(cu.cuMemcpyHtoD(gen, &before_wrap, 8), "cuMemcpyHtoD");
  check_case(c, 2);  // forward: the last tag, then the clear; backward: tag 1
  check_case(c, 3);  // tags 2 and 3
  uint64_t after = 0;
  normjit::driver::check_cuda(cu.cuMemcpyDtoH(&after, gen, 8), "cuMemcpyDtoH");
  EXPECT_EQ(after, 3u);
}

TEST(GpuKernelsDeterminism, BackwardIsBitwiseRepeatable) {
  REQUIRE_GPU();
  const Case c{{2, 16, 64, 64, 64}, DType::f32, false};  // the resident split, forward and backward
  EXPECT_EQ(check_case(c, 7), check_case(c, 7));
  const Case h{{2, 16, 64, 64, 64}, DType::f16, false, true, normjit::Activation::silu, true};
  EXPECT_EQ(check_case(h, 8), check_case(h, 8));
}

class GpuKernelsEval : public ::testing::TestWithParam<Case> {};

// Running statistics updated in the training forward (the resident split's last-CTA pass too),
// then eval mode with them.
TEST_P(GpuKernelsEval, RunningStatsUpdateAndEvalMode) {
  REQUIRE_GPU();
  const Case& k = GetParam();
  const std::vector<int64_t>& shape = k.shape;
  const int64_t N = shape[0], C = shape[1], S = shape[2] * shape[3] * shape[4];
  const Layout L{N, C, S, k.channels_last};
  std::vector<float> x(N * C * S);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (auto& v : x) v = 3.f + 2.f * normal(rng);
  std::vector<float> rm(C, 0.5f), rv(C, 2.f);
  DeviceBuffer xb(x.size() * 4), yb(x.size() * 4), rmb(C * 4), rvb(C * 4);
  xb.upload(x.data());
  rmb.upload(rm.data());
  rvb.upload(rv.data());
  normjit::ForwardArgs fa;
  fa.x = arg(xb, DType::f32, k);
  fa.y = arg(yb, DType::f32, k);
  fa.running_mean = static_cast<float*>(rmb.get());
  fa.running_var = static_cast<float*>(rvb.get());
  fa.momentum = 0.1;
  normjit::instance_norm_forward(fa);
  std::vector<float> rm2(C), rv2(C);
  rmb.download(rm2.data());
  rvb.download(rv2.data());
  for (int64_t c = 0; c < C; ++c) {
    double m_avg = 0, v_avg = 0;
    for (int64_t n = 0; n < N; ++n) {
      double m = 0, v = 0;
      for (int64_t s = 0; s < S; ++s) m += x[L.at(n, c, s)];
      m /= S;
      for (int64_t s = 0; s < S; ++s) v += std::pow(x[L.at(n, c, s)] - m, 2);
      m_avg += m / N, v_avg += v / (S - 1) / N;
    }
    EXPECT_NEAR(rm2[c], 0.9 * 0.5 + 0.1 * m_avg, 1e-4);
    EXPECT_NEAR(rv2[c], 0.9 * 2.0 + 0.1 * v_avg, 1e-3);
  }
  // Eval: y = (x - running_mean) / sqrt(running_var + eps).
  fa.use_input_stats = false;
  normjit::instance_norm_forward(fa);
  std::vector<float> y(x.size());
  yb.download(y.data());
  for (int64_t i = 0; i < N * C * S; i += 37) {
    const int64_t c = k.channels_last ? i % C : (i / S) % C;
    EXPECT_NEAR(y[i], (x[i] - rm2[c]) / std::sqrt(rv2[c] + 1e-5), 1e-4);
  }
}
INSTANTIATE_TEST_SUITE_P(Shapes, GpuKernelsEval,
                         ::testing::Values(Case{{3, 4, 9, 10, 11}},          // one CTA per instance
                                           Case{{2, 3, 40, 40, 40}},         // the resident split
                                           Case{{2, 32, 40, 40, 40}, DType::f32, true},   // channels-last ring
                                           Case{{2, 30, 40, 40, 40}, DType::f32, true}),  // flat super-rows
                         case_name);

TEST(GpuKernelsErrors, BadInputThrowsBeforeLaunch) {
  normjit::ForwardArgs fa;
  fa.x = normjit::contiguous_tensor(reinterpret_cast<void*>(0x10000), DType::f32, {2, 3, 4});
  fa.y = normjit::contiguous_tensor(reinterpret_cast<void*>(0x20000), DType::f32, {2, 3, 5});
  EXPECT_THROW(normjit::instance_norm_forward(fa), normjit::Error);
}

}  // namespace
