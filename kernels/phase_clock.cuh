// Where a resident-split step's time goes: a measurement build, off unless NVRTC gets
// -DNJ_PHASE_CLOCKS=1 (NORMJIT_NVRTC_OPTIONS="-DNJ_PHASE_CLOCKS=1", which is also part of the disk
// cache key, so these kernels never mix with the default ones).
//
// Thread 0 of a few CTAs (every NJ_PHASE_CLOCKS_EVERY-th) stamps clock64() at the end of each
// phase of every step (nj_phase_mark) and, at the kernel's end, prints the mean SM cycles per
// phase over the steady steps (the first and last NJ_OUTPUT_LAG + 1 steps left out: fill and
// drain). Thread 0's view is the CTA's: every phase ends at or after a CTA barrier except the
// cp.async wait, the poll and the writes, which thread 0 does for its own part only.
// Why clock64 and not %globaltimer: the phases last hundreds of cycles, below the timer's
// resolution on some GPUs; cycles convert to time through the kernel time of the same run.
// Included by resident_split.cuh after NJ_OUTPUT_LAG.
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

#if NJ_PHASE_CLOCKS
#ifndef NJ_PHASE_CLOCKS_EVERY
#define NJ_PHASE_CLOCKS_EVERY 33
#endif
__shared__ long long nj_phase_last;
__shared__ long long nj_phase_sum[kPhases];
__shared__ int nj_phase_counting;

__device__ __forceinline__ bool nj_phase_thread() {
  return threadIdx.x == 0 && blockIdx.x % NJ_PHASE_CLOCKS_EVERY == 0;
}
__device__ __forceinline__ void nj_phase_start() {
  if (!nj_phase_thread()) return;
  for (int k = 0; k < kPhases; ++k) nj_phase_sum[k] = 0;
  nj_phase_counting = 0;
  nj_phase_last = clock64();
}
// The start of a step of `steps` (the pipeline's iterations): whether its phases count (steady
// state only). Phase A runs from the previous step's last mark, so it holds the loop's overhead.
__device__ __forceinline__ void nj_phase_step(long long step, long long steps) {
  if (!nj_phase_thread()) return;
  nj_phase_counting = step > NJ_OUTPUT_LAG && step + NJ_OUTPUT_LAG + 1 < steps;
}
__device__ __forceinline__ void nj_phase_mark(NjPhase k) {
  if (!nj_phase_thread()) return;
  const long long t = clock64();
  if (nj_phase_counting) nj_phase_sum[k] += t - nj_phase_last;
  nj_phase_last = t;
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
#else
__device__ __forceinline__ void nj_phase_start() {}
__device__ __forceinline__ void nj_phase_step(long long, long long) {}
__device__ __forceinline__ void nj_phase_mark(NjPhase) {}
__device__ __forceinline__ void nj_phase_report(const char*, long long, int) {}
#endif
