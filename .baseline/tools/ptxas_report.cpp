#include "ptxas_report.h"

#include <algorithm>
#include <cstdlib>

namespace normjit::tools {
namespace {

// The integer just before `suffix` (e.g. "128" in "128 bytes stack frame"), or -1.
int number_before(const std::string& log, const std::string& suffix) {
  const size_t at = log.find(suffix);
  if (at == std::string::npos) return -1;
  size_t begin = at;
  while (begin > 0 && log[begin - 1] >= '0' && log[begin - 1] <= '9') --begin;
  return begin == at ? -1 : std::atoi(log.c_str() + begin);
}

}  // namespace

PtxasReport parse_ptxas_report(const std::string& log) {
  PtxasReport r;
  const size_t used = log.find("Used ");
  if (used == std::string::npos) return r;
  r.found = true;
  r.registers = std::atoi(log.c_str() + used + 5);
  r.spill_store_bytes = std::max(0, number_before(log, " bytes spill stores"));
  r.stack_frame_bytes = std::max(0, number_before(log, " bytes stack frame"));
  return r;
}

}  // namespace normjit::tools
