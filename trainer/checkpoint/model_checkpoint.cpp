#include "trainer/checkpoint/model_checkpoint.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "compression/half.hpp"
#include "core/atomic_file.hpp"
#include "core/strict_json.hpp"
#include "core/error.hpp"

namespace geoloco::trainer {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr std::string_view kPrefix = "transformer.";
constexpr const char* kGeolocoFormatKey = "geoloco.format";
constexpr const char* kGeolocoVersionKey = "geoloco.format_version";

// What geoloco computes, under GPT2Config's names: the layer norm epsilon (kLnEps in
// trainer/model/kernels_ref.cpp, kernels_fast.cpp, trainer/cuda/ops_kernels.cu) and the GELU,
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), which transformers calls gelu_new
// (gelu_pytorch_tanh is the same function; "gelu" is the exact erf form).
constexpr double kLayerNormEpsilon = 1e-5;
constexpr const char* kActivation = "gelu_new";
constexpr const char* kActivationAlias = "gelu_pytorch_tanh";
// A GPT2Config is a few kilobytes; anything this large is not one.
constexpr uintmax_t kMaxConfigJson = 16u << 20;

const char* const kReserved[] = {"format", "format_version", kGeolocoFormatKey, kGeolocoVersionKey, "n_layer",
                                 "n_head", "n_embd",         "n_positions",     "block_size",       "vocab_size"};
const char* const kHyperparameterKeys[] = {"n_layer", "n_head", "n_embd", "n_positions", "block_size", "vocab_size"};

// The name under which `hf_name` ("transformer.h.0...") is stored: as is, or without the
// "transformer." prefix as GPT2Model saves it. Empty when neither exists.
std::string stored_name(const SafetensorsFile& f, const std::string& hf_name) {
  if (f.has(hf_name)) return hf_name;
  if (hf_name.starts_with(kPrefix)) {
    std::string bare = hf_name.substr(kPrefix.size());
    if (f.has(bare)) return bare;
  }
  return {};
}

// The block index of "[transformer.]h.{i}.<rest>" (rest in *rest), or -1 for other names.
int block_index(std::string_view name, std::string* rest) {
  if (name.starts_with(kPrefix)) name.remove_prefix(kPrefix.size());
  if (!name.starts_with("h.")) return -1;
  name.remove_prefix(2);
  int i = -1;
  const auto [p, ec] = std::from_chars(name.data(), name.data() + name.size(), i);
  if (ec != std::errc() || p == name.data() + name.size() || *p != '.' || i < 0 || i > (1 << 20)) return -1;
  if (name.front() == '0' && p != name.data() + 1) return -1;  // "h.01." is not block 1
  if (rest) *rest = std::string(p + 1, name.data() + name.size());
  return i;
}

int meta_int(const SafetensorsFile& f, const std::string& key) {
  const std::string& v = f.meta(key);
  int out = 0;
  const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || p != v.data() + v.size() || out <= 0)
    throw FileError(f.path(), fmt::format("__metadata__ '{}' is '{}', expected a positive integer", key, v));
  return out;
}

bool has_meta(const SafetensorsFile& f, const char* key) { return f.metadata().count(key) != 0; }

// geoloco's own file, by either identity: format "geoloco-gpt2" (before the move to "pt")
// or geoloco.format.
bool is_geoloco_file(const SafetensorsFile& f) {
  return (has_meta(f, "format") && f.meta("format") == kModelFormat) || has_meta(f, kGeolocoFormatKey);
}

// FileError unless the file is geoloco's (a known version) or a PyTorch export (format "pt"
// or none): safetensors written for TensorFlow, Flax or MLX name and lay out tensors
// differently.
void check_format(const SafetensorsFile& f) {
  if (has_meta(f, "format") && f.meta("format") == kModelFormat) {
    if (has_meta(f, "format_version") && f.meta("format_version") != kModelFormatVersion)
      throw FileError(f.path(), fmt::format("model format_version '{}' is not supported (expected {})",
                                            f.meta("format_version"), kModelFormatVersion));
    return;
  }
  if (has_meta(f, "format") && f.meta("format") != kTorchFormat)
    throw FileError(f.path(), fmt::format("format '{}' is neither a {} model nor a PyTorch export (format '{}')",
                                          f.meta("format"), kModelFormat, kTorchFormat));
  if (has_meta(f, kGeolocoFormatKey) && f.meta(kGeolocoFormatKey) != kModelFormat)
    throw FileError(f.path(), fmt::format("__metadata__ '{}' is '{}', expected '{}'", kGeolocoFormatKey,
                                          f.meta(kGeolocoFormatKey), kModelFormat));
  if (has_meta(f, kGeolocoVersionKey) && f.meta(kGeolocoVersionKey) != kModelFormatVersion)
    throw FileError(f.path(), fmt::format("model format_version '{}' is not supported (expected {})",
                                          f.meta(kGeolocoVersionKey), kModelFormatVersion));
}

ModelConfig config_from_metadata(const SafetensorsFile& f) {
  ModelConfig c;
  c.n_layer = meta_int(f, "n_layer");
  c.n_head = meta_int(f, "n_head");
  c.n_embd = meta_int(f, "n_embd");
  c.vocab_size = meta_int(f, "vocab_size");
  c.block_size = meta_int(f, "n_positions");
  if (has_meta(f, "block_size") && meta_int(f, "block_size") != c.block_size)
    throw FileError(f.path(), fmt::format("metadata block_size {} differs from n_positions {}", f.meta("block_size"),
                                          c.block_size));
  return c;
}

std::string config_json_path(const std::string& model_path) {
  return (fs::path(model_path).parent_path() / "config.json").string();
}

json read_config_json(const std::string& path, const std::string& model) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw FileError(path, fmt::format("no such file; {} has no hyperparameters in its __metadata__ (a PyTorch or "
                                      "Hugging Face export), so they are read from the config.json beside it",
                                      model));
  if (!fs::is_regular_file(path, ec)) throw FileError(path, "not a regular file");
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) throw FileError(path, fmt::format("cannot stat: {}", ec.message()));
  if (size > kMaxConfigJson)
    throw FileError(path, fmt::format("{} bytes, more than the {} a model config may take", size, kMaxConfigJson));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw FileError(path, fmt::format("cannot open: {}", std::strerror(errno)));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw FileError(path, fmt::format("cannot read: {}", std::strerror(errno)));
  std::string duplicate;
  json j;
  try {
    j = parse_json_rejecting_duplicates(text, &duplicate);
  } catch (const json::exception& e) {
    throw FileError(path, fmt::format("not valid JSON: {}", e.what()));
  }
  if (!duplicate.empty()) throw FileError(path, fmt::format("duplicate key '{}'", duplicate));
  if (!j.is_object()) throw FileError(path, "not a JSON object");
  return j;
}

// An integer key of config.json in [lo, hi] (ModelConfig::from_yaml's ranges).
int json_int(const json& j, const std::string& path, const char* key, int lo, int hi) {
  if (!j.contains(key)) throw FileError(path, fmt::format("missing key '{}'", key));
  const json& v = j[key];
  if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi)
    throw FileError(path, fmt::format("'{}' is {}, expected an integer in [{}, {}]", key, v.dump(), lo, hi));
  return static_cast<int>(v.get<int64_t>());
}

// A boolean key that, when present, must say what geoloco does.
void expect_flag(const json& j, const std::string& path, const char* key, bool want, const char* why) {
  if (!j.contains(key)) return;
  if (!j[key].is_boolean() || j[key].get<bool>() != want)
    throw FileError(path, fmt::format("'{}' is {}, but {} (expected {})", key, j[key].dump(), why, want));
}

// The config must describe the tensors beside it: wte [vocab_size, n_embd], wpe
// [n_positions, n_embd], blocks h.0 .. h.{n_layer-1}. (A missing wte or wpe is left to
// check_model's per-tensor message; n_head has no tensor of its own.)
void check_config_against_tensors(const SafetensorsFile& f, const ModelConfig& c, const std::string& path) {
  auto contradicts = [&](const char* key, int value, const TensorInfo& t) {
    return FileError(
        path, fmt::format("'{}' is {}, but {} holds '{}' {}", key, value, f.path(), t.name, shape_string(t.shape)));
  };
  if (const std::string wte = stored_name(f, "transformer.wte.weight"); !wte.empty()) {
    const TensorInfo& t = f.info(wte);
    if (t.shape.size() == 2 && t.shape[0] != c.vocab_size) throw contradicts("vocab_size", c.vocab_size, t);
    if (t.shape.size() == 2 && t.shape[1] != c.n_embd) throw contradicts("n_embd", c.n_embd, t);
  }
  if (const std::string wpe = stored_name(f, "transformer.wpe.weight"); !wpe.empty()) {
    const TensorInfo& t = f.info(wpe);
    if (t.shape.size() == 2 && t.shape[0] != c.block_size) throw contradicts("n_positions", c.block_size, t);
    if (t.shape.size() == 2 && t.shape[1] != c.n_embd) throw contradicts("n_embd", c.n_embd, t);
  }
  int blocks = 0;
  for (const auto& t : f.tensors()) blocks = std::max(blocks, block_index(t.name, nullptr) + 1);
  if (blocks != c.n_layer)
    throw FileError(path, fmt::format("'n_layer' is {}, but {} holds {}", c.n_layer, f.path(),
                                      blocks == 0 ? std::string("no blocks h.{i}")
                                                  : fmt::format("blocks h.0 to h.{}", blocks - 1)));
}

// The hyperparameters of a PyTorch / Hugging Face export, from the config.json beside it.
ModelConfig config_from_json(const SafetensorsFile& f, const std::string& path) {
  const json j = read_config_json(path, f.path());
  if (j.contains("model_type") && j["model_type"] != "gpt2")
    throw FileError(path, fmt::format("'model_type' is {}, expected \"gpt2\"", j["model_type"].dump()));
  ModelConfig c;
  c.n_layer = json_int(j, path, "n_layer", 1, 1024);
  c.n_head = json_int(j, path, "n_head", 1, 1024);
  c.n_embd = json_int(j, path, "n_embd", 1, 65536);
  c.block_size = json_int(j, path, "n_positions", 1, 1 << 20);
  c.vocab_size = json_int(j, path, "vocab_size", 2, 1 << 24);
  if (c.n_embd % c.n_head != 0)
    throw FileError(path, fmt::format("'n_embd' is {}, not a multiple of 'n_head' ({})", c.n_embd, c.n_head));
  if (j.contains("n_ctx") && json_int(j, path, "n_ctx", 1, 1 << 20) != c.block_size)
    throw FileError(path, fmt::format("'n_ctx' is {}, but 'n_positions' is {}: geoloco has one context length "
                                      "(model.block_size)",
                                      j["n_ctx"].dump(), c.block_size));
  if (j.contains("n_inner") && !j["n_inner"].is_null() &&
      !(j["n_inner"].is_number_integer() && j["n_inner"].get<int64_t>() == 4 * int64_t{c.n_embd}))
    throw FileError(path, fmt::format("'n_inner' is {}, but geoloco's MLP is 4 * n_embd = {} wide (expected null)",
                                      j["n_inner"].dump(), 4 * int64_t{c.n_embd}));
  if (j.contains("layer_norm_epsilon")) {
    const json& e = j["layer_norm_epsilon"];
    if (!e.is_number() || std::fabs(e.get<double>() - kLayerNormEpsilon) > kLayerNormEpsilon * 1e-9)
      throw FileError(path, fmt::format("'layer_norm_epsilon' is {}, but geoloco's layer norm uses {}", e.dump(),
                                        kLayerNormEpsilon));
  }
  if (j.contains("activation_function") && j["activation_function"] != kActivation &&
      j["activation_function"] != kActivationAlias)
    throw FileError(path, fmt::format("'activation_function' is {}, but geoloco's GELU is the tanh approximation "
                                      "(\"{}\" or \"{}\")",
                                      j["activation_function"].dump(), kActivation, kActivationAlias));
  expect_flag(j, path, "tie_word_embeddings", true, "geoloco ties the LM head to wte");
  expect_flag(j, path, "scale_attn_weights", true, "geoloco scales attention scores by 1/sqrt(head size)");
  expect_flag(j, path, "scale_attn_by_inverse_layer_idx", false, "geoloco does not scale attention by layer");
  expect_flag(j, path, "add_cross_attention", false, "geoloco's GPT-2 has no cross-attention");
  check_config_against_tensors(f, c, path);
  return c;
}

// A checkpoint's hyperparameters and the file they were read from.
struct Described {
  ModelConfig config;
  std::string source;
  bool from_config_json = false;
};

Described describe(const SafetensorsFile& f) {
  check_format(f);
  const bool in_metadata =
      is_geoloco_file(f) || std::any_of(std::begin(kHyperparameterKeys), std::end(kHyperparameterKeys),
                                        [&](const char* k) { return has_meta(f, k); });
  if (in_metadata) return {config_from_metadata(f), f.path(), false};
  const std::string path = config_json_path(f.path());
  return {config_from_json(f, path), path, true};
}

// lm_head.weight beside the tied wte: accepted only as an exact copy of it.
void check_tied_head(const SafetensorsFile& f, const std::string& wte) {
  const TensorInfo& head = f.info("lm_head.weight");
  const TensorInfo& emb = f.info(wte);
  const auto a = f.bytes(head.name), b = f.bytes(wte);
  if (head.dtype == emb.dtype && head.shape == emb.shape && std::equal(a.begin(), a.end(), b.begin(), b.end())) return;
  const std::string what = head.dtype != emb.dtype || head.shape != emb.shape
                               ? fmt::format("is {} {}, '{}' {} {}", dtype_name(head.dtype), shape_string(head.shape),
                                             wte, dtype_name(emb.dtype), shape_string(emb.shape))
                               : fmt::format("holds other values than '{}'", wte);
  throw FileError(f.path(), fmt::format("tensor 'lm_head.weight' {}: geoloco ties the LM head to the token "
                                        "embedding and cannot load a separate one",
                                        what));
}

}  // namespace

std::vector<TensorWrite> model_tensors(const ParamLayout& layout, std::span<const float> params) {
  GEOLOCO_CHECK(params.size() == static_cast<size_t>(layout.total()), "params hold {} floats, the layout {}",
                params.size(), layout.total());
  std::vector<TensorWrite> out;
  out.reserve(layout.views().size());
  for (const auto& v : layout.views())
    out.push_back(
        f32_tensor(v.name, v.shape, params.subspan(static_cast<size_t>(v.offset), static_cast<size_t>(v.numel))));
  return out;
}

std::map<std::string, std::string> model_metadata(const ModelConfig& cfg,
                                                  const std::map<std::string, std::string>& extra) {
  std::map<std::string, std::string> m = extra;
  for (const char* k : kReserved)
    GEOLOCO_CHECK(!extra.count(k), "checkpoint metadata key '{}' is reserved for the model description", k);
  m["format"] = kTorchFormat;  // what transformers requires of a safetensors file it loads
  m[kGeolocoFormatKey] = kModelFormat;
  m[kGeolocoVersionKey] = kModelFormatVersion;
  m["n_layer"] = std::to_string(cfg.n_layer);
  m["n_head"] = std::to_string(cfg.n_head);
  m["n_embd"] = std::to_string(cfg.n_embd);
  m["n_positions"] = std::to_string(cfg.block_size);
  m["block_size"] = std::to_string(cfg.block_size);
  m["vocab_size"] = std::to_string(cfg.vocab_size);
  return m;
}

void save_model(const std::string& path, const ParamLayout& layout, std::span<const float> params,
                const std::map<std::string, std::string>& metadata) {
  const auto tensors = model_tensors(layout, params);
  write_safetensors(path, tensors, model_metadata(layout.config(), metadata));
}

std::string hf_config_json(const ModelConfig& c) {
  const int eos = c.vocab_size - 1;  // GPT-2's <|endoftext|> (50256) for its own vocabulary
  const json j = {
      {"model_type", "gpt2"},
      {"architectures", json::array({"GPT2LMHeadModel"})},
      {"n_layer", c.n_layer},
      {"n_head", c.n_head},
      {"n_embd", c.n_embd},
      {"n_positions", c.block_size},
      {"n_ctx", c.block_size},
      {"vocab_size", c.vocab_size},
      {"n_inner", nullptr},  // 4 * n_embd
      {"layer_norm_epsilon", kLayerNormEpsilon},
      {"activation_function", kActivation},
      {"tie_word_embeddings", true},
      {"scale_attn_weights", true},
      {"scale_attn_by_inverse_layer_idx", false},
      {"reorder_and_upcast_attn", false},
      {"add_cross_attention", false},
      {"attn_pdrop", 0.0},
      {"embd_pdrop", 0.0},
      {"resid_pdrop", 0.0},
      {"summary_first_dropout", 0.0},
      {"initializer_range", 0.02},  // Gpt::init_params' standard deviation
      {"bos_token_id", eos},
      {"eos_token_id", eos},
      {"use_cache", true},
      {"torch_dtype", "float32"},
  };
  return j.dump(2) + "\n";
}

void save_model_directory(const std::string& dir, const ParamLayout& layout, std::span<const float> params,
                          const std::map<std::string, std::string>& metadata) {
  // config.json first: once model.safetensors (what find_model_file looks for) exists, the
  // directory is complete for Hugging Face too.
  const std::string text = hf_config_json(layout.config());
  write_file_atomically((fs::path(dir) / "config.json").string(),
                        {reinterpret_cast<const uint8_t*>(text.data()), text.size()});
  save_model((fs::path(dir) / "model.safetensors").string(), layout, params, metadata);
}

ModelConfig read_model_config(const SafetensorsFile& f) { return describe(f).config; }

ModelConfig read_model_config(const std::string& path) { return read_model_config(SafetensorsFile::read(path)); }

void check_model(const SafetensorsFile& f, const ParamLayout& layout) {
  // Hyperparameters first: "n_layer 4 vs 2" is a clearer message than a missing tensor.
  const Described saved = describe(f);
  const ModelConfig& want = layout.config();
  auto differ = [&](const char* key, int s, int w) {
    if (s != w) throw FileError(saved.source, fmt::format("checkpoint has {} = {}, this model has {}", key, s, w));
  };
  differ("n_layer", saved.config.n_layer, want.n_layer);
  differ("n_head", saved.config.n_head, want.n_head);
  differ("n_embd", saved.config.n_embd, want.n_embd);
  if (saved.from_config_json && saved.config.block_size != want.block_size)
    throw FileError(saved.source, fmt::format("checkpoint has n_positions = {}, this model has block_size = {} "
                                              "(geoloco's wpe has block_size rows: set model.block_size to {}; "
                                              "train.seq_len may stay shorter)",
                                              saved.config.block_size, want.block_size, saved.config.block_size));
  differ("block_size", saved.config.block_size, want.block_size);
  differ("vocab_size", saved.config.vocab_size, want.vocab_size);

  std::set<std::string> used;
  for (const auto& v : layout.views()) {
    const std::string name = stored_name(f, v.name);
    if (name.empty())
      throw FileError(f.path(), fmt::format("missing tensor '{}' (expected shape {})", v.name, shape_string(v.shape)));
    const auto& t = f.info(name);
    if (t.dtype != Dtype::F32 && t.dtype != Dtype::BF16 && t.dtype != Dtype::F16)
      throw FileError(f.path(), fmt::format("tensor '{}' is {}, expected F32 (or BF16/F16, widened exactly)", name,
                                            dtype_name(t.dtype)));
    if (t.shape != v.shape)
      throw FileError(f.path(), fmt::format("tensor '{}' has the wrong shape: expected {}, found {}", name,
                                            shape_string(v.shape), shape_string(t.shape)));
    used.insert(name);
  }
  // Hugging Face's non-parameter buffers of the blocks this model has, and the tied head.
  const int64_t T = want.block_size;
  for (const auto& t : f.tensors()) {
    if (used.count(t.name)) continue;
    if (t.name == "lm_head.weight") {
      check_tied_head(f, stored_name(f, "transformer.wte.weight"));
      continue;
    }
    std::string rest;
    const int block = block_index(t.name, &rest);
    if (block >= 0 && block < want.n_layer && rest == "attn.bias") {
      if (t.shape != std::vector<int64_t>{1, 1, T, T})
        throw FileError(f.path(), fmt::format("buffer '{}' has shape {}, expected [1, 1, {}, {}] (the causal mask "
                                              "over n_positions = {})",
                                              t.name, shape_string(t.shape), T, T, T));
      continue;
    }
    if (block >= 0 && block < want.n_layer && rest == "attn.masked_bias") {
      if (!t.shape.empty() && t.shape != std::vector<int64_t>{1})
        throw FileError(f.path(),
                        fmt::format("buffer '{}' has shape {}, expected [] (a scalar)", t.name, shape_string(t.shape)));
      continue;
    }
    throw FileError(f.path(),
                    fmt::format("unexpected tensor '{}' {} (not part of this model)", t.name, shape_string(t.shape)));
  }
}

void load_model(const SafetensorsFile& f, const ParamLayout& layout, std::span<float> params) {
  GEOLOCO_CHECK(params.size() == static_cast<size_t>(layout.total()), "params hold {} floats, the layout {}",
                params.size(), layout.total());
  check_model(f, layout);
  for (const auto& v : layout.views()) {
    const std::string name = stored_name(f, v.name);
    const auto out = params.subspan(static_cast<size_t>(v.offset), static_cast<size_t>(v.numel));
    const Dtype dtype = f.info(name).dtype;
    if (dtype == Dtype::F32) {
      f.copy_f32(name, v.shape, out);
      continue;
    }
    // Half-precision exports (bf16 / fp16): every value widens to float exactly.
    const auto b = f.bytes(name);
    for (size_t i = 0; i < out.size(); ++i) {
      const uint16_t h = static_cast<uint16_t>(b[2 * i] | (b[2 * i + 1] << 8));  // little-endian
      out[i] = dtype == Dtype::BF16 ? std::bit_cast<float>(uint32_t{h} << 16) : compression::float_from_half(h);
    }
  }
}

std::string find_model_file(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  if (!fs::exists(p, ec)) throw FileError(path, "no such file or directory");
  if (!fs::is_directory(p, ec)) {
    if (!fs::is_regular_file(p, ec)) throw FileError(path, "not a regular file or a directory");
    return path;
  }
  if (fs::is_regular_file(p / "model.safetensors", ec)) return (p / "model.safetensors").string();
  const fs::path latest = p / "latest";
  if (fs::is_regular_file(latest, ec)) {
    std::ifstream in(latest);
    std::string step;
    std::getline(in, step);
    if (step.empty() || step.find('/') != std::string::npos || step == "." || step == "..")
      throw FileError(latest.string(), fmt::format("'{}' does not name a checkpoint directory", step));
    const fs::path model = p / step / "model.safetensors";
    if (!fs::is_regular_file(model, ec))
      throw FileError(latest.string(), fmt::format("names {}, which has no model.safetensors", step));
    return model.string();
  }
  // A run's output directory (its checkpoints/) or checkpoints/ itself: one directory per
  // site; taken when there is one site, else the user must pick one.
  const fs::path sites_dir = fs::is_directory(p / "checkpoints", ec) ? p / "checkpoints" : p;
  std::vector<std::string> sites;
  for (const auto& e : fs::directory_iterator(sites_dir, ec))
    if (e.is_directory(ec) && fs::is_regular_file(e.path() / "latest", ec))
      sites.push_back(e.path().filename().string());
  std::sort(sites.begin(), sites.end());
  if (sites.size() == 1) return find_model_file((sites_dir / sites.front()).string());
  if (!sites.empty())
    throw FileError(path, fmt::format("holds the checkpoints of {} sites ({}): name one of them, e.g. {}", sites.size(),
                                      fmt::join(sites, ", "), (sites_dir / sites.front()).string()));
  if (fs::exists(p / "model.safetensors.index.json", ec))
    throw FileError(path,
                    "holds a sharded export (model.safetensors.index.json), which geoloco does not read: save "
                    "it as one file (save_pretrained(dir, safe_serialization=True, max_shard_size=\"100GB\"))");
  if (fs::exists(p / "pytorch_model.bin", ec))
    throw FileError(path,
                    "holds pytorch_model.bin (a pickle), which geoloco does not read: save it as safetensors "
                    "(save_pretrained(dir, safe_serialization=True))");
  throw FileError(path, "directory has no model.safetensors, no 'latest' checkpoint pointer and no site checkpoints");
}

void load_model(const std::string& path, const ParamLayout& layout, std::span<float> params) {
  load_model(SafetensorsFile::read(path), layout, params);
}

}  // namespace geoloco::trainer
