#include "trainer/model/model_config.hpp"

#include <fmt/format.h>

namespace geoloco::trainer {

ModelConfig ModelConfig::from_yaml(const config::Node& n) {
  ModelConfig c;
  c.n_layer = static_cast<int>(n.get_int("n_layer", c.n_layer, 1, 1024));
  c.n_head = static_cast<int>(n.get_int("n_head", c.n_head, 1, 1024));
  c.n_embd = static_cast<int>(n.get_int("n_embd", c.n_embd, 1, 65536));
  c.block_size = static_cast<int>(n.get_int("block_size", c.block_size, 1, 1 << 20));
  c.vocab_size = static_cast<int>(n.get_int("vocab_size", c.vocab_size, 2, 1 << 24));
  if (c.n_embd % c.n_head != 0)
    n.fail("n_embd", fmt::format("got {}, expected a multiple of n_head ({})", c.n_embd, c.n_head));
  n.finish();
  return c;
}

int64_t ModelConfig::num_params() const {
  const int64_t C = n_embd, L = n_layer;
  return int64_t(vocab_size) * C + int64_t(block_size) * C + L * (12 * C * C + 13 * C) + 2 * C;
}

}  // namespace geoloco::trainer
