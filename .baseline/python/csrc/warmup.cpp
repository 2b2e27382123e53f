// normjit._C.warmup_calls and nvrtc_available: the kernels of a model's calls, ahead of time.
//
// normjit/warmup.py records the instance-norm calls a model makes (sizes, strides, dtypes, fusion
// flags). Each call becomes the ForwardArgs/BackwardArgs that the operators in ops.cpp would build
// (their layout rule, strides and parameter dtypes), with fake pointers, and then kernels through
// the runtime's own code: forward_keys/backward_keys and choose_launch. So what is compiled here is
// exactly what the first real call looks up. The pointers are 256-byte aligned because torch's
// caching allocator hands out blocks at least that aligned (the runtime only reads the alignment).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "compile/disk_cache.h"
#include "driver/nvrtc.h"
#include "ops.h"
#include "runtime/call_keys.h"
#include "runtime/device.h"
#include "runtime/kernel_cache.h"
#include "schedule/heuristics.h"
#include "tools/warmup.h"

namespace py = pybind11;

namespace normjit_torch {
namespace {

// One recorded call; see warmup_calls' docstring for the dict it comes from.
struct Call {
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;  // x's storage offset (elements): it decides x's alignment
  at::ScalarType dtype = at::kFloat;
  std::optional<at::ScalarType> weight_dtype;  // nullopt: not affine
  bool residual = false, running = false, use_input_stats = true;
  int64_t activation = 0;
  bool fwd = true, bwd = false;
};

// float64 is accepted for weights only: the operators convert such weights to fp32.
at::ScalarType parse_dtype(const std::string& name, bool weight) {
  if (name == "float32") return at::kFloat;
  if (name == "float16") return at::kHalf;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float64" && weight) return at::kDouble;
  throw py::value_error("normjit.warmup_calls: " + std::string(weight ? "weight_dtype" : "dtype") + " '" +
                        name + "' is not one of float32, float16, bfloat16" + (weight ? ", float64" : ""));
}

template <typename T>
T get(const py::dict& d, const char* key, T fallback) {
  return d.contains(key) ? d[key].cast<T>() : fallback;
}

Call parse_call(const py::dict& d) {
  if (!d.contains("sizes") || !d.contains("dtype"))
    throw py::value_error("normjit.warmup_calls: each call needs at least 'sizes' and 'dtype'");
  Call c;
  c.sizes = d["sizes"].cast<std::vector<int64_t>>();
  c.strides = get(d, "strides", std::vector<int64_t>{});
  c.offset = get<int64_t>(d, "offset", 0);
  c.dtype = parse_dtype(d["dtype"].cast<std::string>(), /*weight=*/false);
  if (d.contains("weight_dtype") && !d["weight_dtype"].is_none())
    c.weight_dtype = parse_dtype(d["weight_dtype"].cast<std::string>(), /*weight=*/true);
  c.residual = get(d, "residual", false);
  c.running = get(d, "running", false);
  c.use_input_stats = get(d, "use_input_stats", true);
  c.activation = get<int64_t>(d, "activation", 0);
  c.fwd = get(d, "fwd", true);
  c.bwd = get(d, "bwd", false);
  return c;
}

// Distinct fake device addresses, 4 GiB apart and 256-byte aligned.
struct FakePointers {
  uintptr_t next_ = 0;
  void* next(int64_t offset_bytes = 0) {
    next_ += uintptr_t(1) << 32;
    return reinterpret_cast<void*>(next_ + uintptr_t(offset_bytes));
  }
  float* f32() { return static_cast<float*>(next()); }
};

// The kernels of one call, as the operators in ops.cpp would launch them on `device`.
void call_kernels(const Call& c, int device, const normjit::DeviceProfile& profile,
                  std::vector<std::pair<normjit::FusionKey, normjit::KernelConfig>>& out) {
  // x's layout by ops.cpp's rule, from a meta tensor with the recorded strides (costs nothing).
  const at::Tensor meta =
      c.strides.empty()
          ? at::empty(c.sizes, at::TensorOptions().dtype(c.dtype).device(at::kMeta))
          : at::empty_strided(c.sizes, c.strides, at::TensorOptions().dtype(c.dtype).device(at::kMeta));
  at::MemoryFormat fmt = served_format(meta);
  int64_t x_offset = c.offset * int64_t(meta.element_size());
  if (fmt == at::MemoryFormat::Preserve) fmt = at::MemoryFormat::Contiguous, x_offset = 0;  // copied
  const normjit::DType dt = to_normjit_dtype(c.dtype);
  const int64_t C = c.sizes.size() > 1 ? c.sizes[1] : 0;
  // Weight/bias: fp32 or x's dtype, anything else converted to fp32 (param() in ops.cpp).
  const normjit::DType wdt = c.weight_dtype == c.dtype ? dt : normjit::DType::f32;
  auto like_x = [&](void* p) { return strided_arg(p, dt, c.sizes, fmt); };
  auto vec = [&](void* p) {
    normjit::TensorArg a;
    a.data = p, a.dtype = wdt, a.ndim = 1, a.sizes[0] = C, a.strides[0] = 1;
    return a;
  };
  auto add = [&](const normjit::CallKeys& k) {
    if (k.empty) return;  // zero-size: nothing is compiled or launched
    if (normjit::autotune_enabled()) {
      // The first call will time every candidate: compile them all now (duplicates are dropped
      // downstream; alternatives often share the default's kernel and differ in chunks only).
      const normjit::Policy policy = normjit::policy_from_env();
      for (const normjit::Launch& l : normjit::candidate_launches(k.fusion, k.shape, profile, policy))
        out.emplace_back(k.fusion, l.config);
      return;
    }
    const normjit::Launch l = normjit::choose_launch(k.fusion, k.shape, profile, normjit::policy_from_env());
    out.emplace_back(k.fusion, l.config);
  };

  FakePointers p;
  if (c.fwd) {
    normjit::ForwardArgs a;
    a.x = like_x(p.next(x_offset));
    a.y = like_x(p.next());
    if (c.weight_dtype) a.weight = vec(p.next()), a.bias = vec(p.next());
    if (c.residual) a.residual = like_x(p.next());
    if (c.use_input_stats) a.save_mean = p.f32(), a.save_rstd = p.f32();  // always saved in training
    if (c.running) a.running_mean = p.f32(), a.running_var = p.f32();
    a.use_input_stats = c.use_input_stats;
    a.activation = to_activation(c.activation);
    a.device = device;
    add(normjit::forward_keys(a));
  }
  // Only the training forward has a backward kernel (autograd.cpp does eval with aten ops).
  if (c.bwd && c.use_input_stats) {
    normjit::BackwardArgs a;
    a.x = like_x(p.next(x_offset));
    a.dy = like_x(p.next());
    a.dx = like_x(p.next());
    if (c.weight_dtype) {
      a.weight = vec(p.next()), a.bias = vec(p.next());
      a.dweight = p.f32(), a.dbias = p.f32();
    }
    if (c.residual) a.residual = like_x(p.next()), a.dresidual = like_x(p.next());
    a.save_mean = p.f32(), a.save_rstd = p.f32();
    a.activation = to_activation(c.activation);
    a.device = device;
    add(normjit::backward_keys(a));
  }
}

// fn(i) for i in [0, n), `jobs` threads at a time.
template <typename Fn>
void parallel_for(int n, int jobs, Fn fn) {
  if (jobs <= 0) jobs = int(std::max(1u, std::thread::hardware_concurrency()));
  jobs = std::min(jobs, std::max(1, n));
  std::atomic<int> next{0};
  auto worker = [&] {
    for (int i = next++; i < n; i = next++) fn(i);
  };
  std::vector<std::thread> threads;
  for (int t = 1; t < jobs; ++t) threads.emplace_back(worker);
  worker();
  for (auto& t : threads) t.join();
}

// The distinct kernels, not compiled (from_disk: already loaded on the device).
normjit::tools::WarmupSummary distinct(const std::vector<std::pair<normjit::FusionKey, normjit::KernelConfig>>& kernels,
                                       int device) {
  normjit::tools::WarmupSummary s;
  for (const auto& [f, c] : kernels) {
    const bool dup = std::any_of(s.results.begin(), s.results.end(), [&](const auto& k) {
      return normjit::bytes_equal(k.fusion, f) && normjit::bytes_equal(k.config, c);
    });
    if (dup) continue;
    normjit::tools::WarmupKernel k;
    k.fusion = f, k.config = c, k.name = normjit::kernel_name(f, c);
    k.from_disk = normjit::kernel_loaded(f, c, device);
    s.results.push_back(std::move(k));
  }
  return s;
}

py::dict warmup_calls(const py::list& calls, std::optional<int> device, int jobs,
                      std::optional<std::string> profile_name) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  // The heuristics depend on the GPU: use the live profile the runtime itself uses when there is
  // one, else a built-in profile (compile-only warm-up, e.g. filling a disk cache on a build host).
  const normjit::DeviceProfile profile = device ? normjit::device_state(*device).profile
                                                : normjit::builtin_profile(profile_name.value_or("H200"));

  std::vector<std::pair<normjit::FusionKey, normjit::KernelConfig>> kernels;
  for (size_t i = 0; i < calls.size(); ++i) {
    try {
      call_kernels(parse_call(calls[i].cast<py::dict>()), device.value_or(0), profile, kernels);
    } catch (const normjit::Error& e) {
      throw py::value_error("normjit.warmup_calls: call " + std::to_string(i) + ": " + e.what());
    }
  }

  normjit::tools::WarmupSummary s;
  {
    py::gil_scoped_release no_gil;  // NVRTC and module loads take seconds: let Python threads run
    // Without a disk cache, compiling first and loading after would compile twice: get_kernel
    // then does both (a kernel already loaded in this process counts as not compiled).
    const bool compile_first = !device || normjit::compile::DiskCache::global().enabled();
    s = compile_first ? normjit::tools::warmup_kernels(kernels, profile.arch, jobs, /*progress=*/false)
                      : distinct(kernels, *device);
    if (device) {
      // Load into the device's context (L2) so that the first call pays no module load either.
      parallel_for(int(s.results.size()), jobs, [&](int i) {
        auto& k = s.results[size_t(i)];
        if (!k.error.empty()) return;
        try {
          normjit::get_kernel(k.fusion, k.config, *device);
        } catch (const std::exception& e) {
          k.error = e.what();
        }
      });
    }
  }

  py::dict r;
  py::list names, errors;
  int compiled = 0, from_disk = 0, failed = 0;
  for (const auto& k : s.results) {
    names.append(k.name);
    if (!k.error.empty())
      ++failed, errors.append(py::make_tuple(k.name, k.error));
    else
      ++(k.from_disk ? from_disk : compiled);
  }
  r["kernels"] = int(s.results.size());
  r["compiled"] = compiled;
  r["from_disk"] = from_disk;
  r["failed"] = failed;
  r["errors"] = errors;  // (kernel name, NVRTC log or load error)
  r["loaded"] = bool(device);
  r["seconds"] = std::chrono::duration<double>(Clock::now() - start).count();
  r["profile"] = profile.name;
  r["arch"] = profile.arch;
  r["names"] = names;
  return r;
}

}  // namespace

void register_warmup(py::module_& m) {
  m.def("warmup_calls", &warmup_calls, py::arg("calls"), py::arg("device") = py::none(),
        py::arg("jobs") = 0, py::arg("profile") = py::none(),
        R"(Compile (and with a device, load) the kernels of a list of instance-norm calls.

Each call is a dict: sizes (N, C, *spatial), strides (optional, elements; default contiguous),
offset (optional, x's storage offset), dtype ('float32' | 'float16' | 'bfloat16'), weight_dtype
(None: not affine), residual, activation (0..7), use_input_stats, running (running statistics
given), fwd, bwd (only a training call, use_input_stats, has a backward kernel).
device: a CUDA ordinal: the kernels are chosen with that GPU's live profile, compiled through the
disk cache and loaded; None: chosen with the built-in profile `profile` (default 'H200') and only
compiled into the disk cache. jobs: parallel compiles (0: one per hardware thread).
Returns {kernels, compiled, from_disk, failed, errors, loaded, seconds, profile, arch, names}:
compiled counts the NVRTC compiles, from_disk the kernels that needed none (in the disk cache, or
already loaded), errors lists (kernel name, NVRTC log or load error); failures do not raise.)");

  m.def(
      "nvrtc_available",
      []() -> py::tuple {
        std::string why;
        const normjit::driver::Nvrtc* lib = normjit::driver::try_nvrtc(&why);
        if (!lib) return py::make_tuple(false, why);
        return py::make_tuple(true, lib->path + " (NVRTC " + std::to_string(lib->major) + "." +
                                        std::to_string(lib->minor) + ")");
      },
      "(available, detail): whether NVRTC loads here (no GPU needed); detail is the library "
      "loaded, or why none could be.");
}

}  // namespace normjit_torch
