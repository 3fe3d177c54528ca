// The codec's thread fan-out (parallel.hpp).
#include "compression/parallel.hpp"

#include <algorithm>
#include <exception>
#include <thread>
#include <vector>

namespace geoloco::compression {

void parallel_for(size_t n, int threads, const std::function<void(size_t, int)>& body) {
  const int t = static_cast<int>(std::min<size_t>(n, static_cast<size_t>(std::max(threads, 1))));
  if (t <= 1) {
    for (size_t i = 0; i < n; ++i) body(i, 0);
    return;
  }
  std::vector<std::exception_ptr> errors(n);
  auto run = [&](int w) {
    for (size_t i = static_cast<size_t>(w); i < n; i += static_cast<size_t>(t)) {
      try {
        body(i, w);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(t - 1));
  for (int w = 1; w < t; ++w) pool.emplace_back(run, w);
  run(0);
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace geoloco::compression
