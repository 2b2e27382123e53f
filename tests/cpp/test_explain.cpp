// `normjit explain` / warm-up: the prediction on the random crop stream stays within the
// documented bound, names the right reasons, and is exactly what warm-up compiles; a warmed disk
// cache makes a second warm-up compile nothing. Also the command line's exit codes.
//
// The warm-up runs in a child process (this test binary re-executed on a DISABLED_ test) because
// the process-wide disk cache reads NORMJIT_CACHE_DIR once per process.
#include <gtest/gtest.h>

#include "test_helpers.h"
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "compile/disk_cache.h"
#include "driver/nvrtc.h"
#include "normjit/normjit.h"
#include "runtime/call_keys.h"
#include "tools/explain.h"
#include "tools/warmup.h"

extern char** environ;

namespace fs = std::filesystem;
using namespace normjit;
using namespace normjit::tools;

namespace {

using normjit_test::shell;
using normjit_test::TempDir;

constexpr uint64_t kSeed = 1;
constexpr int kStreamLength = 200;

std::vector<ExplainCall> stream_calls() {
  return explain_calls(random_crop_shapes(kStreamLength, kSeed), ExplainOptions{});
}

std::set<std::string> names_of(const std::vector<std::pair<FusionKey, KernelConfig>>& kernels) {
  std::set<std::string> out;
  for (const auto& [f, c] : kernels) out.insert(kernel_name(f, c));
  return out;
}

// The value of the "<field> ..." line of a disk-cache key.
std::string key_field(const std::string& key, const std::string& field) {
  std::istringstream in(key);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + " ", 0) == 0) return line.substr(field.size() + 1);
  return "";
}

// Runs this test binary on one (disabled) test with extra environment; returns the exit status.
int run_child(const std::string& test, const std::map<std::string, std::string>& env) {
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  std::vector<std::string> vars;
  for (char** e = environ; *e; ++e) {
    const std::string v = *e;
    if (env.count(v.substr(0, v.find('='))) || v.rfind("NORMJIT_DISABLE_DISK_CACHE=", 0) == 0) continue;
    vars.push_back(v);
  }
  for (const auto& [k, v] : env) vars.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (std::string& v : vars) envp.push_back(v.data());
  envp.push_back(nullptr);
  std::string filter = "--gtest_filter=" + test;
  std::string also = "--gtest_also_run_disabled_tests";
  char* argv[] = {const_cast<char*>(self.c_str()), filter.data(), also.data(), nullptr};
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid == 0) {
    execve(self.c_str(), argv, envp.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::map<std::string, std::string> read_report(const std::string& path, std::set<std::string>* compiled) {
  std::map<std::string, std::string> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const auto sp = line.find(' ');
    const std::string k = line.substr(0, sp), v = sp == std::string::npos ? "" : line.substr(sp + 1);
    if (k == "compiled_name")
      compiled->insert(v);
    else
      out[k] = v;
  }
  return out;
}

}  // namespace

// -------------------------------------------------------------------------------- prediction
TEST(Explain, RandomCropStreamStaysWithinTheBound) {
  const std::vector<Shape> shapes = random_crop_shapes(kStreamLength, kSeed);
  const std::vector<ExplainCall> calls = stream_calls();
  ASSERT_EQ(calls.size(), 2u * kStreamLength);  // forward and backward per shape

  const std::vector<FusionKey> fusions = explain_fusions(ExplainOptions{});
  ASSERT_EQ(fusions.size(), 2u);
  size_t total = 0;
  for (const FusionKey& f : fusions) {
    size_t kernels = 0;
    bool first = true;
    for (size_t i = 0; i < calls.size(); ++i) {
      const ExplainCall& c = calls[i];
      ASSERT_FALSE(c.empty);
      if (!bytes_equal(c.fusion, f)) continue;
      if (c.new_kernel) {
        ++kernels;
        EXPECT_EQ(c.shares_with, -1);
        if (first) {
          EXPECT_EQ(c.reason, "new fusion");
        } else {
          EXPECT_EQ(c.reason.rfind("new kernel config: ", 0), 0u) << c.reason;
          EXPECT_GT(c.reason.size(), std::string("new kernel config: ").size()) << "an empty diff";
        }
        first = false;
      } else {
        // Shares the kernel of an earlier call that introduced it.
        ASSERT_GE(c.shares_with, 0);
        ASSERT_LT(size_t(c.shares_with), i);
        const ExplainCall& owner = calls[size_t(c.shares_with)];
        EXPECT_TRUE(owner.new_kernel);
        EXPECT_TRUE(bytes_equal(owner.fusion, c.fusion));
        EXPECT_TRUE(bytes_equal(owner.config, c.config));
      }
    }
    const size_t bound = enumerate_configs(f, Policy::bounded).size();
    std::printf("[ explain  ] %s: %zu distinct kernels for %d random crops (bound %zu)\n", describe(f).c_str(), kernels,
                kStreamLength, bound);
    EXPECT_LE(kernels, bound);
    EXPECT_GE(kernels, 1u);
    total += kernels;
  }
  const std::set<Shape> distinct(shapes.begin(), shapes.end());
  std::printf(
      "[ explain  ] %zu distinct shapes (a torch.compile dynamic=False recompile each) vs %zu normjit kernels\n",
      distinct.size(), total);
  EXPECT_EQ(distinct_kernels(calls).size(), total);
  EXPECT_LT(total, distinct.size());
}

TEST(Explain, CallsUseTheRuntimesKeys) {
  // explain builds its keys with forward_keys/backward_keys; check them against hand-built ones.
  ExplainOptions o;
  o.layout = Layout::ndhwc;
  o.dtype = DType::bf16;
  o.residual = true;
  o.activation = Activation::silu;
  const std::vector<ExplainCall> calls = explain_calls({{2, 64, 20, 24, 28}}, o);
  ASSERT_EQ(calls.size(), 2u);
  const std::vector<FusionKey> fusions = explain_fusions(o);
  EXPECT_TRUE(bytes_equal(calls[0].fusion, fusions[0]));
  EXPECT_TRUE(bytes_equal(calls[1].fusion, fusions[1]));
  EXPECT_TRUE(bytes_equal(calls[0].fusion, make_fusion(Direction::forward, DType::bf16, DType::f32, Layout::ndhwc, true,
                                                       true, true, false, true, Activation::silu)));
  EXPECT_EQ(calls[0].config.vec, 8);  // C = 64 channels-last, 16-byte aligned

  // A misaligned input narrows the vector; eval is forward only; zero-size calls launch nothing.
  ExplainOptions m;
  m.align_bytes = 2;
  EXPECT_EQ(explain_calls({{2, 32, 16, 16, 16}}, m)[0].config.vec, 1);
  ExplainOptions e;
  e.eval = true;
  const auto ev = explain_calls({{2, 32, 16, 16, 16}, {0, 32, 16, 16, 16}}, e);
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_FALSE(ev[0].fusion.train);
  EXPECT_TRUE(ev[1].empty);
  EXPECT_FALSE(ev[1].new_kernel);

  // An invalid shape is the runtime's own error.
  try {
    explain_calls({{2, 32, 1, 1, 1}}, ExplainOptions{});
    ADD_FAILURE() << "expected an error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("more than 1 spatial element"), std::string::npos) << err.what();
  }
}

TEST(Explain, ReasonNamesTheNearestConfig) {
  // 2x320x4x4x4 (tiny tier) after 2x320x8x8x8 (warp per instance): only the group differs.
  ExplainOptions o;
  o.backward = false;
  const auto calls = explain_calls({{2, 320, 8, 8, 8}, {2, 320, 4, 4, 4}, {2, 320, 8, 8, 8}}, o);
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[0].reason, "new fusion");
  EXPECT_EQ(calls[1].reason, "new kernel config: group 32->8");
  EXPECT_EQ(calls[2].shares_with, 0);
  EXPECT_NE(format_call(calls, 2).find("(shares kernel with 2x320x8x8x8)"), std::string::npos) << format_call(calls, 2);
  EXPECT_NE(format_call(calls, 1).find("(new kernel: new kernel config: group 32->8)"), std::string::npos);
}

TEST(Explain, AllKernelsIsTheBound) {
  ExplainOptions o;
  const auto all = all_kernels(o);
  size_t expected = 0;
  for (const FusionKey& f : explain_fusions(o)) expected += enumerate_configs(f, o.policy).size();
  EXPECT_EQ(all.size(), expected);
  // The stream's kernels are a subset of them.
  const std::set<std::string> every = names_of(all);
  for (const std::string& n : names_of(distinct_kernels(stream_calls()))) EXPECT_TRUE(every.count(n)) << n;
}

TEST(Explain, RandomCropShapes) {
  const auto a = random_crop_shapes(500, 7), b = random_crop_shapes(500, 7), c = random_crop_shapes(500, 8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  std::set<int64_t> ns, cs;
  for (const Shape& s : a) {
    ASSERT_EQ(s.size(), 5u);
    ns.insert(s[0]);
    cs.insert(s[1]);
    for (int d = 2; d < 5; ++d) {
      EXPECT_GE(s[size_t(d)], 32);
      EXPECT_LE(s[size_t(d)], 192);
    }
  }
  EXPECT_EQ(ns, (std::set<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(cs, (std::set<int64_t>{32, 64, 128, 256, 320}));
}

TEST(Explain, ParseShape) {
  EXPECT_EQ(parse_shape("2x32x128x128x128"), (Shape{2, 32, 128, 128, 128}));
  EXPECT_EQ(parse_shape("(2, 32, 64)"), (Shape{2, 32, 64}));
  EXPECT_EQ(parse_shape("1,4,5,6"), (Shape{1, 4, 5, 6}));
  EXPECT_EQ(shape_str({2, 32, 8}), "2x32x8");
  for (const char* bad : {"2x32", "2x3x4x5x6x7", "2xax3", "", "2x-3x4"}) {
    EXPECT_THROW(parse_shape(bad), Error) << bad;
  }
}

// ----------------------------------------------------------------------------------- warm-up
// The child half of WarmupCompilesExactlyThePrediction (disabled: runs only when re-executed).
TEST(ExplainWarmupChild, DISABLED_Run) {
  const char* out = std::getenv("NORMJIT_TEST_WARMUP_REPORT");
  ASSERT_NE(out, nullptr);
  ASSERT_EQ(compile::DiskCache::global().dir(), std::string(std::getenv("NORMJIT_CACHE_DIR")));
  const auto kernels = distinct_kernels(stream_calls());
  const WarmupSummary s = warmup_kernels(kernels, 90, 2, false);
  const CacheStats st = cache_stats();
  std::ofstream f(out);
  f << "kernels " << s.kernels << "\ncompiled " << s.compiled << "\nfrom_disk " << s.from_disk << "\nfailed "
    << s.failed << "\ncompiles " << st.compiles << "\ndisk_hits " << st.disk_hits << "\nseconds " << s.seconds
    << "\nslowest " << s.slowest << "\n";
  for (const auto& [name, ms] : st.compile_ms) f << "compiled_name " << name << "\n";
  for (const WarmupKernel& k : s.results)
    if (!k.error.empty()) f << "error " << k.name << ": " << k.error.substr(0, k.error.find('\n')) << "\n";
}

TEST(Explain, WarmupCompilesExactlyThePrediction) {
  std::string why;
  if (!driver::try_nvrtc(&why)) GTEST_SKIP() << "NVRTC is not available here: " << why;
  TempDir cache, reports;
  const std::set<std::string> predicted = names_of(distinct_kernels(stream_calls()));
  ASSERT_FALSE(predicted.empty());

  // Cold: every predicted kernel is compiled, and nothing else.
  const std::string first = reports.path() + "/first.txt";
  ASSERT_EQ(run_child("ExplainWarmupChild.DISABLED_Run",
                      {{"NORMJIT_CACHE_DIR", cache.path()}, {"NORMJIT_TEST_WARMUP_REPORT", first}}),
            0);
  std::set<std::string> compiled;
  auto r = read_report(first, &compiled);
  EXPECT_EQ(r["failed"], "0") << r["error"];
  EXPECT_EQ(std::stoul(r["kernels"]), predicted.size());
  EXPECT_EQ(std::stoul(r["compiled"]), predicted.size());
  EXPECT_EQ(r["from_disk"], "0");
  EXPECT_EQ(compiled, predicted) << "compile_kernel was asked for other kernels than explain predicted";
  std::printf("[ warmup   ] %zu kernels compiled cold in %s s (slowest %s)\n", predicted.size(), r["seconds"].c_str(),
              r["slowest"].c_str());

  // The disk cache now holds exactly those kernels, for sm_90.
  compile::DiskCache disk(cache.path());
  std::set<std::string> stored;
  for (const auto& e : disk.list()) {
    EXPECT_TRUE(e.valid) << e.file << ": " << e.problem;
    EXPECT_EQ(key_field(e.key, "arch"), "sm_90");
    stored.insert(key_field(e.key, "name"));
  }
  EXPECT_EQ(stored, predicted);

  // Warm: a second process compiles nothing; every kernel is a disk hit.
  const std::string second = reports.path() + "/second.txt";
  ASSERT_EQ(run_child("ExplainWarmupChild.DISABLED_Run",
                      {{"NORMJIT_CACHE_DIR", cache.path()}, {"NORMJIT_TEST_WARMUP_REPORT", second}}),
            0);
  compiled.clear();
  r = read_report(second, &compiled);
  EXPECT_EQ(r["compiled"], "0");
  EXPECT_EQ(r["compiles"], "0");
  EXPECT_EQ(std::stoul(r["from_disk"]), predicted.size());
  EXPECT_EQ(std::stoul(r["disk_hits"]), predicted.size());
  EXPECT_TRUE(compiled.empty());
  std::printf("[ warmup   ] second warm-up: %s disk hits, 0 compiles, %s s\n", r["from_disk"].c_str(),
              r["seconds"].c_str());
}

// ------------------------------------------------------------------------------ command line
#ifdef NORMJIT_CLI_PATH
TEST(Cli, ExitCodesAndMessages) {
  const std::string cli = NORMJIT_CLI_PATH;
  std::string out;
  EXPECT_EQ(shell(cli + " --version", &out), 0);
  EXPECT_NE(out.find(version()), std::string::npos) << out;
  EXPECT_EQ(shell(cli + " --help", &out), 0);
  EXPECT_NE(out.find("explain"), std::string::npos);
  EXPECT_EQ(shell(cli + " no-such-command", &out), 2);
  EXPECT_NE(out.find("unknown command 'no-such-command'"), std::string::npos) << out;
  EXPECT_NE(out.find("usage: normjit"), std::string::npos) << out;

  EXPECT_EQ(shell(cli + " explain 2x32x128x128x128 2x320x4x4x4", &out), 0) << out;
  EXPECT_NE(out.find("(new kernel: new fusion)"), std::string::npos) << out;
  EXPECT_NE(out.find("distinct kernels"), std::string::npos) << out;
  EXPECT_EQ(shell(cli + " explain --all --direction fwd", &out), 0) << out;
  EXPECT_NE(out.find("60 configs"), std::string::npos) << out;
  EXPECT_EQ(shell(cli + " explain --random 50 --seed 3", &out), 0) << out;
  EXPECT_NE(out.find("50 distinct shapes"), std::string::npos) << out;

  // normjit::Error -> "normjit: error: <message>", exit 1; bad usage -> exit 2.
  EXPECT_EQ(shell(cli + " explain 2x32x1x1x1", &out), 1) << out;
  EXPECT_NE(out.find("normjit: error: "), std::string::npos) << out;
  EXPECT_NE(out.find("more than 1 spatial element"), std::string::npos) << out;
  EXPECT_EQ(shell(cli + " explain --device B200 2x32x8x8x8", &out), 1) << out;
  EXPECT_NE(out.find("unknown device profile 'B200'"), std::string::npos) << out;
  EXPECT_EQ(shell(cli + " explain --bogus", &out), 2) << out;
  EXPECT_EQ(shell(cli + " explain", &out), 2) << out;
}

// The measurement switches are read from the environment once per process, so each case is a
// process of its own. NORMJIT_CLUSTER_WEIGHT_GRADS is on unless set to 0 (session 26: a mend
// that read an unset variable as 0 turned the clusters off by default); a value that is not a
// number, or one out of range, leaves a switch at its default.
TEST(Cli, MeasurementSwitchesKeepTheirDefaults) {
  const std::string cli = std::string(NORMJIT_CLI_PATH) + " explain --device H100 --dtype f16 ";
  const auto plan = [&](const std::string& env, const std::string& args) {
    std::string out;
    EXPECT_EQ(shell(env + cli + args, &out), 0) << out;
    return out;
  };
  const std::string backward = "--layout ndhwc --direction bwd 2x320x8x8x8", clustered = "(clusters of 2)";
  EXPECT_NE(plan("", backward).find(clustered), std::string::npos);
  EXPECT_NE(plan("NORMJIT_CLUSTER_WEIGHT_GRADS=1 ", backward).find(clustered), std::string::npos);
  EXPECT_NE(plan("NORMJIT_CLUSTER_WEIGHT_GRADS=yes ", backward).find(clustered), std::string::npos);
  EXPECT_NE(plan("NORMJIT_CLUSTER_WEIGHT_GRADS=7 ", backward).find(clustered), std::string::npos);
  EXPECT_EQ(plan("NORMJIT_CLUSTER_WEIGHT_GRADS=0 ", backward).find(clustered), std::string::npos);
  // An item count that is not a whole number is ignored, not read as its leading digits.
  const std::string ncdhw = "2x320x8x8x8";
  EXPECT_NE(plan("NORMJIT_TIER_ITEMS=2 ", ncdhw), plan("", ncdhw));
  EXPECT_EQ(plan("NORMJIT_TIER_ITEMS=2x ", ncdhw), plan("", ncdhw));
  // The streamed split's L2 prefetch: a quarter of the next chunk (4096 vectors for the fp32
  // (2,32,128^3) backward on the H100), a percentage when set, none at 0.
  const std::string streamed = "--dtype f32 --layout ncdhw --direction bwd 2x32x128x128x128";
  const std::string quarter = "(next chunk's first 1024 vectors to L2)";
  EXPECT_NE(plan("", streamed).find(quarter), std::string::npos) << plan("", streamed);
  EXPECT_NE(plan("NORMJIT_L2_PREFETCH=50 ", streamed).find("first 2048 vectors"), std::string::npos);
  EXPECT_EQ(plan("NORMJIT_L2_PREFETCH=0 ", streamed).find("vectors to L2"), std::string::npos);
  EXPECT_NE(plan("NORMJIT_L2_PREFETCH=101 ", streamed).find(quarter), std::string::npos);
  EXPECT_NE(plan("NORMJIT_L2_PREFETCH=half ", streamed).find(quarter), std::string::npos);
}

TEST(Cli, WarmupStatsAndDemo) {
  std::string why;
  if (!driver::try_nvrtc(&why)) GTEST_SKIP() << "NVRTC is not available here: " << why;
  TempDir cache;
  const std::string env = "NORMJIT_CACHE_DIR=" + cache.path() + " ";
  const std::string cli = env + NORMJIT_CLI_PATH;
  std::string out;
  EXPECT_EQ(shell(cli + " warmup --jobs 2 --direction fwd 2x320x4x4x4 2x320x8x8x8", &out), 0) << out;
  EXPECT_NE(out.find("kernels: 2, compiled: 2, already in the disk cache: 0"), std::string::npos) << out;
  EXPECT_EQ(shell(cli + " warmup --jobs 2 --direction fwd 2x320x4x4x4 2x320x8x8x8", &out), 0) << out;
  EXPECT_NE(out.find("kernels: 2, compiled: 0, already in the disk cache: 2"), std::string::npos) << out;
  EXPECT_EQ(shell(cli + " stats", &out), 0) << out;
  EXPECT_NE(out.find(cache.path()), std::string::npos) << out;
  EXPECT_NE(out.find("entries: 2"), std::string::npos) << out;

  const bool gpu = availability().available;
  EXPECT_EQ(shell(cli + " demo --iters 3", &out), 0) << out;
  EXPECT_NE(out.find("[3] compile"), std::string::npos) << out;
  if (!gpu) {
    EXPECT_NE(out.find("no CUDA GPU here: skipping the run"), std::string::npos) << out;
  }
  EXPECT_EQ(shell(cli, &out), 0) << out;  // demo is the default command
  EXPECT_NE(out.find("from the disk cache"), std::string::npos) << out;
}

// The tests that read ptxas's report need NVRTC to compile: with a GPU, NVRTC serves a kernel it
// compiled before (same source and options, any process since the machine started) from the
// driver's compute cache, without a ptxas log (docs/PERF_NOTES.md, "NVRTC's driver cache").
const char* const kNoDriverCache = "CUDA_CACHE_DISABLE=1 ";

// NORMJIT_NVRTC_OPTIONS reaches NVRTC (ptxas -v reports registers and spills, and the log is
// printed) and is part of the disk-cache key: the cubin cached without it is not served.
TEST(Cli, ExtraNvrtcOptions) {
  std::string why;
  if (!driver::try_nvrtc(&why)) GTEST_SKIP() << "NVRTC is not available here: " << why;
  TempDir cache;
  const std::string env = std::string(kNoDriverCache) + "NORMJIT_CACHE_DIR=" + cache.path() + " ";
  const std::string warmup = std::string(NORMJIT_CLI_PATH) + " warmup --direction fwd 2x320x4x4x4";
  std::string out;
  EXPECT_EQ(shell(env + warmup, &out), 0) << out;
  EXPECT_EQ(out.find("ptxas info"), std::string::npos) << out;
  EXPECT_EQ(shell(env + "NORMJIT_NVRTC_OPTIONS='--ptxas-options=-v' " + warmup, &out), 0) << out;
  EXPECT_NE(out.find("kernels: 1, compiled: 1, already in the disk cache: 0"), std::string::npos) << out;
  EXPECT_NE(out.find("NVRTC log of in_fwd_"), std::string::npos) << out;
  EXPECT_NE(out.find("spill stores"), std::string::npos) << out;
  EXPECT_EQ(shell(env + "NORMJIT_NVRTC_OPTIONS='--bogus-option' " + warmup, &out), 1) << out;
  EXPECT_NE(out.find("--bogus-option"), std::string::npos) << out;
}

// The measurement build (kernels/phase_clock.cuh, bench/phase_clocks.py) of the resident split and
// of the channels-last split compiles, in both directions and with an epilogue that puts a third
// tensor in the slots, and under its own disk-cache key: the default kernels are compiled again
// beside it, not served.
TEST(Cli, PhaseClockBuildCompiles) {
  std::string why;
  if (!driver::try_nvrtc(&why)) GTEST_SKIP() << "NVRTC is not available here: " << why;
  for (const char* layout : {"ncdhw", "ndhwc"}) {  // the resident split's stamps; the channels-last kernels'
    SCOPED_TRACE(layout);
    TempDir cache;
    const std::string warmup = "NORMJIT_CACHE_DIR=" + cache.path() + " " + NORMJIT_CLI_PATH + " warmup --layout " +
                               layout + " --device H100 --activation leaky_relu --residual 2x32x128x128x128";
    std::string out;
    ASSERT_EQ(shell("NORMJIT_NVRTC_OPTIONS='-DNJ_PHASE_CLOCKS=1' " + warmup, &out), 0) << out;
    EXPECT_NE(out.find("kernels: 2, compiled: 2, already in the disk cache: 0"), std::string::npos) << out;
    ASSERT_EQ(shell(warmup, &out), 0) << out;
    EXPECT_NE(out.find("kernels: 2, compiled: 2, already in the disk cache: 0"), std::string::npos) << out;
  }
}

// The bytes of spill stores of every kernel in a warm-up's ptxas report (--ptxas-options=-v).
static std::vector<int> spill_stores(const std::string& out) {
  const std::string what = " bytes spill stores";
  std::vector<int> bytes;
  for (size_t at = out.find(what); at != std::string::npos; at = out.find(what, at + 1)) {
    const size_t begin = out.find_last_not_of("0123456789", at - 1) + 1;
    bytes.push_back(std::stoi(out.substr(begin, at - begin)));
  }
  return bytes;
}

// (kernel name, bytes of spill stores) for every kernel whose NVRTC log a warm-up printed; the
// CLI prints each kernel's log in one piece, so compiles in parallel do not interleave them.
static std::vector<std::pair<std::string, int>> spill_stores_by_kernel(const std::string& out) {
  const std::string head = "NVRTC log of ";
  std::vector<std::pair<std::string, int>> result;
  for (size_t at = out.find(head); at != std::string::npos;) {
    const size_t name_begin = at + head.size();
    const size_t name_end = out.find(':', name_begin);
    const size_t next = out.find(head, name_begin);
    for (int bytes : spill_stores(out.substr(name_begin, next == std::string::npos ? std::string::npos : next - name_begin)))
      result.emplace_back(out.substr(name_begin, name_end - name_begin), bytes);
    at = next;
  }
  return result;
}

// The cached tiers hold a whole instance in registers: the CTA of 512 with 8 vectors a thread
// (NCDHW instances of 32^3) and the channels-last CTA of 256 (the deepest stage) spilled 20-360
// bytes a thread in 16-bit dtypes before their elements were packed two to a register
// (common.cuh's vec_t; bench/spill_survey.sh). What is left: up to 24 bytes with an activation and a residual.
TEST(Cli, CachedTiersBarelySpill) {
  std::string why;
  if (!driver::try_nvrtc(&why)) GTEST_SKIP() << "NVRTC is not available here: " << why;
  TempDir cache;
  const std::string env =
      std::string(kNoDriverCache) + "NORMJIT_CACHE_DIR=" + cache.path() + " NORMJIT_NVRTC_OPTIONS='--ptxas-options=-v' ";
  struct Stage {
    const char* layout;
    const char* shape;
  };
  for (const Stage st : {Stage{"ncdhw", "2x128x32x32x32"}, Stage{"ndhwc", "2x320x4x4x4"}})
    for (const char* dtype : {"f16", "bf16"})
      for (const char* act : {"identity", "leaky_relu"})
        for (const char* residual : {"", " --residual"}) {
          const std::string fusion = std::string(st.layout) + " " + dtype + " " + act + residual + " " + st.shape;
          SCOPED_TRACE(fusion);
          std::string out;
          ASSERT_EQ(shell(env + NORMJIT_CLI_PATH + " warmup --quiet --layout " + st.layout + " --dtype " + dtype +
                              " --activation " + act + residual + " " + st.shape,
                          &out),
                    0)
              << out;
          const std::vector<int> spills = spill_stores(out);
          for (int bytes : spills) EXPECT_LE(bytes, std::string(act) == "identity" ? 0 : 24) << out;
          EXPECT_EQ(spills.size(), 2u) << out;  // the forward and the backward kernel
        }
}

// The channels-last streamed backward holds its tiles in registers; the heuristics give each
// fusion as many vectors a tile as compile without spilling (nhwc_streamed_items), because a spill
// in the tile loop cost up to 6x on the H200 (docs/PERF_NOTES.md, session 10). ptxas -v reports
// every kernel's spill stores: none for the 16-byte-vector kernels (C = 32), and a few bytes at
// most for the flat ones (C = 30: silu and sigmoid spill 4-20 bytes outside the loop), for every
// dtype and activation, with and without a residual.
TEST(Cli, ChannelsLastBackwardDoesNotSpill) {
  std::string why;
  if (!driver::try_nvrtc(&why)) GTEST_SKIP() << "NVRTC is not available here: " << why;
  TempDir cache;
  const std::string env =
      std::string(kNoDriverCache) + "NORMJIT_CACHE_DIR=" + cache.path() + " NORMJIT_NVRTC_OPTIONS='--ptxas-options=-v' ";
  for (const char* dtype : {"f16", "bf16", "f32"})
    for (const char* act : {"identity", "relu", "leaky_relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh"})
      for (const char* residual : {"", " --residual"}) {
        const std::string fusion = std::string(dtype) + " " + act + residual;
        SCOPED_TRACE(fusion);
        std::string out;
        // Both shapes in one warm-up, which compiles their two kernels in parallel.
        ASSERT_EQ(shell(env + NORMJIT_CLI_PATH + " warmup --quiet --layout ndhwc --direction bwd --dtype " + dtype +
                            " --activation " + act + residual + " 2x32x128x128x128 2x30x128x128x128",
                        &out),
                  0)
            << out;
        // Every kernel the warm-up compiled (one per shape) reports its spills; the flat one (C = 30,
        // lanes at run time: "gfi" in its name) may spill a few bytes outside its tile loop.
        const auto spills = spill_stores_by_kernel(out);
        for (const auto& [kernel, bytes] : spills)
          EXPECT_LE(bytes, kernel.find("gfi") == std::string::npos ? 0 : 32) << kernel << "\n" << out;
        EXPECT_EQ(spills.size(), 2u) << out;
      }
}
#endif
