// geoloco::planner physics: the few closed-form facts every plan rests on -- light in fiber,
// TCP's window/RTT ceiling, the bytes a codec puts on the wire, slow start. Pure functions,
// SI units throughout (seconds, bytes, bytes/s); "Gbit/s" and "GB/s" are decimal (1e9).
#pragma once

#include <cstdint>

namespace geoloco::planner {

// Light in silica fiber travels at ~c/1.47 ~= 204,000 km/s: ~5 us per km one way (the usual
// planning figure; real routes add detours and equipment, which a measured RTT captures).
inline constexpr double kFiberSecondsPerKm = 5e-6;

inline constexpr double kGiga = 1e9;
inline constexpr double kBitsPerByte = 8.0;

// One-way propagation delay over `km` of fiber. InputError if km is negative or not finite.
double fiber_one_way_s(double km);
// Round trip: twice the one-way delay.
double fiber_rtt_s(double km);

// Gbit/s -> bytes/s (800 Gbit/s = 100e9 B/s).
constexpr double gbit_to_bytes_per_s(double gbit_per_s) { return gbit_per_s * kGiga / kBitsPerByte; }
constexpr double bytes_per_s_to_gbit(double bytes_per_s) { return bytes_per_s * kBitsPerByte / kGiga; }

// The TCP receive window a socket actually advertises: Linux keeps part of the receive
// buffer for skb overhead, so with tcp_adv_win_scale=1 only half of tcp_rmem's max becomes
// window (6 MiB max -> 3 MiB window: 629 Mbit/s at 40 ms, which ENVIRONMENT.md measured as
// 630 Mbit/s with iperf3).
double tcp_window_bytes(double rmem_max_bytes, double window_fraction);

// Bandwidth-delay cap of one connection: at most one window in flight per round trip.
double bdp_cap_bytes_per_s(double window_bytes, double rtt_s);

// Receive buffer (tcp_rmem max) one connection needs to carry `rate` bytes/s at `rtt_s`.
double rmem_needed_bytes(double rate_bytes_per_s, double rtt_s, double window_fraction);

// Effective aggregate rate of `connections` parallel connections, each capped by its
// window/RTT, sharing a link of `link_bytes_per_s`: min(link, connections * window / RTT).
double effective_rate_bytes_per_s(double link_bytes_per_s, int64_t connections, double per_connection_cap);

// Connections needed so that connections * per_connection_cap >= target rate.
int64_t connections_needed(double target_bytes_per_s, double per_connection_cap);

// Parallel links of `link_bytes_per_s` needed to move `bytes` in `seconds`.
int64_t links_needed(double bytes, double link_bytes_per_s, double seconds);

// Bytes per value a codec puts on the wire. bits in {32, 16, 8, 4, 2, 1}; below 16 bits
// blockwise quantization adds one scale of `scale_bytes` per `block` values.
double bytes_per_value(int bits, int64_t block, double scale_bytes);

// Time to push `bytes` through one connection whose steady rate is `rate` (bytes/s), when
// its congestion window starts at `initial_window` bytes and doubles every RTT (slow start,
// e.g. after idle with net.ipv4.tcp_slow_start_after_idle=1) until a window carries `rate`.
// Excludes the one-way propagation of the last byte (counted by the caller's latency term).
double slow_start_transfer_s(double bytes, double rate, double rtt_s, double initial_window);

}  // namespace geoloco::planner
