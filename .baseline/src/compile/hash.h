// Non-cryptographic 128-bit hashing for cache keys and checksums. The disk cache stores the full
// key next to the binary and compares it on load, so a hash collision can never serve a wrong
// binary; the hash only names files and detects corruption.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace normjit::compile {

struct Hash128 {
  uint64_t lo = 0, hi = 0;
  bool operator==(const Hash128&) const = default;
  std::string hex() const;  // 32 lowercase hex digits
};

Hash128 hash128(const void* data, size_t size);
inline Hash128 hash128(std::string_view s) { return hash128(s.data(), s.size()); }

}  // namespace normjit::compile
