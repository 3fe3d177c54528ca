#include "trainer/data/open_data.hpp"

#include <cmath>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "trainer/data/shard_source.hpp"
#include "trainer/data/synthetic_source.hpp"
#include "trainer/data/text_source.hpp"

namespace geoloco::trainer {

namespace {

std::string resolve(const std::string& path, const std::filesystem::path& base_dir) {
  const std::filesystem::path p(path);
  return (p.is_absolute() || base_dir.empty()) ? p.string() : (base_dir / p).string();
}

std::shared_ptr<const TokenStream> open_stream(const DataSourceConfig& cfg, const std::filesystem::path& base_dir,
                                               int model_vocab) {
  const std::string path = resolve(cfg.path, base_dir);
  if (cfg.kind == DataSourceConfig::Kind::Text) {
    if (model_vocab < kByteVocab)
      throw InputError(
          fmt::format("data source {} yields byte tokens (vocab 256) but model.vocab_size is {}", path, model_vocab));
    return open_text_stream(path);
  }
  if (model_vocab > 65536)
    throw InputError(fmt::format("llm.c shards hold uint16 tokens but model.vocab_size is {}", model_vocab));
  return open_shard_stream(path, model_vocab);
}

}  // namespace

uint64_t synthetic_stream_seed(uint64_t seed, DataRole role) {
  return mix_seed(seed, role == DataRole::Train ? 0x747261696eULL /* "train" */ : 0x76616cULL /* "val" */);
}

std::shared_ptr<const TokenDataset> open_dataset(const DataSourceConfig& cfg, const std::filesystem::path& base_dir,
                                                 int model_vocab, DataRole role) {
  if (cfg.kind == DataSourceConfig::Kind::Synthetic) {
    if (cfg.vocab > model_vocab)
      throw InputError(fmt::format("synthetic data vocab {} exceeds model.vocab_size {}", cfg.vocab, model_vocab));
    auto chain = std::make_shared<const MarkovChain>(cfg.vocab, cfg.branching, cfg.seed);
    return std::make_shared<SyntheticDataset>(std::move(chain), synthetic_stream_seed(cfg.seed, role), cfg.tokens);
  }
  return std::make_shared<StreamDataset>(open_stream(cfg, base_dir, model_vocab));
}

DataSplits open_data(const DataConfig& cfg, const std::filesystem::path& base_dir, int model_vocab) {
  DataSplits out;
  if (cfg.val) {
    out.train = open_dataset(cfg.train, base_dir, model_vocab, DataRole::Train);
    out.val = open_dataset(*cfg.val, base_dir, model_vocab, DataRole::Val);
    return out;
  }
  if (cfg.train.kind == DataSourceConfig::Kind::Synthetic) {
    if (cfg.train.vocab > model_vocab)
      throw InputError(
          fmt::format("synthetic data vocab {} exceeds model.vocab_size {}", cfg.train.vocab, model_vocab));
    // One chain shared by both splits: same distribution, different windows.
    auto chain = std::make_shared<const MarkovChain>(cfg.train.vocab, cfg.train.branching, cfg.train.seed);
    out.train = std::make_shared<SyntheticDataset>(chain, synthetic_stream_seed(cfg.train.seed, DataRole::Train),
                                                   cfg.train.tokens);
    out.val = std::make_shared<SyntheticDataset>(chain, synthetic_stream_seed(cfg.train.seed, DataRole::Val),
                                                 cfg.train.tokens);
    return out;
  }
  auto stream = open_stream(cfg.train, base_dir, model_vocab);
  const uint64_t n = stream->size();
  const auto held = static_cast<uint64_t>(std::floor(static_cast<double>(n) * cfg.val_fraction));
  out.train = std::make_shared<StreamDataset>(stream, 0, n - held);
  out.val = std::make_shared<StreamDataset>(stream, n - held, n);
  return out;
}

}  // namespace geoloco::trainer
