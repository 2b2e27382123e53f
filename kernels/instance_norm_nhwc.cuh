// Instance norm, forward and backward, for channels-last tensors (NDHWC: the channels of one
// spatial position are contiguous), read and written in place: no layout copies.
//
// A CTA owns a tile of TC = lanes * NJ_VEC channels of one sample n and a chunk of spatial
// positions. Its threads form rows x lanes: a thread loads NJ_VEC neighbouring channels (one
// vector) at NJ_ITEMS positions, so a warp reads whole rows of memory. Per-channel statistics are
// column sums: each thread's partials go through shared memory and are added in row order
// (deterministic). Like the NCDHW kernels, a chunk stays in registers (NJ_CACHED) or is streamed
// twice, and `chunks` CTAs split a long spatial range, exchanging per-channel partials. The
// "instance" of the exchange counters is the (n, channel tile) pair.
//
// The tile's geometry and column sums are in nhwc_tile.cuh, the split's exchange in
// nhwc_exchange.cuh; this file has the tile loads, the passes and the two kernels.
// Two bf16 elements to a 32-bit word (common.cuh's vec_t), but fp16 one to a register: packed,
// the fp16 backward with a residual spilled where it had not (ptxas, sm_90: 8 bytes a thread in
// the streamed tile loop with GELU, 24 in the cached tier), while bf16 spilled far less packed.
#define NJ_PACKED (NJ_DTYPE == 2 && NJ_VEC % 2 == 0)
#include "common.cuh"

#if NJ_BACKWARD
#define NJ_NSUM 2
#else
#define NJ_NSUM 1
#endif
// The tensors a stage of shared-memory slots holds (nhwc_ring.cuh): the forward's x (a residual
// is read where it is added); the kept backward's x and dy, and the residual where the activation's
// gradient reads it.
#if !NJ_BACKWARD
#define NJ_RING_TENSORS 1
#elif NJ_ACT != 0 && NJ_RESIDUAL
#define NJ_RING_TENSORS 3
#else
#define NJ_RING_TENSORS 2
#endif

#include "nhwc_tile.cuh"
#include "phase_clock.cuh"  // a measurement build's stamps (nothing unless NJ_PHASE_CLOCKS)
#include "nhwc_exchange.cuh"

// Whether this kernel may run as a split (chunks > 1) and so carries the exchange: the cached
// kernels are the tiers, one CTA per (sample, channel tile) unit, which never split (the host's
// launchable), nor do the cluster kernels (one unit a CTA). Compiled in, the exchange's code cost
// the deep tiers of (2,320,8^3) and (2,320,4^3) 126-128 registers a thread against 72-123 without
// it, and twice the compile time (ptxas, sm_90; docs/PERF_NOTES.md, session 26).
#define NJ_NHWC_SPLITS (!NJ_CACHED && !NJ_CLUSTER)

struct NhwcTile {
  vec_t x[NJ_ITEMS];
#if NJ_BACKWARD
  vec_t dy[NJ_ITEMS];
#if NJ_ACT != 0 && NJ_RESIDUAL
  vec_t res[NJ_ITEMS];
#endif
#endif
};

__device__ __forceinline__ void load_nhwc_tile(const NjParams& p, const TileUnit& u, idx_t t0, NhwcTile& t) {
  const int row = thread_row(u);
#pragma unroll
  for (int i = 0; i < NJ_ITEMS; ++i) {
    const idx_t s = t0 + row + (idx_t)i * tile_rows(u);
    const bool in = u.c_valid && s < u.s_end;
    const idx_t e = elem_at(p, u, s);
    t.x[i] = in ? load_vec(p.x, e) : zero_vec();
#if NJ_BACKWARD
    t.dy[i] = in ? load_vec(p.dy, e) : zero_vec();
#if NJ_ACT != 0 && NJ_RESIDUAL
    t.res[i] = in ? load_vec(p.residual, e) : zero_vec();
#endif
#endif
  }
}

// The tile order of a chunk's passes: tiles of rows * NJ_ITEMS positions. The output pass
// walks the chunk last tile first when p.reverse_output is set (the default): its first tiles are
// the ones the statistics pass read last, the likeliest to be still in L2 when a (sample, channel
// tile) unit exceeds it. Measured on the H200 (docs/PERF_NOTES.md): 7-8 % faster for
// (2,32,128^3) and (2,32,80,192,160), 19 MB less DRAM read.
__device__ __forceinline__ idx_t nhwc_unit_tiles(const TileUnit& u) {
  const idx_t kTile = (idx_t)tile_rows(u) * NJ_ITEMS;
  return (u.s_end - u.s_begin + kTile - 1) / kTile;
}

__device__ __forceinline__ idx_t nhwc_tile_begin(const NjParams& p, const TileUnit& u, idx_t k, idx_t tiles,
                                                 bool output_pass) {
  const idx_t kTile = (idx_t)tile_rows(u) * NJ_ITEMS;
  if (k >= tiles) return u.s_end;  // past the chunk: every load is predicated off
  return u.s_begin + (output_pass && p.reverse_output ? tiles - 1 - k : k) * kTile;
}

#include "nhwc_ring.cuh"

// Streams a chunk's tiles through `body(t0, tile)` in the pass's order: from the kept slots (the
// chunk held in shared memory from the statistics pass to the output pass), through the ring when
// the kernel has one (the streamed forward: the ring holds its tiles in flight), else loaded into
// registers, the next tile's loads in flight while `body` works on this one.
template <class Body>
__device__ __forceinline__ void nhwc_stream(const NjParams& p, NhwcRing& ring, const TileUnit& u, bool output_pass,
                                            Body body) {
  const idx_t tiles = nhwc_unit_tiles(u);
#if NJ_NHWC_KEPT
  // The statistics pass loads the chunk into the slots; the output pass reads it back from them.
  (void)ring;
  if (!output_pass) nhwc_kept_load(p, u);
#pragma unroll 1
  for (idx_t k = 0; k < tiles; ++k) {
    if (!output_pass) nhwc_kept_wait(k);
    NhwcTile t;
#if !NJ_BACKWARD
    slots_read((int)k, t.x, nullptr, nullptr);
#elif NJ_RING_TENSORS == 3
    slots_read((int)k, t.x, t.dy, t.res);
#else
    slots_read((int)k, t.x, t.dy, nullptr);
#endif
    body(nhwc_tile_begin(p, u, k, tiles, false), t);
  }
#elif NJ_NHWC_RING
  for (idx_t k = 0; k < tiles; ++k) {
    NhwcTile t;
    nhwc_ring_take(p, ring, t.x);
    body(nhwc_tile_begin(p, u, k, tiles, output_pass), t);
  }
#else
  (void)ring;
  NhwcTile t;
  load_nhwc_tile(p, u, nhwc_tile_begin(p, u, 0, tiles, output_pass), t);
  for (idx_t k = 0; k < tiles; ++k) {
    NhwcTile next;
    load_nhwc_tile(p, u, nhwc_tile_begin(p, u, k + 1, tiles, output_pass), next);
    body(nhwc_tile_begin(p, u, k, tiles, output_pass), t);
    t = next;
  }
#endif
}

__device__ __forceinline__ float nhwc_res(const NhwcTile& t, int i, int j) {
#if NJ_BACKWARD && NJ_ACT != 0 && NJ_RESIDUAL
  return vec_get(t.res[i], j);
#else
  (void)t, (void)i, (void)j;
  return 0.f;
#endif
}

// Per-channel affine parameters of this thread's vector.
struct ChannelParams {
  float mean[NJ_VEC], rstd[NJ_VEC], w[NJ_VEC], b[NJ_VEC];
};

__device__ __forceinline__ void load_affine(const NjParams& p, const TileUnit& u, ChannelParams& cp) {
#pragma unroll
  for (int j = 0; j < NJ_VEC; ++j) {
#if NJ_AFFINE
    cp.w[j] = u.c_valid ? load_weight(p.weight, slot_channel(p, u, j)) : 0.f;
    cp.b[j] = u.c_valid ? load_weight(p.bias, slot_channel(p, u, j)) : 0.f;
#else
    cp.w[j] = 1.f, cp.b[j] = 0.f;
#endif
  }
}

#if !NJ_BACKWARD
// ------------------------------------------------------------------------------------- forward
__device__ __forceinline__ void nhwc_tile_stats(const TileUnit& u, idx_t t0, const NhwcTile& t, float* smem,
                                                float (&count)[1], float (&mean)[NJ_VEC], float (&m2)[NJ_VEC]) {
  const int row = thread_row(u);
  float s[1][NJ_VEC];
#pragma unroll
  for (int j = 0; j < NJ_VEC; ++j) s[0][j] = 0.f;
#pragma unroll
  for (int i = 0; i < NJ_ITEMS; ++i)
    if (t0 + row + (idx_t)i * tile_rows(u) < u.s_end)
#pragma unroll
      for (int j = 0; j < NJ_VEC; ++j) s[0][j] += vec_get(t.x[i], j);
  column_sum<1>(u, s, smem);
  const idx_t rows = u.s_end > t0 ? min((idx_t)tile_rows(u) * NJ_ITEMS, u.s_end - t0) : 0;
  count[0] = (float)rows;
  const float inv_rows = rows > 0 ? 1.f / count[0] : 0.f;
#pragma unroll
  for (int j = 0; j < NJ_VEC; ++j) mean[j] = s[0][j] * inv_rows;
  float q[1][NJ_VEC];
#pragma unroll
  for (int j = 0; j < NJ_VEC; ++j) q[0][j] = 0.f;
#pragma unroll
  for (int i = 0; i < NJ_ITEMS; ++i)
    if (t0 + row + (idx_t)i * tile_rows(u) < u.s_end)
#pragma unroll
      for (int j = 0; j < NJ_VEC; ++j) {
        const float d = vec_get(t.x[i], j) - mean[j];
        q[0][j] += d * d;
      }
  column_sum<1>(u, q, smem);
#pragma unroll
  for (int j = 0; j < NJ_VEC; ++j) m2[j] = q[0][j];
}

// Adds one tile's rows to a thread's running per-channel (n, mean, M2): two-pass over the
// registers, then Chan-merged (n is the same for every channel of the thread's vector).
__device__ __forceinline__ void nhwc_thread_tile_stats(const TileUnit& u, idx_t t0, const NhwcTile& t, float& n,
                                                       float (&mean)[NJ_VEC], float (&m2)[NJ_VEC]) {
  const int row = thread_row(u);
  float c = 0.f, s[NJ_VEC];
#pragma unroll
  for (int j = 0; j < NJ_VEC; ++j) s[j] = 0.f;
#pragma unroll
  for (int i = 0; i < NJ_ITEMS; ++i)
    if (t0 + row + (idx_t)i * tile_rows(u) < u.s_end) {
      c += 1.f;
#pragma unroll
      for (int j = 0; j < NJ_VEC; ++j) s[j] += vec_get(t.x[i], j);
    }
  if (c == 0.f) return;
  const float inv_c = 1.f / c, wb = c / (n + c);  // shared by the vector's channels
#pragma unroll
  for (int j = 0; j < NJ_VEC; ++j) {
    const float tile_mean = s[j] * inv_c;
    float q = 0.f;
#pragma unroll
    for (int i = 0; i < NJ_ITEMS; ++i)
      if (t0 + row + (idx_t)i * tile_rows(u) < u.s_end) {
        const float d = vec_get(t.x[i], j) - tile_mean;
        q += d * d;
      }
    chan_merge_weighted(n, wb, mean[j], m2[j], tile_mean, q);
  }
  n += c;
}

// The CTA's per-channel (mean, M2) over `count` rows from the threads' running statistics: two
// column sums per chunk (see group_merge_stats in common.cuh).
__device__ __forceinline__ void nhwc_merge_thread_stats(const TileUnit& u, float n, const float (&tmean)[NJ_VEC],
                                                        const float (&tm2)[NJ_VEC], float count, float* smem,
                                                        float (&mean)[NJ_VEC], float (&m2)[NJ_VEC]) {
  float acc[1][NJ_VEC];
#pragma unroll
  for (int j = 0; j < NJ_VEC; ++j) acc[0][j] = n * tmean[j];
  column_sum<1>(u, acc, smem);
  const float inv_count = count > 0.f ? 1.f / count : 0.f;
#pragma unroll
  for (int j = 0; j < NJ_VEC; ++j) {
    mean[j] = acc[0][j] * inv_count;
    const float d = tmean[j] - mean[j];
    acc[0][j] = n > 0.f ? tm2[j] + n * d * d : 0.f;
  }
  column_sum<1>(u, acc, smem);
#pragma unroll
  for (int j = 0; j < NJ_VEC; ++j) m2[j] = acc[0][j];
}

__device__ __forceinline__ void nhwc_normalize(const NjParams& p, const TileUnit& u, idx_t t0, const NhwcTile& t,
                                               const ChannelParams& cp) {
  const int row = thread_row(u);
#pragma unroll
  for (int i = 0; i < NJ_ITEMS; ++i) {
    const idx_t s = t0 + row + (idx_t)i * tile_rows(u);
    if (u.c_valid && s < u.s_end) {
      const idx_t e = elem_at(p, u, s);
#if NJ_RESIDUAL
      const vec_t r = load_vec(p.residual, e);
#endif
      vec_t out;
#pragma unroll
      for (int j = 0; j < NJ_VEC; ++j) {
        float z = (vec_get(t.x[i], j) - cp.mean[j]) * (cp.rstd[j] * cp.w[j]) + cp.b[j];
#if NJ_RESIDUAL
        z += vec_get(r, j);
#endif
        vec_set(out, j, activate(z, p.act_param));
      }
      store_vec(p.y, e, out);
    }
  }
}

extern "C" __global__ void __launch_bounds__(NJ_THREADS, NJ_MIN_BLOCKS)
normjit_instance_norm_nhwc_forward(const __grid_constant__ NjParams p) {
  __shared__ float smem[NJ_NSUM * NJ_THREADS * NJ_VEC];
  __shared__ bool last_flag;
  nj_phase_start(true);
  NhwcRing ring;
  nhwc_ring_start(p, ring);

  idx_t round = 0;
  for (; tile_round_has_units(p, round); ++round) {
    const TileUnit u = make_tile_unit(p, round);
    const idx_t inst = u.n * channel_tiles(p) + u.tile;
    ChannelParams cp;
    load_affine(p, u, cp);
    unsigned leave_ticket = kNoTicket;
#if NJ_TRAIN
    float count[1] = {0.f}, m2[NJ_VEC];
#pragma unroll
    for (int j = 0; j < NJ_VEC; ++j) cp.mean[j] = 0.f, m2[j] = 0.f;
#if NJ_CACHED
    NhwcTile t;
    load_nhwc_tile(p, u, u.s_begin, t);
    nj_phase_mark(kNhwcLoad);  // the loads were issued; nhwc_tile_stats waits for them
    nhwc_tile_stats(u, u.s_begin, t, smem, count, cp.mean, m2);
#else
    // Streamed: each thread keeps running per-channel statistics of the rows it loaded (next
    // tile's loads in flight while this one is reduced); the CTA combines them once per chunk.
    float tn = 0.f, tmean[NJ_VEC], tm2[NJ_VEC];
#pragma unroll
    for (int j = 0; j < NJ_VEC; ++j) tmean[j] = 0.f, tm2[j] = 0.f;
    nhwc_stream(p, ring, u, false, [&](idx_t t0, const NhwcTile& t) { nhwc_thread_tile_stats(u, t0, t, tn, tmean, tm2); });
    nj_phase_mark(kNhwcLoad);
    count[0] = (float)(u.s_end - u.s_begin);
    nhwc_merge_thread_stats(u, tn, tmean, tm2, count[0], smem, cp.mean, m2);
#endif
#if NJ_FLAT
    // Slot statistics (count[0] rows each) -> channel statistics (P times as many rows).
    fold_slots<true>(p, u, count[0], smem, cp.mean, m2);
    count[0] *= (float)nhwc_positions(p);
#endif
    nj_phase_mark(kNhwcReduce);
    if (NJ_NHWC_SPLITS && p.chunks > 1 && u.active) {
      leave_ticket = exchange_chunk_totals<true>(p, u, inst, smem, cp.mean, m2);
      count[0] = (float)nhwc_extent(p) * (float)nhwc_positions(p);
    }
    const float inv_count = count[0] > 0.f ? 1.f / count[0] : 0.f;
#pragma unroll
    for (int j = 0; j < NJ_VEC; ++j) {
      const float var = m2[j] * inv_count;
      cp.rstd[j] = rsqrtf(var + p.eps);
      if (writes_channel(p, u, j) && u.chunk == 0 && thread_row(u) == 0) {
        const idx_t instance = u.n * p.C + slot_channel(p, u, j);
#if NJ_SAVE
        p.save_mean[instance] = cp.mean[j];
        p.save_rstd[instance] = cp.rstd[j];
#endif
#if NJ_RUNNING
        p.scratch[2 * instance] = cp.mean[j];
        p.scratch[2 * instance + 1] = var;
#endif
      }
    }
#else
#pragma unroll
    for (int j = 0; j < NJ_VEC; ++j) {
      cp.mean[j] = u.c_valid ? p.running_mean[slot_channel(p, u, j)] : 0.f;
      cp.rstd[j] = u.c_valid ? rsqrtf(p.running_var[slot_channel(p, u, j)] + p.eps) : 0.f;
    }
#endif

#if NJ_TRAIN && NJ_CACHED
    nhwc_normalize(p, u, u.s_begin, t, cp);
#else
    nhwc_stream(p, ring, u, NJ_TRAIN, [&](idx_t t0, const NhwcTile& t) { nhwc_normalize(p, u, t0, t, cp); });
#endif
    nj_phase_mark(kNhwcOutput);
    exchange_leave_end(p.counters, inst, p.chunks, leave_ticket);
  }
  nhwc_ring_finish();
  nj_nhwc_phase_report("forward", round, p.chunks);
#if NJ_TRAIN && NJ_RUNNING
  finish_running_stats(p, &last_flag);
#endif
}

#else
// ------------------------------------------------------------------------------------ backward
__device__ __forceinline__ float nhwc_grad(const ChannelParams& cp, int j, float x, float dy, float res, float a) {
#if NJ_ACT == 0
  (void)cp, (void)j, (void)x, (void)res, (void)a;
  return dy;
#else
  float z = (x - cp.mean[j]) * cp.rstd[j] * cp.w[j] + cp.b[j];
#if NJ_RESIDUAL
  z += res;
#endif
  return dy * activate_grad(z, a);
#endif
}

__device__ __forceinline__ void nhwc_accumulate(const NjParams& p, const TileUnit& u, idx_t t0, const NhwcTile& t,
                                                const ChannelParams& cp, float (&sums)[2][NJ_VEC]) {
  const int row = thread_row(u);
#pragma unroll
  for (int i = 0; i < NJ_ITEMS; ++i)
    if (t0 + row + (idx_t)i * tile_rows(u) < u.s_end)
#pragma unroll
      for (int j = 0; j < NJ_VEC; ++j) {
        const float x = vec_get(t.x[i], j);
        const float g = nhwc_grad(cp, j, x, vec_get(t.dy[i], j), nhwc_res(t, i, j), p.act_param);
        sums[0][j] += g;
        sums[1][j] += g * ((x - cp.mean[j]) * cp.rstd[j]);
      }
}

__device__ __forceinline__ void nhwc_write_dx(const NjParams& p, const TileUnit& u, idx_t t0, const NhwcTile& t,
                                              const ChannelParams& cp, const float (&sums)[2][NJ_VEC]) {
  const int row = thread_row(u);
#pragma unroll
  for (int i = 0; i < NJ_ITEMS; ++i) {
    const idx_t s = t0 + row + (idx_t)i * tile_rows(u);
    if (u.c_valid && s < u.s_end) {
      const idx_t e = elem_at(p, u, s);
      vec_t dx;
#if NJ_RESIDUAL
      vec_t dres;
#endif
#pragma unroll
      for (int j = 0; j < NJ_VEC; ++j) {
        const float x = vec_get(t.x[i], j);
        const float g = nhwc_grad(cp, j, x, vec_get(t.dy[i], j), nhwc_res(t, i, j), p.act_param);
        const float xhat = (x - cp.mean[j]) * cp.rstd[j];
        vec_set(dx, j, cp.rstd[j] * cp.w[j] * (g - sums[0][j] * p.inv_spatial - xhat * sums[1][j] * p.inv_spatial));
#if NJ_RESIDUAL
        vec_set(dres, j, g);
#endif
      }
      store_vec(p.y, e, dx);
#if NJ_RESIDUAL
      if (p.dresidual) store_vec(p.dresidual, e, dres);
#endif
    }
  }
}

#if NJ_CLUSTER
// dweight/dbias of a channel tile whose N samples' CTAs form one thread-block cluster (sm_90;
// heuristics nhwc_cluster_tier: one CTA per unit; make_tile_unit takes the sample from the
// cluster rank and the channel tile from the cluster's index). Row 0 of each rank pushes its
// channels' (sum g, sum g * xhat) into rank 0's inbox with st.async, whose bytes count down rank
// 0's inbox barrier (armed behind the tile's loads by cluster_join); rank 0 alone waits for
// all of them, then adds the N ranks' pairs in sample order (the order, and so the bits, of the
// last CTA's pass this replaces) from its own shared memory and writes them. The other ranks
// exit right after their stores.
// History: session 24 had rank 0 read each rank's floats (ld.shared::cluster) between two
// barriers every rank waited at: 1.6-1.9 us a CTA. Session 25 pushed them with st.shared::cluster
// and a release arrival on the cluster barrier: (2,320,8^3) fp16 5.6 -> 5.3 us, (2,320,4^3) 4.7 ->
// 3.9, (8,320,4^3) 6.0 -> 4.3 (H100, CUPTI); but that arrival's release fence (MEMBAR.ALL.GPU)
// waited for the dx stores to drain: 12-15 % of the backward's stall samples (session 27).
// st.async needs no fence. The same configs without a cluster, the last of the tile's N CTAs
// summing through scratch and a counter, lost (5.8, 4.6, 5.9 fp16).
__shared__ __align__(16) float nj_cluster_inbox[NJ_MAX_CLUSTER_RANKS][NJ_GROUP * NJ_VEC * 2];  // rank 0's is used
__shared__ __align__(8) unsigned long long nj_cluster_inbox_bar;
constexpr unsigned kInboxRowBytes = NJ_GROUP * NJ_VEC * 2 * sizeof(float);  // what one rank pushes

// Every CTA arms its inbox barrier for the N ranks' pushes (only rank 0's is used) and announces
// its start (cluster_started, whose arrival publishes the initialisation). Every thread of every
// rank calls it once, behind its unit's loads, before cluster_weight_grads.
__device__ __forceinline__ void cluster_join(const NjParams& p) {
  if (threadIdx.x == 0) inbox_barrier_arm(&nj_cluster_inbox_bar, (unsigned)p.N * kInboxRowBytes);
  cluster_started();
}

// Every thread of every rank calls it once, after cluster_join().
__device__ __forceinline__ void cluster_weight_grads(const NjParams& p, const TileUnit& u,
                                                     const float (&sums)[2][NJ_VEC]) {
  const bool row0 = thread_row(u) == 0;
  const int at = 2 * thread_lane(u) * NJ_VEC;  // this lane's pairs in a rank's row of the inbox
  cluster_wait();  // every rank has joined (cluster_join), so rank 0's inbox and barrier exist
  if (row0) {
    float* row = &nj_cluster_inbox[u.n][at];
#if NJ_VEC % 2 == 0
#pragma unroll
    for (int q = 0; q < NJ_VEC / 2; ++q)
      store_cluster_async(row + 4 * q, &nj_cluster_inbox_bar, 0,
                          make_float4(sums[0][2 * q], sums[1][2 * q], sums[0][2 * q + 1], sums[1][2 * q + 1]));
#else
#pragma unroll
    for (int j = 0; j < NJ_VEC; ++j)
      store_cluster_async(row + 2 * j, &nj_cluster_inbox_bar, 0, make_float2(sums[0][j], sums[1][j]));
#endif
  }
  if (u.n != 0 || !row0) return;  // no more work for this thread: a cluster kernel has one unit a CTA
  inbox_barrier_wait(&nj_cluster_inbox_bar);  // every rank's pairs have arrived
  if (u.c_valid) {
    float sg[NJ_VEC], sgx[NJ_VEC];
#pragma unroll
    for (int j = 0; j < NJ_VEC; ++j) sg[j] = 0.f, sgx[j] = 0.f;
    for (int rank = 0; rank < (int)p.N; ++rank) {
#pragma unroll
      for (int j = 0; j < NJ_VEC; ++j) {
        sg[j] += nj_cluster_inbox[rank][at + 2 * j];
        sgx[j] += nj_cluster_inbox[rank][at + 2 * j + 1];
      }
    }
#pragma unroll
    for (int j = 0; j < NJ_VEC; ++j)
      if (writes_channel(p, u, j)) {
        if (p.dweight) p.dweight[slot_channel(p, u, j)] = sgx[j];
        if (p.dbias) p.dbias[slot_channel(p, u, j)] = sg[j];
      }
  }
}
#endif

extern "C" __global__ void __launch_bounds__(NJ_THREADS, NJ_MIN_BLOCKS)
normjit_instance_norm_nhwc_backward(const __grid_constant__ NjParams p) {
  __shared__ float smem[NJ_NSUM * NJ_THREADS * NJ_VEC];
  __shared__ bool last_flag;
  nj_phase_start(true);
#if !NJ_CACHED
  // Empty unless kept: the streamed backward loads its tiles into registers (nhwc_ring.cuh says
  // why); the kept one holds its chunk's x and dy in shared memory from the sums to the output.
  NhwcRing ring;
  nhwc_ring_start(p, ring);
#endif

  idx_t round = 0;
  for (; tile_round_has_units(p, round); ++round) {
    const TileUnit u = make_tile_unit(p, round);
    const idx_t inst = u.n * channel_tiles(p) + u.tile;
    ChannelParams cp;
    load_affine(p, u, cp);
#pragma unroll
    for (int j = 0; j < NJ_VEC; ++j) {
      cp.mean[j] = u.c_valid ? p.save_mean[u.n * p.C + slot_channel(p, u, j)] : 0.f;
      cp.rstd[j] = u.c_valid ? p.save_rstd[u.n * p.C + slot_channel(p, u, j)] : 0.f;
    }
    float sums[2][NJ_VEC];
#pragma unroll
    for (int j = 0; j < NJ_VEC; ++j) sums[0][j] = 0.f, sums[1][j] = 0.f;
#if NJ_CACHED
    NhwcTile t;
    load_nhwc_tile(p, u, u.s_begin, t);
#if NJ_CLUSTER
    // A cluster kernel runs one round (a unit a CTA). Its inbox is armed and its start announced
    // here, behind the tile's loads: at the kernel's start their asm (memory clobbers) held the
    // loads back by ~18 instructions (nvdisasm sm_90). No rank pushes before every rank has
    // started (cluster_weight_grads' cluster_wait).
    cluster_join(p);
#endif
    nhwc_accumulate(p, u, u.s_begin, t, cp, sums);
#else
    nhwc_stream(p, ring, u, false, [&](idx_t t0, const NhwcTile& t) { nhwc_accumulate(p, u, t0, t, cp, sums); });
#if NJ_CLUSTER
    // The kept whole backward in clusters (one round): armed and announced behind its slots' loads.
    cluster_join(p);
#endif
#endif
    nj_phase_mark(kNhwcLoad);
    column_sum<2>(u, sums, smem);
#if NJ_FLAT
    fold_slots<false>(p, u, 0.f, smem, sums[0], sums[1]);  // slot sums -> channel sums
#endif
    nj_phase_mark(kNhwcReduce);
    unsigned leave_ticket = kNoTicket;
    if (NJ_NHWC_SPLITS && p.chunks > 1 && u.active) {
      leave_ticket = exchange_chunk_totals<false>(p, u, inst, smem, sums[0], sums[1]);
    }
#if NJ_AFFINE
    // Chunk 0 leaves the instance's sums for the last CTA's pass (finish_weight_grads), or with
    // channel_major writes dweight/dbias itself: where N = 1 (the instance is its channel's only
    // one) here, else through the cluster of its channel tile's N CTAs after the output.
    if (!NJ_CLUSTER && u.chunk == 0 && thread_row(u) == 0 && (p.dweight || p.dbias)) {
#pragma unroll
      for (int j = 0; j < NJ_VEC; ++j)
        if (writes_channel(p, u, j)) {
          const idx_t c = slot_channel(p, u, j);
          if (p.channel_major) {
            if (p.dweight) p.dweight[c] = sums[1][j];
            if (p.dbias) p.dbias[c] = sums[0][j];
          } else {
            p.scratch[2 * (u.n * p.C + c)] = sums[0][j];
            p.scratch[2 * (u.n * p.C + c) + 1] = sums[1][j];
          }
        }
    }
#endif
#if NJ_CACHED
    nhwc_write_dx(p, u, u.s_begin, t, cp, sums);
#else
    nhwc_stream(p, ring, u, true, [&](idx_t t0, const NhwcTile& t) { nhwc_write_dx(p, u, t0, t, cp, sums); });
#endif
    nj_phase_mark(kNhwcOutput);
    exchange_leave_end(p.counters, inst, p.chunks, leave_ticket);
#if NJ_CLUSTER
    // After the output, when the tile's registers are free (before it, the 16-bit kernels with an
    // activation spilled 44-72 bytes, ptxas sm_90).
    cluster_weight_grads(p, u, sums);
    nj_phase_mark(kNhwcCluster);
#endif
  }
#if !NJ_CACHED
  nhwc_ring_finish();
#endif
  nj_nhwc_phase_report("backward", round, p.chunks);
#if NJ_AFFINE
  if (!p.channel_major) finish_weight_grads(p, &last_flag);
#endif
}
#endif
