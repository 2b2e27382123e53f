// Per-thread 16-byte slots in dynamic shared memory, filled with cp.async (sm_80 and newer): the
// storage of the tile ring (tile_ring.cuh) and of the resident split (resident_split.cuh).
//
// A stage holds one tile of every streamed tensor: NJ_ITEMS 16-byte vectors per thread and
// tensor. Each thread copies and later reads back only its own slots, so no CTA barrier is
// needed: the thread's cp.async.wait_group is the only synchronisation. Slot (stage, tensor,
// item) of thread t is at
//   (((stage * NJ_RING_TENSORS + tensor) * NJ_ITEMS + item) * NJ_THREADS + t) * 16
// so a warp's 16-byte accesses are contiguous (conflict-free). The host sizes the buffer with the
// same formula (schedule/heuristics.cpp ring_bytes). The including file defines NJ_RING_TENSORS
// (1: x; 2: x, dy; 3: x, dy, residual).
#pragma once

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

__device__ __forceinline__ unsigned slot_offset(int stage, int tensor, int item) {
  return ((((unsigned)stage * NJ_RING_TENSORS + tensor) * NJ_ITEMS + item) * NJ_THREADS + threadIdx.x) * 16u;
}

// Starts copying the tile of vectors [tile_begin, tile_begin + NJ_ITEMS * NJ_THREADS) of the
// instance at element `base` (vectors at or past v_end, or all when !active, become zeros) from
// every tensor in src into `stage`. Commits no cp.async group: the caller does.
__device__ __forceinline__ void slots_copy_tile(const void* const* src, idx_t base, idx_t tile_begin, idx_t v_end,
                                                bool active, int stage) {
#pragma unroll
  for (int i = 0; i < NJ_ITEMS; ++i) {
    const idx_t v = tile_begin + (idx_t)i * NJ_THREADS + threadIdx.x;
    const bool valid = active && v < v_end;
    const idx_t e = valid ? base + v * NJ_VEC : 0;
#pragma unroll
    for (int k = 0; k < NJ_RING_TENSORS; ++k)
      nj_cp_async16(nj_smem_address(nj_ring) + slot_offset(stage, k, i), reinterpret_cast<const data_t*>(src[k]) + e,
                    valid);
  }
}

// This thread's vectors of `stage` into registers (tensor k into out_k; out_k may be null for
// k >= NJ_RING_TENSORS). The caller has waited for the stage's cp.async group.
__device__ __forceinline__ void slots_read(int stage, vec_t* out0, vec_t* out1, vec_t* out2) {
  vec_t* outs[3] = {out0, out1, out2};
#pragma unroll
  for (int k = 0; k < NJ_RING_TENSORS; ++k)
#pragma unroll
    for (int i = 0; i < NJ_ITEMS; ++i) outs[k][i] = *reinterpret_cast<const vec_t*>(nj_ring + slot_offset(stage, k, i));
}
