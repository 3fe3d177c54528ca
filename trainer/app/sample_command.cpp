// geoloco sample: text from a checkpoint, to see what a run's model learned.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "trainer/app/commands.hpp"
#include "trainer/checkpoint/model_checkpoint.hpp"
#include "core/error.hpp"
#include "trainer/data/text_source.hpp"
#include "trainer/model/gpt.hpp"
#include "trainer/model/sampling.hpp"

namespace geoloco::app {

namespace {

struct SampleArgs {
  std::string checkpoint;
  std::string prompt;
  std::vector<int32_t> prompt_ids;  // --prompt-ids 12,7,99: for models that are not byte-level
  int tokens = 200;
  trainer::SamplingOptions sampling;
  uint64_t seed = 1;
  int threads = 1;
  bool json = false;
};

void run_sample(const SampleArgs& a) {
  using namespace trainer;
  const std::string path = find_model_file(a.checkpoint);
  const auto file = SafetensorsFile::read(path);
  const ModelConfig mc = read_model_config(file);
  Gpt model(mc);
  std::vector<float> params(static_cast<size_t>(model.layout().total()));
  load_model(file, model.layout(), params);
  Gpt::set_num_threads(a.threads);
  const bool bytes = mc.vocab_size == kByteVocab;
  if (!a.prompt.empty() && !a.prompt_ids.empty()) throw InputError("give --prompt or --prompt-ids, not both");
  std::vector<int32_t> prompt = a.prompt_ids;
  if (prompt.empty()) {
    if (!bytes)
      throw InputError(
          fmt::format("{} has vocab_size {}, not a byte-level model: give the prompt as --prompt-ids "
                      "(geoloco has no tokenizer for other vocabularies)",
                      path, mc.vocab_size));
    const std::string text = a.prompt.empty() ? std::string("\n") : a.prompt;
    for (unsigned char c : text) prompt.push_back(c);
  }
  const auto out = generate(model, params, prompt, a.tokens, a.sampling, a.seed);
  std::string text;
  if (bytes)
    for (int32_t t : out) text.push_back(static_cast<char>(t));
  if (a.json) {
    nlohmann::json j = {{"checkpoint", path},
                        {"prompt_tokens", prompt},
                        {"tokens", out},
                        {"seed", a.seed},
                        {"temperature", a.sampling.temperature},
                        {"top_k", a.sampling.top_k}};
    if (bytes) j["text"] = text;
    fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  } else if (bytes) {
    fmt::print("{}{}\n", a.prompt, text);
  } else {
    std::string ids;
    for (int32_t t : out) ids += fmt::format("{}{}", ids.empty() ? "" : " ", t);
    fmt::print("{}\n", ids);
  }
}

}  // namespace

void add_sample_command(CLI::App& app) {
  auto a = std::make_shared<SampleArgs>();
  auto* cmd = app.add_subcommand("sample", "Generate text from a checkpoint (what the model learned)");
  cmd->add_option("--checkpoint", a->checkpoint,
                  "model.safetensors, or a checkpoint step, site or one-site run directory (its latest model)")
      ->required();
  cmd->add_option("--prompt", a->prompt, "text to continue (byte-level models; default: a newline)");
  cmd->add_option("--prompt-ids", a->prompt_ids, "token ids to continue, comma-separated (any vocabulary)")
      ->delimiter(',');
  cmd->add_option("--tokens", a->tokens, "tokens to generate")->check(CLI::Range(1, 100000));
  cmd->add_option("--temperature", a->sampling.temperature, "0: the most likely token; < 1 sharper, > 1 flatter")
      ->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--top-k", a->sampling.top_k, "draw among the k most likely tokens (0: all)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", a->seed, "same checkpoint, prompt, options and seed: the same text");
  cmd->add_option("--threads", a->threads, "CPU threads")->check(CLI::PositiveNumber);
  cmd->add_flag("--json", a->json, "one JSON line: prompt_tokens, tokens, text (byte-level models)");
  cmd->callback([a] { run_sample(*a); });
}

}  // namespace geoloco::app
