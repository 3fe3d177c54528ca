#include "core/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.hpp"

namespace geoloco {

namespace {

[[noreturn]] void fail(const std::string& path, const char* what, int err) {
  throw Error(fmt::format("{}: {} failed: {}", path, what, std::strerror(err)));
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)) {
  // Unique per writer, not just per process: several ranks (threads, in tests) or sites that
  // share an output directory may write the same file at once; the last rename wins whole.
  static std::atomic<uint64_t> serial{0};
  tmp_ = fmt::format("{}.tmp.{}.{}", path_, ::getpid(), serial.fetch_add(1));
  fd_.reset(::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd_) fail(tmp_, "open", errno);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (!committed_) abandon();
}

void AtomicFileWriter::abandon() noexcept {
  fd_.reset();
  ::unlink(tmp_.c_str());
}

void AtomicFileWriter::write(const void* data, size_t bytes) {
  GEOLOCO_CHECK(fd_ && !committed_, "write to {} after commit or failure", path_);
  if (const int err = write_all(fd_.get(), data, bytes)) {
    abandon();
    fail(tmp_, "write", err);
  }
  written_ += bytes;
}

void AtomicFileWriter::commit() {
  GEOLOCO_CHECK(fd_ && !committed_, "commit of {} twice or after failure", path_);
  if (::fsync(fd_.get()) != 0) {
    const int err = errno;
    abandon();
    fail(tmp_, "fsync", err);
  }
  if (const int err = fd_.close(); err != 0) {
    abandon();
    fail(tmp_, "close", err);
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    abandon();
    fail(path_, "rename", err);
  }
  committed_ = true;
  // The rename is durable only once the directory entry is on disk.
  const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  const Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dfd) fail(dir, "open directory", errno);
  if (::fsync(dfd.get()) != 0) fail(dir, "fsync directory", errno);
}

void write_file_atomically(const std::string& path, std::span<const uint8_t> bytes) {
  AtomicFileWriter w(path);
  w.write(bytes);
  w.commit();
}

void write_text_atomically(const std::string& path, const std::string& text) {
  write_file_atomically(path, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

}  // namespace geoloco
