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
// NJ_FLAT (C not a multiple of the 16-byte vector's NJ_VEC elements): a sample is one contiguous
// run of spatial * C elements, read as "super-rows" of L = lcm(C, NJ_VEC) elements (L / C
// positions each) with 16-byte vectors, so odd channel counts get the loads, the ring and the
// whole-row coalescing of C = 32 instead of 2- or 4-byte vectors. Lane l always holds the L-slot
// columns 8l..8l+7 (fp16), whose channels are fixed: (column mod C). The tile and column sums
// run unchanged over the L slot columns (one tile per sample, positions become super-rows);
// fold_slots then adds each channel's L / C slots, before the exchange, so that a split's chunks
// publish and read C per-channel partials rather than L slot columns (L / C times fewer: for
// C = 30, 30 instead of 240 per chunk, read by every CTA of the sample). Lanes (C / gcd(C, NJ_VEC), at
// most 32) are a run-time value there, and rows * lanes may leave the last threads of the CTA
// without a column (they load nothing and their column-sum entries are skipped). The host takes
// it only where L / C divides spatial (every slot then has the same count).
#include "common.cuh"

#if NJ_BACKWARD
#define NJ_NSUM 2
#else
#define NJ_NSUM 1
#endif
// The streamed forward's ring holds x (nhwc_ring.cuh; a residual is read where it is added).
#define NJ_RING_TENSORS 1

#if NJ_FLAT
// gcd(C, NJ_VEC): NJ_VEC is a power of two.
__device__ __forceinline__ idx_t flat_gcd(const NjParams& p) { return min((idx_t)(p.C & -p.C), (idx_t)NJ_VEC); }
__device__ __forceinline__ int nhwc_lanes(const NjParams& p) { return (int)(p.C / flat_gcd(p)); }
// Positions per memory row: the super-row's L / C.
__device__ __forceinline__ int nhwc_positions(const NjParams& p) { return (int)(NJ_VEC / flat_gcd(p)); }
__device__ __forceinline__ idx_t channel_tiles(const NjParams&) { return 1; }
#else
__device__ __forceinline__ int nhwc_lanes(const NjParams&) { return NJ_GROUP; }
__device__ __forceinline__ int nhwc_positions(const NjParams&) { return 1; }
__device__ __forceinline__ idx_t channel_tiles(const NjParams& p) { return (p.C + NJ_GROUP * NJ_VEC - 1) / (NJ_GROUP * NJ_VEC); }
#endif
// Memory rows of a sample (positions, or super-rows when flat): the extent chunks divide.
__device__ __forceinline__ idx_t nhwc_extent(const NjParams& p) { return (idx_t)p.spatial / nhwc_positions(p); }
// 1 / extent (exact: positions are a power of two).
__device__ __forceinline__ float inv_extent(const NjParams& p) { return p.inv_spatial * (float)nhwc_positions(p); }

struct TileUnit {
  bool active;
  idx_t n, tile, c0;           // sample, channel tile, first channel (flat: slot column) of this thread's vector
  bool c_valid;                // this thread's channels exist (C need not fill the last tile)
  int chunk;
  idx_t s_begin, s_end;        // row range of the chunk (positions; flat: super-rows)
#if NJ_FLAT
  // The CTA's shape, a run-time value when flat (else the constants of the accessors below):
  // `rows` x `lanes` threads over a tile `tc` elements wide; this thread's lane and row (row ==
  // rows: a spare thread of the CTA).
  int lanes, rows, tc, lane, row;
#endif
};

#if NJ_FLAT
__device__ __forceinline__ int tile_lanes(const TileUnit& u) { return u.lanes; }
__device__ __forceinline__ int tile_rows(const TileUnit& u) { return u.rows; }
__device__ __forceinline__ int tile_width(const TileUnit& u) { return u.tc; }
__device__ __forceinline__ int thread_lane(const TileUnit& u) { return u.lane; }
__device__ __forceinline__ int thread_row(const TileUnit& u) { return u.row; }
// Elements from one memory row to the next: a super-row.
__device__ __forceinline__ idx_t row_elems(const NjParams&, const TileUnit& u) { return u.tc; }
#else
__device__ __forceinline__ int tile_lanes(const TileUnit&) { return NJ_GROUP; }
__device__ __forceinline__ int tile_rows(const TileUnit&) { return NJ_THREADS / NJ_GROUP; }
__device__ __forceinline__ int tile_width(const TileUnit&) { return NJ_GROUP * NJ_VEC; }
__device__ __forceinline__ int thread_lane(const TileUnit&) { return threadIdx.x % NJ_GROUP; }
__device__ __forceinline__ int thread_row(const TileUnit&) { return threadIdx.x / NJ_GROUP; }
__device__ __forceinline__ idx_t row_elems(const NjParams& p, const TileUnit&) { return p.C; }
#endif

__device__ __forceinline__ TileUnit make_tile_unit(const NjParams& p, idx_t round) {
  const idx_t units = p.N * channel_tiles(p) * p.chunks;
  const idx_t unit = round * gridDim.x + blockIdx.x;
  TileUnit u;
#if NJ_FLAT
  u.lanes = nhwc_lanes(p);
  u.rows = NJ_THREADS / u.lanes;
  u.tc = u.lanes * NJ_VEC;
  u.lane = threadIdx.x % u.lanes;
  u.row = threadIdx.x / u.lanes;
#endif
  u.active = unit < units;
  const idx_t safe = u.active ? unit : 0;
  const idx_t inst = quotient(safe, p.chunks, p.by_chunks);
  u.chunk = (int)(safe - inst * p.chunks);
  u.n = inst / channel_tiles(p);
  u.tile = inst % channel_tiles(p);
  u.c0 = u.tile * tile_width(u) + (idx_t)thread_lane(u) * NJ_VEC;
  u.c_valid = u.active && (NJ_FLAT ? thread_row(u) < tile_rows(u) : u.c0 < p.C);
  u.s_begin = (idx_t)u.chunk * p.chunk_vectors;
  u.s_end = u.active ? min(nhwc_extent(p), u.s_begin + (idx_t)p.chunk_vectors) : u.s_begin;
  return u;
}

__device__ __forceinline__ idx_t tile_rounds(const NjParams& p) {
  const idx_t units = p.N * channel_tiles(p) * p.chunks;
  return (units + gridDim.x - 1) / gridDim.x;
}

__device__ __forceinline__ idx_t elem_at(const NjParams& p, const TileUnit& u, idx_t s) {
  return u.n * (idx_t)p.stride_n + s * row_elems(p, u) + u.c0;
}

// The channel of element j of this thread's vector, and whether this thread writes that
// channel's per-channel results (flat: only the channel's first slot does).
__device__ __forceinline__ idx_t slot_channel(const NjParams& p, const TileUnit& u, int j) {
  return NJ_FLAT ? (u.c0 + j) % (idx_t)p.C : u.c0 + j;
}
__device__ __forceinline__ bool writes_channel(const NjParams& p, const TileUnit& u, int j) {
  return u.c_valid && (!NJ_FLAT || u.c0 + j < (idx_t)p.C);
}

// Column sums over the CTA's rows: v[k][j] (sum k, column j of this thread's vector) becomes the
// total over all rows for that column. smem: NJ_NSUM * NJ_THREADS * NJ_VEC floats.
template <int K>
__device__ __forceinline__ void column_sum(const TileUnit& u, float (&v)[K][NJ_VEC], float* smem) {
  const int rows = tile_rows(u), tc = tile_width(u);
  if (!NJ_FLAT || thread_row(u) < rows)  // a flat CTA's spare threads hold no column
#pragma unroll
    for (int k = 0; k < K; ++k)
#pragma unroll
      for (int j = 0; j < NJ_VEC; ++j) smem[(k * rows + thread_row(u)) * tc + thread_lane(u) * NJ_VEC + j] = v[k][j];
  __syncthreads();
  // Thread t < K * TC adds column (t % TC) of sum (t / TC) in row order; the totals go to row 0.
  for (int t = threadIdx.x; t < K * tc; t += NJ_THREADS) {
    const int k = t / tc, col = t % tc;
    float s = 0.f;
    // Unrolled by 8, not fully: a full unroll (64 rows at 4 lanes) put 256 of the kernel's
    // ~3000 PTX instructions in these 4 sums that only K * TC threads run.
#pragma unroll 8
    for (int r = 0; r < rows; ++r) s += smem[(k * rows + r) * tc + col];
    smem[(k * rows) * tc + col] = s;  // row 0 was already read by this thread
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int j = 0; j < NJ_VEC; ++j) v[k][j] = smem[(k * rows) * tc + thread_lane(u) * NJ_VEC + j];
  __syncthreads();
}

// Flat only: this thread's slot values (a, b) of its columns become the totals of their
// channels, from the channel's P = L / C slots (columns ch, ch + C, ...) in slot order, so every
// slot of a channel gets the same bits. kStats: (a, b) are the (mean, M2) of `count` rows per
// slot, merged by Chan's rule for equal counts (the mean is the slots' average, M2 the sum of
// theirs plus count * (slot mean - mean)^2); else both are sums and add.
template <bool kStats>
__device__ __forceinline__ void fold_slots(const NjParams& p, const TileUnit& u, float count, float* smem,
                                           float (&a)[NJ_VEC], float (&b)[NJ_VEC]) {
#if NJ_FLAT
  const int C = (int)p.C, P = nhwc_positions(p), tc = tile_width(u);
  if (thread_row(u) == 0)
#pragma unroll
    for (int j = 0; j < NJ_VEC; ++j) smem[u.c0 + j] = a[j], smem[tc + u.c0 + j] = b[j];
  __syncthreads();
#pragma unroll
  for (int j = 0; j < NJ_VEC; ++j) {
    const int ch = (int)slot_channel(p, u, j);
    float sa = 0.f, sb = 0.f;
    for (int k = 0; k < P; ++k) sa += smem[ch + k * C];
    if (kStats) sa *= 1.f / (float)P;
    for (int k = 0; k < P; ++k) {
      const float d = kStats ? smem[ch + k * C] - sa : 0.f;
      sb += smem[tc + ch + k * C] + (kStats ? count * d * d : 0.f);
    }
    a[j] = sa, b[j] = sb;
  }
  __syncthreads();
#else
  (void)p, (void)u, (void)count, (void)smem, (void)a, (void)b;
#endif
}

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
    __threadfence();
  }
  __syncthreads();
  if (threadIdx.x == 0) exchange_arrive_and_wait(p.counters, inst, p.chunks);
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
  if (threadIdx.x == 0) exchange_arrive_and_wait(p.counters, inst, 2 * p.chunks);
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
template <bool kStats>
__device__ __forceinline__ void exchange_chunk_totals(const NjParams& p, const TileUnit& u, idx_t inst, float* smem,
                                                      float (&a)[NJ_VEC], float (&b)[NJ_VEC]) {
  tile_exchange_arrive(p, u, inst, a, b);
  if (scattered_merge(p, u)) {
    merge_column<kStats>(p, u, inst, smem);
    merged_arrive_and_wait(p, inst);
    read_pairs(p, u, merged_pairs(p, u, inst), a, b);
  } else {
    merge_all_chunks<kStats>(p, u, inst, smem, a, b);
  }
  exchange_depart(p.counters, inst, p.chunks);
}

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

// Streams a chunk's tiles through `body(t0, tile)` in the pass's order: through the ring when the
// kernel has one (the streamed forward: the ring holds its tiles in flight), else loaded into
// registers, the next tile's loads in flight while `body` works on this one.
template <class Body>
__device__ __forceinline__ void nhwc_stream(const NjParams& p, NhwcRing& ring, const TileUnit& u, bool output_pass,
                                            Body body) {
  const idx_t tiles = nhwc_unit_tiles(u);
#if NJ_NHWC_RING
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
  return to_float(t.res[i].v[j]);
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
      for (int j = 0; j < NJ_VEC; ++j) s[0][j] += to_float(t.x[i].v[j]);
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
        const float d = to_float(t.x[i].v[j]) - mean[j];
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
      for (int j = 0; j < NJ_VEC; ++j) s[j] += to_float(t.x[i].v[j]);
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
        const float d = to_float(t.x[i].v[j]) - tile_mean;
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
        float z = (to_float(t.x[i].v[j]) - cp.mean[j]) * (cp.rstd[j] * cp.w[j]) + cp.b[j];
#if NJ_RESIDUAL
        z += to_float(r.v[j]);
#endif
        out.v[j] = from_float<data_t>(activate(z, p.act_param));
      }
      store_vec(p.y, e, out);
    }
  }
}

extern "C" __global__ void __launch_bounds__(NJ_THREADS, NJ_MIN_BLOCKS)
normjit_instance_norm_nhwc_forward(const __grid_constant__ NjParams p) {
  __shared__ float smem[NJ_NSUM * NJ_THREADS * NJ_VEC];
  __shared__ bool last_flag;
  const idx_t rounds = tile_rounds(p);
  NhwcRing ring;
  nhwc_ring_start(p, ring);

  for (idx_t round = 0; round < rounds; ++round) {
    const TileUnit u = make_tile_unit(p, round);
    const idx_t inst = u.n * channel_tiles(p) + u.tile;
    ChannelParams cp;
    load_affine(p, u, cp);
#if NJ_TRAIN
    float count[1] = {0.f}, m2[NJ_VEC];
#pragma unroll
    for (int j = 0; j < NJ_VEC; ++j) cp.mean[j] = 0.f, m2[j] = 0.f;
#if NJ_CACHED
    NhwcTile t;
    load_nhwc_tile(p, u, u.s_begin, t);
    nhwc_tile_stats(u, u.s_begin, t, smem, count, cp.mean, m2);
#else
    // Streamed: each thread keeps running per-channel statistics of the rows it loaded (next
    // tile's loads in flight while this one is reduced); the CTA combines them once per chunk.
    float tn = 0.f, tmean[NJ_VEC], tm2[NJ_VEC];
#pragma unroll
    for (int j = 0; j < NJ_VEC; ++j) tmean[j] = 0.f, tm2[j] = 0.f;
    nhwc_stream(p, ring, u, false, [&](idx_t t0, const NhwcTile& t) { nhwc_thread_tile_stats(u, t0, t, tn, tmean, tm2); });
    count[0] = (float)(u.s_end - u.s_begin);
    nhwc_merge_thread_stats(u, tn, tmean, tm2, count[0], smem, cp.mean, m2);
#endif
#if NJ_FLAT
    // Slot statistics (count[0] rows each) -> channel statistics (P times as many rows).
    fold_slots<true>(p, u, count[0], smem, cp.mean, m2);
    count[0] *= (float)nhwc_positions(p);
#endif
    if (p.chunks > 1 && u.active) {
      exchange_chunk_totals<true>(p, u, inst, smem, cp.mean, m2);
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
  }
  nhwc_ring_finish();
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
        const float x = to_float(t.x[i].v[j]);
        const float g = nhwc_grad(cp, j, x, to_float(t.dy[i].v[j]), nhwc_res(t, i, j), p.act_param);
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
        const float x = to_float(t.x[i].v[j]);
        const float g = nhwc_grad(cp, j, x, to_float(t.dy[i].v[j]), nhwc_res(t, i, j), p.act_param);
        const float xhat = (x - cp.mean[j]) * cp.rstd[j];
        dx.v[j] = from_float<data_t>(cp.rstd[j] * cp.w[j] *
                                     (g - sums[0][j] * p.inv_spatial - xhat * sums[1][j] * p.inv_spatial));
#if NJ_RESIDUAL
        dres.v[j] = from_float<data_t>(g);
#endif
      }
      store_vec(p.y, e, dx);
#if NJ_RESIDUAL
      if (p.dresidual) store_vec(p.dresidual, e, dres);
#endif
    }
  }
}

extern "C" __global__ void __launch_bounds__(NJ_THREADS, NJ_MIN_BLOCKS)
normjit_instance_norm_nhwc_backward(const __grid_constant__ NjParams p) {
  __shared__ float smem[NJ_NSUM * NJ_THREADS * NJ_VEC];
  __shared__ bool last_flag;
  const idx_t rounds = tile_rounds(p);
  NhwcRing ring;  // empty: the backward loads its tiles into registers (nhwc_ring.cuh says why)

  for (idx_t round = 0; round < rounds; ++round) {
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
    nhwc_accumulate(p, u, u.s_begin, t, cp, sums);
#else
    nhwc_stream(p, ring, u, false, [&](idx_t t0, const NhwcTile& t) { nhwc_accumulate(p, u, t0, t, cp, sums); });
#endif
    column_sum<2>(u, sums, smem);
#if NJ_FLAT
    fold_slots<false>(p, u, 0.f, smem, sums[0], sums[1]);  // slot sums -> channel sums
#endif
    if (p.chunks > 1 && u.active) {
      exchange_chunk_totals<false>(p, u, inst, smem, sums[0], sums[1]);
    }
#if NJ_AFFINE
    if (u.chunk == 0 && thread_row(u) == 0 && (p.dweight || p.dbias)) {
#pragma unroll
      for (int j = 0; j < NJ_VEC; ++j)
        if (writes_channel(p, u, j)) {
          const idx_t instance = u.n * p.C + slot_channel(p, u, j);
          p.scratch[2 * instance] = sums[0][j];
          p.scratch[2 * instance + 1] = sums[1][j];
        }
    }
#endif
#if NJ_CACHED
    nhwc_write_dx(p, u, u.s_begin, t, cp, sums);
#else
    nhwc_stream(p, ring, u, true, [&](idx_t t0, const NhwcTile& t) { nhwc_write_dx(p, u, t0, t, cp, sums); });
#endif
  }
#if NJ_AFFINE
  finish_weight_grads(p, &last_flag);
#endif
}
#endif
