// geoloco eval: the mean loss of a checkpoint on a data file, as one JSON line.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "trainer/app/commands.hpp"
#include "trainer/checkpoint/model_checkpoint.hpp"
#include "core/safetensors.hpp"
#include "core/error.hpp"
#include "trainer/data/shard_source.hpp"
#include "trainer/data/text_source.hpp"
#include "trainer/model/gpt.hpp"

namespace geoloco::app {

namespace {

struct EvalArgs {
  std::string checkpoint;
  std::string data;
  int64_t tokens = 0;  // 0: the whole file
  int batch = 8;
  int seq_len = 0;
  int threads = 1;
};

bool looks_like_shard(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  int32_t magic = 0;
  in.read(reinterpret_cast<char*>(&magic), sizeof magic);
  return in.gcount() == sizeof magic && magic == trainer::kShardMagic;
}

void run_eval(const EvalArgs& a) {
  using namespace trainer;
  // A file, or a step / site / one-site run directory: its latest model (as train.init_from).
  const std::string path = find_model_file(a.checkpoint);
  auto file = SafetensorsFile::read(path);
  const ModelConfig mc = read_model_config(file);
  Gpt model(mc);
  std::vector<float> params(static_cast<size_t>(model.layout().total()));
  load_model(file, model.layout(), params);
  Gpt::set_num_threads(a.threads);

  std::shared_ptr<const TokenStream> stream;
  if (looks_like_shard(a.data)) {
    stream = open_shard_stream(a.data, mc.vocab_size);
  } else {
    if (mc.vocab_size < kByteVocab)
      throw InputError(
          fmt::format("{}: raw bytes need vocab_size >= 256, but {} has vocab_size {}", a.data, path, mc.vocab_size));
    stream = open_text_stream(a.data);
  }
  StreamDataset ds(stream);
  const int T = a.seq_len > 0 ? a.seq_len : mc.block_size;
  if (T > mc.block_size)
    throw InputError(fmt::format("--seq-len {} exceeds the model's block_size {}", T, mc.block_size));
  size_t n = ds.num_windows(T);
  if (a.tokens > 0) n = std::min<size_t>(n, static_cast<size_t>((a.tokens + T - 1) / T));
  if (n == 0)
    throw InputError(fmt::format("{}: fewer than {} tokens, not one window of the model's context", a.data, T + 1));

  std::vector<int32_t> win(static_cast<size_t>(T + 1)), in(static_cast<size_t>(a.batch) * T), tg(in.size());
  double sum = 0;
  size_t done = 0;
  while (done < n) {
    const int rows = static_cast<int>(std::min<size_t>(static_cast<size_t>(a.batch), n - done));
    for (int r = 0; r < rows; ++r) {
      ds.window(done + r, T, win.data());
      std::copy(win.begin(), win.begin() + T, in.begin() + int64_t(r) * T);
      std::copy(win.begin() + 1, win.end(), tg.begin() + int64_t(r) * T);
    }
    sum += double(model.evaluate(params, in.data(), tg.data(), rows, T)) * rows;
    done += rows;
  }
  const double loss = sum / double(done);
  nlohmann::json j = {{"loss", loss},
                      {"tokens", static_cast<int64_t>(done) * T},
                      {"windows", done},
                      {"seq_len", T},
                      {"perplexity", std::exp(loss)},
                      {"bits_per_token", loss / std::log(2.0)},
                      {"checkpoint", path},
                      {"data", a.data}};
  fmt::print("{}\n", j.dump());
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto args = std::make_shared<EvalArgs>();
  auto* cmd =
      app.add_subcommand("eval", "Evaluate a checkpoint on a data file; prints one JSON line (loss, tokens, ...)");
  cmd->add_option("--checkpoint", args->checkpoint,
                  "model.safetensors written by geoloco, or a checkpoint step, site or one-site run directory (its "
                  "latest model)")
      ->required();
  cmd->add_option("--data", args->data, "a text file (byte tokens) or an llm.c token shard")->required();
  cmd->add_option("--tokens", args->tokens, "evaluate at most this many tokens (default: the whole file)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--batch", args->batch, "sequences per forward pass")->check(CLI::PositiveNumber);
  cmd->add_option("--seq-len", args->seq_len, "tokens per sequence (default: the model's block_size)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--threads", args->threads, "CPU threads")->check(CLI::PositiveNumber);
  cmd->callback([args] { run_eval(*args); });
}

}  // namespace geoloco::app
