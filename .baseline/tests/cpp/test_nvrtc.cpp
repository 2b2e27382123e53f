// NVRTC loading and compilation, the compile -> disk cache path, and the driver loader's behaviour
// on machines without a GPU. Nothing here needs a GPU; tests that need NVRTC skip without it.
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "test_helpers.h"

#include "compile/compiler.h"
#include "compile/disk_cache.h"
#include "driver/cuda_driver.h"
#include "driver/nvrtc.h"
#include "normjit/normjit.h"
#include "ptxas_report.h"

namespace fs = std::filesystem;
using namespace normjit;

namespace {

using normjit_test::TempDir;

const char* kTinyKernel = R"(
extern "C" __global__ void scale(const float* __restrict__ x, float* __restrict__ y, float a, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i];
}
)";

compile::CompileRequest tiny_request(int arch) {
  compile::CompileRequest req;
  req.name = "scale";
  req.source = kTinyKernel;
  req.arch = arch;
  return req;
}

bool is_elf(const std::vector<char>& bytes) {
  return bytes.size() > 4 && std::memcmp(bytes.data(), "\x7f" "ELF", 4) == 0;
}

class Nvrtc : public testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!driver::try_nvrtc(&why)) GTEST_SKIP() << "NVRTC is not available here: " << why;
  }
};

}  // namespace

TEST_F(Nvrtc, LoadsAndReportsVersion) {
  const driver::Nvrtc& lib = driver::nvrtc();
  EXPECT_GE(lib.major, 12);
  EXPECT_FALSE(lib.path.empty());
  EXPECT_EQ(&lib, driver::try_nvrtc(nullptr)) << "loaded once";
}

TEST_F(Nvrtc, CompilesCubinForSm80AndSm90) {
  for (int arch : {80, 90}) {
    double ms = -1;
    const std::vector<char> cubin = compile::nvrtc_compile(tiny_request(arch), &ms);
    EXPECT_TRUE(is_elf(cubin)) << "sm_" << arch;
    EXPECT_GT(ms, 0) << "sm_" << arch;
  }
}

TEST_F(Nvrtc, SyntaxErrorThrowsWithLog) {
  compile::CompileRequest req = tiny_request(90);
  req.name = "broken_kernel";
  req.source = "extern \"C\" __global__ void broken_kernel(float* y) { y[0] = undefined_thing; }\n";
  try {
    compile::nvrtc_compile(req, nullptr);
    FAIL() << "expected normjit::Error";
  } catch (const normjit::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("broken_kernel"), std::string::npos) << msg;
    EXPECT_NE(msg.find("identifier \"undefined_thing\" is undefined"), std::string::npos) << msg;
    EXPECT_NE(msg.find("sm_90"), std::string::npos) << msg;
  }
}

TEST_F(Nvrtc, UnsupportedArchitectureSaysWhichAreSupported) {
  try {
    compile::nvrtc_compile(tiny_request(10), nullptr);
    FAIL() << "expected normjit::Error";
  } catch (const normjit::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("sm_10"), std::string::npos) << msg;
    EXPECT_NE(msg.find("compiles for"), std::string::npos) << msg;
  }
}

TEST_F(Nvrtc, DiskKeyNamesEverythingThatChangesTheBinary) {
  const auto req = tiny_request(90);
  const std::string key = compile::disk_key(req);
  EXPECT_EQ(key.rfind("normjit ", 0), 0u) << key;
  EXPECT_NE(key.find("\nnvrtc "), std::string::npos) << key;
  EXPECT_NE(key.find("\narch sm_90\n"), std::string::npos) << key;
  EXPECT_NE(key.find("\noptions --std=c++17"), std::string::npos) << key;
  EXPECT_NE(key.find("\nname scale\n"), std::string::npos) << key;

  auto other = req;
  other.arch = 80;
  EXPECT_NE(compile::disk_key(other), key);
  other = req;
  other.options.push_back("-DEXTRA=1");
  EXPECT_NE(compile::disk_key(other), key);
  other = req;
  other.source += " ";
  EXPECT_NE(compile::disk_key(other), key);
}

TEST_F(Nvrtc, CompileCubinGoesThroughTheDiskCache) {
  TempDir tmp;
  compile::DiskCache cache(tmp.path());
  const auto req = tiny_request(90);

  const compile::CompileResult first = compile::compile_cubin(req, &cache);
  EXPECT_FALSE(first.from_disk);
  EXPECT_GT(first.compile_ms, 0);
  EXPECT_TRUE(is_elf(first.cubin));
  EXPECT_EQ(cache.writes(), 1u);

  const compile::CompileResult second = compile::compile_cubin(req, &cache);
  EXPECT_TRUE(second.from_disk);
  EXPECT_EQ(second.compile_ms, 0);
  EXPECT_EQ(second.cubin, first.cubin);
  EXPECT_EQ(second.disk_key, first.disk_key);

  // Without a cache, or with a disabled one, it always compiles.
  EXPECT_FALSE(compile::compile_cubin(req, nullptr).from_disk);
  compile::DiskCache disabled("");
  EXPECT_FALSE(compile::compile_cubin(req, &disabled).from_disk);
}

TEST_F(Nvrtc, ConcurrentCompilesFromThreads) {
  constexpr int kThreads = 4;
  std::vector<std::vector<char>> out(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      auto req = tiny_request(t % 2 ? 80 : 90);
      req.options.push_back("-DVARIANT=" + std::to_string(t));
      out[t] = compile::nvrtc_compile(req, nullptr);
    });
  for (auto& th : threads) th.join();
  for (const auto& cubin : out) EXPECT_TRUE(is_elf(cubin));
}

// This machine class (CI, build hosts) has no NVIDIA driver: everything must say so clearly.
TEST(CudaDriver, MissingDriverIsReportedNotFatal) {
  if (void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) {
    dlclose(lib);
    GTEST_SKIP() << "an NVIDIA driver is installed here";
  }
  std::string why;
  EXPECT_EQ(driver::try_cuda_driver(&why), nullptr);
  EXPECT_NE(why.find("libcuda.so.1"), std::string::npos) << why;
  EXPECT_NE(why.find("NVIDIA"), std::string::npos) << why;
  EXPECT_THROW(driver::cuda_driver(), normjit::Error);
}

TEST(CudaDriver, CheckCudaFormatsTheFailure) {
  EXPECT_NO_THROW(driver::check_cuda(CUDA_SUCCESS, "cuNothing"));
  try {
    driver::check_cuda(CUDA_ERROR_INVALID_VALUE, "cuModuleLoadData(scale)");
    FAIL() << "expected normjit::Error";
  } catch (const normjit::Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("cuModuleLoadData(scale) failed: ", 0), 0u) << msg;
    if (driver::try_cuda_driver(nullptr)) {
      EXPECT_NE(msg.find("CUDA_ERROR_INVALID_VALUE"), std::string::npos) << msg;
    }
  }
}

TEST(PtxasReport, ReadsRegistersSpillsAndStackFromTheLog) {
  const std::string log =
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Compiling entry function 'k' for 'sm_90'\n"
      "ptxas info    : Function properties for k\n"
      "ptxas         .     216 bytes stack frame, 244 bytes spill stores, 244 bytes spill loads\n"
      "ptxas info    : Used 128 registers, used 1 barriers, 216 bytes cumulative stack size\n";
  const tools::PtxasReport r = tools::parse_ptxas_report(log);
  EXPECT_TRUE(r.found);
  EXPECT_EQ(r.registers, 128);
  EXPECT_EQ(r.spill_store_bytes, 244);
  EXPECT_EQ(r.stack_frame_bytes, 216);
  EXPECT_FALSE(tools::parse_ptxas_report("").found) << "a log without -Xptxas=-v";
}

TEST_F(Nvrtc, VerboseCompileReturnsPtxasReport) {
  // With a GPU, NVRTC would serve a kernel compiled before from the driver's compute cache, without
  // a ptxas log; this process has not loaded libcuda for NVRTC yet, so the variable still counts.
  setenv("CUDA_CACHE_DISABLE", "1", 1);
  compile::CompileRequest req = tiny_request(90);
  req.options = {"-Xptxas=-v"};
  std::string log;
  EXPECT_TRUE(is_elf(compile::nvrtc_compile(req, nullptr, nullptr, &log)));
  const tools::PtxasReport r = tools::parse_ptxas_report(log);
  EXPECT_TRUE(r.found) << log;
  EXPECT_GT(r.registers, 0) << log;
  EXPECT_EQ(r.spill_store_bytes, 0) << log;
}
