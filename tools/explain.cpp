#include "explain.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "runtime/call_keys.h"

namespace normjit::tools {
namespace {

[[noreturn]] void fail(const std::string& what) { throw Error("normjit explain: " + what); }

// Fake device addresses: far apart, each aligned to exactly `align` bytes (the runtime only reads
// their alignment).
struct FakePointers {
  explicit FakePointers(int align) : align_(align) {}
  void* next() {
    base_ += uintptr_t(1) << 40;
    // 1 TiB apart (no overlap), plus `align` so that the largest power of two dividing it is `align`.
    return reinterpret_cast<void*>(base_ + uintptr_t(align_ < 256 ? align_ : 0));
  }

 private:
  int align_;
  uintptr_t base_ = 0;
};

TensorArg tensor(void* data, DType dtype, const Shape& s, Layout layout) {
  return layout == Layout::ncdhw ? contiguous_tensor(data, dtype, s) : channels_last_tensor(data, dtype, s);
}

TensorArg vector_arg(void* data, DType dtype, int64_t n) { return contiguous_tensor(data, dtype, {n}); }

float* fake_f32(FakePointers& p) { return static_cast<float*>(p.next()); }

CallKeys forward_call(const Shape& s, const ExplainOptions& o) {
  FakePointers p(o.align_bytes);
  ForwardArgs a;
  a.x = tensor(p.next(), o.dtype, s, o.layout);
  a.y = tensor(p.next(), o.dtype, s, o.layout);
  const int64_t C = s.size() > 1 ? s[1] : 0;
  if (o.affine) {
    a.weight = vector_arg(p.next(), o.weight_dtype, C);
    a.bias = vector_arg(p.next(), o.weight_dtype, C);
  }
  if (o.residual) a.residual = tensor(p.next(), o.dtype, s, o.layout);
  a.use_input_stats = !o.eval;
  if (o.running || o.eval) {
    a.running_mean = fake_f32(p);
    a.running_var = fake_f32(p);
  }
  if (!o.eval) {  // the PyTorch binding always saves the statistics in training
    a.save_mean = fake_f32(p);
    a.save_rstd = fake_f32(p);
  }
  a.activation = o.activation;
  return forward_keys(a);
}

CallKeys backward_call(const Shape& s, const ExplainOptions& o) {
  FakePointers p(o.align_bytes);
  BackwardArgs a;
  a.x = tensor(p.next(), o.dtype, s, o.layout);
  a.dy = tensor(p.next(), o.dtype, s, o.layout);
  a.dx = tensor(p.next(), o.dtype, s, o.layout);
  const int64_t C = s.size() > 1 ? s[1] : 0;
  if (o.affine) {
    a.weight = vector_arg(p.next(), o.weight_dtype, C);
    a.bias = vector_arg(p.next(), o.weight_dtype, C);
    a.dweight = fake_f32(p);
    a.dbias = fake_f32(p);
  }
  if (o.residual) {
    a.residual = tensor(p.next(), o.dtype, s, o.layout);
    a.dresidual = tensor(p.next(), o.dtype, s, o.layout);
  }
  a.save_mean = fake_f32(p);
  a.save_rstd = fake_f32(p);
  a.activation = o.activation;
  return backward_keys(a);
}

size_t diff_count(const std::string& diff) {
  return diff.empty() ? 0 : 1 + size_t(std::count(diff.begin(), diff.end(), ','));
}

void check_options(const ExplainOptions& o) {
  if (!o.forward && !o.backward) fail("nothing to explain: --direction selects neither fwd nor bwd");
  if (o.eval && !o.forward) fail("--eval has no backward kernel; use --direction fwd or both");
  if (o.align_bytes <= 0 || (o.align_bytes & (o.align_bytes - 1)) != 0)
    fail("--align must be a power of two (bytes), got " + std::to_string(o.align_bytes));
}

std::vector<Direction> directions(const ExplainOptions& o) {
  std::vector<Direction> d;
  if (o.forward) d.push_back(Direction::forward);
  if (o.backward && !o.eval) d.push_back(Direction::backward);
  return d;
}

}  // namespace

std::vector<FusionKey> explain_fusions(const ExplainOptions& o) {
  check_options(o);
  std::vector<FusionKey> out;
  for (Direction d : directions(o)) {
    if (d == Direction::forward)
      out.push_back(make_fusion(d, o.dtype, o.weight_dtype, o.layout, !o.eval, o.affine, o.residual,
                                o.running && !o.eval, !o.eval, o.activation));
    else
      out.push_back(
          make_fusion(d, o.dtype, o.weight_dtype, o.layout, true, o.affine, o.residual, false, false, o.activation));
  }
  return out;
}

std::vector<ExplainCall> explain_calls(const std::vector<Shape>& shapes, const ExplainOptions& o) {
  check_options(o);
  std::vector<ExplainCall> calls;
  // Per fusion: the configs selected so far and the call that introduced each one.
  struct Seen {
    FusionKey fusion;
    std::vector<std::pair<KernelConfig, int>> configs;
  };
  std::vector<Seen> seen;

  for (const Shape& s : shapes) {
    if (s.size() < 3 || s.size() > 5)
      fail("shape " + shape_str(s) + " has " + std::to_string(s.size()) +
           " dims; expected N x C x 1-3 spatial dims, e.g. 2x32x128x128x128");
    for (Direction d : directions(o)) {
      ExplainCall call;
      call.shape = s;
      call.direction = d;
      const CallKeys k = d == Direction::forward ? forward_call(s, o) : backward_call(s, o);
      if (k.empty) {
        call.empty = true;
        call.reason = "zero-size input: nothing is compiled or launched";
        calls.push_back(std::move(call));
        continue;
      }
      call.fusion = k.fusion;
      call.key = k.shape;
      call.launch = choose_launch(k.fusion, k.shape, o.device, o.policy);
      call.config = call.launch.config;

      auto it = std::find_if(seen.begin(), seen.end(), [&](const Seen& x) { return bytes_equal(x.fusion, k.fusion); });
      if (it == seen.end()) {
        seen.push_back({k.fusion, {}});
        it = seen.end() - 1;
      }
      const int index = int(calls.size());
      auto same = std::find_if(it->configs.begin(), it->configs.end(),
                               [&](const auto& c) { return bytes_equal(c.first, call.config); });
      if (same != it->configs.end()) {
        call.shares_with = same->second;
      } else {
        call.new_kernel = true;
        if (it->configs.empty()) {
          call.reason = "new fusion";
        } else {
          std::string best;
          size_t best_count = ~size_t(0);
          for (const auto& c : it->configs) {
            const std::string diff = config_diff(c.first, call.config);
            if (diff_count(diff) < best_count) best_count = diff_count(diff), best = diff;
          }
          call.reason = "new kernel config: " + best;
        }
        it->configs.emplace_back(call.config, index);
      }
      calls.push_back(std::move(call));
    }
  }
  return calls;
}

std::vector<std::pair<FusionKey, KernelConfig>> distinct_kernels(const std::vector<ExplainCall>& calls) {
  std::vector<std::pair<FusionKey, KernelConfig>> out;
  for (const ExplainCall& c : calls)
    if (c.new_kernel) out.emplace_back(c.fusion, c.config);
  return out;
}

std::vector<std::pair<FusionKey, KernelConfig>> all_kernels(const ExplainOptions& o) {
  std::vector<std::pair<FusionKey, KernelConfig>> out;
  for (const FusionKey& f : explain_fusions(o))
    for (const KernelConfig& c : enumerate_configs(f, o.policy, o.device)) out.emplace_back(f, c);
  return out;
}

std::string format_call(const std::vector<ExplainCall>& calls, size_t i) {
  const ExplainCall& c = calls.at(i);
  char head[64];
  std::snprintf(head, sizeof(head), "%-20s %s  ", shape_str(c.shape).c_str(), direction_name(c.direction));
  if (c.empty) return head + c.reason;
  std::string s = head + kernel_name(c.fusion, c.config) + "  " + c.launch.tier + ", grid " +
                  std::to_string(c.launch.grid) + " x " + std::to_string(c.config.threads) + ", chunks " +
                  std::to_string(c.launch.chunks) +
                  // A chunk's length: 16-byte-or-narrower vectors (NCDHW), rows of the channel tile (NDHWC).
                  (c.launch.chunks > 1 ? " of " + std::to_string(c.launch.chunk_vectors) +
                                             (c.fusion.layout == Layout::ncdhw ? " vectors" : " rows")
                                       : "") +
                  (c.launch.cooperative ? " (cooperative)" : "") +
                  (c.launch.l2_prefetch_vectors > 0
                       ? " (next chunk's first " + std::to_string(c.launch.l2_prefetch_vectors) + " vectors to L2)"
                       : "") +
                  (c.launch.cluster > 1 ? " (clusters of " + std::to_string(c.launch.cluster) + ")" : "") + "  ";
  if (c.new_kernel)
    s += "(new kernel: " + c.reason + ")";
  else
    s += "(shares kernel with " + shape_str(calls.at(size_t(c.shares_with)).shape) + ")";
  return s;
}

Shape parse_shape(const std::string& text) {
  Shape s;
  std::string cur;
  auto flush = [&] {
    if (cur.empty()) return;
    char* end = nullptr;
    const long long v = std::strtoll(cur.c_str(), &end, 10);
    if (*end != '\0' || v < 0)
      fail("cannot read '" + text + "' as a shape: '" + cur + "' is not a size; expected e.g. 2x32x128x128x128");
    s.push_back(v);
    cur.clear();
  };
  for (char ch : text) {
    if (std::isdigit(static_cast<unsigned char>(ch)) || ch == '-') {
      cur += ch;
    } else if (ch == 'x' || ch == 'X' || ch == ',' || ch == ' ' || ch == '\t' || ch == '(' || ch == ')' || ch == '[' ||
               ch == ']' || ch == '\r') {
      flush();
    } else {
      fail("cannot read '" + text + "' as a shape: unexpected '" + std::string(1, ch) +
           "'; expected sizes separated by 'x', e.g. 2x32x128x128x128");
    }
  }
  flush();
  if (s.size() < 3 || s.size() > 5)
    fail("shape '" + text + "' has " + std::to_string(s.size()) +
         " sizes; expected N x C x 1-3 spatial dims, e.g. 2x32x128x128x128");
  return s;
}

std::string shape_str(const Shape& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += 'x';
    out += std::to_string(s[i]);
  }
  return out;
}

std::vector<Shape> random_crop_shapes(int count, uint64_t seed, int dims) {
  if (dims < 1 || dims > 3) fail("random crops have 1 to 3 spatial dims, got " + std::to_string(dims));
  uint64_t state = seed;
  auto next = [&]() {  // splitmix64
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  // Uniform in [lo, hi] (the modulo bias over 2^64 is negligible for these ranges).
  auto uniform = [&](int64_t lo, int64_t hi) { return lo + int64_t(next() % uint64_t(hi - lo + 1)); };
  static constexpr int64_t kLadder[] = {32, 64, 128, 256, 320};
  std::vector<Shape> out;
  for (int i = 0; i < count; ++i) {
    Shape s{uniform(1, 4), kLadder[uniform(0, 4)]};
    for (int d = 0; d < dims; ++d) s.push_back(uniform(32, 192));
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<Shape> nnunet_ladder_shapes() {
  return {{2, 32, 128, 128, 128}, {2, 64, 64, 64, 64}, {2, 128, 32, 32, 32},
          {2, 256, 16, 16, 16},   {2, 320, 8, 8, 8},   {2, 320, 4, 4, 4}};
}

// ------------------------------------------------------------------------------ command line
namespace {

DType parse_dtype(const std::string& v) {
  if (v == "f16" || v == "fp16" || v == "float16" || v == "half") return DType::f16;
  if (v == "bf16" || v == "bfloat16") return DType::bf16;
  if (v == "f32" || v == "fp32" || v == "float32" || v == "float") return DType::f32;
  fail("unknown dtype '" + v + "'; expected f16, bf16 or f32");
}

Activation parse_activation(const std::string& v) {
  for (int a = 0; a <= int(Activation::tanh); ++a)
    if (v == activation_name(Activation(a))) return Activation(a);
  if (v == "none") return Activation::identity;
  if (v == "gelu_erf") return Activation::gelu_erf;
  if (v == "swish") return Activation::silu;
  std::string known;
  for (int a = 0; a <= int(Activation::tanh); ++a) known += std::string(a ? ", " : "") + activation_name(Activation(a));
  fail("unknown activation '" + v + "'; expected one of: " + known);
}

void read_shapes_file(const std::string& path, std::vector<Shape>& out) {
  std::ifstream in(path);
  if (!in) fail("cannot open shapes file '" + path + "'");
  std::string line;
  while (std::getline(in, line)) {
    const auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    out.push_back(parse_shape(line));
  }
}

int64_t parse_int(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0') fail(flag + " expects an integer, got '" + v + "'");
  return x;
}

}  // namespace

bool parse_explain_flag(int argc, char** argv, int& i, ExplainCli& cli) {
  std::string a = argv[i];
  std::string value;
  bool has_value = false;
  if (a.rfind("--", 0) == 0) {
    const auto eq = a.find('=');
    if (eq != std::string::npos) value = a.substr(eq + 1), a = a.substr(0, eq), has_value = true;
  }
  auto take = [&]() -> std::string {
    if (has_value) return value;
    if (i + 1 >= argc) fail(a + " needs a value");
    return argv[++i];
  };
  ExplainOptions& o = cli.options;
  if (a == "--device") {
    cli.device_name = take();
  } else if (a == "--dtype") {
    o.dtype = parse_dtype(take());
  } else if (a == "--weight-dtype") {
    const std::string v = take();
    cli.weight_same = v == "same";
    if (!cli.weight_same) o.weight_dtype = parse_dtype(v);
  } else if (a == "--layout") {
    const std::string v = take();
    if (v == "ncdhw" || v == "contiguous")
      o.layout = Layout::ncdhw;
    else if (v == "ndhwc" || v == "channels_last" || v == "channels_last_3d")
      o.layout = Layout::ndhwc;
    else
      fail("unknown layout '" + v + "'; expected ncdhw or ndhwc");
  } else if (a == "--direction") {
    const std::string v = take();
    if (v == "fwd" || v == "forward")
      o.forward = true, o.backward = false;
    else if (v == "bwd" || v == "backward")
      o.forward = false, o.backward = true;
    else if (v == "both")
      o.forward = o.backward = true;
    else
      fail("unknown direction '" + v + "'; expected fwd, bwd or both");
  } else if (a == "--affine") {
    o.affine = true;
  } else if (a == "--no-affine") {
    o.affine = false;
  } else if (a == "--activation") {
    o.activation = parse_activation(take());
  } else if (a == "--residual") {
    o.residual = true;
  } else if (a == "--running") {
    o.running = true;
  } else if (a == "--eval") {
    o.eval = true;
  } else if (a == "--policy") {
    const std::string v = take();
    if (v == "bounded")
      o.policy = Policy::bounded;
    else if (v == "exact")
      o.policy = Policy::exact;
    else
      fail("unknown policy '" + v + "'; expected bounded or exact");
  } else if (a == "--align") {
    o.align_bytes = int(parse_int(a, take()));
  } else if (a == "--all") {
    cli.all = true;
  } else if (a == "--shapes-file") {
    read_shapes_file(take(), cli.shapes);
  } else if (a == "--random") {
    cli.random = int(parse_int(a, take()));
    if (cli.random < 0) fail("--random expects a count >= 0");
  } else if (a == "--seed") {
    cli.seed = uint64_t(parse_int(a, take()));
  } else if (!a.empty() && (std::isdigit(static_cast<unsigned char>(a[0])) || a[0] == '(')) {
    cli.shapes.push_back(parse_shape(a));
  } else {
    return false;
  }
  return true;
}

void finish_explain_cli(ExplainCli& cli) {
  ExplainOptions& o = cli.options;
  if (cli.weight_same) o.weight_dtype = o.dtype;
  std::string lower = cli.device_name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char ch) { return std::tolower(ch); });
  o.device = lower == "live" ? live_profile(0) : builtin_profile(cli.device_name);
  if (cli.random > 0) {
    const std::vector<Shape> r = random_crop_shapes(cli.random, cli.seed);
    cli.shapes.insert(cli.shapes.end(), r.begin(), r.end());
  }
  check_options(o);
}

const char* explain_flags_help() {
  return "  --device NAME        H200 (default), H100, A100, L4, or live (the GPU here)\n"
         "  --dtype T            f16 (default), bf16, f32\n"
         "  --weight-dtype T     affine parameters: f32 (default, as under autocast) or same\n"
         "  --layout L           ncdhw (contiguous, default) or ndhwc (channels_last_3d)\n"
         "  --direction D        fwd, bwd or both (default)\n"
         "  --affine/--no-affine with weight and bias (default) or without\n"
         "  --activation NAME    identity (default), relu, leaky_relu, gelu, gelu_tanh, silu, sigmoid, tanh\n"
         "  --residual           y = act(norm(x) * w + b + residual)\n"
         "  --running            update running statistics (track_running_stats=True)\n"
         "  --eval               normalise with running statistics (forward only)\n"
         "  --policy P           bounded (default) or exact (NORMJIT_POLICY)\n"
         "  --align BYTES        alignment of the data pointers (default 256, a fresh allocation)\n"
         "  --all                every kernel config the policy allows for the fusion(s)\n"
         "  --shapes-file F      shapes one per line ('#' starts a comment)\n"
         "  --random N --seed S  N random crops: N in [1,4], C in {32,64,128,256,320}, D,H,W in [32,192]\n"
         "  SHAPE                N x C x spatial dims, e.g. 2x32x128x128x128 (1-3 spatial dims)\n";
}

}  // namespace normjit::tools
