#include "schedule/device_profile.h"

#include <algorithm>
#include <cctype>

#include "driver/cuda_driver.h"
#include "normjit/normjit.h"

namespace normjit {

std::vector<DeviceProfile> builtin_profiles() {
  return {
      {"H200", 90, 132, 2048, 65536, 60 << 20, 228 << 10},
      {"H100", 90, 132, 2048, 65536, 50 << 20, 228 << 10},
      {"A100", 80, 108, 2048, 65536, 40 << 20, 164 << 10},
      {"L4", 89, 58, 1536, 65536, 48 << 20, 100 << 10},
  };
}

DeviceProfile builtin_profile(const std::string& name) {
  std::string want = name;
  std::transform(want.begin(), want.end(), want.begin(), [](unsigned char ch) { return std::toupper(ch); });
  std::string known;
  for (const DeviceProfile& p : builtin_profiles()) {
    if (p.name == want) return p;
    known += (known.empty() ? "" : ", ") + p.name;
  }
  throw Error("unknown device profile '" + name + "'; expected one of: " + known + " (or 'live' for the GPU here)");
}

DeviceProfile live_profile(int device) {
  const auto& cu = driver::cuda_driver();
  CUdevice dev;
  driver::check_cuda(cu.cuDeviceGet(&dev, device), "cuDeviceGet");
  auto attr = [&](CUdevice_attribute a) {
    int v = 0;
    driver::check_cuda(cu.cuDeviceGetAttribute(&v, a, dev), "cuDeviceGetAttribute");
    return v;
  };
  DeviceProfile p;
  char name[256] = {};
  driver::check_cuda(cu.cuDeviceGetName(name, sizeof(name) - 1, dev), "cuDeviceGetName");
  p.name = name;
  p.arch = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) * 10 + attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  p.sms = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  p.max_threads_per_sm = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR);
  p.regs_per_sm = attr(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR);
  p.l2_bytes = attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
  p.smem_per_sm = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
  return p;
}

}  // namespace normjit
