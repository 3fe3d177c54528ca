#include "trainer/cuda/check_report.hpp"

#include <charconv>
#include <cmath>

#include "core/error.hpp"

namespace geoloco::cuda {

CheckStep parse_check_step(std::string_view text) {
  const auto bad = [&](const char* why) {
    return InputError(fmt::format("step '{}' is malformed ({}): expected name:rc:seconds", text, why));
  };
  const size_t a = text.find(':');
  const size_t b = a == std::string_view::npos ? a : text.find(':', a + 1);
  if (a == std::string_view::npos || b == std::string_view::npos) throw bad("needs two ':'");
  CheckStep s;
  s.name = std::string(text.substr(0, a));
  if (s.name.empty()) throw bad("empty name");
  const std::string_view rc = text.substr(a + 1, b - a - 1), sec = text.substr(b + 1);
  auto r1 = std::from_chars(rc.data(), rc.data() + rc.size(), s.rc);
  if (rc.empty() || r1.ec != std::errc() || r1.ptr != rc.data() + rc.size()) throw bad("rc is not an integer");
  try {
    size_t used = 0;
    s.seconds = std::stod(std::string(sec), &used);
    if (used != sec.size() || s.seconds < 0) throw bad("seconds is not a non-negative number");
  } catch (const std::logic_error&) {
    throw bad("seconds is not a number");
  }
  return s;
}

namespace {
nlohmann::json parse_doc(std::string_view text, const char* what, std::vector<std::string>& problems) {
  if (text.empty()) {
    problems.push_back(fmt::format("{} document missing", what));
    return nullptr;
  }
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    problems.push_back(fmt::format("{} document is not a JSON object", what));
    return nullptr;
  }
  return j;
}
}  // namespace

nlohmann::json assemble_check_report(const std::vector<CheckStep>& steps, std::string_view gpu,
                                     std::string_view parity_text, std::string_view bench_text) {
  std::vector<std::string> problems;
  nlohmann::json jsteps = nlohmann::json::array();
  double total = 0;
  for (const auto& s : steps) {
    jsteps.push_back({{"name", s.name}, {"rc", s.rc}, {"seconds", s.seconds}});
    total += s.seconds;
    if (s.rc != 0) problems.push_back(fmt::format("step {} exited {}", s.name, s.rc));
  }
  if (steps.empty()) problems.push_back("no steps ran");
  nlohmann::json parity = parse_doc(parity_text, "parity", problems);
  if (parity.is_object() && !(parity.contains("ok") && parity["ok"].is_boolean() && parity["ok"].get<bool>()))
    problems.push_back("parity document does not say ok: true");
  nlohmann::json bench = parse_doc(bench_text, "bench", problems);
  nlohmann::json r;
  r["magic"] = "geoloco-gpu-check";
  r["version"] = 1;
  r["ok"] = problems.empty();
  r["gpu"] = std::string(gpu);
  r["steps"] = std::move(jsteps);
  r["total_seconds"] = total;
  r["parity"] = std::move(parity);
  r["bench"] = std::move(bench);
  r["problems"] = problems;
  return r;
}

namespace {
// j[key] as a number, or NaN when absent or not a number.
double number(const nlohmann::json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_number() ? j[key].get<double>() : std::nan("");
}
std::string text(const nlohmann::json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string("?");
}
}  // namespace

std::string summarize_check_report(const nlohmann::json& r, int top_ops) {
  std::string out = fmt::format("gpu check: {}\n", r.value("ok", false) ? "ok" : "FAILED");
  out += fmt::format("  gpu: {}\n", text(r, "gpu"));
  if (r.contains("steps") && r["steps"].is_array()) {
    std::string steps;
    for (const auto& s : r["steps"])
      steps += fmt::format("{}{} rc {} ({:.1f} s)", steps.empty() ? "" : ", ", text(s, "name"), s.value("rc", -1),
                           number(s, "seconds"));
    out += fmt::format("  steps: {}\n", steps.empty() ? "none" : steps);
  }
  const nlohmann::json& b = r.contains("bench") ? r["bench"] : nlohmann::json();
  if (b.is_object()) {
    out += fmt::format(
        "  bench: {:.1f}k tokens/s (B {}, {}, {} attention), step {:.2f} ms, {:.1f} TFLOP/s, MFU {:.3f}, "
        "{:.3f}x the peer ({:.0f}k tokens/s)\n",
        number(b, "tokens_per_s") / 1e3, b.value("batch", 0), text(b, "precision"), text(b, "attention"),
        number(b, "step_ms"), number(b, "achieved_tflops"), number(b, "mfu"), number(b, "ratio"),
        b.contains("peer") ? number(b["peer"], "tokens_per_s") / 1e3 : std::nan(""));
    if (b.contains("op_profile") && b["op_profile"].is_object() && b["op_profile"].contains("ops") &&
        b["op_profile"]["ops"].is_array()) {
      const auto& ops = b["op_profile"]["ops"];
      out +=
          fmt::format("  ops of one profiled step ({:.2f} ms of device time):\n", number(b["op_profile"], "total_ms"));
      int shown = 0;
      for (const auto& o : ops) {
        if (shown++ == top_ops) {
          out += fmt::format("    ... {} more\n", ops.size() - size_t(top_ops));
          break;
        }
        out += fmt::format("    {:<20} {:9.3f} ms {:6.1f}%  x{}\n", text(o, "op"), number(o, "ms"),
                           100.0 * number(o, "share"), o.value("calls", 0));
      }
    }
  } else {
    out += "  bench: none\n";
  }
  if (r.contains("problems") && r["problems"].is_array())
    for (const auto& p : r["problems"])
      out += fmt::format("  problem: {}\n", p.is_string() ? p.get<std::string>() : p.dump());
  return out;
}

}  // namespace geoloco::cuda
