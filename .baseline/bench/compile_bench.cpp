// Cold-compile cost of normjit kernels and the NVRTC options that change it (CPU only).
//
// For each option set: compiles a representative kernel (the nnU-Net stage-0 forward, fp16,
// split + cached) REPEAT times with NVRTC (no disk cache) and reports the median milliseconds and
// cubin size; the very first compile of the process (NVRTC's one-time start) is reported apart.
// Then times a disk-cache hit (read + verify) for the same kernel. NVRTC's driver-cache use is off
// (CUDA_CACHE_DISABLE=1 unless set).
//   build/normjit_compile_bench [REPEAT]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "compile/compiler.h"
#include "compile/disk_cache.h"
#include "runtime/call_keys.h"
#include "runtime/kernel_cache.h"
#include "schedule/heuristics.h"

using namespace normjit;

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main(int argc, char** argv) {
  // Each repeat compiles the same source: with NVRTC's use of the driver's compute cache (12.9+,
  // wherever libcuda is found) every repeat after the first would be a ~30 ms cache hit.
  setenv("CUDA_CACHE_DISABLE", "1", /*overwrite=*/0);
  const int repeat = argc > 1 ? std::atoi(argv[1]) : 5;
  ForwardArgs a;
  a.x = contiguous_tensor(reinterpret_cast<void*>(0x100000), DType::f16, {2, 32, 128, 128, 128});
  a.y = contiguous_tensor(reinterpret_cast<void*>(0x200000), DType::f16, {2, 32, 128, 128, 128});
  a.weight = contiguous_tensor(reinterpret_cast<void*>(0x300000), DType::f32, {32});
  a.bias = contiguous_tensor(reinterpret_cast<void*>(0x400000), DType::f32, {32});
  a.save_mean = reinterpret_cast<float*>(0x500000);
  a.save_rstd = reinterpret_cast<float*>(0x600000);
  const CallKeys k = forward_keys(a);
  const Launch l = choose_launch(k.fusion, k.shape, builtin_profile("H200"), Policy::bounded);
  compile::CompileRequest req = compile_request(k.fusion, l.config, 90);
  std::printf("kernel %s (%zu bytes of source)\n", req.name.c_str(), req.source.size());

  double first_ms = 0;
  compile::nvrtc_compile(req, &first_ms);
  std::printf("first compile in this process (includes NVRTC start): %.1f ms\n", first_ms);

  const std::vector<std::pair<const char*, std::vector<std::string>>> variants = {
      {"default (" "--std=c++17 -default-device)", {}},
      {"+ -minimal", {"-minimal"}},
      {"+ -dopt=on", {"-dopt=on"}},
      {"+ -Ofc=max", {"-Ofc=max"}},
      {"+ -extra-device-vectorization", {"-extra-device-vectorization"}},
  };
  std::printf("%-36s %10s %10s\n", "options", "median ms", "cubin B");
  for (const auto& [label, extra] : variants) {
    req.options = extra;
    std::vector<double> ms;
    size_t bytes = 0;
    try {
      for (int i = 0; i < repeat; ++i) {
        double t = 0;
        bytes = compile::nvrtc_compile(req, &t).size();
        ms.push_back(t);
      }
      std::printf("%-36s %10.1f %10zu\n", label, median(ms), bytes);
    } catch (const std::exception& e) {
      std::printf("%-36s rejected: %.60s\n", label, e.what());
    }
  }

  // Disk-cache hit: read, verify (size, key, checksum).
  req.options.clear();
  const auto dir = std::filesystem::temp_directory_path() / "normjit-compile-bench";
  std::filesystem::remove_all(dir);
  compile::DiskCache cache(dir.string());
  compile::compile_cubin(req, &cache);
  std::vector<double> hit_ms;
  for (int i = 0; i < 200; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const compile::CompileResult r = compile::compile_cubin(req, &cache);
    hit_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    if (!r.from_disk) std::printf("unexpected disk miss\n");
  }
  std::printf("disk-cache hit (read + verify, no module load): median %.3f ms\n", median(hit_ms));
  std::filesystem::remove_all(dir);
  return 0;
}
