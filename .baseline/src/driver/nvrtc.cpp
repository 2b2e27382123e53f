// Finding and loading NVRTC at run time (see nvrtc.h for the search order).
#include "driver/nvrtc.h"

#include <dlfcn.h>
#include <glob.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "normjit/normjit.h"

namespace normjit::driver {
namespace {

// Where pip's NVRTC wheels put the library, relative to a site-packages directory: the CUDA 13
// wheels (nvidia-cuda-nvrtc 13.x) use nvidia/cu13/lib, the CUDA 12 ones nvidia/cuda_nvrtc/lib.
const char* const kPipLayouts[] = {
    "nvidia/cu13/lib/libnvrtc.so.13",
    "nvidia/cuda_nvrtc/lib/libnvrtc.so.13",
    "nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
};

void add_unique(std::vector<std::string>& v, const std::string& s) {
  if (!s.empty() && std::find(v.begin(), v.end(), s) == v.end()) v.push_back(s);
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// site-packages directories of a Python prefix (a venv or a conda environment).
void site_packages_of_prefix(const std::string& prefix, std::vector<std::string>& out) {
  if (prefix.empty()) return;
  glob_t g{};
  const std::string pattern = prefix + "/lib/python3*/site-packages";
  if (glob(pattern.c_str(), GLOB_ONLYDIR, nullptr, &g) == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) add_unique(out, g.gl_pathv[i]);
  globfree(&g);
}

// Libraries already mapped into this process tell us where Python keeps its packages (torch, numpy
// and friends live in site-packages), and whether some NVRTC is already loaded (torch loads the
// pip one); reusing that one avoids two NVRTC copies in one process.
void scan_process_maps(std::vector<std::string>& site_dirs, std::vector<std::string>& loaded_nvrtc) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    const size_t base = path.rfind('/');
    if (path.compare(base + 1, 12, "libnvrtc.so.") == 0) add_unique(loaded_nvrtc, path);
    for (const std::string marker : {"/site-packages/", "/dist-packages/"}) {  // dist-: Debian's Python
      const size_t sp = path.find(marker);
      if (sp != std::string::npos) add_unique(site_dirs, path.substr(0, sp + marker.size() - 1));
    }
  }
}

// Every candidate, in the order of nvrtc.h.
std::vector<std::string> candidates() {
  std::vector<std::string> c;
  add_unique(c, "libnvrtc.so.13");
  add_unique(c, "libnvrtc.so.12");

  std::vector<std::string> site_dirs, loaded;
  site_packages_of_prefix(env("VIRTUAL_ENV"), site_dirs);
  site_packages_of_prefix(env("CONDA_PREFIX"), site_dirs);
  scan_process_maps(site_dirs, loaded);
  for (const std::string& p : loaded) add_unique(c, p);
  for (const std::string& dir : site_dirs)
    for (const char* rel : kPipLayouts) add_unique(c, dir + "/" + rel);

  add_unique(c, "/usr/local/cuda/lib64/libnvrtc.so");
  return c;
}

template <typename Fn>
bool bind(void* lib, const char* name, Fn& slot) {
  slot = reinterpret_cast<Fn>(dlsym(lib, name));
  return slot != nullptr;
}

// Resolves the table from an opened library; returns the missing symbol's name, or "".
std::string bind_all(void* lib, Nvrtc& t) {
#define NORMJIT_BIND(f) \
  if (!bind(lib, #f, t.f)) return #f;
  NORMJIT_BIND(nvrtcVersion)
  NORMJIT_BIND(nvrtcGetErrorString)
  NORMJIT_BIND(nvrtcCreateProgram)
  NORMJIT_BIND(nvrtcDestroyProgram)
  NORMJIT_BIND(nvrtcCompileProgram)
  NORMJIT_BIND(nvrtcGetProgramLogSize)
  NORMJIT_BIND(nvrtcGetProgramLog)
  NORMJIT_BIND(nvrtcGetCUBINSize)
  NORMJIT_BIND(nvrtcGetCUBIN)
#undef NORMJIT_BIND
  bind(lib, "nvrtcGetNumSupportedArchs", t.nvrtcGetNumSupportedArchs);
  bind(lib, "nvrtcGetSupportedArchs", t.nvrtcGetSupportedArchs);
  return {};
}

// The file a library handle came from, for messages and `normjit explain`.
std::string real_path(void* symbol, const std::string& fallback) {
  Dl_info info{};
  if (dladdr(symbol, &info) && info.dli_fname && info.dli_fname[0]) return info.dli_fname;
  return fallback;
}

// NVRTC dlopens libnvrtc-builtins.so.<major>.<minor> by name when it compiles. For a copy found by
// file path (pip, NORMJIT_NVRTC_PATH) that directory is usually not on the loader's search path, so
// load the builtins from next to it first; the later lookup by soname then finds them.
void preload_builtins(const Nvrtc& t) {
  const size_t slash = t.path.rfind('/');
  if (slash == std::string::npos) return;
  const std::string file = t.path.substr(0, slash) + "/libnvrtc-builtins.so." + std::to_string(t.major) + "." +
                           std::to_string(t.minor);
  dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);  // best effort: absent in some layouts, then NVRTC finds its own
}

struct LoadResult {
  Nvrtc table;
  bool ok = false;
  std::string error;
};

// Tries one candidate; on failure appends "  <candidate>: <why>" to `tried`.
bool try_load(const std::string& candidate, LoadResult& out, std::string& tried) {
  void* lib = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    std::string err = dlerror() ?: "cannot be loaded";
    if (err.rfind(candidate + ": ", 0) == 0) err.erase(0, candidate.size() + 2);  // dlerror repeats the name
    tried += "\n  " + candidate + ": " + err;
    return false;
  }
  Nvrtc t;
  if (std::string missing = bind_all(lib, t); !missing.empty()) {
    tried += "\n  " + candidate + ": has no " + missing + " (not a usable NVRTC)";
    dlclose(lib);
    return false;
  }
  if (t.nvrtcVersion(&t.major, &t.minor) != NVRTC_SUCCESS) {
    tried += "\n  " + candidate + ": nvrtcVersion failed";
    dlclose(lib);
    return false;
  }
  // The library stays loaded for the life of the process.
  t.path = real_path(reinterpret_cast<void*>(t.nvrtcVersion), candidate);
  preload_builtins(t);
  out.table = t;
  out.ok = true;
  return true;
}

LoadResult load_nvrtc() {
  LoadResult out;
  std::string tried;
  const std::string forced = env("NORMJIT_NVRTC_PATH");
  if (!forced.empty()) {
    // An explicit choice is not second-guessed: falling back silently would hide a broken setting.
    if (!try_load(forced, out, tried))
      out.error = "NVRTC could not be loaded from NORMJIT_NVRTC_PATH:" + tried +
                  "\nPoint NORMJIT_NVRTC_PATH at a libnvrtc.so file, or unset it to search the usual places.";
    return out;
  }
  for (const std::string& c : candidates())
    if (try_load(c, out, tried)) return out;
  out.error = "NVRTC (the CUDA runtime compiler) could not be found. Tried:" + tried +
              "\nTo fix this, install the CUDA toolkit or `pip install nvidia-cuda-nvrtc`, or set NORMJIT_NVRTC_PATH to "
              "the full path of libnvrtc.so.";
  return out;
}

const LoadResult& loaded() {
  static const LoadResult result = load_nvrtc();  // once per process, thread-safe
  return result;
}

}  // namespace

const Nvrtc* try_nvrtc(std::string* why_not) {
  try {
    const LoadResult& r = loaded();
    if (r.ok) return &r.table;
    if (why_not) *why_not = r.error;
  } catch (const std::exception& e) {
    if (why_not) *why_not = e.what();
  }
  return nullptr;
}

const Nvrtc& nvrtc() {
  const LoadResult& r = loaded();
  if (!r.ok) throw Error(r.error);
  return r.table;
}

std::vector<int> nvrtc_supported_archs(const Nvrtc& lib) {
  std::vector<int> archs;
  int n = 0;
  if (!lib.nvrtcGetNumSupportedArchs || !lib.nvrtcGetSupportedArchs) return archs;
  if (lib.nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n <= 0) return archs;
  archs.resize(static_cast<size_t>(n));
  if (lib.nvrtcGetSupportedArchs(archs.data()) != NVRTC_SUCCESS) archs.clear();
  std::sort(archs.begin(), archs.end());
  return archs;
}

}  // namespace normjit::driver
