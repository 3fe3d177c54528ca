// Human-friendly counts for planner inputs: "1T" parameters, "124M", "6MiB" buffers.
#pragma once

#include <string>
#include <string_view>

namespace geoloco::planner {

// A non-negative count with an optional decimal suffix K/M/B|G/T (1e3..1e12) or binary
// suffix KiB/MiB/GiB/TiB (2^10..2^40); a plain number (1.5e12) works too.
// InputError naming `what` and the text when it does not parse or is negative.
double parse_count(std::string_view text, std::string_view what);

// "2.00 TB", "629 Mbit/s", "1.00 ms": engineering notation for the tables.
std::string format_bytes(double bytes);
std::string format_rate_bits(double bytes_per_s);
std::string format_seconds(double s);
std::string format_count(double n);  // 1e12 -> "1.00T"

}  // namespace geoloco::planner
