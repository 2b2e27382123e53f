#include "runtime/keys.h"

#include <sstream>

namespace normjit {

const char* direction_name(Direction d) { return d == Direction::forward ? "fwd" : "bwd"; }
const char* layout_name(Layout l) { return l == Layout::ncdhw ? "ncdhw" : "ndhwc"; }

const char* dtype_name(DType d) {
  switch (d) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
  }
  return "?";
}
int dtype_size(DType d) { return d == DType::f32 ? 4 : 2; }

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::identity: return "identity";
    case Activation::relu: return "relu";
    case Activation::leaky_relu: return "leaky_relu";
    case Activation::gelu_erf: return "gelu";
    case Activation::gelu_tanh: return "gelu_tanh";
    case Activation::silu: return "silu";
    case Activation::sigmoid: return "sigmoid";
    case Activation::tanh: return "tanh";
  }
  return "?";
}

uint64_t hash_bytes(const void* p, size_t n) {
  // FNV-1a over 8-byte words, then a final avalanche: the keys are small and fixed-size.
  const unsigned char* b = static_cast<const unsigned char*>(p);
  uint64_t h = 1469598103934665603ull;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, b + i, 8);
    h = (h ^ w) * 1099511628211ull;
  }
  for (; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

FusionKey make_fusion(Direction d, DType dtype, DType wdtype, Layout layout, bool train, bool affine, bool residual,
                      bool running, bool save, Activation act) {
  FusionKey f = zeroed<FusionKey>();
  f.direction = d;
  f.dtype = dtype;
  f.weight_dtype = affine ? wdtype : DType::f32;
  f.layout = layout;
  f.train = train;
  f.affine = affine;
  f.residual = residual;
  f.running = running;
  f.save = save;
  f.activation = act;
  return f;
}

KernelConfig make_config(int threads, int group, int items, int vec, int min_blocks, bool cached, bool index64,
                         int stages, bool resident, bool flat, bool cluster) {
  KernelConfig c = zeroed<KernelConfig>();
  c.threads = static_cast<uint16_t>(threads);
  c.group = static_cast<uint16_t>(group);
  c.items = static_cast<uint8_t>(items);
  c.vec = static_cast<uint8_t>(vec);
  c.min_blocks = static_cast<uint8_t>(min_blocks);
  c.cached = cached;
  c.index64 = index64;
  c.stages = static_cast<uint8_t>(stages);
  c.resident = resident;
  c.flat = flat;
  c.cluster = cluster;
  return c;
}

std::string describe(const FusionKey& f) {
  std::ostringstream s;
  s << "instance_norm " << direction_name(f.direction) << " " << dtype_name(f.dtype) << " " << layout_name(f.layout)
    << (f.train ? " train" : " eval");
  if (f.affine) s << " affine(" << dtype_name(f.weight_dtype) << ")";
  if (f.residual) s << " +residual";
  if (f.running) s << " running-stats";
  if (f.save) s << " save-stats";
  if (f.activation != Activation::identity) s << " " << activation_name(f.activation);
  return s.str();
}

std::string describe(const KernelConfig& c) {
  std::ostringstream s;
  s << "threads=" << c.threads << " group=" << c.group << " items=" << int(c.items) << " vec=" << int(c.vec)
    << " min_blocks=" << int(c.min_blocks) << " cached=" << int(c.cached) << " index=" << (c.index64 ? 64 : 32);
  if (c.stages)
    s << (c.resident ? " resident slots=" : keeps_dy_in_shared_memory(c) ? " shared-memory slots=" : " stages=") << int(c.stages);
  if (c.flat) s << " flat";
  if (c.cluster) s << " cluster";
  return s.str();
}

std::string kernel_name(const FusionKey& f, const KernelConfig& c) {
  std::ostringstream s;
  s << "in_" << direction_name(f.direction) << "_" << dtype_name(f.dtype) << "_" << layout_name(f.layout) << "_"
    << (f.train ? "train" : "eval");
  if (f.affine) s << "_w" << dtype_name(f.weight_dtype);
  if (f.residual) s << "_res";
  if (f.running) s << "_run";
  if (f.save) s << "_save";
  if (f.activation != Activation::identity) s << "_" << activation_name(f.activation);
  s << "_t" << c.threads << "g";
  if (c.flat)
    s << "f";  // lanes are a run-time value
  else
    s << c.group;
  s << "i" << int(c.items) << "v" << int(c.vec) << "b" << int(c.min_blocks)
    << (c.cached ? "c" : "s") << (c.index64 ? "64" : "32");
  if (c.stages) s << (c.resident ? "p" : "r") << int(c.stages);
  if (c.cluster) s << "cl";
  return s.str();
}

std::string config_diff(const KernelConfig& a, const KernelConfig& b) {
  std::ostringstream s;
  auto field = [&](const char* name, long x, long y) {
    if (x == y) return;
    if (s.tellp() > 0) s << ", ";
    s << name << " " << x << "->" << y;
  };
  field("threads", a.threads, b.threads);
  field("group", a.group, b.group);
  field("items", a.items, b.items);
  field("vec", a.vec, b.vec);
  field("min_blocks", a.min_blocks, b.min_blocks);
  field("cached", a.cached, b.cached);
  field("index64", a.index64, b.index64);
  field("stages", a.stages, b.stages);
  field("resident", a.resident, b.resident);
  field("flat", a.flat, b.flat);
  field("cluster", a.cluster, b.cluster);
  return s.str();
}

}  // namespace normjit
