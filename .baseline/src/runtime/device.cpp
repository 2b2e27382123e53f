#include "runtime/device.h"

#include <array>
#include <memory>
#include <mutex>

#include "driver/cuda_driver.h"
#include "normjit/normjit.h"

namespace normjit {
namespace {
constexpr int kMaxDevices = 64;
std::array<std::once_flag, kMaxDevices> g_once;
std::array<std::unique_ptr<DeviceState>, kMaxDevices> g_states;
}  // namespace

const DeviceState& device_state(int ordinal) {
  const auto& cu = driver::cuda_driver();
  int count = 0;
  driver::check_cuda(cu.cuDeviceGetCount(&count), "cuDeviceGetCount");
  if (ordinal < 0 || ordinal >= count || ordinal >= kMaxDevices)
    throw Error("device " + std::to_string(ordinal) + " does not exist: this machine has " + std::to_string(count) +
                " CUDA device(s); expected an ordinal in [0, " + std::to_string(count) + ")");
  std::call_once(g_once[ordinal], [&] {
    auto s = std::make_unique<DeviceState>();
    s->ordinal = ordinal;
    CUdevice dev;
    driver::check_cuda(cu.cuDeviceGet(&dev, ordinal), "cuDeviceGet");
    driver::check_cuda(cu.cuDevicePrimaryCtxRetain(&s->context, dev), "cuDevicePrimaryCtxRetain");
    s->profile = live_profile(ordinal);
    g_states[ordinal] = std::move(s);
  });
  return *g_states[ordinal];
}

void make_current(const DeviceState& d) {
  const auto& cu = driver::cuda_driver();
  CUcontext current = nullptr;
  driver::check_cuda(cu.cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  if (current != d.context) driver::check_cuda(cu.cuCtxSetCurrent(d.context), "cuCtxSetCurrent");
}

}  // namespace normjit
