// The autotuner's choices as disk-cache records, so that the next process skips the search.
//
// A record is one disk-cache entry (compile/disk_cache.h: atomic publish, verified load). Its key
// is text naming everything that may change which launch is fastest: the record format, normjit's
// version, a hash of the kernel templates, the NVRTC version, the GPU (DeviceProfile: name, arch,
// SMs, L2; not the ordinal, so one record serves every GPU of a kind), the policy and split mode,
// and every field of the FusionKey and ShapeKey. The payload is the chosen launch as text lines
// (every KernelConfig field, chunks, chunk_vectors, grid, cooperative) plus the measured times,
// for people.
//
// A loaded record is trusted only as a pointer into the current candidate list: decode_choice
// returns the candidate it names, or nothing. A stale record (heuristics changed), a foreign or
// damaged one can therefore never yield a launch that the heuristics would not build.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "runtime/keys.h"
#include "schedule/device_profile.h"
#include "schedule/heuristics.h"

namespace normjit::compile {
class DiskCache;
}

namespace normjit::autotune {

// What a search measured, stored beside the choice (informational).
struct Timing {
  double chosen_us = 0;   // the chosen launch
  double default_us = 0;  // choose_launch's
  int candidates = 0;
};

std::string record_key(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev, Policy policy);
// Whether a disk-cache key is an autotune record's (the CLI lists them apart from kernels).
bool is_record_key(const std::string& key);

std::vector<char> encode_choice(const Launch& chosen, const Timing& t);
// The candidate the payload names, or nullopt when it names none of them or cannot be parsed.
std::optional<Launch> decode_choice(const std::vector<char>& payload, const std::vector<Launch>& candidates);
// One line for `normjit cache show`, e.g. "threads=512 ... chunks 43 grid 258 (221.3 us; default 250.1 us)".
std::string describe_payload(const std::vector<char>& payload);

// Through a disk cache; a null or disabled cache stores nothing and finds nothing.
std::optional<Launch> load_choice(compile::DiskCache* disk, const std::string& key,
                                  const std::vector<Launch>& candidates);
bool store_choice(compile::DiskCache* disk, const std::string& key, const Launch& chosen, const Timing& t);

}  // namespace normjit::autotune
