#include "transport/probe/tcp_counters.hpp"

#include <charconv>
#include <fstream>
#include <sstream>
#include <vector>

namespace geoloco::probe {

namespace {

std::vector<std::string> words(const std::string& line) {
  std::istringstream ss(line);
  std::vector<std::string> out;
  for (std::string w; ss >> w;) out.push_back(w);
  return out;
}

}  // namespace

std::optional<TcpCounters> parse_snmp(const std::string& text) {
  std::istringstream ss(text);
  std::vector<std::string> names, values;
  for (std::string line; std::getline(ss, line);) {
    auto w = words(line);
    if (w.empty() || w[0] != "Tcp:") continue;
    if (names.empty()) {
      names = w;
    } else {
      values = w;
      break;
    }
  }
  if (names.empty() || values.size() != names.size()) return std::nullopt;
  std::optional<uint64_t> out, re;
  for (size_t i = 1; i < names.size(); ++i) {
    if (names[i] != "OutSegs" && names[i] != "RetransSegs") continue;
    uint64_t v = 0;
    const std::string& s = values[i];
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
    (names[i] == "OutSegs" ? out : re) = v;
  }
  if (!out || !re) return std::nullopt;
  return TcpCounters{*out, *re};
}

std::optional<TcpCounters> read_tcp_counters(const std::string& path) {
  std::ifstream f(path);
  if (!f) return std::nullopt;
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_snmp(ss.str());
}

}  // namespace geoloco::probe
