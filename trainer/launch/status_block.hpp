// StatusBlock: `geoloco launch` on a terminal -- one status line per site, redrawn in place
// at the bottom of the screen (step/total, loss, tokens/s, ETA, last sync and its cost,
// utilization, sites in the round), while the ranks' log lines (warnings and errors in full)
// scroll above it. Each site's rank 0 reports through a pipe (GEOLOCO_STATUS_FD, one JSON
// object per line); finish() erases the block so the screen is left clean.
#pragma once

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace geoloco::launch {

class StatusBlock {
 public:
  // `sites` in config order (one line each); output goes to `fd` (a terminal).
  StatusBlock(int fd, std::vector<std::string> sites);
  // A site's latest status (a JSON object from its rank 0). Redraws at most 10 times a second.
  void update(const nlohmann::json& status);
  // Writes whole log lines above the block (the block is erased, the lines written, the
  // block drawn again).
  void print(const std::string& lines);
  // Erases the block; nothing is drawn afterwards.
  void finish();
  // One site's line as drawn, `width` columns at most (exposed for tests).
  static std::string format_line(const std::string& site, size_t name_width, const nlohmann::json& s, size_t width);

 private:
  void draw();
  std::string erase_sequence() const;
  int width() const;

  int fd_;
  std::vector<std::string> sites_;
  size_t name_width_ = 0;
  std::map<std::string, nlohmann::json> latest_;
  size_t drawn_ = 0;  // lines of the block on screen now
  bool finished_ = false;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace geoloco::launch
