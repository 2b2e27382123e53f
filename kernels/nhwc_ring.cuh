// A per-thread ring of NJ_STAGES tiles of x in shared memory, filled with cp.async, for the
// streamed channels-last forward (instance_norm_nhwc.cuh with NJ_CACHED == 0, 16-byte vectors,
// sm_80 and newer): tile_ring.cuh's idea, walking the channels-last tile sequence.
//
// Why: loaded into registers, a streamed tile left one tile per thread in flight (the next one,
// while the current was reduced or written) at 2 CTAs of 256 per SM: ~32 KB per SM, about what
// the HBM latency needs at full bandwidth and less than it needs under load. The ring keeps
// NJ_STAGES - 1 tiles per thread in flight without registers, and runs ahead across the exchange
// into the output pass, so the output pass's first tiles are on their way while a CTA waits for
// its chunk's peers. Measured on the H200 (fp16, docs/PERF_NOTES.md): forward (2,32,128^3)
// 248 -> 228 us, (2,32,80,192,160) 298 -> 277, (2,64,64^3) 95 -> 87; 4 stages as 3. The backward,
// whose registers already hold two tiles of x and dy in flight, measured slower through a ring of
// 3 (x and dy: 32 KB a stage, as many as fit beside a second CTA): 349 -> 376 us on (2,32,128^3).
//
// The producer walks exactly the sequence the consumer asks for: for every round, the chunk's
// tiles once per pass (statistics, then output; only output in eval), each pass in the order
// nhwc_tile_begin gives it (the output pass last tile first when p.reverse_output is set).
// Each thread copies and reads back only its own slots (smem_slots.cuh), so no CTA barrier is
// needed. The kernel file defines NJ_RING_TENSORS (1; the kept backward 2-3), TileUnit and the
// tile order (nhwc_unit_tiles, nhwc_tile_begin) before including this.
#pragma once
#include "smem_slots.cuh"

// The kept ring (NJ_RESIDENT: heuristics' "channels-last split, kept in shared memory") is the
// same storage used the other way round: a chunk of at most NJ_STAGES tiles is copied whole, tile
// k into slot k, for its statistics pass and stays there for its output pass, so x is read from
// memory once instead of twice (the second time from L2). It applies where every CTA of the grid
// holds its chunk at once (in fp16 the (2,256,16^3) and (2,128,32^3) stages; nhwc_kept_split says
// where else). The launch's dynamic shared memory may cover only the slots its chunks fill. The
// backward keeps x and dy (and a residual the activation's gradient reads) the same way, for its
// sums and then its dx (heuristics' nhwc_kept_whole: one chunk a unit).
#define NJ_NHWC_RING (NJ_STAGES > 0)
#define NJ_NHWC_KEPT (NJ_NHWC_RING && NJ_RESIDENT)
#if NJ_NHWC_RING
#if NJ_CACHED || (NJ_BACKWARD && !NJ_RESIDENT) || (NJ_STAGES < 2 && !NJ_RESIDENT)
#error "the channels-last ring: the streamed forward, 2 stages or more; the kept split, 1 or more"
#endif
static_assert(sizeof(vec_t) == 16, "the channels-last ring moves 16-byte vectors");

// Starts copying the tile of chunk positions from t0 of every slot tensor (x; the kept backward's
// x, dy and residual) into `stage` (zeros for positions past the chunk or channels past C;
// nothing is read when !live). Commits no cp.async group.
__device__ __forceinline__ void nhwc_copy_tile(const NjParams& p, const TileUnit& u, idx_t t0, bool live, int stage) {
#if NJ_BACKWARD
  const void* const src[3] = {p.x, p.dy, p.residual};
#else
  const void* const src[1] = {p.x};
#endif
#pragma unroll
  for (int i = 0; i < NJ_ITEMS; ++i) {
    const idx_t s = t0 + thread_row(u) + (idx_t)i * tile_rows(u);
    const bool valid = live && u.c_valid && s < u.s_end;
    const idx_t e = valid ? elem_at(p, u, s) : 0;
#pragma unroll
    for (int k = 0; k < NJ_RING_TENSORS; ++k)
      nj_cp_async16(nj_smem_address(nj_ring) + slot_offset(stage, k, i), reinterpret_cast<const data_t*>(src[k]) + e,
                    valid);
  }
}

#if NJ_NHWC_KEPT
struct NhwcRing {};  // no cursor: each round's chunk is loaded whole (nhwc_kept_load)
__device__ __forceinline__ void nhwc_ring_start(const NjParams&, NhwcRing&) {}

// Copies the chunk's tiles into slots 0.. (tile k into slot k), one cp.async group per slot, the
// slots past the chunk's tiles as empty groups: tile k has landed after
// cp.async.wait_group(NJ_STAGES - 1 - k) (nhwc_kept_wait).
__device__ __forceinline__ void nhwc_kept_load(const NjParams& p, const TileUnit& u) {
  const idx_t tiles = nhwc_unit_tiles(u);
#pragma unroll
  for (int k = 0; k < NJ_STAGES; ++k) {
    if (k < tiles) nhwc_copy_tile(p, u, nhwc_tile_begin(p, u, k, tiles, false), true, k);
    nj_cp_async_commit();
  }
}

// Waits until tile k (< NJ_STAGES) of nhwc_kept_load has landed; wait_group takes an immediate.
template <int K = 0>
__device__ __forceinline__ void nhwc_kept_wait(idx_t k) {
  if (k == K) {
    nj_cp_async_wait<NJ_STAGES - 1 - K>();
  } else if constexpr (K + 1 < NJ_STAGES) {
    nhwc_kept_wait<K + 1>(k);
  }
}
#else

#if NJ_TRAIN
#define NJ_NHWC_PASSES 2
#else
#define NJ_NHWC_PASSES 1
#endif

struct NhwcRing {
  // Producer cursor: tile k of `tiles` of pass `pass` of unit u (round `round`).
  idx_t round, rounds, k, tiles;
  int pass;
  TileUnit u;
  bool done;
  unsigned taken;  // consumer: tiles taken so far
};

// Moves the cursor to the next tile of the sequence, skipping units without tiles.
__device__ __forceinline__ void nhwc_ring_advance(const NjParams& p, NhwcRing& r) {
  while (!r.done && r.k >= r.tiles) {
    r.k = 0;
    if (++r.pass == NJ_NHWC_PASSES) {
      r.pass = 0;
      if (++r.round >= r.rounds) {
        r.done = true;
        break;
      }
      r.u = make_tile_unit(p, r.round);
      r.tiles = nhwc_unit_tiles(r.u);
    }
  }
}

// Copies the cursor's tile into `stage` (zeros for positions past the chunk, channels past C,
// or past the sequence) and commits one cp.async group: always exactly one, so wait_group
// counts tiles.
__device__ __forceinline__ void nhwc_ring_produce(const NjParams& p, NhwcRing& r, int stage) {
  const idx_t t0 = r.done ? 0 : nhwc_tile_begin(p, r.u, r.k, r.tiles, r.pass == 1);
  nhwc_copy_tile(p, r.u, t0, !r.done, stage);
  nj_cp_async_commit();
  if (!r.done) {
    ++r.k;
    nhwc_ring_advance(p, r);
  }
}

// Starts the sequence at round 0 and puts the first NJ_STAGES - 1 tiles in flight.
__device__ __forceinline__ void nhwc_ring_start(const NjParams& p, NhwcRing& r) {
  r.rounds = tile_rounds(p);
  r.round = 0;
  r.pass = 0;
  r.k = 0;
  r.done = r.rounds == 0;
  if (!r.done) r.u = make_tile_unit(p, 0);
  r.tiles = r.done ? 0 : nhwc_unit_tiles(r.u);
  nhwc_ring_advance(p, r);  // skip units without tiles
  r.taken = 0;
#pragma unroll
  for (int s = 0; s < NJ_STAGES - 1; ++s) nhwc_ring_produce(p, r, s);
}

// The next tile of the sequence into registers; refills the ring.
__device__ __forceinline__ void nhwc_ring_take(const NjParams& p, NhwcRing& r, vec_t (&x)[NJ_ITEMS]) {
  nj_cp_async_wait<NJ_STAGES - 2>();  // the oldest tile in flight has landed
  slots_read((int)(r.taken % NJ_STAGES), x, nullptr, nullptr);
  nhwc_ring_produce(p, r, (int)((r.taken + NJ_STAGES - 1) % NJ_STAGES));
  ++r.taken;
}
#endif  // NJ_NHWC_KEPT

// No cp.async may be pending when the kernel ends.
__device__ __forceinline__ void nhwc_ring_finish() { nj_cp_async_wait<0>(); }
#else
struct NhwcRing {};  // no ring: streamed tiles are loaded straight into registers
__device__ __forceinline__ void nhwc_ring_start(const NjParams&, NhwcRing&) {}
__device__ __forceinline__ void nhwc_ring_finish() {}
#endif
