// The `data:` section of a run config:
//
//   data:
//     train: {kind: text, path: corpus/train.txt}
//     val:   {kind: text, path: corpus/val.txt}      # optional
//     val_fraction: 0.1                              # only when `val` is absent
//
// Source kinds and their keys:
//   text       path                      bytes of a file, vocab 256
//   shards     path                      llm.c shards: a file, a directory or a glob
//   synthetic  vocab, branching, seed,   Markov chain with a known entropy rate
//              tokens
// Relative paths are resolved by open_data() against the config file's directory.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/config_node.hpp"

namespace geoloco::trainer {

struct DataSourceConfig {
  enum class Kind { Text, Shards, Synthetic };
  Kind kind = Kind::Text;
  std::string path;              // text, shards
  int vocab = 256;               // synthetic: number of symbols
  int branching = 4;             // synthetic: successors per state
  uint64_t seed = 1;             // synthetic: chain and stream seed
  uint64_t tokens = 1ull << 26;  // synthetic: nominal length (windows = (tokens - 1) / T)

  static DataSourceConfig from_yaml(const config::Node& node);
  bool operator==(const DataSourceConfig&) const = default;
};

const char* to_string(DataSourceConfig::Kind kind);

struct DataConfig {
  DataSourceConfig train;
  std::optional<DataSourceConfig> val;
  // When `val` is absent: text/shards hold out the last val_fraction of the train tokens;
  // synthetic uses the same chain with a different stream seed.
  double val_fraction = 0.1;
  // disjoint: every rank of every site draws different windows (world = all ranks).
  // identical: every site replays the same stream (world = the site's ranks): for
  // experiments and tests (N sites on identical data must equal one site).
  std::string across_sites = "disjoint";
  // aligned: training window i starts at token i*T (llm.c); random: each window of an epoch
  // starts at i*T plus a seeded offset in [0, T) drawn per (epoch, window), as nanoGPT's
  // random starts do, under the same sampler contract (sampler.hpp). Streams only (text,
  // shards): synthetic windows are independent draws already. Validation stays aligned.
  std::string windows = "aligned";

  static DataConfig from_yaml(const config::Node& node);
};

}  // namespace geoloco::trainer
