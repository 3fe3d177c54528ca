// GPT-2 model checkpoints as safetensors, in the directory layout Hugging Face's
// GPT2LMHeadModel.from_pretrained(dir) loads: dir/model.safetensors with every ParamLayout
// view as one F32 tensor under its HF name and HF shape (Conv1D weights [in, out], e.g.
// transformer.h.0.attn.c_attn.weight [n_embd, 3*n_embd]; the LM head is tied to wte and not
// stored), and dir/config.json with the hyperparameters (hf_config_json).
//
// __metadata__ of the files geoloco writes:
//   format = "pt"                  (transformers refuses a safetensors file whose format is
//                                   not one of pt/tf/flax/mlx)
//   geoloco.format = "geoloco-gpt2", geoloco.format_version = "1"   (what and which version)
//   n_layer, n_head, n_embd, n_positions (= block_size), block_size, vocab_size  (decimal)
//   + the caller's keys (e.g. step, run id, config hash); they may not redefine the above.
// Files written before the move to "pt" carry format = "geoloco-gpt2", format_version = "1"
// instead; they load as before.
//
// What loads (load_model, check_model, read_model_config):
//   * geoloco's files (either identity above), and any file whose __metadata__ holds the
//     hyperparameters: they come from __metadata__ (config.json beside it is not read);
//   * a PyTorch / Hugging Face export: format "pt" or no format, no hyperparameters in
//     __metadata__ (GPT2LMHeadModel.save_pretrained(dir, safe_serialization=True)). The
//     hyperparameters come from config.json in the same directory (n_layer, n_head, n_embd,
//     n_positions, vocab_size; n_ctx, when present, must equal n_positions), which must
//     also describe geoloco's computation where it says anything about it: model_type
//     "gpt2", layer_norm_epsilon 1e-5, activation_function gelu_new (or gelu_pytorch_tanh,
//     the same tanh approximation), n_inner null or 4*n_embd, tie_word_embeddings,
//     scale_attn_weights true, scale_attn_by_inverse_layer_idx and add_cross_attention
//     false. It must agree with the tensors (wte [vocab_size, n_embd], wpe [n_positions,
//     n_embd], blocks h.0 .. h.{n_layer-1}). A config.json that is missing, not JSON (or
//     with a duplicate key), lacks a key, has a wrong type or contradicts the tensors or
//     geoloco is a FileError naming config.json and the key.
//   Tensor names may carry the "transformer." prefix (GPT2LMHeadModel) or not (GPT2Model).
//   Besides the parameters a file may hold only HF's non-parameter buffers of the blocks it
//   has, h.{i}.attn.bias (the causal mask, shape [1, 1, n_positions, n_positions]) and
//   h.{i}.attn.masked_bias (a scalar, shape [] or [1]), which are skipped, and
//   lm_head.weight when it equals the stored wte exactly (dtype, shape and bytes: geoloco
//   ties the head to wte, so it cannot load a separate one). Everything else -- a missing or
//   unknown tensor, another dtype than F32/BF16/F16, another shape -- is a FileError naming
//   the file and the tensor, as are other formats ("flax", "tf", ...).
//
// Context length: geoloco's position table wpe is [block_size, n_embd], so block_size IS
// n_positions; an export with n_positions 1024 loads only into model.block_size: 1024
// (train.seq_len and eval --seq-len may use shorter windows). Rows of wpe are never cut or
// padded: the model loaded is exactly the one saved.
#pragma once

#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/safetensors.hpp"
#include "trainer/model/model_config.hpp"
#include "trainer/model/param_layout.hpp"

namespace geoloco::trainer {

inline constexpr const char* kModelFormat = "geoloco-gpt2";
inline constexpr const char* kModelFormatVersion = "1";
inline constexpr const char* kTorchFormat = "pt";  // safetensors' own format tag for PyTorch files

// Tensors (views into `params`, which must outlive their use) and metadata of a model, for
// callers that put the model into a larger checkpoint with other state.
std::vector<TensorWrite> model_tensors(const ParamLayout& layout, std::span<const float> params);
std::map<std::string, std::string> model_metadata(const ModelConfig& cfg,
                                                  const std::map<std::string, std::string>& extra);

// Atomic write of the model file alone (no config.json). Throws geoloco::Error on a size
// mismatch, a reserved metadata key, or an I/O failure.
void save_model(const std::string& path, const ParamLayout& layout, std::span<const float> params,
                const std::map<std::string, std::string>& metadata = {});

// Writes `dir`/config.json (hf_config_json), then `dir`/model.safetensors (save_model), each
// atomically: a directory GPT2LMHeadModel.from_pretrained(dir) loads as is. `dir` must exist.
// What the trainer writes for every checkpoint.
void save_model_directory(const std::string& dir, const ParamLayout& layout, std::span<const float> params,
                          const std::map<std::string, std::string>& metadata = {});

// Hugging Face's GPT2Config for `cfg` as config.json text: model_type gpt2, architectures
// [GPT2LMHeadModel], n_layer, n_head, n_embd, n_positions = n_ctx = block_size, vocab_size,
// and geoloco's computation: layer_norm_epsilon 1e-5, activation_function gelu_new (the tanh
// approximation geoloco's kernels use), tie_word_embeddings true, scaled attention, no
// dropout; bos/eos token ids vocab_size - 1 (GPT-2's <|endoftext|> 50256 for its vocabulary).
std::string hf_config_json(const ModelConfig& cfg);

// Fills `params` (layout.total() floats); BF16 and F16 tensors (half-precision exports) are
// widened exactly. Everything check_model refuses is refused first.
void load_model(const std::string& path, const ParamLayout& layout, std::span<float> params);
void load_model(const SafetensorsFile& file, const ParamLayout& layout, std::span<float> params);

// Every check of load_model without copying anything (what validation calls before a run):
// the file's hyperparameters (read_model_config) against the layout's ("checkpoint has
// n_embd = 8, this model has 16", naming the file they came from: the model file or its
// config.json), then every tensor (see the top of this file): FileError when `file` cannot
// fill `layout`.
void check_model(const SafetensorsFile& file, const ParamLayout& layout);

// The model file a user names (train.init_from): `path` when it is a file; for a directory,
// its model.safetensors (a checkpoint step directory), else the model of the checkpoint its
// `latest` pointer names (a site's checkpoint directory), else, for a run's output directory
// or its checkpoints/, the one site's latest model. FileError naming the path when none
// applies or several sites' checkpoints are there (the message lists them); a directory with
// only a sharded export (model.safetensors.index.json) or a pickle (pytorch_model.bin) is
// told so.
std::string find_model_file(const std::string& path);

// The model hyperparameters of a checkpoint: from its __metadata__, or for a PyTorch /
// Hugging Face export from the config.json beside it (see the top of this file). FileError
// naming the file and the key when absent, malformed or contradicted.
ModelConfig read_model_config(const std::string& path);
ModelConfig read_model_config(const SafetensorsFile& file);

}  // namespace geoloco::trainer
