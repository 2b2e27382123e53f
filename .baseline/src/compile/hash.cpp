// A small 128-bit non-cryptographic hash (our own design): two 64-bit lanes, each absorbing 16-byte
// blocks through a 64x64->128 bit multiply folded to 64 bits, with different constants and a
// different pairing of the block's words so that the lanes fail independently. Good enough to name
// cache files and to detect corrupted bytes; not meant to resist an adversary (the disk cache
// compares the full key anyway).
#include "compile/hash.h"

#include <cstring>

namespace normjit::compile {
namespace {

// Odd constants with well-spread bits (fractional parts of irrational numbers and primes).
constexpr uint64_t kK0 = 0x9e3779b97f4a7c15ull;
constexpr uint64_t kK1 = 0xc2b2ae3d27d4eb4full;
constexpr uint64_t kK2 = 0x165667b19e3779f9ull;
constexpr uint64_t kK3 = 0xd6e8feb86659fd93ull;
constexpr uint64_t kK4 = 0xa0761d6478bd642full;
constexpr uint64_t kK5 = 0x8ebc6af09c88c6e3ull;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// Full 128-bit product of a and b, high and low halves xor-ed: every input bit influences many
// output bits, at the cost of one multiply.
inline uint64_t fold_mul(uint64_t a, uint64_t b) {
  const unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  return static_cast<uint64_t>(p) ^ static_cast<uint64_t>(p >> 64);
}

// Bijective avalanche step for the final value of each lane.
inline uint64_t finalize(uint64_t x) {
  x ^= x >> 31;
  x *= kK3;
  x ^= x >> 29;
  x *= kK1;
  x ^= x >> 32;
  return x;
}

// Reads 8 bytes in little-endian order regardless of alignment. Cache files are shared between
// processes of one machine only, but a fixed byte order keeps hex names stable everywhere.
inline uint64_t load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}

// Up to 8 trailing bytes, zero padded; the total length is mixed into the seeds so that
// zero-padding cannot make two different inputs collide.
inline uint64_t load_partial(const unsigned char* p, size_t n) {
  unsigned char buf[8] = {};
  std::memcpy(buf, p, n);
  return load64(buf);
}

struct Lanes {
  uint64_t a, b;

  void absorb(uint64_t w0, uint64_t w1) {
    // Lane a multiplies (w0, w1), lane b multiplies (w1, w0) with other constants, so a block that
    // zeroes one lane's product (w1 == kK1 for lane a) still changes the other lane.
    a = rotl(a ^ fold_mul(w0 ^ kK0 ^ a, w1 ^ kK1), 23) * kK2 + w1;
    b = rotl(b + fold_mul(w1 ^ kK4 ^ b, w0 ^ kK5), 37) * kK3 ^ w0;
  }
};

}  // namespace

Hash128 hash128(const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  Lanes s{kK0 ^ (static_cast<uint64_t>(size) * kK2), kK4 + static_cast<uint64_t>(size) * kK1};

  size_t n = size;
  for (; n >= 16; n -= 16, p += 16) s.absorb(load64(p), load64(p + 8));
  if (n > 0) {
    const uint64_t w0 = n >= 8 ? load64(p) : load_partial(p, n);
    const uint64_t w1 = n > 8 ? load_partial(p + 8, n - 8) : 0;
    s.absorb(w0, w1);
  }

  // Cross the lanes so that each output word depends on both, then avalanche.
  const uint64_t x = fold_mul(s.a ^ kK1, s.b ^ kK4);
  const uint64_t y = fold_mul(s.b ^ kK5, rotl(s.a, 17) ^ kK0);
  return Hash128{finalize(s.a ^ x), finalize(s.b + y)};
}

std::string Hash128::hex() const {
  static const char digits[] = "0123456789abcdef";
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) {
    out[15 - i] = digits[(hi >> (4 * i)) & 0xf];
    out[31 - i] = digits[(lo >> (4 * i)) & 0xf];
  }
  return out;
}

}  // namespace normjit::compile
