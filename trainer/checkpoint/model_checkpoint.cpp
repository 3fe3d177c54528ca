#include "trainer/checkpoint/model_checkpoint.hpp"

#include <algorithm>
#include <bit>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "compression/half.hpp"
#include "trainer/core/error.hpp"

namespace geoloco::trainer {

namespace {

const char* const kReserved[] = {"format", "format_version", "n_layer", "n_head", "n_embd",
                                 "n_positions", "block_size", "vocab_size"};

bool ignorable_extra(const std::string& name) {
  auto ends_with = [&](std::string_view s) { return name.size() >= s.size() && name.ends_with(s); };
  return name == "lm_head.weight" || ends_with(".attn.bias") || ends_with(".attn.masked_bias");
}

// The name under which `hf_name` ("transformer.h.0...") is stored: as is, or without the
// "transformer." prefix as GPT2Model saves it. Empty when neither exists.
std::string stored_name(const SafetensorsFile& f, const std::string& hf_name) {
  if (f.has(hf_name)) return hf_name;
  static constexpr std::string_view kPrefix = "transformer.";
  if (hf_name.starts_with(kPrefix)) {
    std::string bare = hf_name.substr(kPrefix.size());
    if (f.has(bare)) return bare;
  }
  return {};
}

int meta_int(const SafetensorsFile& f, const std::string& key) {
  const std::string& v = f.meta(key);
  int out = 0;
  const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || p != v.data() + v.size() || out <= 0)
    throw FileError(f.path(), fmt::format("__metadata__ '{}' is '{}', expected a positive integer", key, v));
  return out;
}

}  // namespace

std::vector<TensorWrite> model_tensors(const ParamLayout& layout, std::span<const float> params) {
  GEOLOCO_CHECK(params.size() == static_cast<size_t>(layout.total()), "params hold {} floats, the layout {}",
                params.size(), layout.total());
  std::vector<TensorWrite> out;
  out.reserve(layout.views().size());
  for (const auto& v : layout.views())
    out.push_back(f32_tensor(v.name, v.shape,
                             params.subspan(static_cast<size_t>(v.offset), static_cast<size_t>(v.numel))));
  return out;
}

std::map<std::string, std::string> model_metadata(const ModelConfig& cfg,
                                                  const std::map<std::string, std::string>& extra) {
  std::map<std::string, std::string> m = extra;
  for (const char* k : kReserved)
    GEOLOCO_CHECK(!extra.count(k), "checkpoint metadata key '{}' is reserved for the model description", k);
  m.insert_or_assign("format", std::string(kModelFormat));
  m.insert_or_assign("format_version", std::string(kModelFormatVersion));
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

ModelConfig read_model_config(const SafetensorsFile& f) {
  if (f.metadata().count("format") && f.meta("format") != kModelFormat)
    throw FileError(f.path(), fmt::format("format '{}' is not a {} model", f.meta("format"), kModelFormat));
  if (f.metadata().count("format_version") && f.meta("format_version") != kModelFormatVersion)
    throw FileError(f.path(), fmt::format("model format_version '{}' is not supported (expected {})",
                                          f.meta("format_version"), kModelFormatVersion));
  ModelConfig c;
  c.n_layer = meta_int(f, "n_layer");
  c.n_head = meta_int(f, "n_head");
  c.n_embd = meta_int(f, "n_embd");
  c.vocab_size = meta_int(f, "vocab_size");
  c.block_size = meta_int(f, "n_positions");
  if (f.metadata().count("block_size") && meta_int(f, "block_size") != c.block_size)
    throw FileError(f.path(), fmt::format("metadata block_size {} differs from n_positions {}", f.meta("block_size"),
                                          c.block_size));
  return c;
}

ModelConfig read_model_config(const std::string& path) { return read_model_config(SafetensorsFile::read(path)); }

void check_model(const SafetensorsFile& f, const ParamLayout& layout) {
  // Hyperparameters first: "n_layer 4 vs 2" is a clearer message than a missing tensor.
  if (f.metadata().count("n_layer")) {
    const ModelConfig saved = read_model_config(f);
    const ModelConfig& want = layout.config();
    auto differ = [&](const char* key, int s, int w) {
      if (s != w)
        throw FileError(f.path(), fmt::format("checkpoint has {} = {}, this model has {}", key, s, w));
    };
    differ("n_layer", saved.n_layer, want.n_layer);
    differ("n_head", saved.n_head, want.n_head);
    differ("n_embd", saved.n_embd, want.n_embd);
    differ("block_size", saved.block_size, want.block_size);
    differ("vocab_size", saved.vocab_size, want.vocab_size);
  }
  std::set<std::string> used;
  for (const auto& v : layout.views()) {
    const std::string name = stored_name(f, v.name);
    if (name.empty()) throw FileError(f.path(), fmt::format("missing tensor '{}' (expected shape {})", v.name,
                                                            shape_string(v.shape)));
    const auto& t = f.info(name);
    if (t.dtype != Dtype::F32 && t.dtype != Dtype::BF16 && t.dtype != Dtype::F16)
      throw FileError(f.path(), fmt::format("tensor '{}' is {}, expected F32 (or BF16/F16, widened exactly)", name,
                                            dtype_name(t.dtype)));
    if (t.shape != v.shape)
      throw FileError(f.path(), fmt::format("tensor '{}' has the wrong shape: expected {}, found {}", name,
                                            shape_string(v.shape), shape_string(t.shape)));
    used.insert(name);
  }
  for (const auto& t : f.tensors())
    if (!used.count(t.name) && !ignorable_extra(t.name))
      throw FileError(f.path(), fmt::format("unexpected tensor '{}' {} (not part of this model)", t.name,
                                            shape_string(t.shape)));
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
  namespace fs = std::filesystem;
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
    if (e.is_directory(ec) && fs::is_regular_file(e.path() / "latest", ec)) sites.push_back(e.path().filename().string());
  std::sort(sites.begin(), sites.end());
  if (sites.size() == 1) return find_model_file((sites_dir / sites.front()).string());
  if (!sites.empty())
    throw FileError(path, fmt::format("holds the checkpoints of {} sites ({}): name one of them, e.g. {}", sites.size(),
                                      fmt::join(sites, ", "), (sites_dir / sites.front()).string()));
  throw FileError(path, "directory has no model.safetensors, no 'latest' checkpoint pointer and no site checkpoints");
}

void load_model(const std::string& path, const ParamLayout& layout, std::span<float> params) {
  load_model(SafetensorsFile::read(path), layout, params);
}

}  // namespace geoloco::trainer
