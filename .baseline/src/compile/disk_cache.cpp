// The on-disk cache (L3). See disk_cache.h for the contract.
//
// File layout of one entry, "<hash128(key).hex()>.njc" (integers little-endian):
//   offset  0: magic "NJITCACH"            (8 bytes)
//   offset  8: format version              (u32)
//   offset 12: key length                  (u32)
//   offset 16: payload length              (u64)
//   offset 24: hash128(key + payload).lo   (u64)
//   offset 32: hash128(key + payload).hi   (u64)
//   offset 40: key bytes, then payload bytes; the file ends exactly there.
// Writers create "<entry name>.tmp.<pid>.<tid>.<random>" in the same directory and rename it over the
// entry, so readers never see a partial file and concurrent writers of one key simply race to an
// identical result. Only files matching these two name patterns are ever read or deleted: the
// directory may be shared with other files (a user can point NORMJIT_CACHE_DIR anywhere).
#include "compile/disk_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "compile/hash.h"

namespace normjit::compile {
namespace {

constexpr char kMagic[8] = {'N', 'J', 'I', 'T', 'C', 'A', 'C', 'H'};
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kHeaderSize = 40;
constexpr uint64_t kMaxKeyBytes = 1u << 20;        // keys are a few hundred bytes
constexpr uint64_t kMaxPayloadBytes = 1ull << 31;  // cubins are well below this
constexpr const char* kEntrySuffix = ".njc";
constexpr const char* kTempMarker = ".njc.tmp.";
constexpr auto kStaleTempAge = std::chrono::seconds(60);  // a live writer finishes far sooner

std::string errno_text(int err) { return std::strerror(err); }

// ---- little-endian encoding -------------------------------------------------------------------

void put_u32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
void put_u64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}
uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

std::vector<char> encode_entry(const std::string& key, const std::vector<char>& payload) {
  std::vector<char> out(kHeaderSize + key.size() + payload.size());
  std::memcpy(out.data(), kMagic, sizeof kMagic);
  put_u32(&out[8], kFormatVersion);
  put_u32(&out[12], static_cast<uint32_t>(key.size()));
  put_u64(&out[16], payload.size());
  std::memcpy(&out[kHeaderSize], key.data(), key.size());
  if (!payload.empty()) std::memcpy(&out[kHeaderSize + key.size()], payload.data(), payload.size());
  const Hash128 sum = hash128(&out[kHeaderSize], key.size() + payload.size());
  put_u64(&out[24], sum.lo);
  put_u64(&out[32], sum.hi);
  return out;
}

// What a file holds once verified. `problem` is empty for a good entry.
struct Decoded {
  std::string problem;
  std::string key;
  size_t payload_offset = 0, payload_size = 0;
};

Decoded decode_entry(const std::vector<char>& file) {
  Decoded d;
  if (file.size() < kHeaderSize) {
    d.problem = "truncated: " + std::to_string(file.size()) + " bytes, shorter than the header";
    return d;
  }
  if (std::memcmp(file.data(), kMagic, sizeof kMagic) != 0) {
    d.problem = "not a normjit cache entry (bad magic)";
    return d;
  }
  if (const uint32_t v = get_u32(&file[8]); v != kFormatVersion) {
    d.problem = "unsupported format version " + std::to_string(v);
    return d;
  }
  const uint64_t key_size = get_u32(&file[12]);
  const uint64_t payload_size = get_u64(&file[16]);
  if (key_size > kMaxKeyBytes || payload_size > kMaxPayloadBytes) {
    d.problem = "corrupt header (impossible sizes)";
    return d;
  }
  const uint64_t expected = kHeaderSize + key_size + payload_size;
  if (file.size() != expected) {
    d.problem = (file.size() < expected ? "truncated: " : "trailing bytes: ") + std::to_string(file.size()) +
                " bytes, header says " + std::to_string(expected);
    return d;
  }
  const Hash128 sum = hash128(&file[kHeaderSize], key_size + payload_size);
  if (sum.lo != get_u64(&file[24]) || sum.hi != get_u64(&file[32])) {
    d.problem = "checksum mismatch (corrupted contents)";
    return d;
  }
  d.key.assign(&file[kHeaderSize], key_size);
  d.payload_offset = kHeaderSize + key_size;
  d.payload_size = payload_size;
  return d;
}

// ---- file helpers -----------------------------------------------------------------------------

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

std::string entry_name(const std::string& key) { return hash128(key).hex() + kEntrySuffix; }

bool is_entry_name(const std::string& name) {
  if (name.size() != 32 + std::strlen(kEntrySuffix) || !ends_with(name, kEntrySuffix)) return false;
  return std::all_of(name.begin(), name.begin() + 32, [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool is_temp_name(const std::string& name) { return name.find(kTempMarker) != std::string::npos; }

// Reads a whole file through an open descriptor.
bool read_all(int fd, std::vector<char>& out, uint64_t size, std::string* err) {
  out.resize(size);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, out.data() + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *err = "read failed: " + errno_text(errno);
      return false;
    }
    if (n == 0) break;  // shrank underneath us; verification reports it as truncated
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  return true;
}

bool write_all(int fd, const char* p, size_t size, int* err) {
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *err = errno;
      return false;
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// Writes `bytes`, flushes them to disk and closes fd; returns what failed, or "".
std::string write_durably(int fd, const std::vector<char>& bytes) {
  std::string failure;
  int err = 0;
  if (!write_all(fd, bytes.data(), bytes.size(), &err))
    failure = "writing: " + errno_text(err);
  else if (::fsync(fd) != 0)
    failure = "fsync: " + errno_text(errno);
  if (::close(fd) != 0 && failure.empty()) failure = "close: " + errno_text(errno);
  return failure;
}

// Deletes `path` only if it is still the file we inspected: a writer may have renamed a fresh,
// valid entry over it in the meantime, and that one must survive.
bool unlink_if_same(const std::string& path, const struct stat& inspected) {
  struct stat now {};
  if (::stat(path.c_str(), &now) != 0) return false;
  if (now.st_dev != inspected.st_dev || now.st_ino != inspected.st_ino) return false;
  return ::unlink(path.c_str()) == 0;
}

// mkdir -p. Intermediate directories get 0755 (they may be shared, like ~/.cache), the cache
// directory itself 0700: it holds code that this user's processes will load and run.
bool make_dirs(const std::string& dir, std::string* err) {
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    const std::string prefix = dir.substr(0, pos);
    const bool leaf = pos == dir.size();
    if (::mkdir(prefix.c_str(), leaf ? 0700 : 0755) == 0 || errno == EEXIST) {
      struct stat st {};
      if (::stat(prefix.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) continue;
      *err = prefix + " exists and is not a directory";
      return false;
    }
    *err = "cannot create " + prefix + ": " + errno_text(errno);
    return false;
  }
  return true;
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);  // best effort: some file systems refuse fsync on directories
  ::close(fd);
}

// A suffix no other writer on this machine (or a machine sharing the directory) will pick:
// pid and thread id separate live writers here, the random part covers pid reuse across hosts.
std::string unique_suffix() {
  static std::atomic<uint64_t> counter{0};
  uint64_t r = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  try {
    std::random_device rd;
    r ^= (static_cast<uint64_t>(rd()) << 32) ^ rd();
  } catch (...) {  // no entropy source: the clock and counter still make it unique per process
  }
  r ^= counter.fetch_add(1) * 0x9e3779b97f4a7c15ull;
  char buf[96];
  std::snprintf(buf, sizeof buf, "%ld.%ld.%016llx", static_cast<long>(::getpid()),
                static_cast<long>(::syscall(SYS_gettid)), static_cast<unsigned long long>(r));
  return buf;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

bool truthy(const std::string& v) {
  return !v.empty() && v != "0" && v != "false" && v != "FALSE" && v != "no" && v != "off" && v != "OFF";
}

// Opens, reads and verifies one entry file. Returns false when the file cannot be opened (gone).
struct Inspection {
  struct stat st {};
  std::vector<char> bytes;
  Decoded decoded;
  std::string io_error;  // could not be read
};

bool inspect(const std::string& path, Inspection& out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return false;
    out.io_error = "cannot open: " + errno_text(errno);
    return true;
  }
  if (::fstat(fd, &out.st) != 0) {
    out.io_error = "cannot stat: " + errno_text(errno);
  } else if (static_cast<uint64_t>(out.st.st_size) > kHeaderSize + kMaxKeyBytes + kMaxPayloadBytes) {
    out.decoded.problem = "implausibly large (" + std::to_string(out.st.st_size) + " bytes)";
  } else if (read_all(fd, out.bytes, static_cast<uint64_t>(out.st.st_size), &out.io_error)) {
    out.decoded = decode_entry(out.bytes);
  }
  ::close(fd);
  return true;
}

bool is_stale_temp(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  const auto age = std::chrono::system_clock::now() - std::chrono::system_clock::from_time_t(st.st_mtime);
  return age > kStaleTempAge;
}

// File names in `dir` (not . and ..), sorted for stable output.
std::vector<std::string> dir_names(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return names;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

// ---- DiskCache --------------------------------------------------------------------------------

DiskCache& DiskCache::global() {
  // Never destroyed: other static objects may still use it while the process exits.
  static DiskCache* cache = new DiskCache(default_dir());
  return *cache;
}

std::string DiskCache::default_dir() {
  if (truthy(env("NORMJIT_DISABLE_DISK_CACHE"))) return "";
  if (std::string d = env("NORMJIT_CACHE_DIR"); !d.empty()) return d;
  // The XDG spec says relative values are invalid and must be ignored.
  if (std::string x = env("XDG_CACHE_HOME"); !x.empty() && x[0] == '/') return x + "/normjit";
  if (std::string h = env("HOME"); !h.empty()) return h + "/.cache/normjit";
  return "";  // nowhere sensible to write: in-memory caching only
}

DiskCache::DiskCache(std::string dir) : dir_(std::move(dir)) {
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  if (dir_.empty()) return;  // disabled on purpose: no warning

  std::string err;
  if (!make_dirs(dir_, &err)) {
    disable_writes(err);
    return;
  }
  enabled_ = true;

  // Probe by creating a file: access(W_OK) is wrong for root, ACLs and read-only mounts alike.
  const std::string probe = dir_ + "/.probe" + kTempMarker + unique_suffix();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    // Reads stay enabled: a read-only cache prepared by someone else is still useful.
    disable_writes(errno_text(errno));
    return;
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

std::string DiskCache::path_for(const std::string& key) const { return dir_ + "/" + entry_name(key); }

void DiskCache::disable_writes(const std::string& why) {
  writable_ = false;
  std::call_once(warned_, [&] {
    std::fprintf(stderr,
                 "normjit: disk cache %s is not writable (%s); continuing with the in-memory cache only. "
                 "Set NORMJIT_CACHE_DIR to a writable directory or NORMJIT_DISABLE_DISK_CACHE=1 to silence this.\n",
                 dir_.c_str(), why.c_str());
  });
}

std::optional<std::vector<char>> DiskCache::load(const std::string& key) {
  if (!enabled_) return std::nullopt;
  const std::string path = path_for(key);
  Inspection in;
  if (!inspect(path, in)) {
    ++misses_;
    return std::nullopt;
  }
  std::string problem = !in.io_error.empty() ? in.io_error : in.decoded.problem;
  if (problem.empty() && in.decoded.key != key) problem = "stored key differs from the requested one";
  if (!problem.empty()) {
    ++misses_;
    ++errors_;
    if (in.io_error.empty()) unlink_if_same(path, in.st);  // keep files we merely could not read
    return std::nullopt;
  }
  ++hits_;
  const auto first = in.bytes.begin() + static_cast<std::ptrdiff_t>(in.decoded.payload_offset);
  return std::vector<char>(first, first + static_cast<std::ptrdiff_t>(in.decoded.payload_size));
}

bool DiskCache::store(const std::string& key, const std::vector<char>& payload) {
  if (!enabled_ || !writable_) return false;
  if (key.size() > kMaxKeyBytes || payload.size() > kMaxPayloadBytes) return false;

  const std::string final_path = path_for(key);
  const std::string temp_path = final_path + ".tmp." + unique_suffix();
  const std::vector<char> bytes = encode_entry(key, payload);

  int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0 && errno == ENOENT) {
    // The directory was removed while we ran (rm -rf of the cache): recreate it once.
    std::string err;
    if (make_dirs(dir_, &err)) fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  }
  if (fd < 0) {
    const int err = errno;
    ++errors_;
    disable_writes("creating " + temp_path + ": " + errno_text(err));
    return false;
  }

  // Any failure below leaves no trace: the temp file is removed and the entry is untouched.
  std::string failure = write_durably(fd, bytes);
  if (failure.empty() && ::rename(temp_path.c_str(), final_path.c_str()) != 0)
    failure = "renaming to " + final_path + ": " + errno_text(errno);
  if (!failure.empty()) {
    ::unlink(temp_path.c_str());
    ++errors_;
    disable_writes(failure);
    return false;
  }
  fsync_dir(dir_);  // make the rename itself durable
  ++writes_;
  return true;
}

std::vector<DiskCache::Entry> DiskCache::list() const {
  std::vector<Entry> entries;
  if (dir_.empty()) return entries;
  for (const std::string& name : dir_names(dir_)) {
    if (!is_entry_name(name)) continue;
    Inspection in;
    if (!inspect(dir_ + "/" + name, in)) continue;  // deleted since the directory was read
    Entry e;
    e.file = name;
    e.bytes = static_cast<uint64_t>(in.st.st_size);
    e.key = in.decoded.key;
    e.problem = !in.io_error.empty() ? in.io_error : in.decoded.problem;
    if (e.problem.empty() && entry_name(e.key) != name) e.problem = "file name does not match the stored key";
    e.valid = e.problem.empty();
    entries.push_back(std::move(e));
  }
  return entries;
}

// Both maintenance calls also delete temp files older than a minute: their writers crashed.
// The returned counts include those temp files.
size_t DiskCache::remove_invalid() {
  size_t removed = 0;
  if (dir_.empty()) return 0;
  for (const std::string& name : dir_names(dir_)) {
    const std::string path = dir_ + "/" + name;
    if (is_temp_name(name)) {
      if (is_stale_temp(path) && ::unlink(path.c_str()) == 0) ++removed;
      continue;
    }
    if (!is_entry_name(name)) continue;
    Inspection in;
    if (!inspect(path, in) || !in.io_error.empty()) continue;
    const bool bad = !in.decoded.problem.empty() || entry_name(in.decoded.key) != name;
    if (bad && unlink_if_same(path, in.st)) ++removed;
  }
  return removed;
}

size_t DiskCache::clear() {
  size_t removed = 0;
  if (dir_.empty()) return 0;
  for (const std::string& name : dir_names(dir_)) {
    const std::string path = dir_ + "/" + name;
    // A fresh temp file belongs to a writer that is about to rename it; leave it alone.
    const bool ours = is_entry_name(name) || (is_temp_name(name) && is_stale_temp(path));
    if (ours && ::unlink(path.c_str()) == 0) ++removed;
  }
  return removed;
}

}  // namespace normjit::compile
