// geoloco::test::run_ranks: the one way the tests run N ranks as threads of this process
// (gloo's tests do the same). Every thread is joined before anything is rethrown, so a
// failing rank never leaves the others running against freed state.
#pragma once

#include <spdlog/spdlog.h>

#include <cstddef>
#include <exception>
#include <thread>
#include <type_traits>
#include <vector>

namespace geoloco::test {

// Runs fn(rank) for rank 0..n-1, each on its own thread, and joins them all. If any rank
// threw, rethrows the exception of the lowest such rank (deterministic, so a test can assert
// on the message; the others are usually echoes of it, e.g. a peer's timeout). When fn
// returns a value, returns the values by rank (the type must be default-constructible).
template <class Fn>
auto run_ranks(int n, Fn&& fn) {
  using R = std::invoke_result_t<Fn&, int>;
  static_assert(!std::is_same_v<R, bool>, "std::vector<bool> cannot be written from several threads: return int");
  const size_t count = n > 0 ? static_cast<size_t>(n) : 0;
  // spdlog's registry is a function-local static inside the (uninstrumented) shared library:
  // built here, before the threads, so TSan sees it happen-before their first log line.
  spdlog::default_logger_raw();
  std::vector<std::exception_ptr> errors(count);
  std::vector<std::conditional_t<std::is_void_v<R>, char, R>> out(std::is_void_v<R> ? 0 : count);
  {
    std::vector<std::jthread> threads;
    threads.reserve(count);
    for (size_t r = 0; r < count; ++r)
      threads.emplace_back([&, r] {
        try {
          if constexpr (std::is_void_v<R>) {
            fn(static_cast<int>(r));
          } else {
            out[r] = fn(static_cast<int>(r));
          }
        } catch (...) {
          errors[r] = std::current_exception();
        }
      });
  }  // joins every thread
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  if constexpr (!std::is_void_v<R>) return out;
}

}  // namespace geoloco::test
