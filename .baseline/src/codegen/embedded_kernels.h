// The kernel templates of kernels/, embedded at build time by cmake/embed_kernels.cmake.
#pragma once

#include <string>
#include <vector>

namespace normjit::codegen {

struct EmbeddedFile {
  const char* name;  // file name, e.g. "common.cuh"
  const char* text;
};
const std::vector<EmbeddedFile>& embedded_kernel_files();

}  // namespace normjit::codegen
