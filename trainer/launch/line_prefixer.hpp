// Turns a child's byte stream into whole lines prefixed with "[label] ", each written with
// one write(2) so lines from different ranks never interleave mid-line.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

namespace geoloco::launch {

class LinePrefixer {
 public:
  // A line longer than this is cut and emitted in pieces (each piece prefixed), so a child
  // that never prints a newline cannot grow the buffer without bound.
  static constexpr size_t kMaxLine = 64 * 1024;

  LinePrefixer(std::string label, int out_fd);
  // Lines go to `sink` (whole, prefixed, newline-terminated) instead of a descriptor: the
  // terminal status view prints them above its block.
  LinePrefixer(std::string label, std::function<void(const std::string&)> sink);
  void feed(const char* data, size_t len);
  // Emits a trailing partial line (adding the newline). Call once at EOF.
  void finish();

 private:
  void emit(const char* line, size_t len);

  std::string prefix_;
  int fd_ = -1;
  std::function<void(const std::string&)> sink_;
  std::string pending_;
};

}  // namespace geoloco::launch
