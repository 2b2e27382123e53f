// Per-GPU state: the primary context (the one PyTorch's runtime uses too) and the live profile.
#pragma once

#include <cuda.h>

#include "schedule/device_profile.h"

namespace normjit {

struct DeviceState {
  int ordinal = 0;
  CUcontext context = nullptr;
  DeviceProfile profile;
};

// Created once per device (thread-safe); throws normjit::Error for a bad ordinal or no driver.
const DeviceState& device_state(int ordinal);

// Makes the device's primary context current on this thread (a no-op when it already is, which is
// the case under PyTorch).
void make_current(const DeviceState& d);

}  // namespace normjit
