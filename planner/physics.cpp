#include "planner/physics.hpp"

#include <fmt/format.h>

#include <cmath>

#include "core/error.hpp"

namespace geoloco::planner {
namespace {

void require_positive(double v, const char* what) {
  if (!(std::isfinite(v) && v > 0)) throw InputError(fmt::format("{}: got {}, expected a positive number", what, v));
}

}  // namespace

double fiber_one_way_s(double km) {
  if (!std::isfinite(km) || km < 0)
    throw InputError(fmt::format("distance: got {} km, expected a distance >= 0 km", km));
  return km * kFiberSecondsPerKm;
}

double fiber_rtt_s(double km) { return 2.0 * fiber_one_way_s(km); }

double tcp_window_bytes(double rmem_max_bytes, double window_fraction) {
  require_positive(rmem_max_bytes, "tcp_rmem max");
  if (!(window_fraction > 0 && window_fraction <= 1))
    throw InputError(fmt::format("tcp window fraction: got {}, expected a number in (0, 1]", window_fraction));
  return rmem_max_bytes * window_fraction;
}

double bdp_cap_bytes_per_s(double window_bytes, double rtt_s) {
  require_positive(window_bytes, "tcp window");
  require_positive(rtt_s, "rtt");
  return window_bytes / rtt_s;
}

double rmem_needed_bytes(double rate_bytes_per_s, double rtt_s, double window_fraction) {
  require_positive(rate_bytes_per_s, "rate");
  require_positive(rtt_s, "rtt");
  require_positive(window_fraction, "tcp window fraction");
  return rate_bytes_per_s * rtt_s / window_fraction;
}

double effective_rate_bytes_per_s(double link_bytes_per_s, int64_t connections, double per_connection_cap) {
  require_positive(link_bytes_per_s, "link rate");
  require_positive(per_connection_cap, "per-connection rate");
  if (connections < 1) throw InputError(fmt::format("connections: got {}, expected >= 1", connections));
  return std::min(link_bytes_per_s, static_cast<double>(connections) * per_connection_cap);
}

int64_t connections_needed(double target_bytes_per_s, double per_connection_cap) {
  require_positive(target_bytes_per_s, "target rate");
  require_positive(per_connection_cap, "per-connection rate");
  // Tolerate the last ulp so that an exact multiple does not round up to one more.
  double n = target_bytes_per_s / per_connection_cap;
  return static_cast<int64_t>(std::ceil(n * (1 - 1e-12)));
}

int64_t links_needed(double bytes, double link_bytes_per_s, double seconds) {
  require_positive(bytes, "bytes");
  require_positive(link_bytes_per_s, "link rate");
  require_positive(seconds, "time");
  return connections_needed(bytes / seconds, link_bytes_per_s);
}

double bytes_per_value(int bits, int64_t block, double scale_bytes) {
  switch (bits) {
    case 32: return 4.0;
    case 16: return 2.0;
    case 8:
    case 4:
    case 2:
    case 1: break;
    default: throw InputError(fmt::format("bits: got {}, expected one of 32 | 16 | 8 | 4 | 2 | 1", bits));
  }
  if (block < 1) throw InputError(fmt::format("quantization block: got {}, expected >= 1", block));
  if (!(scale_bytes >= 0 && std::isfinite(scale_bytes)))
    throw InputError(fmt::format("scale bytes: got {}, expected >= 0", scale_bytes));
  return bits / 8.0 + scale_bytes / static_cast<double>(block);
}

double slow_start_transfer_s(double bytes, double rate, double rtt_s, double initial_window) {
  require_positive(rate, "rate");
  require_positive(rtt_s, "rtt");
  require_positive(initial_window, "initial window");
  if (bytes <= 0) return 0.0;
  // Each round trip while the window is below the bandwidth-delay product sends one window
  // and then waits for its ACKs; once a window covers rate*rtt the flow is rate-limited.
  const double steady_window = rate * rtt_s;
  double t = 0, left = bytes, w = initial_window;
  while (w < steady_window) {
    if (left <= w) return t + left / rate;
    left -= w;
    t += rtt_s;
    w *= 2;
  }
  return t + left / rate;
}

}  // namespace geoloco::planner
