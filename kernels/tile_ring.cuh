// A per-thread ring of NJ_STAGES tiles in shared memory, filled with cp.async, for the streamed
// NCDHW kernels (NJ_CACHED == 0, group == CTA, 16-byte vectors; sm_80 and newer).
//
// Why: a streamed kernel reads every chunk twice (statistics, then output). Loading tiles into
// registers left at most one tile per thread in flight and stalled on every tile; the ring keeps
// NJ_STAGES - 1 tiles in flight per thread without registers, across pass and round boundaries,
// so the next pass's first tiles are already on their way while the CTA waits at the exchange.
//
// Each thread copies and later reads back only its own slots, so no CTA barrier is needed: the
// thread's cp.async.wait_group is the only synchronisation. The producer walks exactly the tile
// sequence the consumer will ask for: for every round, the chunk's tiles once per pass
// (NJ_RING_PASSES: 2 when training — statistics and output — else 1).
//
// Storage and copies: smem_slots.cuh (included outside the #if: codegen expands each file once).
#pragma once
#include "smem_slots.cuh"

// NJ_RING: the kernel streams through the ring (the resident split, and a register tier that keeps
// dy in shared memory, use the slots their own way).
#define NJ_RING (NJ_STAGES > 0 && !NJ_RESIDENT && !NJ_CACHED)
#if NJ_RING
#if NJ_GROUP != NJ_THREADS || NJ_STAGES < 2
#error "the tile ring serves streamed kernels whose group is the whole CTA, with at least 2 stages"
#endif

#if NJ_TRAIN
#define NJ_RING_PASSES 2
#else
#define NJ_RING_PASSES 1
#endif
static_assert(sizeof(vec_t) == 16, "the tile ring moves 16-byte vectors");

struct TileRing {
  const void* src[NJ_RING_TENSORS];  // the streamed tensors (x; x, dy; x, dy, residual)
  // Producer cursor: the next tile to copy.
  idx_t round, rounds, t;
  int pass;
  Unit u;
  bool done;
  // Consumer position: tiles taken so far.
  unsigned taken;
};

// Moves the producer cursor to the next non-empty tile (or marks the sequence done).
__device__ __forceinline__ void ring_advance(const NjParams& p, TileRing& r, idx_t step) {
  r.t += step;
  while (!r.done && r.t >= r.u.v_end) {
    if (++r.pass == NJ_RING_PASSES) {
      r.pass = 0;
      if (++r.round >= r.rounds) {
        r.done = true;
        break;
      }
      r.u = make_unit(p, r.round);
    }
    r.t = r.u.v_begin;
  }
}

// Copies the cursor's tile into `stage` (zeros past the chunk or the sequence) and commits one
// cp.async group — always exactly one, so wait_group counts tiles.
__device__ __forceinline__ void ring_produce(const NjParams& p, TileRing& r, int stage) {
  constexpr idx_t kTile = (idx_t)NJ_THREADS * NJ_ITEMS;
  slots_copy_tile(r.src, r.u.base, r.t, r.u.v_end, !r.done, stage);
  nj_cp_async_commit();
  if (!r.done) ring_advance(p, r, kTile);
}

// Starts the sequence at round 0 and puts the first NJ_STAGES - 1 tiles in flight.
__device__ __forceinline__ void ring_start(const NjParams& p, TileRing& r, const void* a, const void* b,
                                           const void* c) {
  r.src[0] = a;
#if NJ_RING_TENSORS > 1
  r.src[1] = b;
#endif
#if NJ_RING_TENSORS > 2
  r.src[2] = c;
#endif
  (void)b, (void)c;
  r.rounds = num_rounds(p);
  r.round = 0;
  r.pass = 0;
  r.done = r.rounds == 0;
  if (!r.done) r.u = make_unit(p, 0);
  r.t = r.done ? 0 : r.u.v_begin;
  if (!r.done) ring_advance(p, r, 0);  // skip empty units
  r.taken = 0;
#pragma unroll
  for (int s = 0; s < NJ_STAGES - 1; ++s) ring_produce(p, r, s);
}

// The next tile of the sequence into registers (tensor k into out_k); refills the ring.
__device__ __forceinline__ void ring_take(const NjParams& p, TileRing& r, vec_t* out0, vec_t* out1, vec_t* out2) {
  nj_cp_async_wait<NJ_STAGES - 2>();  // the oldest tile in flight has landed
  slots_read((int)(r.taken % NJ_STAGES), out0, out1, out2);
  ring_produce(p, r, (int)((r.taken + NJ_STAGES - 1) % NJ_STAGES));
  ++r.taken;
}

// Asks L2 for the first p.l2_prefetch_vectors vectors of this CTA's chunk in round `round` + 1,
// of every streamed tensor: one bulk prefetch a tensor by thread 0 (sm_90). Called after a round's
// statistics pass, whose DRAM reads are then done: without it DRAM idles while the CTA waits at
// the exchange and re-reads its chunk from L2, since the ring's few tiles in flight are that
// second pass's; with it the head of the next round's chunk streams in meanwhile, and that
// round's statistics pass starts from L2. How much is the host's choice (l2_prefetch_percent):
// the whole chunk measured slower than none. A hint: nothing waits for it, and the range lies
// inside the chunk, so inside the tensors.
__device__ __forceinline__ void ring_prefetch_next_round(const NjParams& p, const TileRing& r, idx_t round) {
#if __CUDA_ARCH__ >= 900
  if (p.l2_prefetch_vectors <= 0 || threadIdx.x != 0 || !round_has_units(p, round + 1)) return;
  const Unit u = make_unit(p, round + 1);
  const idx_t vectors = min(u.v_end - u.v_begin, (idx_t)p.l2_prefetch_vectors);
  if (!u.active || vectors <= 0) return;
  for (int k = 0; k < NJ_RING_TENSORS; ++k) {
    const data_t* first = reinterpret_cast<const data_t*>(r.src[k]) + u.base + u.v_begin * NJ_VEC;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(first), "r"((unsigned)(vectors * 16))
                 : "memory");
  }
#else
  (void)p, (void)r, (void)round;
#endif
}

// Drains the ring before the kernel's end (no cp.async may be pending at exit).
__device__ __forceinline__ void ring_finish() { nj_cp_async_wait<0>(); }
#else
struct TileRing {};  // no ring: streamed tiles are loaded straight into registers
__device__ __forceinline__ void ring_finish() {}
#endif
