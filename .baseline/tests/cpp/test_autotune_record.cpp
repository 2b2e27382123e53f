// Autotune records and safety checks, offline: a choice survives a round trip through a DiskCache
// in a temporary directory and comes back as the current candidate; stale, foreign and damaged
// records are ignored (never an invalid launch); keys name every field that selects a launch but
// not the device ordinal; in-place calls are recognised; the public switch works.
#include <gtest/gtest.h>

#include "test_helpers.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "compile/disk_cache.h"
#include "normjit/normjit.h"
#include "runtime/autotune.h"
#include "runtime/autotune_record.h"
#include "runtime/keys.h"
#include "schedule/device_profile.h"
#include "schedule/heuristics.h"

namespace fs = std::filesystem;
using namespace normjit;

namespace {

using normjit_test::TempDir;

ShapeKey ncdhw_shape(int64_t N, int64_t C, int64_t spatial, int device = 0) {
  ShapeKey s = zeroed<ShapeKey>();
  s.N = N, s.C = C, s.spatial = spatial;
  s.stride_s = 1, s.stride_c = spatial, s.stride_n = spatial * C;
  s.device = device;
  s.align_bytes = 16;
  return s;
}

FusionKey train_fwd() {
  return make_fusion(Direction::forward, DType::f16, DType::f32, Layout::ncdhw, true, true, false, true, true,
                     Activation::identity);
}

std::vector<char> bytes(const std::string& s) { return std::vector<char>(s.begin(), s.end()); }

// The nnU-Net stage-0 shape: several candidates.
struct Fixture {
  FusionKey f = train_fwd();
  ShapeKey s = ncdhw_shape(2, 32, 128 * 128 * 128);
  DeviceProfile dev = builtin_profile("H200");
  std::vector<Launch> candidates = candidate_launches(f, s, dev, Policy::bounded);
  std::string key = autotune::record_key(f, s, dev, Policy::bounded);
};

}  // namespace

TEST(AutotuneRecord, RoundTripThroughDiskCache) {
  Fixture x;
  ASSERT_GE(x.candidates.size(), 3u);
  TempDir dir;
  compile::DiskCache disk(dir.path());
  ASSERT_TRUE(disk.enabled());
  EXPECT_FALSE(autotune::load_choice(&disk, x.key, x.candidates)) << "nothing stored yet";

  const Launch& chosen = x.candidates[2];
  autotune::Timing t{180.5, 221.25, int(x.candidates.size())};
  ASSERT_TRUE(autotune::store_choice(&disk, x.key, chosen, t));

  // A second cache object on the same directory: what the next process sees.
  compile::DiskCache other(dir.path());
  const auto loaded = autotune::load_choice(&other, x.key, x.candidates);
  ASSERT_TRUE(loaded);
  EXPECT_TRUE(same_launch(*loaded, chosen));
  EXPECT_EQ(loaded->counters, chosen.counters);
  EXPECT_EQ(loaded->partials, chosen.partials);
  EXPECT_EQ(loaded->scratch, chosen.scratch);
  EXPECT_STREQ(loaded->tier, chosen.tier);

  // The entry is listed, valid, recognisable as a record and readable.
  const auto entries = other.list();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_TRUE(entries[0].valid);
  EXPECT_TRUE(autotune::is_record_key(entries[0].key));
  const auto payload = other.load(x.key);
  ASSERT_TRUE(payload);
  const std::string text = autotune::describe_payload(*payload);
  EXPECT_NE(text.find(chosen.tier), std::string::npos) << text;
  EXPECT_NE(text.find("180.50 us"), std::string::npos) << text;
  EXPECT_NE(text.find("default 221.25 us"), std::string::npos) << text;

  // A disabled cache stores and finds nothing.
  compile::DiskCache off("");
  EXPECT_FALSE(autotune::store_choice(&off, x.key, chosen, t));
  EXPECT_FALSE(autotune::load_choice(&off, x.key, x.candidates));
  EXPECT_FALSE(autotune::load_choice(nullptr, x.key, x.candidates));
}

// A flat channels-last choice (C = 30: lanes at run time, group 0) survives the round trip too.
TEST(AutotuneRecord, FlatChannelsLastChoiceRoundTrips) {
  const FusionKey f = make_fusion(Direction::forward, DType::f16, DType::f32, Layout::ndhwc, true, true, false, false,
                                  true, Activation::identity);
  ShapeKey s = zeroed<ShapeKey>();
  s.N = 2, s.C = 30, s.spatial = 32 * 32 * 32;  // the streamed default and a register-held split
  s.stride_c = 1, s.stride_s = 30, s.stride_n = 30 * s.spatial;
  s.align_bytes = 16;
  const DeviceProfile dev = builtin_profile("H200");
  const std::vector<Launch> candidates = candidate_launches(f, s, dev, Policy::bounded);
  ASSERT_GE(candidates.size(), 2u);
  const Launch& chosen = candidates.back();
  ASSERT_TRUE(chosen.config.flat);
  TempDir dir;
  compile::DiskCache disk(dir.path());
  const std::string key = autotune::record_key(f, s, dev, Policy::bounded);
  ASSERT_TRUE(autotune::store_choice(&disk, key, chosen, autotune::Timing{260.0, 270.0, int(candidates.size())}));
  const auto loaded = autotune::load_choice(&disk, key, candidates);
  ASSERT_TRUE(loaded);
  EXPECT_TRUE(same_launch(*loaded, chosen));
  EXPECT_NE(autotune::describe_payload(*disk.load(key)).find(" flat"), std::string::npos);
}

TEST(AutotuneRecord, StaleOrForeignChoiceIsIgnored) {
  Fixture x;
  // A launch the current heuristics do not offer (they changed since the record was written).
  Launch stale = x.candidates[0];
  stale.chunks += 1;
  EXPECT_FALSE(autotune::decode_choice(autotune::encode_choice(stale, {}), x.candidates));
  stale = x.candidates[0];
  stale.config.items = 2;
  EXPECT_FALSE(autotune::decode_choice(autotune::encode_choice(stale, {}), x.candidates));
  // Another shape's choice under this shape's key.
  const std::vector<Launch> small = candidate_launches(x.f, ncdhw_shape(2, 320, 64), x.dev, Policy::bounded);
  for (const Launch& l : small) EXPECT_FALSE(autotune::decode_choice(autotune::encode_choice(l, {}), x.candidates));
  // Each current candidate decodes to itself.
  for (const Launch& l : x.candidates) {
    const auto d = autotune::decode_choice(autotune::encode_choice(l, {}), x.candidates);
    ASSERT_TRUE(d);
    EXPECT_TRUE(same_launch(*d, l));
  }

  // Stored under the key, a stale record is a miss that the next search overwrites.
  TempDir dir;
  compile::DiskCache disk(dir.path());
  ASSERT_TRUE(autotune::store_choice(&disk, x.key, stale, {}));
  EXPECT_FALSE(autotune::load_choice(&disk, x.key, x.candidates));
  ASSERT_TRUE(autotune::store_choice(&disk, x.key, x.candidates[1], {}));
  const auto now = autotune::load_choice(&disk, x.key, x.candidates);
  ASSERT_TRUE(now);
  EXPECT_TRUE(same_launch(*now, x.candidates[1]));
}

TEST(AutotuneRecord, DamagedPayloadsAreIgnored) {
  Fixture x;
  const std::string good(autotune::encode_choice(x.candidates[1], {}).data(),
                         autotune::encode_choice(x.candidates[1], {}).size());
  ASSERT_TRUE(autotune::decode_choice(bytes(good), x.candidates));
  const std::vector<std::string> bad = {
      "",
      "garbage",
      std::string(300, '\0'),
      good.substr(0, good.size() / 2),                                      // truncated: fields missing
      good.substr(0, good.find("grid")),                                    // no grid
      "threads 512x\n" + good.substr(good.find('\n') + 1),                  // not a number
      "threads -512\n" + good.substr(good.find('\n') + 1),                  // out of range
      "threads 99999999999999999999\n" + good.substr(good.find('\n') + 1),  // overflows
  };
  for (const std::string& b : bad) EXPECT_FALSE(autotune::decode_choice(bytes(b), x.candidates)) << "payload: " << b;

  // A damaged file under the key: the disk cache's checksum rejects (and deletes) it.
  TempDir dir;
  compile::DiskCache disk(dir.path());
  ASSERT_TRUE(autotune::store_choice(&disk, x.key, x.candidates[1], {}));
  const auto entries = disk.list();
  ASSERT_EQ(entries.size(), 1u);
  const std::string path = dir.path() + "/" + entries[0].file;
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('#');
  }
  EXPECT_FALSE(autotune::load_choice(&disk, x.key, x.candidates));
  EXPECT_FALSE(fs::exists(path));
}

TEST(AutotuneRecord, KeyNamesEverythingButTheOrdinal) {
  Fixture x;
  const std::string& k = x.key;
  EXPECT_TRUE(autotune::is_record_key(k));
  EXPECT_EQ(k.rfind("autotune ", 0), 0u);
  EXPECT_NE(k.find("H200"), std::string::npos);
  EXPECT_NE(k.find("sm_90"), std::string::npos);
  EXPECT_NE(k.find("normjit " + version()), std::string::npos);
  // The ordinal is not part of it: one record serves every GPU of a kind.
  ShapeKey other_gpu = x.s;
  other_gpu.device = 3;
  EXPECT_EQ(autotune::record_key(x.f, other_gpu, x.dev, Policy::bounded), k);
  // Every other field is.
  auto differs = [&](ShapeKey s) { return autotune::record_key(x.f, s, x.dev, Policy::bounded) != k; };
  ShapeKey s = x.s;
  s.N = 3;
  EXPECT_TRUE(differs(s));
  s = x.s, s.C = 31;
  EXPECT_TRUE(differs(s));
  s = x.s, s.spatial -= 8;
  EXPECT_TRUE(differs(s));
  s = x.s, s.stride_n += 8;
  EXPECT_TRUE(differs(s));
  s = x.s, s.stride_c += 8;
  EXPECT_TRUE(differs(s));
  s = x.s, s.align_bytes = 8;
  EXPECT_TRUE(differs(s));
  FusionKey g = x.f;
  g.activation = Activation::silu;
  EXPECT_NE(autotune::record_key(g, x.s, x.dev, Policy::bounded), k);
  EXPECT_NE(autotune::record_key(x.f, x.s, builtin_profile("H100"), Policy::bounded), k);
  EXPECT_NE(autotune::record_key(x.f, x.s, x.dev, Policy::exact), k);
  // A kernel's key is not a record's.
  EXPECT_FALSE(autotune::is_record_key("normjit 0.1.0\nnvrtc 13.0\narch sm_90\n"));
}

TEST(AutotuneSafety, InPlaceCallsAreRecognised) {
  const FusionKey f = train_fwd();
  NjParams p;
  std::memset(&p, 0, sizeof p);
  p.N = 2, p.C = 4, p.spatial = 1000, p.stride_n = 4000, p.stride_c = 1000, p.stride_s = 1;
  auto at = [](uintptr_t a) { return reinterpret_cast<void*>(a); };
  const uintptr_t MB = 1 << 20;
  p.x = at(1 * MB);
  p.y = at(2 * MB);
  p.weight = at(3 * MB), p.bias = at(3 * MB + 256);
  p.save_mean = static_cast<float*>(at(4 * MB)), p.save_rstd = static_cast<float*>(at(4 * MB + 256));
  p.running_mean = static_cast<float*>(at(5 * MB)), p.running_var = static_cast<float*>(at(5 * MB + 256));
  EXPECT_FALSE(autotune::writes_overlap_reads(f, p));
  p.y = const_cast<void*>(p.x);  // y = x in place
  EXPECT_TRUE(autotune::writes_overlap_reads(f, p));
  p.y = at(1 * MB + 8000 * 2 - 2);  // y's first element is x's last (fp16): overlap
  EXPECT_TRUE(autotune::writes_overlap_reads(f, p));
  p.y = at(1 * MB + 8000 * 2);  // y starts right after x: none
  EXPECT_FALSE(autotune::writes_overlap_reads(f, p));
  p.save_mean = static_cast<float*>(const_cast<void*>(p.weight));  // saved stats over the weight
  EXPECT_TRUE(autotune::writes_overlap_reads(f, p));

  // Backward: dx over dy is in place; dweight next to (not over) save_mean is not.
  const FusionKey b = make_fusion(Direction::backward, DType::f16, DType::f32, Layout::ncdhw, true, true, false, false,
                                  false, Activation::identity);
  NjParams q = p;
  q.save_mean = static_cast<float*>(at(4 * MB));
  q.dy = at(6 * MB);
  q.y = at(7 * MB);
  q.dweight = static_cast<float*>(at(8 * MB)), q.dbias = static_cast<float*>(at(8 * MB + 16));
  EXPECT_FALSE(autotune::writes_overlap_reads(b, q));
  q.y = const_cast<void*>(q.dy);
  EXPECT_TRUE(autotune::writes_overlap_reads(b, q));
}

TEST(AutotuneSwitch, SetAndQuery) {
  const bool before = autotune_enabled();
  set_autotune(true);
  EXPECT_TRUE(autotune_enabled());
  set_autotune(false);
  EXPECT_FALSE(autotune_enabled());
  set_autotune(before);
}

#ifdef NORMJIT_CLI_PATH
using normjit_test::shell;

TEST(AutotuneRecord, CliShowsRecordsReadably) {
  Fixture x;
  TempDir dir;
  compile::DiskCache disk(dir.path());
  ASSERT_TRUE(autotune::store_choice(&disk, x.key, x.candidates[1], {123.4, 150.0, 4}));
  const std::string cli = std::string("NORMJIT_AUTOTUNE=1 ") + NORMJIT_CLI_PATH;
  std::string out;
  EXPECT_EQ(shell(cli + " cache show --dir " + dir.path(), &out), 0) << out;
  EXPECT_NE(out.find("autotune instance_norm fwd f16 ncdhw"), std::string::npos) << out;
  EXPECT_NE(out.find("N=2 C=32 spatial=2097152 on H200 (sm_90)"), std::string::npos) << out;
  EXPECT_NE(out.find(std::string("-> '") + x.candidates[1].tier + "'"), std::string::npos) << out;
  EXPECT_NE(out.find("123.40 us (default 150.00 us, 4 candidates)"), std::string::npos) << out;
  EXPECT_EQ(shell(cli + " stats --dir " + dir.path(), &out), 0) << out;
  EXPECT_NE(out.find("autotune choices  1 entries"), std::string::npos) << out;
  EXPECT_NE(out.find("autotune:          on; 0 searches, 0 records loaded"), std::string::npos) << out;
}
#endif
