// NVRTC -> cubin for one exact architecture, through the disk cache.
#pragma once

#include <string>
#include <vector>

namespace normjit::compile {

class DiskCache;

struct CompileRequest {
  std::string name;                  // kernel name, for logs and stats
  std::string source;                // complete, self-contained CUDA source (no #include)
  int arch = 90;                     // compute capability * 10, e.g. 90 for sm_90
  std::vector<std::string> options;  // extra NVRTC options
};

struct CompileResult {
  std::vector<char> cubin;
  bool from_disk = false;     // served by the disk cache
  double compile_ms = 0;      // NVRTC time (0 when from disk)
  double compile_cpu_ms = 0;  // CPU time of the compiling thread in NVRTC: much less than compile_ms
                              // means the compile waited (for a core, a lock), not worked
  std::string disk_key;       // the key that was looked up
};

// The NVRTC options every kernel is compiled with (besides -arch), chosen by measurement: see
// docs in README "When does normjit compile?".
const std::vector<std::string>& default_options();

// The full disk-cache key: normjit version, NVRTC version, arch, options and a hash of the source.
std::string disk_key(const CompileRequest& req);
// The value of one "<field> <value>" line of such a key (e.g. "name", "arch"), or "".
std::string disk_key_field(const std::string& key, const std::string& field);

// Looks in `cache` (may be null), else compiles with NVRTC and stores the result.
// Throws normjit::Error carrying the NVRTC log on a compile error.
CompileResult compile_cubin(const CompileRequest& req, DiskCache* cache);

// Compiles without any cache (benchmarks, tests); `ms` and `cpu_ms` (optional) get the wall and the
// thread CPU milliseconds (NVRTC compiles on the calling thread), `log` (optional) NVRTC's program
// log (with -Xptxas=-v: ptxas' resource report, see tools/ptxas_report.h).
std::vector<char> nvrtc_compile(const CompileRequest& req, double* ms, double* cpu_ms = nullptr,
                                std::string* log = nullptr);

}  // namespace normjit::compile
