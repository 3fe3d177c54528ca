// Test fixture: a model directory laid out exactly as Hugging Face's
// GPT2LMHeadModel.save_pretrained(dir, safe_serialization=True) writes it, without Python:
//   model.safetensors as the safetensors package serializes it: __metadata__ {"format": "pt"}
//     and nothing else (no geoloco checksums or hyperparameters), a compact JSON header
//     padded with spaces to a multiple of 8, tensors ordered by dtype (widest first) then
//     name -- so not in ParamLayout order;
//   config.json as GPT2Config.save_pretrained writes it (sorted keys, old files' n_ctx,
//     dropouts 0.1, GPT-2's bos/eos 50256 whatever the vocabulary).
// Options pick GPT2Model names (no "transformer." prefix), the causal-mask buffers older
// transformers versions saved, and an untied-looking lm_head.weight copy of wte.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trainer/model/param_layout.hpp"

namespace geoloco::test {

struct RawTensor {
  std::string name;
  std::string dtype;  // "F32", "BOOL", ...
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

inline std::vector<uint8_t> f32_bytes(std::span<const float> v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// safetensors' own serialization (safetensors/src/tensor.rs: prepare + serialize).
inline std::vector<uint8_t> encode_like_python(std::vector<RawTensor> tensors,
                                               const std::map<std::string, std::string>& metadata) {
  // Rust's Dtype order; sorted descending, so F32 precedes BOOL.
  static const std::vector<std::string> kOrder = {"BOOL", "U8",  "I8",  "F8_E5M2", "F8_E4M3", "I16", "U16", "F16",
                                                  "BF16", "I32", "U32", "F32",     "F64",     "I64", "U64"};
  auto rank = [&](const std::string& d) { return std::find(kOrder.begin(), kOrder.end(), d) - kOrder.begin(); };
  std::stable_sort(tensors.begin(), tensors.end(), [&](const RawTensor& a, const RawTensor& b) {
    return rank(a.dtype) != rank(b.dtype) ? rank(a.dtype) > rank(b.dtype) : a.name < b.name;
  });
  nlohmann::ordered_json h;
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  std::vector<uint8_t> data;
  for (const auto& t : tensors) {
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
    data.insert(data.end(), t.bytes.begin(), t.bytes.end());
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  const uint64_t n = header.size();
  std::vector<uint8_t> out(8 + header.size() + data.size());
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  if (!data.empty()) std::memcpy(out.data() + 8 + header.size(), data.data(), data.size());
  return out;
}

inline void write_bytes(const std::filesystem::path& path, std::span<const uint8_t> bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

struct HfExportOptions {
  bool prefixed = true;             // GPT2LMHeadModel names ("transformer.h.0..."); false: GPT2Model's
  bool mask_buffers = true;         // h.{i}.attn.bias [1, 1, P, P] and h.{i}.attn.masked_bias []
  std::string mask_dtype = "BOOL";  // transformers >= 4.2x: BOOL; older: F32 (or U8)
  bool lm_head = false;             // lm_head.weight: a copy of wte (tied)
};

// GPT2Config.save_pretrained's config.json for `c`.
inline nlohmann::json hf_config(const trainer::ModelConfig& c) {
  return {{"activation_function", "gelu_new"},
          {"architectures", nlohmann::json::array({"GPT2LMHeadModel"})},
          {"attn_pdrop", 0.1},
          {"bos_token_id", 50256},
          {"embd_pdrop", 0.1},
          {"eos_token_id", 50256},
          {"initializer_range", 0.02},
          {"layer_norm_epsilon", 1e-05},
          {"model_type", "gpt2"},
          {"n_ctx", c.block_size},
          {"n_embd", c.n_embd},
          {"n_head", c.n_head},
          {"n_inner", nullptr},
          {"n_layer", c.n_layer},
          {"n_positions", c.block_size},
          {"reorder_and_upcast_attn", false},
          {"resid_pdrop", 0.1},
          {"scale_attn_by_inverse_layer_idx", false},
          {"scale_attn_weights", true},
          {"summary_activation", nullptr},
          {"summary_first_dropout", 0.1},
          {"summary_proj_to_labels", true},
          {"summary_type", "cls_index"},
          {"summary_use_proj", true},
          {"task_specific_params", {{"text-generation", {{"do_sample", true}, {"max_length", 50}}}}},
          {"torch_dtype", "float32"},
          {"transformers_version", "4.41.2"},
          {"use_cache", true},
          {"vocab_size", c.vocab_size}};
}

// The state dict save_pretrained stores for these parameters (laid out by `layout`).
inline std::vector<RawTensor> hf_tensors(const trainer::ParamLayout& layout, std::span<const float> params,
                                         const HfExportOptions& o = {}) {
  const std::string prefix = "transformer.";
  std::vector<RawTensor> out;
  for (const auto& v : layout.views()) {
    const auto values = params.subspan(static_cast<size_t>(v.offset), static_cast<size_t>(v.numel));
    out.push_back({o.prefixed ? v.name : v.name.substr(prefix.size()), "F32", v.shape, f32_bytes(values)});
    if (o.lm_head && v.name == "transformer.wte.weight")
      out.push_back({"lm_head.weight", "F32", v.shape, f32_bytes(values)});
  }
  if (o.mask_buffers) {
    const int64_t P = layout.config().block_size;
    const size_t elem = o.mask_dtype == "F32" ? 4 : 1;
    std::vector<uint8_t> mask(static_cast<size_t>(P * P) * elem, 0);
    for (int64_t r = 0; r < P; ++r)
      for (int64_t c = 0; c <= r; ++c) {
        if (elem == 4) {
          const float one = 1.0f;
          std::memcpy(&mask[static_cast<size_t>(r * P + c) * 4], &one, 4);
        } else {
          mask[static_cast<size_t>(r * P + c)] = 1;
        }
      }
    const float masked_bias = -1e4f;
    for (int i = 0; i < layout.config().n_layer; ++i) {
      const std::string h = (o.prefixed ? prefix : std::string()) + "h." + std::to_string(i) + ".attn.";
      out.push_back({h + "bias", o.mask_dtype, {1, 1, P, P}, mask});
      out.push_back({h + "masked_bias", "F32", {}, f32_bytes(std::span<const float>(&masked_bias, 1))});
    }
  }
  return out;
}

// dir/model.safetensors and dir/config.json; returns the model file's path.
inline std::string write_hf_export(const std::filesystem::path& dir, const trainer::ParamLayout& layout,
                                   std::span<const float> params, const HfExportOptions& o = {}) {
  std::filesystem::create_directories(dir);
  const auto model = dir / "model.safetensors";
  write_bytes(model, encode_like_python(hf_tensors(layout, params, o), {{"format", "pt"}}));
  std::ofstream(dir / "config.json", std::ios::trunc) << hf_config(layout.config()).dump(2) << "\n";
  return model.string();
}

}  // namespace geoloco::test
