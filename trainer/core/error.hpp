// geoloco::core errors: the two tiers every area uses.
//
//  * InputError (and subclasses): the user's input is wrong -- a config key, a CLI argument,
//    a corrupt checkpoint or data file. The CLI exits 2.
//  * Error: anything else that failed at run time -- a peer died, a transfer timed out, a
//    frame was malformed. The CLI exits 1.
// Broken internal invariants use GEOLOCO_CHECK, which throws Error with file:line.
#pragma once

#include <fmt/format.h>

#include <memory>
#include <stdexcept>
#include <string>

namespace geoloco {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what), what_(std::make_shared<std::string>(what)) {}
  explicit Error(const char* what) : Error(std::string(what)) {}
  const char* what() const noexcept override { return what_->c_str(); }
  // Prepends "<context>: " where a caller knows more than the thrower (e.g. the outer step a
  // peer was lost in), keeping the exception's type; copies share the message.
  void add_context(const std::string& context) { *what_ = context + ": " + *what_; }

 private:
  std::shared_ptr<std::string> what_;
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
