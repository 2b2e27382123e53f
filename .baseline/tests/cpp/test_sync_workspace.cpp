// The workspace's rules, without a GPU (a fake allocator stands in for the device): one buffer per
// (device, stream), grown only when a request does not fit, and the current buffer of a stream
// handed to every thread, including one whose lock-free last hit a grow elsewhere made stale.
// Many threads on a few streams: the ThreadSanitizer build checks the hot path here.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "runtime/sync_workspace.h"

namespace normjit {
namespace {

// Fake device memory: distinct addresses 4 GiB apart; the size of each allocation is recorded.
std::mutex g_alloc_mutex;
std::map<uint64_t, size_t> g_allocs;
uint64_t g_next = 0;

uint64_t fake_allocate(int, void*, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_alloc_mutex);
  g_next += uint64_t(1) << 32;
  g_allocs[g_next] = bytes;
  return g_next;
}

size_t allocations() {
  std::lock_guard<std::mutex> lock(g_alloc_mutex);
  return g_allocs.size();
}

// Whether w's three regions, in order inside one allocation, have room for the request.
bool holds(const Workspace& w, int64_t counters, int64_t partials, int64_t scratch) {
  const uint64_t c = reinterpret_cast<uintptr_t>(w.counters), p = reinterpret_cast<uintptr_t>(w.partials),
                 s = reinterpret_cast<uintptr_t>(w.scratch);
  std::lock_guard<std::mutex> lock(g_alloc_mutex);
  const auto it = g_allocs.find(c);
  if (it == g_allocs.end() || p < c || s < p || s > c + it->second) return false;
  return p - c >= uint64_t(counters) * 4 && s - p >= uint64_t(partials) * 4 &&
         c + it->second - s >= uint64_t(scratch) * 4;
}

void* stream(int i) { return reinterpret_cast<void*>(uintptr_t(0x5000 + 16 * i)); }
constexpr int kDevice = 40;  // never a real one: no test here reaches the driver

class SyncWorkspace : public testing::Test {
 protected:
  void SetUp() override { set_workspace_allocator_for_tests(fake_allocate); }
  void TearDown() override { set_workspace_allocator_for_tests(nullptr); }
};

TEST_F(SyncWorkspace, GrowsOnlyWhenARequestDoesNotFit) {
  const size_t before = allocations();
  const Workspace a = get_workspace(kDevice, stream(0), 8, 100, 0);
  EXPECT_TRUE(holds(a, 8, 100, 0));
  const Workspace b = get_workspace(kDevice, stream(0), 1, 1, 0);  // fits: the same buffer
  EXPECT_EQ(b.counters, a.counters);
  EXPECT_EQ(b.partials, a.partials);
  EXPECT_EQ(b.scratch, a.scratch);
  EXPECT_EQ(allocations(), before + 1);

  const Workspace c = get_workspace(kDevice, stream(0), 8, 5000, 3);  // does not fit: grows
  EXPECT_NE(c.counters, a.counters);
  EXPECT_TRUE(holds(c, 8, 5000, 3));
  EXPECT_EQ(allocations(), before + 2);
  EXPECT_EQ(get_workspace(kDevice, stream(0), 1, 1, 0).counters, c.counters) << "the grown buffer from now on";

  const Workspace d = get_workspace(kDevice, stream(1), 1, 1, 0);
  EXPECT_NE(d.counters, c.counters) << "another stream has a buffer of its own";
  const Workspace e = get_workspace(kDevice + 1, stream(0), 1, 1, 0);
  EXPECT_NE(e.counters, c.counters) << "another device has a buffer of its own";
  EXPECT_NE(e.counters, d.counters);
  EXPECT_EQ(get_workspace(kDevice, stream(0), 1, 1, 0).counters, c.counters) << "back to the first stream";
}

TEST_F(SyncWorkspace, AGrowByAnotherThreadReachesThisThreadsNextCall) {
  const Workspace mine = get_workspace(kDevice, stream(2), 1, 1, 1);  // now this thread's last hit
  Workspace grown;
  std::thread([&] { grown = get_workspace(kDevice, stream(2), 1, 1 << 20, 1); }).join();
  EXPECT_NE(grown.counters, mine.counters);
  EXPECT_EQ(get_workspace(kDevice, stream(2), 1, 1, 1).counters, grown.counters)
      << "a request the old buffer fits must still get the stream's current buffer";
}

TEST_F(SyncWorkspace, ManyThreadsOnAFewStreams) {
  constexpr int kThreads = 8, kStreams = 3, kCalls = 20000;
  const size_t before = allocations();
  std::atomic<int> bad{0}, done{0};
  std::vector<std::vector<unsigned*>> last(kThreads, std::vector<unsigned*>(kStreams));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < kCalls; ++i) {
        const int s = 10 + int(rng() % kStreams);
        const int64_t counters = rng() % 64, scratch = rng() % 1024;
        const int64_t partials = rng() % 64 == 0 ? rng() % (1 << 18) : rng() % 512;  // rare large ones grow
        if (!holds(get_workspace(kDevice, stream(s), counters, partials, scratch), counters, partials, scratch)) bad++;
      }
      // Once every thread is done growing, small requests (hits of buffers these threads saw last,
      // some of which others outgrew) must all land on each stream's current buffer.
      done++;
      while (done.load() < kThreads) std::this_thread::yield();
      for (int s = 0; s < kStreams; ++s) last[t][s] = get_workspace(kDevice, stream(10 + s), 1, 1, 1).counters;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0) << "workspaces that did not hold their request";
  // Buffers double: a few grows per stream, not one per large request.
  EXPECT_LE(allocations() - before, size_t(kStreams * 3 * 10));
  for (int s = 0; s < kStreams; ++s) {
    const unsigned* current = get_workspace(kDevice, stream(10 + s), 1, 1, 1).counters;
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(last[t][s], current) << "thread " << t << ", stream " << 10 + s;
  }
}

}  // namespace
}  // namespace normjit
