// The disk cache (L3): round trips, every kind of damaged entry, unwritable directories, a full
// disk, processes racing on one key, maintenance calls and the directory chosen from the
// environment. Each test works in its own fresh directory under /tmp.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_helpers.h"

#include "compile/disk_cache.h"
#include "compile/hash.h"

namespace fs = std::filesystem;
using normjit::compile::DiskCache;
using normjit::compile::hash128;

namespace {

using normjit_test::TempDir;

std::vector<char> make_payload(size_t n, unsigned seed) {
  std::vector<char> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& c : v) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<char>(x >> 24);
  }
  return v;
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void write_file(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The one entry file of a cache that holds exactly one entry.
std::string only_entry(const DiskCache& cache) {
  const auto entries = cache.list();
  if (entries.size() != 1) return "";
  return cache.dir() + "/" + entries[0].file;
}

size_t count_occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

// Sets or unsets environment variables for one scope, restoring the previous values afterwards.
class ScopedEnv {
 public:
  ~ScopedEnv() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second)
        setenv(it->first.c_str(), it->second->c_str(), 1);
      else
        unsetenv(it->first.c_str());
    }
  }
  void set(const std::string& name, const std::string& value) {
    save(name);
    setenv(name.c_str(), value.c_str(), 1);
  }
  void unset(const std::string& name) {
    save(name);
    unsetenv(name.c_str());
  }

 private:
  void save(const std::string& name) {
    const char* v = getenv(name.c_str());
    saved_.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

const std::string kKey = "normjit 0.1.0\nnvrtc 13.0\narch sm_90\noptions --std=c++17\nsource abc 10\nname k\n";

}  // namespace

// ---- hash ---------------------------------------------------------------------------------------

TEST(Hash128, DeterministicHexAndSensitive) {
  const auto a = hash128(std::string("hello world"));
  EXPECT_EQ(a, hash128(std::string("hello world")));
  EXPECT_EQ(a.hex().size(), 32u);
  EXPECT_EQ(a.hex().find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(a, hash128(std::string("hello worle")));
  // Zero padding of the tail must not collide: the length is part of the hash.
  EXPECT_NE(hash128(std::string("")), hash128(std::string(1, '\0')));
  EXPECT_NE(hash128(std::string(1, '\0')), hash128(std::string(2, '\0')));
  EXPECT_NE(hash128(std::string(16, '\0')), hash128(std::string(17, '\0')));

  // Every single-bit flip of a 40-byte input changes both halves.
  std::vector<char> buf = make_payload(40, 7);
  const auto base = hash128(buf.data(), buf.size());
  for (size_t bit = 0; bit < buf.size() * 8; ++bit) {
    buf[bit / 8] ^= static_cast<char>(1 << (bit % 8));
    const auto h = hash128(buf.data(), buf.size());
    EXPECT_NE(h.lo, base.lo) << bit;
    EXPECT_NE(h.hi, base.hi) << bit;
    buf[bit / 8] ^= static_cast<char>(1 << (bit % 8));
  }
}

// ---- basic behaviour ------------------------------------------------------------------------

TEST(DiskCache, RoundTrip) {
  TempDir tmp;
  DiskCache cache(tmp.path());
  ASSERT_TRUE(cache.enabled());
  const auto payload = make_payload(10000, 1);
  ASSERT_TRUE(cache.store(kKey, payload));
  EXPECT_EQ(cache.writes(), 1u);

  auto got = cache.load(kKey);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, payload);
  EXPECT_EQ(cache.hits(), 1u);

  // Another object (another process, in real life) sees the same entry.
  DiskCache other(tmp.path());
  EXPECT_EQ(other.load(kKey), payload);

  // Only the entry is left behind: no temp or probe files.
  EXPECT_EQ(files_in(tmp.path()).size(), 1u);

  // Empty payloads are legal, and storing again replaces the entry.
  ASSERT_TRUE(cache.store("empty", {}));
  EXPECT_EQ(cache.load("empty"), std::vector<char>{});
  const auto payload2 = make_payload(77, 2);
  ASSERT_TRUE(cache.store(kKey, payload2));
  EXPECT_EQ(cache.load(kKey), payload2);
}

TEST(DiskCache, Miss) {
  TempDir tmp;
  DiskCache cache(tmp.path());
  EXPECT_FALSE(cache.load("never stored").has_value());
  EXPECT_EQ(cache.misses(), 1u);
  EXPECT_EQ(cache.errors(), 0u);
  EXPECT_EQ(cache.hits(), 0u);
}

TEST(DiskCache, DisabledWithEmptyDirectory) {
  testing::internal::CaptureStderr();
  DiskCache cache("");
  EXPECT_FALSE(cache.enabled());
  EXPECT_FALSE(cache.store("k", {'x'}));
  EXPECT_FALSE(cache.load("k").has_value());
  EXPECT_TRUE(cache.list().empty());
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");  // disabled on purpose: silent
}

TEST(DiskCache, CreatesMissingDirectories) {
  TempDir tmp;
  const std::string dir = tmp / "a/b/c";
  DiskCache cache(dir + "/");  // a trailing slash is fine
  ASSERT_TRUE(cache.enabled());
  struct stat st {};
  ASSERT_EQ(stat(dir.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0700u);

  // Removed behind our back: the next store recreates it.
  fs::remove_all(dir);
  EXPECT_TRUE(cache.store(kKey, {'a', 'b'}));
  EXPECT_EQ(cache.load(kKey), (std::vector<char>{'a', 'b'}));
}

// ---- damaged entries ------------------------------------------------------------------------

TEST(DiskCache, TruncatedEntryIsMissDeletedAndRewritable) {
  TempDir tmp;
  DiskCache cache(tmp.path());
  const auto payload = make_payload(5000, 3);
  ASSERT_TRUE(cache.store(kKey, payload));
  const std::string file = only_entry(cache);
  ASSERT_FALSE(file.empty());
  const std::vector<char> whole = read_file(file);

  uint64_t errors = 0;
  for (size_t size : {size_t{0}, size_t{1}, size_t{8}, size_t{39}, size_t{40}, size_t{41}, kKey.size() + 40,
                      whole.size() / 2, whole.size() - 1}) {
    SCOPED_TRACE("truncated to " + std::to_string(size) + " bytes");
    write_file(file, std::vector<char>(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(size)));
    ASSERT_EQ(cache.list().size(), 1u);
    EXPECT_FALSE(cache.list()[0].valid);
    EXPECT_FALSE(cache.load(kKey).has_value());
    EXPECT_EQ(cache.errors(), ++errors);
    EXPECT_FALSE(fs::exists(file)) << "a bad entry must be deleted";

    // Recompile + store works afterwards.
    ASSERT_TRUE(cache.store(kKey, payload));
    EXPECT_EQ(cache.load(kKey), payload);
  }
}

TEST(DiskCache, GarbageBytesAreMiss) {
  TempDir tmp;
  DiskCache cache(tmp.path());
  ASSERT_TRUE(cache.store(kKey, make_payload(100, 4)));
  const std::string file = only_entry(cache);
  for (size_t n : {size_t{3}, size_t{40}, size_t{200}, size_t{4096}}) {
    write_file(file, make_payload(n, static_cast<unsigned>(n)));
    EXPECT_FALSE(cache.load(kKey).has_value()) << n;
    EXPECT_FALSE(fs::exists(file)) << n;
  }
}

TEST(DiskCache, TrailingBytesAreMiss) {
  TempDir tmp;
  DiskCache cache(tmp.path());
  ASSERT_TRUE(cache.store(kKey, make_payload(100, 5)));
  const std::string file = only_entry(cache);
  std::ofstream(file, std::ios::binary | std::ios::app) << 'x';
  EXPECT_FALSE(cache.load(kKey).has_value());
  EXPECT_FALSE(fs::exists(file));
}

TEST(DiskCache, KeyMismatchIsMiss) {
  TempDir tmp;
  DiskCache cache(tmp.path());
  const std::string key_a = kKey + "a", key_b = kKey + "b";
  // Learn B's file name by storing it, then put A's entry in its place.
  ASSERT_TRUE(cache.store(key_b, {'b'}));
  const std::string file_b = only_entry(cache);
  ASSERT_TRUE(cache.store(key_a, {'a'}));
  std::string file_a;
  for (const auto& e : cache.list())
    if (tmp / e.file != file_b) file_a = tmp / e.file;
  ASSERT_FALSE(file_a.empty());
  fs::rename(file_a, file_b);

  const auto entries = cache.list();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_FALSE(entries[0].valid);
  EXPECT_NE(entries[0].problem.find("does not match"), std::string::npos) << entries[0].problem;

  EXPECT_FALSE(cache.load(key_b).has_value());
  EXPECT_EQ(cache.errors(), 1u);
  EXPECT_FALSE(fs::exists(file_b));
  EXPECT_FALSE(cache.load(key_a).has_value());  // moved away, so a plain miss
}

TEST(DiskCache, FlippedByteFailsChecksum) {
  TempDir tmp;
  DiskCache cache(tmp.path());
  const auto payload = make_payload(3000, 6);
  for (bool in_payload : {true, false}) {
    ASSERT_TRUE(cache.store(kKey, payload));
    const std::string file = only_entry(cache);
    std::vector<char> bytes = read_file(file);
    const size_t pos = in_payload ? bytes.size() - 1000 : 45;  // 45: inside the key text
    bytes[pos] = static_cast<char>(bytes[pos] ^ 0x10);
    write_file(file, bytes);
    const auto entries = cache.list();
    ASSERT_EQ(entries.size(), 1u);
    EXPECT_NE(entries[0].problem.find("checksum"), std::string::npos) << entries[0].problem;
    EXPECT_FALSE(cache.load(kKey).has_value());
    EXPECT_FALSE(fs::exists(file));
  }
}

// ---- unwritable directory and full disk ---------------------------------------------------------

TEST(DiskCache, UnwritableDirectoryDegradesWithOneWarning) {
  TempDir tmp;
  std::string dir = tmp / "cache";
  {
    DiskCache prepare(dir);
    ASSERT_TRUE(prepare.store(kKey, {'o', 'k'}));
  }
  chmod(dir.c_str(), 0555);
  // As root (CI containers), permissions do not stop writes: detect that and use a path that can
  // never be a directory instead (its parent is a regular file).
  bool readonly_dir = true;
  const std::string probe = dir + "/probe";
  if (int fd = open(probe.c_str(), O_WRONLY | O_CREAT, 0600); fd >= 0) {
    close(fd);
    unlink(probe.c_str());
    readonly_dir = false;
    write_file(tmp / "file", {'x'});
    dir = tmp / "file/cache";
  }

  testing::internal::CaptureStderr();
  DiskCache cache(dir);
  EXPECT_FALSE(cache.store(kKey, {'n', 'e', 'w'}));
  EXPECT_FALSE(cache.store(kKey + "2", {'n', 'e', 'w'}));
  if (readonly_dir) {
    // Reads still work in a read-only cache someone else filled.
    EXPECT_TRUE(cache.enabled());
    EXPECT_EQ(cache.load(kKey), (std::vector<char>{'o', 'k'}));
  } else {
    EXPECT_FALSE(cache.enabled());
    EXPECT_FALSE(cache.load(kKey).has_value());
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(count_occurrences(err, "normjit: disk cache"), 1u) << err;
  EXPECT_NE(err.find("is not writable"), std::string::npos) << err;
  EXPECT_NE(err.find(dir), std::string::npos) << err;
  EXPECT_NE(err.find("NORMJIT_CACHE_DIR"), std::string::npos) << err;
  EXPECT_NE(err.find("NORMJIT_DISABLE_DISK_CACHE=1"), std::string::npos) << err;
  chmod((tmp / "cache").c_str(), 0700);
}

// A full disk, simulated with a file size limit in a child process (so the limit cannot affect the
// test runner). The store must fail cleanly: false, a warning, and no partial or temp file.
TEST(DiskCache, FullDiskLeavesNoPartialFiles) {
  TempDir tmp;
  const std::string dir = tmp / "cache";
  { DiskCache create(dir); }  // create the directory outside the limited child
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(pipe_fds[1], 2);
    signal(SIGXFSZ, SIG_IGN);  // make write() fail with EFBIG instead of killing us
    struct rlimit lim {4096, 4096};
    if (setrlimit(RLIMIT_FSIZE, &lim) != 0) _exit(10);
    DiskCache cache(dir);
    if (cache.store(kKey, make_payload(64 * 1024, 7))) _exit(11);
    if (cache.errors() != 1) _exit(12);
    if (cache.store(kKey + "small", {'x'})) _exit(13);  // writes stay disabled after the failure
    if (cache.load(kKey).has_value()) _exit(14);
    _exit(0);
  }
  close(pipe_fds[1]);
  std::string err;
  char buf[4096];
  for (ssize_t n; (n = read(pipe_fds[0], buf, sizeof buf)) > 0;) err.append(buf, static_cast<size_t>(n));
  close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child died with signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << err;
  EXPECT_EQ(count_occurrences(err, "normjit: disk cache"), 1u) << err;
  EXPECT_NE(err.find("File too large"), std::string::npos) << err;
  EXPECT_TRUE(files_in(dir).empty()) << "left behind: " << files_in(dir).front();
}

// ---- concurrency ------------------------------------------------------------------------------

// Eight processes store and load one key (and some a key of their own) as fast as they can. Every
// load must see a whole entry or none, never a damaged one.
TEST(DiskCache, ProcessesRacingOnOneKey) {
  TempDir tmp;
  const std::string dir = tmp / "cache";
  constexpr int kProcesses = 8, kIterations = 25;
  const auto shared = make_payload(64 * 1024, 8);
  std::vector<pid_t> children;
  for (int p = 0; p < kProcesses; ++p) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      DiskCache cache(dir);
      const std::string own_key = kKey + "own " + std::to_string(p);
      const auto own = make_payload(1000 + 100 * p, 100 + p);
      for (int i = 0; i < kIterations; ++i) {
        if (!cache.store(kKey, shared)) _exit(20);
        const auto got = cache.load(kKey);
        if (got && *got != shared) _exit(21);
        if (p % 2 == 1) {
          if (!cache.store(own_key, own)) _exit(22);
          const auto mine = cache.load(own_key);
          if (!mine || *mine != own) _exit(23);
        }
      }
      if (cache.errors() != 0) _exit(24);  // nothing damaged was ever seen
      _exit(0);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
  }
  DiskCache cache(dir);
  EXPECT_EQ(cache.load(kKey), shared);
  const auto entries = cache.list();
  EXPECT_EQ(entries.size(), 1u + kProcesses / 2);
  for (const auto& e : entries) EXPECT_TRUE(e.valid) << e.file << ": " << e.problem;
  EXPECT_EQ(files_in(dir).size(), entries.size()) << "temp files left behind";
}

// ---- maintenance ------------------------------------------------------------------------------

TEST(DiskCache, ListRemoveInvalidAndClear) {
  TempDir tmp;
  DiskCache cache(tmp.path());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cache.store(kKey + std::to_string(i), make_payload(500, i)));
  auto entries = cache.list();
  ASSERT_EQ(entries.size(), 3u);
  for (const auto& e : entries) {
    EXPECT_TRUE(e.valid);
    EXPECT_EQ(e.bytes, fs::file_size(tmp / e.file));
    EXPECT_EQ(e.key.rfind(kKey, 0), 0u);
  }

  // One damaged entry, an unrelated file, a fresh temp file (a writer at work) and a stale one.
  fs::resize_file(tmp / entries[1].file, entries[1].bytes - 3);
  write_file(tmp / "notes.txt", {'h', 'i'});
  const std::string fresh_temp = tmp / (entries[0].file + ".tmp.1.2.3");
  const std::string stale_temp = tmp / (entries[0].file + ".tmp.4.5.6");
  write_file(fresh_temp, {'t'});
  write_file(stale_temp, {'t'});
  fs::last_write_time(stale_temp, fs::file_time_type::clock::now() - std::chrono::minutes(5));

  entries = cache.list();
  ASSERT_EQ(entries.size(), 3u);  // only entries are listed
  EXPECT_FALSE(entries[1].valid);
  EXPECT_NE(entries[1].problem.find("truncated"), std::string::npos) << entries[1].problem;

  EXPECT_EQ(cache.remove_invalid(), 2u);  // the damaged entry and the stale temp file
  entries = cache.list();
  ASSERT_EQ(entries.size(), 2u);
  for (const auto& e : entries) EXPECT_TRUE(e.valid);
  EXPECT_TRUE(fs::exists(fresh_temp));
  EXPECT_FALSE(fs::exists(stale_temp));

  EXPECT_EQ(cache.clear(), 2u);
  EXPECT_TRUE(cache.list().empty());
  EXPECT_TRUE(fs::exists(tmp / "notes.txt")) << "files that are not ours are never touched";
  EXPECT_TRUE(fs::exists(fresh_temp));
}

// ---- directory from the environment -----------------------------------------------------------

TEST(DiskCache, DefaultDirFromEnvironment) {
  ScopedEnv env;
  env.unset("NORMJIT_DISABLE_DISK_CACHE");
  env.set("NORMJIT_CACHE_DIR", "/somewhere/cache");
  env.set("XDG_CACHE_HOME", "/xdg");
  env.set("HOME", "/home/user");
  EXPECT_EQ(DiskCache::default_dir(), "/somewhere/cache");

  env.set("NORMJIT_DISABLE_DISK_CACHE", "1");
  EXPECT_EQ(DiskCache::default_dir(), "");
  env.set("NORMJIT_DISABLE_DISK_CACHE", "0");
  EXPECT_EQ(DiskCache::default_dir(), "/somewhere/cache");
  env.unset("NORMJIT_DISABLE_DISK_CACHE");

  env.unset("NORMJIT_CACHE_DIR");
  EXPECT_EQ(DiskCache::default_dir(), "/xdg/normjit");
  env.set("XDG_CACHE_HOME", "relative/path");  // invalid per the XDG spec: ignored
  EXPECT_EQ(DiskCache::default_dir(), "/home/user/.cache/normjit");
  env.unset("XDG_CACHE_HOME");
  EXPECT_EQ(DiskCache::default_dir(), "/home/user/.cache/normjit");
  env.unset("HOME");
  EXPECT_EQ(DiskCache::default_dir(), "");
}
