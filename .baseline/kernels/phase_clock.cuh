// Where a kernel's time goes: a measurement build, off unless NVRTC gets -DNJ_PHASE_CLOCKS=1
// (NORMJIT_NVRTC_OPTIONS="-DNJ_PHASE_CLOCKS=1", which is also part of the disk cache key, so these
// kernels never mix with the default ones). bench/phase_clocks.py runs it.
//
// Thread 0 of a few CTAs (every NJ_PHASE_CLOCKS_EVERY-th) stamps clock64() at the end of each
// phase (nj_phase_mark) and, at the kernel's end, prints its SM cycles per phase:
// - the resident split (resident_split.cuh): the mean over the steady steps of the pipeline (the
//   first and last NJ_OUTPUT_LAG + 1 steps left out: fill and drain);
// - the channels-last kernels (instance_norm_nhwc.cuh): the sums over the CTA's rounds (one,
//   usually), and %globaltimer at its start and end, so that the CTAs' start skew shows.
// Thread 0's view is the CTA's: every phase ends at or after a CTA barrier except the cp.async
// wait, the poll and the writes, which thread 0 does for its own part only.
// Why clock64 and not %globaltimer for phases: they last hundreds of cycles, below the timer's
// resolution on some GPUs; cycles convert to time through the kernel time of the same run.
#pragma once

#ifndef NJ_PHASE_CLOCKS
#define NJ_PHASE_CLOCKS 0
#endif

enum NjPhase {
  kPhaseA,          // the look at the partials, the context loads (and the slot's refill, late)
  kPhaseBWait,      // phase B: the chunk's cp.async group landed, read from its slot
  kPhaseBReduce,    // phase B: its partial statistics (CTA reductions) and the publish
  kPhaseCTake,      // phase C: the chunk from its slot (and the early refill, and dx's terms)
  kPhaseCPoll,      // phase C: thread 0's poll of the peers' partials
  kPhaseCMerge,     // phase C: the CTA sum of the merged partials (waits for every thread's poll)
  kPhaseCWrite,     // phase C: the output's arithmetic and stores
  kPhases
};

// The channels-last kernels' phases, in order: a round's statistics pass and CTA sums, then the
// split's exchange (tile_exchange_arrive, the merge, the second arrival of the scattered merge),
// then the output pass.
enum NjNhwcPhase {
  kNhwcLoad,            // the statistics pass: loads (or the ring's waits) and per-thread sums
  kNhwcReduce,          // the CTA's column sums of them
  kNhwcArrive,          // publish the chunk's pairs, wait for the peers (split only)
  kNhwcMerge,           // merge the chunks' pairs (the scattered merge: one column a CTA)
  kNhwcMergedArrive,    // the scattered merge's second arrival, the totals read, the depart
  kNhwcOutput,          // the output pass: normalize (or dx) and stores
  kNhwcCluster,         // the cluster's weight gradients (cluster_weight_grads: the deep backward)
  kNhwcPhases
};

// The channels-last split's arrivals (nhwc_exchange.cuh), stamped in %globaltimer by thread 0:
// when it is ready to arrive (its CTA's partials written) and when its wait ends, for the first
// and the second (scattered merge) arrival of its first round. With every CTA of an instance
// stamped (NJ_PHASE_CLOCKS_EVERY=1), the wait splits into the peers' skew (until the instance's
// last CTA was ready) and the round trip after it (the release, the poll seeing the count).
enum NjArrivalStamp { kArrivalReady, kArrivalReleased, kArrival2Ready, kArrival2Released, kArrivalStamps };

#if NJ_PHASE_CLOCKS
#ifndef NJ_PHASE_CLOCKS_EVERY
#define NJ_PHASE_CLOCKS_EVERY 33
#endif
enum { kMaxPhases = kPhases > kNhwcPhases ? kPhases : kNhwcPhases };  // an enumerator: no symbol in the cubin
__shared__ long long nj_phase_last;
__shared__ long long nj_phase_sum[kMaxPhases];
__shared__ int nj_phase_counting;
__shared__ unsigned long long nj_phase_started_ns;
__shared__ unsigned long long nj_arrival_ns[kArrivalStamps];
__shared__ long long nj_arrival_instance;

__device__ __forceinline__ unsigned long long nj_globaltimer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ bool nj_phase_thread() {
  return threadIdx.x == 0 && blockIdx.x % NJ_PHASE_CLOCKS_EVERY == 0;
}
// `counting`: whether the marks count from the start (the channels-last kernels); the resident
// split counts from nj_phase_step on.
__device__ __forceinline__ void nj_phase_start(bool counting = false) {
  if (!nj_phase_thread()) return;
  for (int k = 0; k < kMaxPhases; ++k) nj_phase_sum[k] = 0;
  nj_phase_counting = counting;
  for (int k = 0; k < kArrivalStamps; ++k) nj_arrival_ns[k] = 0;
  nj_arrival_instance = -1;
  nj_phase_started_ns = nj_globaltimer_ns();
  nj_phase_last = clock64();
}
// Thread 0 only (it does the arrivals); the first round's stamps are kept.
__device__ __forceinline__ void nj_arrival_stamp(int k, idx_t instance) {
  if (!nj_phase_thread() || nj_arrival_ns[k] != 0) return;
  nj_arrival_ns[k] = nj_globaltimer_ns();
  if (k == kArrivalReady) nj_arrival_instance = (long long)instance;
}
__device__ __forceinline__ void nj_phase_mark(int k) {
  if (!nj_phase_thread()) return;
  const long long t = clock64();
  if (nj_phase_counting) nj_phase_sum[k] += t - nj_phase_last;
  nj_phase_last = t;
}
#ifdef NJ_OUTPUT_LAG  // the resident split's (resident_split.cuh defines it before including this)
// The start of a step of `steps` (the pipeline's iterations): whether its phases count (steady
// state only). Phase A runs from the previous step's last mark, so it holds the loop's overhead.
__device__ __forceinline__ void nj_phase_step(long long step, long long steps) {
  if (!nj_phase_thread()) return;
  nj_phase_counting = step > NJ_OUTPUT_LAG && step + NJ_OUTPUT_LAG + 1 < steps;
}
__device__ __forceinline__ void nj_phase_report(const char* kernel, long long steps, int chunks) {
  if (!nj_phase_thread()) return;
  const long long counted = steps - 2 * (NJ_OUTPUT_LAG + 1);
  if (counted <= 0) return;
  long long total = 0;
  for (int k = 0; k < kPhases; ++k) total += nj_phase_sum[k];
  printf("nj_phase %s chunks %d grid %d cta %d steps %lld (counted %lld): cycles a step %lld = A %lld + B.wait %lld + "
         "B.reduce %lld + C.take %lld + C.poll %lld + C.merge %lld + C.write %lld\n",
         kernel, chunks, (int)gridDim.x, (int)blockIdx.x, steps, counted, total / counted, nj_phase_sum[kPhaseA] / counted,
         nj_phase_sum[kPhaseBWait] / counted, nj_phase_sum[kPhaseBReduce] / counted,
         nj_phase_sum[kPhaseCTake] / counted, nj_phase_sum[kPhaseCPoll] / counted,
         nj_phase_sum[kPhaseCMerge] / counted, nj_phase_sum[kPhaseCWrite] / counted);
}
#endif
__device__ __forceinline__ void nj_nhwc_phase_report(const char* kernel, long long rounds, int chunks) {
  if (!nj_phase_thread()) return;
  long long total = 0;
  for (int k = 0; k < kNhwcPhases; ++k) total += nj_phase_sum[k];
  printf("nj_nhwc_phase %s chunks %d grid %d cta %d rounds %lld: cycles %lld = load %lld + reduce %lld + "
         "arrive %lld + merge %lld + merged_arrive %lld + output %lld + cluster %lld; globaltimer %llu to %llu ns; "
         "arrivals instance %lld ready %llu released %llu ready2 %llu released2 %llu\n",
         kernel, chunks, (int)gridDim.x, (int)blockIdx.x, rounds, total, nj_phase_sum[kNhwcLoad],
         nj_phase_sum[kNhwcReduce], nj_phase_sum[kNhwcArrive], nj_phase_sum[kNhwcMerge],
         nj_phase_sum[kNhwcMergedArrive], nj_phase_sum[kNhwcOutput], nj_phase_sum[kNhwcCluster],
         nj_phase_started_ns, nj_globaltimer_ns(), nj_arrival_instance, nj_arrival_ns[kArrivalReady],
         nj_arrival_ns[kArrivalReleased], nj_arrival_ns[kArrival2Ready], nj_arrival_ns[kArrival2Released]);
}
#else
__device__ __forceinline__ void nj_phase_start(bool = false) {}
__device__ __forceinline__ void nj_phase_step(long long, long long) {}
__device__ __forceinline__ void nj_phase_mark(int) {}
__device__ __forceinline__ void nj_arrival_stamp(int, idx_t) {}
__device__ __forceinline__ void nj_phase_report(const char*, long long, int) {}
__device__ __forceinline__ void nj_nhwc_phase_report(const char*, long long, int) {}
#endif
