#include "planner/quantity.hpp"

#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "core/error.hpp"

namespace geoloco::planner {
namespace {

struct Suffix {
  const char* text;
  double factor;
};

constexpr Suffix kSuffixes[] = {
    {"KiB", 1024.0},
    {"MiB", 1048576.0},
    {"GiB", 1073741824.0},
    {"TiB", 1099511627776.0},
    {"K", 1e3},
    {"k", 1e3},
    {"M", 1e6},
    {"B", 1e9},
    {"G", 1e9},
    {"T", 1e12},
};

std::string scaled(double v, const char* const* units, int n_units, double step, const char* fmt_spec) {
  int i = 0;
  double a = std::fabs(v);
  while (i + 1 < n_units && a >= step) {
    a /= step;
    v /= step;
    ++i;
  }
  return fmt::format(fmt::runtime(fmt_spec), v, units[i]);
}

}  // namespace

double parse_count(std::string_view text, std::string_view what) {
  std::string s(text);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  double factor = 1.0;
  for (const auto& suf : kSuffixes) {
    std::string_view t(suf.text);
    if (s.size() > t.size() && std::string_view(s).substr(s.size() - t.size()) == t) {
      factor = suf.factor;
      s.resize(s.size() - t.size());
      break;
    }
  }
  char* end = nullptr;
  errno = 0;
  double v = s.empty() ? 0 : std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || errno != 0 || !std::isfinite(v) || v < 0)
    throw InputError(
        fmt::format("{}: got '{}', expected a non-negative number with an optional "
                    "suffix K, M, B|G, T, KiB, MiB, GiB, TiB",
                    what, text));
  return v * factor;
}

std::string format_bytes(double bytes) {
  static const char* const units[] = {"B", "kB", "MB", "GB", "TB", "PB"};
  return scaled(bytes, units, 6, 1000.0, "{:.3g} {}");
}

std::string format_rate_bits(double bytes_per_s) {
  static const char* const units[] = {"bit/s", "kbit/s", "Mbit/s", "Gbit/s", "Tbit/s", "Pbit/s"};
  return scaled(bytes_per_s * 8.0, units, 6, 1000.0, "{:.3g} {}");
}

std::string format_seconds(double s) {
  if (s == 0) return "0 s";
  double a = std::fabs(s);
  if (a < 1e-3) return fmt::format("{:.3g} us", s * 1e6);
  if (a < 1.0) return fmt::format("{:.3g} ms", s * 1e3);
  if (a < 120.0) return fmt::format("{:.3g} s", s);
  if (a < 7200.0) return fmt::format("{:.3g} min", s / 60);
  return fmt::format("{:.3g} h", s / 3600);
}

std::string format_count(double n) {
  static const char* const units[] = {"", "K", "M", "B", "T"};
  return scaled(n, units, 5, 1000.0, "{:.3g}{}");
}

}  // namespace geoloco::planner
