// The channels-last kernels' tile (instance_norm_nhwc.cuh): which channels and positions a
// thread of a CTA covers, and the per-channel column sums over the CTA's rows. Included by
// instance_norm_nhwc.cuh after common.cuh and NJ_NSUM.
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

// NJ_CLUSTER: the backward's CTAs form a thread-block cluster per channel tile, a CTA per sample,
// and sum dweight/dbias there (instance_norm_nhwc.cuh cluster_weight_grads; the host's
// conditions: heuristics nhwc_cluster_tier). The unit is held in registers (the tiers) or in the
// kept slots (the kept whole backward, NJ_STAGES with NJ_RESIDENT).
#if NJ_CLUSTER && (!NJ_BACKWARD || !NJ_AFFINE || NJ_RESIDUAL || !(NJ_CACHED || (NJ_STAGES > 0 && NJ_RESIDENT)) || \
                   NJ_FLAT || NJ_INDEX64)
#error "NJ_CLUSTER: the channels-last backward with weight gradients, no residual, held on chip, 32-bit"
#endif

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

// Units: the chunks of every (sample, channel tile) instance.
__device__ __forceinline__ idx_t tile_units(const NjParams& p) { return p.N * channel_tiles(p) * p.chunks; }

__device__ __forceinline__ TileUnit make_tile_unit(const NjParams& p, idx_t round) {
  const idx_t units = tile_units(p);
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
#if NJ_CACHED || NJ_CLUSTER
  const idx_t inst = safe;  // one chunk a unit (the host's launchable): no quotient before the loads
  u.chunk = 0;
#else
  const idx_t inst = quotient(safe, p.chunks, p.by_chunks);
  u.chunk = (int)(safe - inst * p.chunks);
#endif
#if NJ_CLUSTER
  // A cluster per channel tile, a CTA per sample (cluster_weight_grads; one unit per CTA).
  u.n = cluster_rank();
  u.tile = cluster_index();
#else
  // Samples fastest, as in the clusters: the host's divisor of N splits the instance, where the
  // channel tiles' count would need a hardware-less division (~25 dependent instructions in front
  // of the deep tiers' first load, nvdisasm sm_90).
  u.tile = quotient(inst, p.N, p.by_n);
  u.n = inst - u.tile * p.N;
#endif
  u.c0 = u.tile * tile_width(u) + (idx_t)thread_lane(u) * NJ_VEC;
  u.c_valid = u.active && (NJ_FLAT ? thread_row(u) < tile_rows(u) : u.c0 < p.C);
  u.s_begin = (idx_t)u.chunk * p.chunk_vectors;
  u.s_end = u.active ? min(nhwc_extent(p), u.s_begin + (idx_t)p.chunk_vectors) : u.s_begin;
  return u;
}

__device__ __forceinline__ idx_t tile_rounds(const NjParams& p) {
  return (tile_units(p) + gridDim.x - 1) / gridDim.x;
}
// Whether round `round` holds any unit: round < tile_rounds(p) without its division (see
// round_has_units). The round loops test this.
__device__ __forceinline__ bool tile_round_has_units(const NjParams& p, idx_t round) {
  return round * (idx_t)gridDim.x < tile_units(p);
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

// Long columns (128 or 256 rows: tiles of one or two lanes in a CTA of 256, as the deep stages'
// narrow tiles are), whose single pass would be a chain of 128-256 dependent adds in the few
// threads that own a column, are summed in each warp first: a reduce-scatter butterfly (each step
// over one bit of the row hands half of the thread's values to its partner and keeps the sum of
// the other half: 2^s - 1 shuffles for 2^s values instead of s * 2^s), so that each of the warp's
// first K * NJ_VEC rows ends with the warp's total of one (sum, column); then the first K * TC
// threads add the warps' totals in warp order. The order is fixed at compile time, so every thread
// of every run gets the same bits. The butterfly needs K * NJ_VEC <= the warp's rows (32 / lanes);
// the other kernels keep the single pass they were measured with.
template <int K>
constexpr bool warp_first_column_sum() {
#if NJ_FLAT
  return false;
#else
  return NJ_THREADS / NJ_GROUP >= 128 && K * NJ_VEC <= 32 / NJ_GROUP;
#endif
}

// The butterfly's steps from row bit kOffset on, kLive values still live in a[0, kLive): a
// template per step, so every index into a[] is a constant (a loop over the steps left the
// streamed backward's array in local memory: a 64-byte stack frame, ptxas sm_90).
template <int kLive, int kOffset, int N>
__device__ __forceinline__ void butterfly_steps(float (&a)[N], int lane_id, int& index) {
  if constexpr (kOffset < 32) {
    const bool upper = (lane_id & kOffset) != 0;
    if constexpr (kLive > 1) {
      constexpr int kHalf = kLive / 2;
#pragma unroll
      for (int i = 0; i < kHalf; ++i) {
        const float give = upper ? a[i] : a[i + kHalf];
        const float keep = upper ? a[i + kHalf] : a[i];
        a[i] = keep + __shfl_xor_sync(0xffffffffu, give, kOffset);
      }
      index += upper ? kHalf : 0;
      butterfly_steps<kHalf, kOffset * 2>(a, lane_id, index);
    } else {
      a[0] += __shfl_xor_sync(0xffffffffu, a[0], kOffset);  // a + b and b + a: the same bits
      butterfly_steps<1, kOffset * 2>(a, lane_id, index);
    }
  }
}

template <int K>
__device__ __forceinline__ void column_sum_warp_first(float (&v)[K][NJ_VEC], float* smem) {
  constexpr int kValues = K * NJ_VEC, kTc = NJ_GROUP * NJ_VEC;
  const int lane_id = threadIdx.x % 32, warp = threadIdx.x / 32;
  float a[kValues];
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int j = 0; j < NJ_VEC; ++j) a[k * NJ_VEC + j] = v[k][j];
  int index = 0;  // which of the kValues values a[0] holds once the halving steps are done
  butterfly_steps<kValues, NJ_GROUP>(a, lane_id, index);
  // Rows past the halving steps hold copies: the lowest of them writes.
  const int row_in_warp = lane_id / NJ_GROUP, col = (lane_id % NJ_GROUP) * NJ_VEC + index % NJ_VEC;
  if (row_in_warp < kValues) smem[(warp * K + index / NJ_VEC) * kTc + col] = a[0];
  __syncthreads();
  float* totals = smem + NJ_WARPS * K * kTc;
  if (threadIdx.x < K * kTc) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < NJ_WARPS; ++w) s += smem[w * K * kTc + threadIdx.x];
    totals[threadIdx.x] = s;
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int j = 0; j < NJ_VEC; ++j) v[k][j] = totals[k * kTc + (lane_id % NJ_GROUP) * NJ_VEC + j];
  __syncthreads();
}

// Column sums over the CTA's rows: v[k][j] (sum k, column j of this thread's vector) becomes the
// total over all rows for that column. smem: NJ_NSUM * NJ_THREADS * NJ_VEC floats.
template <int K>
__device__ __forceinline__ void column_sum(const TileUnit& u, float (&v)[K][NJ_VEC], float* smem) {
  if constexpr (warp_first_column_sum<K>()) {
    column_sum_warp_first<K>(v, smem);
    return;
  }
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
