// The normjit operators: schemas and CUDA kernels.
//
// The CUDA kernels turn c10 tensors into normjit::TensorArg and call the core library on the
// current CUDA stream. They never compute anything themselves; what they do on top of the core:
//   - x that is neither contiguous nor channels-last contiguous is made contiguous (counted);
//   - residual and dy that do not have x's layout are copied into it (counted);
//   - weight/bias in a dtype other than fp32 or x's are converted to fp32;
//   - running statistics that are not fp32 contiguous go through an fp32 copy (copied back);
//   - dweight/dbias come back from the core in fp32 and are cast to the parameter's dtype.
// normjit::Error becomes a c10::Error (Python: RuntimeError) with the same text.
#include "ops.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#ifdef NORMJIT_TORCH_CUDA
// Only out-of-line c10_cuda functions are used (getCurrentCUDAStream, CUDAStream::stream), so no
// CUDA runtime symbol is referenced from this module. (c10::cuda::CUDAGuard would pull in inline
// cudaEvent* calls; the generic c10::DeviceGuard dispatches to the same CUDA guard without them.)
#include <c10/cuda/CUDAStream.h>
#endif

#include <normjit/normjit.h>

namespace normjit_torch {

std::atomic<uint64_t> layout_copies{0};

using at::Tensor;

normjit::DType to_normjit_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return normjit::DType::f32;
    case at::kHalf: return normjit::DType::f16;
    case at::kBFloat16: return normjit::DType::bf16;
    default: break;
  }
  TORCH_CHECK(false, "normjit: unsupported dtype ", t, "; expected float32, float16 or bfloat16");
}

normjit::Activation to_activation(int64_t code) {
  TORCH_CHECK(code >= kIdentity && code <= kTanh, "normjit: activation code ", code,
              " is out of range; expected 0 (identity), 1 (relu), 2 (leaky_relu), 3 (gelu), ",
              "4 (gelu_tanh), 5 (silu), 6 (sigmoid) or 7 (tanh)");
  return static_cast<normjit::Activation>(code);
}

// The layout the kernels see. Contiguous is preferred when a tensor is both (size-1 dims).
at::MemoryFormat served_format(const Tensor& x) {
  if (x.is_contiguous()) return at::MemoryFormat::Contiguous;
  if (x.dim() == 4 && x.is_contiguous(at::MemoryFormat::ChannelsLast))
    return at::MemoryFormat::ChannelsLast;
  if (x.dim() == 5 && x.is_contiguous(at::MemoryFormat::ChannelsLast3d))
    return at::MemoryFormat::ChannelsLast3d;
  return at::MemoryFormat::Preserve;  // neither: the caller copies
}

// The strides are the canonical ones of `fmt` (strides of size-1 dims are arbitrary in c10 and
// do not change any address).
normjit::TensorArg strided_arg(void* data, normjit::DType dtype, at::IntArrayRef sizes,
                               at::MemoryFormat fmt) {
  normjit::TensorArg a;
  a.data = data;
  a.dtype = dtype;
  a.ndim = static_cast<int>(sizes.size());
  const int nd = a.ndim;
  for (int i = 0; i < nd; ++i) a.sizes[i] = sizes[i];
  auto sz = [&](int i) { return std::max<int64_t>(a.sizes[i], 1); };
  if (fmt == at::MemoryFormat::Contiguous) {
    int64_t s = 1;
    for (int i = nd - 1; i >= 0; --i) {
      a.strides[i] = s;
      s *= sz(i);
    }
  } else {  // channels last: C fastest, then the spatial dims last to first, then N
    int64_t s = 1;
    a.strides[1] = s;
    s *= sz(1);
    for (int i = nd - 1; i >= 2; --i) {
      a.strides[i] = s;
      s *= sz(i);
    }
    a.strides[0] = s;
  }
  return a;
}

namespace {

void check_x(const Tensor& x, const char* op, const char* name) {
  TORCH_CHECK(x.defined(), op, ": ", name, " is undefined");
  TORCH_CHECK(x.is_cuda(), op, ": ", name, " must be a CUDA tensor, got a tensor on ", x.device(),
              " (normjit.functional falls back to torch for CPU tensors; the op itself does not)");
  const auto t = x.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kHalf || t == at::kBFloat16, op, ": ", name,
              " must be float32, float16 or bfloat16, got ", t);
  TORCH_CHECK(x.dim() >= 3 && x.dim() <= 5, op, ": ", name,
              " must have 3 to 5 dimensions (N, C, *spatial), got ", x.dim(), " with sizes ",
              x.sizes());
}

// x in a served layout: passed through, or copied to contiguous (counted).
Tensor served_x(const Tensor& x_in, at::MemoryFormat& fmt) {
  fmt = served_format(x_in);
  if (fmt != at::MemoryFormat::Preserve) return x_in;
  layout_copies.fetch_add(1, std::memory_order_relaxed);
  fmt = at::MemoryFormat::Contiguous;
  return x_in.contiguous();
}

// t (same sizes as x) in x's dtype and layout; copies are counted.
Tensor like_x(const Tensor& t, const Tensor& x, at::MemoryFormat fmt, const char* op,
              const char* name) {
  TORCH_CHECK(t.sizes() == x.sizes(), op, ": ", name, " must have the sizes of x ", x.sizes(),
              ", got ", t.sizes());
  TORCH_CHECK(t.device() == x.device(), op, ": ", name, " must be on x's device ", x.device(),
              ", got ", t.device());
  Tensor r = t.scalar_type() == x.scalar_type() ? t : t.to(x.scalar_type());
  if (r.is_contiguous(fmt)) return r;
  layout_copies.fetch_add(1, std::memory_order_relaxed);
  Tensor out = at::empty(x.sizes(), r.options().memory_format(fmt));
  out.copy_(r);
  return out;
}

// A TensorArg for a tensor that is contiguous in `fmt`.
normjit::TensorArg tensor_arg(const Tensor& t, at::MemoryFormat fmt) {
  return strided_arg(t.data_ptr(), to_normjit_dtype(t.scalar_type()), t.sizes(), fmt);
}

normjit::TensorArg vector_arg(const Tensor& t) {
  normjit::TensorArg a;
  a.data = t.data_ptr();
  a.dtype = to_normjit_dtype(t.scalar_type());
  a.ndim = 1;
  a.sizes[0] = t.numel();
  a.strides[0] = 1;
  return a;
}

// weight/bias: C elements on x's device, contiguous, fp32 or x's dtype (else converted to fp32).
Tensor param(const OptTensor& p, const Tensor& x, const char* op, const char* name) {
  if (!p.has_value() || !p->defined()) return Tensor();
  const Tensor& t = *p;
  TORCH_CHECK(t.numel() == x.size(1), op, ": ", name, " should contain ", x.size(1),
              " elements (the number of channels) not ", t.numel());
  TORCH_CHECK(t.device() == x.device(), op, ": ", name, " must be on x's device ", x.device(),
              ", got ", t.device());
  Tensor r = t;
  if (r.scalar_type() != at::kFloat && r.scalar_type() != x.scalar_type()) r = r.to(at::kFloat);
  return r.contiguous();
}

// running_mean/running_var: the core wants C fp32 contiguous; anything else goes through a copy.
struct RunningStat {
  Tensor user;     // the caller's tensor (undefined if absent)
  Tensor buffer;   // what the core reads/writes
  bool copy_back = false;
};

RunningStat running_stat(const OptTensor& p, const Tensor& x, const char* name) {
  RunningStat r;
  if (!p.has_value() || !p->defined()) return r;
  r.user = *p;
  TORCH_CHECK(r.user.numel() == x.size(1), "instance_norm_fwd: ", name, " should contain ",
              x.size(1), " elements (the number of channels) not ", r.user.numel());
  TORCH_CHECK(r.user.device() == x.device(), "instance_norm_fwd: ", name,
              " must be on x's device ", x.device(), ", got ", r.user.device());
  if (r.user.scalar_type() == at::kFloat && r.user.is_contiguous()) {
    r.buffer = r.user;
  } else {
    r.buffer = r.user.to(at::kFloat).contiguous();
    r.copy_back = true;
  }
  return r;
}

// Runs a core entry point; its normjit::Error (bad arguments, an NVRTC log, a driver failure)
// becomes a c10::Error (Python: RuntimeError) with the same text.
template <typename Args>
void call_core(void (*entry)(const Args&), const Args& args) {
  try {
    entry(args);
  } catch (const normjit::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

void* current_stream(const Tensor& x) {
#ifdef NORMJIT_TORCH_CUDA
  return static_cast<void*>(c10::cuda::getCurrentCUDAStream(x.device().index()).stream());
#else
  (void)x;
  TORCH_CHECK(false, "normjit: this build of the binding was made against a torch without CUDA");
#endif
}

std::tuple<Tensor, Tensor, Tensor> instance_norm_fwd_cuda(
    const Tensor& x_in, const OptTensor& weight, const OptTensor& bias, const OptTensor& residual,
    const OptTensor& running_mean, const OptTensor& running_var, bool use_input_stats,
    double momentum, double eps, int64_t activation, double activation_param) {
  constexpr const char* op = "normjit.instance_norm_fwd";
  check_x(x_in, op, "x");
  c10::DeviceGuard guard(x_in.device());
  at::MemoryFormat fmt;
  const Tensor x = served_x(x_in, fmt);
  const int64_t N = x.size(0), C = x.size(1);
  const auto f32 = x.options().dtype(at::kFloat);

  Tensor y = at::empty(x.sizes(), x.options().memory_format(fmt));
  Tensor save_mean = at::empty({use_input_stats ? N * C : 0}, f32);
  Tensor save_rstd = at::empty({use_input_stats ? N * C : 0}, f32);

  const Tensor w = param(weight, x, op, "weight");
  const Tensor b = param(bias, x, op, "bias");
  Tensor r;
  if (residual.has_value() && residual->defined()) r = like_x(*residual, x, fmt, op, "residual");
  RunningStat rm = running_stat(running_mean, x, "running_mean");
  RunningStat rv = running_stat(running_var, x, "running_var");
  TORCH_CHECK(use_input_stats || (rm.user.defined() && rv.user.defined()),
              "Expected running_mean and running_var to be defined when use_input_stats is false");
  const normjit::Activation act = to_activation(activation);
  if (x.numel() == 0) return {y, save_mean, save_rstd};

  normjit::ForwardArgs a;
  a.x = tensor_arg(x, fmt);
  a.y = tensor_arg(y, fmt);
  if (w.defined()) a.weight = vector_arg(w);
  if (b.defined()) a.bias = vector_arg(b);
  if (r.defined()) a.residual = tensor_arg(r, fmt);
  if (use_input_stats) {
    a.save_mean = save_mean.data_ptr<float>();
    a.save_rstd = save_rstd.data_ptr<float>();
  }
  if (rm.buffer.defined()) a.running_mean = rm.buffer.data_ptr<float>();
  if (rv.buffer.defined()) a.running_var = rv.buffer.data_ptr<float>();
  a.use_input_stats = use_input_stats;
  a.eps = eps;
  a.momentum = momentum;
  a.activation = act;
  a.activation_param = static_cast<float>(activation_param);
  a.device = x.device().index();
  a.stream = current_stream(x);
  call_core(normjit::instance_norm_forward, a);
  if (use_input_stats) {
    if (rm.copy_back) rm.user.copy_(rm.buffer);
    if (rv.copy_back) rv.user.copy_(rv.buffer);
  }
  return {y, save_mean, save_rstd};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> instance_norm_bwd_cuda(
    const Tensor& dy_in, const Tensor& x_in, const OptTensor& weight, const OptTensor& bias,
    const OptTensor& residual, const Tensor& save_mean, const Tensor& save_rstd,
    int64_t activation, double activation_param, std::array<bool, 3> output_mask) {
  constexpr const char* op = "normjit.instance_norm_bwd";
  check_x(x_in, op, "x");
  c10::DeviceGuard guard(x_in.device());
  at::MemoryFormat fmt;
  const Tensor x = served_x(x_in, fmt);
  const int64_t N = x.size(0), C = x.size(1);
  const auto f32 = x.options().dtype(at::kFloat);
  TORCH_CHECK(dy_in.defined(), op, ": dy is undefined");
  const Tensor dy = like_x(dy_in, x, fmt, op, "dy");
  for (const Tensor* s : {&save_mean, &save_rstd}) {
    TORCH_CHECK(s->scalar_type() == at::kFloat && s->numel() == N * C && s->is_contiguous() &&
                    s->device() == x.device(),
                op, ": save_mean/save_rstd must be contiguous float32 tensors of N*C = ", N * C,
                " elements on x's device (those the training-mode forward returned); got ",
                s->scalar_type(), " with ", s->numel(), " elements on ", s->device());
  }
  const Tensor w = param(weight, x, op, "weight");
  const Tensor b = param(bias, x, op, "bias");
  Tensor r;
  if (residual.has_value() && residual->defined()) r = like_x(*residual, x, fmt, op, "residual");
  const normjit::Activation act = to_activation(activation);

  const bool want_dw = output_mask[0] && w.defined();
  const bool want_db = output_mask[1] && b.defined();
  const bool want_dr = output_mask[2] && r.defined();
  Tensor dx = at::empty(x.sizes(), x.options().memory_format(fmt));
  Tensor dw32 = want_dw ? at::empty({C}, f32) : Tensor();
  Tensor db32 = want_db ? at::empty({C}, f32) : Tensor();
  Tensor dr = want_dr ? at::empty(x.sizes(), x.options().memory_format(fmt)) : Tensor();

  if (x.numel() == 0) {
    if (want_dw) dw32.zero_();
    if (want_db) db32.zero_();
  } else {
    normjit::BackwardArgs a;
    a.x = tensor_arg(x, fmt);
    a.dy = tensor_arg(dy, fmt);
    a.dx = tensor_arg(dx, fmt);
    if (w.defined()) a.weight = vector_arg(w);
    if (b.defined()) a.bias = vector_arg(b);
    if (r.defined()) a.residual = tensor_arg(r, fmt);
    a.save_mean = save_mean.data_ptr<float>();
    a.save_rstd = save_rstd.data_ptr<float>();
    if (want_dw) a.dweight = dw32.data_ptr<float>();
    if (want_db) a.dbias = db32.data_ptr<float>();
    if (want_dr) a.dresidual = tensor_arg(dr, fmt);
    a.activation = act;
    a.activation_param = static_cast<float>(activation_param);
    a.device = x.device().index();
    a.stream = current_stream(x);
    call_core(normjit::instance_norm_backward, a);
  }

  // Outputs in the dtypes/shapes of the inputs they are gradients of; (0,) when not requested.
  // The fake kernel in normjit/_ops.py mirrors these rules.
  Tensor dweight = want_dw ? dw32.to(weight->scalar_type()).view(weight->sizes())
                           : at::empty({0}, f32.dtype(weight.has_value() && weight->defined()
                                                          ? weight->scalar_type()
                                                          : at::kFloat));
  Tensor dbias = want_db ? db32.to(bias->scalar_type()).view(bias->sizes())
                         : at::empty({0}, f32.dtype(bias.has_value() && bias->defined()
                                                        ? bias->scalar_type()
                                                        : at::kFloat));
  Tensor dresidual = want_dr ? (residual->scalar_type() == dr.scalar_type()
                                    ? dr
                                    : dr.to(residual->scalar_type()))
                             : at::empty({0}, x.options());
  return {dx, dweight, dbias, dresidual};
}

}  // namespace

TORCH_LIBRARY(normjit, m) {
  // The fake (meta) kernels live in Python, in normjit/_ops.py.
  m.set_python_module("normjit._ops");
  m.def(
      "instance_norm_fwd(Tensor x, Tensor? weight, Tensor? bias, Tensor? residual, "
      "Tensor(a!)? running_mean, Tensor(b!)? running_var, bool use_input_stats, float momentum, "
      "float eps, int activation, float activation_param) -> (Tensor, Tensor, Tensor)");
  m.def(
      "instance_norm_bwd(Tensor dy, Tensor x, Tensor? weight, Tensor? bias, Tensor? residual, "
      "Tensor save_mean, Tensor save_rstd, int activation, float activation_param, "
      "bool[3] output_mask) -> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(normjit, CUDA, m) {
  m.impl("instance_norm_fwd", TORCH_FN(instance_norm_fwd_cuda));
  m.impl("instance_norm_bwd", TORCH_FN(instance_norm_bwd_cuda));
}

}  // namespace normjit_torch
