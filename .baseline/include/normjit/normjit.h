// normjit public C++ API: fast instance normalization through run-time generated CUDA kernels.
//
// The library has no dependency on PyTorch. Tensors are described by TensorArg (a device pointer
// with sizes and strides in elements); the caller owns all memory and passes the CUDA stream.
// Every entry point validates its arguments and throws normjit::Error (what was wrong, what was
// expected) before anything is launched.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace normjit {

// An exception whose message says what was wrong, what was expected and what to do about it.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class DType : uint8_t { f32 = 0, f16 = 1, bf16 = 2 };
const char* dtype_name(DType d);
int dtype_size(DType d);

// Activation applied after the affine transform (and the optional residual add).
enum class Activation : uint8_t { identity = 0, relu, leaky_relu, gelu_erf, gelu_tanh, silu, sigmoid, tanh };
const char* activation_name(Activation a);

inline constexpr int kMaxDims = 5;  // (N, C, up to 3 spatial dims)

// A strided device tensor. sizes/strides are in elements; ndim in [1, kMaxDims].
struct TensorArg {
  void* data = nullptr;
  DType dtype = DType::f32;
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
  bool defined() const { return data != nullptr || ndim > 0; }
  int64_t numel() const;
};

// A contiguous (row-major; NCDHW for an input) TensorArg.
TensorArg contiguous_tensor(void* data, DType dtype, std::vector<int64_t> sizes);
// A channels-last TensorArg for sizes (N, C, spatial...): C fastest, then the spatial dims, then N
// (torch's channels_last / channels_last_3d).
TensorArg channels_last_tensor(void* data, DType dtype, std::vector<int64_t> sizes);

// y = act(instance_norm(x) * weight + bias [+ residual]).
//
// x, y: (N, C, *spatial) with 1..3 spatial dims, same sizes/strides class, on `device`.
// Training (use_input_stats): statistics of each (n, c) over the spatial dims; mean and 1/sqrt(var+eps)
// are written to save_mean/save_rstd (fp32, N*C contiguous) when given. running_mean/running_var
// (fp32, C) are updated in the same launch when given.
// Eval (!use_input_stats): normalises with running_mean/running_var, which are then required.
struct ForwardArgs {
  TensorArg x, y;
  TensorArg weight, bias;              // optional (affine), C elements, fp32 or x's dtype
  TensorArg residual;                  // optional, same sizes as x
  float* save_mean = nullptr;          // optional in training, N*C fp32
  float* save_rstd = nullptr;          // optional in training, N*C fp32
  float* running_mean = nullptr;       // optional, C fp32
  float* running_var = nullptr;        // optional, C fp32
  bool use_input_stats = true;
  double eps = 1e-5;
  double momentum = 0.1;
  Activation activation = Activation::identity;
  float activation_param = 0.01f;      // negative slope of leaky_relu
  int device = 0;                      // CUDA device ordinal
  void* stream = nullptr;              // CUstream; nullptr = legacy default stream
};

// Gradients of the training-mode forward. save_mean/save_rstd are those the forward wrote.
struct BackwardArgs {
  TensorArg x, dy, dx;
  TensorArg weight, bias;              // as in the forward (bias is needed to recompute the activation input)
  TensorArg residual;                  // as in the forward
  const float* save_mean = nullptr;    // required, N*C fp32
  const float* save_rstd = nullptr;    // required, N*C fp32
  float* dweight = nullptr;            // optional, C fp32 (sum over N, deterministic order)
  float* dbias = nullptr;              // optional, C fp32
  TensorArg dresidual;                 // optional, written when the forward had a residual
  Activation activation = Activation::identity;
  float activation_param = 0.01f;
  int device = 0;
  void* stream = nullptr;
};

void instance_norm_forward(const ForwardArgs& args);
void instance_norm_backward(const BackwardArgs& args);

// Whether kernels can run here, and if not, why (no driver, no NVRTC, no device).
struct Availability {
  bool available = false;
  std::string reason;
};
Availability availability();

// Cache counters, for stats APIs and tests.
struct CacheStats {
  uint64_t plan_hits = 0, plan_misses = 0;       // L1: launch plans
  uint64_t kernel_hits = 0, kernel_misses = 0;   // L2: loaded kernels
  uint64_t disk_hits = 0, disk_misses = 0, disk_writes = 0, disk_errors = 0;  // L3
  uint64_t compiles = 0;
  uint64_t autotune_searches = 0;        // autotune: candidates timed on the GPU
  uint64_t autotune_records_loaded = 0;  // autotune: a stored choice used instead of a search
  double compile_ms_total = 0;
  std::vector<std::pair<std::string, double>> compile_ms;  // kernel name -> NVRTC milliseconds
};
CacheStats cache_stats();
void reset_cache_stats();
// Drops L1 and L2 (loaded modules stay until process exit); the disk cache is untouched.
void clear_memory_caches();

// Autotune, opt-in like cudnn.benchmark (off by default; NORMJIT_AUTOTUNE=1 turns it on at start).
// With it on, the first call of each (fusion, shape) class times a few valid launch configurations
// of its kernel on the GPU, on the call's own stream and buffers, keeps the fastest and stores the
// choice in the disk cache, so that the next process skips the search. That first call
// synchronises its stream; the real outputs and running statistics are written exactly once.
// Changing the setting drops the in-memory launch plans, so every shape is planned again under it.
void set_autotune(bool enabled);
bool autotune_enabled();

std::string version();

}  // namespace normjit
