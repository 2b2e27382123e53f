// (fusion, kernel config) -> complete CUDA source: the template's switches as #defines, followed by
// the template with its #includes expanded, so the source alone determines the binary (and the
// disk-cache key covers everything).
#pragma once

#include <string>

#include "runtime/keys.h"

namespace normjit::codegen {

struct KernelSource {
  std::string name;         // stable kernel name (keys.h kernel_name)
  std::string entry;        // the __global__ function to look up in the module
  std::string source;
};

KernelSource generate(const FusionKey& f, const KernelConfig& c);

// The __global__ function generate(f, c) defines, for any config: the name to look up in a
// loaded module without generating (expanding and formatting) the whole source again.
const char* entry_point(const FusionKey& f);

// The text of an embedded template with its local #includes expanded (each file once).
std::string expand_template(const std::string& file);

}  // namespace normjit::codegen
