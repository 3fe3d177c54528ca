// Turns a DataConfig into datasets: resolves relative paths, opens and validates files,
// and makes the train/validation split.
#pragma once

#include <filesystem>
#include <memory>

#include "trainer/data/data_config.hpp"
#include "trainer/data/token_dataset.hpp"

namespace geoloco::trainer {

enum class DataRole { Train, Val };

struct DataSplits {
  std::shared_ptr<const TokenDataset> train;
  std::shared_ptr<const TokenDataset> val;  // may have 0 windows (val_fraction 0)
};

// One source. `base_dir` resolves a relative path (pass the config file's directory).
// `model_vocab` is model.vocab_size: every token must be below it, so a byte source needs
// >= 256 and shard tokens are validated against it (FileError naming file/index/value).
// The role selects the synthetic stream seed, so train and val never share windows.
// Throws InputError (ConfigError-style message) when the source cannot feed the model,
// FileError for missing or corrupt files.
std::shared_ptr<const TokenDataset> open_dataset(const DataSourceConfig& cfg, const std::filesystem::path& base_dir,
                                                 int model_vocab, DataRole role);

// Both splits. Without data.val, text/shards hold out the last floor(n * val_fraction)
// tokens of the train stream (train gets [0, n - held), val [n - held, n)); synthetic opens
// the same chain with the validation stream seed.
DataSplits open_data(const DataConfig& cfg, const std::filesystem::path& base_dir, int model_vocab);

// Stream seeds of a synthetic source's splits (exposed for tests).
uint64_t synthetic_stream_seed(uint64_t seed, DataRole role);

}  // namespace geoloco::trainer
