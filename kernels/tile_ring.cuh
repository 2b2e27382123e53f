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
// Ring layout (bytes, dynamic shared memory): slot (stage, tensor, item) of thread t at
//   (((stage * NJ_RING_TENSORS + tensor) * NJ_ITEMS + item) * NJ_THREADS + t) * 16
// so a warp's 16-byte accesses are contiguous (conflict-free). The host sizes it with the same
// formula (schedule/heuristics.cpp ring_bytes).
#pragma once

#if NJ_STAGES > 0
#if NJ_CACHED || NJ_GROUP != NJ_THREADS || NJ_STAGES < 2
#error "the tile ring serves streamed kernels whose group is the whole CTA, with at least 2 stages"
#endif

#if NJ_TRAIN
#define NJ_RING_PASSES 2
#else
#define NJ_RING_PASSES 1
#endif

extern __shared__ __align__(16) unsigned char nj_ring[];

__device__ __forceinline__ unsigned nj_smem_address(const void* p) {
  unsigned long long a;
  asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
  return (unsigned)a;
}

// 16 bytes global -> shared, or 16 zero bytes when !valid (nothing is read).
__device__ __forceinline__ void nj_cp_async16(unsigned dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void nj_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void nj_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

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

__device__ __forceinline__ unsigned ring_offset(int stage, int tensor, int item) {
  return ((((unsigned)stage * NJ_RING_TENSORS + tensor) * NJ_ITEMS + item) * NJ_THREADS + threadIdx.x) * 16u;
}

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
#pragma unroll
  for (int i = 0; i < NJ_ITEMS; ++i) {
    const idx_t v = r.t + (idx_t)i * NJ_THREADS + threadIdx.x;
    const bool valid = !r.done && v < r.u.v_end;
    const idx_t e = valid ? r.u.base + v * NJ_VEC : 0;
#pragma unroll
    for (int k = 0; k < NJ_RING_TENSORS; ++k)
      nj_cp_async16(nj_smem_address(nj_ring) + ring_offset(stage, k, i),
                    reinterpret_cast<const data_t*>(r.src[k]) + e, valid);
  }
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
  static_assert(sizeof(vec_t) == 16, "the tile ring moves 16-byte vectors");
  nj_cp_async_wait<NJ_STAGES - 2>();  // the oldest tile in flight has landed
  const int stage = (int)(r.taken % NJ_STAGES);
  vec_t* outs[3] = {out0, out1, out2};
#pragma unroll
  for (int k = 0; k < NJ_RING_TENSORS; ++k)
#pragma unroll
    for (int i = 0; i < NJ_ITEMS; ++i) outs[k][i] = *reinterpret_cast<const vec_t*>(nj_ring + ring_offset(stage, k, i));
  ring_produce(p, r, (int)((r.taken + NJ_STAGES - 1) % NJ_STAGES));
  ++r.taken;
}

// Drains the ring before the kernel's end (no cp.async may be pending at exit).
__device__ __forceinline__ void ring_finish() { nj_cp_async_wait<0>(); }
#else
struct TileRing {};  // no ring: streamed tiles are loaded straight into registers
__device__ __forceinline__ void ring_finish() {}
#endif
