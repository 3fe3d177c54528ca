// TokenDataset: what the training loop samples from -- a finite, random-access list of
// "windows" of T+1 tokens (T inputs, and the same tokens shifted by one as targets).
//
// Window i of a stream of n tokens is tokens [i*T, i*T + T] (inclusive): windows start
// every T tokens and overlap by exactly one token, so every token is a target exactly once
// (except the first) and num_windows(T) = (n - 1) / T. This is the llm.c / nanoGPT
// convention for non-overlapping training chunks.
//
// Implementations are immutable after construction: window() is const and thread-safe,
// so several ranks (threads) may share one dataset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace geoloco::trainer {

class TokenDataset {
 public:
  virtual ~TokenDataset() = default;
  // Every token this dataset yields is in [0, vocab_size()).
  virtual int vocab_size() const = 0;
  // Number of windows of T+1 tokens (T >= 1).
  virtual size_t num_windows(int T) const = 0;
  // Writes the T+1 tokens of window `index` (< num_windows(T)) to out[0..T].
  // Throws geoloco::Error on an out-of-range index (a caller bug, not bad input).
  virtual void window(size_t index, int T, int32_t* out) const = 0;
  // Whether window_shifted() works: windows are cut from one token stream.
  virtual bool shiftable() const { return false; }
  // The T+1 tokens starting `shift` (in [0, T)) tokens after window `index`'s start; `index`
  // < num_windows(T) - 1, so every shift stays inside the data. Throws geoloco::Error when
  // the dataset is not shiftable() or the index or shift is out of range.
  virtual void window_shifted(size_t index, int T, int shift, int32_t* out) const;
  // One line for logs: kind, files, token count.
  virtual std::string describe() const = 0;
};

// A contiguous token stream (a text file's bytes, the concatenation of llm.c shards).
class TokenStream {
 public:
  virtual ~TokenStream() = default;
  virtual uint64_t size() const = 0;
  virtual int vocab_size() const = 0;
  // Copies tokens [begin, begin + count) to out; requires begin + count <= size().
  virtual void read(uint64_t begin, size_t count, int32_t* out) const = 0;
  virtual std::string describe() const = 0;
};

// The windows of tokens [begin, end) of a stream. Train/validation hold-out splits are two
// StreamDatasets over one stream with disjoint ranges.
class StreamDataset final : public TokenDataset {
 public:
  StreamDataset(std::shared_ptr<const TokenStream> stream, uint64_t begin, uint64_t end);
  explicit StreamDataset(std::shared_ptr<const TokenStream> stream);

  int vocab_size() const override { return stream_->vocab_size(); }
  size_t num_windows(int T) const override;
  void window(size_t index, int T, int32_t* out) const override;
  bool shiftable() const override { return true; }
  void window_shifted(size_t index, int T, int shift, int32_t* out) const override;
  std::string describe() const override;

  uint64_t begin() const { return begin_; }
  uint64_t end() const { return end_; }
  uint64_t num_tokens() const { return end_ - begin_; }

 private:
  std::shared_ptr<const TokenStream> stream_;
  uint64_t begin_, end_;
};

}  // namespace geoloco::trainer
