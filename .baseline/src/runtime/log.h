// NORMJIT_LOG=compile,recompile,plan,disk,autotune (comma-separated; "all" for everything) prints one line per
// event on stderr, prefixed "[normjit]". Parsed once.
#pragma once

#include <string>

namespace normjit::log {

enum Topic : unsigned { compile = 1, recompile = 2, plan = 4, disk = 8, autotune = 16 };
bool enabled(Topic t);
void line(Topic t, const std::string& text);
// Warnings are always printed.
void warn(const std::string& text);

}  // namespace normjit::log
