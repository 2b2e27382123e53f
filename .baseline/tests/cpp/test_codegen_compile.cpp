// Every kernel the bounded policy can ask for compiles: NVRTC builds EVERY config enumerate_configs
// returns, for sm_80 and sm_90, for a set of fusions that toggles every switch of the templates at
// least once (direction, dtype, weight dtype, layout, train/eval, affine, residual, running stats,
// saved statistics, each activation). No disk cache: compile::nvrtc_compile directly, two threads,
// on the runtime's own requests (compile_request).
//
// Cost, measured on a 2-core machine with NVRTC 13.0: 1428 compiles (714 configs x 2 archs; 58 more since),
// 0.16-0.5 s each, 4.1 minutes in all with two threads; each fusion is its own test (10-52 s).
// Nothing is sampled. If the bound grows enough to make this too slow (> 10 minutes), compile
// every config of two fusions and a sample of the rest.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "codegen/codegen.h"
#include "compile/compiler.h"
#include "driver/nvrtc.h"
#include "runtime/kernel_cache.h"
#include "runtime/keys.h"
#include "schedule/heuristics.h"

using namespace normjit;

namespace {

struct FusionCase {
  const char* label;
  FusionKey fusion;
};

// make_fusion(direction, dtype, weight dtype, layout, train, affine, residual, running, save, activation)
std::vector<FusionCase> fusion_cases() {
  using A = Activation;
  const auto fwd = Direction::forward, bwd = Direction::backward;
  const auto nc = Layout::ncdhw, nh = Layout::ndhwc;
  return {
      // nnU-Net under autocast: fp16 data, fp32 affine parameters, saved statistics.
      {"fwd_f16_ncdhw_train_wf32_save",
       make_fusion(fwd, DType::f16, DType::f32, nc, true, true, false, false, true, A::identity)},
      {"bwd_f16_ncdhw_train_wf32_leakyrelu",  // nnU-Net's backward under autocast
       make_fusion(bwd, DType::f16, DType::f32, nc, true, true, false, false, false, A::leaky_relu)},
      {"bwd_f16_ndhwc_train_wf32",
       make_fusion(bwd, DType::f16, DType::f32, nh, true, true, false, false, false, A::identity)},
      {"fwd_f32_ncdhw_train_noaffine_running_save_relu",
       make_fusion(fwd, DType::f32, DType::f32, nc, true, false, false, true, true, A::relu)},
      {"fwd_bf16_ndhwc_eval_wbf16_residual_leakyrelu",
       make_fusion(fwd, DType::bf16, DType::bf16, nh, false, true, true, false, false, A::leaky_relu)},
      {"bwd_bf16_ncdhw_wbf16_residual_gelu",
       make_fusion(bwd, DType::bf16, DType::bf16, nc, true, true, true, false, false, A::gelu_erf)},
      {"bwd_f32_ndhwc_noaffine_silu",
       make_fusion(bwd, DType::f32, DType::f32, nh, true, false, false, false, false, A::silu)},
      {"fwd_f16_ndhwc_train_wf16_running_nosave_gelutanh",
       make_fusion(fwd, DType::f16, DType::f16, nh, true, true, false, true, false, A::gelu_tanh)},
      {"fwd_f16_ncdhw_eval_noaffine_residual_sigmoid",
       make_fusion(fwd, DType::f16, DType::f32, nc, false, false, true, false, false, A::sigmoid)},
      {"bwd_f16_ncdhw_wf32_residual_tanh",
       make_fusion(bwd, DType::f16, DType::f32, nc, true, true, true, false, false, A::tanh)},
      {"fwd_bf16_ncdhw_train_wf32_save_residual_silu",
       make_fusion(fwd, DType::bf16, DType::f32, nc, true, true, true, false, true, A::silu)},
  };
}

// The #include lines NVRTC would see: those outside an `#ifndef NJ_DEVICE_CODE` block once the
// source has defined NJ_DEVICE_CODE (params.h includes <cstdint> for the host compiler only).
std::vector<std::string> active_includes(const std::string& source) {
  std::vector<std::string> out;
  std::vector<bool> inactive;  // per open conditional: whether it hides its lines from NVRTC
  bool device_defined = false;
  std::istringstream in(source);
  std::string line;
  while (std::getline(in, line)) {
    const auto first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] != '#') continue;
    std::string d = line.substr(first + 1);
    d.erase(0, d.find_first_not_of(" \t"));
    const bool hidden = std::find(inactive.begin(), inactive.end(), true) != inactive.end();
    if (d.rfind("define NJ_DEVICE_CODE", 0) == 0 && !hidden) device_defined = true;
    if (d.rfind("ifndef NJ_DEVICE_CODE", 0) == 0)
      inactive.push_back(device_defined);
    else if (d.rfind("ifdef NJ_DEVICE_CODE", 0) == 0)
      inactive.push_back(!device_defined);
    else if (d.rfind("if", 0) == 0)
      inactive.push_back(false);
    else if (d.rfind("else", 0) == 0 && !inactive.empty())
      inactive.back() = !inactive.back();
    else if (d.rfind("endif", 0) == 0 && !inactive.empty())
      inactive.pop_back();
    else if (d.rfind("include", 0) == 0 && !hidden)
      out.push_back(line);
  }
  return out;
}

bool is_elf(const std::vector<char>& b) {
  return b.size() > 4 && std::memcmp(b.data(),
                                     "\x7f"
                                     "ELF",
                                     4) == 0;
}

}  // namespace

// The cases cover every switch both ways and every activation.
TEST(CodegenCompileCoverage, CasesToggleEverySwitch) {
  std::set<int> dirs, dtypes, wsame, layouts, train, affine, residual, running, save, acts;
  for (const FusionCase& c : fusion_cases()) {
    const FusionKey& f = c.fusion;
    dirs.insert(int(f.direction));
    dtypes.insert(int(f.dtype));
    if (f.affine && f.dtype != DType::f32) wsame.insert(f.weight_dtype == f.dtype);
    layouts.insert(int(f.layout));
    if (f.direction == Direction::forward) train.insert(f.train), running.insert(f.running), save.insert(f.save);
    affine.insert(f.affine);
    residual.insert(f.residual);
    acts.insert(int(f.activation));
  }
  EXPECT_EQ(dirs.size(), 2u);
  EXPECT_EQ(dtypes.size(), 3u);
  EXPECT_EQ(wsame.size(), 2u) << "affine weights both fp32 and the input's (16-bit) dtype";
  EXPECT_EQ(layouts.size(), 2u);
  EXPECT_EQ(train.size(), 2u);
  EXPECT_EQ(affine.size(), 2u);
  EXPECT_EQ(residual.size(), 2u);
  EXPECT_EQ(running.size(), 2u);
  EXPECT_EQ(save.size(), 2u);
  EXPECT_EQ(acts.size(), size_t(Activation::tanh) + 1) << "every activation at least once";
}

// Generated sources are self-contained (the disk-cache key hashes the source alone: no #include
// NVRTC would follow) and differ per config.
TEST(CodegenCompileCoverage, SourcesAreSelfContained) {
  for (const FusionCase& c : fusion_cases()) {
    for (Policy p : {Policy::bounded, Policy::exact}) {
      std::set<std::string> names;
      for (const KernelConfig& cfg : enumerate_configs(c.fusion, p)) {
        const codegen::KernelSource src = codegen::generate(c.fusion, cfg);
        EXPECT_EQ(src.source.find("#include \""), std::string::npos)
            << src.name << ": a template include left unexpanded";
        const std::vector<std::string> includes = active_includes(src.source);
        EXPECT_TRUE(includes.empty()) << src.name << ": NVRTC would see " << includes.front();
        EXPECT_NE(src.source.find("#define NJ_THREADS " + std::to_string(cfg.threads)), std::string::npos) << src.name;
        EXPECT_NE(src.source.find(src.entry), std::string::npos) << src.name;
        EXPECT_EQ(src.name, kernel_name(c.fusion, cfg));
        EXPECT_TRUE(names.insert(src.name).second) << "two configs share the name " << src.name;
      }
    }
  }
}

// entry_point() (what an L2 miss looks up in the loaded module) names the function generate()
// defines, for every direction and layout and every config, without generating the source.
TEST(CodegenEntryPoint, IsTheFunctionGenerateDefines) {
  std::set<std::string> entries;
  for (Direction d : {Direction::forward, Direction::backward}) {
    for (Layout l : {Layout::ncdhw, Layout::ndhwc}) {
      const bool fwd = d == Direction::forward;
      const FusionKey f = make_fusion(d, DType::f16, DType::f32, l, true, true, false, false, fwd, Activation::relu);
      const std::string entry = codegen::entry_point(f);
      for (const KernelConfig& cfg : enumerate_configs(f, Policy::bounded)) {
        const codegen::KernelSource src = codegen::generate(f, cfg);
        EXPECT_EQ(entry, src.entry) << src.name;
        // Defined, not merely mentioned: the name starts a line and opens the parameter list.
        EXPECT_NE(src.source.find("\n" + entry + "("), std::string::npos) << src.name << " does not define " << entry;
      }
      entries.insert(entry);
    }
  }
  EXPECT_EQ(entries.size(), 4u) << "one entry point per direction and layout";
}

class CodegenCompile : public testing::TestWithParam<FusionCase> {
 protected:
  void SetUp() override {
    std::string why;
    if (!driver::try_nvrtc(&why)) GTEST_SKIP() << "NVRTC is not available here: " << why;
  }
};

TEST_P(CodegenCompile, EveryBoundedConfigCompiles) {
  const FusionKey f = GetParam().fusion;
  const std::vector<KernelConfig> configs = enumerate_configs(f, Policy::bounded);
  ASSERT_FALSE(configs.empty());
  struct Job {
    KernelConfig config;
    int arch;
  };
  std::vector<Job> jobs;
  for (int arch : {80, 90})
    for (const KernelConfig& c : configs) jobs.push_back({c, arch});

  std::atomic<size_t> next{0};
  std::mutex mutex;
  std::vector<std::string> failures;
  double slowest = 0, total = 0;
  std::string slowest_name;
  const auto start = std::chrono::steady_clock::now();
  auto worker = [&] {
    for (size_t i = next++; i < jobs.size(); i = next++) {
      const compile::CompileRequest req = compile_request(f, jobs[i].config, jobs[i].arch);  // as the runtime's
      double ms = 0;
      std::string error;
      try {
        if (!is_elf(compile::nvrtc_compile(req, &ms))) error = "not an ELF cubin";
      } catch (const std::exception& e) {
        error = e.what();
      }
      std::lock_guard<std::mutex> lock(mutex);
      total += ms;
      if (ms > slowest) slowest = ms, slowest_name = req.name + " sm_" + std::to_string(req.arch);
      if (!error.empty()) failures.push_back(req.name + " (sm_" + std::to_string(req.arch) + "): " + error);
    }
  };
  std::thread helper(worker);
  worker();
  helper.join();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[ compile  ] %s: %zu configs x 2 archs in %.1f s wall (%.0f ms per compile, slowest %.0f ms: %s)\n",
              GetParam().label, configs.size(), wall, total / double(jobs.size()), slowest, slowest_name.c_str());
  for (const std::string& e : failures) ADD_FAILURE() << e;
  EXPECT_TRUE(failures.empty()) << failures.size() << " of " << jobs.size() << " compiles failed";
}

INSTANTIATE_TEST_SUITE_P(Fusions, CodegenCompile, testing::ValuesIn(fusion_cases()),
                         [](const testing::TestParamInfo<FusionCase>& info) { return std::string(info.param.label); });
