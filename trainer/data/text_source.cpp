#include "trainer/data/text_source.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include "core/error.hpp"
#include "trainer/data/mapped_file.hpp"

namespace geoloco::trainer {

namespace {

// The bytes of one file, or of every regular file of a directory in sorted name order
// (symbolic links are skipped: Debian's license directory links GPL -> GPL-3 and so on,
// which would count the same text twice).
class TextStream final : public TokenStream {
 public:
  explicit TextStream(const std::string& path) : path_(path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
      std::vector<std::string> names;
      for (const auto& e : fs::directory_iterator(path, ec))
        if (!e.is_symlink() && e.is_regular_file()) names.push_back(e.path().string());
      if (ec) throw FileError(path, "cannot list directory: " + ec.message());
      std::sort(names.begin(), names.end());
      if (names.empty()) throw FileError(path, "directory has no regular files to read as text");
      for (auto& n : names) files_.emplace_back(n);
    } else {
      files_.emplace_back(path);
    }
    for (const auto& f : files_) {
      starts_.push_back(size_);
      size_ += f.size();
    }
  }
  uint64_t size() const override { return size_; }
  int vocab_size() const override { return kByteVocab; }
  void read(uint64_t begin, size_t count, int32_t* out) const override {
    GEOLOCO_CHECK(begin <= size() && count <= size() - begin, "read [{}, +{}) past {} bytes of {}", begin, count,
                  size(), path_);
    // The file holding `begin`, then onwards across file boundaries.
    size_t f = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), begin) - starts_.begin()) - 1;
    while (count > 0) {
      const auto bytes = files_[f].bytes();
      const uint64_t off = begin - starts_[f];
      const size_t n = static_cast<size_t>(std::min<uint64_t>(count, bytes.size() - off));
      for (size_t i = 0; i < n; ++i) out[i] = bytes[off + i];
      out += n;
      begin += n;
      count -= n;
      ++f;
    }
  }
  std::string describe() const override {
    if (files_.size() == 1) return fmt::format("text {} ({} bytes)", path_, size());
    return fmt::format("text {} ({} files, {} bytes)", path_, files_.size(), size());
  }

 private:
  std::string path_;
  std::vector<MappedFile> files_;
  std::vector<uint64_t> starts_;
  uint64_t size_ = 0;
};

}  // namespace

std::shared_ptr<const TokenStream> open_text_stream(const std::string& path) {
  return std::make_shared<TextStream>(path);
}

}  // namespace geoloco::trainer
