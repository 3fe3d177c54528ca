// Physics pins: fiber delay, the 1T-parameter sync, TCP's window/RTT ceiling, codec bytes.
#include <gtest/gtest.h>

#include "planner/physics.hpp"
#include "planner/quantity.hpp"
#include "core/error.hpp"

using namespace geoloco::planner;
using geoloco::InputError;

TEST(Physics, FiberDelayIsFiveMicrosecondsPerKm) {
  // 100 km: 0.5 ms one way, 1 ms round trip; 500 km: 5 ms round trip.
  EXPECT_DOUBLE_EQ(fiber_one_way_s(100), 0.5e-3);
  EXPECT_DOUBLE_EQ(fiber_rtt_s(100), 1e-3);
  EXPECT_DOUBLE_EQ(fiber_rtt_s(500), 5e-3);
  EXPECT_DOUBLE_EQ(fiber_rtt_s(0), 0.0);
}

TEST(Physics, NegativeDistanceIsAnInputError) {
  try {
    fiber_rtt_s(-3);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "distance: got -3 km, expected a distance >= 0 km");
  }
}

TEST(Physics, OneTrillionBf16ParametersIsTwoTerabytesAndTwentySecondsOnOneLink) {
  const double bytes = 1e12 * bytes_per_value(16, 128, 4);
  EXPECT_DOUBLE_EQ(bytes, 2e12);
  const double link = gbit_to_bytes_per_s(800);
  EXPECT_DOUBLE_EQ(link, 100e9);
  EXPECT_DOUBLE_EQ(bytes / link, 20.0);
  // Tens to hundreds of parallel links: 1 s needs 20, 100 ms needs 200.
  EXPECT_EQ(links_needed(bytes, link, 1.0), 20);
  EXPECT_EQ(links_needed(bytes, link, 0.1), 200);
  EXPECT_EQ(links_needed(bytes, link, 0.099), 203);  // ceil(202.02)
}

TEST(Physics, BandwidthDelayCapMatchesTheMeasuredIperfFigure) {
  // Linux default tcp_rmem max 6 MiB, half of it window: 3 MiB per 40 ms round trip
  // = 629.1456 Mbit/s (ENVIRONMENT.md measured 630 Mbit/s with iperf3 at 40 ms).
  const double w = tcp_window_bytes(6291456, 0.5);
  EXPECT_DOUBLE_EQ(w, 3145728);
  const double cap = bdp_cap_bytes_per_s(w, 0.040);
  EXPECT_DOUBLE_EQ(bytes_per_s_to_gbit(cap), 3145728.0 * 8 / 0.040 / 1e9);
  EXPECT_NEAR(bytes_per_s_to_gbit(cap), 0.6291456, 1e-12);
  // Filling 1 Gbit/s at 40 ms takes 2 such connections, or a 10 MB rmem for one.
  EXPECT_EQ(connections_needed(gbit_to_bytes_per_s(1), cap), 2);
  EXPECT_DOUBLE_EQ(rmem_needed_bytes(gbit_to_bytes_per_s(1), 0.040, 0.5), 125e6 * 0.040 / 0.5);
  // Effective rate: min(link, n x cap).
  EXPECT_DOUBLE_EQ(effective_rate_bytes_per_s(gbit_to_bytes_per_s(1), 1, cap), cap);
  EXPECT_DOUBLE_EQ(effective_rate_bytes_per_s(gbit_to_bytes_per_s(1), 2, cap), 125e6);
}

TEST(Physics, ConnectionsNeededForExactMultiplesDoesNotRoundUp) {
  EXPECT_EQ(connections_needed(100, 25), 4);
  EXPECT_EQ(connections_needed(100.5, 25), 5);
  EXPECT_EQ(connections_needed(1, 25), 1);
}

TEST(Physics, BytesPerValueIncludesBlockScales) {
  EXPECT_DOUBLE_EQ(bytes_per_value(32, 128, 4), 4.0);
  EXPECT_DOUBLE_EQ(bytes_per_value(16, 128, 4), 2.0);
  EXPECT_DOUBLE_EQ(bytes_per_value(8, 128, 4), 1.0 + 4.0 / 128);
  EXPECT_DOUBLE_EQ(bytes_per_value(4, 128, 4), 0.5 + 4.0 / 128);
  EXPECT_DOUBLE_EQ(bytes_per_value(2, 64, 2), 0.25 + 2.0 / 64);
  EXPECT_THROW(bytes_per_value(3, 128, 4), InputError);
  EXPECT_THROW(bytes_per_value(4, 0, 4), InputError);
}

TEST(Physics, SlowStartDoublesTheWindowEachRoundTrip) {
  // rate 1e6 B/s, rtt 0.1 s -> steady window 1e5 B. Initial window 1e4: rounds carry
  // 1e4, 2e4, 4e4, 8e4 (>= 1e5? no: 8e4 < 1e5) then 16e4 >= 1e5 is steady.
  // 1e6 bytes: 4 ramp rounds carry 1.5e5 in 0.4 s, the remaining 8.5e5 take 0.85 s.
  EXPECT_DOUBLE_EQ(slow_start_transfer_s(1e6, 1e6, 0.1, 1e4), 0.4 + 0.85);
  // Fits in the second ramp round: 1 full round (1e4) + 5e3 at line rate.
  EXPECT_DOUBLE_EQ(slow_start_transfer_s(1.5e4, 1e6, 0.1, 1e4), 0.1 + 5e3 / 1e6);
  // Initial window already covers the BDP: no ramp.
  EXPECT_DOUBLE_EQ(slow_start_transfer_s(1e6, 1e6, 0.1, 2e5), 1.0);
}

TEST(Quantity, ParsesSuffixes) {
  EXPECT_DOUBLE_EQ(parse_count("1T", "params"), 1e12);
  EXPECT_DOUBLE_EQ(parse_count("124M", "params"), 124e6);
  EXPECT_DOUBLE_EQ(parse_count("1.5B", "params"), 1.5e9);
  EXPECT_DOUBLE_EQ(parse_count("6MiB", "rmem"), 6291456);
  EXPECT_DOUBLE_EQ(parse_count("2.5e9", "params"), 2.5e9);
  try {
    parse_count("12X", "params");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("params: got '12X'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_count("-5", "params"), InputError);
  EXPECT_THROW(parse_count("", "params"), InputError);
}
