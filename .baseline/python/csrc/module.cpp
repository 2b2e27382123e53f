// The Python module normjit._C: availability, cache statistics and the autotune switch of the core
// library.
// Importing it registers the normjit::instance_norm_fwd/bwd operators (ops.cpp, autograd.cpp).
// Import torch before this module (normjit/_ops.py does): it resolves against torch's libraries.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/version.h>

#include <normjit/normjit.h>

#include <string>

#include "ops.h"
#include "runtime/prefetch.h"

namespace py = pybind11;

namespace normjit_torch {
void register_warmup(py::module_& m);  // warmup_calls, nvrtc_available (warmup.cpp)
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "normjit: run-time generated CUDA kernels for instance normalization (torch binding)";

  m.def(
      "is_available",
      []() -> py::tuple {
#ifndef NORMJIT_TORCH_CUDA
        return py::make_tuple(false, std::string("normjit was built against a torch without CUDA"));
#else
        normjit::Availability a;
        try {
          a = normjit::availability();
        } catch (const std::exception& e) {
          return py::make_tuple(false, std::string(e.what()));
        }
        return py::make_tuple(a.available, a.reason);
#endif
      },
      "(available, reason): whether normjit kernels can run here, and if not, why.");

  m.def(
      "cache_info",
      []() {
        const normjit::CacheStats s = normjit::cache_stats();
        py::dict d;
        d["plan_hits"] = s.plan_hits;
        d["plan_misses"] = s.plan_misses;
        d["kernel_hits"] = s.kernel_hits;
        d["kernel_misses"] = s.kernel_misses;
        d["disk_hits"] = s.disk_hits;
        d["disk_misses"] = s.disk_misses;
        d["disk_writes"] = s.disk_writes;
        d["disk_errors"] = s.disk_errors;
        d["compiles"] = s.compiles;
        d["autotune_searches"] = s.autotune_searches;
        d["autotune_records_loaded"] = s.autotune_records_loaded;
        d["compile_ms_total"] = s.compile_ms_total;
        d["compile_ms"] = s.compile_ms;  // list of (kernel name, NVRTC milliseconds)
        d["layout_copies"] =
            normjit_torch::layout_copies.load(std::memory_order_relaxed);
        return d;
      },
      "Cache counters of the core library plus the binding's layout_copies counter.");

  m.def(
      "reset_cache_stats",
      []() {
        normjit::reset_cache_stats();
        normjit_torch::layout_copies.store(0, std::memory_order_relaxed);
      },
      "Reset all counters reported by cache_info().");

  m.def("clear_memory_caches", &normjit::clear_memory_caches,
        "Drop the in-memory plan and kernel caches (the disk cache is untouched).");

  m.def("version", &normjit::version, "Version of the normjit core library.");

  m.def("enable_prefetch", [] { normjit::set_prefetch_default(true); },
        "Compile training forwards' backward kernels in the background (unless NORMJIT_PREFETCH says "
        "otherwise); normjit/_ops.py calls it after registering prefetch_shutdown at exit.");
  m.def(
      "prefetch_shutdown",
      [] {
        py::gil_scoped_release no_gil;  // waits for the background compiles in progress
        normjit::prefetch_shutdown();
      },
      "Stop the background compile threads (normjit/_ops.py calls it at interpreter exit).");

#if defined(TORCH_VERSION_MAJOR) && defined(TORCH_VERSION_MINOR)
  // The torch this module was compiled against; normjit/_ops.py compares it with the running one.
  m.attr("torch_version") =
      std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR);
#endif

  // ---------------------------------------------------------------------------------------------
  // Lead: explain / warmup / autotune bindings go here.
  // ---------------------------------------------------------------------------------------------
  normjit_torch::register_warmup(m);

  m.def("set_autotune", &normjit::set_autotune, py::arg("enabled"),
        "Turn autotune on or off (normjit.autotune() documents it). Drops the in-memory launch plans "
        "when the setting changes.");
  m.def("autotune_enabled", &normjit::autotune_enabled,
        "Whether autotune is on (initially from NORMJIT_AUTOTUNE).");
}
