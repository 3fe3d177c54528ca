// geoloco_gpu_report: writes tools/gpu_check.sh's report.json.
//   geoloco_gpu_report --out report.json --gpu "<name>" [--parity p.json] [--bench b.json]
//                      --step name:rc:seconds ...
// Exit 0 when the report says ok, 1 when it does not, 2 for bad arguments.
#include <CLI/CLI.hpp>

#include <fstream>
#include <iostream>
#include <sstream>

#include "trainer/cuda/check_report.hpp"

namespace {
std::string slurp(const std::string& path) {
  if (path.empty()) return {};
  std::ifstream f(path, std::ios::binary);
  if (!f) return {};
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"assemble the GPU check report"};
  std::string out, gpu, parity, bench;
  std::vector<std::string> steps;
  app.add_option("--out", out, "report path")->required();
  app.add_option("--gpu", gpu, "GPU name");
  app.add_option("--parity", parity, "parity JSON path");
  app.add_option("--bench", bench, "bench JSON path");
  app.add_option("--step", steps, "name:rc:seconds");
  CLI11_PARSE(app, argc, argv);
  try {
    std::vector<geoloco::cuda::CheckStep> parsed;
    for (const auto& s : steps) parsed.push_back(geoloco::cuda::parse_check_step(s));
    const auto report = geoloco::cuda::assemble_check_report(parsed, gpu, slurp(parity), slurp(bench));
    std::ofstream f(out);
    f << report.dump(2) << "\n";
    if (!f) {
      std::cerr << "cannot write " << out << "\n";
      return 1;
    }
    std::cout << geoloco::cuda::summarize_check_report(report);
    return report["ok"].get<bool>() ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
}
