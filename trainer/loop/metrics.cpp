// metrics.jsonl lines and the terminal's progress line (metrics.hpp).
#include "trainer/loop/metrics.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "core/atomic_file.hpp"
#include "core/error.hpp"

namespace geoloco::trainer {

MetricsWriter::MetricsWriter(std::string path, bool append) : path_(std::move(path)) {
  f_ = std::fopen(path_.c_str(), append ? "a" : "w");
  if (!f_) throw FileError(path_, fmt::format("cannot open for writing: {}", std::strerror(errno)));
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

void MetricsWriter::write(const nlohmann::json& line) {
  // NaN is not JSON: write null.
  std::string s = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  s.push_back('\n');
  if (std::fwrite(s.data(), 1, s.size(), f_) != s.size() || std::fflush(f_) != 0)
    throw Error(fmt::format("{}: write failed: {}", path_, std::strerror(errno)));
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  if (s < 60) return fmt::format("{:.1f}s", s);
  const int64_t t = static_cast<int64_t>(s + 0.5);
  if (t < 3600) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return fmt::format("{}h{:02d}m", t / 3600, (t % 3600) / 60);
}

std::string format_rate(double v) {
  if (v >= 1e6) return fmt::format("{:.2f}M", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.1f}k", v / 1e3);
  return fmt::format("{:.0f}", v);
}

ProgressLine::ProgressLine(bool enabled, int64_t total_steps)
    : tty_(isatty(STDERR_FILENO) == 1), enabled_(enabled), total_(total_steps) {}

void ProgressLine::update(int64_t step, double loss, double tps, double elapsed, double val_loss) {
  if (!enabled_) return;
  if (first_step_ < 0) {
    first_step_ = step;
    first_elapsed_ = elapsed;
  }
  double eta = NAN;
  if (step > first_step_) eta = (elapsed - first_elapsed_) / double(step - first_step_) * double(total_ - step);
  std::string line = fmt::format("step {}/{} | loss {:.4f}", step, total_, loss);
  if (std::isfinite(val_loss)) line += fmt::format(" | val {:.4f}", val_loss);
  line += fmt::format(" | {} tok/s | elapsed {} | ETA {}", format_rate(tps), format_duration(elapsed),
                      step >= total_ ? "0s" : format_duration(eta));
  if (tty_) {
    fmt::print(stderr, "\r\033[K{}", line);
    dirty_ = true;
  } else {
    fmt::print(stderr, "{}\n", line);
  }
  std::fflush(stderr);
}

void ProgressLine::clear() {
  if (tty_ && dirty_) {
    fmt::print(stderr, "\r\033[K");
    dirty_ = false;
  }
}

void ProgressLine::finish() {
  if (tty_ && dirty_) fmt::print(stderr, "\n");
  dirty_ = false;
}

}  // namespace geoloco::trainer
