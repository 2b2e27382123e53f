// Autograd for normjit::instance_norm_fwd, in C++ (as torchvision does for its ops), so the
// per-call path stays out of Python.
//
// Training (use_input_stats): the backward is normjit::instance_norm_bwd (the core's kernels).
// Eval (normalised with running statistics): the core has no backward kernel for it; the
// backward is a few plain aten ops (dx = dz * w * rsqrt(running_var + eps), dz = dy * act'(z)).
#include "ops.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <vector>

namespace normjit_torch {
namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

const c10::TypedOperatorHandle<FwdSig>& fwd_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("normjit::instance_norm_fwd", "")
                             .typed<FwdSig>();
  return op;
}

const c10::TypedOperatorHandle<BwdSig>& bwd_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("normjit::instance_norm_bwd", "")
                             .typed<BwdSig>();
  return op;
}

bool present(const OptTensor& t) { return t.has_value() && t->defined(); }
OptTensor opt(const Tensor& t) { return t.defined() ? OptTensor(t) : OptTensor(); }

// dz = dy * act'(z), all fp32.
Tensor activation_backward(const Tensor& dy, const Tensor& z, int64_t activation, double param) {
  switch (activation) {
    case kRelu: return at::threshold_backward(dy, z, 0);
    case kLeakyRelu: return at::leaky_relu_backward(dy, z, param, /*self_is_result=*/false);
    case kGeluErf: return at::gelu_backward(dy, z, "none");
    case kGeluTanh: return at::gelu_backward(dy, z, "tanh");
    case kSilu: return at::silu_backward(dy, z);
    case kSigmoid: return at::sigmoid_backward(dy, at::sigmoid(z));
    case kTanh: return at::tanh_backward(dy, at::tanh(z));
    default: return dy;
  }
}

// Gradients of y = act(((x - mean) * rstd) * w + b [+ r]) with per-channel mean/rstd (eval).
// Returns {dx, dw, db, dr}; undefined where not needed.
std::array<Tensor, 4> eval_backward(const Tensor& dy, const Tensor& x, const Tensor& w,
                                    const Tensor& b, const Tensor& r, const Tensor& mean,
                                    const Tensor& rstd, int64_t activation, double param,
                                    bool need_x, bool need_w, bool need_b, bool need_r) {
  const int64_t nd = x.dim();
  std::vector<int64_t> shape(nd, 1);
  shape[1] = x.size(1);
  std::vector<int64_t> reduce_dims{0};
  for (int64_t d = 2; d < nd; ++d) reduce_dims.push_back(d);

  const Tensor dy32 = dy.to(at::kFloat);
  const Tensor mean_b = mean.view(shape), rstd_b = rstd.view(shape);
  Tensor xhat;
  if (activation != kIdentity || need_w) xhat = (x.to(at::kFloat) - mean_b) * rstd_b;
  Tensor dz = dy32;
  if (activation != kIdentity) {
    Tensor z = xhat;
    if (w.defined()) z = z * w.to(at::kFloat).reshape(shape);
    if (b.defined()) z = z + b.to(at::kFloat).reshape(shape);
    if (r.defined()) z = z + r.to(at::kFloat);
    dz = activation_backward(dy32, z, activation, param);
  }
  std::array<Tensor, 4> g;
  if (need_x) {
    Tensor scale = w.defined() ? w.to(at::kFloat).reshape(shape) * rstd_b : rstd_b;
    g[0] = (dz * scale).to(x.scalar_type());
  }
  if (need_w && w.defined())
    g[1] = (dz * xhat).sum(reduce_dims).to(w.scalar_type()).view(w.sizes());
  if (need_b && b.defined()) g[2] = dz.sum(reduce_dims).to(b.scalar_type()).view(b.sizes());
  if (need_r && r.defined()) g[3] = dz.to(r.scalar_type());
  return g;
}

class InstanceNormFunction : public torch::autograd::Function<InstanceNormFunction> {
 public:
  // Positions of the forward's arguments, which are also the positions of backward's outputs.
  enum { kX, kWeight, kBias, kResidual, kRunningMean, kRunningVar, kNumArgs = 11 };

  static variable_list forward(AutogradContext* ctx, const Tensor& x, const OptTensor& weight,
                               const OptTensor& bias, const OptTensor& residual,
                               const OptTensor& running_mean, const OptTensor& running_var,
                               bool use_input_stats, double momentum, double eps,
                               int64_t activation, double activation_param) {
    // The saved statistics are non-differentiable, so their gradients are always undefined:
    // without this autograd would hand backward two zero-filled (N*C) tensors, two fill kernels
    // a backward (ncu, session 34). backward reads grads[0] alone and checks it is defined.
    ctx->set_materialize_grads(false);
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [y, save_mean, save_rstd] =
        fwd_op().call(x, weight, bias, residual, running_mean, running_var, use_input_stats,
                      momentum, eps, activation, activation_param);

    // needs_input_grad() counts edges, which exist only for the tensors that were given.
    int64_t edge = 1;  // x is edge 0
    auto edge_of = [&](const OptTensor& t) -> int64_t { return present(t) ? edge++ : -1; };
    ctx->saved_data["weight_edge"] = edge_of(weight);
    ctx->saved_data["bias_edge"] = edge_of(bias);
    ctx->saved_data["residual_edge"] = edge_of(residual);
    ctx->saved_data["train"] = use_input_stats;
    ctx->saved_data["activation"] = activation;
    ctx->saved_data["activation_param"] = activation_param;

    Tensor stat0 = save_mean, stat1 = save_rstd;
    if (!use_input_stats) {
      // Eval: per-channel mean and 1/sqrt(var + eps) of the running statistics, copied now so
      // that later updates of the buffers do not change this graph's gradients.
      // (copy=true: an op below autograd must not hand back its input, as to() would.)
      stat0 = running_mean->to(at::kFloat, /*non_blocking=*/false, /*copy=*/true).reshape({-1});
      stat1 = at::rsqrt(running_var->to(at::kFloat, false, /*copy=*/true).reshape({-1}) + eps);
    }
    ctx->save_for_backward({x, weight.value_or(Tensor()), bias.value_or(Tensor()),
                            residual.value_or(Tensor()), stat0, stat1});
    ctx->mark_non_differentiable({save_mean, save_rstd});
    return {y, save_mean, save_rstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &x = saved[0], &w = saved[1], &b = saved[2], &r = saved[3];
    const Tensor &stat0 = saved[4], &stat1 = saved[5];
    const bool train = ctx->saved_data["train"].toBool();
    const int64_t activation = ctx->saved_data["activation"].toInt();
    const double param = ctx->saved_data["activation_param"].toDouble();
    auto needs = [&](const char* key) {
      const int64_t e = ctx->saved_data[key].toInt();
      return e >= 0 && ctx->needs_input_grad(static_cast<size_t>(e));
    };
    const bool need_x = ctx->needs_input_grad(0);
    const bool need_w = needs("weight_edge");
    const bool need_b = needs("bias_edge");
    const bool need_r = needs("residual_edge");

    variable_list out(kNumArgs);
    const Tensor& dy = grads[0];
    if (!dy.defined() || !(need_x || need_w || need_b || need_r)) return out;
    if (train) {
      auto [dx, dw, db, dr] = bwd_op().call(dy, x, opt(w), opt(b), opt(r), stat0, stat1,
                                            activation, param, {need_w, need_b, need_r});
      if (need_x) out[kX] = dx;
      if (need_w) out[kWeight] = dw;
      if (need_b) out[kBias] = db;
      if (need_r) out[kResidual] = dr;
    } else {
      auto g = eval_backward(dy, x, w, b, r, stat0, stat1, activation, param, need_x, need_w,
                             need_b, need_r);
      out[kX] = g[0];
      out[kWeight] = g[1];
      out[kBias] = g[2];
      out[kResidual] = g[3];
    }
    return out;
  }
};

std::tuple<Tensor, Tensor, Tensor> instance_norm_fwd_autograd(
    const Tensor& x, const OptTensor& weight, const OptTensor& bias, const OptTensor& residual,
    const OptTensor& running_mean, const OptTensor& running_var, bool use_input_stats,
    double momentum, double eps, int64_t activation, double activation_param) {
  const bool needs_grad =
      at::GradMode::is_enabled() &&
      (x.requires_grad() || (present(weight) && weight->requires_grad()) ||
       (present(bias) && bias->requires_grad()) || (present(residual) && residual->requires_grad()));
  std::tuple<Tensor, Tensor, Tensor> result;
  if (!needs_grad) {  // inference: no graph, no Function
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    result = fwd_op().call(x, weight, bias, residual, running_mean, running_var, use_input_stats,
                           momentum, eps, activation, activation_param);
  } else {
    auto outs = InstanceNormFunction::apply(x, weight, bias, residual, running_mean, running_var,
                                            use_input_stats, momentum, eps, activation,
                                            activation_param);
    result = {outs[0], outs[1], outs[2]};
  }
  // The running statistics were updated in place below the ADInplaceOrView key: bump their
  // version counters as an aten in-place op would.
  if (use_input_stats) {
    for (const OptTensor* t : {&running_mean, &running_var}) {
      if (present(*t) && !(*t)->is_inference()) torch::autograd::impl::bump_version(**t);
    }
  }
  return result;
}

}  // namespace

TORCH_LIBRARY_IMPL(normjit, Autograd, m) {
  m.impl("instance_norm_fwd", TORCH_FN(instance_norm_fwd_autograd));
}

}  // namespace normjit_torch
