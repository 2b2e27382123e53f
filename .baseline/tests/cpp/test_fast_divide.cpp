// nj_divide (kernels/params.h): the multiply-high division the kernels use to split unit indices.
// The same inline function runs here and in the kernels, so checking it on the host checks theirs.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/params.h"

namespace {

// Every n the kernels can pass (0 <= n < 2^31), sampled: the edges of each quotient step near
// both ends of the range, and random values.
std::vector<uint32_t> dividends(uint32_t d, std::mt19937& rng) {
  std::vector<uint32_t> n = {0, 1, 2, 0x7ffffffeu, 0x7fffffffu};
  const uint32_t top = 0x7fffffffu;
  for (uint32_t q : {1u, 2u, 3u, 1000u, top / d - 1, top / d}) {
    const uint64_t at = uint64_t(q) * d;
    for (int64_t delta = -2; delta <= 2; ++delta) {
      const int64_t v = int64_t(at) + delta;
      if (v >= 0 && v <= top) n.push_back(uint32_t(v));
    }
  }
  std::uniform_int_distribution<uint32_t> any(0, top);
  for (int i = 0; i < 200; ++i) n.push_back(any(rng));
  return n;
}

void expect_exact(uint32_t d, std::mt19937& rng) {
  const NjDivisor by = nj_divisor(d);
  for (uint32_t n : dividends(d, rng)) ASSERT_EQ(nj_divide(n, by), n / d) << n << " / " << d;
}

TEST(FastDivide, ExactForSmallDivisors) {
  std::mt19937 rng(1);
  for (uint32_t d = 1; d <= 4096; ++d) expect_exact(d, rng);
}

TEST(FastDivide, ExactForPowersOfTwoAndTheirNeighbours) {
  std::mt19937 rng(2);
  for (int s = 1; s < 31; ++s)
    for (int64_t delta = -1; delta <= 1; ++delta) expect_exact(uint32_t((int64_t(1) << s) + delta), rng);
}

TEST(FastDivide, ExactForLargeRandomDivisors) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint32_t> any(1, 0x7fffffffu);
  for (int i = 0; i < 2000; ++i) expect_exact(any(rng), rng);
  expect_exact(0x7fffffffu, rng);
}

TEST(FastDivide, DivisorsOutOfRangeAreMarkedUnusable) {
  // The kernels divide by hardware on 64-bit index builds; nj_divisor says so with a zero multiplier.
  for (int64_t d : {int64_t(0), int64_t(-3), int64_t(1) << 31, int64_t(1) << 40}) {
    const NjDivisor by = nj_divisor(d);
    EXPECT_EQ(by.mul, 0u) << d;
    EXPECT_EQ(by.shift, 0u) << d;
  }
  EXPECT_EQ(nj_divisor(1).mul, 1u);  // in range: never zero
}

}  // namespace
