// The resident split (NJ_RESIDENT): training kernels (NCDHW, 16-byte vectors, sm_80 and newer) for
// instances too large for one CTA, each chunk held in shared memory from its load to its output,
// so x (and dy) is read from HBM exactly once and each CTA waits for its peers only rarely.
//
// Why: the other splits run in rounds in lockstep. Every CTA of a round loads, reduces, waits at
// the exchange for the slowest of its ~43 peers and only then writes; the memory system idles at
// every exchange (measured on the H200: the L2-streamed split moved 2.4-2.7 TB/s of DRAM traffic
// against a 4.25 TB/s copy, its traffic near ideal). Here every CTA (two of 256 threads per SM, or
// one of 512 for instances of more chunks than those merge: their slots take most of the shared
// memory; the host says why, resident_thread_choices) walks its chunks as a software pipeline of
// NJ_STAGES slots:
//
//   step s:  A  the look at the partials of chunk s-L's instance (L = NJ_STAGES - 1)
//            B  chunk s-1 has landed: its partial statistics, published to its peers (no wait)
//            C  chunk s-L: read from its slot; its instance's partials (published at least one
//               step ago in the common case) merged, its output written
//            and chunk s+1 starts loading into the slot C read                      (cp.async)
//
// so while a CTA merges and writes, its next chunks are in flight, and its peers published the
// partials it waits for one or more steps earlier. Where instances hold more chunks than the grid
// (p.early_refill, early_refill_pays on the host) phase C waits for peers a step or more behind,
// so chunk s+1 starts loading as soon as C has read the slot: its reads run during that wait.
// Elsewhere at the step's end: loads queued ahead of C's poll measured a longer step there.
//
// The exchange is one round trip to L2: a chunk's partial pair is two 64-bit words, each a float
// and the launch's 32-bit tag, stored without a fence; a reader polls its peer's words until both
// carry the tag (no counters, no fences, no departure). The tag is the generation in exchange[0]
// plus one: every CTA reads it at its start, the last CTA to finish stores it back (after every
// CTA has read it), so words of earlier launches carry smaller tags. When the tag would wrap, the
// last CTA clears the whole region instead. Measured on the H200 before this scheme (counters:
// a fence and an atomic to publish, the counter, the partials and a departing atomic on the
// critical path of every step) the pipeline ran 244 us for (2,32,128^3) fp16, slower than the
// L2-streamed split's 208. Chunk s of CTA b is unit s * gridDim.x + b: an
// instance's chunks are consecutive units, so they run on neighbouring CTAs in one or a few
// steps. Deadlock freedom: C at step s needs only partials that B publishes at steps <= s (and B
// precedes C within a step in every CTA) as long as an instance's chunks reach at most L - 1
// steps past the one being written, which holds when chunks - 1 <= (L - 1) * gridDim.x. The host
// guarantees that, one chunk per CTA per step (chunk_vectors <= NJ_THREADS * NJ_ITEMS) and
// co-residency (cooperative launch).
//
// The kernels (instance_norm_forward.cuh, instance_norm_backward.cuh) write the three phases; this
// file holds the pipeline's bookkeeping. The slots are smem_slots.cuh's stages.
#pragma once
#include "smem_slots.cuh"  // outside the #if: codegen expands each file once

#if NJ_RESIDENT
#if NJ_CACHED || NJ_GROUP != NJ_THREADS || NJ_STAGES < 3 || !NJ_TRAIN
#error "the resident split is a training kernel whose group is the whole CTA, with at least 3 slots"
#endif

static_assert(sizeof(vec_t) == 16, "the resident split moves 16-byte vectors");

#define NJ_OUTPUT_LAG (NJ_STAGES - 1)
#include "phase_clock.cuh"  // a measurement build's stamps (nothing unless NJ_PHASE_CLOCKS)

__device__ __forceinline__ int resident_slot(idx_t step) { return (int)(step % NJ_STAGES); }

// This CTA's chunk of `step` starts loading into its slot (nothing past the last unit). Always
// commits exactly one cp.async group per step, so wait_group counts steps.
__device__ __forceinline__ void resident_load(const NjParams& p, const Unit& u, idx_t step, const void* const* src) {
  if (u.active) slots_copy_tile(src, u.base, u.v_begin, u.v_end, true, resident_slot(step));
  nj_cp_async_commit();
}

// Phase B: the chunk of `step` (whose load started a step ago) into registers, once it has landed.
__device__ __forceinline__ void resident_take_landed(idx_t step, vec_t* out0, vec_t* out1, vec_t* out2) {
  nj_cp_async_wait<1>();  // all but the newest group (chunk step + 1, started last step) are complete
  slots_read(resident_slot(step), out0, out1, out2);
}

// Phase C: the chunk of `step` again (it landed steps ago).
__device__ __forceinline__ void resident_take(idx_t step, vec_t* out0, vec_t* out1, vec_t* out2) {
  slots_read(resident_slot(step), out0, out1, out2);
}

// ---------------------------------------------------------------- the tagged exchange
typedef unsigned long long nj_u64;

__device__ __forceinline__ nj_u64 nj_load_relaxed(const nj_u64* p) {
  nj_u64 v;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void nj_store_relaxed(nj_u64* p, nj_u64 v) {
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ nj_u64 tagged(unsigned tag, float v) { return ((nj_u64)tag << 32) | __float_as_uint(v); }
__device__ __forceinline__ unsigned tag_of(nj_u64 w) { return (unsigned)(w >> 32); }

// This launch's tag (every thread, at the kernel's start).
__device__ __forceinline__ unsigned resident_tag(const NjParams& p) {
  return (unsigned)nj_load_relaxed(p.exchange) + 1u;
}

__device__ __forceinline__ nj_u64* resident_words(const NjParams& p, idx_t instance, idx_t chunk) {
  return p.exchange + 1 + 2 * (instance * p.chunks + chunk);
}

// One thread: the chunk's partial pair (a, b) to its peers.
__device__ __forceinline__ void resident_publish(const NjParams& p, const Unit& u, unsigned tag, float a, float b) {
  nj_u64* w = resident_words(p, u.instance, u.chunk);
  nj_store_relaxed(w, tagged(tag, a));
  nj_store_relaxed(w + 1, tagged(tag, b));
}

// Thread j < chunks reads chunk j's pair of u's instance: first a look that may find words of an
// earlier launch (issued early, so its latency overlaps other work), then resident_settle polls
// until both carry the tag. Other threads get (0, 0). The forward merges (mean, M2) pairs about a
// shift, one chunk a thread: the host keeps chunks <= NJ_THREADS. The backward's pairs are plain
// sums, so thread j also adds chunk j + NJ_THREADS (`a2`, `b2`): up to 2 * NJ_THREADS chunks, which
// lets the backward run two CTAs of 256 per SM (resident_merge_capacity on the host).
// The forward's threads all also read chunk 0's first word (`first`, one request per warp): the
// shift of its merge (forward_resident), which every thread must know before the one CTA sum.
struct TaggedPair {
  nj_u64 a, b;
#if NJ_BACKWARD
  nj_u64 a2, b2;
#else
  nj_u64 first;
#endif
};
__device__ __forceinline__ TaggedPair resident_peek(const NjParams& p, const Unit& u) {
  TaggedPair t = {};
  if (u.active && threadIdx.x < p.chunks) {
    const nj_u64* w = resident_words(p, u.instance, threadIdx.x);
    t.a = nj_load_relaxed(w);
    t.b = nj_load_relaxed(w + 1);
  }
#if NJ_BACKWARD
  if (u.active && threadIdx.x + NJ_THREADS < p.chunks) {
    const nj_u64* w = resident_words(p, u.instance, threadIdx.x + NJ_THREADS);
    t.a2 = nj_load_relaxed(w);
    t.b2 = nj_load_relaxed(w + 1);
  }
#else
  if (u.active) t.first = nj_load_relaxed(resident_words(p, u.instance, 0));
#endif
  return t;
}
// The word at w, polled from `seen` (its last look) until it carries the tag.
__device__ __forceinline__ nj_u64 resident_poll(const nj_u64* w, unsigned tag, nj_u64 seen) {
  while (tag_of(seen) != tag) __nanosleep(32), seen = nj_load_relaxed(w);
  return seen;
}
__device__ __forceinline__ float value_of(nj_u64 w) { return __uint_as_float((unsigned)w); }
#if !NJ_BACKWARD
// Chunk 0's first word of u's instance (every thread).
__device__ __forceinline__ float resident_settle_first(const NjParams& p, const Unit& u, unsigned tag, nj_u64 w0) {
  return value_of(resident_poll(resident_words(p, u.instance, 0), tag, w0));
}
#endif
__device__ __forceinline__ void resident_settle(const NjParams& p, const Unit& u, unsigned tag, TaggedPair t, float& a,
                                                float& b) {
  a = b = 0.f;
  if (threadIdx.x >= p.chunks) return;
  const nj_u64* w = resident_words(p, u.instance, threadIdx.x);
  t.a = resident_poll(w, tag, t.a);
  t.b = resident_poll(w + 1, tag, t.b);
  a = value_of(t.a);
  b = value_of(t.b);
#if NJ_BACKWARD
  if (threadIdx.x + NJ_THREADS < p.chunks) {  // chunk j + NJ_THREADS, added in this fixed order
    const nj_u64* w2 = resident_words(p, u.instance, threadIdx.x + NJ_THREADS);
    a += value_of(resident_poll(w2, tag, t.a2));
    b += value_of(resident_poll(w2 + 1, tag, t.b2));
  }
#endif
}

// The last CTA of the launch (all its threads, after last_cta_arrive): the generation for the next
// launch, or at the wrap a cleared region.
__device__ __forceinline__ void resident_advance_generation(const NjParams& p, unsigned tag) {
  if (tag == 0xffffffffu) {
    for (idx_t i = 1 + threadIdx.x; i < p.exchange_words; i += NJ_THREADS) nj_store_relaxed(p.exchange + i, 0);
    __syncthreads();
    if (threadIdx.x == 0) nj_store_relaxed(p.exchange, 0);
  } else if (threadIdx.x == 0) {
    nj_store_relaxed(p.exchange, tag);
  }
}

// ---------------------------------------------------------------- the pipeline
// Every step: phase A here (the look at the partials phase C will merge, and the per-instance
// values both phases read from global memory start loading, so that their latency overlaps other
// work), then
//   stats(u, step, ctx)                 phase B, for the unit u of chunk `step` (one step ago);
//                                       ctx = stats_ctx(u), loaded in that step's phase A
//   output(u, step, peek, ctx, slot_read)
//                                       phase C, for the unit NJ_OUTPUT_LAG steps ago; `peek`
//                                       goes to resident_settle, ctx = output_ctx(u) loaded this
//                                       step; it calls slot_read() right after its resident_take:
//                                       with p.early_refill chunk step + NJ_STAGES starts loading
//                                       there into the slot just read, else at the step's end
// (a thread's cp.async into its own slot is ordered after its own earlier reads of that slot, as
// in any per-thread pipeline: no barrier is needed).
// The contexts are the kernel's per-instance values (saved statistics, weight and bias): loaded
// inside a phase, after its barriers, each cost a dependent L2 round trip on every step's chain
// (a compiler does not move a load across a barrier). All are called for active units only (the
// contexts with any unit; they must give zeros for inactive ones); an active unit is the same for
// every thread of the CTA (one unit per CTA), so the phases may use CTA barriers.
template <class StatsCtx, class OutputCtx, class Stats, class Output>
__device__ __forceinline__ void resident_pipeline(const NjParams& p, const void* const* src, StatsCtx stats_ctx,
                                                  OutputCtx output_ctx, Stats stats, Output output) {
  const idx_t steps = num_rounds(p);
  resident_load(p, make_unit(p, 0), 0, src);
  auto next_stats_ctx = stats_ctx(make_unit(p, steps));  // inactive
  nj_phase_start();
  for (idx_t step = 0; step < steps + NJ_OUTPUT_LAG; ++step) {
    nj_phase_step(step, steps + NJ_OUTPUT_LAG);
    const Unit ul = make_unit(p, step);
    const auto ctx_b = next_stats_ctx;  // the unit of chunk step - 1
    next_stats_ctx = stats_ctx(ul);
    const Unit uc = make_unit(p, step >= NJ_OUTPUT_LAG ? step - NJ_OUTPUT_LAG : steps);  // inactive until full
    const TaggedPair peek = resident_peek(p, uc);
    const auto ctx_c = output_ctx(uc);
    const idx_t next = min(step + 1, steps);  // steps: an inactive unit, an empty group
    auto refill = [&] { resident_load(p, make_unit(p, next), step + 1, src); };
    auto slot_read = [&] {
      if (p.early_refill) refill();
    };
    nj_phase_mark(kPhaseA);
    if (step >= 1 && step <= steps) {
      const Unit u = make_unit(p, step - 1);
      if (u.active) stats(u, step - 1, ctx_b);
    }
    if (uc.active) output(uc, step - NJ_OUTPUT_LAG, peek, ctx_c, slot_read);
    if (!uc.active || !p.early_refill) refill();
  }
  nj_cp_async_wait<0>();
  nj_phase_report(NJ_BACKWARD ? "backward" : "forward", steps + NJ_OUTPUT_LAG, p.chunks);
}
#endif
