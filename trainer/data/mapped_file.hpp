// MappedFile: a read-only memory map of a whole file (RAII over open/mmap/munmap).
//
// Data sources map their files instead of reading them so that a multi-GB corpus costs
// page cache, not heap, and several datasets over the same file share pages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace geoloco::trainer {

class MappedFile {
 public:
  // Throws FileError (with errno text) if the file cannot be opened, stat'ed or mapped.
  // An empty file maps to an empty span (mmap of 0 bytes is not allowed).
  explicit MappedFile(std::string path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;

  const std::string& path() const { return path_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  size_t size() const { return size_; }

 private:
  void release() noexcept;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace geoloco::trainer
