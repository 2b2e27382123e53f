// L3: a directory of compiled binaries (and small records such as autotune choices) shared by
// every process of the user.
//
// Location: $NORMJIT_CACHE_DIR, else $XDG_CACHE_HOME/normjit, else ~/.cache/normjit.
// NORMJIT_DISABLE_DISK_CACHE=1 turns it off. An entry is one file named by the hash of its key:
//   header (magic, format version, key length, payload length, payload checksum), key text, payload.
// Entries are published atomically (unique temp file in the same directory, fsync, rename), so a
// reader sees a whole entry or none. load() verifies magic, sizes, the stored key (equal to the
// requested one) and the checksum; a bad entry is deleted and reported as a miss. A directory that
// cannot be created or written degrades to memory-only with one warning on stderr.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace normjit::compile {

class DiskCache {
 public:
  // The process-wide cache configured from the environment.
  static DiskCache& global();

  // A cache in `dir` (tests and the CLI); an empty dir means disabled.
  explicit DiskCache(std::string dir);

  bool enabled() const { return enabled_.load(); }
  const std::string& dir() const { return dir_; }

  // The entry for `key`, verified, or nullopt (missing, or bad and now deleted).
  std::optional<std::vector<char>> load(const std::string& key);
  // Publishes atomically. Returns false (and warns once, disabling further writes) on failure.
  bool store(const std::string& key, const std::vector<char>& payload);

  struct Entry {
    std::string file;       // file name inside dir()
    uint64_t bytes = 0;     // file size
    bool valid = false;     // header, sizes and checksum verified
    std::string key;        // stored key (first line shown by the CLI)
    std::string problem;    // why it is invalid
  };
  std::vector<Entry> list() const;   // every entry, verified
  size_t remove_invalid();           // deletes entries that fail verification; returns the count
  size_t clear();                    // deletes every entry; returns the count

  // Counters of this object.
  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }
  uint64_t writes() const { return writes_; }
  uint64_t errors() const { return errors_; }

  static std::string default_dir();  // from the environment, "" when disabled

 private:
  std::string path_for(const std::string& key) const;
  void disable_writes(const std::string& why);

  std::string dir_;
  std::atomic<bool> enabled_{false};
  std::atomic<bool> writable_{true};
  std::once_flag warned_;
  std::atomic<uint64_t> hits_{0}, misses_{0}, writes_{0}, errors_{0};
};

}  // namespace normjit::compile
