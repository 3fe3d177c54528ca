// geoloco::Fd: the one owner of a POSIX file descriptor (socket, pipe end, file, eventfd,
// signalfd). Move-only; closes exactly once, on destruction or reset(). Every area uses this
// class rather than a wrapper of its own (STYLE.md: one small helper, written once).
#pragma once

#include <cstddef>
#include <utility>

namespace geoloco {

class Fd {
 public:
  Fd() noexcept = default;
  // Takes ownership of `fd` (-1 or any negative value: owns nothing).
  explicit Fd(int fd) noexcept : fd_(fd < 0 ? -1 : fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  explicit operator bool() const noexcept { return valid(); }

  // Gives the descriptor up without closing it; this object owns nothing afterwards.
  [[nodiscard]] int release() noexcept { return std::exchange(fd_, -1); }

  // Closes the owned descriptor (if any) and takes `fd`. reset(get()) is a no-op, never a
  // close of a descriptor that is still held.
  void reset(int fd = -1) noexcept;

  // Closes now and says how that went: 0, or the errno of a close() that reported a failure
  // (EIO: a write-back error the caller must not ignore, e.g. before renaming a file into
  // place). The descriptor is released either way. EINTR counts as closed (see fd.cpp).
  int close() noexcept;

 private:
  int fd_ = -1;
};

// close(2) once, never retried: on Linux the descriptor is gone even when close() returns
// EINTR, and a retry could close a descriptor another thread has just been given. Returns
// 0 or errno (EINTR reported as 0). For code that holds raw descriptors it does not own.
int close_fd(int fd) noexcept;

// Writes all `bytes` at `data` to `fd` (a file, a pipe, a terminal): retries a write that
// EINTR interrupted and, on a descriptor someone set non-blocking, waits until it takes more
// (EAGAIN). Returns 0, or the errno of the write that failed (what came before it was
// written). The one write loop of the code base (sockets with deadlines: net::send_all).
int write_all(int fd, const void* data, size_t bytes) noexcept;

}  // namespace geoloco
