// The per-call path of instance_norm_forward / instance_norm_backward:
//
//   validate arguments -> FusionKey + ShapeKey (fixed-size structs)
//   -> L1 plan cache hit: fill the argument block, launch                      (the hot path)
//   -> L1 miss: heuristics (schedule/), or with autotune on the autotuner (autotune.cpp: a stored
//      choice, else the candidates timed on this call's stream) -> L2 kernel cache
//      (kernel_cache.cpp) -> L3 disk cache or NVRTC (compile/) -> build and remember the plan -> launch
//
// Nothing is launched before every argument has been checked; errors say what was wrong and what
// was expected.
#include <cuda.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <shared_mutex>
#include <sstream>
#include <unordered_map>

#include "driver/cuda_driver.h"
#include "kernels/params.h"
#include "normjit/normjit.h"
#include "runtime/autotune.h"
#include "runtime/device.h"
#include "runtime/kernel_cache.h"
#include "runtime/call_keys.h"
#include "runtime/keys.h"
#include "runtime/log.h"
#include "runtime/prefetch.h"
#include "runtime/stats.h"
#include "runtime/sync_workspace.h"
#include "schedule/heuristics.h"

namespace normjit {

// ------------------------------------------------------------------------------------ validation
namespace {

std::string sizes_str(const TensorArg& t, bool strides = false) {
  std::ostringstream s;
  s << "[";
  for (int i = 0; i < t.ndim; ++i) s << (i ? ", " : "") << (strides ? t.strides[i] : t.sizes[i]);
  s << "]";
  return s.str();
}

[[noreturn]] void fail(const std::string& what) { throw Error("normjit instance_norm: " + what); }

// NCDHW: the spatial dims are dense with unit stride. NDHWC: the channel stride is 1 and the
// spatial dims are dense with stride C. Size-1 dims may have any stride.
bool dense_spatial(const TensorArg& t, int64_t inner) {
  int64_t expected = inner;
  for (int d = t.ndim - 1; d >= 2; --d) {
    if (t.sizes[d] != 1 && t.strides[d] != expected) return false;
    expected *= t.sizes[d];
  }
  return true;
}

Geometry classify(const TensorArg& t, const char* name) {
  if (t.ndim < 3 || t.ndim > 5)
    fail(std::string(name) + " must have 3 to 5 dims (N, C, 1-3 spatial dims), got " + std::to_string(t.ndim) +
         " dims " + sizes_str(t));
  Geometry g;
  g.N = t.sizes[0];
  g.C = t.sizes[1];
  g.spatial = 1;
  for (int d = 0; d < t.ndim; ++d) {
    if (t.sizes[d] < 0) fail(std::string(name) + " has a negative size: " + sizes_str(t));
    if (t.strides[d] < 0) fail(std::string(name) + " has a negative stride: " + sizes_str(t, true));
    if (d >= 2) g.spatial *= t.sizes[d];
  }
  g.stride_n = t.strides[0];
  if (t.numel() == 0 || dense_spatial(t, 1)) {  // an empty tensor's strides do not matter
    g.layout = Layout::ncdhw;
    g.stride_c = t.strides[1];
    g.stride_s = 1;
  } else if ((t.strides[1] == 1 || g.C == 1) && dense_spatial(t, g.C)) {
    g.layout = Layout::ndhwc;
    g.stride_c = 1;
    g.stride_s = g.C;
  } else {
    fail(std::string(name) + " has unsupported strides " + sizes_str(t, true) + " for sizes " + sizes_str(t) +
         "; expected the spatial dims dense in NCDHW (contiguous) or NDHWC (channels_last) order. Make it "
         "contiguous first");
  }
  return g;
}

void check_dtype(const TensorArg& t, const char* name) {
  if (t.dtype != DType::f32 && t.dtype != DType::f16 && t.dtype != DType::bf16)
    fail(std::string(name) + " has an unsupported dtype code " + std::to_string(int(t.dtype)) +
         "; expected float32, float16 or bfloat16");
}

void check_like(const TensorArg& t, const TensorArg& x, const char* name) {
  if (t.ndim != x.ndim || !std::equal(t.sizes, t.sizes + t.ndim, x.sizes))
    fail(std::string(name) + " has sizes " + sizes_str(t) + "; expected x's sizes " + sizes_str(x));
  if (t.dtype != x.dtype)
    fail(std::string(name) + " is " + dtype_name(t.dtype) + "; expected x's dtype " + dtype_name(x.dtype));
  for (int d = 0; d < x.ndim; ++d)
    if (x.sizes[d] != 1 && t.strides[d] != x.strides[d])
      fail(std::string(name) + " has strides " + sizes_str(t, true) + "; expected x's strides " +
           sizes_str(x, true) + " (the same memory format)");
  if (t.numel() > 0 && !t.data) fail(std::string(name) + " has a null data pointer");
}

// Returns the weight dtype (f32 when there is no weight).
DType check_affine(const TensorArg& w, const TensorArg& b, const Geometry& g, DType x_dtype) {
  if (w.defined() != b.defined())
    fail("weight and bias must be given together (affine) or not at all; pass zeros for a missing bias");
  if (!w.defined()) return DType::f32;
  for (const TensorArg* t : {&w, &b}) {
    const char* name = t == &w ? "weight" : "bias";
    if (t->numel() != g.C)
      fail(std::string(name) + " has " + std::to_string(t->numel()) + " elements; expected C = " +
           std::to_string(g.C));
    if (t->ndim >= 1 && t->strides[t->ndim - 1] != 1 && g.C > 1) fail(std::string(name) + " must be contiguous");
    if (t->dtype != DType::f32 && t->dtype != x_dtype)
      fail(std::string(name) + " is " + dtype_name(t->dtype) + "; expected float32 or x's dtype " +
           dtype_name(x_dtype));
    if (!t->data && g.C > 0) fail(std::string(name) + " has a null data pointer");
  }
  if (w.dtype != b.dtype) fail("weight and bias must have the same dtype");
  return w.dtype;
}

void check_activation(Activation a) {
  if (static_cast<unsigned>(a) > static_cast<unsigned>(Activation::tanh))
    fail("unknown activation code " + std::to_string(int(a)));
}

uint16_t alignment_of(std::initializer_list<const void*> ptrs) {
  uintptr_t bits = 16;
  for (const void* p : ptrs)
    if (p) bits |= reinterpret_cast<uintptr_t>(p);
  return static_cast<uint16_t>(bits & (~bits + 1));  // lowest set bit, at most 16
}

ShapeKey shape_key(const Geometry& g, int device, uint16_t align) {
  ShapeKey s = zeroed<ShapeKey>();
  s.N = g.N, s.C = g.C, s.spatial = g.spatial;
  s.stride_n = g.stride_n, s.stride_c = g.stride_c, s.stride_s = g.stride_s;
  s.device = device;
  s.align_bytes = align;
  return s;
}

void fill_shape(NjParams& p, const Geometry& g) {
  p.N = g.N, p.C = g.C, p.spatial = g.spatial;
  p.stride_n = g.stride_n, p.stride_c = g.stride_c, p.stride_s = g.stride_s;
  p.inv_spatial = 1.f / float(g.spatial);
  p.by_n = nj_divisor(g.N), p.by_c = nj_divisor(g.C);
}

// -------------------------------------------------------------------------------- L1: plans
struct PlanKey {
  FusionKey fusion;
  ShapeKey shape;
};

// Everything a launch needs besides the per-call pointers.
struct Plan {
  CUfunction function = nullptr;
  CUcontext context = nullptr;
  unsigned grid = 0, threads = 0, smem = 0;
  bool cooperative = false;
  bool channel_major = false;
  int cluster = 1;  // CTAs per thread-block cluster
  bool reverse_output = true;
  bool early_refill = false;
  int l2_prefetch_vectors = 0;
  int chunks = 1;
  int chunk_vectors = 0;
  int64_t counters = 0, partials = 0, scratch = 0, exchange = 0;
};

std::shared_mutex g_plans_mutex;
std::unordered_map<PlanKey, Plan, BytesHash<PlanKey>, BytesEqual<PlanKey>> g_plans;

// The plan for launch `l` of kernel `k`. Throws when the launch cannot run on this device.
Plan make_plan(const Launch& l, const LoadedKernel& k, const DeviceState& dev) {
  Plan p;
  p.function = k.function;
  p.context = dev.context;
  p.threads = l.config.threads;
  p.smem = unsigned(l.smem_bytes > 0 && l.smem_bytes < k.dynamic_smem ? l.smem_bytes : k.dynamic_smem);
  p.cooperative = l.cooperative;
  p.channel_major = l.channel_major;
  p.cluster = l.cluster;
  p.reverse_output = output_pass_reversed();
  p.early_refill = l.early_refill;
  p.chunks = l.chunks;
  if (l.chunk_vectors > 0x7fffffff)
    throw Error("normjit: internal: " + std::to_string(l.chunk_vectors) +
                " vectors per chunk overflow the kernel's int");
  p.chunk_vectors = int(l.chunk_vectors);
  p.l2_prefetch_vectors = int(l.l2_prefetch_vectors);  // a part of one chunk (ncdhw_split)
  p.counters = l.counters, p.partials = l.partials, p.scratch = l.scratch, p.exchange = l.exchange;
  if (l.grid <= 0 || l.grid > 0x7fffffff) throw Error("normjit: internal: grid of " + std::to_string(l.grid) + " CTAs");
  p.grid = unsigned(l.grid);
  if (l.cluster > 1 && l.grid % l.cluster != 0)
    throw Error("normjit: internal: grid of " + std::to_string(l.grid) + " CTAs in clusters of " +
                std::to_string(l.cluster));
  if (l.cooperative && l.grid > int64_t(k.max_blocks_per_sm) * dev.profile.sms)
    throw Error("normjit: internal: kernel " + k.name + " needs " + std::to_string(l.grid) +
                " co-resident CTAs but the device holds " + std::to_string(k.max_blocks_per_sm * dev.profile.sms) +
                " (" + std::to_string(k.registers) + " registers per thread); please report this shape");
  return p;
}

// Enqueues the plan's kernel on `stream`; fills in the decomposition and workspace of `params`.
void launch_plan(const Plan& plan, int device, NjParams& params, void* stream) {
  const auto& cu = driver::cuda_driver();
  CUcontext current = nullptr;
  cu.cuCtxGetCurrent(&current);
  if (current != plan.context) driver::check_cuda(cu.cuCtxSetCurrent(plan.context), "cuCtxSetCurrent");

  if (plan.counters || plan.partials || plan.scratch || plan.exchange) {
    const Workspace w = get_workspace(device, stream, plan.counters, plan.partials, plan.scratch, plan.exchange);
    params.counters = w.counters;
    params.partials = w.partials;
    params.scratch = w.scratch;
    params.exchange = w.exchange;
    params.exchange_words = w.exchange_words;
  }
  params.chunks = plan.chunks;
  params.by_chunks = nj_divisor(plan.chunks);
  params.chunk_vectors = plan.chunk_vectors;
  params.channel_major = plan.channel_major;
  params.reverse_output = plan.reverse_output;
  params.early_refill = plan.early_refill;
  params.l2_prefetch_vectors = plan.l2_prefetch_vectors;
  void* args[] = {&params};
  CUresult r;
  if (plan.cooperative || plan.cluster > 1) {
    CUlaunchAttribute attr;
    std::memset(&attr, 0, sizeof(attr));
    if (plan.cooperative) {
      attr.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
      attr.value.cooperative = 1;
    } else {
      attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      attr.value.clusterDim.x = unsigned(plan.cluster), attr.value.clusterDim.y = 1, attr.value.clusterDim.z = 1;
    }
    CUlaunchConfig cfg;
    std::memset(&cfg, 0, sizeof(cfg));
    cfg.gridDimX = plan.grid, cfg.gridDimY = 1, cfg.gridDimZ = 1;
    cfg.blockDimX = plan.threads, cfg.blockDimY = 1, cfg.blockDimZ = 1;
    cfg.sharedMemBytes = plan.smem;
    cfg.hStream = static_cast<CUstream>(stream);
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    r = cu.cuLaunchKernelEx(&cfg, plan.function, args, nullptr);
  } else {
    r = cu.cuLaunchKernel(plan.function, plan.grid, 1, 1, plan.threads, 1, 1, plan.smem, static_cast<CUstream>(stream), args,
                          nullptr);
  }
  driver::check_cuda(r, "cuLaunchKernel (normjit instance_norm)");
}

// The launch of an L1 miss: the heuristics' choice, or with autotune on (and the call's params at
// hand) the autotuner's. `remember` is cleared when the plan must not enter the L1 cache.
Launch plan_launch(const FusionKey& f, const ShapeKey& s, const DeviceState& dev, void* stream, const NjParams* params,
                   bool* remember) {
  const Policy policy = policy_from_env();
  if (!params || !autotune::enabled()) return choose_launch(f, s, dev.profile, policy);
  make_current(dev);
  // Each candidate goes through the same plan and launch code as a real call.
  auto launch_candidate = [&](const Launch& l, NjParams& p) {
    launch_plan(make_plan(l, get_kernel(f, l.config, s.device), dev), s.device, p, stream);
  };
  const autotune::Choice c = autotune::choose(f, s, dev.profile, policy, *params, stream, launch_candidate);
  *remember = c.remember;
  return c.launch;
}

Plan build_plan(const FusionKey& f, const ShapeKey& s, void* stream, const NjParams* params, bool* remember) {
  const DeviceState& dev = device_state(s.device);
  prefetch_backward(f, s, dev);  // a training forward: its backward kernel compiles in the background
  const Launch l = plan_launch(f, s, dev, stream, params, remember);
  // A launch that breaks its kernel's preconditions would hang (the resident split) or compute
  // garbage; the tests check the heuristics on the built-in GPUs, this guards the live one.
  if (!launchable(f, s, l, dev.profile))
    throw Error("normjit: internal: the launch chosen for N=" + std::to_string(s.N) + " C=" + std::to_string(s.C) +
                " spatial=" + std::to_string(s.spatial) + " (" + l.tier + ", " + std::to_string(l.chunks) +
                " chunks, grid " + std::to_string(l.grid) + ") breaks its kernel's preconditions on " +
                dev.profile.name + "; please report this shape");
  if (!kernel_loaded(f, l.config, s.device)) {
    const auto& cu = driver::cuda_driver();
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    make_current(dev);
    driver::check_cuda(cu.cuStreamIsCapturing(static_cast<CUstream>(stream), &status), "cuStreamIsCapturing");
    if (status != CU_STREAM_CAPTURE_STATUS_NONE)
      throw Error("normjit: kernel " + kernel_name(f, l.config) +
                  " is not compiled yet and the stream is being captured into a CUDA graph; run the same call once "
                  "before capturing (or use `normjit warmup`)");
    prefetch_ladder(f, s, l.config, dev);  // a cold forward: the next stages' kernels compile beside it
  }
  const LoadedKernel& k = get_kernel(f, l.config, s.device);
  const Plan p = make_plan(l, k, dev);
  if (log::enabled(log::plan)) {
    std::ostringstream o;
    o << "plan " << k.name << " N=" << s.N << " C=" << s.C << " spatial=" << s.spatial << ": tier '" << l.tier
      << "', grid " << l.grid << " x " << l.config.threads << ", chunks " << l.chunks
      << (l.cooperative ? " (cooperative)" : "") << ", " << k.registers << " registers";
    log::line(log::plan, o.str());
  }
  return p;
}

// L1 lookup; on a miss, heuristics (or autotune, which needs the call's params) + L2/L3 build the
// plan, which is remembered.
Plan resolve_plan(const FusionKey& f, const ShapeKey& s, void* stream, const NjParams* params) {
  PlanKey key;
  std::memset(static_cast<void*>(&key), 0, sizeof(key));
  key.fusion = f;
  key.shape = s;
  {
    std::shared_lock<std::shared_mutex> lock(g_plans_mutex);
    auto it = g_plans.find(key);
    if (it != g_plans.end()) {
      stats::counters().plan_hits.fetch_add(1, std::memory_order_relaxed);
      return it->second;
    }
  }
  stats::counters().plan_misses++;
  bool remember = true;
  Plan plan = build_plan(f, s, stream, params, &remember);
  if (remember) {
    std::unique_lock<std::shared_mutex> lock(g_plans_mutex);
    g_plans.emplace(key, plan);
  }
  return plan;
}

void run(const FusionKey& f, const ShapeKey& s, NjParams& params, void* stream) {
  const Plan plan = resolve_plan(f, s, stream, &params);
  launch_plan(plan, s.device, params, stream);
}

}  // namespace

// For the host-overhead benchmark on machines without a GPU: plants a plan so that the L1 hit
// path (key building, lookup, argument packing) can be timed without a launch.
void plant_plan_for_benchmark(const FusionKey& f, const ShapeKey& s) {
  PlanKey key;
  std::memset(static_cast<void*>(&key), 0, sizeof(key));
  key.fusion = f;
  key.shape = s;
  Plan plan;
  plan.grid = 1, plan.threads = 32;
  std::unique_lock<std::shared_mutex> lock(g_plans_mutex);
  g_plans[key] = plan;
}

// The launch-free part of a forward call: validation, keys, L1 lookup, argument block.
void forward_host_path_for_benchmark(const ForwardArgs& a, void* params_out) {
  const CallKeys k = forward_keys(a);
  const Plan plan = resolve_plan(k.fusion, k.shape, a.stream, nullptr);
  NjParams& p = *static_cast<NjParams*>(params_out);
  p.x = a.x.data;
  p.y = a.y.data;
  p.weight = a.weight.data;
  p.bias = a.bias.data;
  p.save_mean = a.save_mean;
  p.save_rstd = a.save_rstd;
  p.eps = float(a.eps);
  fill_shape(p, k.geometry);
  p.chunks = plan.chunks;
  p.by_chunks = nj_divisor(plan.chunks);
  p.chunk_vectors = plan.chunk_vectors;
}

void clear_plan_cache() {
  std::unique_lock<std::shared_mutex> lock(g_plans_mutex);
  g_plans.clear();
}

// ------------------------------------------------------------------------------- entry points
CallKeys forward_keys(const ForwardArgs& a) {
  CallKeys k;
  check_dtype(a.x, "x");
  const Geometry g = classify(a.x, "x");
  check_like(a.y, a.x, "y");
  const bool residual = a.residual.defined();
  if (residual) check_like(a.residual, a.x, "residual");
  const DType wdtype = check_affine(a.weight, a.bias, g, a.x.dtype);
  check_activation(a.activation);
  if (!std::isfinite(a.eps) || a.eps < 0) fail("eps must be a finite number >= 0, got " + std::to_string(a.eps));
  if ((a.running_mean == nullptr) != (a.running_var == nullptr))
    fail("running_mean and running_var must be given together");
  const bool running = a.running_mean != nullptr;
  if (!a.use_input_stats && !running)
    fail("eval mode (use_input_stats=false) needs running_mean and running_var");
  if (a.x.numel() == 0) return k;  // nothing to compute, nothing launched
  if (!a.x.data) fail("x has a null data pointer");
  if (a.use_input_stats && g.spatial <= 1)
    fail("expected more than 1 spatial element when training, got input of size " + sizes_str(a.x));
  const bool save = a.use_input_stats && a.save_mean && a.save_rstd;
  if (a.use_input_stats && (a.save_mean == nullptr) != (a.save_rstd == nullptr))
    fail("save_mean and save_rstd must be given together");

  k.empty = false;
  k.fusion = make_fusion(Direction::forward, a.x.dtype, wdtype, g.layout, a.use_input_stats,
                                  a.weight.defined(), residual, running && a.use_input_stats, save, a.activation);
  k.shape = shape_key(g, a.device, alignment_of({a.x.data, a.y.data, a.residual.data}));
  k.geometry = g;
  return k;
}

CallKeys backward_keys(const BackwardArgs& a) {
  CallKeys k;
  check_dtype(a.x, "x");
  const Geometry g = classify(a.x, "x");
  check_like(a.dy, a.x, "dy");
  check_like(a.dx, a.x, "dx");
  const bool residual = a.residual.defined();
  if (residual) check_like(a.residual, a.x, "residual");
  if (a.dresidual.defined()) {
    if (!residual) fail("dresidual was given but the forward had no residual");
    check_like(a.dresidual, a.x, "dresidual");
  }
  const DType wdtype = check_affine(a.weight, a.bias, g, a.x.dtype);
  check_activation(a.activation);
  if ((a.dweight || a.dbias) && !a.weight.defined()) fail("dweight/dbias requested without weight and bias");
  if (a.x.numel() == 0) return k;
  if (!a.x.data) fail("x has a null data pointer");
  if (!a.save_mean || !a.save_rstd) fail("backward needs save_mean and save_rstd from the training forward");
  if (g.spatial <= 1) fail("expected more than 1 spatial element, got input of size " + sizes_str(a.x));

  k.empty = false;
  k.fusion = make_fusion(Direction::backward, a.x.dtype, wdtype, g.layout, true, a.weight.defined(),
                                  residual, false, false, a.activation);
  k.shape =
      shape_key(g, a.device, alignment_of({a.x.data, a.dy.data, a.dx.data, a.residual.data, a.dresidual.data}));
  k.geometry = g;
  return k;
}

void instance_norm_forward(const ForwardArgs& a) {
  const CallKeys k = forward_keys(a);
  if (k.empty) return;
  NjParams p;
  std::memset(&p, 0, sizeof(p));
  p.x = a.x.data;
  p.y = a.y.data;
  p.residual = a.residual.data;
  p.weight = a.weight.data;
  p.bias = a.bias.data;
  p.save_mean = a.save_mean;
  p.save_rstd = a.save_rstd;
  p.running_mean = a.running_mean;
  p.running_var = a.running_var;
  p.eps = float(a.eps);
  p.momentum = float(a.momentum);
  p.act_param = a.activation_param;
  fill_shape(p, k.geometry);
  run(k.fusion, k.shape, p, a.stream);
}

void instance_norm_backward(const BackwardArgs& a) {
  const CallKeys k = backward_keys(a);
  if (k.empty) return;
  NjParams p;
  std::memset(&p, 0, sizeof(p));
  p.x = a.x.data;
  p.dy = a.dy.data;
  p.y = a.dx.data;
  p.residual = a.residual.data;
  p.dresidual = a.dresidual.data;
  p.weight = a.weight.data;
  p.bias = a.bias.data;
  p.save_mean = const_cast<float*>(a.save_mean);
  p.save_rstd = const_cast<float*>(a.save_rstd);
  p.dweight = a.dweight;
  p.dbias = a.dbias;
  p.act_param = a.activation_param;
  fill_shape(p, k.geometry);
  run(k.fusion, k.shape, p, a.stream);
}

}  // namespace normjit
