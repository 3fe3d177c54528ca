// GPT-2 model hyperparameters (the `model:` section of a run config).
#pragma once

#include <cstdint>

#include "core/config_node.hpp"

namespace geoloco::trainer {

struct ModelConfig {
  int n_layer = 4;
  int n_head = 4;
  int n_embd = 128;
  int block_size = 128;  // maximum context length T
  int vocab_size = 256;  // 256 for byte tokens, 50257 for GPT-2 BPE shards

  static ModelConfig from_yaml(const config::Node& node);  // validates
  int64_t num_params() const;
  bool operator==(const ModelConfig&) const = default;
};

}  // namespace geoloco::trainer
