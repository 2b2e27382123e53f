// Shared by the GPU tests (tests/cpp/test_gpu_*.cpp): the GPU check and skip macro, host tensors
// in the device dtypes, device buffers, and the double-precision forward/backward reference check.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <ostream>
#include <random>
#include <vector>

#include "driver/cuda_driver.h"
#include "normjit/normjit.h"
#include "runtime/device.h"

namespace normjit_test {

using normjit::DType;

inline bool have_gpu() {
  static const bool ok = [] {
    if (!normjit::availability().available) return false;
    // The tests allocate with the driver API before any normjit call: make the primary context
    // (the one normjit and PyTorch use) current on this thread first.
    normjit::make_current(normjit::device_state(0));
    return true;
  }();
  return ok;
}
#define REQUIRE_GPU()                                                                           \
  if (!normjit_test::have_gpu()) GTEST_SKIP() << "no CUDA GPU: skipped (" << normjit::availability().reason << ")"

// ------------------------------------------------------------------ host-side dtype conversions
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN stays NaN
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float bf16_to_f32(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// A host tensor stored in the device dtype, with float views.
struct HostTensor {
  DType dtype;
  std::vector<unsigned char> bytes;
  size_t n = 0;
  HostTensor(DType d, size_t count) : dtype(d), bytes(count * normjit::dtype_size(d)), n(count) {}
  float get(size_t i) const {
    if (dtype == DType::f32) return reinterpret_cast<const float*>(bytes.data())[i];
    if (dtype == DType::f16) return float(reinterpret_cast<const _Float16*>(bytes.data())[i]);
    return bf16_to_f32(reinterpret_cast<const uint16_t*>(bytes.data())[i]);
  }
  void set(size_t i, float v) {
    if (dtype == DType::f32) reinterpret_cast<float*>(bytes.data())[i] = v;
    else if (dtype == DType::f16) reinterpret_cast<_Float16*>(bytes.data())[i] = _Float16(v);
    else reinterpret_cast<uint16_t*>(bytes.data())[i] = f32_to_bf16(v);
  }
};

struct DeviceBuffer {
  CUdeviceptr ptr = 0;
  size_t size = 0;
  explicit DeviceBuffer(size_t bytes) : size(bytes) {
    const auto& cu = normjit::driver::cuda_driver();
    normjit::driver::check_cuda(cu.cuMemAlloc(&ptr, bytes ? bytes : 16), "cuMemAlloc");
    normjit::driver::check_cuda(cu.cuMemsetD8(ptr, 0xff, bytes ? bytes : 16), "cuMemsetD8");  // poison
  }
  ~DeviceBuffer() { normjit::driver::cuda_driver().cuMemFree(ptr); }
  void* get() const { return reinterpret_cast<void*>(ptr); }
  void upload(const void* src) {
    normjit::driver::check_cuda(normjit::driver::cuda_driver().cuMemcpyHtoD(ptr, src, size), "cuMemcpyHtoD");
  }
  void download(void* dst) const {
    normjit::driver::check_cuda(normjit::driver::cuda_driver().cuMemcpyDtoH(dst, ptr, size), "cuMemcpyDtoH");
  }
};

// ------------------------------------------------------------------ double-precision reference
struct Case {
  std::vector<int64_t> shape;  // N, C, spatial...
  DType dtype = DType::f32;
  bool channels_last = false;
  bool affine = true;
  normjit::Activation act = normjit::Activation::identity;
  bool residual = false;
  float offset = 0.f;  // added to x: mean >> std
};

// gtest prints a parameter with this instead of its bytes.
inline void PrintTo(const Case& c, std::ostream* os) {
  for (size_t i = 0; i < c.shape.size(); ++i) *os << (i ? "x" : "") << c.shape[i];
  *os << " " << normjit::dtype_name(c.dtype) << (c.channels_last ? " ndhwc" : " ncdhw");
}

struct Layout {
  int64_t N, C, S;
  bool cl;
  int64_t at(int64_t n, int64_t c, int64_t s) const { return cl ? (n * S + s) * C + c : (n * C + c) * S + s; }
};

inline double act_ref(normjit::Activation a, double z, double slope) {
  using A = normjit::Activation;
  switch (a) {
    case A::identity: return z;
    case A::relu: return z > 0 ? z : 0;
    case A::leaky_relu: return z >= 0 ? z : z * slope;
    case A::gelu_erf: return 0.5 * z * (1 + std::erf(z / std::sqrt(2.0)));
    case A::gelu_tanh: return 0.5 * z * (1 + std::tanh(0.7978845608028654 * (z + 0.044715 * z * z * z)));
    case A::silu: return z / (1 + std::exp(-z));
    case A::sigmoid: return 1 / (1 + std::exp(-z));
    case A::tanh: return std::tanh(z);
  }
  return z;
}
inline double act_grad_ref(normjit::Activation a, double z, double slope) {
  const double h = 1e-6 * std::max(1.0, std::fabs(z));
  if (a == normjit::Activation::relu) return z > 0 ? 1 : 0;
  if (a == normjit::Activation::leaky_relu) return z > 0 ? 1 : slope;
  return (act_ref(a, z + h, slope) - act_ref(a, z - h, slope)) / (2 * h);
}

inline normjit::TensorArg arg(const DeviceBuffer& b, DType d, const Case& c) {
  return c.channels_last ? normjit::channels_last_tensor(b.get(), d, c.shape)
                         : normjit::contiguous_tensor(b.get(), d, c.shape);
}

inline double tolerance(DType d) { return d == DType::f32 ? 2e-4 : d == DType::f16 ? 1.5e-2 : 8e-2; }

// Runs forward and backward on the GPU and checks y, mean/rstd, dx, dweight, dbias (and the
// residual's gradient) against double precision. Returns the bytes of dx (then of dweight and
// dbias, where affine), for determinism checks.
inline std::vector<unsigned char> check_case(const Case& c, uint32_t seed = 1) {
  Layout L{c.shape[0], c.shape[1], 1, c.channels_last};
  for (size_t d = 2; d < c.shape.size(); ++d) L.S *= c.shape[d];
  const size_t total = size_t(L.N * L.C * L.S);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  HostTensor x(c.dtype, total), dy(c.dtype, total), res(c.dtype, total);
  // Each channel its own mean and scale, so that statistics landing on the wrong channel (the
  // channels-last kernels map lanes and slots to channels) fail the per-channel checks.
  for (int64_t n = 0; n < L.N; ++n)
    for (int64_t ch = 0; ch < L.C; ++ch)
      for (int64_t s = 0; s < L.S; ++s)
        x.set(size_t(L.at(n, ch, s)), c.offset + normal(rng) * (1.5f + 0.25f * float(ch % 5)) + 0.5f + 0.1f * float(ch % 11));
  for (size_t i = 0; i < total; ++i) {
    dy.set(i, normal(rng));
    res.set(i, normal(rng));
  }
  std::vector<float> w(L.C), b(L.C);
  for (int64_t i = 0; i < L.C; ++i) w[i] = 1.f + 0.3f * normal(rng), b[i] = 0.2f * normal(rng);

  const size_t bytes = total * normjit::dtype_size(c.dtype);
  DeviceBuffer dx_buf(bytes), dy_buf(bytes), x_buf(bytes), y_buf(bytes), res_buf(bytes), dres_buf(bytes);
  DeviceBuffer w_buf(L.C * 4), b_buf(L.C * 4), mean_buf(L.N * L.C * 4), rstd_buf(L.N * L.C * 4);
  DeviceBuffer dw_buf(L.C * 4), db_buf(L.C * 4);
  x_buf.upload(x.bytes.data());
  dy_buf.upload(dy.bytes.data());
  res_buf.upload(res.bytes.data());
  w_buf.upload(w.data());
  b_buf.upload(b.data());

  normjit::ForwardArgs fa;
  fa.x = arg(x_buf, c.dtype, c);
  fa.y = arg(y_buf, c.dtype, c);
  if (c.affine) {
    fa.weight = normjit::contiguous_tensor(w_buf.get(), DType::f32, {L.C});
    fa.bias = normjit::contiguous_tensor(b_buf.get(), DType::f32, {L.C});
  }
  if (c.residual) fa.residual = arg(res_buf, c.dtype, c);
  fa.save_mean = static_cast<float*>(mean_buf.get());
  fa.save_rstd = static_cast<float*>(rstd_buf.get());
  fa.activation = c.act;
  normjit::instance_norm_forward(fa);

  normjit::BackwardArgs ba;
  ba.x = fa.x;
  ba.dy = arg(dy_buf, c.dtype, c);
  ba.dx = arg(dx_buf, c.dtype, c);
  ba.weight = fa.weight;
  ba.bias = fa.bias;
  ba.residual = fa.residual;
  if (c.residual) ba.dresidual = arg(dres_buf, c.dtype, c);
  ba.save_mean = fa.save_mean;
  ba.save_rstd = fa.save_rstd;
  if (c.affine) ba.dweight = static_cast<float*>(dw_buf.get()), ba.dbias = static_cast<float*>(db_buf.get());
  ba.activation = c.act;
  normjit::instance_norm_backward(ba);

  HostTensor y(c.dtype, total), dx(c.dtype, total), dres(c.dtype, total);
  y_buf.download(y.bytes.data());
  dx_buf.download(dx.bytes.data());
  if (c.residual) dres_buf.download(dres.bytes.data());
  std::vector<float> mean(L.N * L.C), rstd(L.N * L.C), dw(L.C), db(L.C);
  mean_buf.download(mean.data());
  rstd_buf.download(rstd.data());
  if (c.affine) dw_buf.download(dw.data()), db_buf.download(db.data());

  const double tol = tolerance(c.dtype);
  std::vector<double> dw_ref(L.C, 0), db_ref(L.C, 0);
  double max_err_y = 0, max_err_dx = 0;
  for (int64_t n = 0; n < L.N; ++n)
    for (int64_t ch = 0; ch < L.C; ++ch) {
      double m = 0;
      for (int64_t s = 0; s < L.S; ++s) m += x.get(L.at(n, ch, s));
      m /= double(L.S);
      double v = 0;
      for (int64_t s = 0; s < L.S; ++s) v += std::pow(x.get(L.at(n, ch, s)) - m, 2);
      v /= double(L.S);
      const double rs = 1 / std::sqrt(v + 1e-5);
      const double wc = c.affine ? w[ch] : 1, bc = c.affine ? b[ch] : 0;
      EXPECT_NEAR(mean[n * L.C + ch], m, 1e-5 * std::max(1.0, std::fabs(m)) + 1e-5) << "mean n=" << n << " c=" << ch;
      EXPECT_NEAR(rstd[n * L.C + ch], rs, 1e-3 * rs) << "rstd n=" << n << " c=" << ch;
      double sg = 0, sgx = 0;
      std::vector<double> g(L.S), xh(L.S);
      for (int64_t s = 0; s < L.S; ++s) {
        const int64_t i = L.at(n, ch, s);
        xh[s] = (x.get(i) - m) * rs;
        const double z = xh[s] * wc + bc + (c.residual ? res.get(i) : 0);
        max_err_y = std::max(max_err_y, std::fabs(y.get(i) - act_ref(c.act, z, 0.01)));
        g[s] = dy.get(i) * act_grad_ref(c.act, z, 0.01);
        sg += g[s], sgx += g[s] * xh[s];
        if (c.residual) EXPECT_NEAR(dres.get(i), g[s], tol * (1 + std::fabs(g[s])));
      }
      for (int64_t s = 0; s < L.S; ++s) {
        const double ref = rs * wc * (g[s] - sg / L.S - xh[s] * sgx / L.S);
        max_err_dx = std::max(max_err_dx, std::fabs(dx.get(L.at(n, ch, s)) - ref) / (rs * std::fabs(wc) + 1e-3));
      }
      dw_ref[ch] += sgx, db_ref[ch] += sg;
    }
  EXPECT_LT(max_err_y, tol * 4) << "forward output";
  EXPECT_LT(max_err_dx, tol * 4) << "dx";
  if (c.affine)
    for (int64_t ch = 0; ch < L.C; ++ch) {
      EXPECT_NEAR(dw[ch], dw_ref[ch], tol * (std::sqrt(double(L.N * L.S)) + std::fabs(dw_ref[ch]))) << "dweight " << ch;
      EXPECT_NEAR(db[ch], db_ref[ch], tol * (std::sqrt(double(L.N * L.S)) + std::fabs(db_ref[ch]))) << "dbias " << ch;
    }
  std::vector<unsigned char> out = dx.bytes;
  if (c.affine) {
    const auto* w_bytes = reinterpret_cast<const unsigned char*>(dw.data());
    const auto* b_bytes = reinterpret_cast<const unsigned char*>(db.data());
    out.insert(out.end(), w_bytes, w_bytes + dw.size() * sizeof(float));
    out.insert(out.end(), b_bytes, b_bytes + db.size() * sizeof(float));
  }
  return out;
}

}  // namespace normjit_test
