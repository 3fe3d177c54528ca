#include "trainer/data/text_source.hpp"

#include <fmt/format.h>

#include "trainer/core/error.hpp"
#include "trainer/data/mapped_file.hpp"

namespace geoloco::trainer {

namespace {

class TextStream final : public TokenStream {
 public:
  explicit TextStream(const std::string& path) : file_(path) {}
  uint64_t size() const override { return file_.size(); }
  int vocab_size() const override { return kByteVocab; }
  void read(uint64_t begin, size_t count, int32_t* out) const override {
    GEOLOCO_CHECK(begin <= size() && count <= size() - begin, "read [{}, +{}) past {} bytes of {}", begin, count,
                  size(), file_.path());
    const uint8_t* p = file_.bytes().data() + begin;
    for (size_t i = 0; i < count; ++i) out[i] = p[i];
  }
  std::string describe() const override { return fmt::format("text {} ({} bytes)", file_.path(), size()); }

 private:
  MappedFile file_;
};

}  // namespace

std::shared_ptr<const TokenStream> open_text_stream(const std::string& path) {
  return std::make_shared<TextStream>(path);
}

}  // namespace geoloco::trainer
