// Instance-norm backward, NCDHW, training mode (the statistics came from the input).
//
// With xhat = (x - mean) * rstd, z = xhat * w + b [+ residual] and y = act(z):
//   g   = dy * act'(z)                       (z is recomputed from x: nothing extra is saved)
//   dx  = rstd * w * (g - mean(g) - xhat * mean(g * xhat))
//   dresidual = g;  dweight[c] = sum_n sum(g * xhat);  dbias[c] = sum_n sum(g)
// Per instance we need sum(g) and sum(g * xhat); like the forward, a chunk's x and dy stay in
// registers (NJ_CACHED; with NJ_SHARED_DY, dy in shared memory) or are streamed twice, and split
// instances merge partial sums in chunk order (or, with NJ_RESIDENT, stay in shared memory in a
// pipeline of chunks: resident_split.cuh, backward_resident below). dweight/dbias are reduced over
// N in a fixed order: by the CTA that holds all N samples of a channel (channel_major), by the
// channel's cluster (NJ_CLUSTER), else by the last CTA. No atomics on floats, the same bits on
// every run.
#include "common.cuh"

#if NJ_CLUSTER && (!NJ_AFFINE || !NJ_CACHED || NJ_GROUP != NJ_THREADS || NJ_INDEX64)
#error "NJ_CLUSTER: the NCDHW backward with weight gradients, one instance held in a CTA's registers, 32-bit"
#endif

struct BwdContext {
  float mean, rstd, w, b;
};

// g = dy * act'(z) for element k of vector i.
__device__ __forceinline__ float grad_at(const BwdContext& s, float x, float dy, float res, float act_param) {
#if NJ_ACT == 0
  (void)s, (void)x, (void)res, (void)act_param;
  return dy;
#else
  float z = (x - s.mean) * s.rstd * s.w + s.b;
#if NJ_RESIDUAL
  z += res;
#endif
  return dy * activate_grad(z, act_param);
#endif
}

#if NJ_ACT != 0 && NJ_RESIDUAL
#define NJ_NEEDS_RESIDUAL 1
#else
#define NJ_NEEDS_RESIDUAL 0
#endif

// NJ_SHARED_DY: a register tier (NJ_CACHED) whose CTA keeps its instance's x in registers and dy
// in one stage of shared-memory slots (smem_slots.cuh), filled by cp.async. Why: holding both in
// registers caps the backward at 128 registers a thread, so the tier of 512 x 8 vectors runs one
// CTA an SM, and (2,128,32^3)'s 256 instances take two waves in which a CTA's stores never overlap
// the next one's loads. A CTA of 256 x 16 vectors with dy in 64 KB of shared memory fits two an SM:
// one wave (heuristics.cpp, shared_dy_tier_fits).
#define NJ_SHARED_DY (NJ_CACHED && NJ_STAGES > 0)
#if NJ_SHARED_DY
#if NJ_NEEDS_RESIDUAL || NJ_GROUP != NJ_THREADS || NJ_STAGES != 1
#error "NJ_SHARED_DY: dy alone in one stage of slots, a CTA an instance"
#endif
#define NJ_RING_TENSORS 1  // the slots hold dy
static_assert(sizeof(vec_t) == 16, "NJ_SHARED_DY: the slots move 16-byte vectors");
#elif NJ_NEEDS_RESIDUAL
#define NJ_RING_TENSORS 3
#else
#define NJ_RING_TENSORS 2
#endif
#include "tile_ring.cuh"
#include "resident_split.cuh"

struct BwdTile {
  vec_t x[NJ_ITEMS];
#if !NJ_SHARED_DY
  vec_t dy[NJ_ITEMS];
#endif
#if NJ_NEEDS_RESIDUAL
  vec_t res[NJ_ITEMS];
#endif
};

// Vector i of this thread's dy in tile t: from registers, or (NJ_SHARED_DY) from its slot.
__device__ __forceinline__ vec_t dy_at(const BwdTile& t, int i) {
#if NJ_SHARED_DY
  (void)t;
  return *reinterpret_cast<const vec_t*>(nj_ring + slot_offset(0, 0, i));
#else
  return t.dy[i];
#endif
}

__device__ __forceinline__ void load_bwd_tile(const NjParams& p, const Unit& u, idx_t tile_begin, int lane,
                                              BwdTile& t) {
#if NJ_SHARED_DY
  // dy's copies first, so that they and x's loads are in flight together. Each thread reads back
  // only its own slots (the previous round's reads are done: program order), so no CTA barrier.
  const void* dy_src[1] = {p.dy};
  slots_copy_tile(dy_src, u.base, tile_begin, u.v_end, true, 0);
  nj_cp_async_commit();
#endif
#pragma unroll
  for (int i = 0; i < NJ_ITEMS; ++i) {
    const idx_t v = tile_begin + (idx_t)i * NJ_GROUP + lane;
    const bool in = v < u.v_end;
    const idx_t e = u.base + v * NJ_VEC;
    t.x[i] = in ? load_vec(p.x, e) : zero_vec();
#if !NJ_SHARED_DY
    t.dy[i] = in ? load_vec(p.dy, e) : zero_vec();
#endif
#if NJ_NEEDS_RESIDUAL
    t.res[i] = in ? load_vec(p.residual, e) : zero_vec();
#endif
  }
#if NJ_SHARED_DY
  nj_cp_async_wait<0>();
#endif
}

// The next tile of a streamed pass: from the ring (in flight for a while already), else loaded now.
__device__ __forceinline__ void stream_bwd_tile(const NjParams& p, TileRing& ring, const Unit& u, idx_t tb, int lane,
                                                BwdTile& t) {
#if NJ_RING
  (void)u, (void)tb, (void)lane;
#if NJ_NEEDS_RESIDUAL
  ring_take(p, ring, t.x, t.dy, t.res);
#else
  ring_take(p, ring, t.x, t.dy, nullptr);
#endif
#else
  (void)ring;
  load_bwd_tile(p, u, tb, lane, t);
#endif
}

__device__ __forceinline__ float res_at(const BwdTile& t, int i, int k) {
#if NJ_NEEDS_RESIDUAL
  return vec_get(t.res[i], k);
#else
  (void)t, (void)i, (void)k;
  return 0.f;
#endif
}

// Adds this thread's contributions to sum(g) and sum(g * xhat).
__device__ __forceinline__ void accumulate_tile(const NjParams& p, const BwdContext& s, idx_t tile_begin, idx_t v_end,
                                                int lane, const BwdTile& t, float (&sums)[2]) {
#pragma unroll
  for (int i = 0; i < NJ_ITEMS; ++i) {
    const idx_t v = tile_begin + (idx_t)i * NJ_GROUP + lane;
    if (v < v_end) {
      const vec_t dy = dy_at(t, i);
#pragma unroll
      for (int k = 0; k < NJ_VEC; ++k) {
        const float x = vec_get(t.x[i], k);
        const float g = grad_at(s, x, vec_get(dy, k), res_at(t, i, k), p.act_param);
        sums[0] += g;
        sums[1] += g * ((x - s.mean) * s.rstd);
      }
    }
  }
}

// Stores dx (and d(residual)) of this thread's vectors of a tile: element k of vector i is
// dx_of(i, k, g), which also sets g, the gradient at the pre-activation (d(residual)).
template <class DxOf>
__device__ __forceinline__ void store_dx_tile(const NjParams& p, const Unit& u, idx_t tile_begin, int lane,
                                              DxOf dx_of) {
#pragma unroll
  for (int i = 0; i < NJ_ITEMS; ++i) {
    const idx_t v = tile_begin + (idx_t)i * NJ_GROUP + lane;
    if (v < u.v_end) {
      const idx_t e = u.base + v * NJ_VEC;
      vec_t dx;
#if NJ_RESIDUAL
      vec_t dres;
#endif
#pragma unroll
      for (int k = 0; k < NJ_VEC; ++k) {
        float g;
        vec_set(dx, k, dx_of(i, k, g));
#if NJ_RESIDUAL
        vec_set(dres, k, g);
#endif
      }
      store_vec(p.y, e, dx);
#if NJ_RESIDUAL
      if (p.dresidual) store_vec(p.dresidual, e, dres);
#endif
    }
  }
}

__device__ __forceinline__ void write_dx_tile(const NjParams& p, const Unit& u, const BwdContext& s, idx_t tile_begin,
                                              int lane, const BwdTile& t, float mean_g, float mean_gx) {
  const float k_scale = s.rstd * s.w;
  vec_t dy;
  store_dx_tile(p, u, tile_begin, lane, [&](int i, int k, float& g) {
    if (k == 0) dy = dy_at(t, i);  // one 16-byte read a vector (the loops are unrolled)
    const float x = vec_get(t.x[i], k);
    g = grad_at(s, x, vec_get(dy, k), res_at(t, i, k), p.act_param);
    const float xhat = (x - s.mean) * s.rstd;
    return k_scale * (g - mean_g - xhat * mean_gx);
  });
}

// dweight[c] and dbias[c] straight from this round's groups when units walk channel by channel
// (p.channel_major: the host guarantees one chunk per instance and groups per CTA a multiple of N,
// so the CTA holds all N samples of each of its channels): summed over n in order, like
// finish_weight_grads, with no grid-wide pass. `buf` is 2 floats per group of shared memory.
__device__ __forceinline__ void channel_weight_grads(const NjParams& p, idx_t round, int lane, const float (&sums)[2],
                                                     float* buf) {
  const int g = threadIdx.x / NJ_GROUP;
  if (lane == 0) buf[2 * g] = sums[0], buf[2 * g + 1] = sums[1];
  __syncthreads();
  const int first = threadIdx.x * (int)p.N;  // this thread's channel: groups first .. first + N - 1
  const idx_t unit = round * gridDim.x * NJ_GROUPS_PER_CTA + (idx_t)blockIdx.x * NJ_GROUPS_PER_CTA + first;
  if (first < NJ_GROUPS_PER_CTA && unit < p.N * p.C) {
    float sg = 0.f, sgx = 0.f;
    for (int n = 0; n < (int)p.N; ++n) sg += buf[2 * (first + n)], sgx += buf[2 * (first + n) + 1];
    const idx_t c = unit / p.N;
    if (p.dweight) p.dweight[c] = sgx;
    if (p.dbias) p.dbias[c] = sg;
  }
  __syncthreads();  // buf is rewritten by the next round
}

#if NJ_CLUSTER
// dweight/dbias of a channel whose N samples' CTAs form one thread-block cluster (sm_90;
// heuristics ncdhw_cluster_fits: one instance a CTA, one round, units in channel-major order, so
// the cluster's index is the channel and its rank the sample). Thread 0 of each rank pushes the
// instance's (sum g, sum g * xhat) into rank 0's inbox with st.async, whose bytes count down rank
// 0's inbox barrier; rank 0 alone waits, adds the N pairs in sample order (the order, and so the
// bits, of the last CTA's pass this replaces) and writes them. The channels-last tiers' way
// (instance_norm_nhwc.cuh, cluster_weight_grads), with one channel a CTA.
__shared__ __align__(8) float nj_ncdhw_inbox[NJ_MAX_CLUSTER_RANKS][2];  // rank 0's is used
__shared__ __align__(8) unsigned long long nj_ncdhw_inbox_bar;

// Every thread of every rank calls it once, behind its instance's loads: arms the inbox barrier
// for the N ranks' pairs and announces the CTA's start (cluster_started publishes the barrier).
__device__ __forceinline__ void ncdhw_cluster_join(const NjParams& p) {
  if (threadIdx.x == 0) inbox_barrier_arm(&nj_ncdhw_inbox_bar, (unsigned)p.N * 2u * (unsigned)sizeof(float));
  cluster_started();
}

// Every thread of every rank calls it once, after ncdhw_cluster_join and the dx stores.
__device__ __forceinline__ void ncdhw_cluster_weight_grads(const NjParams& p, const Unit& u, const float (&sums)[2]) {
  const unsigned rank = cluster_rank();
  cluster_wait();  // every rank has joined, so rank 0's inbox and barrier exist
  if (threadIdx.x != 0) return;
  store_cluster_async(nj_ncdhw_inbox[rank], &nj_ncdhw_inbox_bar, 0, make_float2(sums[0], sums[1]));
  if (rank != 0) return;
  inbox_barrier_wait(&nj_ncdhw_inbox_bar);  // every rank's pair has arrived
  float sg = 0.f, sgx = 0.f;
  for (int n = 0; n < (int)p.N; ++n) sg += nj_ncdhw_inbox[n][0], sgx += nj_ncdhw_inbox[n][1];
  if (p.dweight) p.dweight[u.channel] = sgx;
  if (p.dbias) p.dbias[u.channel] = sg;
}
#endif

// The saved statistics and affine parameters of u's instance.
__device__ __forceinline__ BwdContext bwd_context(const NjParams& p, const Unit& u) {
  BwdContext s;
  s.mean = u.active ? p.save_mean[u.instance] : 0.f;
  s.rstd = u.active ? p.save_rstd[u.instance] : 0.f;
#if NJ_AFFINE
  s.w = u.active ? load_weight(p.weight, u.channel) : 0.f;
  s.b = u.active ? load_weight(p.bias, u.channel) : 0.f;
#else
  s.w = 1.f, s.b = 0.f;
#endif
  return s;
}

// Chunk 0 of an instance leaves its (sum g, sum g * xhat) for the dweight/dbias pass.
__device__ __forceinline__ void keep_weight_sums(const NjParams& p, const Unit& u, int lane, const float (&sums)[2]) {
#if NJ_AFFINE
  if (u.active && u.chunk == 0 && lane == 0 && (p.dweight || p.dbias)) {
    p.scratch[2 * u.instance] = sums[0];
    p.scratch[2 * u.instance + 1] = sums[1];
  }
#else
  (void)p, (void)u, (void)lane, (void)sums;
#endif
}

// This thread's vectors of one slot of the resident split (resident_split.cuh) into t.
#if NJ_RESIDENT
__device__ __forceinline__ void resident_take_tile(idx_t step, bool landed, BwdTile& t) {
#if NJ_NEEDS_RESIDUAL
  vec_t* res = t.res;
#else
  vec_t* res = nullptr;
#endif
  if (landed)
    resident_take_landed(step, t.x, t.dy, res);
  else
    resident_take(step, t.x, t.dy, res);
}

// Phase C's per-element terms that do not need the instance's sums, computed before the poll so
// that the arithmetic overlaps it and only a subtract and an FMA an element follow the barrier:
// dx = k g - k mean_g - (k xhat) mean_gx, with k = rstd w (write_dx_tile's k_scale).
struct DxTerms {
  float kg[NJ_ITEMS][NJ_VEC], kxhat[NJ_ITEMS][NJ_VEC];
#if NJ_RESIDUAL
  float g[NJ_ITEMS][NJ_VEC];  // d(residual)
#endif
};

__device__ __forceinline__ void dx_terms(const NjParams& p, const BwdContext& s, const BwdTile& t, DxTerms& d) {
  const float k_scale = s.rstd * s.w;
#pragma unroll
  for (int i = 0; i < NJ_ITEMS; ++i) {
#pragma unroll
    for (int k = 0; k < NJ_VEC; ++k) {
      const float x = vec_get(t.x[i], k);
      const float g = grad_at(s, x, vec_get(t.dy[i], k), res_at(t, i, k), p.act_param);
      d.kg[i][k] = k_scale * g;
      d.kxhat[i][k] = k_scale * ((x - s.mean) * s.rstd);
#if NJ_RESIDUAL
      d.g[i][k] = g;
#endif
    }
  }
}

__device__ __forceinline__ void write_dx_terms(const NjParams& p, const Unit& u, const BwdContext& s,
                                               const DxTerms& d, float mean_g, float mean_gx) {
  const float k_mean_g = s.rstd * s.w * mean_g;
  store_dx_tile(p, u, u.v_begin, (int)threadIdx.x, [&](int i, int k, float& g) {
#if NJ_RESIDUAL
    g = d.g[i][k];
#else
    g = 0.f;
#endif
    return (d.kg[i][k] - k_mean_g) - d.kxhat[i][k] * mean_gx;
  });
}

// The resident split's phases B and C (resident_split.cuh runs the pipeline).
__device__ __forceinline__ void backward_resident(const NjParams& p, float* smem, unsigned tag) {
  const void* src[3] = {p.x, p.dy, p.residual};
  auto context = [&](const Unit& u) { return bwd_context(p, u); };
  resident_pipeline(
      p, src, context, context,
      [&](const Unit& u, idx_t step, const BwdContext& s) {
        // B: the chunk's (sum g, sum g * xhat), to its peers.
        BwdTile t;
        resident_take_tile(step, true, t);
        nj_phase_mark(kPhaseBWait);
        float sums[2] = {0.f, 0.f};
        accumulate_tile(p, s, u.v_begin, u.v_end, threadIdx.x, t, sums);
        group_sum<2>(sums, smem);
        if (threadIdx.x == 0) resident_publish(p, u, tag, sums[0], sums[1]);
        nj_phase_mark(kPhaseBReduce);
      },
      [&](const Unit& u, idx_t step, const TaggedPair& peek, const BwdContext& s, auto slot_read) {
        // C: the chunk from its slot (with p.early_refill refilled at once) and its terms of dx,
        // first, so that those reads and that arithmetic overlap the poll and the barrier behind
        // it; the instance's sums (thread j holds chunk j's, added in group_sum's fixed tree); dx
        // of the chunk.
        DxTerms d;
        {
          BwdTile t;
          resident_take_tile(step, false, t);
          slot_read();
          dx_terms(p, s, t, d);
        }
        nj_phase_mark(kPhaseCTake);
        float sums[2];
        resident_settle(p, u, tag, peek, sums[0], sums[1]);
        nj_phase_mark(kPhaseCPoll);
        group_sum<2>(sums, smem);
        nj_phase_mark(kPhaseCMerge);
        keep_weight_sums(p, u, threadIdx.x, sums);
        write_dx_terms(p, u, s, d, sums[0] * p.inv_spatial, sums[1] * p.inv_spatial);
        nj_phase_mark(kPhaseCWrite);
      });
}
#endif

#if !NJ_RESIDENT
// Rounds of units: every group loads (or streams) its chunk, sums, exchanges with its peers and
// writes dx, round after round.
__device__ __forceinline__ void backward_rounds(const NjParams& p, float* smem, float* merged, float* channel_sums) {
  const int lane = threadIdx.x % NJ_GROUP;
  constexpr idx_t kTile = (idx_t)NJ_GROUP * NJ_ITEMS;
  TileRing ring;
#if NJ_RING
  ring_start(p, ring, p.x, p.dy, p.residual);
#endif

  for (idx_t round = 0; round_has_units(p, round); ++round) {
    const Unit u = make_unit(p, round);
    const BwdContext s = bwd_context(p, u);
    float sums[2] = {0.f, 0.f};
#if NJ_CACHED
    BwdTile t;
    load_bwd_tile(p, u, u.v_begin, lane, t);
#if NJ_CLUSTER
    ncdhw_cluster_join(p);  // behind the loads, as the channels-last tiers' cluster_join
#endif
    accumulate_tile(p, s, u.v_begin, u.v_end, lane, t, sums);
    group_sum<2>(sums, smem);
#else
    for (idx_t tb = u.v_begin; tb < u.v_end; tb += kTile) {
      BwdTile t;
      stream_bwd_tile(p, ring, u, tb, lane, t);
      accumulate_tile(p, s, tb, u.v_end, lane, t, sums);
    }
#if NJ_RING
    ring_prefetch_next_round(p, ring, round);
#endif
    group_sum<2>(sums, smem);
#endif
    unsigned leave_ticket = kNoTicket;
    if (NJ_NCDHW_SPLITS && p.chunks > 1 && u.active)
      leave_ticket = exchange_sum_partials(p, u, sums[0], sums[1], merged);  // the instance's sums
#if NJ_AFFINE && !NJ_CLUSTER
    if (p.channel_major) {
      channel_weight_grads(p, round, lane, sums, channel_sums);
    } else {
      keep_weight_sums(p, u, lane, sums);
    }
#else
    (void)channel_sums;
#endif
    const float mean_g = sums[0] * p.inv_spatial, mean_gx = sums[1] * p.inv_spatial;
#if NJ_CACHED
    write_dx_tile(p, u, s, u.v_begin, lane, t, mean_g, mean_gx);
#else
    for (idx_t tb = u.v_begin; tb < u.v_end; tb += kTile) {
      BwdTile t;
      stream_bwd_tile(p, ring, u, tb, lane, t);
      write_dx_tile(p, u, s, tb, lane, t, mean_g, mean_gx);
    }
#endif
    exchange_leave_end(p.counters, u.instance, p.chunks, leave_ticket);
#if NJ_CLUSTER
    ncdhw_cluster_weight_grads(p, u, sums);  // after the dx stores, which it does not wait for
#endif
  }

  ring_finish();
}
#endif

extern "C" __global__ void __launch_bounds__(NJ_THREADS, NJ_MIN_BLOCKS)
normjit_instance_norm_backward(const __grid_constant__ NjParams p) {
  __shared__ float smem[2 * (NJ_WARPS > 0 ? NJ_WARPS : 1)];
  __shared__ float merged[2];
  __shared__ float channel_sums[2 * NJ_GROUPS_PER_CTA];
  __shared__ bool last_flag;
#if NJ_RESIDENT
  (void)channel_sums, (void)merged;
  const unsigned tag = resident_tag(p);
  backward_resident(p, smem, tag);
  // The last CTA: dweight/dbias, and the exchange's generation for the next launch.
  if (last_cta_arrive(grid_counter(p), &last_flag)) {
#if NJ_AFFINE
    update_weight_grads(p);
#endif
    resident_advance_generation(p, tag);
    last_cta_done(grid_counter(p));
  }
#else
  backward_rounds(p, smem, merged, channel_sums);
#if NJ_AFFINE
  if (!p.channel_major) finish_weight_grads(p, &last_flag);
#else
  (void)last_flag;
#endif
#endif
}
