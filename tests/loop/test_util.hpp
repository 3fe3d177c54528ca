// Helpers shared by the loop tests: small configs (temporary directories, ports and rank
// threads are tests/support's).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "tests/support/temp_dir.hpp"

namespace geoloco::testing {

// A small synthetic-data run: 2 layers, d 32, context 16.
inline std::string tiny_config(const std::filesystem::path& out, const std::string& extra_train = "",
                               const std::string& extra = "") {
  return "run: {name: t, seed: 11, output_dir: " + out.string() +
         "}\n"
         "model: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 32}\n"
         "data:\n  train: {kind: synthetic, vocab: 32, branching: 3, seed: 5, tokens: 200000}\n"
         "train:\n  steps: 20\n  micro_batch: 4\n  grad_accum: 2\n  log_every: 5\n"
         "  optimizer: {lr: 3.0e-3}\n  schedule: {kind: cosine, warmup_steps: 3}\n" +
         extra_train + extra;
}

// Rewrites the value of metadata `key` in a safetensors file's JSON header in place to
// `fill(old_length)` (same length: the file still parses and every tensor checksum holds),
// so a test can hand a damaged value to the reader.
inline void damage_metadata(const std::filesystem::path& file, const std::string& key,
                            const std::function<std::string(size_t)>& fill) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  std::string head(8192, '\0');
  f.read(head.data(), static_cast<std::streamsize>(head.size()));
  const std::string tag = "\"" + key + "\":\"";
  const size_t at = head.find(tag);
  ASSERT_NE(at, std::string::npos) << key;
  const size_t begin = at + tag.size(), end = head.find('"', begin);
  const std::string value = fill(end - begin);
  ASSERT_EQ(value.size(), end - begin);
  f.clear();
  f.seekp(static_cast<std::streamoff>(begin));
  f.write(value.data(), static_cast<std::streamsize>(value.size()));
}

}  // namespace geoloco::testing
