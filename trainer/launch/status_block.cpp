// The terminal status view: one line per site formatted from its rank 0's reports, redrawn
// below the ranks' output (status_block.hpp).
#include "trainer/launch/status_block.hpp"

#include <fmt/format.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "core/fd.hpp"
#include "trainer/launch/line_prefixer.hpp"

namespace geoloco::launch {
namespace {

double num(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : NAN;
}

std::string duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto t = static_cast<int64_t>(std::llround(s));
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

std::string rate(double v) {
  if (!std::isfinite(v)) return "?";
  if (v >= 1e6) return fmt::format("{:.2f}M", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.1f}k", v / 1e3);
  return fmt::format("{:.0f}", v);
}

// The first `width` code points of UTF-8 text (site names may be UTF-8; the rest is ASCII).
std::string truncate_columns(const std::string& s, size_t width) {
  size_t cols = 0, i = 0;
  for (; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if ((c & 0xC0) != 0x80) {
      if (cols == width) break;
      ++cols;
    }
  }
  return s.substr(0, i);
}

}  // namespace

StatusBlock::StatusBlock(int fd, std::vector<std::string> sites) : fd_(fd), sites_(std::move(sites)) {
  for (const auto& s : sites_) name_width_ = std::max(name_width_, s.size());
}

std::string StatusBlock::format_line(const std::string& site, size_t name_width, const nlohmann::json& s,
                                     size_t width) {
  std::string line = fmt::format("{:<{}}  ", site, name_width);
  if (s.is_null()) return truncate_columns(line + "starting...", width);
  const double step = num(s, "step"), steps = num(s, "steps");
  const double frac = steps > 0 && std::isfinite(step) ? std::clamp(step / steps, 0.0, 1.0) : 0.0;
  constexpr int kBar = 16;
  const int full = static_cast<int>(std::floor(frac * kBar));
  std::string bar = "[";
  for (int i = 0; i < kBar; ++i) bar += i < full ? "#" : "-";
  bar += "]";
  line += fmt::format("step {:.0f}/{:.0f} {} {:3.0f}%", step, steps, bar, 100.0 * frac);
  if (std::isfinite(num(s, "loss"))) line += fmt::format("  loss {:.4f}", num(s, "loss"));
  if (std::isfinite(num(s, "val_loss"))) line += fmt::format(" (val {:.4f})", num(s, "val_loss"));
  line += fmt::format("  {} tok/s", rate(num(s, "tokens_per_s")));
  const double elapsed = num(s, "elapsed_s");
  if (s.value("done", false)) {
    line += fmt::format("  done in {}", duration(elapsed));
  } else if (std::isfinite(elapsed) && step > 0 && steps > step) {
    line += fmt::format("  ETA {}", duration(elapsed / step * (steps - step)));
  }
  if (std::isfinite(num(s, "sync_s")))
    line += fmt::format("  sync {:.2f}s (wait {:.2f}s)", num(s, "sync_s"),
                        std::isfinite(num(s, "exposed_wait_s")) ? num(s, "exposed_wait_s") : 0.0);
  if (std::isfinite(num(s, "compute_utilization")))
    line += fmt::format("  util {:.1f}%", 100.0 * num(s, "compute_utilization"));
  if (std::isfinite(num(s, "members")) && std::isfinite(num(s, "sites")))
    line += fmt::format("  sites {:.0f}/{:.0f}", num(s, "members"), num(s, "sites"));
  return truncate_columns(line, width);
}

int StatusBlock::width() const {
  winsize ws{};
  if (::ioctl(fd_, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 120;
}

std::string StatusBlock::erase_sequence() const {
  // Cursor to the block's first line, then clear to the end of the screen.
  if (drawn_ == 0) return "";
  return fmt::format("\r\x1b[{}A\x1b[J", drawn_);
}

void StatusBlock::draw() {
  std::string out = erase_sequence();
  // One column short of the width: a line that fills the last column would wrap on some
  // terminals and push the block down a line.
  const size_t w = static_cast<size_t>(std::max(20, width() - 1));
  for (const auto& site : sites_) {
    auto it = latest_.find(site);
    out += format_line(site, name_width_, it == latest_.end() ? nlohmann::json() : it->second, w) + "\n";
  }
  drawn_ = sites_.size();
  (void)write_all(fd_, out.data(), out.size());
  last_draw_ = std::chrono::steady_clock::now();
}

void StatusBlock::update(const nlohmann::json& status) {
  if (finished_ || !status.is_object() || !status.contains("site") || !status["site"].is_string()) return;
  latest_[status["site"].get<std::string>()] = status;
  const auto now = std::chrono::steady_clock::now();
  if (drawn_ == 0 || status.value("done", false) || now - last_draw_ >= std::chrono::milliseconds(100)) draw();
}

void StatusBlock::print(const std::string& lines) {
  if (finished_) {
    (void)write_all(fd_, lines.data(), lines.size());
    return;
  }
  std::string out = erase_sequence() + lines;
  drawn_ = 0;
  (void)write_all(fd_, out.data(), out.size());
  draw();
}

void StatusBlock::finish() {
  if (finished_) return;
  const std::string out = erase_sequence();
  (void)write_all(fd_, out.data(), out.size());
  drawn_ = 0;
  finished_ = true;
}

}  // namespace geoloco::launch
