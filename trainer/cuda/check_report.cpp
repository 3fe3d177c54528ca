#include "trainer/cuda/check_report.hpp"

#include <charconv>

#include "trainer/core/error.hpp"

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

}  // namespace geoloco::cuda
