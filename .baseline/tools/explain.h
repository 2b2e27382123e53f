// What normjit would do for a list of shapes, without a GPU: the kernel each call selects, its
// launch, and whether that kernel is new (and why) or shared with an earlier shape.
//
// The prediction runs the runtime's own code: forward_keys/backward_keys (validation and keys,
// given fake but aligned pointers) and choose_launch (the heuristics). `normjit explain`, `normjit
// warmup`, `normjit demo` and the tests are built on explain_calls().
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "normjit/normjit.h"
#include "runtime/keys.h"
#include "schedule/device_profile.h"
#include "schedule/heuristics.h"

namespace normjit::tools {

using Shape = std::vector<int64_t>;  // (N, C, 1-3 spatial dims)

// The call being predicted: what a PyTorch module would pass for each shape.
struct ExplainOptions {
  DeviceProfile device = builtin_profile("H200");
  DType dtype = DType::f16;
  DType weight_dtype = DType::f32;  // affine parameters: f32 (autocast) or the input's dtype
  Layout layout = Layout::ncdhw;    // ncdhw = contiguous, ndhwc = channels_last_3d
  bool forward = true;
  bool backward = true;  // ignored in eval (there is no eval backward kernel)
  bool affine = true;
  bool residual = false;
  bool running = false;  // running statistics (track_running_stats)
  bool eval = false;     // normalise with the running statistics (forward only)
  Activation activation = Activation::identity;
  Policy policy = Policy::bounded;
  int align_bytes = 256;  // alignment of every data pointer (a fresh allocation: 256)
};

struct ExplainCall {
  Shape shape;
  Direction direction = Direction::forward;
  bool empty = false;  // zero-size shape: nothing compiled or launched (fusion/config unset)
  FusionKey fusion{};
  ShapeKey key{};  // the runtime's shape key of the call (its sizes, strides, alignment)
  KernelConfig config{};
  Launch launch;
  bool new_kernel = false;  // the first call of this run that needs this kernel
  std::string reason;       // new_kernel: "new fusion" or "new kernel config: <diff vs nearest>"
  int shares_with = -1;     // !new_kernel: index (into the result) of the call that introduced it
};

// One entry per (shape, direction), shapes in order, forward before backward. Throws
// normjit::Error for an invalid shape (the runtime's own message) or option combination.
std::vector<ExplainCall> explain_calls(const std::vector<Shape>& shapes, const ExplainOptions& options);

// The fusions the options describe (forward and/or backward), in the order explain_calls uses.
std::vector<FusionKey> explain_fusions(const ExplainOptions& options);

// The distinct kernels of a prediction, in first-use order.
std::vector<std::pair<FusionKey, KernelConfig>> distinct_kernels(const std::vector<ExplainCall>& calls);

// Every config of enumerate_configs for each of the options' fusions (the documented bound).
std::vector<std::pair<FusionKey, KernelConfig>> all_kernels(const ExplainOptions& options);

// One line for calls[i]: shape, direction, kernel name, tier, grid x threads, chunks, and
// "(new kernel: <reason>)" or "(shares kernel with <shape>)".
std::string format_call(const std::vector<ExplainCall>& calls, size_t i);

// "2x32x128x128x128" -> {2, 32, 128, 128, 128}; throws normjit::Error saying what is expected.
Shape parse_shape(const std::string& text);
std::string shape_str(const Shape& s);

// The random crop stream of the issue: N uniform in [1, 4], C from the nnU-Net ladder
// {32, 64, 128, 256, 320}, each of the `dims` spatial sizes uniform in [32, 192]. A portable
// generator (splitmix64), so a seed gives the same shapes on every platform.
std::vector<Shape> random_crop_shapes(int count, uint64_t seed, int dims = 3);

// The nnU-Net ladder at batch 2 (the demo's shapes).
std::vector<Shape> nnunet_ladder_shapes();

// Command-line options shared by explain, warmup and demo. Consumes argv[i] (and its value,
// advancing i) when it is one of explain's flags and returns true; returns false for anything
// else. Throws normjit::Error for a bad value.
struct ExplainCli {
  ExplainOptions options;
  std::string device_name = "H200";
  bool weight_same = false;  // --weight-dtype same
  bool all = false;
  std::vector<Shape> shapes;
  int random = 0;
  uint64_t seed = 0;
};
bool parse_explain_flag(int argc, char** argv, int& i, ExplainCli& cli);
// Resolves --device (reading the GPU for "live"), --random and --shapes-file into cli.
void finish_explain_cli(ExplainCli& cli);
// The help text of those flags.
const char* explain_flags_help();

}  // namespace normjit::tools
