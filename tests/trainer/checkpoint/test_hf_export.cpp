// Hugging Face GPT-2 exports in, Hugging Face directories out: a save_pretrained layout
// (format "pt", config.json beside it, either naming, mask buffers, a tied lm_head) loads to
// exactly the weights written; every way config.json or the extra tensors can be wrong is a
// FileError naming the file and the key or tensor; geoloco's own directories carry a
// config.json that this same HF path accepts.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "tests/trainer/checkpoint/checkpoint_test_util.hpp"
#include "tests/trainer/checkpoint/hf_export.hpp"
#include "tests/support/temp_dir.hpp"
#include "trainer/checkpoint/model_checkpoint.hpp"
#include "core/error.hpp"

using namespace geoloco;
using namespace geoloco::trainer;
using geoloco::test::HfExportOptions;
using geoloco::test::TempDir;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

ModelConfig small() { return {.n_layer = 2, .n_head = 2, .n_embd = 8, .block_size = 16, .vocab_size = 32}; }

using trainer::test::file_error;
using trainer::test::filled;

// What a loader refuses, through each entry point: read_model_config (eval, sample) and
// check_model / load_model against the matching layout (train.init_from).
void expect_refused(const std::string& model, const ParamLayout& L, const std::string& want) {
  SCOPED_TRACE(want);
  EXPECT_EQ(file_error([&] { read_model_config(model); }), want);
  EXPECT_EQ(file_error([&] { check_model(read_safetensors(model), L); }), want);
  std::vector<float> q(static_cast<size_t>(L.total()));
  EXPECT_EQ(file_error([&] { load_model(model, L, q); }), want);
}

void write_json(const fs::path& p, const json& j) { std::ofstream(p, std::ios::trunc) << j.dump(2); }

}  // namespace

TEST(HfExport, SavePretrainedLayoutsLoadToExactlyTheWeightsWritten) {
  const ParamLayout L(small());
  const auto p = filled(L);
  for (bool prefixed : {true, false})
    for (bool lm_head : {false, true})
      for (const char* mask : {"", "BOOL", "F32"}) {
        SCOPED_TRACE(::testing::Message() << "prefixed " << prefixed << " lm_head " << lm_head << " mask " << mask);
        TempDir dir;
        const HfExportOptions o{
            .prefixed = prefixed, .mask_buffers = *mask != 0, .mask_dtype = *mask ? mask : "BOOL", .lm_head = lm_head};
        const std::string model = geoloco::test::write_hf_export(dir.path(), L, p, o);
        // The fixture is what it claims: no geoloco metadata, no checksums, not in layout order.
        const auto f = read_safetensors(model);
        EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
        EXPECT_FALSE(f.checksummed());
        EXPECT_EQ(f.has("lm_head.weight"), lm_head);
        EXPECT_EQ(f.has(prefixed ? "transformer.h.1.attn.bias" : "h.1.attn.bias"), *mask != 0);
        EXPECT_NE(f.tensors().front().name, L.views().front().name.substr(prefixed ? 0 : 12));  // "h.0..." or "lm_head"

        EXPECT_EQ(find_model_file(dir.path().string()), model);
        EXPECT_EQ(read_model_config(model), small());
        std::vector<float> q(p.size(), 0.0f);
        load_model(model, L, q);
        EXPECT_EQ(std::memcmp(p.data(), q.data(), p.size() * 4), 0);
      }
}

TEST(HfExport, NoFormatAtAllLoadsLikePt) {
  TempDir dir;
  const ParamLayout L(small());
  const auto p = filled(L);
  const std::string model = geoloco::test::write_hf_export(dir.path(), L, p);
  geoloco::test::write_bytes(model, geoloco::test::encode_like_python(geoloco::test::hf_tensors(L, p), {}));
  EXPECT_TRUE(read_safetensors(model).metadata().empty());
  std::vector<float> q(p.size());
  load_model(model, L, q);
  EXPECT_EQ(q, p);
}

TEST(HfExport, BadConfigJsonIsRefusedNamingItAndTheKey) {
  TempDir dir;
  const ParamLayout L(small());
  const std::string model = geoloco::test::write_hf_export(dir.path(), L, filled(L));
  const fs::path cfg = dir.path() / "config.json";
  const std::string at = cfg.string() + ": ";
  const json good = geoloco::test::hf_config(small());

  fs::remove(cfg);
  expect_refused(model, L,
                 at + "no such file; " + model +
                     " has no hyperparameters in its __metadata__ (a PyTorch or Hugging "
                     "Face export), so they are read from the config.json beside it");
  std::ofstream(cfg) << "{\"n_layer\": 2, \"n_head\": ";
  EXPECT_NE(file_error([&] { read_model_config(model); }).find(at + "not valid JSON: "), std::string::npos);
  std::ofstream(cfg, std::ios::trunc) << "{\"n_head\": 2, \"n_head\": 4}";
  expect_refused(model, L, at + "duplicate key 'n_head'");
  std::ofstream(cfg, std::ios::trunc) << "[2, 2, 8]";
  expect_refused(model, L, at + "not a JSON object");

  auto with = [&](const char* key, const json& value) {
    json j = good;
    if (value.is_discarded())
      j.erase(key);
    else
      j[key] = value;
    write_json(cfg, j);
  };
  const json absent = json::value_t::discarded;
  with("n_head", absent);
  expect_refused(model, L, at + "missing key 'n_head'");
  with("n_positions", absent);
  expect_refused(model, L, at + "missing key 'n_positions'");
  with("n_embd", "8");
  expect_refused(model, L, at + "'n_embd' is \"8\", expected an integer in [1, 65536]");
  with("n_layer", 0);
  expect_refused(model, L, at + "'n_layer' is 0, expected an integer in [1, 1024]");
  with("n_head", 3);
  expect_refused(model, L, at + "'n_embd' is 8, not a multiple of 'n_head' (3)");
  with("model_type", "gpt_neo");
  expect_refused(model, L, at + "'model_type' is \"gpt_neo\", expected \"gpt2\"");

  // Contradicting the tensors beside it.
  with("n_embd", 16);
  expect_refused(model, L, at + "'n_embd' is 16, but " + model + " holds 'transformer.wte.weight' [32, 8]");
  with("vocab_size", 50257);
  expect_refused(model, L, at + "'vocab_size' is 50257, but " + model + " holds 'transformer.wte.weight' [32, 8]");
  json longer = good;
  longer["n_positions"] = longer["n_ctx"] = 1024;
  write_json(cfg, longer);
  expect_refused(model, L, at + "'n_positions' is 1024, but " + model + " holds 'transformer.wpe.weight' [16, 8]");
  with("n_layer", 3);
  expect_refused(model, L, at + "'n_layer' is 3, but " + model + " holds blocks h.0 to h.1");
  with("n_ctx", 8);
  expect_refused(model, L,
                 at + "'n_ctx' is 8, but 'n_positions' is 16: geoloco has one context length (model.block_size)");

  // Contradicting what geoloco computes.
  with("layer_norm_epsilon", 1e-6);
  expect_refused(model, L, at + "'layer_norm_epsilon' is 1e-06, but geoloco's layer norm uses 1e-05");
  with("activation_function", "gelu");
  expect_refused(model, L,
                 at + "'activation_function' is \"gelu\", but geoloco's GELU is the tanh approximation "
                      "(\"gelu_new\" or \"gelu_pytorch_tanh\")");
  with("n_inner", 64);
  expect_refused(model, L, at + "'n_inner' is 64, but geoloco's MLP is 4 * n_embd = 32 wide (expected null)");
  with("tie_word_embeddings", false);
  expect_refused(model, L, at + "'tie_word_embeddings' is false, but geoloco ties the LM head to wte (expected true)");
  with("scale_attn_by_inverse_layer_idx", true);
  expect_refused(model, L,
                 at + "'scale_attn_by_inverse_layer_idx' is true, but geoloco does not scale attention by "
                      "layer (expected false)");

  // Equivalent spellings and keys geoloco has no use for are fine.
  with("activation_function", "gelu_pytorch_tanh");
  EXPECT_EQ(read_model_config(model), small());
  with("n_inner", 32);
  EXPECT_EQ(read_model_config(model), small());
  with("n_ctx", absent);
  EXPECT_EQ(read_model_config(model), small());
}

// The config agrees with its tensors but not with the model the run describes; n_head has no
// tensor of its own, so only config.json can tell.
TEST(HfExport, ConfigThatDisagreesWithTheRunsModelIsNamed) {
  TempDir dir;
  const ParamLayout L(small());
  const std::string model = geoloco::test::write_hf_export(dir.path(), L, filled(L));
  const std::string cfg = (dir.path() / "config.json").string();
  ModelConfig heads = small();
  heads.n_head = 4;
  std::vector<float> q(static_cast<size_t>(L.total()));
  EXPECT_EQ(file_error([&] { load_model(model, ParamLayout(heads), q); }),
            cfg + ": checkpoint has n_head = 2, this model has 4");
  ModelConfig shorter = small();
  shorter.block_size = 8;
  ParamLayout S(shorter);
  std::vector<float> r(static_cast<size_t>(S.total()));
  EXPECT_EQ(file_error([&] { load_model(model, S, r); }),
            cfg +
                ": checkpoint has n_positions = 16, this model has block_size = 8 (geoloco's wpe has block_size "
                "rows: set model.block_size to 16; train.seq_len may stay shorter)");
}

TEST(HfExport, LmHeadMustEqualTheTiedWte) {
  TempDir dir;
  const ParamLayout L(small());
  const auto p = filled(L);
  auto tensors = geoloco::test::hf_tensors(L, p, {.lm_head = true});
  auto head = std::find_if(tensors.begin(), tensors.end(), [](const auto& t) { return t.name == "lm_head.weight"; });
  ASSERT_NE(head, tensors.end());
  const std::string model = geoloco::test::write_hf_export(dir.path(), L, p);
  std::vector<float> q(p.size());
  auto refused = [&] {
    geoloco::test::write_bytes(model, geoloco::test::encode_like_python(tensors, {{"format", "pt"}}));
    const std::string a = file_error([&] { check_model(read_safetensors(model), L); });
    EXPECT_EQ(file_error([&] { load_model(model, L, q); }), a);
    return a;
  };
  const std::string tied = ": geoloco ties the LM head to the token embedding and cannot load a separate one";
  head->bytes[100] ^= 1;  // one value, one bit
  EXPECT_EQ(refused(), model + ": tensor 'lm_head.weight' holds other values than 'transformer.wte.weight'" + tied);
  head->bytes[100] ^= 1;
  head->dtype = "F16";  // same bytes, read as twice as many halves
  head->shape = {64, 8};
  EXPECT_EQ(refused(), model + ": tensor 'lm_head.weight' is F16 [64, 8], 'transformer.wte.weight' F32 [32, 8]" + tied);
  head->dtype = "F32";
  head->shape = {32, 8};
  EXPECT_EQ(refused(), "<no FileError>");  // the exact copy is fine
  EXPECT_EQ(q, p);
}

TEST(HfExport, BuffersAreCheckedAndUnknownTensorsStayErrors) {
  TempDir dir;
  const ParamLayout L(small());
  const auto p = filled(L);
  const std::string model = geoloco::test::write_hf_export(dir.path(), L, p);
  std::vector<float> q(p.size());
  auto rewrite = [&](const std::function<void(std::vector<geoloco::test::RawTensor>&)>& edit,
                     std::map<std::string, std::string> meta = {{"format", "pt"}}) {
    auto t = geoloco::test::hf_tensors(L, p);
    edit(t);
    geoloco::test::write_bytes(model, geoloco::test::encode_like_python(t, meta));
  };
  auto named = [](std::vector<geoloco::test::RawTensor>& t, const std::string& n) -> geoloco::test::RawTensor& {
    return *std::find_if(t.begin(), t.end(), [&](const auto& x) { return x.name == n; });
  };

  rewrite([&](auto& t) {
    auto& b = named(t, "transformer.h.1.attn.bias");
    b.shape = {1, 1, 8, 32};  // same bytes, not a square mask
  });
  EXPECT_EQ(file_error([&] { load_model(model, L, q); }),
            model +
                ": buffer 'transformer.h.1.attn.bias' has shape [1, 1, 8, 32], expected [1, 1, 16, 16] (the "
                "causal mask over n_positions = 16)");
  rewrite([&](auto& t) {
    auto& b = named(t, "transformer.h.0.attn.masked_bias");
    b.shape = {1, 1};
  });
  EXPECT_EQ(file_error([&] { load_model(model, L, q); }),
            model + ": buffer 'transformer.h.0.attn.masked_bias' has shape [1, 1], expected [] (a scalar)");
  rewrite([&](auto& t) { t.push_back({"transformer.h.0.attn.rotary", "F32", {1}, std::vector<uint8_t>(4)}); });
  EXPECT_EQ(file_error([&] { load_model(model, L, q); }),
            model + ": unexpected tensor 'transformer.h.0.attn.rotary' [1] (not part of this model)");
  rewrite([&](auto& t) { t.push_back({"score.weight", "F32", {2, 8}, std::vector<uint8_t>(64)}); });
  EXPECT_EQ(file_error([&] { load_model(model, L, q); }),
            model + ": unexpected tensor 'score.weight' [2, 8] (not part of this model)");
  rewrite([](auto&) {}, {{"format", "flax"}});
  expect_refused(model, L,
                 model + ": format 'flax' is neither a geoloco-gpt2 model nor a PyTorch export (format 'pt')");
  rewrite([](auto&) {});
  load_model(model, L, q);
  EXPECT_EQ(q, p);
}

TEST(HfExport, ShardedAndPickleDirectoriesAreNamed) {
  TempDir dir;
  std::ofstream(dir.path() / "model.safetensors.index.json") << "{}";
  EXPECT_NE(file_error([&] {
              find_model_file(dir.path().string());
            }).find(dir.path().string() + ": holds a sharded export (model.safetensors.index.json)"),
            std::string::npos);
  fs::remove(dir.path() / "model.safetensors.index.json");
  std::ofstream(dir.path() / "pytorch_model.bin") << "pickle";
  EXPECT_NE(file_error([&] {
              find_model_file(dir.path().string());
            }).find(dir.path().string() + ": holds pytorch_model.bin (a pickle)"),
            std::string::npos);
}

// geoloco's directories: config.json with what GPT2LMHeadModel.from_pretrained needs, and
// format "pt" (transformers refuses other formats). The config passes the same checks an
// HF export's does: with the geoloco metadata stripped, the directory still loads.
TEST(HfExport, SavedDirectoriesCarryAConfigJsonHuggingFaceAccepts) {
  TempDir dir;
  const ModelConfig c{.n_layer = 3, .n_head = 4, .n_embd = 16, .block_size = 12, .vocab_size = 50257};
  const ParamLayout L(c);
  const auto p = filled(L);
  save_model_directory(dir.path().string(), L, p, {{"geoloco_step", "7"}});
  const std::string model = (dir.path() / "model.safetensors").string();
  const auto f = read_safetensors(model);
  EXPECT_EQ(f.meta("format"), "pt");
  EXPECT_EQ(f.meta("geoloco.format"), "geoloco-gpt2");
  EXPECT_EQ(f.meta("geoloco_step"), "7");

  const json j = json::parse(std::ifstream(dir.path() / "config.json"));
  EXPECT_EQ(j["model_type"], "gpt2");
  EXPECT_EQ(j["architectures"], json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(j["n_layer"], 3);
  EXPECT_EQ(j["n_head"], 4);
  EXPECT_EQ(j["n_embd"], 16);
  EXPECT_EQ(j["n_positions"], 12);
  EXPECT_EQ(j["n_ctx"], 12);
  EXPECT_EQ(j["vocab_size"], 50257);
  EXPECT_EQ(j["bos_token_id"], 50256);
  EXPECT_EQ(j["eos_token_id"], 50256);
  EXPECT_EQ(j["layer_norm_epsilon"].get<double>(), 1e-5);
  EXPECT_EQ(j["activation_function"], "gelu_new");
  EXPECT_EQ(j["tie_word_embeddings"], true);
  EXPECT_TRUE(j["n_inner"].is_null());
  for (const char* k : {"attn_pdrop", "embd_pdrop", "resid_pdrop", "summary_first_dropout"})
    EXPECT_EQ(j[k].get<double>(), 0.0) << k;
  for (const auto& e : fs::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path() << " left behind";

  // The metadata is what geoloco reads: a config.json saying otherwise is not consulted.
  std::ofstream(dir.path() / "config.json", std::ios::app) << "garbage";
  EXPECT_EQ(read_model_config(model), c);
  // Without the metadata (as an HF round trip would write it), geoloco's own config.json is
  // the source, and it is accepted.
  std::ofstream(dir.path() / "config.json", std::ios::trunc) << hf_config_json(c);
  auto t = geoloco::test::hf_tensors(L, p, {.mask_buffers = false});
  geoloco::test::write_bytes(model, geoloco::test::encode_like_python(t, {{"format", "pt"}}));
  EXPECT_EQ(read_model_config(model), c);
  std::vector<float> q(p.size());
  load_model(model, L, q);
  EXPECT_EQ(q, p);
}

// Files written before geoloco moved its format tag to "pt" still load.
TEST(HfExport, OlderGeolocoFilesStillLoad) {
  TempDir dir;
  const ParamLayout L(small());
  const auto p = filled(L);
  auto meta = model_metadata(small(), {});
  meta.erase("geoloco.format");
  meta.erase("geoloco.format_version");
  meta["format"] = "geoloco-gpt2";
  meta["format_version"] = "1";
  const std::string model = dir.file("old.safetensors");  // no config.json anywhere
  write_safetensors(model, model_tensors(L, p), meta);
  EXPECT_EQ(read_model_config(model), small());
  std::vector<float> q(p.size());
  load_model(model, L, q);
  EXPECT_EQ(q, p);
  meta["format_version"] = "2";
  write_safetensors(model, model_tensors(L, p), meta);
  expect_refused(model, L, model + ": model format_version '2' is not supported (expected 1)");
}
