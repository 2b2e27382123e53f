// Instance-norm forward, NCDHW (each instance's spatial elements contiguous).
//
//   y = act((x - mean) * rstd * weight + bias [+ residual])
//
// One group of NJ_GROUP threads handles one chunk of one instance. With NJ_CACHED the chunk is
// held in registers (NJ_ITEMS vectors per thread), so x is read from memory exactly once; the
// statistics are two-pass over the registers (mean, then the sum of squared deviations), which is
// robust when mean >> std. When an instance is larger than one CTA can hold, `chunks` CTAs split
// it and merge their (mean, M2) partials with Chan's formula in chunk order (see common.cuh).
// Without NJ_CACHED (instances too large for the co-resident CTAs to hold) each CTA streams its
// chunk twice: once for statistics (per-tile two-pass, Chan-merged), once to normalise. With
// NJ_RESIDENT each chunk stays in shared memory between the two, in a pipeline of chunks
// (resident_split.cuh, forward_resident below).
//
// Compile-time switches besides common.cuh's: NJ_TRAIN (batch statistics; else running stats),
// NJ_AFFINE, NJ_RESIDUAL, NJ_RUNNING (update running stats), NJ_SAVE (write mean/rstd), NJ_CACHED,
// NJ_RESIDENT.
#include "common.cuh"
#define NJ_RING_TENSORS 1
#include "tile_ring.cuh"
#include "resident_split.cuh"

// Two-pass statistics of the vectors a thread holds: returns the group's (count, mean, m2).
__device__ __forceinline__ void tile_stats(const vec_t (&xr)[NJ_ITEMS], idx_t tile_begin, idx_t v_end, int lane,
                                           float* smem, float& count, float& mean, float& m2) {
  float s[1] = {0.f};
#pragma unroll
  for (int i = 0; i < NJ_ITEMS; ++i) {
    const idx_t v = tile_begin + (idx_t)i * NJ_GROUP + lane;
    if (v < v_end) {
#pragma unroll
      for (int k = 0; k < NJ_VEC; ++k) s[0] += vec_get(xr[i], k);
    }
  }
  group_sum<1>(s, smem);
  const idx_t vecs = v_end > tile_begin ? min((idx_t)NJ_GROUP * NJ_ITEMS, v_end - tile_begin) : 0;
  count = (float)(vecs * NJ_VEC);
  mean = count > 0.f ? s[0] / count : 0.f;
  float q[1] = {0.f};
#pragma unroll
  for (int i = 0; i < NJ_ITEMS; ++i) {
    const idx_t v = tile_begin + (idx_t)i * NJ_GROUP + lane;
    if (v < v_end) {
#pragma unroll
      for (int k = 0; k < NJ_VEC; ++k) {
        const float d = vec_get(xr[i], k) - mean;
        q[0] += d * d;
      }
    }
  }
  group_sum<1>(q, smem);
  m2 = q[0];
}

// Adds one tile's values to a thread's running (n, mean, M2): two-pass over the registers, then
// Chan-merged, so it stays exact when mean >> std.
__device__ __forceinline__ void thread_tile_stats(const vec_t (&xr)[NJ_ITEMS], idx_t tile_begin, idx_t v_end,
                                                  int lane, float& n, float& mean, float& m2) {
  float s = 0.f, c = 0.f;
#pragma unroll
  for (int i = 0; i < NJ_ITEMS; ++i) {
    if (tile_begin + (idx_t)i * NJ_GROUP + lane < v_end) {
      c += (float)NJ_VEC;
#pragma unroll
      for (int k = 0; k < NJ_VEC; ++k) s += vec_get(xr[i], k);
    }
  }
  if (c == 0.f) return;
  const float tile_mean = s / c;
  float q = 0.f;
#pragma unroll
  for (int i = 0; i < NJ_ITEMS; ++i) {
    if (tile_begin + (idx_t)i * NJ_GROUP + lane < v_end) {
#pragma unroll
      for (int k = 0; k < NJ_VEC; ++k) {
        const float d = vec_get(xr[i], k) - tile_mean;
        q += d * d;
      }
    }
  }
  chan_merge(n, mean, m2, c, tile_mean, q);
}

__device__ __forceinline__ void load_tile(const NjParams& p, const Unit& u, idx_t tile_begin, int lane,
                                          vec_t (&xr)[NJ_ITEMS]) {
#pragma unroll
  for (int i = 0; i < NJ_ITEMS; ++i) {
    const idx_t v = tile_begin + (idx_t)i * NJ_GROUP + lane;
    xr[i] = v < u.v_end ? load_vec(p.x, u.base + v * NJ_VEC) : zero_vec();
  }
}

// The next tile of a streamed pass: from the ring (in flight for a while already), else loaded now.
__device__ __forceinline__ void stream_tile(const NjParams& p, TileRing& ring, const Unit& u, idx_t t, int lane,
                                            vec_t (&xr)[NJ_ITEMS]) {
#if NJ_RING
  (void)u, (void)t, (void)lane;
  ring_take(p, ring, xr, nullptr, nullptr);
#else
  (void)ring;
  load_tile(p, u, t, lane, xr);
#endif
}

// y for the vectors of one tile held in xr.
__device__ __forceinline__ void normalize_tile(const NjParams& p, const Unit& u, idx_t tile_begin, int lane,
                                               const vec_t (&xr)[NJ_ITEMS], float mean, float scale, float shift) {
#pragma unroll
  for (int i = 0; i < NJ_ITEMS; ++i) {
    const idx_t v = tile_begin + (idx_t)i * NJ_GROUP + lane;
    if (v < u.v_end) {
      const idx_t e = u.base + v * NJ_VEC;
#if NJ_RESIDUAL
      const vec_t r = load_vec(p.residual, e);
#endif
      vec_t out;
#pragma unroll
      for (int k = 0; k < NJ_VEC; ++k) {
        float z = (vec_get(xr[i], k) - mean) * scale + shift;
#if NJ_RESIDUAL
        z += vec_get(r, k);
#endif
        vec_set(out, k, activate(z, p.act_param));
      }
      store_vec(p.y, e, out);
    }
  }
}

// Every thread, once all partials of u's instance are published: the instance's (mean, M2) from
// its chunks' (mean_j, M2_j): mean = sum_j n_j mean_j / n, then M2 = sum_j (M2_j + n_j (mean_j -
// mean)^2). The CTA's threads read the partials in parallel and add them with group_sum's fixed
// tree: identical bits in every peer CTA. Leaves the exchange; returns the departure's ticket for
// exchange_leave_end after the output pass.
__device__ __forceinline__ unsigned merge_chunk_stats(const NjParams& p, const Unit& u, float* smem, float& mean,
                                                      float& m2) {
  const float* part = p.partials + 2 * u.instance * p.chunks;
  const float count = (float)p.spatial;
  float acc[1] = {0.f};
  for (int j = threadIdx.x; j < p.chunks; j += NJ_THREADS) acc[0] += chunk_count(p, j) * __ldcg(part + 2 * j);
  group_sum<1>(acc, smem);
  mean = acc[0] / count;
  acc[0] = 0.f;
  for (int j = threadIdx.x; j < p.chunks; j += NJ_THREADS) {
    const float d = __ldcg(part + 2 * j) - mean;
    acc[0] += __ldcg(part + 2 * j + 1) + chunk_count(p, j) * d * d;
  }
  group_sum<1>(acc, smem);
  m2 = acc[0];
  return exchange_depart_begin(p.counters, u.instance);
}

// The instance's rstd from its (mean, M2) over `count` elements; chunk 0 saves mean/rstd and
// leaves (mean, biased var) for the running-stats pass.
__device__ __forceinline__ float instance_rstd(const NjParams& p, const Unit& u, int lane, float mean, float m2,
                                               float count) {
  const float var = count > 0.f ? m2 / count : 0.f;
  const float rstd = rsqrtf(var + p.eps);
  if (u.active && u.chunk == 0 && lane == 0) {
#if NJ_SAVE
    p.save_mean[u.instance] = mean;
    p.save_rstd[u.instance] = rstd;
#endif
#if NJ_RUNNING
    p.scratch[2 * u.instance] = mean;
    p.scratch[2 * u.instance + 1] = var;
#endif
  }
  (void)p, (void)mean;
  return rstd;
}

// u's channel's weight and bias (1 and 0 without affine; 0 and 0 for an inactive unit).
struct Affine {
  float w, b;
};
__device__ __forceinline__ Affine load_affine(const NjParams& p, const Unit& u) {
#if NJ_AFFINE
  return {u.active ? load_weight(p.weight, u.channel) : 0.f, u.active ? load_weight(p.bias, u.channel) : 0.f};
#else
  (void)p, (void)u;
  return {1.f, 0.f};
#endif
}

// y = z * scale + shift before the residual and activation, z = x - mean.
__device__ __forceinline__ void affine_scale_shift(const Affine& a, float rstd, float& scale, float& shift) {
  scale = rstd * a.w;
  shift = a.b;
}

#if NJ_RESIDENT
// The resident split's phases B and C (resident_split.cuh runs the pipeline).
__device__ __forceinline__ void forward_resident(const NjParams& p, float* smem, unsigned tag) {
  const void* src[1] = {p.x};
  struct NoContext {};
  resident_pipeline(
      p, src, [&](const Unit&) { return NoContext{}; }, [&](const Unit& u) { return load_affine(p, u); },
      [&](const Unit& u, idx_t step, NoContext) {
        // B: the statistics of the chunk that landed, two-pass in registers, to its peers.
        vec_t xr[NJ_ITEMS];
        resident_take_landed(step, xr, nullptr, nullptr);
        nj_phase_mark(kPhaseBWait);
        float tn = 0.f, tmean = 0.f, tm2 = 0.f, mean, m2;
        thread_tile_stats(xr, u.v_begin, u.v_end, threadIdx.x, tn, tmean, tm2);
        group_merge_stats(tn, tmean, tm2, chunk_count(p, u.chunk), smem, mean, m2);
        if (threadIdx.x == 0) resident_publish(p, u, tag, mean, m2);
        nj_phase_mark(kPhaseBReduce);
      },
      [&](const Unit& u, idx_t step, const TaggedPair& peek, const Affine& affine, auto slot_read) {
        // C: the instance's (mean, M2) from its chunks' (thread j holds chunk j's) in one CTA
        // sum about chunk 0's mean (shifted_add in common.cuh). Then the output of the chunk,
        // from its slot, read first so that those reads overlap the poll and the barriers (and
        // with p.early_refill the slot refilled at once).
        vec_t xr[NJ_ITEMS];
        resident_take(step, xr, nullptr, nullptr);
        slot_read();
        nj_phase_mark(kPhaseCTake);
        float mean_j, m2_j;
        resident_settle(p, u, tag, peek, mean_j, m2_j);
        const float k = resident_settle_first(p, u, tag, peek.first);
        nj_phase_mark(kPhaseCPoll);
        const float n_j = threadIdx.x < p.chunks ? chunk_count(p, (int)threadIdx.x) : 0.f;
        float acc[2] = {0.f, 0.f};
        shifted_add(n_j, mean_j, m2_j, k, acc[0], acc[1]);
        group_sum<2>(acc, smem);
        nj_phase_mark(kPhaseCMerge);
        float mean, m2;
        shifted_result(k, acc[0], acc[1], p.inv_spatial, mean, m2);
        float scale, shift;
        affine_scale_shift(affine, instance_rstd(p, u, threadIdx.x, mean, m2, (float)p.spatial), scale, shift);
        normalize_tile(p, u, u.v_begin, threadIdx.x, xr, mean, scale, shift);
        nj_phase_mark(kPhaseCWrite);
      });
}
#endif

#if !NJ_RESIDENT
// Rounds of units: every group loads (or streams) its chunk, reduces, exchanges with its peers and
// writes, round after round.
__device__ __forceinline__ void forward_rounds(const NjParams& p, float* smem) {
  const int lane = threadIdx.x % NJ_GROUP;
  constexpr idx_t kTile = (idx_t)NJ_GROUP * NJ_ITEMS;
  TileRing ring;
#if NJ_RING
  ring_start(p, ring, p.x, nullptr, nullptr);
#endif

  for (idx_t round = 0; round_has_units(p, round); ++round) {
    const Unit u = make_unit(p, round);
    const Affine affine = load_affine(p, u);  // issued before the reductions' barriers: off the chain
    float mean, rstd;
    unsigned leave_ticket = kNoTicket;
#if NJ_TRAIN
#if NJ_CACHED
    vec_t xr[NJ_ITEMS];
    load_tile(p, u, u.v_begin, lane, xr);
    float count, m2;
    tile_stats(xr, u.v_begin, u.v_end, lane, smem, count, mean, m2);
#else
    // Streamed: each thread keeps running statistics of the tiles it reads; the CTA combines
    // them once per chunk.
    float tn = 0.f, tmean = 0.f, tm2 = 0.f;
    for (idx_t t = u.v_begin; t < u.v_end; t += kTile) {
      vec_t xr[NJ_ITEMS];
      stream_tile(p, ring, u, t, lane, xr);
      thread_tile_stats(xr, t, u.v_end, lane, tn, tmean, tm2);
    }
#if NJ_RING
    ring_prefetch_next_round(p, ring, round);
#endif
    float count = (float)((u.v_end - u.v_begin) * NJ_VEC), m2;
    group_merge_stats(tn, tmean, tm2, count, smem, mean, m2);
#endif
    if (NJ_NCDHW_SPLITS && p.chunks > 1 && u.active) {
      exchange_cta_publish_and_wait(p.counters, u.instance, p.partials, u.instance * p.chunks + u.chunk, mean, m2,
                                    p.chunks);
      leave_ticket = merge_chunk_stats(p, u, smem, mean, m2);
      count = (float)p.spatial;
    }
    rstd = instance_rstd(p, u, lane, mean, m2, count);
#else   // eval: running statistics
    mean = u.active ? p.running_mean[u.channel] : 0.f;
    rstd = u.active ? rsqrtf(p.running_var[u.channel] + p.eps) : 0.f;
#endif

    float scale, shift;
    affine_scale_shift(affine, rstd, scale, shift);

#if NJ_TRAIN && NJ_CACHED
    normalize_tile(p, u, u.v_begin, lane, xr, mean, scale, shift);
#else
    for (idx_t t = u.v_begin; t < u.v_end; t += kTile) {
      vec_t xr[NJ_ITEMS];
      stream_tile(p, ring, u, t, lane, xr);
      normalize_tile(p, u, t, lane, xr, mean, scale, shift);
    }
#endif
    exchange_leave_end(p.counters, u.instance, p.chunks, leave_ticket);
  }

  ring_finish();
}
#endif

extern "C" __global__ void __launch_bounds__(NJ_THREADS, NJ_MIN_BLOCKS)
normjit_instance_norm_forward(const __grid_constant__ NjParams p) {
  __shared__ float smem[NJ_WARPS > 0 ? 2 * NJ_WARPS : 1];  // group_sum<2>
  __shared__ bool last_flag;
#if NJ_RESIDENT
  const unsigned tag = resident_tag(p);
  forward_resident(p, smem, tag);
  // The last CTA: running statistics, and the exchange's generation for the next launch.
  if (last_cta_arrive(grid_counter(p), &last_flag)) {
#if NJ_RUNNING
    update_running_stats(p);
#endif
    resident_advance_generation(p, tag);
    last_cta_done(grid_counter(p));
  }
#else
  forward_rounds(p, smem);
#if NJ_TRAIN && NJ_RUNNING
  finish_running_stats(p, &last_flag);
#else
  (void)last_flag;
#endif
#endif
}
