// Helpers shared by the loop tests: temporary directories and small configs.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace geoloco::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "geoloco_test_XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name, const std::string& content) const {
    auto p = path_ / name;
    std::ofstream(p) << content;
    return p.string();
  }

 private:
  std::filesystem::path path_;
};

// A small synthetic-data run: 2 layers, d 32, context 16.
inline std::string tiny_config(const std::filesystem::path& out, const std::string& extra_train = "",
                               const std::string& extra = "") {
  return "run: {name: t, seed: 11, output_dir: " + out.string() + "}\n"
         "model: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 32}\n"
         "data:\n  train: {kind: synthetic, vocab: 32, branching: 3, seed: 5, tokens: 200000}\n"
         "train:\n  steps: 20\n  micro_batch: 4\n  grad_accum: 2\n  log_every: 5\n"
         "  optimizer: {lr: 3.0e-3}\n  schedule: {kind: cosine, warmup_steps: 3}\n" +
         extra_train + extra;
}

}  // namespace geoloco::testing
