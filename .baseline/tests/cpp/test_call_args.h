// Calls for the offline tests of the heuristics: the arguments the binding passes, with fake
// device pointers (the heuristics read only their alignment).
#pragma once

#include <cstdint>
#include <vector>

#include "normjit/normjit.h"

namespace normjit {

using Shape = std::vector<int64_t>;

// A device address whose largest power-of-two divisor is `align` bytes (256: a fresh allocation).
inline void* fake_ptr(int index, int align = 256) {
  return reinterpret_cast<void*>((uintptr_t(index + 1) << 36) + uintptr_t(align < 256 ? align : 0));
}

inline TensorArg make_tensor(void* data, DType dtype, const Shape& s, Layout layout) {
  return layout == Layout::ncdhw ? contiguous_tensor(data, dtype, s) : channels_last_tensor(data, dtype, s);
}

inline TensorArg vec_arg(void* data, DType dtype, int64_t n) { return contiguous_tensor(data, dtype, {n}); }

// A training forward with affine fp32 parameters and saved statistics (what the binding passes).
inline ForwardArgs fwd_args(const Shape& s, DType dtype = DType::f16, Layout layout = Layout::ncdhw, int align = 256) {
  ForwardArgs a;
  a.x = make_tensor(fake_ptr(0, align), dtype, s, layout);
  a.y = make_tensor(fake_ptr(1), dtype, s, layout);
  a.weight = vec_arg(fake_ptr(2), DType::f32, s[1]);
  a.bias = vec_arg(fake_ptr(3), DType::f32, s[1]);
  a.save_mean = static_cast<float*>(fake_ptr(4));
  a.save_rstd = static_cast<float*>(fake_ptr(5));
  return a;
}

inline BackwardArgs bwd_args(const Shape& s, DType dtype = DType::f16, Layout layout = Layout::ncdhw, int align = 256) {
  BackwardArgs a;
  a.x = make_tensor(fake_ptr(0, align), dtype, s, layout);
  a.dy = make_tensor(fake_ptr(1), dtype, s, layout);
  a.dx = make_tensor(fake_ptr(2), dtype, s, layout);
  a.weight = vec_arg(fake_ptr(3), DType::f32, s[1]);
  a.bias = vec_arg(fake_ptr(4), DType::f32, s[1]);
  a.save_mean = static_cast<const float*>(fake_ptr(5));
  a.save_rstd = static_cast<const float*>(fake_ptr(6));
  a.dweight = static_cast<float*>(fake_ptr(7));
  a.dbias = static_cast<float*>(fake_ptr(8));
  return a;
}

}  // namespace normjit
