#include "runtime/log.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>

namespace normjit::log {
namespace {

unsigned parse(const char* v) {
  if (!v) return 0;
  unsigned mask = 0;
  std::stringstream in(v);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item == "compile") mask |= compile;
    else if (item == "recompile") mask |= recompile;
    else if (item == "plan") mask |= plan;
    else if (item == "disk") mask |= disk;
    else if (item == "autotune") mask |= autotune;
    else if (item == "all") mask |= ~0u;
  }
  return mask;
}

unsigned mask() {
  static const unsigned m = parse(std::getenv("NORMJIT_LOG"));
  return m;
}

std::mutex& io_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

bool enabled(Topic t) { return (mask() & t) != 0; }

void line(Topic t, const std::string& text) {
  if (!enabled(t)) return;
  std::lock_guard<std::mutex> lock(io_mutex());
  std::fprintf(stderr, "[normjit] %s\n", text.c_str());
}

void warn(const std::string& text) {
  std::lock_guard<std::mutex> lock(io_mutex());
  std::fprintf(stderr, "[normjit] warning: %s\n", text.c_str());
}

}  // namespace normjit::log
