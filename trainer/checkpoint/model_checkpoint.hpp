// GPT-2 model checkpoints as safetensors, loadable by Hugging Face's GPT2LMHeadModel:
// every ParamLayout view is one F32 tensor under its HF name and HF shape (Conv1D weights
// [in, out], e.g. attn.c_attn.weight [n_embd, 3*n_embd]); the LM head is tied to wte and
// not stored.
//
// __metadata__ carries:
//   format = "geoloco-gpt2", format_version = "1"     (what and which version this file is)
//   n_layer, n_head, n_embd, n_positions (= block_size), block_size, vocab_size  (decimal)
//   + the caller's keys (e.g. step, run id, config hash); they may not redefine the above.
#pragma once

#include <map>
#include <span>
#include <string>
#include <vector>

#include "trainer/checkpoint/safetensors.hpp"
#include "trainer/model/model_config.hpp"
#include "trainer/model/param_layout.hpp"

namespace geoloco::trainer {

inline constexpr const char* kModelFormat = "geoloco-gpt2";
inline constexpr const char* kModelFormatVersion = "1";

// Tensors (views into `params`, which must outlive their use) and metadata of a model, for
// callers that put the model into a larger checkpoint with other state.
std::vector<TensorWrite> model_tensors(const ParamLayout& layout, std::span<const float> params);
std::map<std::string, std::string> model_metadata(const ModelConfig& cfg,
                                                  const std::map<std::string, std::string>& extra);

// Atomic write of the whole model. Throws geoloco::Error on a size mismatch, a reserved
// metadata key, or an I/O failure.
void save_model(const std::string& path, const ParamLayout& layout, std::span<const float> params,
                const std::map<std::string, std::string>& metadata = {});

// Fills `params` (layout.total() floats); BF16 and F16 tensors (half-precision exports) are
// widened exactly. FileError naming the file and the tensor when a tensor is missing, has
// another dtype or shape ("expected [128, 384], found [128, 256]"),
// when the file holds a tensor the layout does not have (a deeper model), or when its
// hyperparameter metadata disagrees with the layout. Files without geoloco metadata (e.g.
// exported by Hugging Face) load when their tensors match; names without the
// "transformer." prefix (GPT2Model) and HF's non-parameter buffers (attn.bias,
// attn.masked_bias) and the tied lm_head.weight are accepted.
void load_model(const std::string& path, const ParamLayout& layout, std::span<float> params);
void load_model(const SafetensorsFile& file, const ParamLayout& layout, std::span<float> params);

// Every check of load_model without copying anything: FileError when `file` cannot fill
// `layout` (what validation calls before a run).
void check_model(const SafetensorsFile& file, const ParamLayout& layout);

// The model file a user names (train.init_from): `path` when it is a file; for a directory,
// its model.safetensors (a checkpoint step directory), else the model of the checkpoint its
// `latest` pointer names (a site's checkpoint directory), else, for a run's output directory
// or its checkpoints/, the one site's latest model. FileError naming the path when none
// applies or several sites' checkpoints are there (the message lists them).
std::string find_model_file(const std::string& path);

// The model hyperparameters stored in a checkpoint's metadata. FileError when absent or
// not an integer.
ModelConfig read_model_config(const std::string& path);
ModelConfig read_model_config(const SafetensorsFile& file);

}  // namespace geoloco::trainer
