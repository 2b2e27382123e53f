// Autotune records in the disk cache: key text, payload text, and matching a payload against the
// current candidates. See autotune_record.h.
#include "runtime/autotune_record.h"

#include <charconv>
#include <cstdio>
#include <map>
#include <sstream>

#include "codegen/embedded_kernels.h"
#include "compile/disk_cache.h"
#include "compile/hash.h"
#include "driver/nvrtc.h"

#ifndef NORMJIT_VERSION
#error "NORMJIT_VERSION must be defined by the build: it is part of every autotune record key"
#endif

namespace normjit::autotune {
namespace {

// Bumped whenever the key or payload format changes: old records then simply miss.
constexpr int kRecordFormat = 2;  // (its fields: see encode_choice)
constexpr const char* kKeyPrefix = "autotune ";

// A hash of every kernel template: a template change can change which launch is fastest, even
// when normjit's version string stays the same (development builds).
const std::string& kernels_hash() {
  static const std::string h = [] {
    std::string all;
    for (const codegen::EmbeddedFile& e : codegen::embedded_kernel_files()) all += std::string(e.name) + '\n' + e.text;
    return compile::hash128(all).hex();
  }();
  return h;
}

std::string nvrtc_version() {
  const driver::Nvrtc* lib = driver::try_nvrtc(nullptr);
  return lib ? std::to_string(lib->major) + "." + std::to_string(lib->minor) : "none";
}

std::string hex(const void* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char b = static_cast<const unsigned char*>(p)[i];
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

// "field value" lines -> map; later duplicates win (they never occur in what we write).
std::map<std::string, std::string> parse_lines(const std::vector<char>& payload) {
  std::map<std::string, std::string> out;
  std::istringstream in(std::string(payload.begin(), payload.end()));
  std::string line;
  while (std::getline(in, line)) {
    const size_t space = line.find(' ');
    if (space == std::string::npos) continue;
    out[line.substr(0, space)] = line.substr(space + 1);
  }
  return out;
}

bool parse_int(const std::map<std::string, std::string>& m, const char* field, int64_t lo, int64_t hi, int64_t* v) {
  auto it = m.find(field);
  if (it == m.end()) return false;
  const std::string& s = it->second;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), *v);
  return r.ec == std::errc() && r.ptr == s.data() + s.size() && *v >= lo && *v <= hi;
}

}  // namespace

std::string record_key(const FusionKey& f, const ShapeKey& s, const DeviceProfile& dev, Policy policy) {
  std::ostringstream k;
  // First line: what `normjit cache show` prints for the entry.
  k << kKeyPrefix << describe(f) << " N=" << s.N << " C=" << s.C << " spatial=" << s.spatial << " on " << dev.name
    << " (sm_" << dev.arch << ")\n";
  k << "format " << kRecordFormat << "\n";
  k << "normjit " << NORMJIT_VERSION << "\n";
  k << "kernels " << kernels_hash() << "\n";
  k << "nvrtc " << nvrtc_version() << "\n";
  k << "device " << dev.name << " sm_" << dev.arch << " sms " << dev.sms << " threads/sm " << dev.max_threads_per_sm
    << " regs/sm " << dev.regs_per_sm << " l2 " << dev.l2_bytes << "\n";
  k << "policy " << policy_name(policy) << " split " << (split_mode() == SplitMode::l2 ? "l2" : "registers") << "\n";
  k << "fusion " << hex(&f, sizeof f) << "\n";
  k << "shape N " << s.N << " C " << s.C << " spatial " << s.spatial << " strides " << s.stride_n << " " << s.stride_c
    << " " << s.stride_s << " align " << s.align_bytes << "\n";
  return k.str();
}

bool is_record_key(const std::string& key) { return key.rfind(kKeyPrefix, 0) == 0; }

std::vector<char> encode_choice(const Launch& l, const Timing& t) {
  const KernelConfig& c = l.config;
  char buf[512];
  const int n =
      std::snprintf(buf, sizeof buf,
                    "threads %d\ngroup %d\nitems %d\nvec %d\nmin_blocks %d\ncached %d\nindex64 %d\n"
                    "stages %d\nresident %d\nflat %d\ncluster %d\nchunks %d\nchunk_vectors %lld\ngrid %lld\ncooperative %d\n"
                    "tier %s\nchosen_us %.2f\ndefault_us %.2f\ncandidates %d\n",
                    c.threads, c.group, c.items, c.vec, c.min_blocks, int(c.cached), int(c.index64), int(c.stages),
                    int(c.resident), int(c.flat), int(c.cluster), l.chunks, static_cast<long long>(l.chunk_vectors), static_cast<long long>(l.grid),
                    int(l.cooperative), l.tier, t.chosen_us, t.default_us, t.candidates);
  return std::vector<char>(buf, buf + std::min<size_t>(size_t(std::max(n, 0)), sizeof buf - 1));
}

std::optional<Launch> decode_choice(const std::vector<char>& payload, const std::vector<Launch>& candidates) {
  const auto m = parse_lines(payload);
  int64_t threads, group, items, vec, min_blocks, cached, index64, stages, resident, flat, cluster, chunks,
      chunk_vectors, grid, cooperative;
  constexpr int64_t kInt = 0x7fffffff;
  if (!parse_int(m, "threads", 1, 1024, &threads) || !parse_int(m, "group", 0, 1024, &group) ||
      !parse_int(m, "items", 1, 255, &items) || !parse_int(m, "vec", 1, 255, &vec) ||
      !parse_int(m, "min_blocks", 1, 255, &min_blocks) || !parse_int(m, "cached", 0, 1, &cached) ||
      !parse_int(m, "index64", 0, 1, &index64) || !parse_int(m, "stages", 0, 255, &stages) ||
      !parse_int(m, "resident", 0, 1, &resident) || !parse_int(m, "flat", 0, 1, &flat) ||
      !parse_int(m, "cluster", 0, 1, &cluster) ||
      !parse_int(m, "chunks", 1, kInt, &chunks) || !parse_int(m, "chunk_vectors", 1, kInt, &chunk_vectors) ||
      !parse_int(m, "grid", 1, kInt, &grid) || !parse_int(m, "cooperative", 0, 1, &cooperative))
    return std::nullopt;
  Launch want;
  want.config = make_config(int(threads), int(group), int(items), int(vec), int(min_blocks), cached != 0, index64 != 0,
                            int(stages), resident != 0, flat != 0, cluster != 0);
  want.chunks = int(chunks);
  want.chunk_vectors = chunk_vectors;
  want.grid = grid;
  want.cooperative = cooperative != 0;
  // (A KernelConfig field missing here would make every record miss: safe, but searched again.)
  for (const Launch& c : candidates)
    if (same_launch(c, want)) return c;  // the current candidate, with its own workspace sizes
  return std::nullopt;
}

std::string describe_payload(const std::vector<char>& payload) {
  const auto m = parse_lines(payload);
  auto get = [&](const char* f) {
    auto it = m.find(f);
    return it == m.end() ? std::string("?") : it->second;
  };
  std::ostringstream o;
  o << "'" << get("tier") << "' threads " << get("threads") << " items " << get("items") << " vec " << get("vec");
  if (get("stages") != "0") o << (get("resident") == "1" ? " resident slots " : " stages ") << get("stages");
  if (get("flat") == "1") o << " flat";
  o << " chunks " << get("chunks") << " grid " << get("grid") << ": " << get("chosen_us") << " us (default "
    << get("default_us") << " us, " << get("candidates") << " candidates)";
  return o.str();
}

std::optional<Launch> load_choice(compile::DiskCache* disk, const std::string& key,
                                  const std::vector<Launch>& candidates) {
  if (!disk || !disk->enabled()) return std::nullopt;
  const auto payload = disk->load(key);
  if (!payload) return std::nullopt;
  return decode_choice(*payload, candidates);
}

bool store_choice(compile::DiskCache* disk, const std::string& key, const Launch& chosen, const Timing& t) {
  if (!disk || !disk->enabled()) return false;
  return disk->store(key, encode_choice(chosen, t));
}

}  // namespace normjit::autotune
