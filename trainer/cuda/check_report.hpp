// The report tools/gpu_check.sh writes: one JSON document that says in a glance whether the
// GPU run passed, what each step took, the per-op parity table and the benchmark figures.
// Assembled by plain host code (the geoloco_gpu_report tool) so it is tested without a GPU.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace geoloco::cuda {

struct CheckStep {
  std::string name;
  int rc = 0;
  double seconds = 0;
};

// "name:rc:seconds", e.g. "build:0:212.5". Throws InputError naming the text when malformed.
CheckStep parse_check_step(std::string_view text);

// Report schema (version 1):
//   {"magic":"geoloco-gpu-check","version":1,"ok":bool,"gpu":str,
//    "steps":[{"name","rc","seconds"}...],"total_seconds":x,
//    "parity":<parsed parity JSON or null>,"bench":<parsed bench JSON or null>,
//    "problems":[str...]}
// ok is true only when every step exited 0, the parity document is present with "ok": true,
// and the bench document is present. A missing or unparsable document is a problem, never
// an exception: the report must still be written when a step crashed.
nlohmann::json assemble_check_report(const std::vector<CheckStep>& steps, std::string_view gpu,
                                     std::string_view parity_text, std::string_view bench_text);

// The report in a few lines for a person (and for the last lines of a remote run's output):
// ok/FAILED, the GPU, each step's rc and seconds, the bench's tokens/s, step time, TFLOP/s,
// MFU and ratio to the peer, the `top_ops` most expensive ops of the profiled step (ms, share,
// calls), and every problem. Fields the report lacks are skipped, never an error.
std::string summarize_check_report(const nlohmann::json& report, int top_ops = 12);

}  // namespace geoloco::cuda
