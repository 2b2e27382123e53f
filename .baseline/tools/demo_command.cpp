// `normjit demo [SHAPE...]`: normjit's main job in one command, on the nnU-Net ladder (fp16, batch 2)
// unless shapes are given:
//   1. whether kernels can run here (driver, NVRTC, GPU);
//   2. explain: the kernel each forward and backward call selects, and which calls share one;
//   3. compile the predicted kernels through the disk cache, timing each cold compile;
//   4. the cache directory and counters;
//   5. with a GPU: run instance_norm_forward on random fp16 data, check a few instances against a
//      double-precision CPU reference, and time it with CUDA events (µs, effective TB/s).
// Without a GPU, steps 1-4 still run: explain, compile and cache need none.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "compile/disk_cache.h"
#include "driver/cuda_driver.h"
#include "explain.h"
#include "normjit/normjit.h"
#include "runtime/device.h"
#include "warmup.h"

namespace {

using namespace normjit;
using namespace normjit::tools;

void print_usage(FILE* out) {
  std::fprintf(out,
               "usage: normjit demo [--iters N] [--no-run] [SHAPE...]\n"
               "Explains, compiles (through the disk cache) and, when a GPU is here, runs and times the fp16\n"
               "instance-norm forward on the shapes (default: the nnU-Net ladder at batch 2).\n"
               "  --iters N   timed calls per shape (default 20)\n"
               "  --no-run    stop after compiling even when a GPU is here\n");
}

// ------------------------------------------------------------------------------ fp16 on the host
uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const int32_t exp = int32_t((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffffu;
  if (((x >> 23) & 0xff) == 0xff) return uint16_t(sign | 0x7c00u | (mant ? 0x200u : 0));  // inf / nan
  if (exp >= 31) return uint16_t(sign | 0x7c00u);                                         // overflow
  if (exp <= 0) {                                                                         // subnormal / zero
    if (exp < -10) return uint16_t(sign);
    mant |= 0x800000u;
    const int shift = 14 - exp;
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) ++h;
    return uint16_t(sign | h);
  }
  uint32_t h = sign | (uint32_t(exp) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;  // round to nearest even (may carry into exp)
  return uint16_t(h);
}

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ffu;
  float f;
  if (exp == 0) {
    f = std::ldexp(float(mant), -24);
  } else if (exp == 31) {
    f = mant ? NAN : INFINITY;
  } else {
    f = std::ldexp(float(mant | 0x400u), int(exp) - 25);
  }
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits |= sign;
  std::memcpy(&f, &bits, 4);
  return f;
}

// ---------------------------------------------------------------------------------- GPU run
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    driver::check_cuda(driver::cuda_driver().cuMemAlloc(&ptr_, std::max<size_t>(bytes, 16)), "cuMemAlloc");
  }
  ~DeviceBuffer() { driver::cuda_driver().cuMemFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return reinterpret_cast<void*>(ptr_); }
  CUdeviceptr ptr() const { return ptr_; }

 private:
  CUdeviceptr ptr_ = 0;
  size_t bytes_;
};

struct RunResult {
  bool ok = true;
  double max_err = 0;
  double us = 0;
  double tbps = 0;
  double first_call_ms = 0;
};

uint64_t g_rng = 0x243f6a8885a308d3ull;
float next_uniform() {  // [-1, 1)
  g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
  return float((g_rng >> 40) * (1.0 / double(1ull << 23))) - 1.0f;
}

RunResult run_shape(const Shape& shape, int iters) {
  const auto& cu = driver::cuda_driver();
  RunResult res;
  const int64_t N = shape[0], C = shape[1];
  int64_t S = 1;
  for (size_t d = 2; d < shape.size(); ++d) S *= shape[d];
  const int64_t numel = N * C * S;

  // Random data: each instance gets its own offset and scale so the mean really matters.
  std::vector<uint16_t> hx(static_cast<size_t>(numel));
  for (int64_t i = 0; i < N * C; ++i) {
    const float offset = 2.0f * next_uniform(), scale = 1.0f + 0.5f * next_uniform();
    for (int64_t s = 0; s < S; ++s) hx[size_t(i * S + s)] = float_to_half(offset + scale * next_uniform());
  }
  std::vector<float> hw(static_cast<size_t>(C)), hb(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) hw[size_t(c)] = 1.0f + 0.5f * next_uniform(), hb[size_t(c)] = 0.5f * next_uniform();

  DeviceBuffer x(size_t(numel) * 2), y(size_t(numel) * 2), w(size_t(C) * 4), b(size_t(C) * 4);
  DeviceBuffer mean(size_t(N * C) * 4), rstd(size_t(N * C) * 4);
  driver::check_cuda(cu.cuMemcpyHtoD(x.ptr(), hx.data(), hx.size() * 2), "cuMemcpyHtoD");
  driver::check_cuda(cu.cuMemcpyHtoD(w.ptr(), hw.data(), hw.size() * 4), "cuMemcpyHtoD");
  driver::check_cuda(cu.cuMemcpyHtoD(b.ptr(), hb.data(), hb.size() * 4), "cuMemcpyHtoD");

  ForwardArgs a;
  a.x = contiguous_tensor(x.get(), DType::f16, shape);
  a.y = contiguous_tensor(y.get(), DType::f16, shape);
  a.weight = contiguous_tensor(w.get(), DType::f32, {C});
  a.bias = contiguous_tensor(b.get(), DType::f32, {C});
  a.save_mean = static_cast<float*>(mean.get());
  a.save_rstd = static_cast<float*>(rstd.get());
  a.eps = 1e-5;

  // The first call builds the plan and loads the kernel (from the disk cache the compile step filled).
  const auto t0 = std::chrono::steady_clock::now();
  instance_norm_forward(a);
  driver::check_cuda(cu.cuStreamSynchronize(nullptr), "cuStreamSynchronize");
  res.first_call_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  // Check a few instances against a double-precision reference.
  std::vector<int64_t> instances{0, N * C - 1, (N / 2) * C + C / 2, C / 3};
  std::vector<uint16_t> hy(static_cast<size_t>(S));
  std::vector<float> hmean(static_cast<size_t>(N * C)), hrstd(static_cast<size_t>(N * C));
  driver::check_cuda(cu.cuMemcpyDtoH(hmean.data(), mean.ptr(), hmean.size() * 4), "cuMemcpyDtoH");
  driver::check_cuda(cu.cuMemcpyDtoH(hrstd.data(), rstd.ptr(), hrstd.size() * 4), "cuMemcpyDtoH");
  for (int64_t inst : instances) {
    driver::check_cuda(cu.cuMemcpyDtoH(hy.data(), y.ptr() + CUdeviceptr(inst * S * 2), size_t(S) * 2), "cuMemcpyDtoH");
    const uint16_t* xi = hx.data() + inst * S;
    double sum = 0;
    for (int64_t s = 0; s < S; ++s) sum += half_to_float(xi[s]);
    const double m = sum / double(S);
    double sq = 0;
    for (int64_t s = 0; s < S; ++s) sq += (half_to_float(xi[s]) - m) * (half_to_float(xi[s]) - m);
    const double r = 1.0 / std::sqrt(sq / double(S) + a.eps);
    const int64_t c = inst % C;
    for (int64_t s = 0; s < S; ++s) {
      const double ref = (half_to_float(xi[s]) - m) * r * hw[size_t(c)] + hb[size_t(c)];
      const double err = std::fabs(double(half_to_float(hy[size_t(s)])) - ref);
      res.max_err = std::max(res.max_err, err);
      if (!(err <= 4e-3 + 4e-3 * std::fabs(ref))) res.ok = false;
    }
    if (!(std::fabs(hmean[size_t(inst)] - m) <= 1e-4 * (1 + std::fabs(m)))) res.ok = false;
    if (!(std::fabs(hrstd[size_t(inst)] - r) <= 1e-4 * r)) res.ok = false;
  }

  // Time back-to-back calls with events on the (legacy default) stream.
  CUevent start, stop;
  driver::check_cuda(cu.cuEventCreate(&start, CU_EVENT_DEFAULT), "cuEventCreate");
  driver::check_cuda(cu.cuEventCreate(&stop, CU_EVENT_DEFAULT), "cuEventCreate");
  for (int i = 0; i < 3; ++i) instance_norm_forward(a);
  driver::check_cuda(cu.cuEventRecord(start, nullptr), "cuEventRecord");
  for (int i = 0; i < iters; ++i) instance_norm_forward(a);
  driver::check_cuda(cu.cuEventRecord(stop, nullptr), "cuEventRecord");
  driver::check_cuda(cu.cuEventSynchronize(stop), "cuEventSynchronize");
  float ms = 0;
  driver::check_cuda(cu.cuEventElapsedTime(&ms, start, stop), "cuEventElapsedTime");
  cu.cuEventDestroy(start);
  cu.cuEventDestroy(stop);
  res.us = double(ms) * 1000.0 / iters;
  res.tbps = 2.0 * double(numel) * 2.0 / (res.us * 1e-6) / 1e12;  // read x + write y
  return res;
}

}  // namespace

int run_demo_command(int argc, char** argv) {
  std::vector<Shape> shapes;
  int iters = 20;
  bool run = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      print_usage(stdout);
      return 0;
    } else if (a == "--iters" && i + 1 < argc) {
      iters = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--no-run") {
      run = false;
    } else if (!a.empty() && std::isdigit(static_cast<unsigned char>(a[0]))) {
      shapes.push_back(parse_shape(a));
    } else {
      std::fprintf(stderr, "normjit demo: unexpected argument '%s'\n", a.c_str());
      print_usage(stderr);
      return 2;
    }
  }
  if (shapes.empty()) shapes = nnunet_ladder_shapes();

  // 1. Where are we?
  std::printf("normjit %s\n", version().c_str());
  const Availability av = availability();
  std::printf("[1] availability: %s\n", av.available ? "a CUDA GPU, the driver and NVRTC are here"
                                                     : ("no GPU run possible: " + av.reason).c_str());
  ExplainOptions o;  // fp16, NCDHW, affine with fp32 parameters (autocast), training, fwd + bwd
  o.device = av.available ? live_profile(0) : builtin_profile("H200");
  o.policy = policy_from_env();
  std::printf("    predicting for %s (sm_%d, %d SMs)%s, %s policy\n", o.device.name.c_str(), o.device.arch,
              o.device.sms, av.available ? "" : " (built-in profile)", policy_name(o.policy));

  // 2. Explain.
  std::printf("\n[2] explain: fp16, NCDHW, affine (fp32 weight), training forward + backward\n");
  const std::vector<ExplainCall> calls = explain_calls(shapes, o);
  for (size_t i = 0; i < calls.size(); ++i) std::printf("    %s\n", format_call(calls, i).c_str());
  const auto kernels = distinct_kernels(calls);
  std::printf("    %zu calls -> %zu distinct kernels\n", calls.size(), kernels.size());

  // 3. Compile through the disk cache.
  compile::DiskCache& disk = compile::DiskCache::global();
  const int jobs = int(std::max(1u, std::thread::hardware_concurrency()));
  std::printf("\n[3] compile for sm_%d through the disk cache (%s), %d at a time\n", o.device.arch,
              disk.enabled() ? disk.dir().c_str() : "disabled", jobs);
  std::fflush(stdout);
  const WarmupSummary w = warmup_kernels(kernels, o.device.arch, jobs, false);
  for (const WarmupKernel& k : w.results) {
    if (!k.error.empty())
      std::printf("    FAILED    %s\n%s\n", k.name.c_str(), k.error.c_str());
    else if (k.from_disk)
      std::printf("    disk hit  %7.1f ms  %s\n", k.ms, k.name.c_str());
    else
      std::printf("    compiled  %7.1f ms  %s\n", k.ms, k.name.c_str());
  }
  std::printf("    %d kernels: %d compiled (cold), %d from the disk cache, %.2f s wall", w.kernels, w.compiled,
              w.from_disk, w.seconds);
  if (!w.slowest.empty()) std::printf(", slowest %s (%.0f ms)", w.slowest.c_str(), w.slowest_ms);
  std::printf("\n");
  if (w.compiled > 0 && disk.enabled())
    std::printf("    run `normjit demo` again: every kernel then comes from the disk cache\n");
  if (w.failed) return 1;

  // 4. Cache.
  const CacheStats s = cache_stats();
  std::printf("\n[4] cache: directory %s\n", disk.enabled() ? disk.dir().c_str() : "(disabled)");
  if (disk.enabled()) std::printf("    %zu entries in the disk cache\n", disk.list().size());
  std::printf("    this process: %llu NVRTC compiles (%.0f ms of NVRTC), %llu disk hits, %llu disk writes\n",
              (unsigned long long)s.compiles, s.compile_ms_total, (unsigned long long)s.disk_hits,
              (unsigned long long)s.disk_writes);

  // 5. Run.
  if (!av.available) {
    std::printf("\nno CUDA GPU here: skipping the run; explain, compile and cache work without one\n");
    return 0;
  }
  if (!run) return 0;
  std::printf("\n[5] instance_norm_forward on %s, random fp16 data, %d timed calls per shape\n", o.device.name.c_str(),
              iters);
  make_current(device_state(0));
  bool all_ok = true;
  for (const Shape& shape : shapes) {
    const RunResult r = run_shape(shape, iters);
    all_ok = all_ok && r.ok;
    std::printf("    %-20s first call %7.2f ms   %9.1f us   %6.3f TB/s   max |err| %.2e %s\n", shape_str(shape).c_str(),
                r.first_call_ms, r.us, r.tbps, r.max_err, r.ok ? "ok" : "MISMATCH");
    std::fflush(stdout);
  }
  const CacheStats after = cache_stats();
  std::printf("    L1 plans: %llu hits, %llu misses; L2 kernels: %llu hits, %llu misses; NVRTC compiles in all: %llu\n",
              (unsigned long long)after.plan_hits, (unsigned long long)after.plan_misses,
              (unsigned long long)after.kernel_hits, (unsigned long long)after.kernel_misses,
              (unsigned long long)after.compiles);
  if (!all_ok) {
    std::fprintf(stderr, "normjit demo: the output does not match the CPU reference\n");
    return 1;
  }
  return 0;
}
