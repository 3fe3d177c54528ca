#include "trainer/data/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.hpp"
#include "core/fd.hpp"

namespace geoloco::trainer {

namespace {

std::string errno_text(const char* what) { return fmt::format("{} failed: {}", what, std::strerror(errno)); }

}  // namespace

MappedFile::MappedFile(std::string path) : path_(std::move(path)) {
  // Closed on every path out of the constructor; the mapping outlives it.
  const Fd f(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
  if (!f) throw FileError(path_, errno_text("open"));
  struct stat st {};
  if (::fstat(f.get(), &st) != 0) throw FileError(path_, errno_text("fstat"));
  if (!S_ISREG(st.st_mode)) throw FileError(path_, "not a regular file");
  size_ = static_cast<size_t>(st.st_size);
  if (size_ == 0) return;
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, f.get(), 0);
  if (p == MAP_FAILED) {
    size_ = 0;
    throw FileError(path_, errno_text("mmap"));
  }
  data_ = static_cast<const uint8_t*>(p);
}

MappedFile::~MappedFile() { release(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::release() noexcept {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace geoloco::trainer
