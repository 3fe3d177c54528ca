// The native trainer's side of the outer loop's seam (native_site.hpp).
#include "trainer/loop/native_site.hpp"

#include <filesystem>

#include "core/atomic_file.hpp"

namespace geoloco::trainer {

NativeSite::NativeSite(SiteStrategy& strategy, TraceRecorder* trace, std::string output_dir)
    : strategy_(strategy), trace_(trace), output_dir_(std::move(output_dir)) {}

std::vector<std::vector<std::byte>> NativeSite::all_gather(std::span<const std::byte> mine) {
  auto* coll = strategy_.collective();
  if (!coll || strategy_.ranks() == 1) return {std::vector<std::byte>(mine.begin(), mine.end())};
  return coll->all_gather_bytes(mine);
}

void NativeSite::write_plans(const nlohmann::json& plans) {
  std::error_code ec;
  std::filesystem::create_directories(output_dir_, ec);
  write_text_atomically((std::filesystem::path(output_dir_) / "plan.json").string(), plans.dump(2) + "\n");
}

outer::ModelParams model_params(const ParamLayout& layout) {
  outer::ModelParams p;
  p.total = layout.total();
  for (const ParamView& v : layout.views()) {
    outer::ParamTensor t;
    t.name = v.name;
    t.offset = v.offset;
    t.rows = v.shape.size() >= 2 ? v.shape[0] : 1;
    t.cols = t.rows > 0 ? v.numel / t.rows : 0;
    t.block = v.block;
    p.tensors.push_back(std::move(t));
  }
  std::sort(p.tensors.begin(), p.tensors.end(),
            [](const outer::ParamTensor& a, const outer::ParamTensor& b) { return a.offset < b.offset; });
  return p;
}

}  // namespace geoloco::trainer
