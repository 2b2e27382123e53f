// The heuristics and the per-call validation, offline: vector-width classes, the 64-bit index
// switch, tier order, split decisions for the big nnU-Net shapes, the bound on kernel configs
// (every config choose_launch returns over a large random shape stream is one enumerate_configs
// lists, for both policies and every built-in GPU, and every launch, default or autotune
// candidate, meets its kernel's preconditions), zero-size inputs, and the error messages.
// Pointers are fake: the runtime only reads their alignment.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "normjit/normjit.h"
#include "runtime/call_keys.h"
#include "runtime/keys.h"
#include "schedule/device_profile.h"
#include "schedule/heuristics.h"
#include "test_call_args.h"

using namespace normjit;

namespace {

Launch launch_for(const CallKeys& k, const std::string& device = "H200", Policy p = Policy::bounded) {
  return choose_launch(k.fusion, k.shape, builtin_profile(device), p);
}

int vec_of(const Shape& s, DType dtype, Layout layout, int align = 256) {
  const CallKeys k = forward_keys(fwd_args(s, dtype, layout, align));
  return vector_width(k.shape, dtype, layout);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool contains(const std::vector<KernelConfig>& v, const KernelConfig& c) {
  return std::any_of(v.begin(), v.end(), [&](const KernelConfig& x) { return bytes_equal(x, c); });
}

// The message of the normjit::Error `f` throws ("" when it throws nothing).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// ------------------------------------------------------------------------------- vector widths
TEST(Heuristics, VectorWidthFollowsAlignmentAndSizes) {
  const Shape big{2, 32, 64, 64, 64};
  // 16-byte aligned: 8 halves, 4 floats per access.
  EXPECT_EQ(vec_of(big, DType::f16, Layout::ncdhw), 8);
  EXPECT_EQ(vec_of(big, DType::bf16, Layout::ncdhw), 8);
  EXPECT_EQ(vec_of(big, DType::f32, Layout::ncdhw), 4);
  // A pointer only aligned to 8, 4 or 2 bytes (a sliced tensor) narrows the vector.
  EXPECT_EQ(vec_of(big, DType::f16, Layout::ncdhw, 8), 4);
  EXPECT_EQ(vec_of(big, DType::f16, Layout::ncdhw, 4), 2);
  EXPECT_EQ(vec_of(big, DType::f16, Layout::ncdhw, 2), 1);
  EXPECT_EQ(vec_of(big, DType::f32, Layout::ncdhw, 8), 2);
  EXPECT_EQ(vec_of(big, DType::f32, Layout::ncdhw, 4), 1);
  // The spatial size must be a multiple of the vector (every instance starts aligned).
  EXPECT_EQ(vec_of({2, 32, 33, 33, 33}, DType::f16, Layout::ncdhw), 1);  // odd
  EXPECT_EQ(vec_of({2, 32, 7, 5, 3}, DType::f32, Layout::ncdhw), 1);
  EXPECT_EQ(vec_of({2, 32, 2, 3, 5}, DType::f16, Layout::ncdhw), 2);  // 30 = 2 x 15
  EXPECT_EQ(vec_of({2, 32, 4, 3, 5}, DType::f16, Layout::ncdhw), 4);  // 60 = 4 x 15
  EXPECT_EQ(vec_of({2, 32, 8, 3, 5}, DType::f16, Layout::ncdhw), 8);
  // Channels-last vectorises over C: an odd C is scalar whatever the spatial size.
  EXPECT_EQ(vec_of({2, 32, 64, 64, 64}, DType::f16, Layout::ndhwc), 8);
  EXPECT_EQ(vec_of({2, 33, 64, 64, 64}, DType::f16, Layout::ndhwc), 1);
  EXPECT_EQ(vec_of({2, 36, 63, 63, 63}, DType::f16, Layout::ndhwc), 4);
  EXPECT_EQ(vec_of({2, 320, 63, 63, 63}, DType::f32, Layout::ndhwc), 4);

  // The chosen config carries the width, and a misaligned backward input narrows it too.
  const CallKeys k = backward_keys(bwd_args(big, DType::f16, Layout::ncdhw, 2));
  EXPECT_EQ(launch_for(k).config.vec, 1);
  EXPECT_EQ(launch_for(backward_keys(bwd_args(big))).config.vec, 8);
}

TEST(Heuristics, PaddedBatchStrideNarrowsVector) {
  // A padded batch stride that is not a multiple of the vector breaks instance alignment.
  ForwardArgs a = fwd_args({2, 32, 16, 16, 16});
  a.x.strides[0] = a.y.strides[0] = 32 * 4096 + 3;
  const CallKeys k = forward_keys(a);
  EXPECT_EQ(vector_width(k.shape, DType::f16, Layout::ncdhw), 1);
}

// Channels-last with C not a multiple of the 16-byte vector: flat super-rows of lcm(C, vec)
// elements with 16-byte vectors where they apply, else the narrow vectors.
TEST(Heuristics, ChannelsLastOddChannelsReadFlatSuperRows) {
  struct Row {
    Shape shape;
    DType dtype;
    int align;
    bool flat;
    int64_t extent;  // rows a sample's chunks cover: super-rows when flat, else positions
  };
  const int64_t v = 128 * 128 * 128;
  const Row rows[] = {
      {{2, 30, 128, 128, 128}, DType::f16, 256, true, v / 4},  // lcm 120: 15 lanes, 4 positions
      {{2, 20, 128, 128, 128}, DType::f16, 256, true, v / 2},  // lcm 40: 5 lanes, 2 positions
      {{2, 3, 64, 64, 64}, DType::f16, 256, true, 64 * 64 * 64 / 8},
      {{2, 30, 64, 64, 64}, DType::f32, 256, true, 64 * 64 * 64 / 2},  // 4-float vectors: lcm 60
      {{2, 30, 33, 33, 33}, DType::f16, 256, false, 33 * 33 * 33},     // 4 positions do not divide
      {{2, 250, 16, 16, 16}, DType::f16, 256, false, 4096},            // 125 lanes: past a warp
      {{2, 30, 64, 64, 64}, DType::f16, 8, false, 64 * 64 * 64},       // x only 8-byte aligned
      {{2, 32, 64, 64, 64}, DType::f16, 256, false, 64 * 64 * 64},     // a multiple of 8: tiles
  };
  for (const Row& r : rows) {
    for (bool forward : {true, false}) {
      const CallKeys k = forward ? forward_keys(fwd_args(r.shape, r.dtype, Layout::ndhwc, r.align))
                                 : backward_keys(bwd_args(r.shape, r.dtype, Layout::ndhwc, r.align));
      const Launch l = launch_for(k);
      SCOPED_TRACE(describe(k.fusion) + " C=" + std::to_string(r.shape[1]) + ": " + describe(l.config));
      EXPECT_EQ(l.config.flat, r.flat);
      if (r.flat) {
        EXPECT_EQ(int(l.config.vec) * dtype_size(r.dtype), 16);
        EXPECT_EQ(l.config.group, 0) << "flat lanes are a run-time value";
        EXPECT_NE(kernel_name(k.fusion, l.config).find("gf"), std::string::npos);
      }
      EXPECT_GE(int64_t(l.chunks) * l.chunk_vectors, r.extent);
      EXPECT_LT(int64_t(l.chunks - 1) * l.chunk_vectors, r.extent);
    }
  }
  // A padded batch stride that leaves samples 16-byte misaligned keeps the narrow vectors.
  ForwardArgs a = fwd_args({2, 30, 16, 16, 16}, DType::f16, Layout::ndhwc);
  a.x.strides[0] = a.y.strides[0] = 30 * 4096 + 2;
  EXPECT_FALSE(launch_for(forward_keys(a)).config.flat);
}

// ---------------------------------------------------------------------------- index width
TEST(Heuristics, Index64PastTwoToThe31Elements) {
  // 2^31 - 2^20 elements: 32-bit offsets suffice; 2^31 + 2^20: they do not.
  const Shape below{1, 1, 1024, 1024, 2047}, above{1, 1, 1024, 1024, 2049};
  for (DType dt : {DType::f32, DType::f16}) {
    for (Layout layout : {Layout::ncdhw, Layout::ndhwc}) {
      const CallKeys lo = forward_keys(fwd_args(below, dt, layout));
      const CallKeys hi = forward_keys(fwd_args(above, dt, layout));
      EXPECT_FALSE(needs_index64(lo.shape));
      EXPECT_TRUE(needs_index64(hi.shape));
      EXPECT_FALSE(launch_for(lo).config.index64);
      EXPECT_TRUE(launch_for(hi).config.index64);
    }
  }
  // The same holds when the size comes from many instances rather than one big one.
  const CallKeys many = backward_keys(bwd_args({64, 320, 64, 64, 32}));  // 2^31 + 2^29 elements
  EXPECT_TRUE(launch_for(many).config.index64);
  const CallKeys fits = backward_keys(bwd_args({2, 32, 128, 128, 128}));
  EXPECT_FALSE(launch_for(fits).config.index64);
}

// ------------------------------------------------------------------------------------ tiers
namespace {
int tier_rank(const std::string& tier) {
  static const char* order[] = {"tiny",
                                "small",
                                "medium (CTA of 128)",
                                "medium (CTA of 256)",
                                "large (CTA of 512)",
                                "large (CTA of 256, 16",  // the CTA of 512 x 8's capacity, dy in shared memory
                                "large (CTA of 512, 8",
                                "split, cached",
                                "split, resident",
                                "split, streamed"};
  for (int i = 0; i < int(std::size(order)); ++i)
    if (tier.rfind(order[i], 0) == 0) return i;
  static const char* nhwc[] = {"channels-last small", "channels-last medium", "channels-last split, cached",
                               "channels-last split, kept", "channels-last split, streamed"};
  for (int i = 0; i < int(std::size(nhwc)); ++i)
    if (tier.rfind(nhwc[i], 0) == 0) return 100 + i;
  ADD_FAILURE() << "unknown tier '" << tier << "'";
  return -1;
}
}  // namespace

TEST(Heuristics, TierIsMonotoneInSize) {
  // For a fixed vector class (spatial a multiple of 8), a larger instance never gets a smaller tier.
  // The backward's two splits rank as one: which of them pays depends on the chunk count against
  // the grid, not on size alone (resident_backward_pays). So do the channels-last forward's kept
  // and streamed splits: the kept one applies by whether the tensor fits the CTAs' slots.
  for (const char* device : {"H200", "A100", "L4"}) {
    for (Layout layout : {Layout::ncdhw, Layout::ndhwc}) {
      for (int dir = 0; dir < 2; ++dir) {
        for (int64_t C : {32, 320}) {
          int last = -1;
          std::string last_tier;
          for (int64_t spatial = 8; spatial <= (int64_t(1) << 24); spatial = spatial * 5 / 4 / 8 * 8 + 8) {
            const Shape s{2, C, spatial};
            const CallKeys k = dir == 0 ? forward_keys(fwd_args(s, DType::f16, layout))
                                        : backward_keys(bwd_args(s, DType::f16, layout));
            const Launch l = launch_for(k, device);
            const bool resident_backward = dir == 1 && std::string(l.tier).rfind("split, resident", 0) == 0;
            const bool kept = std::string(l.tier).rfind("channels-last split, kept", 0) == 0;
            const int rank = resident_backward ? tier_rank("split, streamed")
                             : kept            ? tier_rank("channels-last split, streamed")
                                               : tier_rank(l.tier);
            EXPECT_GE(rank, last) << device << " " << layout_name(layout) << " dir " << dir << " C " << C << " spatial "
                                  << spatial << ": '" << l.tier << "' after '" << last_tier << "'";
            last = std::max(last, rank);
            last_tier = l.tier;
          }
        }
      }
    }
  }
}

TEST(Heuristics, SmallInstancesShareACta) {
  // nnU-Net's deepest stage: 640 instances of 64 elements, several per CTA.
  const Launch l = launch_for(forward_keys(fwd_args({2, 320, 4, 4, 4})));
  EXPECT_LE(l.config.group, 32);
  EXPECT_GT(l.config.threads / l.config.group, 1);
  EXPECT_FALSE(l.cooperative);
  EXPECT_EQ(l.chunks, 1);
}

TEST(Heuristics, DeepBackwardSumsWeightGradsPerCta) {
  // Where a CTA's groups can hold all N samples of their channels, the backward walks instances
  // channel by channel and needs no grid-wide pass (no scratch, no grid counter).
  for (const Shape& s : {Shape{2, 320, 4, 4, 4}, Shape{2, 320, 8, 8, 8}, Shape{1, 256, 16, 16, 16}}) {
    const Launch l = launch_for(backward_keys(bwd_args(s)));
    SCOPED_TRACE(std::to_string(s[0]) + "x" + std::to_string(s[1]) + "x" + std::to_string(s[2]) + ": " + l.tier);
    EXPECT_TRUE(l.channel_major);
    EXPECT_EQ(l.scratch, 0);
    EXPECT_EQ(l.counters, 0);
  }
  // Where a CTA holds one instance of N = 2: channel by channel in clusters of the channel's CTAs
  // (NcdhwBackwardSumsWeightGradsInClusters). Not for splits, nor without affine, nor forward.
  EXPECT_TRUE(launch_for(backward_keys(bwd_args({2, 256, 16, 16, 16}))).config.cluster);
  EXPECT_FALSE(launch_for(backward_keys(bwd_args({2, 32, 128, 128, 128}))).channel_major);
  EXPECT_FALSE(launch_for(backward_keys(bwd_args({3, 320, 4, 4, 4}))).channel_major);  // 32 groups, N = 3
  BackwardArgs plain = bwd_args({2, 320, 4, 4, 4});
  plain.weight = plain.bias = TensorArg{};
  plain.dweight = plain.dbias = nullptr;
  EXPECT_FALSE(launch_for(backward_keys(plain)).channel_major);
  EXPECT_FALSE(launch_for(forward_keys(fwd_args({2, 320, 4, 4, 4}))).channel_major);
  // (Channels-last: ChannelsLastBackwardOf*.)
}

TEST(Heuristics, ChannelsLastBackwardOfOneSampleWritesWeightGradsPerCta) {
  // N = 1: each (sample, channel tile) is its channels' only instance, so chunk 0 writes dweight
  // and dbias itself, whether a CTA holds the unit or a split's exchange totals it.
  for (const Shape& s : {Shape{1, 320, 4, 4, 4}, Shape{1, 32, 64, 64, 64}}) {
    const Launch l = launch_for(backward_keys(bwd_args(s, DType::f16, Layout::ndhwc)));
    SCOPED_TRACE(l.tier);
    EXPECT_TRUE(l.channel_major);
    EXPECT_EQ(l.scratch, 0);
    EXPECT_EQ(l.counters, l.chunks > 1 ? 2 * s[1] + 1 : 0);  // the exchange's, where split
  }
  EXPECT_GT(launch_for(backward_keys(bwd_args({1, 32, 64, 64, 64}, DType::f16, Layout::ndhwc))).chunks, 1);
  // Not for a split of N = 2, nor without affine.
  EXPECT_FALSE(launch_for(backward_keys(bwd_args({2, 32, 64, 64, 64}, DType::f16, Layout::ndhwc))).channel_major);
  BackwardArgs plain = bwd_args({1, 320, 4, 4, 4}, DType::f16, Layout::ndhwc);
  plain.weight = plain.bias = TensorArg{};
  plain.dweight = plain.dbias = nullptr;
  EXPECT_FALSE(launch_for(backward_keys(plain)).channel_major);
  EXPECT_EQ(launch_for(backward_keys(plain)).cluster, 1);
}

TEST(Heuristics, ChannelsLastBackwardOfSeveralSamplesSumsWeightGradsInClusters) {
  // 2 <= N <= 8, one CTA per (sample, channel tile), sm_90: a cluster of the tile's N CTAs sums
  // the weight gradients (no scratch, no grid counter, no last CTA's pass).
  for (const Shape& s : {Shape{2, 320, 8, 8, 8}, Shape{2, 320, 4, 4, 4}, Shape{4, 128, 8, 8, 8}, Shape{8, 64, 4, 4, 4},
                         Shape{3, 200, 5, 7, 11}}) {
    for (const char* device : {"H100", "H200"}) {
      const Launch l = launch_for(backward_keys(bwd_args(s, DType::f16, Layout::ndhwc)), device);
      SCOPED_TRACE(std::string(device) + " N=" + std::to_string(s[0]) + " C=" + std::to_string(s[1]) + ": " + l.tier);
      EXPECT_TRUE(l.channel_major);
      EXPECT_TRUE(l.config.cluster);
      EXPECT_EQ(l.cluster, s[0]);
      EXPECT_EQ(l.chunks, 1);
      EXPECT_EQ(l.grid % l.cluster, 0);
      EXPECT_EQ(l.scratch, 0);
      EXPECT_EQ(l.counters, 0);
    }
  }
  // Not before sm_90 (A100: the last CTA's pass), nor past the portable cluster size, nor for a
  // split, nor for the forward or the flat super-rows of C = 30.
  const Launch a100 = launch_for(backward_keys(bwd_args({2, 320, 8, 8, 8}, DType::f16, Layout::ndhwc)), "A100");
  EXPECT_FALSE(a100.channel_major);
  EXPECT_EQ(a100.cluster, 1);
  EXPECT_GT(a100.scratch, 0);
  EXPECT_EQ(launch_for(backward_keys(bwd_args({9, 64, 4, 4, 4}, DType::f16, Layout::ndhwc))).cluster, 1);
  EXPECT_EQ(launch_for(backward_keys(bwd_args({2, 32, 64, 64, 64}, DType::f16, Layout::ndhwc))).cluster, 1);
  EXPECT_EQ(launch_for(forward_keys(fwd_args({2, 320, 8, 8, 8}, DType::f16, Layout::ndhwc))).cluster, 1);
  EXPECT_EQ(launch_for(backward_keys(bwd_args({2, 30, 8, 8, 8}, DType::f16, Layout::ndhwc))).cluster, 1);
  // NCDHW never launches clusters.
  EXPECT_EQ(launch_for(backward_keys(bwd_args({2, 320, 8, 8, 8}))).cluster, 1);
}

// ---------------------------------------------------------------------------------- splits
TEST(Heuristics, BigShapeForwardIsACooperativeSplit) {
  // nnU-Net stage 0: 64 instances of 2M elements. With NORMJIT_SPLIT=registers each instance is
  // split over co-resident CTAs that keep their tile in registers, the grid a whole number of
  // instances. (The L4's 58 SMs cannot hold the 128 chunks of one instance: it streams.)
  setenv("NORMJIT_SPLIT", "registers", 1);
  struct Restore {
    ~Restore() { unsetenv("NORMJIT_SPLIT"); }
  } restore;
  for (const char* name : {"H200", "H100", "A100"}) {
    const DeviceProfile dev = builtin_profile(name);
    const CallKeys k = forward_keys(fwd_args({2, 32, 128, 128, 128}));
    const Launch l = choose_launch(k.fusion, k.shape, dev, Policy::bounded);
    SCOPED_TRACE(dev.name);
    EXPECT_TRUE(l.cooperative);
    EXPECT_GT(l.chunks, 1);
    EXPECT_TRUE(l.config.cached) << l.tier;
    EXPECT_EQ(std::string(l.tier), "split, cached in registers");
    EXPECT_EQ(l.grid % l.chunks, 0);
    EXPECT_LE(l.grid, int64_t(dev.sms) * l.config.min_blocks);
    EXPECT_GE(l.chunks * l.chunk_vectors * l.config.vec, int64_t(128) * 128 * 128);  // chunks cover the instance
    EXPECT_LE(l.chunk_vectors, int64_t(l.config.threads) * l.config.items);          // a chunk fits the tile
    EXPECT_GT(l.partials, 0);
    EXPECT_GT(l.counters, 0);
  }
}

TEST(Heuristics, BigShapeForwardIsTheResidentSplit) {
  // nnU-Net stage 0 on the big GPUs: two CTAs of 256 per SM, or one of 512 where an instance at
  // 256 needs more chunks than half what a CTA of 256 merges (forward 128, backward 256),
  // chunks of at most one shared-memory slot, the pipeline's deadlock-freedom condition
  // (kernels/resident_split.cuh), slots within a CTA's share of the SM. The forward by default,
  // the backward where it measured faster (resident_backward_pays, resident_plan), and both with
  // NORMJIT_SPLIT=resident. (The A100's backward slots, x and dy in 164 KB, are too small for 108
  // SMs to hold an instance.)
  for (const char* name : {"H200", "H100"}) {
    const DeviceProfile dev = builtin_profile(name);
    auto backward_threads = [&](const Shape& s) {
      const CallKeys k = backward_keys(bwd_args(s));
      const Launch l = choose_launch(k.fusion, k.shape, dev, Policy::bounded);
      return l.config.resident ? l.config.threads : 0;
    };
    auto forward_threads = [&](const Shape& s) {
      const CallKeys k = forward_keys(fwd_args(s));
      const Launch l = choose_launch(k.fusion, k.shape, dev, Policy::bounded);
      return l.config.resident ? l.config.threads : 0;
    };
    SCOPED_TRACE(name);
    EXPECT_EQ(forward_threads({2, 32, 128, 128, 128}), 512);  // 147 chunks at 256, 74 at 512
    EXPECT_EQ(forward_threads({2, 32, 80, 192, 160}), 512);   // 172 at 256
    EXPECT_EQ(forward_threads({2, 64, 64, 64, 64}), 256);     // 19 at 256
    EXPECT_EQ(forward_threads({2, 48, 96, 96, 96}), 256);     // 62 at 256
    EXPECT_EQ(backward_threads({2, 32, 128, 128, 128}), 512);  // 342 chunks at 256, 171 at 512
    EXPECT_EQ(backward_threads({2, 32, 80, 192, 160}), 512);   // 400 at 256, 200 at 512
    EXPECT_EQ(backward_threads({2, 64, 64, 64, 64}), 256);     // 43 at 256
    // 342 chunks at 256; at 512 too few steps (32 x 171 chunks on 132 CTAs: 42), so it keeps 256.
    EXPECT_EQ(backward_threads({1, 32, 128, 128, 128}), 256);
    // 22 chunks at 512 in 22 steps: streams (session 4: 90 us resident, 86 streamed).
    EXPECT_EQ(backward_threads({1, 64, 64, 64, 64}), 0);
  }
  setenv("NORMJIT_SPLIT", "resident", 1);
  struct Restore {
    ~Restore() { unsetenv("NORMJIT_SPLIT"); }
  } restore;
  for (const char* name : {"H200", "H100", "A100"}) {
    const DeviceProfile dev = builtin_profile(name);
    for (int dir = 0; dir < (std::string(name) == "A100" ? 1 : 2); ++dir) {
      const CallKeys k = dir == 0 ? forward_keys(fwd_args({2, 32, 128, 128, 128}))
                                  : backward_keys(bwd_args({2, 32, 128, 128, 128}));
      const Launch l = choose_launch(k.fusion, k.shape, dev, Policy::bounded);
      SCOPED_TRACE(dev.name + " " + describe(k.fusion) + ": " + l.tier + " " + describe(l.config));
      ASSERT_TRUE(l.config.resident);
      // The backward's 171 chunks an instance exceed the grid of 132: its slots refill early (the
      // forward's 74 do not).
      EXPECT_EQ(l.early_refill, l.chunks > l.grid);
      EXPECT_EQ(std::string(l.tier), l.early_refill ? "split, resident in shared memory (pipelined, early refill)"
                                                    : "split, resident in shared memory (pipelined)");
      EXPECT_TRUE(l.cooperative);
      EXPECT_FALSE(l.config.cached);
      EXPECT_EQ(l.config.threads, 512);
      EXPECT_EQ(l.config.min_blocks, 1);
      EXPECT_EQ(l.grid, int64_t(dev.sms) * l.config.min_blocks);
      EXPECT_GE(l.config.stages, 3);
      EXPECT_LE(l.chunk_vectors, int64_t(l.config.threads) * l.config.items);
      EXPECT_GE(l.chunks * l.chunk_vectors * l.config.vec, int64_t(128) * 128 * 128);
      EXPECT_LT((l.chunks - 1) * l.chunk_vectors * l.config.vec, int64_t(128) * 128 * 128);
      EXPECT_LE(l.chunks - 1, int64_t(l.config.stages - 2) * l.grid);
      EXPECT_LE(ring_bytes(k.fusion, l.config) + 2048, dev.smem_per_sm / l.config.min_blocks);
      // Thread j merges chunk j, in the backward also chunk j + threads.
      EXPECT_LE(l.chunks, l.config.threads * (dir == 0 ? 1 : 2));
      EXPECT_EQ(l.exchange, 1 + 2 * 64 * l.chunks);
      EXPECT_GT(l.counters, 0);
    }
  }
  // An instance of more chunks than a CTA of 256 merges (293 of 1792 vectors) takes the CTA of 512
  // (147 chunks of 3567 at least; 198 of 2648 fill the same 3 steps of 132 CTAs).
  const Launch big = launch_for(forward_keys(fwd_args({1, 2, 64, 256, 256})));
  EXPECT_TRUE(big.config.resident && big.config.threads == 512 && big.chunks == 198) << big.tier;
  // Past the deadlock-freedom bound (one instance of 2^26 elements) it streams.
  const CallKeys huge = forward_keys(fwd_args({1, 1, 1 << 26}));
  EXPECT_FALSE(launch_for(huge).config.resident) << launch_for(huge).tier;
  // Nor without 16-byte vectors (cp.async moves 16 bytes), nor channels-last, nor eval.
  EXPECT_FALSE(launch_for(forward_keys(fwd_args({2, 32, 127, 127, 127}))).config.resident);
  EXPECT_FALSE(launch_for(forward_keys(fwd_args({2, 32, 128, 128, 128}, DType::f16, Layout::ndhwc))).config.resident);
}

TEST(Heuristics, ResidentChunksFillTheirSteps) {
  // The resident split walks its units in steps of a grid (chunk s of CTA b is unit s * grid + b),
  // so the forward takes as many chunks as fit the fewest chunks' steps: each step then moves as
  // little as it can (resident_step_balanced_chunks). The backward keeps the fewest (measured
  // slower balanced where an instance spans more than a grid). H100, fp16 forward (two CTAs of 256
  // a SM, 264 CTAs):
  auto resident = [](const Shape& s, DType dtype = DType::f16, bool backward = false) {
    const CallKeys k = backward ? backward_keys(bwd_args(s, dtype)) : forward_keys(fwd_args(s, dtype));
    const Launch l = launch_for(k, "H100");
    EXPECT_TRUE(l.config.resident) << l.tier;
    return l;
  };
  // 128 instances: 19 chunks of 1725 vectors (9.2 steps, the tenth 21 % full) become 20 of 1639
  // (9.7 steps); 21 would take 11.
  const Launch mid = resident({2, 64, 64, 64, 64});
  EXPECT_EQ(mid.chunks, 20);
  EXPECT_EQ(mid.chunk_vectors, 1639);
  EXPECT_EQ(mid.grid, 264);
  // 8 instances of 19 chunks fill 152 of the 264 CTAs; 33 chunks fill them all, in one step.
  const Launch few = resident({1, 8, 64, 64, 64});
  EXPECT_EQ(few.chunks, 33);
  EXPECT_EQ(few.grid, 264);
  // 16 instances of 19 chunks: 1.15 steps, so two steps of 33 chunks.
  EXPECT_EQ(resident({2, 8, 64, 64, 64}).chunks, 33);
  // A CTA of 512 (74 chunks at 512, 132 CTAs, 64 instances in 35.9 steps): unchanged.
  EXPECT_EQ(resident({2, 32, 128, 128, 128}).chunks, 74);
  // The backward: the fewest chunks that fit a slot (342 of 767 vectors, 1.3 grids an instance).
  EXPECT_EQ(resident({1, 32, 128, 128, 128}, DType::f16, true).chunks, 342);
  // Every plan over a sweep of shapes: within the kernel's limits (launchable); the forward's in
  // no more steps than the fewest chunks' (the chunks that fit one slot), and one more chunk would
  // take more; the backward's the fewest.
  const DeviceProfile dev = builtin_profile("H100");
  int moved = 0;
  for (DType dtype : {DType::f16, DType::f32})
    for (bool backward : {false, true})
      for (int64_t n : {1, 2})
        for (int64_t c : {1, 2, 8, 16, 30, 64})
          for (int64_t d : {48, 64, 80, 96, 112, 128}) {
            const Shape s{n, c, d, d, d};
            const CallKeys k = backward ? backward_keys(bwd_args(s, dtype)) : forward_keys(fwd_args(s, dtype));
            const Launch l = choose_launch(k.fusion, k.shape, dev, Policy::bounded);
            if (!l.config.resident) continue;
            SCOPED_TRACE(describe(k.fusion) + " " + std::to_string(n) + "x" + std::to_string(c) + "x" +
                         std::to_string(d) + "^3: " + std::to_string(l.chunks) + " chunks");
            EXPECT_TRUE(launchable(k.fusion, k.shape, l, dev));
            const int64_t nvec = k.shape.spatial / l.config.vec;
            const int64_t slot = int64_t(l.config.threads) * l.config.items;
            const int64_t fewest = ceil_div(nvec, ceil_div(nvec, ceil_div(nvec, slot)));
            auto steps = [&](int64_t chunks) {
              const int64_t units = n * c * chunks;
              return ceil_div(units, std::min<int64_t>(units, int64_t(dev.sms) * l.config.min_blocks));
            };
            if (backward) {
              EXPECT_EQ(l.chunks, fewest);
              continue;
            }
            EXPECT_GE(l.chunks, fewest);
            EXPECT_EQ(steps(l.chunks), steps(fewest));
            const int64_t more = ceil_div(nvec, ceil_div(nvec, l.chunks + 1));
            EXPECT_TRUE(more == l.chunks || steps(more) > steps(fewest) || more > l.config.threads ||
                        more - 1 > int64_t(l.config.stages - 2) * l.grid);
            moved += l.chunks != fewest;
          }
  EXPECT_GT(moved, 10);
}

// NORMJIT_RESIDENT_SLOTS is read once per process, so each setting runs in a fresh one (the
// threadsafe death-test style re-executes the test binary).
TEST(HeuristicsDeathTest, ResidentSlotsSetThePipelineDepth) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto depth_is = [](const char* value, int stages, int items) {
    setenv("NORMJIT_RESIDENT_SLOTS", value, 1);
    const Launch l = launch_for(forward_keys(fwd_args({2, 32, 128, 128, 128})));
    const bool ok = l.config.resident && l.config.stages == stages && l.config.items == items &&
                    l.chunks - 1 <= int64_t(stages - 2) * l.grid &&
                    int64_t(stages) * l.config.items * l.config.threads * 16 + 2048 <= builtin_profile("H200").smem_per_sm;
    std::exit(ok ? 0 : 1);
  };
  // H200, fp16 forward: the slots share ~225 KB, at most 8 vectors a thread.
  EXPECT_EXIT(depth_is("3", 3, 8), testing::ExitedWithCode(0), "");
  EXPECT_EXIT(depth_is("6", 6, 4), testing::ExitedWithCode(0), "");
  EXPECT_EXIT(depth_is("9", 4, 7), testing::ExitedWithCode(0), "") << "out of range: the default";
  EXPECT_EXIT(depth_is("two", 4, 7), testing::ExitedWithCode(0), "") << "not a number: the default";
}

// NORMJIT_RESIDENT_BALANCE=0 keeps the fewest chunks that fit a slot (read once per process).
TEST(HeuristicsDeathTest, ResidentBalanceCanBeTurnedOff) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto chunks_are = [](const char* value, int chunks) {
    setenv("NORMJIT_RESIDENT_BALANCE", value, 1);
    std::exit(launch_for(forward_keys(fwd_args({2, 64, 64, 64, 64})), "H100").chunks == chunks ? 0 : 1);
  };
  EXPECT_EXIT(chunks_are("0", 19), testing::ExitedWithCode(0), "");
  EXPECT_EXIT(chunks_are("1", 20), testing::ExitedWithCode(0), "");
  EXPECT_EXIT(chunks_are("off", 20), testing::ExitedWithCode(0), "") << "not 0 or 1: the default";
}

TEST(Heuristics, BigShapeStreamsThroughL2) {
  // NORMJIT_SPLIT=l2 (and the L4, whose 58 SMs hold too little of an instance) streams each chunk
  // twice, sized so a round's reads fit in half the L2.
  setenv("NORMJIT_SPLIT", "l2", 1);
  struct Restore {
    ~Restore() { unsetenv("NORMJIT_SPLIT"); }
  } restore;
  for (const char* name : {"H200", "H100", "A100", "L4"}) {
    if (std::string(name) == "L4") unsetenv("NORMJIT_SPLIT");
    const DeviceProfile dev = builtin_profile(name);
    const CallKeys k = forward_keys(fwd_args({2, 32, 128, 128, 128}));
    const Launch l = choose_launch(k.fusion, k.shape, dev, Policy::bounded);
    SCOPED_TRACE(dev.name);
    EXPECT_TRUE(l.cooperative);
    EXPECT_FALSE(l.config.cached);
    EXPECT_FALSE(l.config.resident);
    EXPECT_EQ(l.grid % l.chunks, 0);
    EXPECT_LE(l.grid, int64_t(dev.sms) * l.config.min_blocks);
    EXPECT_GE(l.chunks * l.chunk_vectors * l.config.vec, int64_t(128) * 128 * 128);
    const int64_t round_bytes = l.grid * l.chunk_vectors * l.config.vec * 2;
    EXPECT_LE(round_bytes, dev.l2_bytes / 2 + l.grid * l.config.threads * l.config.items * 16) << round_bytes;
  }
}

TEST(Heuristics, BigShapeBackwardAndOtherSplits) {
  const DeviceProfile h200 = builtin_profile("H200");
  for (DType dt : {DType::f16, DType::f32}) {
    for (Layout layout : {Layout::ncdhw, Layout::ndhwc}) {
      const CallKeys k = backward_keys(bwd_args({2, 32, 128, 128, 128}, dt, layout));
      const Launch l = choose_launch(k.fusion, k.shape, h200, Policy::bounded);
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + layout_name(layout) + ": " + l.tier);
      EXPECT_GT(l.chunks, 1);
      if (l.cooperative && !l.config.resident) {
        EXPECT_EQ(l.grid % l.chunks, 0);
        EXPECT_LE(l.grid, int64_t(h200.sms) * l.config.min_blocks);
      }
      EXPECT_GE(l.chunks * l.chunk_vectors * (layout == Layout::ncdhw ? l.config.vec : 1), int64_t(128) * 128 * 128);
    }
  }
  // Eval is elementwise: split for parallelism, no exchange between chunks.
  ForwardArgs e = fwd_args({2, 32, 128, 128, 128});
  e.use_input_stats = false;
  e.save_mean = e.save_rstd = nullptr;
  e.running_mean = static_cast<float*>(fake_ptr(9));
  e.running_var = static_cast<float*>(fake_ptr(10));
  const Launch l = launch_for(forward_keys(e));
  EXPECT_FALSE(l.cooperative);
  EXPECT_FALSE(l.config.cached);
  EXPECT_EQ(l.partials, 0);
  EXPECT_GT(l.chunks, 1);
  EXPECT_EQ(l.grid, 64 * l.chunks);
}

TEST(Heuristics, NcdhwStreamedSplitTakesChunksOfFewerTileSteps) {
  // The NCDHW split that streams each chunk twice takes more chunks than the L2 budget's count
  // where that cuts the tile steps a chunk walks: fp32 (2,32,128^3)'s backward ran 86 chunks of
  // 3 steps on 86 of 132 SMs, and now runs 128 of 2. More chunks of as many steps measured slower
  // (fp16 (2,32,80,192,160): 2 x 50 chunks, 3 steps each, stays). Forced to stream
  // (NORMJIT_SPLIT=l2): the fp16 backward of (2,32,80,192,160) now takes the resident split.
  setenv("NORMJIT_SPLIT", "l2", 1);
  struct Restore {
    ~Restore() { unsetenv("NORMJIT_SPLIT"); }
  } restore;
  const DeviceProfile h100 = builtin_profile("H100");
  struct Row {
    Shape shape;
    DType dtype;
    int chunks;
    int64_t grid;
  };
  for (const Row& r : {Row{{2, 32, 128, 128, 128}, DType::f32, 128, 128},
                       Row{{2, 32, 80, 192, 160}, DType::f16, 50, 100},
                       Row{{2, 32, 80, 192, 160}, DType::bf16, 50, 100},
                       Row{{2, 32, 80, 192, 160}, DType::f32, 100, 100},
                       Row{{1, 1, 256, 256, 256}, DType::f16, 132, 132}}) {
    const CallKeys k = backward_keys(bwd_args(r.shape, r.dtype));
    const Launch l = choose_launch(k.fusion, k.shape, h100, Policy::bounded);
    SCOPED_TRACE(std::string(dtype_name(r.dtype)) + " " + std::to_string(r.shape[2]) + ": " + l.tier);
    EXPECT_EQ(l.tier, std::string("split, streamed twice (second read from L2)"));
    EXPECT_EQ(l.chunks, r.chunks);
    EXPECT_EQ(l.grid, r.grid);
  }
  // Every streamed training split, forward or backward, on every built-in GPU: one round of
  // co-resident CTAs, whole instances a round, and a round of several instances reads within
  // half the L2 (plus a tile a CTA of rounding; an instance too large for the budget even at a
  // chunk a slot takes a round alone).
  int checked = 0;
  for (const char* name : {"H200", "H100", "A100", "L4"}) {
    const DeviceProfile dev = builtin_profile(name);
    for (const Shape& shape : {Shape{2, 32, 128, 128, 128}, Shape{2, 32, 80, 192, 160}, Shape{1, 3, 101, 103, 107},
                               Shape{2, 64, 64, 64, 64}, Shape{1, 1, 256, 256, 256}, Shape{4, 5, 96, 96, 96}}) {
      for (DType dt : {DType::f16, DType::f32}) {
        for (bool forward : {true, false}) {
          const CallKeys k = forward ? forward_keys(fwd_args(shape, dt)) : backward_keys(bwd_args(shape, dt));
          const Launch l = choose_launch(k.fusion, k.shape, dev, Policy::bounded);
          if (l.tier != std::string("split, streamed twice (second read from L2)") || l.chunks < 2) continue;
          SCOPED_TRACE(std::string(name) + " " + dtype_name(dt) + (forward ? " fwd " : " bwd ") +
                       std::to_string(shape[1]) + "x" + std::to_string(shape[2]));
          EXPECT_LE(l.grid, int64_t(dev.sms) * l.config.min_blocks);
          EXPECT_EQ(l.grid % l.chunks, 0);
          // The next round's whole chunk is asked of L2 before each exchange, where sm_90's bulk
          // prefetch exists (tile_ring.cuh).
          EXPECT_EQ(l.l2_prefetch_vectors, dev.arch >= 90 ? l.chunk_vectors * 25 / 100 : 0);
          const int64_t per_vec = int64_t(l.config.vec) * dtype_size(dt) * (forward ? 1 : 2);
          if (l.grid > l.chunks)
            EXPECT_LE(l.grid * l.chunk_vectors * per_vec,
                      dev.l2_bytes / 2 + l.grid * l.config.threads * l.config.items * per_vec);
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 20);
}

TEST(Heuristics, ChannelsLastSplitFillsTheGpu) {
  // A channels-last training tensor that fits the L2 budget in few chunks still gets enough to
  // fill the co-resident CTA slots (2 per SM on the H200), as long as a chunk keeps 2 tiles of
  // 128 rows (the forward keeps them in shared memory where the tensor fits on chip); the workspace holds a pair per column per chunk plus the merged totals.
  const DeviceProfile h200 = builtin_profile("H200");
  struct Row {
    Shape shape;
    bool forward;
    int chunks;
    int64_t grid;
  };
  for (const Row& r : {Row{{2, 128, 32, 32, 32}, true, 66, 264}, Row{{2, 128, 32, 32, 32}, false, 66, 264},
                       Row{{2, 256, 16, 16, 16}, true, 16, 128}, Row{{2, 256, 16, 16, 16}, false, 16, 128},
                       Row{{2, 64, 64, 64, 64}, true, 132, 264}, Row{{2, 64, 64, 64, 64}, false, 132, 264}}) {
    {
      const bool forward = r.forward;
      const CallKeys k = forward ? forward_keys(fwd_args(r.shape, DType::f16, Layout::ndhwc))
                                 : backward_keys(bwd_args(r.shape, DType::f16, Layout::ndhwc));
      const Launch l = choose_launch(k.fusion, k.shape, h200, Policy::bounded);
      SCOPED_TRACE(std::to_string(r.shape[1]) + " channels, " + std::to_string(r.shape[2]) + "^3" +
                   (forward ? " fwd" : " bwd"));
      EXPECT_EQ(l.chunks, r.chunks);
      EXPECT_EQ(l.grid, r.grid);
      EXPECT_TRUE(l.cooperative);
      const int64_t insts = l.grid / l.chunks, columns = 64;  // fp16: 8 lanes of 8 channels
      EXPECT_EQ(l.partials, insts * (l.chunks + 1) * columns * 2);
    }
  }
  // Where the L2 budget keeps an instance whole, it stays whole: one chunk needs no exchange.
  // (8 channels: one 16-byte vector a row, 4096 positions, more than a CTA's registers hold; the
  // forward keeps its 4 tiles in shared memory.)
  const CallKeys k = forward_keys(fwd_args({2, 8, 16, 16, 16}, DType::f16, Layout::ndhwc));
  const Launch l = choose_launch(k.fusion, k.shape, h200, Policy::bounded);
  EXPECT_EQ(l.tier, std::string("channels-last split, kept in shared memory"));
  EXPECT_EQ(l.chunks, 1);
  EXPECT_FALSE(l.cooperative);
}

TEST(Heuristics, ChannelsLastForwardKeepsChunksOnChip) {
  // The training forward of a channels-last tensor that fits in the CTAs' shared memory (the kept
  // split, kernels/nhwc_ring.cuh): chunks of at most `stages` tiles, every CTA co-resident (one
  // round), x read once, the launch's shared memory the slots its chunks fill. Not where it does
  // not fit, not for eval, not for flat rows, not under NORMJIT_SPLIT=l2 or registers. The
  // backward keeps x and dy where both fit its slots ((2,256,16^3) fp16 on the H100/H200). Also
  // where the chunks are fewer than the exchange's columns (every CTA reads every chunk's pairs):
  // (2,256,16^3) and (3,72,20,21,22).
  struct Row {
    Shape shape;
    DType dtype;
    bool kept;
  };
  const Row rows[] = {
      {{2, 128, 32, 32, 32}, DType::f16, true},   {{1, 64, 58, 58, 60}, DType::f16, true},
      {{2, 16, 32, 32, 32}, DType::bf16, true},   {{1, 24, 40, 48, 37}, DType::f16, true},
      {{2, 128, 32, 32, 32}, DType::f32, false},  // 32 MB: more than the slots
      {{2, 64, 64, 64, 64}, DType::f16, false},   {{2, 32, 128, 128, 128}, DType::f16, false},
      {{2, 30, 32, 32, 32}, DType::f16, false},   // flat super-rows
      {{2, 320, 8, 8, 8}, DType::f16, false},     // a CTA holds a unit: the deep tier
      {{2, 256, 16, 16, 16}, DType::f16, true},   {{3, 72, 20, 21, 22}, DType::f16, true},  // chunks < 64 columns
  };
  for (const char* device : {"H100", "H200", "A100"}) {
    const DeviceProfile dev = builtin_profile(device);
    for (const Row& r : rows) {
      const CallKeys k = forward_keys(fwd_args(r.shape, r.dtype, Layout::ndhwc));
      const Launch l = choose_launch(k.fusion, k.shape, dev, Policy::bounded);
      SCOPED_TRACE(std::string(device) + " " + dtype_name(r.dtype) + " C=" + std::to_string(r.shape[1]) + " " +
                   l.tier);
      EXPECT_TRUE(launchable(k.fusion, k.shape, l, dev));
      if (std::string(device) == "A100" && r.kept) {  // 164 KB of shared memory an SM: 4 slots
        if (l.config.resident) EXPECT_EQ(l.config.stages, 4);
        continue;
      }
      EXPECT_EQ(l.config.resident, r.kept);
      if (!r.kept) continue;
      EXPECT_EQ(l.tier, std::string("channels-last split, kept in shared memory"));
      EXPECT_EQ(l.config.stages, 6) << describe(l.config);  // 96 KB of each CTA's ~110
      EXPECT_FALSE(l.config.cached);
      const int64_t tile_rows = int64_t(l.config.threads / l.config.group) * l.config.items;
      EXPECT_LE(l.chunk_vectors, l.config.stages * tile_rows);
      const int64_t tiles = (l.chunk_vectors + tile_rows - 1) / tile_rows;
      EXPECT_EQ(l.smem_bytes, tiles * ring_bytes(k.fusion, l.config) / l.config.stages);
      const int64_t units = r.shape[0] * ((r.shape[1] + l.config.group * l.config.vec - 1) / (l.config.group * l.config.vec));
      EXPECT_EQ(l.grid, units * l.chunks) << "one round";
      EXPECT_LE(l.grid, int64_t(dev.sms) * l.config.min_blocks);
      EXPECT_GT(l.partials, 0);
      // The backward keeps its chunks (x and dy) where they fit its slots, all co-resident; eval
      // streams, and so does the forward under NORMJIT_SPLIT=l2 or registers.
      FusionKey b = k.fusion;
      b.direction = Direction::backward;
      b.save = false;
      const Launch bl = choose_launch(b, k.shape, dev, Policy::bounded);
      if (bl.config.resident) {
        EXPECT_TRUE(launchable(b, k.shape, bl, dev)) << bl.tier;
        const int64_t b_rows = int64_t(bl.config.threads / bl.config.group) * bl.config.items;
        EXPECT_LE(bl.chunk_vectors, bl.config.stages * b_rows);
        EXPECT_LE(bl.grid, int64_t(dev.sms) * bl.config.min_blocks);
        EXPECT_EQ(bl.smem_bytes, (bl.chunk_vectors + b_rows - 1) / b_rows * ring_bytes(b, bl.config) / bl.config.stages);
      }
      if (std::string(device) != "A100" && r.dtype == DType::f16 && r.shape[1] == 256)
        EXPECT_TRUE(bl.config.resident && bl.chunks > 1) << bl.tier;
      FusionKey e = k.fusion;
      e.train = false;
      e.save = false;
      EXPECT_FALSE(choose_launch(e, k.shape, dev, Policy::bounded).config.resident);
      for (const char* mode : {"l2", "registers"}) {
        setenv("NORMJIT_SPLIT", mode, 1);
        const Launch m = choose_launch(k.fusion, k.shape, dev, Policy::bounded);
        unsetenv("NORMJIT_SPLIT");
        EXPECT_FALSE(m.config.resident) << mode;
      }
      // A launch whose chunks exceed the slots is refused.
      Launch big = l;
      big.chunks = std::max(1, l.chunks / 2);
      big.chunk_vectors = (l.chunk_vectors * l.chunks + big.chunks - 1) / big.chunks;
      if (big.chunk_vectors > l.config.stages * tile_rows) EXPECT_FALSE(launchable(k.fusion, k.shape, big, dev));
    }
  }
}

TEST(Heuristics, KeptSplitNarrowsTilesThatLeaveSmsIdle) {
  // The kept split takes 32-byte rows (2 fp16 vectors) where its natural 128-byte tiles would run
  // fewer CTAs than half the SMs, or leave over a quarter of their lanes past C; elsewhere the
  // natural width, which measured faster where the grid fills the SMs (nhwc_kept_split).
  struct Row {
    Shape shape;
    int lanes;
  };
  const Row rows[] = {
      {{1, 96, 16, 16, 16}, 2},     // 2 tiles x 16 chunks: 32 CTAs
      {{3, 72, 20, 21, 22}, 2},     // C = 72 in tiles of 64 channels: 56 of 128 lanes idle
      {{2, 80, 20, 20, 20}, 2},     // 48 of 128 idle
      {{2, 256, 16, 16, 16}, 8},    // 128 CTAs, every lane busy
      {{4, 320, 12, 12, 12}, 8},    // 120 CTAs
      {{2, 128, 32, 32, 32}, 8},    // 264 CTAs
  };
  const DeviceProfile dev = builtin_profile("H100");
  for (const Row& r : rows)
    for (Direction d : {Direction::forward, Direction::backward}) {
      const CallKeys k = d == Direction::forward ? forward_keys(fwd_args(r.shape, DType::f16, Layout::ndhwc))
                                                 : backward_keys(bwd_args(r.shape, DType::f16, Layout::ndhwc));
      const Launch l = choose_launch(k.fusion, k.shape, dev, Policy::bounded);
      SCOPED_TRACE("C=" + std::to_string(r.shape[1]) + (d == Direction::forward ? " fwd " : " bwd ") + l.tier);
      if (d == Direction::backward && r.shape[1] == 128) continue;  // x and dy exceed the slots: streamed
      EXPECT_TRUE(l.config.resident && l.chunks > 1);
      EXPECT_EQ(l.config.group, r.lanes);
      EXPECT_TRUE(launchable(k.fusion, k.shape, l, dev));
      EXPECT_LE(l.grid, int64_t(dev.sms) * l.config.min_blocks) << "one round";
    }
}

TEST(Heuristics, NcdhwBackwardKeepsDyInSharedMemoryBeyondOneWave) {
  // The register tier of a CTA of 256 x 16 vectors with dy in shared memory (64 KB, two CTAs an SM)
  // replaces the CTA of 512 x 8 vectors (one an SM) where that one takes more waves: fp16/bf16
  // instances of 2049-4096 16-byte vectors, more of them than the SMs. Not where one wave of the
  // CTA of 512 already holds them, not for fp32 32^3 (8192 vectors: a split), not where an
  // activation reads the residual back (the slots hold dy alone), not where two such CTAs do not
  // fit an SM's shared memory (L4), not before sm_80, not under the exact policy.
  struct Row {
    Shape shape;
    DType dtype;
    const char* device;
    bool residual_act;
    bool shared_dy;
  };
  const Row rows[] = {
      {{2, 128, 32, 32, 32}, DType::f16, "H100", false, true},
      {{2, 128, 32, 32, 32}, DType::bf16, "H200", false, true},
      {{3, 47, 24, 29, 31}, DType::f16, "H100", false, true},
      {{1, 128, 32, 32, 32}, DType::f16, "A100", false, true},   // 128 instances on 108 SMs
      {{1, 128, 32, 32, 32}, DType::f16, "H100", false, false},  // 128 on 132: one wave either way
      {{2, 128, 32, 32, 32}, DType::f32, "H100", false, false},
      {{2, 128, 32, 32, 32}, DType::f16, "H100", true, false},
      {{2, 128, 32, 32, 32}, DType::f16, "L4", false, false},
      {{2, 128, 16, 16, 32}, DType::f16, "H100", false, false},  // 1024 vectors: the CTA of 256 x 4
  };
  for (const Row& r : rows) {
    BackwardArgs a = bwd_args(r.shape, r.dtype, Layout::ncdhw);
    if (r.residual_act) {
      a.residual = a.x;
      a.activation = Activation::leaky_relu;
    }
    const CallKeys k = backward_keys(a);
    const Launch l = launch_for(k, r.device);
    SCOPED_TRACE(std::string(r.device) + " " + describe(k.fusion) + " N=" + std::to_string(r.shape[0]) + ": " + l.tier);
    EXPECT_EQ(keeps_dy_in_shared_memory(l.config), r.shared_dy);
    EXPECT_TRUE(launchable(k.fusion, k.shape, l, builtin_profile(r.device)));
    if (r.shared_dy) {
      EXPECT_EQ(l.config.threads, 256);
      EXPECT_EQ(l.config.items, 16);
      EXPECT_EQ(l.config.min_blocks, 2);
      EXPECT_EQ(l.config.stages, 1);
      EXPECT_EQ(ring_bytes(k.fusion, l.config), 64 << 10);
      EXPECT_EQ(l.grid, r.shape[0] * r.shape[1]);
      EXPECT_EQ(launch_for(k, r.device, Policy::exact).config.stages, 0) << "the exact policy sizes the registers";
    }
  }
}

TEST(Heuristics, NcdhwBackwardSumsWeightGradsInClusters) {
  // The NCDHW backward of a tier holding one instance a CTA, with 2-8 samples and weights, on
  // sm_90: clusters of the channel's N CTAs, units channel by channel, no last-CTA pass (no
  // scratch). Not for N = 1 or N > 8, not without weights, not before sm_90, not for a split or a
  // tier of several instances a CTA (those sum in the CTA where they hold every sample).
  struct Row {
    Shape shape;
    const char* device;
    bool affine;
    int cluster;
  };
  const Row rows[] = {
      {{2, 256, 16, 16, 16}, "H100", true, 2},  {{2, 256, 12, 12, 12}, "H200", true, 2},
      {{2, 128, 32, 32, 32}, "H100", true, 2},  {{4, 128, 32, 32, 32}, "H100", true, 4},
      {{8, 64, 32, 32, 32}, "H100", true, 8},   {{3, 17, 11, 13, 17}, "H100", true, 3},
      {{9, 64, 16, 16, 16}, "H100", true, 1},   {{1, 256, 16, 16, 16}, "H100", true, 1},
      {{2, 256, 16, 16, 16}, "H100", false, 1}, {{2, 256, 16, 16, 16}, "A100", true, 1},
      {{2, 320, 8, 8, 8}, "H100", true, 1},     // a warp an instance: summed in the CTA
      {{2, 32, 128, 128, 128}, "H100", true, 1},  // the resident split
  };
  for (const Row& r : rows) {
    const DeviceProfile dev = builtin_profile(r.device);
    BackwardArgs a = bwd_args(r.shape, DType::f16, Layout::ncdhw);
    if (!r.affine) a.weight = a.bias = {}, a.dweight = a.dbias = nullptr;
    const CallKeys k = backward_keys(a);
    const Launch l = choose_launch(k.fusion, k.shape, dev, Policy::bounded);
    SCOPED_TRACE(std::string(r.device) + " N=" + std::to_string(r.shape[0]) + " " + l.tier);
    EXPECT_EQ(l.cluster, r.cluster);
    EXPECT_EQ(l.config.cluster, r.cluster > 1);
    EXPECT_TRUE(launchable(k.fusion, k.shape, l, dev));
    if (r.cluster > 1) {
      EXPECT_EQ(l.grid, r.shape[0] * r.shape[1]) << "one round, a CTA an instance";
      EXPECT_TRUE(l.channel_major);
      EXPECT_EQ(l.scratch, 0) << "no last-CTA pass";
      Launch two_rounds = l;
      two_rounds.grid = l.grid / 2;
      EXPECT_FALSE(launchable(k.fusion, k.shape, two_rounds, dev));
    }
  }
}

TEST(Heuristics, ChannelsLastForwardKeepsSmallUnitsWhole) {
  // The kept forward with one chunk a unit (heuristics nhwc_kept_whole): where a unit of 16-byte
  // rows is at most 36 KB and the units fit one CTA an SM, the channel tile narrows to one 16-byte
  // vector and no exchange runs. The rows follow the H200 measurements the rule was drawn from
  // (session 31): kept whole where it won (11^3 to 13^3), the kept split where it lost (14^3 and
  // up, or more units than SMs).
  struct Row {
    Shape shape;
    DType dtype;
    bool whole;
  };
  const Row rows[] = {
      {{2, 256, 11, 11, 11}, DType::f16, true},   {{2, 256, 12, 12, 12}, DType::f16, true},
      {{1, 320, 12, 12, 12}, DType::bf16, true},  {{2, 320, 12, 12, 12}, DType::f16, true},
      {{2, 64, 12, 12, 12}, DType::f16, true},    {{2, 256, 13, 13, 13}, DType::f16, true},  // 35 KB a unit
      {{3, 200, 11, 12, 13}, DType::bf16, true}, {{1, 24, 12, 12, 12}, DType::f32, true},
      {{2, 256, 14, 14, 14}, DType::f16, false},  // 44 KB a unit: level with the split
      {{2, 256, 16, 16, 16}, DType::f16, false},  {{1, 96, 16, 16, 16}, DType::f16, false},
      {{4, 320, 12, 12, 12}, DType::f16, false},  // 160 units: more than the SMs
      {{2, 320, 12, 12, 12}, DType::f32, false},  // fp32: 160 units of 4 channels
      {{2, 30, 12, 12, 12}, DType::f16, false},   // flat super-rows
  };
  const DeviceProfile dev = builtin_profile("H200");
  for (const Row& r : rows) {
    const CallKeys k = forward_keys(fwd_args(r.shape, r.dtype, Layout::ndhwc));
    const Launch l = choose_launch(k.fusion, k.shape, dev, Policy::bounded);
    SCOPED_TRACE(std::string(dtype_name(r.dtype)) + " C=" + std::to_string(r.shape[1]) + " D=" +
                 std::to_string(r.shape[2]) + ": " + l.tier);
    EXPECT_TRUE(launchable(k.fusion, k.shape, l, dev));
    const bool whole = std::string(l.tier).find("kept whole") != std::string::npos;
    EXPECT_EQ(whole, r.whole);
    if (!whole) continue;
    EXPECT_TRUE(l.config.resident);
    EXPECT_FALSE(l.config.cached);
    EXPECT_FALSE(l.cooperative);
    EXPECT_EQ(l.chunks, 1);
    EXPECT_EQ(l.config.group * l.config.vec * dtype_size(r.dtype), 16) << describe(l.config);
    const int64_t spatial = k.shape.spatial;
    EXPECT_EQ(l.chunk_vectors, spatial);
    EXPECT_EQ(l.grid, r.shape[0] * (r.shape[1] / l.config.vec));
    EXPECT_LE(l.grid, dev.sms);
    const int64_t tile_rows = int64_t(l.config.threads / l.config.group) * l.config.items;
    const int64_t tiles = (spatial + tile_rows - 1) / tile_rows;
    EXPECT_LE(tiles, l.config.stages);
    EXPECT_EQ(l.smem_bytes, tiles * ring_bytes(k.fusion, l.config) / l.config.stages);
    // The configs are the kept split's at a narrower tile: in the bounded set already.
    const auto configs = enumerate_configs(k.fusion, Policy::bounded, dev);
    EXPECT_TRUE(std::any_of(configs.begin(), configs.end(),
                            [&](const KernelConfig& c) { return bytes_equal(c, l.config); }));
    // Not for eval, nor under NORMJIT_SPLIT=l2 or registers.
    FusionKey e = k.fusion;
    e.train = false;
    e.save = false;
    EXPECT_EQ(std::string(choose_launch(e, k.shape, dev, Policy::bounded).tier).find("kept whole"), std::string::npos);
    for (const char* mode : {"l2", "registers"}) {
      setenv("NORMJIT_SPLIT", mode, 1);
      const Launch m = choose_launch(k.fusion, k.shape, dev, Policy::bounded);
      unsetenv("NORMJIT_SPLIT");
      EXPECT_FALSE(m.config.resident) << mode;
    }
  }
}

TEST(Heuristics, ChannelsLastBackwardKeepsSmallUnitsWhole) {
  // The kept backward with one chunk a unit (nhwc_kept_whole): x and dy of a unit in the CTA's
  // slots (at most 3 tiles of 1024 positions in two CTAs' share of an H200 SM; 2 with a residual
  // that the activation's gradient reads), where the forward's rule keeps it whole too; the weight
  // gradients in clusters of the channel tile's N CTAs (2-8 samples, affine, no residual).
  struct Row {
    Shape shape;
    DType dtype;
    bool whole, cluster;
    Activation act = Activation::identity;
    bool residual = false;
  };
  const Row rows[] = {
      {{2, 256, 12, 12, 12}, DType::f16, true, true},
      {{1, 320, 12, 12, 12}, DType::bf16, true, false},  // one sample: its CTAs write the weights' gradients
      {{2, 256, 13, 13, 13}, DType::f16, true, true},    // 2197 positions: 3 tiles
      {{5, 16, 11, 12, 13}, DType::f16, true, true},
      {{9, 8, 11, 11, 11}, DType::f16, true, false},     // more samples than a portable cluster
      {{2, 64, 12, 12, 12}, DType::f16, true, false, Activation::leaky_relu, true},
      {{2, 64, 13, 13, 13}, DType::f16, false, false, Activation::leaky_relu, true},  // 3 tiles of 3 tensors
      {{2, 256, 14, 14, 14}, DType::f16, false, false},
      {{2, 256, 16, 16, 16}, DType::f16, false, false},
      {{4, 320, 12, 12, 12}, DType::f16, false, false},  // 160 units: more than the SMs
      {{2, 30, 12, 12, 12}, DType::f16, false, false},   // flat super-rows
  };
  const DeviceProfile dev = builtin_profile("H200");
  for (const Row& r : rows) {
    BackwardArgs a = bwd_args(r.shape, r.dtype, Layout::ndhwc);
    a.activation = r.act;
    if (r.residual) a.residual = a.dresidual = make_tensor(fake_ptr(9), r.dtype, r.shape, Layout::ndhwc);
    const CallKeys k = backward_keys(a);
    const Launch l = choose_launch(k.fusion, k.shape, dev, Policy::bounded);
    SCOPED_TRACE(std::string(dtype_name(r.dtype)) + " N=" + std::to_string(r.shape[0]) + " C=" +
                 std::to_string(r.shape[1]) + " D=" + std::to_string(r.shape[2]) + ": " + l.tier);
    EXPECT_TRUE(launchable(k.fusion, k.shape, l, dev));
    const bool whole = std::string(l.tier).find("kept whole") != std::string::npos;
    EXPECT_EQ(whole, r.whole);
    EXPECT_EQ(l.config.cluster, r.cluster);
    if (!whole) continue;
    EXPECT_TRUE(l.config.resident && !l.config.cached && !l.cooperative && l.chunks == 1);
    EXPECT_EQ(l.config.group * l.config.vec * dtype_size(r.dtype), 16) << describe(l.config);
    EXPECT_EQ(l.cluster, r.cluster ? r.shape[0] : 1);
    // No last CTA's pass where clusters or one sample write the weights' gradients.
    EXPECT_EQ(l.channel_major, r.cluster || r.shape[0] == 1);
    const int64_t tile_rows = int64_t(l.config.threads / l.config.group) * l.config.items;
    const int64_t tiles = (k.shape.spatial + tile_rows - 1) / tile_rows;
    EXPECT_LE(tiles, l.config.stages);
    EXPECT_EQ(l.smem_bytes, tiles * ring_bytes(k.fusion, l.config) / l.config.stages);
    const auto configs = enumerate_configs(k.fusion, Policy::bounded, dev);
    EXPECT_TRUE(std::any_of(configs.begin(), configs.end(),
                            [&](const KernelConfig& c) { return bytes_equal(c, l.config); }))
        << describe(l.config);
  }
}

TEST(Heuristics, ChannelsLastDeepStagesNarrowTheChannelTiles) {
  // Few positions and many channels: at 8 vectors a tile (64 fp16 channels) (2,320,8^3) had 10
  // units; tiles of fewer lanes give more units, each held whole by one CTA (no exchange), until
  // the grid has a CTA per SM or a row would be narrower than a 32-byte sector. The backward
  // narrows as the forward where it ends without the last CTA's weight-gradient pass (one sample,
  // or 2-8 in clusters on sm_90); with more samples, only where no CTA holds a unit at the
  // natural width (`natural_grid` > 0: it keeps that CTA of 256 and 8 lanes).
  struct Row {
    Shape shape;
    DType dtype;
    int threads, lanes;
    int64_t grid, natural_grid = 0;
  };
  for (const Row& r : {Row{{2, 320, 8, 8, 8}, DType::f16, 256, 2, 40},   // 512 positions: 128 rows x 4
                       Row{{2, 320, 4, 4, 4}, DType::f16, 64, 2, 40},  // 64 positions: a CTA of 64
                       Row{{1, 320, 4, 4, 4}, DType::bf16, 64, 2, 20},
                       Row{{2, 320, 8, 8, 8}, DType::f32, 256, 2, 80},   // 2 x 4 floats a row
                       Row{{2, 321, 4, 4, 4}, DType::f16, 256, 16, 42},  // 2-byte vectors: 16 lanes a row
                       Row{{16, 320, 4, 4, 4}, DType::f16, 64, 4, 160, 80},  // a CTA per SM at 4 lanes
                       Row{{4, 256, 8, 8, 8}, DType::bf16, 256, 2, 64}}) {
    for (bool forward : {true, false}) {
      const CallKeys k = forward ? forward_keys(fwd_args(r.shape, r.dtype, Layout::ndhwc))
                                 : backward_keys(bwd_args(r.shape, r.dtype, Layout::ndhwc));
      const Launch l = launch_for(k, "H100");
      SCOPED_TRACE(describe(l.config) + (forward ? " fwd " : " bwd ") + std::to_string(r.shape[0]) + "x" +
                   std::to_string(r.shape[1]) + "x" + std::to_string(r.shape[2]));
      const bool natural = !forward && r.natural_grid > 0;
      EXPECT_EQ(l.config.threads, natural ? 256 : r.threads);
      EXPECT_EQ(l.config.group, natural ? 8 : r.lanes);
      EXPECT_EQ(l.grid, natural ? r.natural_grid : r.grid);
      EXPECT_EQ(l.chunks, 1);
      EXPECT_TRUE(l.config.cached);
      EXPECT_FALSE(l.cooperative);
    }
  }
  // Where no tile of 32-byte rows holds a unit, tiles of one 16-byte vector do (instead of a split):
  // nnU-Net's (2,320,5,12,10), 600 positions; not for a backward with a residual (its fp16 tiles
  // spill), which stays a split.
  for (const Row& r : {Row{{2, 320, 5, 12, 10}, DType::f16, 256, 1, 80}, Row{{3, 200, 9, 10, 11}, DType::bf16, 256, 1, 75},
                       Row{{2, 64, 10, 10, 10}, DType::f32, 256, 1, 32}}) {
    for (bool forward : {true, false}) {
      const CallKeys k = forward ? forward_keys(fwd_args(r.shape, r.dtype, Layout::ndhwc))
                                 : backward_keys(bwd_args(r.shape, r.dtype, Layout::ndhwc));
      const Launch l = launch_for(k, "H100");
      SCOPED_TRACE(describe(l.config) + (forward ? " fwd " : " bwd ") + std::to_string(r.shape[1]));
      EXPECT_EQ(l.config.threads, r.threads);
      EXPECT_EQ(l.config.group, r.lanes);
      EXPECT_EQ(l.grid, r.grid);
      EXPECT_EQ(l.chunks, 1);
      EXPECT_TRUE(l.config.cached);
    }
  }
  BackwardArgs with_residual = bwd_args({2, 320, 5, 12, 10}, DType::f16, Layout::ndhwc);
  with_residual.residual = with_residual.x;
  with_residual.activation = Activation::leaky_relu;
  EXPECT_FALSE(launch_for(backward_keys(with_residual), "H100").config.cached);
  // Bigger volumes keep the natural width: a unit is more than a CTA holds at any width.
  EXPECT_EQ(launch_for(forward_keys(fwd_args({2, 128, 32, 32, 32}, DType::f16, Layout::ndhwc)), "H100").config.group, 8);
  EXPECT_EQ(launch_for(forward_keys(fwd_args({2, 32, 128, 128, 128}, DType::f16, Layout::ndhwc)), "H100").config.group,
            4);
  // Enough units at the natural width: no narrowing.
  EXPECT_EQ(launch_for(forward_keys(fwd_args({256, 64, 4, 4, 4}, DType::f16, Layout::ndhwc)), "H100").config.group, 8);
  // Where the backward keeps the pass (the A100 has no clusters) it keeps the natural width; the
  // backward without weights has none, there too.
  const BackwardArgs deep = bwd_args({2, 320, 4, 4, 4}, DType::f16, Layout::ndhwc);
  EXPECT_EQ(launch_for(backward_keys(deep), "A100").config.group, 8);
  BackwardArgs plain = deep;
  plain.weight = plain.bias = TensorArg{};
  plain.dweight = plain.dbias = nullptr;
  EXPECT_EQ(launch_for(backward_keys(plain), "A100").config.group, 2);
  EXPECT_EQ(launch_for(backward_keys(plain), "H100").config.group, 2);
  EXPECT_EQ(launch_for(backward_keys(plain), "H100").cluster, 1);
}

// ----------------------------------------------------------------- the bound on kernel configs
namespace {

struct Rng {
  std::mt19937_64 g;
  explicit Rng(uint64_t seed) : g(seed) {}
  int64_t uniform(int64_t lo, int64_t hi) { return lo + int64_t(g() % uint64_t(hi - lo + 1)); }
  bool coin(int percent = 50) { return uniform(0, 99) < percent; }
  template <typename T>
  T pick(std::initializer_list<T> v) {
    return v.begin()[uniform(0, int64_t(v.size()) - 1)];
  }
};

int64_t random_size(Rng& r) {
  switch (r.uniform(0, 5)) {
    case 0:
      return 1;
    case 1:
      return r.pick<int64_t>({2, 3, 5, 7, 11, 13, 17, 31, 61, 127, 251, 509, 1021, 2039});  // primes
    case 2:
      return int64_t(1) << r.uniform(0, 9);
    case 3:
      return r.uniform(1, 48);
    case 4:
      return r.uniform(32, 192);
    default:
      return r.uniform(100, 700);
  }
}

}  // namespace

TEST(Heuristics, EveryChosenConfigIsEnumerated) {
  Rng r(12345);
  const std::vector<DeviceProfile> devices = builtin_profiles();
  size_t checked = 0, huge = 0;
  // Distinct (fusion, config) pairs seen, per policy.
  std::vector<std::pair<FusionKey, KernelConfig>> seen[2];
  std::map<std::string, int> tiers;  // launches checked per size tier
  for (int i = 0; i < 10000; ++i) {
    const int dims = int(r.uniform(1, 3));
    Shape s{r.coin(80) ? r.uniform(1, 4) : random_size(r),
            r.coin(50) ? r.pick<int64_t>({32, 64, 128, 256, 320}) : random_size(r)};
    for (int d = 0; d < dims; ++d) s.push_back(random_size(r));
    if (r.coin(3)) {  // now and then a shape past 2^31 elements
      s = {r.uniform(1, 4), r.pick<int64_t>({1, 3, 32, 320}), r.uniform(1000, 1400), r.uniform(1000, 1400),
           r.uniform(1000, 1400)};
      ++huge;
    }
    const DType dt = r.pick({DType::f32, DType::f16, DType::bf16});
    const Layout layout = r.coin() ? Layout::ncdhw : Layout::ndhwc;
    const int align = r.pick({256, 256, 256, 8, 4, 2});
    const bool backward = r.coin();
    const bool affine = r.coin(70);
    const DType wdt = r.coin() ? DType::f32 : dt;
    const Activation act = Activation(r.uniform(0, int(Activation::tanh)));
    const bool residual = r.coin(20);

    CallKeys k;
    try {
      if (!backward) {
        ForwardArgs a = fwd_args(s, dt, layout, align);
        const bool eval = r.coin(20);
        int64_t spatial = 1;
        for (size_t d = 2; d < s.size(); ++d) spatial *= s[d];
        if (spatial <= 1 && !eval) continue;  // training needs more than one element (tested below)
        if (!affine)
          a.weight = a.bias = TensorArg();
        else
          a.weight.dtype = a.bias.dtype = wdt;
        if (residual) a.residual = make_tensor(fake_ptr(11, align), dt, s, layout);
        if (eval || r.coin(20)) {
          a.running_mean = static_cast<float*>(fake_ptr(9));
          a.running_var = static_cast<float*>(fake_ptr(10));
        }
        if (eval) a.use_input_stats = false, a.save_mean = a.save_rstd = nullptr;
        a.activation = act;
        k = forward_keys(a);
      } else {
        int64_t spatial = 1;
        for (size_t d = 2; d < s.size(); ++d) spatial *= s[d];
        if (spatial <= 1) continue;
        BackwardArgs a = bwd_args(s, dt, layout, align);
        if (!affine)
          a.weight = a.bias = TensorArg(), a.dweight = a.dbias = nullptr;
        else
          a.weight.dtype = a.bias.dtype = wdt;
        if (residual) a.residual = make_tensor(fake_ptr(11, align), dt, s, layout);
        a.activation = act;
        k = backward_keys(a);
      }
    } catch (const Error& e) {
      ADD_FAILURE() << "valid call rejected: " << e.what();
      continue;
    }
    if (k.empty) continue;
    const DeviceProfile& dev = devices[size_t(i) % devices.size()];
    for (Policy p : {Policy::bounded, Policy::exact}) {
      const Launch l = choose_launch(k.fusion, k.shape, dev, p);
      const std::vector<KernelConfig> all = enumerate_configs(k.fusion, p, dev);
      ASSERT_TRUE(contains(all, l.config))
          << "choose_launch returned a config enumerate_configs does not list (" << policy_name(p) << ", " << dev.name
          << "): " << describe(k.fusion) << " / " << describe(l.config) << " for N=" << k.shape.N << " C=" << k.shape.C
          << " spatial=" << k.shape.spatial;
      EXPECT_GE(l.grid, 1);
      EXPECT_GE(l.chunks, 1);
      if (l.cooperative) {
        EXPECT_LE(l.grid, int64_t(dev.sms) * l.config.min_blocks);
      }
      // The kernel's preconditions (a launch that breaks one hangs or computes garbage on the GPU),
      // for the default and for every launch autotune may time.
      ++tiers[l.tier];
      EXPECT_TRUE(launchable(k.fusion, k.shape, l, dev))
          << "choose_launch returned a launch its kernel cannot run (" << policy_name(p) << ", " << dev.name
          << "): " << describe(k.fusion) << " / " << describe(l.config) << " " << l.tier << ", chunks " << l.chunks
          << " of " << l.chunk_vectors << " vectors, grid " << l.grid << ", for N=" << k.shape.N
          << " C=" << k.shape.C << " spatial=" << k.shape.spatial;
      if (i % 10 == 0)
        for (const Launch& c : candidate_launches(k.fusion, k.shape, dev, p))
          EXPECT_TRUE(launchable(k.fusion, k.shape, c, dev)) << c.tier << " for " << describe(k.fusion);
      auto& v = seen[int(p)];
      if (std::none_of(v.begin(), v.end(), [&](const auto& x) {
            return bytes_equal(x.first, k.fusion) && bytes_equal(x.second, l.config);
          }))
        v.emplace_back(k.fusion, l.config);
    }
    ++checked;
  }
  EXPECT_GT(checked, 8000u);
  EXPECT_GT(huge, 100u);
  EXPECT_GT(tiers["split, resident in shared memory (pipelined)"], 100);  // the sweep reaches the splits
  EXPECT_GT(tiers["channels-last split, streamed twice"], 100);
  std::printf(
      "[ stream   ] %zu calls checked (%zu past 2^31 elements); distinct (fusion, config): bounded %zu, exact %zu\n",
      checked, huge, seen[0].size(), seen[1].size());
  for (const auto& [tier, n] : tiers) std::printf("[ stream   ] %6d launches: %s\n", n, tier.c_str());
}

TEST(Heuristics, BoundedSetSizes) {
  // The bound on compiles per fusion and GPU arch that the README documents. If a heuristics change
  // moves these numbers, update the README's "When does normjit compile?" table with them.
  struct Row {
    Direction d;
    Layout layout;
    DType dtype;
    bool train;
    size_t bounded;
  };
  const Row rows[] = {
      // Training NCDHW: + the resident split for the 16-byte class, 32- and 64-bit indexing.
      // The resident split has two CTA sizes (256, and 512 for larger instances).
      {Direction::forward, Layout::ncdhw, DType::f16, true, 60},
      {Direction::forward, Layout::ncdhw, DType::f32, true, 46},
      {Direction::forward, Layout::ncdhw, DType::f16, false, 56},
      // The backward with weight gradients (sm_90): + the cluster variants of the tiers of one
      // instance a CTA (4 tiers x the vector classes, and the dy-in-shared-memory tier's 16-byte
      // class), 32-bit indexing; + that tier (16-byte class, 2 index widths).
      {Direction::backward, Layout::ncdhw, DType::f16, true, 79},
      {Direction::backward, Layout::ncdhw, DType::f32, true, 61},
      // Channels-last: 16 lane/vector classes x (2 tiers + 2 splits) x 2 index widths, + the flat
      // super-row configs (lanes at run time: 3 per index width).
      // The training forward: + the kept split for the 16-byte class (4 lane counts x 2 index widths).
      {Direction::forward, Layout::ndhwc, DType::f16, true, 122},
      {Direction::forward, Layout::ndhwc, DType::f32, true, 98},
      {Direction::forward, Layout::ndhwc, DType::f16, false, 114},
      // The backward with weight gradients (sm_90): + the tiers' cluster variants, 32-bit indexing
      // (18 lane/vector classes for fp16, 14 for fp32, x 2 tiers); + the kept whole's configs for
      // the 16-byte class (4 lane counts x 2 index widths, and in clusters x 1).
      {Direction::backward, Layout::ndhwc, DType::f16, true, 162},
      {Direction::backward, Layout::ndhwc, DType::f32, true, 130},
  };
  std::printf("[ bound    ] configs per fusion (bounded / exact):\n");
  for (const Row& row : rows) {
    const FusionKey f = make_fusion(row.d, row.dtype, DType::f32, row.layout, row.train, true, false, false,
                                    row.train && row.d == Direction::forward, Activation::identity);
    const size_t bounded = enumerate_configs(f, Policy::bounded).size();
    const size_t exact = enumerate_configs(f, Policy::exact).size();
    std::printf("[ bound    ]   %-48s %4zu / %4zu\n", describe(f).c_str(), bounded, exact);
    EXPECT_EQ(bounded, row.bounded) << describe(f);
    EXPECT_GE(exact, bounded) << describe(f);
    // The bound does not depend on the epilogue (activation, residual, affine dtype, bf16 vs f16),
    // except that a residual's channels-last backward has no cluster variants (they spilled:
    // heuristics nhwc_cluster_tier); the NCDHW backward's keep theirs, but lose the tier that keeps
    // dy in shared memory where an activation reads the residual back (its slots hold dy alone).
    const FusionKey g = make_fusion(row.d, row.dtype == DType::f16 ? DType::bf16 : row.dtype, row.dtype, row.layout,
                                    row.train, true, true, false, false, Activation::silu);
    const auto f_configs = enumerate_configs(f, Policy::bounded);
    const size_t clustered = size_t(std::count_if(f_configs.begin(), f_configs.end(),
                                                  [](const KernelConfig& c) { return c.cluster; }));
    const bool f16 = row.dtype == DType::f16;
    const size_t want_clustered = row.d != Direction::backward ? 0u
                                  : row.layout == Layout::ndhwc ? (f16 ? 40u : 32u)
                                                                : (f16 ? 17u : 13u);
    EXPECT_EQ(clustered, want_clustered) << describe(f);
    const size_t shared_dy = size_t(std::count_if(f_configs.begin(), f_configs.end(), keeps_dy_in_shared_memory));
    EXPECT_EQ(shared_dy, row.d == Direction::backward && row.layout == Layout::ncdhw ? 3u : 0u) << describe(f);
    EXPECT_EQ(enumerate_configs(g, Policy::bounded).size(),
              bounded - (row.layout == Layout::ndhwc ? clustered : shared_dy))
        << describe(g);
    // No duplicates.
    const auto all = enumerate_configs(f, Policy::bounded);
    for (size_t i = 0; i < all.size(); ++i)
      for (size_t j = i + 1; j < all.size(); ++j) EXPECT_FALSE(bytes_equal(all[i], all[j])) << describe(all[i]);
  }
}

// The shared-memory ring of streamed kernels: only where the device has room for min_blocks CTAs
// of it (else the cooperative launch would not be co-resident), only for 16-byte vectors (cp.async
// copies 16 bytes), and on every built-in GPU the big NCDHW shapes get one where memory allows.
TEST(Heuristics, RingFitsTheDeviceSharedMemory) {
  size_t rings = 0;
  for (const DeviceProfile& dev : builtin_profiles()) {
    for (Direction d : {Direction::forward, Direction::backward})
      for (Layout layout : {Layout::ncdhw, Layout::ndhwc})
        for (DType dt : {DType::f32, DType::f16, DType::bf16})
          for (bool residual : {false, true}) {
            const FusionKey f = make_fusion(d, dt, DType::f32, layout, true, true, residual,
                                            false, d == Direction::forward, Activation::leaky_relu);
            for (const KernelConfig& c : enumerate_configs(f, Policy::bounded, dev)) {
              if (c.stages == 0) {
                EXPECT_EQ(ring_bytes(f, c), 0);
                continue;
              }
              ++rings;
              // A register tier with slots: the NCDHW backward's dy in one stage of shared memory.
              const bool shared_dy = keeps_dy_in_shared_memory(c);
              if (shared_dy) {
                EXPECT_TRUE(layout == Layout::ncdhw && d == Direction::backward && !residual) << describe(c);
                EXPECT_EQ(c.stages, 1) << describe(c);
              }
              if (layout == Layout::ncdhw) EXPECT_EQ(c.group, c.threads) << describe(c);
              EXPECT_EQ(int(c.vec) * dtype_size(dt), 16) << describe(c);
              EXPECT_GE(c.stages, (c.resident && layout == Layout::ndhwc) || shared_dy ? 1 : 2) << describe(c);
              EXPECT_EQ(ring_bytes(f, c),
                        int64_t(c.stages) * (shared_dy ? 1 : ring_tensors(f)) * c.items * c.threads * 16);
              // min_blocks CTAs of it, each with ~1 KB reserved by the driver and small static smem;
              // the channels-last column sums besides (a float per thread and vector element; two
              // in the backward). The channels-last backward has no ring, only the kept slots.
              if (layout == Layout::ndhwc && d == Direction::backward) EXPECT_TRUE(c.resident) << describe(c);
              const int64_t column_sums =
                  layout == Layout::ndhwc ? int64_t(c.threads) * c.vec * 4 * (d == Direction::backward ? 2 : 1) : 0;
              EXPECT_LE(int64_t(c.min_blocks) * (ring_bytes(f, c) + 2048 + column_sums), dev.smem_per_sm)
                  << dev.name << ": " << describe(f) << " / " << describe(c);
            }
          }
  }
  EXPECT_GT(rings, 0u);
  // The (2,32,128^3) fp16 training forward: the resident split's 4 slots of 7 vectors per thread
  // in one CTA of 512 on the H200; with NORMJIT_SPLIT=l2 it streams through a ring of 3 stages.
  ForwardArgs a = fwd_args({2, 32, 128, 128, 128}, DType::f16, Layout::ncdhw, 256);
  const CallKeys k = forward_keys(a);
  const Launch r = choose_launch(k.fusion, k.shape, builtin_profile("H200"), Policy::bounded);
  EXPECT_TRUE(r.config.resident);
  EXPECT_EQ(ring_bytes(k.fusion, r.config), 4 * 7 * 512 * 16);
  setenv("NORMJIT_SPLIT", "l2", 1);
  const Launch l = choose_launch(k.fusion, k.shape, builtin_profile("H200"), Policy::bounded);
  unsetenv("NORMJIT_SPLIT");
  EXPECT_EQ(l.config.stages, 3) << describe(l.config);
  EXPECT_EQ(ring_bytes(k.fusion, l.config), 3 * 4 * 512 * 16);
  // Channels-last, the same shape: the forward streams x through 3 stages, two CTAs of 256 per
  // SM; the backward loads its tiles into registers.
  const CallKeys kc = forward_keys(fwd_args({2, 32, 128, 128, 128}, DType::f16, Layout::ndhwc, 256));
  const Launch fc = choose_launch(kc.fusion, kc.shape, builtin_profile("H200"), Policy::bounded);
  EXPECT_EQ(ring_bytes(kc.fusion, fc.config), 3 * 1 * 4 * 256 * 16) << describe(fc.config);
  FusionKey bf = kc.fusion;
  bf.direction = Direction::backward;
  bf.save = false;
  const Launch bc = choose_launch(bf, kc.shape, builtin_profile("H200"), Policy::bounded);
  EXPECT_EQ(bc.config.stages, 0) << describe(bc.config);
  EXPECT_FALSE(bc.config.cached) << describe(bc.config);
}

// ------------------------------------------------------------------------------- zero sizes
// make_tensor gives PyTorch's strides, which treat a size-0 dim as size 1 ((2,32,8,8,0) has
// strides (2048,64,8,1,1)); contiguous_tensor() multiplies the sizes as they are.
TEST(Validation, ZeroSizeShapesGiveEmptyKeys) {
  for (const Shape& s :
       {Shape{0, 32, 8, 8, 8}, Shape{2, 0, 8, 8, 8}, Shape{2, 32, 0, 8, 8}, Shape{2, 32, 8, 8, 0}, Shape{0, 0, 0}}) {
    for (Layout layout : {Layout::ncdhw, Layout::ndhwc}) {
      EXPECT_TRUE(forward_keys(fwd_args(s, DType::f16, layout)).empty);
      EXPECT_TRUE(backward_keys(bwd_args(s, DType::f16, layout)).empty);
    }
  }
  EXPECT_FALSE(forward_keys(fwd_args({1, 1, 2})).empty);
  ForwardArgs a = fwd_args({2, 32, 8, 8, 8});
  a.x = contiguous_tensor(fake_ptr(0), DType::f16, {2, 32, 8, 0, 8});
  a.y = contiguous_tensor(fake_ptr(1), DType::f16, {2, 32, 8, 0, 8});
  EXPECT_TRUE(forward_keys(a).empty);
}

// ----------------------------------------------------------------------------- error messages
TEST(Validation, ErrorsNameTheProblem) {
  auto expect_error = [](const std::string& msg, std::initializer_list<const char*> parts) {
    ASSERT_FALSE(msg.empty()) << "expected a normjit::Error";
    for (const char* p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  };
  const Shape s{2, 32, 8, 8, 8};

  {  // wrong number of dims
    ForwardArgs a = fwd_args({2, 32});
    expect_error(error_of([&] { forward_keys(a); }), {"x must have 3 to 5 dims", "got 2 dims"});
    BackwardArgs b = bwd_args({2, 32, 4, 4, 4});
    b.x.ndim = 6;
    expect_error(error_of([&] { backward_keys(b); }), {"x must have 3 to 5 dims"});
  }
  {  // y in another memory format
    ForwardArgs a = fwd_args(s);
    a.y = make_tensor(fake_ptr(1), DType::f16, s, Layout::ndhwc);
    expect_error(error_of([&] { forward_keys(a); }), {"y has strides", "expected x's strides", "same memory format"});
    BackwardArgs b = bwd_args(s);
    b.dy = make_tensor(fake_ptr(1), DType::f16, s, Layout::ndhwc);
    expect_error(error_of([&] { backward_keys(b); }), {"dy has strides"});
  }
  {  // y with other sizes or dtype
    ForwardArgs a = fwd_args(s);
    a.y = make_tensor(fake_ptr(1), DType::f16, {2, 32, 8, 8, 4}, Layout::ncdhw);
    expect_error(error_of([&] { forward_keys(a); }), {"y has sizes", "expected x's sizes"});
    a = fwd_args(s);
    a.y.dtype = DType::f32;
    expect_error(error_of([&] { forward_keys(a); }), {"y is f32", "expected x's dtype f16"});
  }
  {  // weight size mismatch
    ForwardArgs a = fwd_args(s);
    a.weight.sizes[0] = 16;
    expect_error(error_of([&] { forward_keys(a); }), {"weight has 16 elements", "expected C = 32"});
    BackwardArgs b = bwd_args(s);
    b.bias.sizes[0] = 31;
    expect_error(error_of([&] { backward_keys(b); }), {"bias has 31 elements", "expected C = 32"});
    a = fwd_args(s);
    a.bias = TensorArg();
    expect_error(error_of([&] { forward_keys(a); }), {"weight and bias must be given together"});
    a = fwd_args(s, DType::f16);
    a.weight.dtype = a.bias.dtype = DType::bf16;
    expect_error(error_of([&] { forward_keys(a); }), {"weight is bf16", "expected float32 or x's dtype f16"});
  }
  {  // eval without running statistics
    ForwardArgs a = fwd_args(s);
    a.use_input_stats = false;
    expect_error(error_of([&] { forward_keys(a); }), {"eval mode", "needs running_mean and running_var"});
    a.running_mean = static_cast<float*>(fake_ptr(9));
    expect_error(error_of([&] { forward_keys(a); }), {"running_mean and running_var must be given together"});
  }
  {  // one spatial element in training
    ForwardArgs a = fwd_args({2, 32, 1, 1, 1});
    expect_error(error_of([&] { forward_keys(a); }), {"more than 1 spatial element", "[2, 32, 1, 1, 1]"});
    BackwardArgs b = bwd_args({2, 32, 1});
    expect_error(error_of([&] { backward_keys(b); }), {"more than 1 spatial element"});
    // ... but eval is fine with a single element.
    a.use_input_stats = false;
    a.save_mean = a.save_rstd = nullptr;
    a.running_mean = static_cast<float*>(fake_ptr(9));
    a.running_var = static_cast<float*>(fake_ptr(10));
    EXPECT_FALSE(forward_keys(a).empty);
  }
  {  // unsupported strides: spatial dims transposed, or a gap inside the spatial dims
    ForwardArgs a = fwd_args(s);
    std::swap(a.x.strides[3], a.x.strides[4]);
    a.y.strides[3] = a.x.strides[3], a.y.strides[4] = a.x.strides[4];
    expect_error(error_of([&] { forward_keys(a); }), {"x has unsupported strides", "NCDHW", "NDHWC", "contiguous"});
    a = fwd_args(s);
    a.x.strides[4] = 2;
    expect_error(error_of([&] { forward_keys(a); }), {"x has unsupported strides"});
  }
  {  // backward without saved statistics; dweight without weight; dresidual without residual
    BackwardArgs b = bwd_args(s);
    b.save_rstd = nullptr;
    expect_error(error_of([&] { backward_keys(b); }), {"needs save_mean and save_rstd"});
    b = bwd_args(s);
    b.weight = b.bias = TensorArg();
    expect_error(error_of([&] { backward_keys(b); }), {"dweight/dbias requested without weight and bias"});
    b = bwd_args(s);
    b.dresidual = make_tensor(fake_ptr(12), DType::f16, s, Layout::ncdhw);
    expect_error(error_of([&] { backward_keys(b); }), {"dresidual was given but the forward had no residual"});
  }
  {  // negative eps, unknown activation, null data
    ForwardArgs a = fwd_args(s);
    a.eps = -1;
    expect_error(error_of([&] { forward_keys(a); }), {"eps must be a finite number >= 0"});
    a = fwd_args(s);
    a.activation = Activation(200);
    expect_error(error_of([&] { forward_keys(a); }), {"unknown activation code 200"});
    a = fwd_args(s);
    a.x.data = nullptr;
    expect_error(error_of([&] { forward_keys(a); }), {"x has a null data pointer"});
  }
  // Messages say where they come from.
  EXPECT_EQ(error_of([&] { forward_keys(fwd_args({2, 32})); }).rfind("normjit", 0), 0u);
}
