// Argument validation and key building of the per-call path, shared by the runtime
// (instance_norm.cpp) and by `normjit explain` / warm-up, so that a prediction is built by the
// very code that the runtime runs.
#pragma once

#include "normjit/normjit.h"
#include "runtime/keys.h"

namespace normjit {

struct Geometry {
  Layout layout;
  int64_t N, C, spatial, stride_n, stride_c, stride_s;
};

struct CallKeys {
  bool empty = true;  // zero-size input: nothing is compiled or launched
  FusionKey fusion;
  ShapeKey shape;
  Geometry geometry;
};

// Validate (throwing normjit::Error) and build the keys. Pointers are only read for alignment.
CallKeys forward_keys(const ForwardArgs& a);
CallKeys backward_keys(const BackwardArgs& a);

}  // namespace normjit
