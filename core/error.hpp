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
#include <utility>

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
  FileError(const std::string& path, const std::string& problem) : InputError(path + ": " + problem), path_(path) {}
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

namespace detail {
[[noreturn]] void check_failed(const char* expr, const char* file, int line, const std::string& msg);
// A comparison's check: its operands as they were ("3 vs 4").
[[noreturn]] void check_failed(const char* expr, const char* file, int line, const std::string& operands,
                               const std::string& msg);
inline std::string check_message() { return {}; }
template <class... A>
std::string check_message(fmt::format_string<A...> f, A&&... a) {
  return fmt::format(f, std::forward<A>(a)...);
}
}  // namespace detail

}  // namespace geoloco

// Invariant check: throws geoloco::Error("file:line: check 'expr' failed: msg").
#define GEOLOCO_CHECK(cond, ...)                                                              \
  do {                                                                                        \
    if (!(cond)) [[unlikely]]                                                                 \
      ::geoloco::detail::check_failed(#cond, __FILE__, __LINE__, ::fmt::format(__VA_ARGS__)); \
  } while (0)

// Comparison checks that print both operands, as gloo's ENFORCE_EQ does:
// GEOLOCO_CHECK_EQ(a, b[, fmt, args...]) throws
// geoloco::Error("file:line: check 'a == b' failed (3 vs 4): msg"). Operands must be printable
// by fmt; each is evaluated once.
#define GEOLOCO_CHECK_OP_(op, a, b, ...)                                                             \
  do {                                                                                               \
    const auto& geoloco_check_a_ = (a);                                                              \
    const auto& geoloco_check_b_ = (b);                                                              \
    if (!(geoloco_check_a_ op geoloco_check_b_)) [[unlikely]]                                        \
      ::geoloco::detail::check_failed(#a " " #op " " #b, __FILE__, __LINE__,                         \
                                      ::fmt::format("{} vs {}", geoloco_check_a_, geoloco_check_b_), \
                                      ::geoloco::detail::check_message(__VA_ARGS__));                \
  } while (0)
#define GEOLOCO_CHECK_EQ(a, b, ...) GEOLOCO_CHECK_OP_(==, a, b __VA_OPT__(, ) __VA_ARGS__)
#define GEOLOCO_CHECK_NE(a, b, ...) GEOLOCO_CHECK_OP_(!=, a, b __VA_OPT__(, ) __VA_ARGS__)
#define GEOLOCO_CHECK_LT(a, b, ...) GEOLOCO_CHECK_OP_(<, a, b __VA_OPT__(, ) __VA_ARGS__)
#define GEOLOCO_CHECK_LE(a, b, ...) GEOLOCO_CHECK_OP_(<=, a, b __VA_OPT__(, ) __VA_ARGS__)
#define GEOLOCO_CHECK_GT(a, b, ...) GEOLOCO_CHECK_OP_(>, a, b __VA_OPT__(, ) __VA_ARGS__)
#define GEOLOCO_CHECK_GE(a, b, ...) GEOLOCO_CHECK_OP_(>=, a, b __VA_OPT__(, ) __VA_ARGS__)
