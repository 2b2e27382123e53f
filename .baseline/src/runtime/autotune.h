// Opt-in autotuning (like cudnn.benchmark): NORMJIT_AUTOTUNE=1 or set_autotune(true).
//
// On the L1 miss of a call (the first call of a (fusion, shape) class in the process), instead of
// taking choose_launch's launch as is, the runtime asks choose() here:
//   1. candidate_launches (heuristics) lists the default and a few valid alternatives;
//   2. a record of an earlier search in the disk cache (autotune_record.h) that names one of the
//      current candidates is used as is: no search (counted as autotune_records_loaded);
//   3. else every candidate is compiled (through L2/L3 as usual), launched once to warm up, then
//      timed with CUDA events on the call's own stream and buffers: a few interleaved rounds of a
//      few launches each, the best round per candidate. The fastest wins; the default keeps its
//      place unless another candidate beats it by more than 3% (noise). The choice is stored in
//      the disk cache (counted as autotune_searches).
// The L1 plan then remembers the choice, so later calls cost nothing extra.
//
// Safety. The timing launches write the call's outputs, which the real launch then overwrites.
// The real running_mean/running_var, which a training forward updates in place, are never touched
// by the timing launches: those go to a scratch buffer, so the real state is updated exactly once,
// by the real launch. A call whose outputs overlap its inputs (in place) would not be repeatable:
// it is not timed (the default is used for its shape class in this process). During CUDA-graph
// capture nothing is timed, synchronised, allocated or compiled: a stored record is used if its
// kernel is loaded already, else the default (not remembered, so the first call outside capture
// tunes). A search that fails (e.g. no memory for the scratch buffer) warns and keeps the default.
// The search synchronises the stream: acceptable for an opt-in, first-call cost.
#pragma once

#include <functional>

#include "kernels/params.h"
#include "runtime/keys.h"
#include "schedule/device_profile.h"
#include "schedule/heuristics.h"

namespace normjit::autotune {

// NORMJIT_AUTOTUNE (1/true/on) gives the initial value; set_enabled overrides it.
bool enabled();
void set_enabled(bool on);

// Enqueues one launch of `l` on the call's stream with `params` (the caller fills in the
// decomposition and workspace). Compiles or loads the kernel on first use; throws normjit::Error
// when the launch cannot run on this device.
using LaunchFn = std::function<void(const Launch& l, NjParams& params)>;

struct Choice {
  Launch launch;
  bool remember = true;  // false: the L1 plan cache must not keep it (CUDA-graph capture)
};

// The launch for an L1 miss with autotune enabled. `params` are the real call's (read only: the
// timing launches use a copy); `stream` is the call's stream, on which the device's context is
// current.
Choice choose(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev, Policy policy, const NjParams& params,
              void* stream, const LaunchFn& launch);

// Whether a buffer the kernel writes overlaps one it reads (an in-place call), from the pointers,
// sizes and strides in `p`. Running statistics count as read only in eval (the timing launches
// of a training forward redirect them).
bool writes_overlap_reads(const FusionKey& f, const NjParams& p);

}  // namespace normjit::autotune
