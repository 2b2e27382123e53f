// Shared device code of every normjit kernel: storage types and conversions, vector loads, group
// reductions, activations and the cross-CTA exchange. Self-contained on purpose: NVRTC compiles it
// with no toolkit header, so nothing at run time needs CUDA_HOME.
//
// The generated source defines these macros before including this file (see codegen/codegen.cpp):
//   NJ_DTYPE, NJ_WDTYPE     0 = fp32, 1 = fp16, 2 = bf16 (input/output; weight and bias)
//   NJ_VEC                  elements per vector access (16 bytes when alignment allows)
//   NJ_THREADS, NJ_GROUP    CTA size; threads cooperating on one instance (<= 32, or == NJ_THREADS)
//   NJ_ITEMS                vectors each thread holds in registers per tile
//   NJ_INDEX64              64-bit element offsets
//   NJ_ACT                  activation (codes of normjit::Activation)
//   NJ_MIN_BLOCKS           CTAs per SM the register budget must allow (caps registers, so the
//                           heuristics know how many CTAs are co-resident without a GPU)
#pragma once

#define NJ_DEVICE_CODE 1
#include "params.h"

typedef unsigned short nj_u16;
typedef unsigned int nj_u32;
#if NJ_INDEX64
typedef long long idx_t;
#else
typedef int idx_t;
#endif

// ---------------------------------------------------------------- storage types and conversions
struct nj_half { nj_u16 bits; };
struct nj_bf16 { nj_u16 bits; };

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(nj_half v) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
  return f;
}
__device__ __forceinline__ float to_float(nj_bf16 v) { return __uint_as_float(((nj_u32)v.bits) << 16); }

template <typename T> __device__ __forceinline__ T from_float(float f);
template <> __device__ __forceinline__ float from_float<float>(float f) { return f; }
template <> __device__ __forceinline__ nj_half from_float<nj_half>(float f) {
  nj_half h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}
template <> __device__ __forceinline__ nj_bf16 from_float<nj_bf16>(float f) {
  nj_bf16 h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}

#if NJ_DTYPE == 0
typedef float data_t;
#elif NJ_DTYPE == 1
typedef nj_half data_t;
#else
typedef nj_bf16 data_t;
#endif
#if NJ_WDTYPE == 0
typedef float weight_t;
#elif NJ_WDTYPE == 1
typedef nj_half weight_t;
#else
typedef nj_bf16 weight_t;
#endif

// NJ_VEC elements accessed as one aligned load/store (LDG.128 for 16 bytes), read and written one
// element at a time through vec_get / vec_set. 16-bit elements are kept two to a 32-bit word and
// converted at each use: held as an array of 16-bit values, ptxas gave each element a register of
// its own, so a thread's tile took twice the registers and the largest cached tier spilled (a CTA
// of 512 with 8 vectors a thread: `bench/spill_survey.sh`, docs/PERF_NOTES.md, session 12).
#ifndef NJ_PACKED  // a template may choose (instance_norm_nhwc.cuh)
#define NJ_PACKED (NJ_DTYPE != 0 && NJ_VEC % 2 == 0)
#endif
#if NJ_PACKED
struct __align__(sizeof(data_t) * NJ_VEC) vec_t { nj_u32 w[NJ_VEC / 2]; };
#else
struct __align__(sizeof(data_t) * NJ_VEC) vec_t { data_t v[NJ_VEC]; };
#endif

// Element k of a vector, as a float.
__device__ __forceinline__ float vec_get(const vec_t& x, int k) {
#if NJ_PACKED
  const nj_u32 w = x.w[k / 2];
#if NJ_DTYPE == 2  // bf16: the high 16 bits of a float
  return __uint_as_float((k & 1) ? (w & 0xffff0000u) : (w << 16));
#else              // fp16
  float f;
  if (k & 1)
    asm("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, hi; }" : "=f"(f) : "r"(w));
  else
    asm("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, lo; }" : "=f"(f) : "r"(w));
  return f;
#endif
#else
  return to_float(x.v[k]);
#endif
}
// Element k of a vector, from a float (rounded to the element type).
__device__ __forceinline__ void vec_set(vec_t& x, int k, float f) {
#if NJ_PACKED
  const nj_u32 bits = from_float<data_t>(f).bits;
  x.w[k / 2] = (k & 1) ? ((x.w[k / 2] & 0xffffu) | (bits << 16)) : ((x.w[k / 2] & 0xffff0000u) | bits);
#else
  x.v[k] = from_float<data_t>(f);
#endif
}

__device__ __forceinline__ vec_t load_vec(const void* base, idx_t elem) {
  return *reinterpret_cast<const vec_t*>(reinterpret_cast<const data_t*>(base) + elem);
}
__device__ __forceinline__ void store_vec(void* base, idx_t elem, const vec_t& v) {
  *reinterpret_cast<vec_t*>(reinterpret_cast<data_t*>(base) + elem) = v;
}
__device__ __forceinline__ vec_t zero_vec() {
  vec_t v;
#pragma unroll
  for (int k = 0; k < NJ_VEC; ++k) vec_set(v, k, 0.f);
  return v;
}
__device__ __forceinline__ float load_weight(const void* p, idx_t c) {
  return to_float(reinterpret_cast<const weight_t*>(p)[c]);
}

// ---------------------------------------------------------------- activations
// The forward value act(z) and, for the backward, d act / dz. Adding one: a case here and an
// enum value in include/normjit/normjit.h.
__device__ __forceinline__ float nj_sigmoid(float z) { return 1.f / (1.f + __expf(-z)); }

__device__ __forceinline__ float activate(float z, float param) {
#if NJ_ACT == 0
  return z;
#elif NJ_ACT == 1
  return z > 0.f ? z : (z == z ? 0.f : z);  // relu; NaN propagates as in torch
#elif NJ_ACT == 2
  return z >= 0.f ? z : z * param;         // leaky_relu
#elif NJ_ACT == 3
  return 0.5f * z * (1.f + erff(z * 0.70710678118654752f));  // gelu (erf)
#elif NJ_ACT == 4
  return 0.5f * z * (1.f + tanhf(0.79788456080286536f * (z + 0.044715f * z * z * z)));  // gelu tanh
#elif NJ_ACT == 5
  return z * nj_sigmoid(z);                // silu
#elif NJ_ACT == 6
  return nj_sigmoid(z);                    // sigmoid
#else
  return tanhf(z);                         // tanh
#endif
}

__device__ __forceinline__ float activate_grad(float z, float param) {
#if NJ_ACT == 0
  return 1.f;
#elif NJ_ACT == 1
  return z > 0.f ? 1.f : 0.f;
#elif NJ_ACT == 2
  return z > 0.f ? 1.f : param;
#elif NJ_ACT == 3
  const float cdf = 0.5f * (1.f + erff(z * 0.70710678118654752f));
  const float pdf = 0.39894228040143268f * __expf(-0.5f * z * z);
  return cdf + z * pdf;
#elif NJ_ACT == 4
  const float k = 0.79788456080286536f;
  const float inner = k * (z + 0.044715f * z * z * z);
  const float t = tanhf(inner);
  return 0.5f * (1.f + t) + 0.5f * z * (1.f - t * t) * k * (1.f + 3.f * 0.044715f * z * z);
#elif NJ_ACT == 5
  const float s = nj_sigmoid(z);
  return s * (1.f + z * (1.f - s));
#elif NJ_ACT == 6
  const float s = nj_sigmoid(z);
  return s * (1.f - s);
#else
  const float t = tanhf(z);
  return 1.f - t * t;
#endif
}

// ---------------------------------------------------------------- group reductions
// All threads of a group get the same sum, combined in a fixed order (deterministic bits).
// Groups of <= 32 threads reduce with shuffles inside their warp; a group of the whole CTA goes
// through shared memory. Every thread of the CTA must call these the same number of times.
#define NJ_WARPS (NJ_THREADS / 32)

__device__ __forceinline__ float warp_sum(float v, int width) {
  for (int offset = width / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset, width);
  return v;
}

template <int K>
__device__ __forceinline__ void group_sum(float (&v)[K], float* smem /* K * NJ_WARPS floats */) {
#if NJ_GROUP <= 32
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = warp_sum(v[k], NJ_GROUP);
#else
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    v[k] = warp_sum(v[k], 32);
    if (lane == 0) smem[k * NJ_WARPS + warp] = v[k];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < K; ++k) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < NJ_WARPS; ++w) s += smem[k * NJ_WARPS + w];
    v[k] = s;
  }
  __syncthreads();  // smem is reused by the next reduction
#endif
}

// ---------------------------------------------------------------- cross-CTA exchange
// The `chunks` CTAs of one instance publish a partial result each, wait for each other, and read
// all partials back in chunk order, so every CTA computes bit-identical statistics. The host makes
// all CTAs of a launch co-resident (cooperative launch) and the grid a multiple of `chunks`, so
// the peers of an instance always run at the same time. Counters return to zero on exit: the last
// CTA to leave an instance resets them, which keeps the workspace valid for the next launch and
// for CUDA-graph replays.
// The arrival is a release (it orders every write that happens before it, including the other
// threads' writes ordered by a preceding __syncthreads, before the count) and the poll an
// acquire (reads after it see what the peers wrote before their arrivals): the pattern of a
// GPU-scope semaphore. Two __threadfence() around a relaxed atomic did the same at about
// 0.9-1.7 us a round trip (docs/PERF_NOTES.md, 000).
__device__ __forceinline__ void add_release(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// One thread publishes its chunk's partial pair (a, b) and spins until all `chunks` peers of the
// instance have published theirs; after it returns, the partials may be read (with __ldcg).
__device__ __forceinline__ void exchange_arrive_and_wait(unsigned* counters, idx_t instance, int chunks) {
  add_release(counters + 2 * instance, 1u);
  while (load_acquire(counters + 2 * instance) < (unsigned)chunks) __nanosleep(20);
}
__device__ __forceinline__ void exchange_publish_and_wait(unsigned* counters, idx_t instance, float* partials,
                                                          idx_t slot, float a, float b, int chunks) {
  __stcg(partials + 2 * slot, a);
  __stcg(partials + 2 * slot + 1, b);
  exchange_arrive_and_wait(counters, instance, chunks);
}

// One thread, once its CTA has read every partial it needs: the last peer to leave resets the
// instance's counters. In two halves: exchange_leave_begin sends the departure and returns its
// ticket, exchange_leave_end (the same thread, after other work, e.g. the output pass) resets
// the counters when the ticket says this CTA left last, so that the atomic's round trip overlaps
// that work instead of stalling the thread's warp (kNoTicket: this thread sent none). Any time
// before the kernel ends will do: every peer had passed its wait when it left.
constexpr unsigned kNoTicket = 0xffffffffu;
__device__ __forceinline__ unsigned exchange_leave_begin(unsigned* counters, idx_t instance) {
  return atomicAdd(counters + 2 * instance + 1, 1u);
}
__device__ __forceinline__ void exchange_leave_end(unsigned* counters, idx_t instance, int chunks, unsigned ticket) {
  // The kNoTicket test first: where the ticket is that constant (a kernel that never splits) the
  // compiler drops the whole block.
  if (ticket != kNoTicket && ticket == (unsigned)chunks - 1) {
    counters[2 * instance] = 0;
    counters[2 * instance + 1] = 0;
    __threadfence();
  }
}

// Every thread of the CTA: thread 0 publishes the CTA's partial and waits for the peers; all
// threads may read the partials afterwards.
__device__ __forceinline__ void exchange_cta_publish_and_wait(unsigned* counters, idx_t instance, float* partials,
                                                              idx_t slot, float a, float b, int chunks) {
  if (threadIdx.x == 0) exchange_publish_and_wait(counters, instance, partials, slot, a, b, chunks);
  __syncthreads();
}

// Leaving the exchange for a CTA whose threads all read partials (every thread calls it): the
// barrier says every thread has read them; thread 0 gets the ticket for exchange_leave_end, the
// others kNoTicket.
__device__ __forceinline__ unsigned exchange_depart_begin(unsigned* counters, idx_t instance) {
  __syncthreads();
  return threadIdx.x == 0 ? exchange_leave_begin(counters, instance) : kNoTicket;
}

// The last CTA of the grid to call this returns true (after a fence that makes every other CTA's
// earlier writes visible to it); it must then call last_cta_done().
__device__ __forceinline__ bool last_cta_arrive(unsigned* global_counter, bool* flag_smem) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    *flag_smem = atomicAdd(global_counter, 1u) == gridDim.x - 1;
    if (*flag_smem) __threadfence();
  }
  __syncthreads();
  return *flag_smem;
}
__device__ __forceinline__ void last_cta_done(unsigned* global_counter) {
  __syncthreads();
  if (threadIdx.x == 0) *global_counter = 0;
}

// ---------------------------------------------------------------- statistics
// Chan et al.'s pairwise merge of (count, mean, M2) accumulators: numerically stable where
// sum/sum-of-squares is not (mean >> std).
//
// chan_merge_weighted takes the merge weight wb = n_b / (n_a + n_b) from the caller, so that
// accumulators sharing their counts (the channels of one NDHWC vector) pay one division between
// them: a full-precision division is a dozen instructions and a slow-path call, and with one per
// channel they cost the channels-last forward ~30 % of its NVRTC time (the gain of
// --prec-div=false, measured on a 2-core CPU).
__device__ __forceinline__ void chan_merge_weighted(float n_a, float wb, float& mean_a, float& m2_a, float mean_b,
                                                    float m2_b) {
  const float delta = mean_b - mean_a;
  mean_a += delta * wb;
  m2_a += m2_b + delta * delta * n_a * wb;
}
__device__ __forceinline__ void chan_merge(float& n_a, float& mean_a, float& m2_a, float n_b, float mean_b,
                                           float m2_b) {
  const float n = n_a + n_b;
  if (n_b == 0.f) return;
  chan_merge_weighted(n_a, n_b / n, mean_a, m2_a, mean_b, m2_b);
  n_a = n;
}

// The one-pass merge of chunks' (n_k, mean_k, M2_k) about a shift s, chunk 0's mean (the
// resident split and the channels-last split merge their chunks this way): with d_k = mean_k - s,
// S1 = sum n_k d_k and S2 = sum (M2_k + n_k d_k^2), mean = s + S1 / n and M2 = S2 - S1^2 / n. The
// shift keeps the cancellation bounded when mean >> std, where the plain sum of squares loses
// everything: n (mean - s)^2 <= (n / n_0) M2, so M2 loses at most ~log2(chunks) bits and
// typically none. One sum of the pair is half the chain of a mean sum and then an M2 sum.
__device__ __forceinline__ void shifted_add(float n_k, float mean_k, float m2_k, float shift, float& s1, float& s2) {
  const float d = mean_k - shift;
  s1 += n_k * d;
  s2 += m2_k + n_k * d * d;
}
__device__ __forceinline__ void shifted_result(float shift, float s1, float s2, float inv_n, float& mean, float& m2) {
  const float mean_d = s1 * inv_n;
  mean = shift + mean_d;
  m2 = s2 - s1 * mean_d;
  if (m2 < 0.f) m2 = 0.f;  // rounding; a NaN stays NaN
}

// Combines the threads' running (n, mean, M2) of one group into the group's (mean, M2) over
// `count` elements: the mean from the sum of n * mean, then M2 = sum(M2_t + n_t (mean_t - mean)^2).
// Two fixed-order group sums per chunk, instead of two per tile.
__device__ __forceinline__ void group_merge_stats(float n, float mean_t, float m2_t, float count, float* smem,
                                                  float& mean, float& m2) {
  float s[1] = {n * mean_t};
  group_sum<1>(s, smem);
  mean = count > 0.f ? s[0] / count : 0.f;
  const float d = mean_t - mean;
  float q[1] = {n > 0.f ? m2_t + n * d * d : 0.f};
  group_sum<1>(q, smem);
  m2 = q[0];
}

// v / d for an index v >= 0, d = the divisor `by` was built for (params.h's nj_divide: a multiply
// instead of a division on 32-bit index builds; 64-bit builds divide, they are rare).
__device__ __forceinline__ idx_t quotient(idx_t v, nj_i64 d, NjDivisor by) {
#if NJ_INDEX64
  (void)by;
  return v / (idx_t)d;
#else
  (void)d;
  return (idx_t)nj_divide((unsigned)v, by);
#endif
}

#if NJ_GROUP > 0  // (the flat channels-last kernels set their lanes at run time: NJ_GROUP 0)
// ---------------------------------------------------------------- work decomposition (NCDHW)
// A unit is one chunk of one instance. The grid's groups walk the units in rounds; every thread
// runs the same number of rounds (inactive groups carry empty ranges) so that warp shuffles and
// CTA barriers stay uniform.
#define NJ_GROUPS_PER_CTA (NJ_THREADS / NJ_GROUP)
// Whether the kernel may run as a split (chunks > 1) and so carries the exchange: a split's CTA
// is one group (heuristics ncdhw_split: group == threads; the host's launchable). The kernels of
// several instances a CTA (the small and tiny tiers of the deep stages) leave the exchange's code
// out, as the channels-last tiers do (NJ_NHWC_SPLITS): compiled in but never run, it cost the
// channels-last tiers up to 15 % (docs/PERF_NOTES.md, session 27).
#define NJ_NCDHW_SPLITS (NJ_GROUP == NJ_THREADS)

struct Unit {
  bool active;
  idx_t instance, channel, base;  // base: element offset of the instance's first element
  int chunk;
  idx_t v_begin, v_end;           // vector range of this chunk
};

__device__ __forceinline__ Unit make_unit(const NjParams& p, idx_t round) {
  const idx_t groups = (idx_t)gridDim.x * NJ_GROUPS_PER_CTA;
  const idx_t unit = round * groups + (idx_t)blockIdx.x * NJ_GROUPS_PER_CTA + threadIdx.x / NJ_GROUP;
  const idx_t units = (idx_t)p.N * p.C * p.chunks;
  Unit u;
  u.active = unit < units;
  const idx_t safe = u.active ? unit : 0;
#if NJ_NCDHW_SPLITS
  u.instance = quotient(safe, p.chunks, p.by_chunks);
  u.chunk = (int)(safe - u.instance * p.chunks);
#else
  u.instance = safe;  // one chunk an instance (the host's launchable): no quotient before the loads
  u.chunk = 0;
#endif
#if NJ_BACKWARD
  if (p.channel_major) {  // unit = c * N + n
    const idx_t c = quotient(u.instance, p.N, p.by_n);
    u.instance = (u.instance - c * p.N) * p.C + c;
  }
#endif
  const idx_t n = quotient(u.instance, p.C, p.by_c);
  u.channel = u.instance - n * p.C;
  u.base = n * (idx_t)p.stride_n + u.channel * (idx_t)p.stride_c;
  const idx_t nvec = (idx_t)p.spatial / NJ_VEC;
  u.v_begin = (idx_t)u.chunk * p.chunk_vectors;
  u.v_end = u.active ? min(nvec, u.v_begin + (idx_t)p.chunk_vectors) : u.v_begin;
  return u;
}

__device__ __forceinline__ idx_t num_rounds(const NjParams& p) {
  const idx_t groups = (idx_t)gridDim.x * NJ_GROUPS_PER_CTA;
  const idx_t units = (idx_t)p.N * p.C * p.chunks;
  return (units + groups - 1) / groups;
}

// Whether round `round` holds any unit: round < num_rounds(p) without its division, which ptxas
// schedules in front of the first round's loads however the loop is written (~25 dependent
// instructions before the first load of the deep tiers, nvdisasm sm_90). The round loops test this.
__device__ __forceinline__ bool round_has_units(const NjParams& p, idx_t round) {
  return round * (idx_t)gridDim.x * NJ_GROUPS_PER_CTA < (idx_t)p.N * p.C * p.chunks;
}

// Elements covered by chunk j of an instance.
__device__ __forceinline__ float chunk_count(const NjParams& p, int j) {
  const idx_t nvec = (idx_t)p.spatial / NJ_VEC;
  const idx_t begin = (idx_t)j * p.chunk_vectors;
  return (float)(min((idx_t)p.chunk_vectors, nvec - begin) * NJ_VEC);
}

// ---------------------------------------------------------------- chunk merge (NCDHW backward split)
// Warp 0 runs the whole exchange of a split instance: lane 0 publishes the CTA's partial and
// waits for the peers, the 32 lanes read the instance's partials in parallel and add them in a
// fixed order (chunk j on lane j % 32, lanes in a shuffle tree), so every peer CTA computes the
// same bits; the other warps wait at the one barrier that hands out the result. Measured on the
// H200 against the whole CTA taking part (a read of the partials and two shared-memory reductions
// per exchange): backward of (2,32,80,192,160) fp16 482 -> 356 us, (2,32,128^3) 335 -> 328 us.
// The same scheme made the forward's (mean, M2) merge slower (217 -> 255 us on (2,32,80,192,160),
// for reasons not found), so the forward keeps the whole-CTA merge. `out` is 2 floats of shared
// memory used by nothing else.

// Warp 0, lane 0 publishes the CTA's partial (a, b) and waits for the peers; then warp 0 reads
// the instance's partials from the returned pointer.
__device__ __forceinline__ const float* exchange_warp0_wait(const NjParams& p, const Unit& u, float a, float b) {
  if (threadIdx.x == 0)
    exchange_publish_and_wait(p.counters, u.instance, p.partials, u.instance * p.chunks + u.chunk, a, b, p.chunks);
  __syncwarp();
  return p.partials + 2 * u.instance * p.chunks;
}

// Every thread: thread 0's merged (a, b) to the whole CTA, and this CTA starts leaving the
// exchange (thread 0, after the barrier). Returns thread 0's departure ticket for
// exchange_leave_end after the output, kNoTicket elsewhere.
__device__ __forceinline__ unsigned exchange_warp0_finish(const NjParams& p, const Unit& u, float& a, float& b,
                                                          float* out) {
  if (threadIdx.x == 0) out[0] = a, out[1] = b;
  __syncthreads();
  a = out[0], b = out[1];
  return threadIdx.x == 0 ? exchange_leave_begin(p.counters, u.instance) : kNoTicket;  // warp 0 read every partial
}

// Backward: the chunk's (sum g, sum g * xhat) in, the instance's out; returns the departure
// ticket (exchange_warp0_finish).
__device__ __forceinline__ unsigned exchange_sum_partials(const NjParams& p, const Unit& u, float& s0, float& s1,
                                                          float* out) {
  if (threadIdx.x < 32) {
    const float* part = exchange_warp0_wait(p, u, s0, s1);
    float a = 0.f, b = 0.f;
#pragma unroll 4
    for (int j = threadIdx.x; j < p.chunks; j += 32) a += __ldcg(part + 2 * j), b += __ldcg(part + 2 * j + 1);
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      a += __shfl_down_sync(0xffffffffu, a, offset);
      b += __shfl_down_sync(0xffffffffu, b, offset);
    }
    s0 = a, s1 = b;
  }
  return exchange_warp0_finish(p, u, s0, s1, out);
}
#endif  // NJ_GROUP > 0

// ---------------------------------------------------------------- thread-block clusters (sm_90)
#if __CUDA_ARCH__ >= 900
// The cluster barrier in two halves (every thread of the CTA calls each, alternately): arrive,
// and wait until every thread of every CTA of the cluster has arrived (or exited).
// cluster_started(), early in a kernel, lets a later cluster_wait() tell that every CTA of the
// cluster runs, before writing to another CTA's shared memory.
__device__ __forceinline__ void cluster_started() { asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory"); }
// Release: this thread's writes before it (remote shared-memory stores too) are visible to the
// threads that pass the matching cluster_wait().
__device__ __forceinline__ void cluster_arrive_release() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
// This CTA's rank in its cluster, and its cluster's index in the grid (1-D clusters).
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned cluster_index() {
  unsigned r;
  asm("mov.u32 %0, %%clusterid.x;" : "=r"(r));
  return r;
}
// The address of `local`'s offset in the shared memory of the cluster's CTA `rank`;
// store_cluster_shared stores v there (16-byte aligned for a float4, 8 for a float2).
__device__ __forceinline__ unsigned cluster_shared_address(const float* local, unsigned rank) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"((unsigned)__cvta_generic_to_shared(local)), "r"(rank));
  return remote;
}
__device__ __forceinline__ void store_cluster_shared(float* local, unsigned rank, float4 v) {
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(cluster_shared_address(local, rank)), "f"(v.x),
               "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
}
__device__ __forceinline__ void store_cluster_shared(float* local, unsigned rank, float2 v) {
  asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};" ::"r"(cluster_shared_address(local, rank)), "f"(v.x), "f"(v.y)
               : "memory");
}
// A transaction barrier (mbarrier) in shared memory that completes when `bytes` have arrived
// through store_cluster_async. One thread of the CTA arms it before
// cluster_started(), whose arrival carries the initialisation to the other CTAs (the fence).
__device__ __forceinline__ void inbox_barrier_arm(unsigned long long* bar, unsigned bytes) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(bar);
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(a) : "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(a), "r"(bytes) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// Stores v into `local`'s offset in CTA `rank`'s shared memory and counts its bytes on that
// CTA's barrier `bar` (same offset there): no release fence, the barrier's completion publishes.
__device__ __forceinline__ void store_cluster_async(float* local, unsigned long long* bar, unsigned rank, float4 v) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(
                   cluster_shared_address(local, rank)),
               "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(cluster_shared_address((const float*)bar, rank))
               : "memory");
}
__device__ __forceinline__ void store_cluster_async(float* local, unsigned long long* bar, unsigned rank, float2 v) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];" ::"r"(
                   cluster_shared_address(local, rank)),
               "f"(v.x), "f"(v.y), "r"(cluster_shared_address((const float*)bar, rank))
               : "memory");
}
// Waits until the armed barrier's bytes have all arrived; the stores are then visible.
__device__ __forceinline__ void inbox_barrier_wait(unsigned long long* bar) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(bar);
  unsigned done = 0;
  while (!done) {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(a)
        : "memory");
  }
}
#else
// No clusters before sm_90. The host launches no cluster kernel there (heuristics
// nhwc_cluster_applies); these stubs only let the bounded set's kernels compile for every arch.
__device__ __forceinline__ void cluster_started() { __trap(); }
__device__ __forceinline__ void cluster_arrive_release() { __trap(); }
__device__ __forceinline__ void cluster_wait() { __trap(); }
__device__ __forceinline__ unsigned cluster_rank() { __trap(); return 0; }
__device__ __forceinline__ unsigned cluster_index() { __trap(); return 0; }
__device__ __forceinline__ void store_cluster_shared(float*, unsigned, float4) { __trap(); }
__device__ __forceinline__ void store_cluster_shared(float*, unsigned, float2) { __trap(); }
__device__ __forceinline__ void inbox_barrier_arm(unsigned long long*, unsigned) { __trap(); }
__device__ __forceinline__ void store_cluster_async(float*, unsigned long long*, unsigned, float4) { __trap(); }
__device__ __forceinline__ void store_cluster_async(float*, unsigned long long*, unsigned, float2) { __trap(); }
__device__ __forceinline__ void inbox_barrier_wait(unsigned long long*) { __trap(); }
#endif

// ---------------------------------------------------------------- grid-wide finishing steps
// Both run in the last CTA to finish (see last_cta_arrive), over per-instance values that every
// CTA left in p.scratch, in a fixed order: deterministic, no floating-point atomics.

__device__ __forceinline__ unsigned* grid_counter(const NjParams& p) { return p.counters + 2 * (idx_t)p.N * p.C; }

// The last CTA's pass sums, for every channel c, the N (a, b) pairs scratch holds at
// 2 * (n * C + c), n in order (deterministic). Each thread takes up to kFinishGroup channels
// (c, c + NJ_THREADS, ...) and has all their loads of one n in flight together: the pass is a
// chain of L2 round trips, one per dependent load, and at the deep stages, whose kernels take
// 4-10 µs, each one costs about half a microsecond.
constexpr int kFinishGroup = 4;
template <typename Done>
__device__ __forceinline__ void sum_scratch_pairs(const NjParams& p, Done done) {
  for (idx_t c0 = threadIdx.x; c0 < p.C; c0 += kFinishGroup * NJ_THREADS) {
    float a[kFinishGroup], b[kFinishGroup];
#pragma unroll
    for (int k = 0; k < kFinishGroup; ++k) a[k] = 0.f, b[k] = 0.f;
#pragma unroll 2
    for (idx_t n = 0; n < p.N; ++n) {
      float2 v[kFinishGroup];
#pragma unroll
      for (int k = 0; k < kFinishGroup; ++k) {
        const idx_t c = c0 + (idx_t)k * NJ_THREADS;
        v[k] = c < p.C ? __ldcg(reinterpret_cast<const float2*>(p.scratch + 2 * (n * p.C + c))) : make_float2(0.f, 0.f);
      }
#pragma unroll
      for (int k = 0; k < kFinishGroup; ++k) a[k] += v[k].x, b[k] += v[k].y;
    }
#pragma unroll
    for (int k = 0; k < kFinishGroup; ++k) {
      const idx_t c = c0 + (idx_t)k * NJ_THREADS;
      if (c < p.C) done(c, a[k], b[k]);
    }
  }
}

// running = (1 - momentum) * running + momentum * (mean over N of the instance statistics), with
// the unbiased variance, as torch does. scratch holds (mean, biased var) per instance. The last
// CTA, every thread.
__device__ __forceinline__ void update_running_stats(const NjParams& p) {
  const float unbias = (float)p.spatial / (float)(p.spatial - 1);
  sum_scratch_pairs(p, [&](idx_t c, float m, float v) {
    m /= (float)p.N;
    v = v / (float)p.N * unbias;
    p.running_mean[c] = (1.f - p.momentum) * p.running_mean[c] + p.momentum * m;
    p.running_var[c] = (1.f - p.momentum) * p.running_var[c] + p.momentum * v;
  });
}
__device__ __forceinline__ void finish_running_stats(const NjParams& p, bool* flag_smem) {
  if (!last_cta_arrive(grid_counter(p), flag_smem)) return;
  update_running_stats(p);
  last_cta_done(grid_counter(p));
}

// dweight[c] = sum_n sum(g * xhat), dbias[c] = sum_n sum(g). scratch holds (sum g, sum g*xhat).
// The last CTA, every thread.
__device__ __forceinline__ void update_weight_grads(const NjParams& p) {
  if (!p.dweight && !p.dbias) return;
  sum_scratch_pairs(p, [&](idx_t c, float sg, float sgx) {
    if (p.dweight) p.dweight[c] = sgx;
    if (p.dbias) p.dbias[c] = sg;
  });
}
__device__ __forceinline__ void finish_weight_grads(const NjParams& p, bool* flag_smem) {
  if (!p.dweight && !p.dbias) return;
  if (!last_cta_arrive(grid_counter(p), flag_smem)) return;
  update_weight_grads(p);
  last_cta_done(grid_counter(p));
}
