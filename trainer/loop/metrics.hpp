// Run outputs: metrics.jsonl lines (flushed per line, so a crash loses at most the line
// being written) and the live progress line on a terminal. (Atomic text files: core/atomic_file.hpp.)
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace geoloco::trainer {

class MetricsWriter {
 public:
  // Truncates unless `append` (resume). Throws FileError when the file can't be opened.
  MetricsWriter(std::string path, bool append);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void write(const nlohmann::json& line);

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

// On a terminal: one line rewritten in place ("step 120/2000 | loss 2.345 | 45.2k tok/s |
// ETA 1m23s"). Otherwise: a plain line per update.
class ProgressLine {
 public:
  ProgressLine(bool enabled, int64_t total_steps);
  void update(int64_t step, double loss, double tokens_per_s, double elapsed_s, double val_loss);
  void clear();   // before another message is printed
  void finish();  // end the line

 private:
  bool tty_;
  bool enabled_;
  int64_t total_;
  bool dirty_ = false;
  int64_t first_step_ = -1;
  double first_elapsed_ = 0;
};

std::string format_duration(double seconds);  // "1h02m", "3m05s", "12.3s"
std::string format_rate(double per_s);        // "45.2k"

}  // namespace geoloco::trainer
