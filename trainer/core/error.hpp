// geoloco::core errors: the two tiers every area uses.
//
//  * InputError (and subclasses): the user's input is wrong -- a config key, a CLI argument,
//    a corrupt checkpoint or data file. The CLI exits 2.
//  * Error: anything else that failed at run time -- a peer died, a transfer timed out, a
//    frame was malformed. The CLI exits 1.
// Broken internal invariants use GEOLOCO_CHECK, which throws Error with file:line.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace geoloco {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad input from the user: exit code 2.
class InputError : public Error {
 public:
  using Error::Error;
};

// A config value is wrong. The message already names file, line:col, key path, value and
// what is allowed.
class ConfigError : public InputError {
 public:
  using InputError::InputError;
};

// A file (checkpoint, data shard, key file) is missing, truncated or corrupt.
class FileError : public InputError {
 public:
  FileError(const std::string& path, const std::string& problem)
      : InputError(path + ": " + problem), path_(path) {}
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

namespace detail {
[[noreturn]] void check_failed(const char* expr, const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace geoloco

// Invariant check: throws geoloco::Error("file:line: check 'expr' failed: msg").
#define GEOLOCO_CHECK(cond, ...)                                                             \
  do {                                                                                       \
    if (!(cond)) [[unlikely]]                                                                \
      ::geoloco::detail::check_failed(#cond, __FILE__, __LINE__, ::fmt::format(__VA_ARGS__)); \
  } while (0)
