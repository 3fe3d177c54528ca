// Atomic file replacement: a reader (or a crash) sees either the old file or the complete
// new one, never a torn checkpoint.
//
// Bytes go to `<path>.tmp.<pid>`; commit() fsyncs the file, renames it over `path` and
// fsyncs the directory so the rename itself survives a power loss. A writer destroyed
// without commit() removes its temporary file. Two threads of one process must not write
// the same path at once (they would share the temporary name).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/fd.hpp"

namespace geoloco {

class AtomicFileWriter {
 public:
  // Throws geoloco::Error naming the path and errno text when the temporary can't be created.
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t bytes);
  void write(std::span<const uint8_t> bytes) { write(bytes.data(), bytes.size()); }
  // fsync, rename over the target, fsync the directory. Throws geoloco::Error on failure
  // (the temporary is removed and the old file, if any, is untouched).
  void commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_; }
  uint64_t bytes_written() const { return written_; }

 private:
  void abandon() noexcept;
  std::string path_, tmp_;
  Fd fd_;
  uint64_t written_ = 0;
  bool committed_ = false;
};

// One-shot convenience.
void write_file_atomically(const std::string& path, std::span<const uint8_t> bytes);
void write_text_atomically(const std::string& path, const std::string& text);

}  // namespace geoloco
