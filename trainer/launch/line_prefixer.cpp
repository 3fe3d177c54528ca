// LinePrefixer's buffering: a child's bytes cut into whole "[label] " lines, each one write(2)
// (line_prefixer.hpp).
#include "trainer/launch/line_prefixer.hpp"

#include "core/fd.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace geoloco::launch {

LinePrefixer::LinePrefixer(std::string label, int out_fd) : prefix_("[" + label + "] "), fd_(out_fd) {}
LinePrefixer::LinePrefixer(std::string label, std::function<void(const std::string&)> sink)
    : prefix_("[" + label + "] "), sink_(std::move(sink)) {}

void LinePrefixer::emit(const char* line, size_t len) {
  while (len > kMaxLine) {
    emit(line, kMaxLine);
    line += kMaxLine;
    len -= kMaxLine;
  }
  std::string out;
  out.reserve(prefix_.size() + len + 1);
  out.append(prefix_).append(line, len).push_back('\n');
  if (sink_) {
    sink_(out);
  } else {
    (void)write_all(fd_, out.data(), out.size());  // a failed sink only loses the view
  }
}

void LinePrefixer::feed(const char* data, size_t len) {
  while (len > 0) {
    const char* nl = static_cast<const char*>(std::memchr(data, '\n', len));
    if (nl == nullptr) {
      pending_.append(data, len);
      while (pending_.size() >= kMaxLine) {
        emit(pending_.data(), kMaxLine);
        pending_.erase(0, kMaxLine);
      }
      return;
    }
    const size_t part = static_cast<size_t>(nl - data);
    if (pending_.empty()) {
      emit(data, part);
    } else {
      pending_.append(data, part);
      emit(pending_.data(), pending_.size());
      pending_.clear();
    }
    data = nl + 1;
    len -= part + 1;
  }
}

void LinePrefixer::finish() {
  if (!pending_.empty()) emit(pending_.data(), pending_.size());
  pending_.clear();
}

}  // namespace geoloco::launch
