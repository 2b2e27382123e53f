// What the heuristics need to know about a GPU. Built-in profiles let `normjit explain` predict
// kernels offline; the live profile is read from the driver.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace normjit {

struct DeviceProfile {
  std::string name;
  int arch = 90;               // compute capability * 10
  int sms = 132;               // multiprocessors
  int max_threads_per_sm = 2048;
  int regs_per_sm = 65536;
  int64_t l2_bytes = 50 << 20;
  int smem_per_sm = 228 << 10;  // shared memory per multiprocessor (bytes, before per-CTA reserves)
};

// H200, H100, A100, L4 (case-insensitive); throws normjit::Error listing the known names.
DeviceProfile builtin_profile(const std::string& name);
std::vector<DeviceProfile> builtin_profiles();
// Read from the driver for a device ordinal (needs a GPU).
DeviceProfile live_profile(int device);

}  // namespace normjit
