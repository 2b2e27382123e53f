// Shared declarations of the normjit PyTorch binding (python/csrc).
//
// ops.cpp       schema (TORCH_LIBRARY) and the CUDA kernels: c10 tensors -> normjit::TensorArg
// autograd.cpp  the Autograd kernel of instance_norm_fwd (a torch::autograd::Function)
// module.cpp    the pybind11 module normjit._C (availability, cache statistics)
// warmup.cpp    warmup_calls / nvrtc_available: ahead-of-time kernels for a model's calls
#pragma once

#include <ATen/core/Tensor.h>
#include <normjit/normjit.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <tuple>

namespace normjit_torch {

// Number of layout copies the binding made because an input was neither contiguous nor
// channels-last contiguous (x), or did not have x's layout (residual, dy). Exposed in cache_info().
extern std::atomic<uint64_t> layout_copies;

using OptTensor = std::optional<at::Tensor>;

// Activation codes; the same numbers as normjit::Activation and normjit/functional.py.
enum ActivationCode : int64_t {
  kIdentity = 0,
  kRelu = 1,
  kLeakyRelu = 2,
  kGeluErf = 3,
  kGeluTanh = 4,
  kSilu = 5,
  kSigmoid = 6,
  kTanh = 7,
};

// Conventions of the operators (ops.cpp), shared with warmup.cpp so that a warm-up builds the
// very arguments the operators would.
normjit::DType to_normjit_dtype(at::ScalarType t);
normjit::Activation to_activation(int64_t code);
// The layout the kernels see: Contiguous, ChannelsLast(3d), or Preserve when x is neither (the
// operator then copies x to contiguous).
at::MemoryFormat served_format(const at::Tensor& x);
// A TensorArg of the given sizes, contiguous in `fmt` (Contiguous or channels last).
normjit::TensorArg strided_arg(void* data, normjit::DType dtype, at::IntArrayRef sizes,
                               at::MemoryFormat fmt);

// C++ signatures of the two operators (see the schemas in ops.cpp).
using FwdSig = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor& x, const OptTensor& weight, const OptTensor& bias, const OptTensor& residual,
    const OptTensor& running_mean, const OptTensor& running_var, bool use_input_stats,
    double momentum, double eps, int64_t activation, double activation_param);

using BwdSig = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor& dy, const at::Tensor& x, const OptTensor& weight, const OptTensor& bias,
    const OptTensor& residual, const at::Tensor& save_mean, const at::Tensor& save_rstd,
    int64_t activation, double activation_param, std::array<bool, 3> output_mask);

}  // namespace normjit_torch
