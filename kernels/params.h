// The argument block of every normjit kernel, shared verbatim by the host (runtime/) and the
// generated device code, so both sides agree on the layout by construction. Plain C types only:
// this file is compiled by the host compiler and by NVRTC (which sees no system headers).
#pragma once

#ifndef NJ_DEVICE_CODE
#include <cstdint>
typedef int64_t nj_i64;
#else
typedef long long nj_i64;
#endif

// Division by a run-time constant as a multiply-high, add and shift (Granlund and Montgomery's
// round-up method): the kernels split a unit index into (instance, chunk) and an instance into
// (n, c) every pipeline step, and a hardware-less integer division costs ~25 dependent
// instructions on the step's chain. Exact for every n < 2^31 and 1 <= d < 2^31; nj_divisor() on
// the host builds it, nj_divide() is the same expression on both sides (tests/cpp checks it).
struct NjDivisor {
  unsigned mul;
  unsigned shift;
};
#ifdef NJ_DEVICE_CODE
__device__ __forceinline__
#else
inline
#endif
unsigned nj_divide(unsigned n, NjDivisor d) {
  const unsigned high = (unsigned)(((unsigned long long)n * d.mul) >> 32);
  return (high + n) >> d.shift;  // high <= n < 2^31: no overflow
}
#ifndef NJ_DEVICE_CODE
// d in [1, 2^31); anything else gives a divisor that nj_divide must not be used with (the kernels
// then divide by hardware: 64-bit index builds).
inline NjDivisor nj_divisor(int64_t d) {
  if (d < 1 || d >= (int64_t(1) << 31)) return {0u, 0u};
  unsigned shift = 0;
  while ((int64_t(1) << shift) < d) ++shift;  // ceil(log2 d)
  const uint64_t mul = ((uint64_t(1) << 32) * ((uint64_t(1) << shift) - uint64_t(d))) / uint64_t(d) + 1;
  return {unsigned(mul), shift};
}
#endif

// The most CTAs one thread-block cluster holds on every cluster-capable GPU (the portable size;
// more needs cudaFuncAttributeNonPortableClusterSizeAllowed). The channels-last backward's
// cluster of samples sizes rank 0's inbox by it; the heuristics never plan a larger cluster.
#define NJ_MAX_CLUSTER_RANKS 8

struct NjParams {
  // Tensors. x/y/residual/dy/dx share one layout; see the stride fields below.
  const void* x;
  void* y;                 // forward output, or dx in the backward
  const void* dy;          // backward only
  const void* residual;    // forward: added before the activation
  void* dresidual;         // backward: gradient of the residual
  const void* weight;      // C elements, or null
  const void* bias;        // C elements, or null
  float* save_mean;        // N*C, written in training forward, read in backward
  float* save_rstd;        // N*C
  float* running_mean;     // C, updated in training forward / read in eval
  float* running_var;      // C
  float* dweight;          // C, backward
  float* dbias;            // C, backward

  // Cross-CTA workspace (see runtime/sync_workspace.h): counters that every launch leaves at zero,
  // per-chunk partial results, and per-instance scratch.
  unsigned* counters;      // 2 per instance + 1 global
  float* partials;         // instances * chunks * 2
  float* scratch;          // instances * 2 (per-instance sums for dweight/dbias or biased var)
  // The resident split's exchange (kernels/resident_split.cuh): word 0 the launch generation,
  // then 2 tagged words per chunk; exchange_words is the region's whole size.
  unsigned long long* exchange;
  nj_i64 exchange_words;

  // Shape. An instance is (n, c); element s of instance (n, c) is at
  //   n * stride_n + c * stride_c + s * stride_s      (s in [0, spatial))
  // NCDHW: stride_s = 1, stride_c = spatial. NDHWC: stride_s = C, stride_c = 1.
  nj_i64 N, C, spatial;
  nj_i64 stride_n, stride_c, stride_s;

  // Work decomposition chosen by the heuristics (runtime values; the kernel's compile-time
  // configuration only bounds them).
  int chunks;              // CTAs cooperating on one instance (1 = no cross-CTA exchange)
  int chunk_vectors;       // vectors each chunk covers (the last may cover fewer)
  NjDivisor by_chunks, by_n, by_c;  // nj_divisor(chunks), (N), (C): see nj_divide

  float eps;
  float momentum;
  float act_param;         // leaky_relu slope
  float inv_spatial;       // 1 / spatial
  int reverse_output;      // streamed NDHWC kernels: the output pass walks each chunk backwards
  int channel_major;       // backward: CTAs write dweight/dbias themselves, no last CTA's pass. NCDHW:
                           // units walk (c, n), n fastest (make_unit); NDHWC: N = 1, or with N > 1
                           // a cluster per channel tile, a CTA per sample (cluster_weight_grads)
  int early_refill;        // resident split: phase C refills its slot as soon as it has read it
  int l2_prefetch_vectors; // streamed NCDHW split (sm_90): vectors of its next chunk a CTA asks L2
                           // for before it waits at the exchange (tile_ring.cuh); 0 = none
};
