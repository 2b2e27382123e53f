// NVRTC compilation to a cubin for one exact architecture, with the disk cache in front.
//
// Every NVRTC program is independent, so compiles from several threads run concurrently; the only
// shared state is the loaded NVRTC table, which is immutable after loading.
#include "compile/compiler.h"

#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "compile/disk_cache.h"
#include "compile/hash.h"
#include "driver/nvrtc.h"
#include "normjit/normjit.h"

#ifndef NORMJIT_VERSION
#error "NORMJIT_VERSION must be defined by the build: it is part of every disk-cache key"
#endif

namespace normjit::compile {
namespace {

// Options are part of the cache key, so changing this list invalidates old entries by itself.
//  --std=c++17      the kernels use if constexpr and friends; pinned so a newer NVRTC default
//                   cannot change what the code means.
//  -default-device  helpers need no __device__ annotation.
// Deliberately absent:
//  --use_fast_math  changes rsqrt/exp/erf accuracy; normalisation must match PyTorch closely.
//  -O3              not an NVRTC option (NVRTC 13 rejects it); device code is optimised by default.
//  -lineinfo / -G   debugging aids that make cubins larger (and -G slow).
//  -minimal         NVRTC >= 12.4: skips texture/cudadevrt declarations, measured ~10% faster on a
//                   small kernel with NVRTC 13.0; a candidate once the kernels are known not to need them.
// NORMJIT_NVRTC_OPTIONS (space-separated) appends options for profiling and inspection, e.g.
// "-lineinfo" for Nsight Compute's source view or "--ptxas-options=-v" for registers and spills
// (NVRTC's log is then printed). Being options, they are part of every disk-cache key.
std::vector<std::string> extra_options() {
  std::vector<std::string> out;
  const char* v = std::getenv("NORMJIT_NVRTC_OPTIONS");
  std::istringstream in(v ? v : "");
  for (std::string o; in >> o;) out.push_back(o);
  return out;
}

std::vector<std::string> choose_default_options() {
  std::vector<std::string> options{"--std=c++17", "-default-device"};
  for (std::string& o : extra_options()) options.push_back(std::move(o));
  return options;
}

std::string join_options(const CompileRequest& req) {
  std::string s;
  auto add = [&](const std::string& o) {
    if (!s.empty()) s += ' ';
    s += o;
  };
  for (const std::string& o : default_options()) add(o);
  for (const std::string& o : req.options) add(o);
  return s;
}

std::string arch_option(int arch) { return "--gpu-architecture=sm_" + std::to_string(arch); }

double thread_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) * 1e3 + double(t.tv_nsec) / 1e6;
}

// Owns an nvrtcProgram for exception safety.
class Program {
 public:
  Program(const driver::Nvrtc& lib, const CompileRequest& req) : lib_(lib) {
    const std::string file = req.name + ".cu";  // appears in NVRTC's error messages
    check(lib_.nvrtcCreateProgram(&prog_, req.source.c_str(), file.c_str(), 0, nullptr, nullptr), req,
          "nvrtcCreateProgram");
  }
  ~Program() {
    if (prog_) lib_.nvrtcDestroyProgram(&prog_);
  }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  nvrtcProgram get() const { return prog_; }

  std::string log() const {
    size_t size = 0;
    if (lib_.nvrtcGetProgramLogSize(prog_, &size) != NVRTC_SUCCESS || size <= 1) return {};
    std::string text(size, '\0');
    if (lib_.nvrtcGetProgramLog(prog_, text.data()) != NVRTC_SUCCESS) return {};
    text.resize(std::strlen(text.c_str()));  // drop the terminating NUL
    return text;
  }

  void check(nvrtcResult r, const CompileRequest& req, const char* what) const {
    if (r != NVRTC_SUCCESS)
      throw Error(std::string(what) + " failed for kernel '" + req.name + "': " + lib_.nvrtcGetErrorString(r));
  }

 private:
  const driver::Nvrtc& lib_;
  nvrtcProgram prog_ = nullptr;
};

std::string supported_archs_text(const driver::Nvrtc& lib) {
  std::string s;
  for (int a : driver::nvrtc_supported_archs(lib)) s += (s.empty() ? "sm_" : ", sm_") + std::to_string(a);
  return s.empty() ? "unknown" : s;
}

[[noreturn]] void throw_compile_error(const driver::Nvrtc& lib, const CompileRequest& req, nvrtcResult r,
                                      const std::string& options, const std::string& log) {
  std::string msg = "NVRTC " + std::to_string(lib.major) + "." + std::to_string(lib.minor) +
                    " failed to compile kernel '" + req.name + "' for sm_" + std::to_string(req.arch) + ": " +
                    lib.nvrtcGetErrorString(r) + "\n  options: " + arch_option(req.arch) + " " + options;
  if (r == NVRTC_ERROR_INVALID_OPTION)
    msg += "\n  this NVRTC (" + lib.path + ") compiles for: " + supported_archs_text(lib);
  msg += "\n  log:\n" + (log.empty() ? std::string("  (empty)") : log);
  throw Error(msg);
}

}  // namespace

const std::vector<std::string>& default_options() {
  static const std::vector<std::string> options = choose_default_options();
  return options;
}

std::string disk_key(const CompileRequest& req) {
  const driver::Nvrtc& lib = driver::nvrtc();
  return std::string("normjit ") + NORMJIT_VERSION + "\n" +                                    //
         "nvrtc " + std::to_string(lib.major) + "." + std::to_string(lib.minor) + "\n" +       //
         "arch sm_" + std::to_string(req.arch) + "\n" +                                        //
         "options " + join_options(req) + "\n" +                                               //
         "source " + hash128(req.source).hex() + " " + std::to_string(req.source.size()) + "\n" +  //
         "name " + req.name + "\n";
}

std::vector<char> nvrtc_compile(const CompileRequest& req, double* ms, double* cpu_ms, std::string* log) {
  const driver::Nvrtc& lib = driver::nvrtc();
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = thread_cpu_ms();

  std::vector<std::string> options{arch_option(req.arch)};
  options.insert(options.end(), default_options().begin(), default_options().end());
  options.insert(options.end(), req.options.begin(), req.options.end());
  std::vector<const char*> argv;
  for (const std::string& o : options) argv.push_back(o.c_str());

  Program prog(lib, req);
  const nvrtcResult r = lib.nvrtcCompileProgram(prog.get(), static_cast<int>(argv.size()), argv.data());
  if (r != NVRTC_SUCCESS) throw_compile_error(lib, req, r, join_options(req), prog.log());

  size_t size = 0;
  prog.check(lib.nvrtcGetCUBINSize(prog.get(), &size), req, "nvrtcGetCUBINSize");
  if (size == 0)
    throw Error("NVRTC produced no cubin for kernel '" + req.name + "' (sm_" + std::to_string(req.arch) +
                "); the architecture must be a real sm_XX, not a virtual compute_XX");
  std::vector<char> cubin(size);
  prog.check(lib.nvrtcGetCUBIN(prog.get(), cubin.data()), req, "nvrtcGetCUBIN");

  if (ms) *ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (cpu_ms) *cpu_ms = thread_cpu_ms() - cpu_start;
  const std::string text = prog.log();
  if (!text.empty() && !extra_options().empty())  // asked for (e.g. ptxas -v): show it
    std::fprintf(stderr, "[normjit] NVRTC log of %s:\n%s\n", req.name.c_str(), text.c_str());
  if (log) *log = text;
  return cubin;
}

std::string disk_key_field(const std::string& key, const std::string& field) {
  const std::string prefix = field + " ";
  for (size_t pos = 0; pos < key.size();) {
    size_t end = key.find('\n', pos);
    if (end == std::string::npos) end = key.size();
    if (key.compare(pos, prefix.size(), prefix) == 0) return key.substr(pos + prefix.size(), end - pos - prefix.size());
    pos = end + 1;
  }
  return "";
}

CompileResult compile_cubin(const CompileRequest& req, DiskCache* cache) {
  CompileResult result;
  result.disk_key = disk_key(req);
  const bool use_cache = cache && cache->enabled();
  if (use_cache) {
    if (auto hit = cache->load(result.disk_key)) {
      // The checksum proved the bytes are what was stored; the ELF check guards against a
      // foreign payload stored under our key by some other tool.
      if (hit->size() >= 4 && std::memcmp(hit->data(), "\x7f" "ELF", 4) == 0) {
        result.cubin = std::move(*hit);
        result.from_disk = true;
        return result;
      }
    }
  }
  result.cubin = nvrtc_compile(req, &result.compile_ms, &result.compile_cpu_ms);
  if (use_cache) cache->store(result.disk_key, result.cubin);  // failure already warned about
  return result;
}

}  // namespace normjit::compile
