// NVRTC, loaded with dlopen on first use. Search order: $NORMJIT_NVRTC_PATH (when set, the only
// candidate), libnvrtc.so.13, libnvrtc.so.12, the NVRTC that pip's nvidia-cuda-nvrtc package ships
// in a Python installation (site-packages found through $VIRTUAL_ENV, $CONDA_PREFIX and the paths of
// libraries already loaded into the process), then /usr/local/cuda/lib64.
#pragma once

#include <nvrtc.h>

#include <string>
#include <vector>

namespace normjit::driver {

struct Nvrtc {
  nvrtcResult (*nvrtcVersion)(int*, int*);
  const char* (*nvrtcGetErrorString)(nvrtcResult);
  nvrtcResult (*nvrtcCreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                                    const char* const*);
  nvrtcResult (*nvrtcDestroyProgram)(nvrtcProgram*);
  nvrtcResult (*nvrtcCompileProgram)(nvrtcProgram, int, const char* const*);
  nvrtcResult (*nvrtcGetProgramLogSize)(nvrtcProgram, size_t*);
  nvrtcResult (*nvrtcGetProgramLog)(nvrtcProgram, char*);
  nvrtcResult (*nvrtcGetCUBINSize)(nvrtcProgram, size_t*);
  nvrtcResult (*nvrtcGetCUBIN)(nvrtcProgram, char*);
  // Optional (nullptr when the library lacks them): used to say which -arch values are valid.
  nvrtcResult (*nvrtcGetNumSupportedArchs)(int*) = nullptr;
  nvrtcResult (*nvrtcGetSupportedArchs)(int*) = nullptr;
  int major = 0, minor = 0;  // nvrtcVersion, read once at load
  std::string path;          // the library that was loaded
};

// Loads NVRTC once; throws normjit::Error naming the paths tried and how to install it.
const Nvrtc& nvrtc();
const Nvrtc* try_nvrtc(std::string* why_not);

// The sm_XX values this NVRTC can compile for, ascending (empty if it cannot tell).
std::vector<int> nvrtc_supported_archs(const Nvrtc& lib);

}  // namespace normjit::driver
