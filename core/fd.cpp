#include "core/fd.hpp"

#include <poll.h>
#include <unistd.h>

#include <cerrno>

namespace geoloco {

int close_fd(int fd) noexcept {
  if (fd < 0) return 0;
  // Linux releases the descriptor before close() can be interrupted (man 2 close, "Dealing
  // with error returns from close()"), so EINTR means closed; retrying could close a
  // descriptor that another thread opened in between.
  if (::close(fd) == 0 || errno == EINTR) return 0;
  return errno;
}

void Fd::reset(int fd) noexcept {
  if (fd < 0) fd = -1;
  if (fd == fd_) return;
  const int old = std::exchange(fd_, fd);
  close_fd(old);
}

int Fd::close() noexcept { return close_fd(release()); }

int write_all(int fd, const void* data, size_t bytes) noexcept {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        pollfd pf{fd, POLLOUT, 0};
        (void)::poll(&pf, 1, 100);
        continue;
      }
      return errno;
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return 0;
}

}  // namespace geoloco
