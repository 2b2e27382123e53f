#include "schedule/heuristics.h"

#include "kernels/params.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace normjit {
namespace {

// Registers per thread each direction's kernels are capped at (through NJ_MIN_BLOCKS). Measured
// with ptxas -v: the forward needs ~62 with 4 cached 16-byte vectors, the backward ~100 (x, dy and
// possibly the residual in registers).
int register_budget(Direction d) { return d == Direction::forward ? 64 : 128; }

// One size tier: a CTA of `threads`, groups of `group` threads per instance, `items` vectors per
// thread under the bounded policy.
struct Tier {
  int threads, group, items;
  const char* name;
  bool shared_dy = false;  // the backward's x in registers, dy in shared memory (shared_dy_tier_fits)
};
// Smallest first. Groups <= 32 put several instances in one CTA (warp shuffles only); larger
// groups are the whole CTA (shared-memory reductions). The last tier holds 8 vectors per thread
// rather than using CTAs of 1024: measured on the H200, one 1024-thread CTA per SM reached 60% of
// copy bandwidth on (2,128,32^3) fp16 because loads, reductions and stores could not overlap.
constexpr Tier kTiers[] = {
    {256, 8, 4, "tiny (8 threads/instance)"},   {256, 32, 4, "small (warp/instance)"},
    {128, 128, 4, "medium (CTA of 128)"},       {256, 256, 4, "medium (CTA of 256)"},
    {512, 512, 4, "large (CTA of 512)"},
    {256, 256, 16, "large (CTA of 256, 16 vectors/thread, dy in shared memory)", true},
    {512, 512, 8, "large (CTA of 512, 8 vectors/thread)"},
};
constexpr int kSplitThreads = 512;
constexpr int kBoundedItems = 4;

int min_blocks_for(int threads, Direction d, const DeviceProfile& dev) {
  const int by_regs = dev.regs_per_sm / (threads * register_budget(d));
  const int by_threads = dev.max_threads_per_sm / threads;
  return std::max(1, std::min(by_regs, by_threads));
}

// Whether tier `t` may serve fusion f with vectors of `vec` elements on `dev`, whatever the shape.
// The dy-in-shared-memory tier serves the NCDHW backward whose slots hold dy alone (no residual
// read for an activation's derivative), with 16-byte vectors (cp.async: sm_80), under the bounded
// policy, where two such CTAs (64 KB of slots each, beside the driver's reserve) fit an SM.
bool tier_allowed(const Tier& t, const FusionKey& f, int vec, Policy policy, const DeviceProfile& dev) {
  if (!t.shared_dy) return true;
  const int mb = min_blocks_for(t.threads, f.direction, dev);
  const int64_t per_cta = int64_t(t.items) * t.threads * 16 + 2048;
  return f.direction == Direction::backward && f.layout == Layout::ncdhw && ring_tensors(f) == 2 &&
         vec * dtype_size(f.dtype) == 16 && policy == Policy::bounded && shared_dy_tier_enabled() &&
         dev.arch >= 80 && mb >= 2 && mb * per_cta <= dev.smem_per_sm;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Streamed tiles go through a ring of `stages` tiles in shared memory filled with cp.async
// (kernels/tile_ring.cuh for NCDHW, kernels/nhwc_ring.cuh for the channels-last forward), so
// that several tiles per thread are in flight without holding registers. Measured on the H200
// before the ring: the streamed NCDHW kernels moved 2-2.7 TB/s of DRAM traffic with their loads
// in registers, latency-bound at 1-2 CTAs per SM. The channels-last backward measured slower
// through a ring (nhwc_ring.cuh says why) and keeps its tiles in registers.
// How many stages of shared-memory slots (the ring's, or the kept split's: nhwc_kept_stages) fit
// beside `min_blocks` CTAs per SM; 0 where no slots apply.
int ring_capacity(const FusionKey& f, int threads, int items, int vec, int min_blocks, const DeviceProfile& dev) {
  if (dev.arch < 80 || vec * dtype_size(f.dtype) != 16) return 0;
  const int64_t stage = int64_t(ring_tensors(f)) * items * threads * 16;
  // The channels-last column sums: one float per thread and vector element (two in the backward).
  const int64_t static_smem =
      f.layout == Layout::ndhwc ? int64_t(threads) * vec * 4 * (f.direction == Direction::backward ? 2 : 1) : 0;
  // 2048: the driver's reserve per CTA and the kernels' small static shared memory.
  const int64_t per_cta = dev.smem_per_sm / std::max(1, min_blocks) - 2048 - static_smem;
  return int(std::clamp<int64_t>(per_cta / stage, 0, 255));
}

int ring_stages(const FusionKey& f, int threads, int items, int vec, int min_blocks, const DeviceProfile& dev) {
  if (f.layout == Layout::ndhwc && f.direction == Direction::backward) return 0;  // registers (above)
  const int stages = std::min(ring_stage_cap(), ring_capacity(f, threads, items, vec, min_blocks, dev));
  return stages >= 2 ? stages : 0;
}

// The resident split (kernels/resident_split.cuh): kSplitThreads / threads CTAs of `threads` per
// SM walk their chunks through resident_slots() shared-memory slots (load, statistics, wait,
// output). Each slot holds a chunk of every streamed tensor: `items` 16-byte vectors per thread
// and tensor, as many as a CTA's share of the SM's shared memory allows (the driver reserves 1 KB
// per CTA; static shared memory is under 1 KB). Fewer slots make bigger chunks (fewer steps) but
// less slack between a chunk's statistics and its output.
int resident_ctas(int threads) { return kSplitThreads / threads; }

// The resident split's grid for `units` chunks in all: every co-resident CTA, or one per chunk.
int64_t resident_grid(const DeviceProfile& dev, int threads, int64_t units) {
  return std::min<int64_t>(int64_t(dev.sms) * resident_ctas(threads), units);
}

int resident_items(const FusionKey& f, const DeviceProfile& dev, int threads) {
  const int64_t slot_per_item = int64_t(ring_tensors(f)) * threads * 16;
  const int64_t per_cta = dev.smem_per_sm / resident_ctas(threads) - 2048;
  return int(std::min<int64_t>(8, per_cta / (resident_slots() * slot_per_item)));
}

bool resident_possible(const FusionKey& f, int vec, const DeviceProfile& dev, int threads) {
  return f.train && f.layout == Layout::ncdhw && dev.arch >= 80 && vec * dtype_size(f.dtype) == 16 &&
         resident_items(f, dev, threads) >= 1;
}

// The most chunks an instance of the resident split may have at `threads` a CTA: thread j merges
// chunk j, and in the backward (plain sums) also chunk j + threads (resident_split.cuh).
int64_t resident_merge_capacity(const FusionKey& f, int threads) {
  return int64_t(threads) * (f.direction == Direction::backward ? 2 : 1);
}

// The CTA sizes the resident split tries, preferred first. The forward: two CTAs of 256 per SM,
// each with half the SM's slots (twice the chunks), so that one CTA's reductions, barriers and
// polls overlap the other's loads and stores; measured on the H200 (fp16 forward, against one CTA
// of 512, two A/B runs): (2,32,128^3) 170 -> 163-165 us, (2,32,80,192,160) 199 -> 185-188,
// (2,64,64^3) 52.4 -> 48.2-49.1, (2,30,128^3) 161 -> 155.
// The forward's limit is 256 chunks an instance (thread j merges chunk j), so larger instances
// take the CTA of 512. The backward merges plain sums, two chunks a thread (up to 512 chunks at
// 256: resident_merge_capacity), and takes two CTAs of 256 too; measured on the H200 (backward
// kernel, µs, fp16 unless noted; session 10): (2,32,128^3) 297-299 at 512, 299-300 at 256, bf16
// 313 -> 305; (2,64,64^3) 83 streamed, 87.5 resident at 512, 75.4 resident at 256 (hence the
// lower step count in resident_backward_pays at 256); (2,32,80,192,160) 359 streamed, 366 at 512,
// 399 at 256 (400 chunks). Since sessions 36 (backward) and 37 (forward), an instance of more
// chunks at 256 than half what that CTA merges takes the CTA of 512 (resident_plan, measured on
// the H100). NORMJIT_RESIDENT_THREADS=256|512 takes one size for both directions, for measurements.
std::vector<int> resident_thread_choices() {
  if (const int forced = resident_threads_override()) return {forced};
  return {256, 512};
}

int items_for(Policy policy, int64_t nvec, int group) {
  if (policy == Policy::bounded) return kBoundedItems;
  // exact: the fewest items (power of two, <= 8) that hold the instance in this group.
  int items = 1;
  while (items < 8 && int64_t(items) * group < nvec) items *= 2;
  return items;
}

}  // namespace

int ring_tensors(const FusionKey& f) {
  if (f.direction == Direction::forward) return 1;  // x (a residual is read where it is added)
  return f.residual && f.activation != Activation::identity ? 3 : 2;  // x, dy (, residual)
}

int64_t ring_bytes(const FusionKey& f, const KernelConfig& c) {
  const int tensors = keeps_dy_in_shared_memory(c) ? 1 : ring_tensors(f);  // dy alone
  return int64_t(c.stages) * tensors * c.items * c.threads * 16;
}

SplitMode split_mode() {
  // L2-sized streaming measured faster than register-held chunks on the H200 (fp16, fwd /
  // fwd+bwd): (2,32,128^3) 221 / 553 us against 278 / 715 us; (2,32,80,192,160) 250 / 671 against
  // 478 / 898 us: fewer, larger rounds beat reading x once from HBM in lockstep rounds. The
  // resident split reads x once without lockstep rounds: measured in one run on the H200 (fp16),
  // forward (2,32,128^3) 182 vs 206 us, fp32 340 vs 427 us, (2,32,80,192,160) 211 vs 219 us. Its
  // backward (x and dy in the slots: 3 vectors per thread, more steps) pays only on some shapes
  // (resident_backward_pays). Hence the automatic default (docs/PERF_NOTES.md).
  const char* v = std::getenv("NORMJIT_SPLIT");
  if (v && std::strcmp(v, "registers") == 0) return SplitMode::registers;
  if (v && std::strcmp(v, "l2") == 0) return SplitMode::l2;
  if (v && std::strcmp(v, "resident") == 0) return SplitMode::resident;
  return SplitMode::automatic;
}

// The variable's value where it is a whole number in [lo, hi]; the fallback where it is unset,
// not a number or out of range (so a default-on flag with lo = 0 stays on when unset).
static int env_int_in(const char* name, int lo, int hi, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return *end == '\0' && n >= lo && n <= hi ? int(n) : fallback;
}

int resident_slots() {
  // 4 slots (7 vectors a thread, fp16 forward) measured fastest of 3-6 on the H200: see
  // docs/PERF_NOTES.md. The variable is for such measurements; read once per process, so that
  // the enumerated kernel set (explain --all) and the selections agree.
  static const int slots = env_int_in("NORMJIT_RESIDENT_SLOTS", 3, 8, 4);
  return slots;
}

int resident_threads_override() {
  // The variable is for measurements; read once per process.
  static const int threads = [] {
    const int v = env_int_in("NORMJIT_RESIDENT_THREADS", 256, 512, 0);
    return v == 256 || v == 512 ? v : 0;
  }();
  return threads;
}

int ring_stage_cap() {
  // 3: the NCDHW ring's depth since it was introduced; 4 measured the same for the channels-last
  // forward (docs/PERF_NOTES.md). The variable is for such measurements; read once per process.
  static const int cap = env_int_in("NORMJIT_RING_STAGES", 2, 8, 3);
  return cap;
}

int nhwc_min_row_bytes() {
  // 32: a deep stage's channel tiles narrow down to rows of one whole 32-byte sector
  // (nhwc_deep_tier). 16 allows half sectors (one fp16 vector: the fp16 backward with a residual
  // then spills 20-38 bytes, ptxas, sm_90); 128 turns the narrowing off. The variable is for
  // measurements; read once per process.
  static const int bytes = env_int_in("NORMJIT_NHWC_MIN_ROW_BYTES", 2, 512, 32);
  return bytes;
}

bool shared_dy_tier_enabled() {
  // The variable is for measurements (the tier against the CTA of 512 it replaces); read once per
  // process, so that the enumerated kernel set and the selections agree.
  static const bool enabled = env_int_in("NORMJIT_SHARED_DY", 0, 1, 1) == 1;
  return enabled;
}

bool cluster_weight_grads_enabled() {
  // NORMJIT_CLUSTER_WEIGHT_GRADS=0 leaves the channels-last backward of N > 1 to the last CTA's
  // weight-gradient pass (nhwc_cluster_tier), for measurements. Read once per process.
  static const bool on = env_int_in("NORMJIT_CLUSTER_WEIGHT_GRADS", 0, 1, 1) == 1;
  return on;
}

int nhwc_backward_items_override() {
  static const int items = env_int_in("NORMJIT_NHWC_BWD_ITEMS", 1, 8, 0);
  return items;
}

int kept_split_chunk_tiles_override() {
  static const int tiles = env_int_in("NORMJIT_KEPT_CHUNK_TILES", 1, 8, 0);
  return tiles;
}
int kept_split_row_bytes_override() {
  static const int bytes = env_int_in("NORMJIT_KEPT_ROW_BYTES", 16, 256, 0);
  return bytes;
}

bool resident_balance_enabled() {
  // Read once per process, for measurements (resident_step_balanced_chunks).
  static const bool on = env_int_in("NORMJIT_RESIDENT_BALANCE", 0, 1, 1) == 1;
  return on;
}

int l2_prefetch_percent() {
  // A quarter of the next round's chunk. The streamed fp32 backward read exactly its ideal bytes
  // from DRAM (x and dy once: the second pass hit L2) but at 64 % of DRAM's peak (Nsight Compute,
  // (2,32,128^3)): the gap is the exchange's wait, not misses. Measured on the H100 (backward
  // kernel, CUPTI, session 37), (2,32,128^3) and (2,32,80,192,160): none 750 and 981 us, 25 %
  // 686 and 946-952, 50 % 704 and 981, 100 % 777 and 1100 (the whole chunk: (2,32,80,192,160)
  // read 1.46 GB from DRAM instead of 1.28, the next chunk evicting this one's second pass).
  // (1,32,128^3), (2,128,32^3) fp32 and (1,64,64^3) fp16 level at 100 %. The variable is for
  // such measurements; read once per process.
  static const int percent = env_int_in("NORMJIT_L2_PREFETCH", 0, 100, 25);
  return percent;
}

bool output_pass_reversed() {
  // The output pass re-reads what the statistics pass read; starting with the tiles read last
  // turns the L2-resident tail of a unit larger than L2 into hits (NDHWC). The NCDHW kernels keep
  // the forward order: their rounds fit in L2, and walking backwards measured more DRAM reads.
  static const bool reversed = [] {
    const char* v = std::getenv("NORMJIT_OUTPUT_ORDER");
    return !(v && std::strcmp(v, "forward") == 0);
  }();
  return reversed;
}

bool early_refill_pays(int64_t chunks, int64_t grid) {
  // Measured on the H100 (fp16 backward kernels, three A/B runs, docs/PERF_NOTES.md session 17):
  // instances of more chunks than the grid, whose phase C waits for peers a step or more behind,
  // gain from loads that run during that wait: (2,32,128^3) 342 chunks 2.0-2.9 % faster,
  // (1,32,128^3) 1.8-2.8 %; instances within one grid lose, the loads queued ahead of the poll
  // lengthen the step: (2,64,64,128,128) 171 chunks 2.9-3.4 % slower, (2,64,64^3) and the
  // forwards (<= 147 chunks) within 1 %.
  static const char* forced = std::getenv("NORMJIT_EARLY_REFILL");
  if (forced && (std::strcmp(forced, "0") == 0 || std::strcmp(forced, "1") == 0)) return forced[0] == '1';
  return chunks > grid;
}

Policy policy_from_env() {
  const char* v = std::getenv("NORMJIT_POLICY");
  return (v && std::strcmp(v, "exact") == 0) ? Policy::exact : Policy::bounded;
}
const char* policy_name(Policy p) { return p == Policy::exact ? "exact" : "bounded"; }

int vector_width(const ShapeKey& s, DType dtype, Layout layout) {
  const int es = dtype_size(dtype);
  int vec = std::min(16, int(s.align_bytes)) / es;
  // The vectorised dimension is the spatial one (NCDHW) or the channel one (NDHWC); every
  // instance start must stay aligned, so the other strides must be multiples too.
  const int64_t inner = layout == Layout::ncdhw ? s.spatial : s.C;
  auto fits = [&](int v) {
    return inner % v == 0 && s.stride_n % v == 0 &&
           (layout == Layout::ncdhw ? s.stride_c % v == 0 : s.stride_s % v == 0);
  };
  while (vec > 1 && !fits(vec)) vec /= 2;
  return std::max(vec, 1);
}

bool needs_index64(const ShapeKey& s) {
  const int64_t last = (s.N - 1) * s.stride_n + (s.C - 1) * s.stride_c + (s.spatial - 1) * s.stride_s;
  // +16: the widest vector access past the last element's start; the instance-chunk counters too.
  return last + 16 >= (int64_t(1) << 31) || s.N * s.C * 2048 >= (int64_t(1) << 31);
}

namespace {

// ------------------------------------------------------------------ launch builders
// Shared by choose_launch (the default) and candidate_launches (autotune), so that every candidate
// is built by the same code as a default launch of that kind.

int tier_items_override() {
  // NORMJIT_TIER_ITEMS=1|2|4|8: the NCDHW register tiers' vectors a thread instead of the bounded
  // policy's kBoundedItems, for measurements (docs/PERF_NOTES.md 000a: a deep instance fills 1 or
  // 2 of the 4 items, and the empty ones still cost instructions). A tier whose group cannot then
  // hold the instance is skipped, as under the exact policy. Read once per process.
  static const int items = [] {
    const int v = env_int_in("NORMJIT_TIER_ITEMS", 1, 8, 0);
    return (v & (v - 1)) == 0 ? v : 0;
  }();
  return items;
}

int tier_items(const Tier& t, Policy policy, int64_t nvec) {
  if (const int forced = tier_items_override()) return forced;
  return policy == Policy::bounded ? t.items : items_for(policy, nvec, t.group);
}

// Where the dy-in-shared-memory tier (kernels/instance_norm_backward.cuh, NJ_SHARED_DY) replaces
// the CTA of 512 x 8 vectors: where that tier's one CTA an SM (x and dy in 128 registers a thread)
// takes more waves than two CTAs of 256, each with 64 KB of dy in shared memory. Measured on the
// H100 (backward kernel, CUPTI, two interleaved rounds against NORMJIT_SHARED_DY=0, session 41),
// µs, fp16 and bf16 alike: (2,128,32^3) 23.4 -> 21.8 (two waves -> one); (2,80,28^3) 13.5 ->
// 12.1; (3,47,24,29,31) 12.7 -> 11.4; (1,140,16,32,40) 12.4 -> 11.3; (4,128,32^3) level (40.8 ->
// 40.5, bf16 40.8 -> 41.1: four waves -> two). Not where the items are forced (NORMJIT_TIER_ITEMS,
// measurements) or NORMJIT_SHARED_DY=0.
bool shared_dy_tier_fits(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev, const Tier& t) {
  if (tier_items_override() != 0) return false;
  const int mb = min_blocks_for(t.threads, f.direction, dev);
  const int64_t wide_slots = int64_t(dev.sms) * min_blocks_for(kSplitThreads, f.direction, dev);
  const int64_t instances = s.N * s.C;
  return ceil_div(instances, int64_t(dev.sms) * mb) < ceil_div(instances, wide_slots);
}

// Tier `t` with one group per instance, the instance held in registers (with t.shared_dy, x in
// registers and dy in one stage of shared-memory slots); threads == 0 when the tier's tile cannot
// hold the instance or the tier does not apply.
Launch ncdhw_tier(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev, Policy policy, const Tier& t) {
  Launch l;
  const int vec = vector_width(s, f.dtype, f.layout);
  const int64_t nvec = s.spatial / vec;
  if (!tier_allowed(t, f, vec, policy, dev)) return l;
  const int items = tier_items(t, policy, nvec);
  if (int64_t(t.group) * items < nvec) return l;
  if (t.shared_dy && !shared_dy_tier_fits(f, s, dev, t)) return l;
  const int mb = min_blocks_for(t.threads, f.direction, dev);
  l.config = make_config(t.threads, t.group, items, vec, mb, /*cached=*/true, needs_index64(s), t.shared_dy ? 1 : 0);
  l.chunks = 1;
  l.chunk_vectors = nvec;
  const int per_cta = t.threads / t.group;
  l.grid = std::min<int64_t>(ceil_div(s.N * s.C, per_cta), int64_t(dev.sms) * mb * 64);
  l.tier = t.name;
  return l;
}

// The split over `chunks` CTAs per instance (normalised so that no chunk is empty). Training chunks
// exchange partials: every CTA of a round must be co-resident (cooperative launch; the caller keeps
// chunks <= the resident CTAs) and the grid a multiple of the chunk count, so the chunks of one
// instance share a round. `cached` needs chunks >= ceil(nvec / tile).
Launch ncdhw_split(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev, bool cached, int64_t chunks,
                   const char* tier) {
  Launch l;
  const int vec = vector_width(s, f.dtype, f.layout);
  const int64_t nvec = s.spatial / vec;
  const int64_t instances = s.N * s.C;
  const int mb = min_blocks_for(kSplitThreads, f.direction, dev);
  const int64_t resident = int64_t(dev.sms) * mb;
  l.config = make_config(kSplitThreads, kSplitThreads, kBoundedItems, vec, mb, cached, needs_index64(s),
                         cached ? 0 : ring_stages(f, kSplitThreads, kBoundedItems, vec, mb, dev));
  l.chunk_vectors = ceil_div(nvec, std::max<int64_t>(1, chunks));
  l.chunks = int(ceil_div(nvec, l.chunk_vectors));
  l.cooperative = f.train && l.chunks > 1;
  l.grid = l.cooperative ? std::min(resident / l.chunks, instances) * l.chunks : instances * l.chunks;
  l.partials = l.cooperative ? 2 * instances * l.chunks : 0;
  // Streamed rounds that exchange: the next round's chunk on its way to L2 while this one waits.
  if (l.cooperative && !cached && dev.arch >= 90)
    l.l2_prefetch_vectors = l.chunk_vectors * l2_prefetch_percent() / 100;
  l.tier = tier;
  return l;
}

// The resident split of an instance: the CTA size and chunks per instance, or chunks == 0 where it
// does not apply. It applies to an instance of more than one chunk whose chunks reach at most
// (slots - 2) steps past any one of them (the kernel's deadlock-freedom condition: chunks - 1 <=
// (slots - 2) * grid, resident_split.cuh). The first of resident_thread_choices that fits wins.
struct ResidentPlan {
  int threads = 0;
  int64_t chunks = 0;
};

// The resident split at `threads` a CTA, or no plan (chunks 0) where an instance does not fit it.
ResidentPlan resident_plan_at(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev, int threads) {
  const int vec = vector_width(s, f.dtype, f.layout);
  if (!resident_possible(f, vec, dev, threads)) return {};
  const int64_t chunks = ceil_div(s.spatial / vec, int64_t(threads) * resident_items(f, dev, threads));
  const int64_t grid = resident_grid(dev, threads, s.N * s.C * chunks);
  if (chunks < 2 || chunks > resident_merge_capacity(f, threads) || chunks - 1 > int64_t(resident_slots() - 2) * grid)
    return {};
  return {threads, chunks};
}

// Whether the automatic split gives a backward of `chunks` chunks an instance the resident split
// rather than streaming twice: where it has enough steps (rounds of chunks a CTA) that the
// pipeline's fill and drain (3 steps) weigh little. Measured on the H200 (fp16, session 4):
// (2,64,64^3) at 512 a CTA, 22 chunks in 22 steps, 90 us resident against 86 streamed; at two CTAs
// of 256 per SM a step is half as long and one CTA's merge overlaps the other's loads: 43 chunks
// in 21 steps, 75 us resident against 83 streamed, so there 16 steps suffice (not measured below
// 21). Session 4 also limited instances to 1.4 grids (an instance spanning three steps waits for
// a peer's statistics), from (2,32,80,192,160) at 512: 200 chunks (1.5 grids), 368 us resident
// against 352 streamed. Early refill (early_refill_pays) came later and fills that wait: on the
// H100 (session 36) the same plan runs 387 us against 458 streamed, so the limit is gone; the
// plan itself bounds an instance at two grids (resident_plan_at). The forward, with 2.3x larger
// chunks, always pays (PERF_NOTES.md).
bool resident_backward_pays(const ShapeKey& s, const ResidentPlan& plan, const DeviceProfile& dev) {
  const int64_t units = s.N * s.C * plan.chunks;
  const int64_t grid = resident_grid(dev, plan.threads, units);
  return ceil_div(units, grid) >= (plan.threads == 256 ? 16 : 48);
}

ResidentPlan resident_plan(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev) {
  ResidentPlan plan;
  for (int threads : resident_thread_choices()) {
    plan = resident_plan_at(f, s, dev, threads);
    if (plan.chunks > 0) break;
  }
  // An instance of more chunks than half what a CTA of 256 merges (the forward 128, the backward
  // 256: two merges a thread, the chunks over more than a grid) takes the CTA of 512 where it fits
  // (and, backward, pays). Measured on the H100 (session 36, CUPTI, two rounds), backward fp16:
  // (2,32,128^3) 374 us at 256 (342 chunks), 357 at 512 (171); (2,32,80,192,160) 437 at 256
  // (400), 387 at 512 (200), 458 streamed; (2,64,64^3) keeps 256: 92 us (43 chunks) against 98 at
  // 512. Forward (session 37, same method, 256 forced by NORMJIT_RESIDENT_THREADS): fp16
  // (2,32,128^3) 208 us at 256 (147 chunks), 196 at 512; (2,32,80,192,160) 243 (172), 249, the
  // one loss; fp32 (2,32,112^3) 281 (196), 258; (2,64,48,160,160) 458, 444; (2,64,64^3) level
  // (19). (The H200 measured the forward 4-7 % faster at 256 in session 10, before early refill:
  // resident_thread_choices.)
  const int64_t wide_above = resident_merge_capacity(f, 256) / 2;
  if (resident_threads_override() == 0 && plan.threads == 256 && plan.chunks > wide_above) {
    const ResidentPlan wide = resident_plan_at(f, s, dev, 512);
    if (wide.chunks > 0 && (f.direction == Direction::forward || resident_backward_pays(s, wide, dev))) plan = wide;
  }
  return plan;
}

KernelConfig resident_config(const FusionKey& f, const DeviceProfile& dev, int threads, int vec, bool index64) {
  // min_blocks: the slots leave room for that many CTAs per SM (and 128 registers per thread).
  return make_config(threads, threads, resident_items(f, dev, threads), vec, resident_ctas(threads),
                     /*cached=*/false, index64, resident_slots(), /*resident=*/true);
}

// The resident forward's chunks an instance: from the plan's (the fewest that fit a slot) up to
// the most that take no more steps (units over the grid, rounded up), so that every step moves as
// little as it can. Chunk s of CTA b is unit s * grid + b (resident_split.cuh), so the grid walks
// the units in steps, and a last step partly full costs nearly a whole one. Measured on the H100
// (forward kernel, CUPTI, two interleaved rounds, session 38, against NORMJIT_RESIDENT_BALANCE=0),
// µs: fp16 (2,8,64^3) 16 x 19 chunks in 1.15 steps of 264 CTAs -> 16 x 33 in 2: 14.1 -> 12.6;
// fp32 (1,8,64^3) 8 x 37 -> 8 x 66: 13.5 -> 11.9; fp16 (1,2,64,256,256) 2 x 147 -> 2 x 198 at 512:
// 22.1 -> 20.6; (2,8,80,192,160) 86 -> 90 at 512: 67.7 -> 65.2; (2,48,96^3) 62 -> 63: 131.5 ->
// 127.6, fp32 124 -> 126: 256.4 -> 250.1; level (within 0.6 %): fp16 (2,64,64^3) and (1,64,64^3)
// 19 -> 20, (1,8,64^3) 19 -> 33 (one step either way), fp32 (2,8,64^3), (1,2,64,256,256).
// Not the backward: its instances of more chunks than the grid lost, fp16 (1,32,128^3) 342 -> 346
// chunks 174 -> 183 us, (2,8,80,192,160) 400 -> 412 120 -> 134 (their phase C waits on peers a
// grid behind), though (2,48,96^3), 144 -> 145 within one grid, gained 201 -> 191.
// Within what a CTA merges and the deadlock-freedom condition (resident_plan_at); where ties,
// the most chunks. NORMJIT_RESIDENT_BALANCE=0 keeps the plan's, for measurements.
int64_t resident_step_balanced_chunks(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev,
                                      const ResidentPlan& plan) {
  if (!resident_balance_enabled() || f.direction != Direction::forward) return plan.chunks;
  const int64_t nvec = s.spatial / vector_width(s, f.dtype, f.layout);
  const int64_t instances = s.N * s.C;
  // The chunks `wanted` gives once balanced (ceil(nvec / chunk_vectors)).
  auto actual = [&](int64_t wanted) { return ceil_div(nvec, ceil_div(nvec, wanted)); };
  auto grid = [&](int64_t chunks) { return resident_grid(dev, plan.threads, instances * chunks); };
  auto steps = [&](int64_t chunks) { return ceil_div(instances * chunks, grid(chunks)); };
  int64_t best = actual(plan.chunks);
  const int64_t fewest_steps = steps(best);
  const int64_t most = std::min(resident_merge_capacity(f, plan.threads), nvec);
  for (int64_t wanted = best + 1; wanted <= most; ++wanted) {
    const int64_t chunks = actual(wanted);
    if (steps(chunks) > fewest_steps || chunks - 1 > int64_t(resident_slots() - 2) * grid(chunks)) break;
    best = chunks;
  }
  return best;
}

Launch ncdhw_resident(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev, const ResidentPlan& plan) {
  Launch l;
  const int vec = vector_width(s, f.dtype, f.layout);
  const int64_t nvec = s.spatial / vec;
  const int64_t instances = s.N * s.C;
  l.config = resident_config(f, dev, plan.threads, vec, needs_index64(s));
  // Balanced chunks, each at most one slot; the forward's as many as take no more steps than the
  // fewest do.
  l.chunk_vectors = ceil_div(nvec, resident_step_balanced_chunks(f, s, dev, plan));
  l.chunks = int(ceil_div(nvec, l.chunk_vectors));
  l.cooperative = true;
  l.grid = resident_grid(dev, plan.threads, instances * l.chunks);
  l.exchange = 1 + 2 * instances * l.chunks;  // the generation, then a tagged pair per chunk
  l.early_refill = early_refill_pays(l.chunks, l.grid);
  l.tier = l.early_refill ? "split, resident in shared memory (pipelined, early refill)"
                          : "split, resident in shared memory (pipelined)";
  return l;
}

// Chunks per instance for streaming twice, sized so that what all co-resident CTAs read in one
// round fits in `budget_bytes` of L2: the second read then comes from L2, not HBM.
int64_t ncdhw_streamed_chunks(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev, int64_t budget_bytes) {
  const int vec = vector_width(s, f.dtype, f.layout);
  const int64_t nvec = s.spatial / vec;
  const int64_t resident = int64_t(dev.sms) * min_blocks_for(kSplitThreads, f.direction, dev);
  const int64_t tile = int64_t(kSplitThreads) * kBoundedItems;
  const int64_t bytes_per_vec = int64_t(vec) * dtype_size(f.dtype) * (f.direction == Direction::backward ? 2 : 1);
  const int64_t budget_vectors = std::max<int64_t>(tile, budget_bytes / resident / bytes_per_vec / tile * tile);
  return std::clamp<int64_t>(ceil_div(nvec, budget_vectors), 1, resident);
}

// The default streamed split's chunks: the L2 budget's count, raised where more chunks take fewer
// tile steps. A round runs resident / chunks instances, a chunk a CTA, and a CTA walks its chunk
// in tiles of kSplitThreads x kBoundedItems vectors, so the kernel's time goes with rounds x tile
// steps a chunk; the count is the smallest (fewest CTAs and exchanges) of the least rounds x
// steps, from the budget's count up to a chunk a co-resident slot. A round's reads stay within the
// budget (smaller chunks, no more CTAs). Measured on the H100 (backward kernel, CUPTI, session 35,
// bench/results/2026-12-07-session35): fp32 (2,32,128^3) took 86 chunks (86 CTAs on 132 SMs, 3
// steps each): 1042 us, against 907 at 130 chunks of 2 steps; but more chunks of as many steps
// lose: fp16 (2,32,80,192,160) 2 x 50 chunks of 3 steps 450 us, 2 x 65 of 3 steps 520; fp32 100
// -> 130 chunks of 3 steps 980 -> 1062 us (why is not profiled; chunks rounded to whole 128-byte
// lines did not help, session 36). One chunk (no exchange) stays one.
int64_t ncdhw_default_streamed_chunks(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev) {
  const int64_t budget = ncdhw_streamed_chunks(f, s, dev, dev.l2_bytes / 2);
  if (budget <= 1) return budget;
  const int64_t nvec = s.spatial / vector_width(s, f.dtype, f.layout);
  const int64_t instances = s.N * s.C;
  const int64_t resident = int64_t(dev.sms) * min_blocks_for(kSplitThreads, f.direction, dev);
  const int64_t tile = int64_t(kSplitThreads) * kBoundedItems;
  auto steps = [&](int64_t chunks) {
    const int64_t per_round = std::min(resident / chunks, instances);
    return ceil_div(instances, per_round) * ceil_div(ceil_div(nvec, chunks), tile);
  };
  int64_t best = budget;
  for (int64_t k = budget + 1; k <= resident; ++k)
    if (steps(k) < steps(best)) best = k;
  return best;
}

// The NCDHW backward's weight gradients in a thread-block cluster of a channel's N CTAs (sm_90,
// 2 <= N <= 8), where a tier holds one instance a CTA in one round: without it the last CTA to
// finish reads every instance's sums and writes dweight/dbias, a pass behind a fence and an
// atomic per CTA that cost ~2 us of the deep stages' backward (with_workspace). Units then walk
// channel by channel (channel_major), so a cluster of N consecutive CTAs holds one channel's
// samples (kernels/instance_norm_backward.cuh, ncdhw_cluster_weight_grads). Tiers of several
// instances a CTA whose groups hold every sample of their channels (channel_major) need none.
bool ncdhw_cluster_applies(const FusionKey& f, const DeviceProfile& dev) {
  return f.layout == Layout::ncdhw && f.direction == Direction::backward && f.train && f.affine && dev.arch >= 90 &&
         cluster_weight_grads_enabled();
}
bool ncdhw_cluster_fits(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev, const Launch& l) {
  const KernelConfig& c = l.config;
  return ncdhw_cluster_applies(f, dev) && s.N > 1 && s.N <= NJ_MAX_CLUSTER_RANKS && l.chunks == 1 && c.cached &&
         c.group == c.threads && !c.index64 && !l.cooperative && l.grid == s.N * s.C;
}

Launch choose_ncdhw(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev, Policy policy) {
  Launch l;
  const int vec = vector_width(s, f.dtype, f.layout);
  const int64_t nvec = s.spatial / vec;
  const int64_t instances = s.N * s.C;
  const bool exchange = f.train;  // eval needs no statistics: chunks never talk to each other

  for (const Tier& t : kTiers) {
    l = ncdhw_tier(f, s, dev, policy, t);
    if (l.config.threads != 0) break;
  }
  if (l.config.threads != 0 && ncdhw_cluster_fits(f, s, dev, l)) l.config.cluster = true;

  if (l.config.threads == 0) {
    // Split: several CTAs per instance.
    const int threads = kSplitThreads;
    const int mb = min_blocks_for(threads, f.direction, dev);
    const int64_t resident = int64_t(dev.sms) * mb;
    const int items = kBoundedItems;
    const int64_t tile = int64_t(threads) * items;
    const int64_t k_cached = ceil_div(nvec, tile);
    if (!exchange) {
      // Eval is elementwise: split for parallelism, each chunk a whole number of tiles.
      const int64_t chunks =
          std::min<int64_t>(k_cached, std::max<int64_t>(1, 4 * resident / std::max<int64_t>(1, instances)));
      l = ncdhw_split(f, s, dev, /*cached=*/false, chunks, "split (elementwise)");
    } else if (const ResidentPlan rp = resident_plan(f, s, dev);
               rp.chunks > 0 && (split_mode() == SplitMode::resident ||
                                 (split_mode() == SplitMode::automatic &&
                                  (f.direction == Direction::forward || resident_backward_pays(s, rp, dev))))) {
      // Every chunk in shared memory from its load to its output, pipelined: x is read once.
      l = ncdhw_resident(f, s, dev, rp);
    } else if (k_cached <= resident && split_mode() == SplitMode::registers) {
      // Every chunk stays in registers: x is read once. All CTAs of an instance must be co-resident.
      l = ncdhw_split(f, s, dev, /*cached=*/true, k_cached, "split, cached in registers");
    } else {
      // Stream each chunk twice (statistics, then output), a round's reads sized to half the L2.
      l = ncdhw_split(f, s, dev, /*cached=*/false, ncdhw_default_streamed_chunks(f, s, dev),
                      "split, streamed twice (second read from L2)");
    }
  }
  return l;
}

// Channels-last: a CTA owns (n, a tile of TC = lanes * vec channels, a chunk of positions).
// config.group holds the lanes across channels; rows = threads / lanes cover positions.
int nhwc_lanes(int64_t C, int vec) {
  const int cap = vec == 1 ? 32 : 8;  // 8 x 16 bytes = 128-byte rows per warp segment
  int lanes = 1;
  while (lanes < cap && int64_t(lanes) * vec < C) lanes *= 2;
  return lanes;
}

// How the channels-last kernels cover a sample: rows of memory, each `lanes` vectors wide.
// Flat (C not a multiple of the 16-byte vector): a sample's spatial * C elements are read as
// super-rows of lcm(C, vec) elements with 16-byte vectors (kernels/nhwc_tile.cuh); measured on
// the H200, the narrow vectors of C = 30 (4 bytes) and C = 20 (8 bytes) ran at 28-29 % of copy
// bandwidth, slower than torch.compile's forward. Only where every slot gets the same count
// (positions per super-row divide spatial), the lanes fit a warp's reach (<= 32) and every sample
// starts 16-byte aligned.
struct NhwcGeometry {
  int vec = 1;          // elements per vector
  int lanes = 1;        // vectors across a row
  bool flat = false;
  int64_t extent = 0;   // rows per sample: positions, or super-rows when flat
  int64_t tiles = 1;    // channel tiles per sample (1 when flat)
};

// `max_lanes` caps a tile's width below the natural one (nhwc_deep_tier); flat rows ignore it.
NhwcGeometry nhwc_geometry(const FusionKey& f, const ShapeKey& s, int max_lanes = 32) {
  NhwcGeometry g;
  g.vec = vector_width(s, f.dtype, f.layout);
  const int vec16 = 16 / dtype_size(f.dtype);
  if (g.vec < vec16 && s.C % vec16 != 0 && s.align_bytes >= 16 && s.stride_s == s.C && s.stride_n % vec16 == 0) {
    const int64_t gcd = std::min<int64_t>(s.C & -s.C, vec16);  // vec16 is a power of two
    const int64_t lanes = s.C / gcd, positions = vec16 / gcd;
    if (lanes <= 32 && s.spatial % positions == 0) {
      g.vec = vec16;
      g.lanes = int(lanes);
      g.flat = true;
      g.extent = s.spatial / positions;
      return g;
    }
  }
  g.lanes = std::min(nhwc_lanes(s.C, g.vec), max_lanes);
  g.extent = s.spatial;
  g.tiles = ceil_div(s.C, int64_t(g.lanes) * g.vec);
  return g;
}

constexpr int kNhwcThreads[] = {64, 256};
constexpr int kNhwcSplitThreads = 256;
// The NHWC kernels keep per-channel mean/rstd/weight/bias for their vector: ~96 registers.
int nhwc_min_blocks(int threads, const DeviceProfile& dev) {
  return std::max(1, std::min(dev.regs_per_sm / (threads * 128), dev.max_threads_per_sm / threads));
}

KernelConfig nhwc_config(const NhwcGeometry& g, int threads, int items, int min_blocks, bool cached, bool index64,
                         int stages, bool kept = false) {
  return make_config(threads, g.flat ? 0 : g.lanes, items, g.vec, min_blocks, cached, index64, stages, kept, g.flat);
}

// The kept split's slots a CTA holds (kernels/nhwc_ring.cuh: its chunk of at most that many tiles
// stays in shared memory from the statistics pass to the output pass); 0 where it does not apply.
// As many as fit beside two CTAs of 256 an SM: the forward's a tile of x each, and only where
// its streamed ring would have 2 stages or more; the backward's (which streams without a ring) x
// and dy (ring_tensors), from one stage. 8 at most: kernels are keyed by it.
constexpr int kNhwcMaxKeptStages = 8;
int nhwc_kept_stages(const FusionKey& f, int vec, const DeviceProfile& dev) {
  if (!f.train) return 0;
  const int stages = std::min(kNhwcMaxKeptStages, ring_capacity(f, kNhwcSplitThreads, kBoundedItems, vec,
                                                                nhwc_min_blocks(kNhwcSplitThreads, dev), dev));
  return f.direction == Direction::forward && stages < 2 ? 0 : stages;
}

// Vectors per thread and tile of the streamed channels-last split. The backward holds its tiles in
// registers (x, dy and, under an activation, the residual; the next tile's loads in flight beside
// this one's) together with 8 channels' mean, rstd, weight, bias and two sums, under the 128
// registers of two CTAs of 256 per SM. Four vectors spill wherever the tile or the epilogue grows
// (ptxas, CUDA 13.0, sm_90, bytes a thread: fp16 with an activation 44-112, bf16 124-504, with a
// residual 1094-1648; fp32 with a residual 28-44), and a spill inside the tile loop is costly:
// measured on the H200, (2,32,128^3) backward with leaky_relu and a residual 2030 us (fp16) and
// 2994 us (bf16) at 4 vectors against 539 (fp16, 2 vectors) and 576 (bf16, 1: 637 at 2, which
// still spills 20-52 bytes); bf16 without an epilogue 449 at 4, 335 at 3; fp16 with leaky_relu 381
// at 4, 336 at 3. Hence the most vectors that compile without a spill (tests/cpp:
// Cli.ChannelsLastBackwardDoesNotSpill checks it).
int nhwc_streamed_items(const FusionKey& f) {
  if (f.direction != Direction::backward) return kBoundedItems;
  if (const int forced = nhwc_backward_items_override()) return forced;
  const bool act = f.activation != Activation::identity;
  const bool residual = ring_tensors(f) == 3;  // x, dy and the residual (read only under an activation)
  switch (f.dtype) {
    case DType::f32: return residual ? 3 : 4;
    case DType::bf16: return residual ? 1 : act ? 2 : 3;
    default: return residual ? 2 : act ? 3 : 4;
  }
}

// A CTA of `threads` per (n, channel tile of at most `max_lanes` vectors) holding all positions in
// registers; threads == 0 when they do not fit.
Launch nhwc_tier(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev, Policy policy, int threads,
                 int max_lanes) {
  Launch l;
  const NhwcGeometry g = nhwc_geometry(f, s, max_lanes);
  const int rows = threads / g.lanes;
  const int items = policy == Policy::bounded ? kBoundedItems : items_for(policy, g.extent, rows);
  if (int64_t(rows) * items < g.extent) return l;
  const int mb = nhwc_min_blocks(threads, dev);
  l.config = nhwc_config(g, threads, items, mb, true, needs_index64(s), 0);
  l.chunks = 1;
  l.chunk_vectors = g.extent;
  l.grid = s.N * g.tiles;
  l.tier = threads == 64 ? "channels-last small (CTA of 64)" : "channels-last medium (CTA of 256)";
  return l;
}

// The channels-last split over `chunks` CTAs per (n, channel tile), streamed; as ncdhw_split. No
// channels-last split holds its chunk in registers: the cached kernels are the tiers, which hold a
// unit whole and leave the split's exchange out (kernels/nhwc_exchange.cuh). With it compiled in,
// the deep tiers of (2,320,8^3) and (2,320,4^3) used 126-128 registers a thread, without it
// 72-123 (ptxas, sm_90, docs/PERF_NOTES.md session 26); the cached split itself was an autotune
// candidate and NORMJIT_SPLIT=registers only.
Launch nhwc_split(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev, int64_t chunks, const char* tier,
                  int max_lanes = 32) {
  Launch l;
  const NhwcGeometry g = nhwc_geometry(f, s, max_lanes);
  const int64_t insts = s.N * g.tiles;
  const int mb = nhwc_min_blocks(kNhwcSplitThreads, dev);
  const int64_t resident = int64_t(dev.sms) * mb;
  const int items = nhwc_streamed_items(f);
  l.config = nhwc_config(g, kNhwcSplitThreads, items, mb, false, needs_index64(s),
                         ring_stages(f, kNhwcSplitThreads, items, g.vec, mb, dev));
  l.chunk_vectors = ceil_div(g.extent, std::max<int64_t>(1, chunks));
  l.chunks = int(ceil_div(g.extent, l.chunk_vectors));
  l.cooperative = f.train && l.chunks > 1;
  l.grid = l.cooperative ? std::min(resident / l.chunks, insts) * l.chunks : insts * l.chunks;
  // Per (n, channel tile): a pair per column for every chunk, then one for the merged totals
  // (kernels/nhwc_exchange.cuh, the scattered merge).
  l.partials = l.cooperative ? insts * (l.chunks + 1) * int64_t(g.lanes) * g.vec * 2 : 0;
  l.tier = tier;
  return l;
}

// Streamed chunks sized so one round's reads fit in `budget_bytes` of L2 (see ncdhw_streamed_chunks);
// at most one round of (n, channel tile) pairs.
int64_t nhwc_streamed_chunks(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev, int64_t budget_bytes) {
  const NhwcGeometry g = nhwc_geometry(f, s);
  const int rows = kNhwcSplitThreads / g.lanes;
  const int64_t resident = int64_t(dev.sms) * nhwc_min_blocks(kNhwcSplitThreads, dev);
  const int64_t row_bytes =
      int64_t(g.lanes) * g.vec * dtype_size(f.dtype) * (f.direction == Direction::backward ? 2 : 1);
  const int64_t tile_rows = int64_t(rows) * nhwc_streamed_items(f);
  const int64_t budget_rows = std::max<int64_t>(tile_rows, budget_bytes / resident / row_bytes / tile_rows * tile_rows);
  return std::clamp<int64_t>(ceil_div(g.extent, budget_rows), 1, std::max<int64_t>(1, resident / (s.N * g.tiles)));
}

// The default streamed split's chunks: the L2 budget's count, raised to fill every co-resident
// CTA slot as long as each chunk keeps kNhwcMinChunkTiles tiles, where the budget already splits
// (one chunk needs no exchange: (2,320,8^3)'s forward measured 9.8 us whole, 11.0-11.6 in two).
// A tensor that fits the budget in few chunks otherwise leaves slots idle or unevenly shared: (2,128,32^3) took 37 chunks of 4
// (n, channel tile) pairs, 148 CTAs on 132 SMs, and measured 24.4 us against 21.4 for 66 chunks
// (264 CTAs); (2,256,16^3) 13.9 us with 5 chunks against 10.4 with 11 (H200, fp16 forward,
// autotune timings of session 9, once the exchange's loads were 16 bytes wide).
constexpr int64_t kNhwcMinChunkTiles = 2;
int64_t nhwc_default_chunks(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev) {
  const NhwcGeometry g = nhwc_geometry(f, s);
  // In rows of kBoundedItems-vector tiles whatever the kernel's items (the measured chunk size).
  const int64_t tile_rows = int64_t(kNhwcSplitThreads / g.lanes) * kBoundedItems;
  const int64_t resident = int64_t(dev.sms) * nhwc_min_blocks(kNhwcSplitThreads, dev);
  const int64_t fill = std::min(resident / (s.N * g.tiles), g.extent / (kNhwcMinChunkTiles * tile_rows));
  const int64_t budget = nhwc_streamed_chunks(f, s, dev, dev.l2_bytes / 2);
  return budget > 1 ? std::max(budget, fill) : budget;
}

// The channels-last split that reads x once: every (n, channel tile) unit cut into chunks of at
// most nhwc_kept_stages tiles, each held in its CTA's shared memory across the exchange, all
// co-resident (one round), with the streamed split's chunks (nhwc_default_chunks) where they fit;
// the launch's shared memory is the slots its chunks fill. threads == 0 where the tensor does not
// fit on chip that way ((2,64,64^3) fp16: 64 MB against ~26 MB of slots on the H100). Measured on
// the H100 (fp16 forward, CUPTI, against the streamed split): (2,128,32^3) 24.2 -> 23.1 us,
// (1,64,58,58,60) 34.8 -> 30.9, (2,16,32^3) 9.9 -> 9.7 (session 21), and (2,256,16^3), whose
// 16 chunks are fewer than the exchange's 64 columns (every CTA reads every chunk's pairs),
// 11.4 -> 11.0 (session 22, slots sized to the chunk; 14.1 in session 21 with every CTA
// reserving all six slots).
// The lanes (vectors) of a channel tile whose rows are `row_bytes` wide, at most g's.
int nhwc_lanes_for_row(const FusionKey& f, const NhwcGeometry& g, int row_bytes) {
  return std::clamp(row_bytes / (g.vec * dtype_size(f.dtype)), 1, g.lanes);
}

// Whether a tile of `lanes` vectors still reads rows of nhwc_min_row_bytes: a narrower row would
// read part of a 32-byte sector for every position.
bool nhwc_row_wide_enough(const FusionKey& f, const NhwcGeometry& g, int lanes) {
  return lanes >= 1 && lanes * g.vec * dtype_size(f.dtype) >= nhwc_min_row_bytes();
}

// The kept split with channel tiles of at most `max_lanes` vectors; threads == 0 where it does not
// apply.
Launch nhwc_kept_split_at(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev, int max_lanes) {
  const NhwcGeometry g = nhwc_geometry(f, s, max_lanes);
  const int stages = nhwc_kept_stages(f, g.vec, dev);
  // Not for flat rows: their kept kernel spilled (fp16 C = 30: 80 bytes a thread against 8 streamed;
  // ptxas, sm_90), and flat shapes that fit on chip are few. Both directions: the backward keeps x
  // and dy (session 33, H100 fp16: (2,256,16^3) 13.9 -> 12.4 us, 14^3 13.3 -> 11.2, against the
  // split that streams its chunk twice).
  if (stages == 0 || g.flat || split_mode() == SplitMode::l2 || split_mode() == SplitMode::registers) return {};
  const int64_t tile_rows = int64_t(kNhwcSplitThreads / g.lanes) * kBoundedItems;
  const int64_t insts = s.N * g.tiles;
  const int64_t resident = int64_t(dev.sms) * nhwc_min_blocks(kNhwcSplitThreads, dev);
  const int64_t fewest = ceil_div(g.extent, stages * tile_rows);
  if (insts * fewest > resident) return {};
  // (Clamped for a narrowed tile, whose units outnumber the natural width's: one round.)
  int64_t chunks = std::min(std::max(fewest, nhwc_default_chunks(f, s, dev)), resident / insts);
  const int forced_tiles = kept_split_chunk_tiles_override();
  if (forced_tiles > 0 && forced_tiles <= stages && insts * ceil_div(g.extent, forced_tiles * tile_rows) <= resident)
    chunks = ceil_div(g.extent, forced_tiles * tile_rows);
  Launch l = nhwc_split(f, s, dev, chunks, "channels-last split, kept in shared memory", g.lanes);
  l.config = nhwc_config(g, kNhwcSplitThreads, kBoundedItems, l.config.min_blocks, false, needs_index64(s), stages,
                         true);
  l.smem_bytes = ceil_div(l.chunk_vectors, tile_rows) * ring_bytes(f, l.config) / stages;
  return l;
}

// The kept split at the natural tile width, or at rows of nhwc_min_row_bytes (32 bytes: 16 fp16
// channels) where the natural tiles leave the SMs idle: a grid below half the SMs, or over a
// quarter of the tiles' lanes past C. Measured on the H100 (session 33, CUPTI, fp16, forward and
// backward, against the natural width; bench/results/2026-12-07-session33/kn_ab_table.md):
// (1,96,16^3) (32 CTAs) 8.0 -> 7.1 us and 7.6 -> 6.0; (1,128,16^3) 8.0 -> 7.3 and 7.6 -> 6.4;
// (3,72,20,21,22) (C = 72 in tiles of 64: 44 % idle) 14.9 -> 12.6 and 15.6 -> 14.8; (2,80,20^3)
// 11.0 -> 10.2 and 11.7 -> 11.2; (1,40,24^3) 9.9 -> 8.5 and 8.3 -> 7.5. Where the natural grid
// already fills the SMs, 32-byte rows lost (kc_ab_table.md, NORMJIT_KEPT_ROW_BYTES=32):
// (2,256,16^3) backward 12.3 -> 13.6, (4,320,12^3) 13.1 -> 13.8, (2,128,32^3) forward 21.4 -> 27.1;
// and chunks of 1 or 3 tiles instead of the default (NORMJIT_KEPT_CHUNK_TILES) won nowhere by
// more than noise but (2,256,14^3)'s forward at 3 (0.96).
Launch nhwc_kept_split(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev) {
  const NhwcGeometry natural = nhwc_geometry(f, s);
  if (const int forced = kept_split_row_bytes_override())
    return nhwc_kept_split_at(f, s, dev, nhwc_lanes_for_row(f, natural, forced));
  const Launch wide = nhwc_kept_split_at(f, s, dev, natural.lanes);
  const int narrow_lanes = nhwc_lanes_for_row(f, natural, nhwc_min_row_bytes());
  if (wide.config.threads == 0 || narrow_lanes == natural.lanes) return wide;
  const int64_t tile_channels = int64_t(natural.lanes) * natural.vec;
  const bool idle_lanes = 4 * (natural.tiles * tile_channels - s.C) > natural.tiles * tile_channels;
  if (2 * wide.grid >= dev.sms && !idle_lanes) return wide;
  const Launch narrow = nhwc_kept_split_at(f, s, dev, narrow_lanes);
  return narrow.config.threads != 0 ? narrow : wide;
}

// The kept forward with one chunk a unit, where the kept split would cut small units into chunks
// and exchange their statistics: the channel tile narrows to 16-byte rows (one vector: 8 fp16
// channels) so that each CTA's slots hold every position of its unit, and no exchange runs.
// Only where the units fit one CTA an SM (a wave of at most `sms` CTAs) and a unit is at most
// kKeptWholeMaxBytes. Measured on the H200 (session 31, CUPTI, fp16 and bf16 alike), against the
// kept split: (2,256,11^3) 7.9 -> 6.0 us, (2,256,12^3) 8.3 -> 6.8, (1,320,12^3) 8.0 -> 6.3,
// (2,320,12^3) 8.4 -> 7.2, (2,64,12^3) 7.7 -> 6.3, (2,256,13^3) 8.6 -> 7.8 (35 KB a unit); level
// at (2,256,14^3) (44 KB, 9.1 -> 9.2), slower beyond: 15^3 9.6 -> 10.6 (54 KB), (2,256,16^3)
// 9.5 -> 12.2 (64 KB), (1,96,16^3) 7.8 -> 10.9; and where the grid passes the SMs, (4,320,12^3)
// 9.8 -> 10.9 (160 CTAs). bench/results/2026-12-07-session31/k*_kept_whole_ab_table.md.
// The backward the same way, for its sums and then its dx, x and dy kept (up to 3 tiles of 1024
// positions at two CTAs' share of an H100/H200 SM, 2 with a residual), its weight gradients summed in a cluster of the
// channel tile's N CTAs where nhwc_cluster_tier applies: it replaces a split streamed twice with
// an exchange ((2,256,12^3): 6 chunks of 8 units of 64 channels). Measured on the H100 (session
// 32, CUPTI, fp16 backward; bench/results/2026-12-07-session32/kwb_ab_table.md): (2,256,12^3)
// 12.5 -> 9.8 us, (1,320,12^3) 10.6 -> 7.2, (3,200,11,12,13) 13.2 -> 9.6, (2,256,13^3) 12.8 -> 11.6.
constexpr int64_t kKeptWholeMaxBytes = 36 * 1024;
constexpr int kKeptWholeRowBytes = 16;
Launch nhwc_kept_whole(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev) {
  const NhwcGeometry wide = nhwc_geometry(f, s);
  const int stages = nhwc_kept_stages(f, wide.vec, dev);
  if (stages == 0 || wide.flat || split_mode() == SplitMode::l2 || split_mode() == SplitMode::registers) return {};
  const int vector_bytes = wide.vec * dtype_size(f.dtype);
  const NhwcGeometry g = nhwc_geometry(f, s, nhwc_lanes_for_row(f, wide, kKeptWholeRowBytes));
  const int64_t tile_rows = int64_t(kNhwcSplitThreads / g.lanes) * kBoundedItems;
  const int64_t tiles = ceil_div(g.extent, tile_rows);
  if (tiles > stages || s.N * g.tiles > dev.sms || g.extent * g.lanes * vector_bytes > kKeptWholeMaxBytes) return {};
  Launch l;
  l.config = nhwc_config(g, kNhwcSplitThreads, kBoundedItems, nhwc_min_blocks(kNhwcSplitThreads, dev), false,
                         needs_index64(s), stages, true);
  l.chunks = 1;
  l.chunk_vectors = g.extent;
  l.grid = s.N * g.tiles;
  l.smem_bytes = tiles * ring_bytes(f, l.config) / stages;
  l.tier = "channels-last split, kept whole in shared memory (one chunk a unit)";
  return l;
}

// The smaller tier (a CTA of 64, else 256) that holds a whole unit of channel tiles at most
// `max_lanes` vectors wide; threads == 0 when neither does.
Launch nhwc_fitting_tier(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev, Policy policy,
                         int max_lanes) {
  for (int threads : kNhwcThreads) {
    const Launch l = nhwc_tier(f, s, dev, policy, threads, max_lanes);
    if (l.config.threads != 0) return l;
  }
  return {};
}

// The channels-last backward of 2-8 samples on sm_90 and later, one CTA per (sample, channel
// tile) unit held in registers (the tiers) or in shared memory (nhwc_kept_whole), 32-bit
// indexing, not flat, no residual: the kernel variant whose CTAs form a thread-block cluster per
// channel tile and sum dweight/dbias there (KernelConfig
// cluster; kernels/instance_norm_nhwc.cuh cluster_weight_grads), with no last CTA's pass. A
// residual's tile left no registers for it (124-396 bytes of spills, ptxas sm_90, fp16
// leaky_relu). Session 23 (exp/cluster-wgrad, the step compiled into every such kernel and
// chosen at run time): 0.3-0.5 us less than the pass, but the kernels carrying it ran 0.2-0.5 us
// slower without it, hence a config bit here, so that every other kernel keeps its code.
bool nhwc_cluster_applies(const FusionKey& f, const DeviceProfile& dev) {
  return f.layout == Layout::ndhwc && f.direction == Direction::backward && f.affine && !f.residual &&
         dev.arch >= 90 && cluster_weight_grads_enabled();
}
bool nhwc_cluster_fits(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev, const Launch& l) {
  const KernelConfig& c = l.config;
  const bool on_chip = c.cached ? c.stages == 0 : c.resident && c.stages > 0;  // a tier, or the kept whole
  return nhwc_cluster_applies(f, dev) && s.N > 1 && s.N <= NJ_MAX_CLUSTER_RANKS && l.chunks == 1 && on_chip &&
         !c.flat && !c.index64 && !l.cooperative && c.group > 0 &&
         l.grid == s.N * ceil_div(s.C, int64_t(c.group) * c.vec);
}
Launch nhwc_cluster_tier(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev, Launch l) {
  if (nhwc_cluster_fits(f, s, dev, l)) l.config.cluster = true;
  return l;
}
// Whether the backward of a tier's launch `l` ends without the last CTA's pass over every
// channel's weight gradients: no weights, one sample (each CTA writes its channels': with_workspace
// channel_major) or a cluster per channel tile.
bool nhwc_backward_without_pass(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev, const Launch& l) {
  return !f.affine || s.N == 1 || nhwc_cluster_fits(f, s, dev, l);
}

// Deep stages (few positions, many channels) have few (sample, channel tile) units at the natural
// tile width of 8 vectors (64 fp16 channels): (2,320,8^3) ran as 10 CTAs streaming a unit twice,
// ~10 us on the H100 and H200 against ~6.5 for its NCDHW kernel; (2,320,4^3) as 10 CTAs of 256.
// Narrower tiles give more units, each one held whole in a CTA's registers with no exchange
// between CTAs: halve the lanes while the grid has fewer CTAs than the GPU has SMs and a row
// keeps a whole 32-byte sector (nhwc_min_row_bytes). threads == 0 when no tier holds a unit.
Launch nhwc_deep_tier(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev, Policy policy) {
  const NhwcGeometry g = nhwc_geometry(f, s);
  Launch best = nhwc_fitting_tier(f, s, dev, policy, g.lanes);
  // A backward that ends in the last CTA's weight-gradient pass narrows only where no CTA holds a
  // unit at the natural width: measured on the H100 (session 18), (2,320,4^3)'s backward took
  // 9.6 us in 40 CTAs of 64 against 8.0 in 10 of 256 (its forward 6.0 against 6.9), since that
  // pass then ran in one CTA of 64. Without the pass (nhwc_backward_without_pass) it narrows as
  // the forward does: measured on the H100 (session 24, CUPTI), (2,320,4^3) fp16 4.8 -> 4.7 us
  // (bf16 4.4 -> 4.1), (2,320,5^3) 5.2 -> 5.0, (1,320,4^3) 3.3 -> 3.2; none slower. Without
  // weights (no pass at all), (2,320,4^3) 3.0 -> 2.8, (4,320,4^3) 3.1 -> 2.9.
  // (Whether a pass follows is the same at every width: each tier holds one unit a CTA.)
  if (g.flat || (best.config.threads != 0 && f.direction == Direction::backward &&
                 !nhwc_backward_without_pass(f, s, dev, best)))
    return best;
  int lanes = g.lanes / 2;
  for (; nhwc_row_wide_enough(f, g, lanes); lanes /= 2) {
    if (best.config.threads != 0 && best.grid >= dev.sms) break;
    if (const Launch narrower = nhwc_fitting_tier(f, s, dev, policy, lanes); narrower.config.threads != 0)
      best = narrower;
  }
  // Where no tile of whole-sector rows holds a unit, so that a split with its exchange would
  // follow, rows of one 16-byte vector (half a sector) may still: nnU-Net's (2,320,5,12,10) (the
  // fifth stage of an 80x192x160 patch, 600 positions) ran its forward as a kept split of 10 CTAs
  // and its backward as a streamed split of 2 chunks; in tiles of 8 fp16 channels both are 80
  // CTAs holding a unit each. Measured on the H200 (session 31, NORMJIT_NHWC_MIN_ROW_BYTES=16):
  // (3,200,9,10,11) forward 8.2 -> 4.8 us. Not for a backward with a residual, whose fp16 tiles
  // then spill (nhwc_min_row_bytes), nor where NORMJIT_NHWC_MIN_ROW_BYTES turned the narrowing off.
  const bool residual_backward = f.direction == Direction::backward && f.residual;
  if (best.config.threads == 0 && !residual_backward && nhwc_min_row_bytes() <= 32)
    for (; lanes >= 1 && lanes * g.vec * dtype_size(f.dtype) >= 16 && best.config.threads == 0; lanes /= 2)
      best = nhwc_fitting_tier(f, s, dev, policy, lanes);
  return best;
}

Launch choose_nhwc(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev, Policy policy) {
  if (const Launch l = nhwc_deep_tier(f, s, dev, policy); l.config.threads != 0) return nhwc_cluster_tier(f, s, dev, l);
  const NhwcGeometry g = nhwc_geometry(f, s);
  const int rows = kNhwcSplitThreads / g.lanes;
  const int64_t insts = s.N * g.tiles;
  const int64_t resident = int64_t(dev.sms) * nhwc_min_blocks(kNhwcSplitThreads, dev);
  const int64_t k_cached = ceil_div(g.extent, int64_t(rows) * kBoundedItems);
  if (!f.train)
    return nhwc_split(f, s, dev, std::min<int64_t>(k_cached, std::max<int64_t>(1, 4 * resident / insts)),
                      "channels-last split (elementwise)");
  if (const Launch l = nhwc_kept_whole(f, s, dev); l.config.threads != 0) return nhwc_cluster_tier(f, s, dev, l);
  if (const Launch l = nhwc_kept_split(f, s, dev); l.config.threads != 0) return l;
  // Streamed twice, chunks sized so one round's reads fit in half the L2 (see choose_ncdhw), and
  // enough of them to fill the GPU.
  return nhwc_split(f, s, dev, nhwc_default_chunks(f, s, dev), "channels-last split, streamed twice");
}

// Workspace: exchange counters (2 per instance + 1 grid-wide), partials, per-instance scratch.
// The backward's weight gradients need no grid-wide pass where each CTA holds every sample of its
// channels (channel_major): the CTAs write dweight/dbias themselves.
// - NCDHW: one chunk per instance and groups per CTA a multiple of N. Measured on the H200, the
//   last-CTA pass (fence, atomic, a serial read of every instance's sums) was ~2 of the 5.6-6 us
//   of (2,320,4^3) and (2,320,8^3).
// - NDHWC: N = 1, where a channel's only instance is its sample's (chunk 0 writes the totals of
//   the exchange). Measured on the H100 (session 23, CUPTI, fp16), the backward of (1,320,4^3)
//   took 3.4 us against 4.6 with the pass, (1,320,8^3) 4.1 against 5.7, (1,256,16^3) 10.8
//   against 12.3. For N = 2, holding both samples of a channel tile in one CTA (exp/batch-tile)
//   halved the CTAs and lost ((2,320,8^3) 7.0 us against 6.0).
// - NDHWC with 2 <= N <= 8: the cluster variant of the tiers (nhwc_cluster_tier), launched in
//   clusters of the channel tile's N CTAs.
Launch with_workspace(const FusionKey& f, const ShapeKey& s, Launch l) {
  const int64_t instances = s.N * s.C;
  const int64_t groups_per_cta = l.config.group > 0 ? l.config.threads / l.config.group : 0;
  const bool weight_grads = f.direction == Direction::backward && f.affine;
  l.channel_major = weight_grads && (f.layout == Layout::ncdhw ? (l.chunks == 1 && groups_per_cta > 0 &&
                                                                   groups_per_cta % s.N == 0) || l.config.cluster
                                                                : s.N == 1 || l.config.cluster);
  l.cluster = l.config.cluster ? int(s.N) : 1;
  const bool grid_reduce = (f.direction == Direction::forward && f.running) ||
                           (weight_grads && !l.channel_major);
  if (l.cooperative || grid_reduce) {
    l.counters = 2 * instances + 1;
    l.scratch = grid_reduce ? 2 * instances : 0;
  } else {
    l.partials = 0;
  }
  return l;
}

}  // namespace

Launch choose_launch(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev, Policy policy) {
  const Launch l = f.layout == Layout::ncdhw ? choose_ncdhw(f, s, dev, policy) : choose_nhwc(f, s, dev, policy);
  return with_workspace(f, s, l);
}

// The kernels' preconditions (heuristics.h).
bool launchable(const FusionKey& f, const ShapeKey& s, const Launch& l, const DeviceProfile& dev) {
  const int64_t extent = f.layout == Layout::ncdhw ? s.spatial / l.config.vec : nhwc_geometry(f, s).extent;
  const int64_t cv = l.chunk_vectors;
  if (l.config.threads == 0 || l.grid < 1 || l.grid > 0x7fffffff || l.chunks < 1 || cv < 1 || cv > 0x7fffffff)
    return false;
  if (int64_t(l.chunks) * cv < extent || int64_t(l.chunks - 1) * cv >= extent) return false;
  if (l.l2_prefetch_vectors < 0 || l.l2_prefetch_vectors > cv) return false;  // a part of one chunk
  const bool ncdhw_resident = l.config.resident && f.layout == Layout::ncdhw;
  if (l.cooperative && (l.grid > int64_t(dev.sms) * l.config.min_blocks || (!ncdhw_resident && l.grid % l.chunks != 0)))
    return false;
  // The resident split: one chunk per slot, and its deadlock-freedom condition (resident_split.cuh).
  if (ncdhw_resident && (cv > int64_t(l.config.threads) * l.config.items ||
                         l.chunks > resident_merge_capacity(f, l.config.threads) ||
                         l.chunks - 1 > int64_t(l.config.stages - 2) * l.grid || l.exchange < 1))
    return false;
  // The kept channels-last split: a chunk of at most `stages` tiles (nhwc_ring.cuh).
  if (l.config.resident && f.layout == Layout::ndhwc) {
    const int lanes = l.config.flat ? nhwc_geometry(f, s).lanes : l.config.group;
    const int64_t tile_rows = int64_t(l.config.threads / std::max(1, lanes)) * l.config.items;
    if (l.config.cached || l.config.stages < 1 || cv > l.config.stages * tile_rows) return false;
  }
  if (l.chunks > 1 && f.train && !l.cooperative) return false;
  // The channels-last cached kernels have no exchange (nhwc_split), nor have the NCDHW kernels of
  // several instances a CTA (kernels/common.cuh NJ_NCDHW_SPLITS).
  if (f.layout == Layout::ndhwc && l.config.cached && l.chunks > 1) return false;
  if (f.layout == Layout::ncdhw && f.train && l.config.group != l.config.threads && l.chunks > 1) return false;
  if (l.config.cluster && !(f.layout == Layout::ncdhw ? ncdhw_cluster_fits(f, s, dev, l) : nhwc_cluster_fits(f, s, dev, l)))
    return false;
  return true;
}

// ------------------------------------------------------------------ autotune candidates
namespace {

constexpr size_t kMaxCandidates = 6;

struct CandidateList {
  const FusionKey& f;
  const ShapeKey& s;
  const DeviceProfile& dev;
  std::vector<Launch> out;

  // Adds `l` unless it cannot launch, repeats a candidate (same kernel and decomposition) or the
  // list is full.
  void add(const Launch& built) {
    if (built.config.threads == 0 || out.size() >= kMaxCandidates) return;
    const Launch l = with_workspace(f, s, built);
    if (!launchable(f, s, l, dev)) return;
    for (const Launch& c : out)
      if (same_launch(c, l)) return;
    out.push_back(l);
  }
};

// Chunks that give every SM about one CTA when instances are few (at least `lo`), without making a
// chunk smaller than one vector per thread.
int64_t parallel_chunks(int64_t instances, int64_t extent, int64_t threads, int64_t lo, const DeviceProfile& dev) {
  const int64_t want = std::max(lo, ceil_div(dev.sms, std::max<int64_t>(1, instances)));
  return std::min(want, std::max(lo, extent / threads));
}

void ncdhw_candidates(CandidateList& c, Policy policy) {
  const FusionKey& f = c.f;
  const ShapeKey& s = c.s;
  const DeviceProfile& dev = c.dev;
  const int vec = vector_width(s, f.dtype, f.layout);
  const int64_t nvec = s.spatial / vec;
  const int64_t instances = s.N * s.C;
  const int64_t resident = int64_t(dev.sms) * min_blocks_for(kSplitThreads, f.direction, dev);
  const int64_t tile = int64_t(kSplitThreads) * kBoundedItems;
  const int64_t k_cached = ceil_div(nvec, tile);

  // The default's tier (a repeat) and the next two larger ones: more threads per instance, fewer
  // vectors per thread. Larger still only idles threads.
  int tiers = 0;
  for (const Tier& t : kTiers) {
    if (tiers == 3) continue;
    const Launch l = ncdhw_tier(f, s, dev, policy, t);
    if (l.config.threads == 0) continue;
    ++tiers;
    c.add(l);
  }
  const bool fits_a_tier = tiers > 0;
  if (f.train) {
    // Split held in registers: the fewest chunks, and (few instances) enough chunks to fill the SMs.
    for (int64_t k : {std::max<int64_t>(2, k_cached), parallel_chunks(instances, nvec, kSplitThreads, 2, dev)})
      if (k >= k_cached && k <= resident && nvec >= 2 * int64_t(kSplitThreads))
        c.add(ncdhw_split(f, s, dev, true, k, "split, cached in registers"));
    if (!fits_a_tier) {
      if (const ResidentPlan rp = resident_plan(f, s, dev); rp.chunks > 0) c.add(ncdhw_resident(f, s, dev, rp));
      // Streamed twice with rounds sized to a quarter, a half and all of the L2.
      for (int64_t budget : {dev.l2_bytes / 2, dev.l2_bytes / 4, dev.l2_bytes})
        c.add(ncdhw_split(f, s, dev, false, ncdhw_streamed_chunks(f, s, dev, budget),
                          "split, streamed twice (second read from L2)"));
      // One CTA per instance, no exchange: enough when the instances alone fill the GPU.
      if (instances >= resident) c.add(ncdhw_split(f, s, dev, false, 1, "split, streamed twice (CTA per instance)"));
    }
  } else if (nvec >= 2 * int64_t(kSplitThreads)) {
    // Eval is elementwise. The default splits into 4 CTAs per resident slot, chunks of at least a
    // tile; try 1 per slot, and 16 per slot with chunks down to one vector per thread.
    c.add(ncdhw_split(f, s, dev, false, std::min(k_cached, std::max<int64_t>(1, resident / instances)),
                      "split (elementwise)"));
    c.add(ncdhw_split(f, s, dev, false, std::min(nvec / kSplitThreads, std::max<int64_t>(1, 16 * resident / instances)),
                      "split (elementwise)"));
  }
}

void nhwc_candidates(CandidateList& c, Policy policy) {
  const FusionKey& f = c.f;
  const ShapeKey& s = c.s;
  const DeviceProfile& dev = c.dev;
  const NhwcGeometry g = nhwc_geometry(f, s);
  const int rows = kNhwcSplitThreads / g.lanes;
  const int64_t insts = s.N * g.tiles;
  const int64_t resident = int64_t(dev.sms) * nhwc_min_blocks(kNhwcSplitThreads, dev);
  const int64_t k_cached = ceil_div(g.extent, int64_t(rows) * kBoundedItems);

  bool fits_a_tier = false;
  for (int threads : kNhwcThreads) {  // the natural width's tiers
    const Launch l = nhwc_tier(f, s, dev, policy, threads, g.lanes);
    if (l.config.threads == 0) continue;
    fits_a_tier = true;
    c.add(l);
  }
  // Narrower channel tiles, each unit held whole by one CTA (nhwc_deep_tier's choices).
  if (!g.flat)
    for (int lanes = g.lanes / 2; nhwc_row_wide_enough(f, g, lanes); lanes /= 2)
      c.add(nhwc_fitting_tier(f, s, dev, policy, lanes));
  if (f.train) {
    // Splits that fill the SMs where few units would leave them idle (streamed: no channels-last
    // split holds its chunk in registers, nhwc_split says why).
    for (int64_t k : {std::max<int64_t>(2, k_cached), parallel_chunks(insts, g.extent, rows, 2, dev)})
      if (k >= k_cached && k <= resident && g.extent >= 2 * int64_t(rows))
        c.add(nhwc_split(f, s, dev, k, "channels-last split, streamed twice"));
    if (!fits_a_tier) {
      // The kept split at both widths nhwc_kept_split chooses between.
      c.add(nhwc_kept_split(f, s, dev));
      c.add(nhwc_kept_split_at(f, s, dev, g.lanes));
      c.add(nhwc_kept_split_at(f, s, dev, nhwc_lanes_for_row(f, g, nhwc_min_row_bytes())));
      for (int64_t budget : {dev.l2_bytes / 2, dev.l2_bytes / 4, dev.l2_bytes})
        c.add(nhwc_split(f, s, dev, nhwc_streamed_chunks(f, s, dev, budget),
                         "channels-last split, streamed twice"));
      if (insts >= resident)
        c.add(nhwc_split(f, s, dev, 1, "channels-last split, streamed twice (CTA per tile)"));
    }
  } else if (g.extent >= 2 * int64_t(rows)) {
    // Eval: as in ncdhw_candidates.
    c.add(nhwc_split(f, s, dev, std::min(k_cached, std::max<int64_t>(1, resident / insts)),
                     "channels-last split (elementwise)"));
    c.add(nhwc_split(f, s, dev, std::min(g.extent / rows, std::max<int64_t>(1, 16 * resident / insts)),
                     "channels-last split (elementwise)"));
  }
}

}  // namespace

bool same_launch(const Launch& a, const Launch& b) {
  return bytes_equal(a.config, b.config) && a.chunks == b.chunks && a.chunk_vectors == b.chunk_vectors &&
         a.grid == b.grid && a.cooperative == b.cooperative;
}

std::vector<Launch> candidate_launches(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev, Policy policy) {
  CandidateList c{f, s, dev, {}};
  // The default always comes first and is always kept, even in the unexpected case that the
  // checks above would reject it: the autotuner's baseline is exactly what runs without it.
  c.out.push_back(choose_launch(f, s, dev, policy));
  if (f.layout == Layout::ncdhw)
    ncdhw_candidates(c, policy);
  else
    nhwc_candidates(c, policy);
  return c.out;
}

std::vector<KernelConfig> enumerate_configs(const FusionKey& f, Policy policy) {
  return enumerate_configs(f, policy, builtin_profile("H200"));
}

std::vector<KernelConfig> enumerate_configs(const FusionKey& f, Policy policy, const DeviceProfile& dev) {
  // Mirrors choose_launch: the tiers (plus the split configs) x vector classes x index widths.
  // Tiers depend on the device only through min_blocks, which is fixed per threads for the
  // built-in register budgets on every supported GPU (65536 registers, >= 1536 threads per SM),
  // and the streamed split's ring stages through the shared memory per SM.
  std::vector<KernelConfig> out;
  const int es = dtype_size(f.dtype);
  if (f.layout == Layout::ndhwc) {
    for (int vec = 16 / es; vec >= 1; vec /= 2)
      for (bool idx64 : {false, true})
        for (int lanes = 1; lanes <= (vec == 1 ? 32 : 8); lanes *= 2) {
          for (int threads : kNhwcThreads) {
            const int rows = threads / lanes;
            if (policy == Policy::bounded) {
              out.push_back(make_config(threads, lanes, kBoundedItems, vec, nhwc_min_blocks(threads, dev), true, idx64));
            } else {
              for (int items = 1; items <= 8; items *= 2)
                if (rows * items >= 1)
                  out.push_back(make_config(threads, lanes, items, vec, nhwc_min_blocks(threads, dev), true, idx64));
            }
          }
          // The backward's tiers that sum the weight gradients in clusters (nhwc_cluster_tier).
          for (int threads : kNhwcThreads)
            for (int items = 1; items <= 8 && !idx64 && nhwc_cluster_applies(f, dev); items *= 2)
              if (policy == Policy::exact || items == kBoundedItems)
                out.push_back(make_config(threads, lanes, items, vec, nhwc_min_blocks(threads, dev), true, false, 0,
                                          false, false, true));
          const int mb = nhwc_min_blocks(kNhwcSplitThreads, dev);
          const int items = nhwc_streamed_items(f);
          out.push_back(make_config(kNhwcSplitThreads, lanes, items, vec, mb, false, idx64,
                                    ring_stages(f, kNhwcSplitThreads, items, vec, mb, dev)));
          if (const int kept = nhwc_kept_stages(f, vec, dev)) {
            out.push_back(make_config(kNhwcSplitThreads, lanes, kBoundedItems, vec, mb, false, idx64, kept, true));
            if (!idx64 && nhwc_cluster_applies(f, dev))  // the kept whole backward in clusters
              out.push_back(
                  make_config(kNhwcSplitThreads, lanes, kBoundedItems, vec, mb, false, false, kept, true, false, true));
          }
        }
    // Flat (16-byte vectors, lanes at run time): the same tiers and splits, one config each.
    NhwcGeometry flat;
    flat.vec = 16 / es;
    flat.flat = true;
    for (bool idx64 : {false, true}) {
      for (int threads : kNhwcThreads)
        for (int items = 1; items <= 8; items *= 2)
          if (policy == Policy::exact || items == kBoundedItems)
            out.push_back(nhwc_config(flat, threads, items, nhwc_min_blocks(threads, dev), true, idx64, 0));
      const int mb = nhwc_min_blocks(kNhwcSplitThreads, dev);
      const int items = nhwc_streamed_items(f);
      out.push_back(nhwc_config(flat, kNhwcSplitThreads, items, mb, false, idx64,
                                ring_stages(f, kNhwcSplitThreads, items, flat.vec, mb, dev)));
    }
  } else {
  for (int vec = 16 / es; vec >= 1; vec /= 2) {
    for (bool idx64 : {false, true}) {
      for (const Tier& t : kTiers) {
        if (!tier_allowed(t, f, vec, policy, dev)) continue;
        const int mb = min_blocks_for(t.threads, f.direction, dev);
        // With its cluster variant where a tier holds an instance a CTA (ncdhw_cluster_fits).
        const bool cluster = t.group == t.threads && !idx64 && ncdhw_cluster_applies(f, dev);
        const int slots = t.shared_dy ? 1 : 0;
        if (policy == Policy::bounded) {
          out.push_back(make_config(t.threads, t.group, t.items, vec, mb, true, idx64, slots));
          if (cluster)
            out.push_back(make_config(t.threads, t.group, t.items, vec, mb, true, false, slots, false, false, true));
        } else {
          for (int items = 1; items <= 8; items *= 2) {
            out.push_back(make_config(t.threads, t.group, items, vec, mb, true, idx64));
            if (cluster) out.push_back(make_config(t.threads, t.group, items, vec, mb, true, false, 0, false, false, true));
          }
        }
      }
      const int mb = min_blocks_for(kSplitThreads, f.direction, dev);
      if (f.train) out.push_back(make_config(kSplitThreads, kSplitThreads, kBoundedItems, vec, mb, true, idx64));
      out.push_back(make_config(kSplitThreads, kSplitThreads, kBoundedItems, vec, mb, false, idx64,
                                ring_stages(f, kSplitThreads, kBoundedItems, vec, mb, dev)));
      for (int threads : resident_thread_choices())
        if (resident_possible(f, vec, dev, threads)) out.push_back(resident_config(f, dev, threads, vec, idx64));
    }
  }
  }
  // Remove duplicates (the split cached config equals the 512 tier under the bounded policy).
  std::vector<KernelConfig> unique;
  for (const KernelConfig& c : out)
    if (std::none_of(unique.begin(), unique.end(), [&](const KernelConfig& u) { return bytes_equal(u, c); }))
      unique.push_back(c);
  return unique;
}

}  // namespace normjit
