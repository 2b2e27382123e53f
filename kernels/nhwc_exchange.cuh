// The channels-last split's exchange (instance_norm_nhwc.cuh): the CTAs of a (sample, channel
// tile) publish their per-channel partials and read back the totals over the whole sample, either
// each reading every chunk's pairs or, for splits of many chunks, through the scattered merge.
// Included by instance_norm_nhwc.cuh after nhwc_tile.cuh.

// The exchange's partials: per chunk, one (a, b) pair per channel of the tile, channels in order
// (flat: per channel of the sample, after fold_slots made every slot of a channel hold the
// channel's values). Column j of this thread's vector reads and writes pair exchange_column(j).
__device__ __forceinline__ int exchange_width(const NjParams& p, const TileUnit& u) {
  return NJ_FLAT ? (int)p.C : tile_width(u);
}
__device__ __forceinline__ int exchange_column(const NjParams& p, const TileUnit& u, int j) {
  return (int)(slot_channel(p, u, j) - u.tile * tile_width(u));
}
__device__ __forceinline__ const float* chunk_partials(const NjParams& p, const TileUnit& u, idx_t inst, idx_t k) {
  return p.partials + (inst * p.chunks + k) * exchange_width(p, u) * 2;
}

// This thread's NJ_VEC (a, b) pairs of a chunk's partials (or of the merged totals). Not flat,
// they are 2 * NJ_VEC neighbouring floats (64 bytes for fp16), read as 16-byte vectors. In the
// all-chunk merge every CTA reads every chunk's pairs, so these loads were most of the split's L2
// traffic besides x: with one 4-byte load per value, (2,64,64^3)'s forward made 9.5 M L2 sector
// reads and took 77 us (Nsight Compute); with 16-byte loads 7.0 M and 59 us (docs/PERF_NOTES.md,
// session 9).
__device__ __forceinline__ void read_pairs(const NjParams& p, const TileUnit& u, const float* part, float (&a)[NJ_VEC],
                                           float (&b)[NJ_VEC]) {
#if NJ_FLAT || NJ_VEC % 2 != 0
#pragma unroll
  for (int j = 0; j < NJ_VEC; ++j) {
    a[j] = __ldcg(part + 2 * exchange_column(p, u, j));
    b[j] = __ldcg(part + 2 * exchange_column(p, u, j) + 1);
  }
#else
  // 2 * NJ_VEC floats from a multiple of 2 * NJ_VEC: 16-byte aligned (the workspace is).
  const float4* v = reinterpret_cast<const float4*>(part + 2 * exchange_column(p, u, 0));
#pragma unroll
  for (int q = 0; q < NJ_VEC / 2; ++q) {
    const float4 f = __ldcg(v + q);
    a[2 * q] = f.x, b[2 * q] = f.y, a[2 * q + 1] = f.z, b[2 * q + 1] = f.w;
  }
#endif
}

// Publishes this CTA's per-channel partials (2 floats per channel), waits for the chunk's peers.
// Row-0 threads write (flat: the first slot of each channel); thread 0 signals.
__device__ __forceinline__ void tile_exchange_arrive(const NjParams& p, const TileUnit& u, idx_t inst,
                                                     const float (&a)[NJ_VEC], const float (&b)[NJ_VEC]) {
  if (thread_row(u) == 0) {
    float* part = p.partials + (inst * p.chunks + u.chunk) * exchange_width(p, u) * 2;
#if NJ_FLAT || NJ_VEC % 2 != 0
#pragma unroll
    for (int j = 0; j < NJ_VEC; ++j)
      if (!NJ_FLAT || writes_channel(p, u, j)) {
        __stcg(part + 2 * exchange_column(p, u, j), a[j]);
        __stcg(part + 2 * exchange_column(p, u, j) + 1, b[j]);
      }
#else
    float4* v = reinterpret_cast<float4*>(part + 2 * exchange_column(p, u, 0));  // as read_pairs
#pragma unroll
    for (int q = 0; q < NJ_VEC / 2; ++q) __stcg(v + q, make_float4(a[2 * q], b[2 * q], a[2 * q + 1], b[2 * q + 1]));
#endif
  }
  __syncthreads();  // the row-0 writes happen before thread 0's release (exchange_arrive_and_wait)
  if (threadIdx.x == 0) {
    nj_arrival_stamp(kArrivalReady, inst);
    exchange_arrive_and_wait(p.counters, inst, p.chunks);
    nj_arrival_stamp(kArrivalReleased, inst);
  }
  __syncthreads();
}

__device__ __forceinline__ float tile_chunk_count(const NjParams& p, int j) {
  const idx_t begin = (idx_t)j * p.chunk_vectors;
  return (float)min((idx_t)p.chunk_vectors, nhwc_extent(p) - begin);
}

// The scattered merge, where a split has at least as many chunks as exchange columns: CTA k
// merges column k over every chunk and publishes its totals, and after a second arrival every CTA
// reads the totals of its own columns. A CTA then loads O(chunks + columns) pairs instead of
// every chunk's (O(chunks x columns)), at the price of a second wait for the instance's peers.
// The totals of instance i follow every instance's chunk partials (the host sizes the region).
// Measured on the H200 (fp16, Nsight Compute and A/B, docs/PERF_NOTES.md, session 9): the
// forward gains everywhere ((2,64,64^3) 59 -> 55 us, (2,128,32^3) with 66 chunks 24 -> 20,
// (2,30,128^3) 258 -> 232); the backward, whose all-chunk read needs one column sum instead of
// the forward's two, only where its reads are scalar (flat: (2,30,128^3) fwd+bwd 631 -> 577)
// and lost 1-2 us elsewhere ((2,128,32^3) 26.1 -> 27.9), so it keeps that read unless flat.
__device__ __forceinline__ bool scattered_merge(const NjParams& p, const TileUnit& u) {
  return p.chunks >= exchange_width(p, u) && (!NJ_BACKWARD || NJ_FLAT);
}
__device__ __forceinline__ float* merged_pairs(const NjParams& p, const TileUnit& u, idx_t inst) {
  return p.partials + (p.N * channel_tiles(p) * p.chunks + inst) * exchange_width(p, u) * 2;
}

// Column u.chunk's totals over the chunks (kStats: (mean_k, M2_k) of tile_chunk_count(k) * P
// rows each, merged about chunk 0's mean as the forward's all-chunk merge does; else sums).
// Thread t adds chunks t, t + NJ_THREADS, ...; the warps' sums are added in warp order, so the
// bits are the same on every run. smem: 2 * NJ_WARPS floats.
template <bool kStats>
__device__ __forceinline__ void merge_column(const NjParams& p, const TileUnit& u, idx_t inst, float* smem) {
  const int W = exchange_width(p, u), col = u.chunk;
  if (col >= W) return;  // the whole CTA: col is the CTA's
  const float* column = chunk_partials(p, u, inst, 0) + 2 * col;
  const float P = (float)nhwc_positions(p);
  const float shift = kStats ? __ldcg(column) : 0.f;
  float s[2] = {0.f, 0.f};
  for (int k = threadIdx.x; k < p.chunks; k += NJ_THREADS) {
    const float2 v = __ldcg(reinterpret_cast<const float2*>(column + (idx_t)k * W * 2));
    if (kStats) {
      shifted_add(tile_chunk_count(p, k) * P, v.x, v.y, shift, s[0], s[1]);
    } else {
      s[0] += v.x;
      s[1] += v.y;
    }
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    s[q] = warp_sum(s[q], 32);
    if (lane == 0) smem[q * NJ_WARPS + warp] = s[q];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float t[2] = {0.f, 0.f};
    for (int w = 0; w < NJ_WARPS; ++w) t[0] += smem[w], t[1] += smem[NJ_WARPS + w];
    if (kStats) shifted_result(shift, t[0], t[1], inv_extent(p) / P, t[0], t[1]);  // exact: P is a power of two
    __stcg(reinterpret_cast<float2*>(merged_pairs(p, u, inst) + 2 * col), make_float2(t[0], t[1]));
  }
  __syncthreads();  // smem is reused
}

// After merge_column: this CTA arrives a second time and waits until every peer has published
// its column; then the totals may be read (read_pairs on merged_pairs).
__device__ __forceinline__ void merged_arrive_and_wait(const NjParams& p, idx_t inst) {
  if (threadIdx.x == 0) {
    nj_arrival_stamp(kArrival2Ready, inst);
    exchange_arrive_and_wait(p.counters, inst, 2 * p.chunks);
    nj_arrival_stamp(kArrival2Released, inst);
  }
  __syncthreads();
}

// Every CTA reads every chunk's pairs of its own columns: rows of the CTA read different chunks
// in parallel, two chunks in flight, and column_sum adds them in a fixed order. kStats: the
// chunks' (mean_k, M2_k) merge in one pass about chunk 0's mean (shifted_add in common.cuh); a
// chunk counts n_k rows of P positions (P = 1 unless flat). Else (a, b) are sums and add.
template <bool kStats>
__device__ __forceinline__ void merge_all_chunks(const NjParams& p, const TileUnit& u, idx_t inst, float* smem,
                                                 float (&a)[NJ_VEC], float (&b)[NJ_VEC]) {
  const float P = (float)nhwc_positions(p);
  float shift[NJ_VEC], unused[NJ_VEC], s1[1][NJ_VEC], s2[1][NJ_VEC];
  if (kStats) read_pairs(p, u, chunk_partials(p, u, inst, 0), shift, unused);
#pragma unroll
  for (int j = 0; j < NJ_VEC; ++j) {
    if (!kStats) shift[j] = 0.f;
    s1[0][j] = 0.f, s2[0][j] = 0.f;
  }
#pragma unroll 2
  for (int k = thread_row(u); k < p.chunks; k += tile_rows(u)) {
    float ak[NJ_VEC], bk[NJ_VEC];
    read_pairs(p, u, chunk_partials(p, u, inst, k), ak, bk);
    const float nk = kStats ? tile_chunk_count(p, k) * P : 1.f;
#pragma unroll
    for (int j = 0; j < NJ_VEC; ++j) {
      if (kStats) {
        shifted_add(nk, ak[j], bk[j], shift[j], s1[0][j], s2[0][j]);
      } else {
        s1[0][j] += ak[j], s2[0][j] += bk[j];
      }
    }
  }
#if NJ_NSUM == 2  // the backward's shared memory holds both sums at once
  float both[2][NJ_VEC];
#pragma unroll
  for (int j = 0; j < NJ_VEC; ++j) both[0][j] = s1[0][j], both[1][j] = s2[0][j];
  column_sum<2>(u, both, smem);
#pragma unroll
  for (int j = 0; j < NJ_VEC; ++j) s1[0][j] = both[0][j], s2[0][j] = both[1][j];
#else
  column_sum<1>(u, s1, smem);
  column_sum<1>(u, s2, smem);
#endif
  const float inv_n = inv_extent(p) / P;  // exact: P is a power of two
#pragma unroll
  for (int j = 0; j < NJ_VEC; ++j) {
    if (kStats) {
      shifted_result(shift[j], s1[0][j], s2[0][j], inv_n, a[j], b[j]);
    } else {
      a[j] = s1[0][j], b[j] = s2[0][j];
    }
  }
}

// The split's exchange: this CTA's per-channel pairs (a, b) in, the instance's totals out (kStats:
// (mean, M2) over the whole sample; else sums), the same bits in every CTA of the instance.
// Returns the departure ticket for exchange_leave_end after the output (exchange_leave_begin).
template <bool kStats>
__device__ __forceinline__ unsigned exchange_chunk_totals(const NjParams& p, const TileUnit& u, idx_t inst, float* smem,
                                                          float (&a)[NJ_VEC], float (&b)[NJ_VEC]) {
  tile_exchange_arrive(p, u, inst, a, b);
  nj_phase_mark(kNhwcArrive);
  if (scattered_merge(p, u)) {
    merge_column<kStats>(p, u, inst, smem);
    nj_phase_mark(kNhwcMerge);
    merged_arrive_and_wait(p, inst);
    read_pairs(p, u, merged_pairs(p, u, inst), a, b);
  } else {
    merge_all_chunks<kStats>(p, u, inst, smem, a, b);
    nj_phase_mark(kNhwcMerge);
  }
  const unsigned ticket = exchange_depart_begin(p.counters, inst);
  nj_phase_mark(kNhwcMergedArrive);
  return ticket;
}
