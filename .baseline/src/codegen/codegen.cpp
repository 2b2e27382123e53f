#include "codegen/codegen.h"

#include <set>
#include <sstream>

#include "codegen/embedded_kernels.h"

namespace normjit::codegen {
namespace {

const char* find_file(const std::string& name) {
  for (const EmbeddedFile& f : embedded_kernel_files())
    if (name == f.name) return f.text;
  throw Error("internal: kernel template '" + name + "' is not embedded in this build");
}

// Expands `#include "x"` lines recursively; `#pragma once` files are emitted once.
void expand(const std::string& name, std::set<std::string>& seen, std::ostringstream& out) {
  if (!seen.insert(name).second) return;
  std::istringstream in(find_file(name));
  std::string line;
  while (std::getline(in, line)) {
    const auto first = line.find_first_not_of(" \t");
    if (first != std::string::npos && line.compare(first, 10, "#include \"") == 0) {
      const auto open = line.find('"', first);
      const auto close = line.find('"', open + 1);
      expand(line.substr(open + 1, close - open - 1), seen, out);
      continue;
    }
    if (first != std::string::npos && line.compare(first, 12, "#pragma once") == 0) continue;
    out << line << '\n';
  }
}

}  // namespace

std::string expand_template(const std::string& file) {
  std::set<std::string> seen;
  std::ostringstream out;
  expand(file, seen, out);
  return out.str();
}

const char* entry_point(const FusionKey& f) {
  const bool fwd = f.direction == Direction::forward;
  if (f.layout == Layout::ndhwc)
    return fwd ? "normjit_instance_norm_nhwc_forward" : "normjit_instance_norm_nhwc_backward";
  return fwd ? "normjit_instance_norm_forward" : "normjit_instance_norm_backward";
}

KernelSource generate(const FusionKey& f, const KernelConfig& c) {
  KernelSource k;
  k.name = kernel_name(f, c);
  const bool nhwc = f.layout == Layout::ndhwc;
  const bool fwd = f.direction == Direction::forward;
  const char* file = nhwc ? "instance_norm_nhwc.cuh" : fwd ? "instance_norm_forward.cuh" : "instance_norm_backward.cuh";
  k.entry = entry_point(f);

  std::ostringstream s;
  s << "// normjit generated kernel " << k.name << "\n"
    << "// fusion: " << describe(f) << "\n// config: " << describe(c) << "\n";
  auto def = [&](const char* name, long v) { s << "#define " << name << " " << v << "\n"; };
  def("NJ_DTYPE", long(f.dtype));
  def("NJ_WDTYPE", long(f.weight_dtype));
  def("NJ_BACKWARD", fwd ? 0 : 1);
  def("NJ_TRAIN", f.train);
  def("NJ_AFFINE", f.affine);
  def("NJ_RESIDUAL", f.residual);
  def("NJ_RUNNING", f.running);
  def("NJ_SAVE", f.save);
  def("NJ_ACT", long(f.activation));
  def("NJ_THREADS", c.threads);
  def("NJ_GROUP", c.group);
  def("NJ_ITEMS", c.items);
  def("NJ_VEC", c.vec);
  def("NJ_MIN_BLOCKS", c.min_blocks);
  def("NJ_CACHED", c.cached);
  def("NJ_INDEX64", c.index64);
  def("NJ_STAGES", c.stages);
  def("NJ_RESIDENT", c.resident);
  def("NJ_FLAT", c.flat);
  def("NJ_CLUSTER", c.cluster);
  s << expand_template(file);
  k.source = s.str();
  return k;
}

}  // namespace normjit::codegen
