// The fixed-size keys of the per-call path. Plain structs of integers: building one does no
// allocation and no string work, hashing one is a pass over its bytes. Every key is built from a
// zeroed struct (padding included) so that byte-wise hashing and comparison are exact.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "normjit/normjit.h"

namespace normjit {

enum class Direction : uint8_t { forward = 0, backward = 1 };
enum class Layout : uint8_t { ncdhw = 0, ndhwc = 1 };
const char* direction_name(Direction d);
const char* layout_name(Layout l);

// What a kernel computes. Each field is a compile-time switch of the kernel template.
struct FusionKey {
  Direction direction;
  DType dtype;          // x, y (and residual, dy, dx)
  DType weight_dtype;   // weight and bias (f32 when not affine)
  Layout layout;
  bool train;           // batch statistics (else running statistics, forward only)
  bool affine;
  bool residual;
  bool running;         // update running stats (training forward)
  bool save;            // write save_mean/save_rstd (training forward)
  Activation activation;
  uint8_t pad[6];
};
static_assert(sizeof(FusionKey) == 16);

// How a kernel computes it: chosen by the heuristics, the second half of a kernel's identity.
struct KernelConfig {
  uint16_t threads;     // CTA size
  uint16_t group;       // threads per instance (<= 32, or == threads)
  uint8_t items;        // vectors per thread per tile
  uint8_t vec;          // elements per vector access
  uint8_t min_blocks;   // CTAs per SM the register cap guarantees
  bool cached;          // tile held in registers between statistics and output
  bool index64;
  uint8_t stages;       // streamed tiles in flight through a shared-memory ring (0 = loads to registers),
                        // or with `resident` the pipeline's chunk slots
  bool resident;        // resident split: chunks held in shared memory, pipelined (resident_split.cuh)
  bool flat;            // channels-last with C not a multiple of vec: 16-byte vectors over super-rows of
                        // lcm(C, vec) elements, lanes a run-time value (group 0; nhwc_tile.cuh)
  bool cluster;         // channels-last backward: launched in thread-block clusters of a channel tile's
                        // N CTAs, which sum dweight/dbias themselves (cluster_weight_grads)
  uint8_t pad[3];
};
static_assert(sizeof(KernelConfig) == 16);

// A register tier with shared-memory slots: the NCDHW backward's tier that keeps x in registers
// and dy in one stage of slots (NJ_SHARED_DY in kernels/instance_norm_backward.cuh, derived there
// from the same two fields).
inline bool keeps_dy_in_shared_memory(const KernelConfig& c) { return c.cached && c.stages > 0; }

// The shape facts of one call that select a config and a launch: sizes, strides (elements) and
// the alignment of every pointer involved (the largest power of two dividing all of them, capped
// at 16 bytes).
struct ShapeKey {
  int64_t N, C, spatial;
  int64_t stride_n, stride_c, stride_s;
  int32_t device;
  uint16_t align_bytes;
  uint16_t pad;
};
static_assert(sizeof(ShapeKey) == 56);

template <typename T> T zeroed() {
  T t;
  std::memset(static_cast<void*>(&t), 0, sizeof(T));
  return t;
}
template <typename T> bool bytes_equal(const T& a, const T& b) { return std::memcmp(&a, &b, sizeof(T)) == 0; }
uint64_t hash_bytes(const void* p, size_t n);

// Hash and equality of such keys for unordered containers (the L1 plan and L2 kernel caches).
template <typename T> struct BytesHash {
  size_t operator()(const T& k) const { return hash_bytes(&k, sizeof(T)); }
};
template <typename T> struct BytesEqual {
  bool operator()(const T& a, const T& b) const { return bytes_equal(a, b); }
};

FusionKey make_fusion(Direction d, DType dtype, DType wdtype, Layout layout, bool train, bool affine, bool residual,
                      bool running, bool save, Activation act);
KernelConfig make_config(int threads, int group, int items, int vec, int min_blocks, bool cached, bool index64,
                         int stages = 0, bool resident = false, bool flat = false, bool cluster = false);

// Human-readable forms, for logs, explain and error messages.
std::string describe(const FusionKey& f);
std::string describe(const KernelConfig& c);
// The kernel's stable name: fusion and config fields, e.g. "in_fwd_f16_ncdhw_..._t512g512i4v8".
std::string kernel_name(const FusionKey& f, const KernelConfig& c);
// Which fields of two configs differ, e.g. "vec 8->1, cached 1->0".
std::string config_diff(const KernelConfig& from, const KernelConfig& to);

}  // namespace normjit
