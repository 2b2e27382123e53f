// The heuristics: (fusion, shape, device) -> kernel config and launch decomposition.
//
// All of normjit's tuning lives in heuristics.cpp. Pure functions of their arguments: no GPU, no
// global state, so `normjit explain` and the tests can call them offline.
//
// What selects a kernel config (and therefore a compile) — the rest is a runtime argument:
//   * the fusion (direction, dtypes, layout, train/eval, affine, residual, running stats, activation)
//   * the vector width: largest of 16/8/4/2/1 bytes that divides every pointer, the spatial size
//     and the strides (the "alignment class"); channels-last with C not a multiple of the 16-byte
//     vector reads "flat" super-rows of lcm(C, vector) elements with 16 bytes where they apply
//     (KernelConfig::flat: one kernel per tier for every such C, its lanes a run-time value)
//   * the size tier: the smallest (threads, group) tier whose register tile holds one instance,
//     else a split tier (several CTAs per instance, cached in registers when the co-resident CTAs
//     can hold it, streamed twice otherwise)
//   * the index width: 64-bit once an element offset reaches 2^31
// Under the default bounded policy items is fixed at 4, so the kernels per fusion are at most
// |vec classes| x |tiers| x 2 (index width): see enumerate_configs().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/keys.h"
#include "schedule/device_profile.h"

namespace normjit {

enum class Policy : uint8_t { bounded = 0, exact = 1 };
// NORMJIT_POLICY=exact selects the exact policy; anything else (or unset) the bounded default.
Policy policy_from_env();
const char* policy_name(Policy p);

// How a training kernel splits an instance too large for one CTA: hold every chunk in registers
// (x read once from HBM; needs all chunks co-resident), stream chunks twice with the rounds sized
// to L2, or hold each chunk in shared memory in a pipeline of chunks (the resident split: NCDHW,
// 16-byte vectors, sm_80+, instances up to ~2 x the GPU's shared memory). The default (automatic)
// takes the resident split for the forward where it applies and streams otherwise, as measured
// fastest; NORMJIT_SPLIT=registers, l2 or resident selects one for both directions.
enum class SplitMode : uint8_t { registers = 0, l2 = 1, resident = 2, automatic = 3 };
SplitMode split_mode();
// Whether the streamed channels-last kernels walk each chunk backwards in their output pass (the
// default; NORMJIT_OUTPUT_ORDER=forward walks it forwards, for comparison). Read once per process.
bool output_pass_reversed();
// Whether the resident split refills a slot early (phase C's read) for instances of `chunks`
// chunks on a grid of `grid` CTAs; NORMJIT_EARLY_REFILL=0|1 forces it, for measurements.
bool early_refill_pays(int64_t chunks, int64_t grid);
// Shared-memory slots of the resident split's pipeline (3-8; NORMJIT_RESIDENT_SLOTS, default 4).
// Read once per process.
int resident_slots();
// A CTA size forced on the resident split for both directions (NORMJIT_RESIDENT_THREADS: 512, one
// CTA per SM, or 256, two), 0 where unset (the heuristics choose per direction). Read once per
// process.
int resident_threads_override();
// Whether the channels-last backward of 2-8 samples may sum its weight gradients in thread-block
// clusters (NORMJIT_CLUSTER_WEIGHT_GRADS=0|1, default 1). Read once per process.
bool cluster_weight_grads_enabled();
// Whether the NCDHW backward may take the register tier that keeps dy in shared memory
// (NORMJIT_SHARED_DY=0|1, default 1; heuristics.cpp shared_dy_tier_fits). Read once per process.
bool shared_dy_tier_enabled();
// Most tiles of a streamed kernel's cp.async ring (2-8; NORMJIT_RING_STAGES, default 3), as the
// shared memory allows. Read once per process.
int ring_stage_cap();
// Vectors a thread streams per tile in the channels-last streamed backward, forced for
// measurements (NORMJIT_NHWC_BWD_ITEMS, 1-8), 0 where unset (nhwc_streamed_items chooses per
// fusion). Read once per process.
int nhwc_backward_items_override();
// The kept channels-last split's chunk in tiles (NORMJIT_KEPT_CHUNK_TILES, 1-8) and its channel
// tile's row in bytes (NORMJIT_KEPT_ROW_BYTES, 16-256), forced for measurements; 0 where unset.
// Read once per process.
int kept_split_chunk_tiles_override();
int kept_split_row_bytes_override();
// Whether the resident forward takes as many chunks as fit its fewest steps
// (NORMJIT_RESIDENT_BALANCE, default 1; 0 keeps the fewest chunks that fit a slot, for
// measurements). Read once per process.
bool resident_balance_enabled();
// How much of its next round's chunk a streamed NCDHW split asks L2 for before each exchange, in
// percent (NORMJIT_L2_PREFETCH, 0-100; 0 turns it off). Read once per process.
int l2_prefetch_percent();

struct Launch {
  KernelConfig config = zeroed<KernelConfig>();
  int chunks = 1;              // CTAs per instance
  int64_t chunk_vectors = 0;   // vectors per chunk
  int64_t grid = 1;            // CTAs
  bool cooperative = false;    // chunks exchange partials: every CTA must be co-resident
  int64_t counters = 0;        // workspace sizes (elements), 0 = not needed
  int64_t partials = 0;
  int64_t scratch = 0;
  int64_t exchange = 0;        // the resident split's tagged words (8 bytes each)
  // Every CTA holds all N samples of its channels and writes the backward's dweight/dbias itself,
  // without a grid-wide finishing pass: NCDHW by walking instances channel by channel (n
  // fastest); NDHWC where N = 1, or with N > 1 through a cluster of a channel tile's N CTAs
  // (KernelConfig cluster; with_workspace).
  bool channel_major = false;
  // CTAs per thread-block cluster (1: no cluster launch).
  int cluster = 1;
  // The resident split: phase C starts the next chunk's load right after reading its slot, not at
  // the step's end (resident_split.cuh; early_refill_pays).
  bool early_refill = false;
  // The streamed NCDHW split (sm_90): vectors of its next round's chunk a CTA asks L2 for before
  // it waits at the exchange (kernels/tile_ring.cuh, ring_prefetch_next_round); 0 = none.
  int64_t l2_prefetch_vectors = 0;
  // Dynamic shared memory of the launch when less than its kernel's ring (the kept channels-last
  // split: the slots its chunks fill); 0 = the kernel's whole ring (ring_bytes).
  int64_t smem_bytes = 0;
  const char* tier = "";       // the size tier, for explain
};

// The vector width (elements) a shape allows for a dtype.
int vector_width(const ShapeKey& s, DType dtype, Layout layout);
// Whether element offsets need 64-bit arithmetic.
bool needs_index64(const ShapeKey& s);

// The shared-memory ring of a streamed kernel (kernels/tile_ring.cuh): tensors streamed through
// it, and its size in bytes (dynamic shared memory of the launch; 0 without a ring).
int ring_tensors(const FusionKey& f);
int64_t ring_bytes(const FusionKey& f, const KernelConfig& c);

Launch choose_launch(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev, Policy policy);

// Whether `l` can be launched as built for this call on `dev`: the kernel's preconditions (grid and
// chunk sizes fit the launch and the kernel's int parameters, the chunks cover the instance and
// none is empty, a cooperative grid fits the co-resident CTAs its config guarantees, the chunks of
// an instance share a round, the resident split's deadlock-freedom condition and merge capacity,
// an L2 prefetch within one chunk).
// choose_launch always returns such a launch (tests/cpp/test_heuristics.cpp checks it on random
// calls); autotune drops candidates that are not.
bool launchable(const FusionKey& f, const ShapeKey& s, const Launch& l, const DeviceProfile& dev);

// The launches autotune times for a call (runtime/autotune.h): choose_launch's first, then up to
// five alternatives that are valid for this shape: larger size tiers that hold the instance, a
// split held in registers, and for the split tiers other chunk counts (rounds sized to 1/4, 1/2
// and all of the L2; one CTA per instance). Every config is one enumerate_configs lists, so the
// bound on distinct kernels holds with autotune on; chunk counts are run-time arguments and
// cost no compile.
std::vector<Launch> candidate_launches(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev, Policy policy);
// Same kernel and decomposition (config, chunks, chunk_vectors, grid, cooperative).
bool same_launch(const Launch& a, const Launch& b);

// Every config choose_launch can return for this fusion under the policy (the documented bound).
std::vector<KernelConfig> enumerate_configs(const FusionKey& f, Policy policy);  // for the H200
std::vector<KernelConfig> enumerate_configs(const FusionKey& f, Policy policy, const DeviceProfile& dev);

}  // namespace normjit
