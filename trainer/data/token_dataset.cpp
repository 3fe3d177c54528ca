#include "trainer/data/token_dataset.hpp"

#include <fmt/format.h>

#include "core/error.hpp"

namespace geoloco::trainer {

StreamDataset::StreamDataset(std::shared_ptr<const TokenStream> stream, uint64_t begin, uint64_t end)
    : stream_(std::move(stream)), begin_(begin), end_(end) {
  GEOLOCO_CHECK(stream_ != nullptr, "null stream");
  GEOLOCO_CHECK(begin_ <= end_ && end_ <= stream_->size(), "range [{}, {}) outside a stream of {} tokens", begin_, end_,
                stream_->size());
}

StreamDataset::StreamDataset(std::shared_ptr<const TokenStream> stream)
    : StreamDataset(stream, 0, stream ? stream->size() : 0) {}

size_t StreamDataset::num_windows(int T) const {
  GEOLOCO_CHECK(T >= 1, "window length T={} must be >= 1", T);
  const uint64_t n = num_tokens();
  return n == 0 ? 0 : static_cast<size_t>((n - 1) / static_cast<uint64_t>(T));
}

void StreamDataset::window(size_t index, int T, int32_t* out) const {
  const size_t n = num_windows(T);
  GEOLOCO_CHECK(index < n, "window {} out of range ({} windows of T={})", index, n, T);
  stream_->read(begin_ + static_cast<uint64_t>(index) * static_cast<uint64_t>(T), static_cast<size_t>(T) + 1, out);
}

void TokenDataset::window_shifted(size_t, int, int, int32_t*) const {
  throw Error(fmt::format("{}: windows cannot be shifted (not a token stream)", describe()));
}

void StreamDataset::window_shifted(size_t index, int T, int shift, int32_t* out) const {
  const size_t n = num_windows(T);
  GEOLOCO_CHECK(index + 1 < n, "shifted window {} out of range ({} windows of T={})", index, n, T);
  GEOLOCO_CHECK(shift >= 0 && shift < T, "window shift {} outside [0, {})", shift, T);
  stream_->read(begin_ + static_cast<uint64_t>(index) * static_cast<uint64_t>(T) + static_cast<uint64_t>(shift),
                static_cast<size_t>(T) + 1, out);
}

std::string StreamDataset::describe() const {
  return fmt::format("{} tokens [{}, {})", stream_->describe(), begin_, end_);
}

}  // namespace geoloco::trainer
