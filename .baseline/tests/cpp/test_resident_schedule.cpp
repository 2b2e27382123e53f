// The resident split's pipeline schedule (kernels/resident_split.cuh), played out on the host.
//
// Every CTA b walks steps 0 .. steps + L - 1 (L = NJ_OUTPUT_LAG = stages - 1). At step s it loads
// unit s * grid + b (phase A, never waits), publishes the partials of the unit it loaded at step
// s - 1 (phase B, never waits) and then writes the unit it loaded at step s - L, which waits until
// every chunk of that unit's instance has been published (phase C). A CTA's C can therefore wait
// for a peer that is itself waiting: the kernel hangs when such waits close a cycle. The kernel's
// comment and the heuristics (resident_plan) claim that chunks - 1 <= (stages - 2) * grid rules that
// out. Here a model of those three phases runs until every CTA finishes or none can move (a hang:
// publications only accumulate, so if this round-robin order gets stuck, every order does), for
// small pipelines exhaustively and for every resident launch the heuristics choose.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/call_keys.h"
#include "schedule/device_profile.h"
#include "schedule/heuristics.h"
#include "test_call_args.h"

using namespace normjit;

namespace {

struct Pipeline {
  int64_t grid;       // CTAs, all co-resident
  int64_t chunks;     // units per instance (an instance's units are consecutive)
  int64_t instances;  // N * C
  int stages;         // shared-memory slots
  int distance = 1;   // steps from a unit's load to its phase B (the kernel: 1)
};

// Whether every CTA of the pipeline reaches its end.
bool completes(const Pipeline& p) {
  const int64_t units = p.chunks * p.instances;
  const int64_t steps = (units + p.grid - 1) / p.grid;  // num_rounds
  const int64_t lag = p.stages - 1;                      // NJ_OUTPUT_LAG
  std::vector<char> published(size_t(units), 0);
  // Chunks of each instance published so far.
  std::vector<int64_t> ready(size_t(p.instances), 0);
  std::vector<int64_t> step(size_t(p.grid), 0);     // the step each CTA is in
  std::vector<char> phase_b_done(size_t(p.grid), 0);  // its phases A and B of that step ran
  int64_t finished = 0;
  for (bool moved = true; moved && finished < p.grid;) {
    moved = false;
    for (int64_t b = 0; b < p.grid; ++b) {
      while (step[b] < steps + lag) {
        const int64_t s = step[b];
        if (!phase_b_done[b]) {  // A needs nothing; B publishes the unit loaded `distance` steps ago
          if (s >= p.distance && s < steps + p.distance) {
            const int64_t u = (s - p.distance) * p.grid + b;
            if (u < units && !published[u]) published[u] = 1, ++ready[u / p.chunks];
          }
          phase_b_done[b] = 1;
          moved = true;
        }
        if (s >= lag) {  // C: the unit loaded `lag` steps ago needs its whole instance
          const int64_t u = (s - lag) * p.grid + b;
          if (u < units && ready[u / p.chunks] < p.chunks) break;  // waits
        }
        ++step[b], phase_b_done[b] = 0;
        moved = true;
        if (step[b] == steps + lag) ++finished;
      }
    }
  }
  return finished == p.grid;
}

// The bound of the heuristics (resident_plan), for any prefetch distance: an instance's chunks may
// reach stages - 1 - distance steps past its first.
bool within_bound(const Pipeline& p) { return p.chunks - 1 <= int64_t(p.stages - 1 - p.distance) * p.grid; }

TEST(ResidentSchedule, TheBoundRulesOutAHang) {
  int cases = 0;
  for (int stages = 3; stages <= 6; ++stages)
    for (int64_t grid = 1; grid <= 9; ++grid)
      for (int64_t chunks = 1; chunks - 1 <= int64_t(stages - 2) * grid; ++chunks)
        for (int64_t instances = 1; instances <= 7; ++instances) {
          const Pipeline p{grid, chunks, instances, stages};
          ASSERT_TRUE(completes(p)) << "hang within the bound: grid " << grid << ", chunks " << chunks << ", instances "
                                    << instances << ", stages " << stages;
          ++cases;
        }
  EXPECT_GT(cases, 3000);
}

TEST(ResidentSchedule, TheModelSeesAHang) {
  // An instance whose chunks reach a full pipeline past its first: its first chunk's CTA waits at C
  // for a chunk no CTA can load before passing its own C. The model must report that, or the test
  // above would prove nothing.
  for (int stages = 3; stages <= 6; ++stages)
    for (int64_t grid = 1; grid <= 9; ++grid) {
      const Pipeline p{grid, int64_t(stages) * grid + 1, 2, stages};
      EXPECT_FALSE(within_bound(p));
      EXPECT_FALSE(completes(p)) << "grid " << grid << ", stages " << stages;
    }
  // The bound is sufficient, not necessary: past it a launch whose instances happen to align
  // with the steps still completes (3 slots, 2 CTAs, one instance of 4 chunks loaded in steps 0 and
  // 1: all published by step 2's phase B, before its first C), but one more chunk hangs (CTA 0
  // loads chunk 4 in step 2 and, in that step's phase C, waits for its own publication in step 3).
  EXPECT_FALSE(within_bound({2, 4, 1, 3}));
  EXPECT_TRUE(completes({2, 4, 1, 3}));
  EXPECT_FALSE(completes({2, 5, 2, 3}));
}

TEST(ResidentSchedule, PrefetchDistanceTwoCostsAStepOfReach) {
  // An experiment for the next GPU session (docs/PERF_NOTES.md): loads issued two steps before
  // their statistics, so that two chunks are in flight per CTA. With the same slots an instance's
  // chunks may then reach one step less: stages - 3 steps.
  int cases = 0;
  for (int stages = 4; stages <= 6; ++stages)
    for (int64_t grid = 1; grid <= 8; ++grid)
      for (int64_t chunks = 1; chunks <= int64_t(stages) * grid + 1; ++chunks)
        for (int64_t instances = 1; instances <= 6; ++instances) {
          const Pipeline p{grid, chunks, instances, stages, 2};
          if (within_bound(p)) {
            ASSERT_TRUE(completes(p)) << "grid " << grid << ", chunks " << chunks << ", stages " << stages;
            ++cases;
          }
        }
  EXPECT_GT(cases, 1000);
  // For the H200's (2,32,128^3) backward (264 CTAs, 342 chunks) 4 slots are then too few, 5 enough.
  EXPECT_FALSE(within_bound({264, 342, 64, 4, 2}));
  EXPECT_TRUE(within_bound({264, 342, 64, 5, 2}));
}

TEST(ResidentSchedule, EveryResidentLaunchCompletes) {
  // The nnU-Net shapes that take the resident split, both directions, every built-in GPU that
  // runs it, at the default depth; with NORMJIT_SPLIT=resident also shapes that would stream.
  setenv("NORMJIT_SPLIT", "resident", 1);
  struct Restore {
    ~Restore() { unsetenv("NORMJIT_SPLIT"); }
  } restore;
  const std::vector<Shape> shapes = {{2, 32, 128, 128, 128}, {2, 64, 64, 64, 64},    {1, 32, 128, 128, 128},
                                     {2, 32, 80, 192, 160},  {2, 64, 64, 128, 128},  {1, 2, 64, 256, 256},
                                     {2, 30, 128, 128, 128}, {4, 32, 96, 96, 96},    {2, 64, 40, 96, 80},
                                     {1, 1, 64, 128, 128},   {3, 5, 112, 112, 112},  {2, 16, 144, 144, 144}};
  int resident = 0;
  for (const DeviceProfile& dev : builtin_profiles())
    for (const Shape& s : shapes)
      for (int dir = 0; dir < 2; ++dir) {
        const CallKeys k = dir == 0 ? forward_keys(fwd_args(s)) : backward_keys(bwd_args(s));
        const Launch l = choose_launch(k.fusion, k.shape, dev, Policy::bounded);
        if (!l.config.resident) continue;
        const Pipeline p{l.grid, l.chunks, k.shape.N * k.shape.C, l.config.stages};
        SCOPED_TRACE(dev.name + " " + describe(k.fusion) + ": grid " + std::to_string(l.grid) + ", chunks " +
                     std::to_string(l.chunks) + ", stages " + std::to_string(l.config.stages));
        EXPECT_TRUE(within_bound(p));
        EXPECT_TRUE(completes(p));
        ++resident;
      }
  EXPECT_GT(resident, 30);
}

}  // namespace
