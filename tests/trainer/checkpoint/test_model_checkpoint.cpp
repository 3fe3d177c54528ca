// GPT-2 model checkpoints: HF names and shapes, exact round trip, and errors that name the
// tensor with expected vs found shapes.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "tests/trainer/checkpoint/checkpoint_test_util.hpp"
#include "tests/support/temp_dir.hpp"
#include "trainer/checkpoint/model_checkpoint.hpp"
#include "core/error.hpp"

using namespace geoloco;
using namespace geoloco::trainer;
using geoloco::test::TempDir;

namespace {

ModelConfig small(int n_layer = 2, int n_embd = 8) {
  ModelConfig c;
  c.n_layer = n_layer;
  c.n_head = 2;
  c.n_embd = n_embd;
  c.block_size = 16;
  c.vocab_size = 32;
  return c;
}

using trainer::test::file_error;
using trainer::test::filled;

}  // namespace

TEST(ModelCheckpoint, RoundTripIsBitExactWithHfNamesShapesAndMetadata) {
  TempDir dir;
  ParamLayout L(small());
  const auto p = filled(L);
  const auto path = dir.file("model.safetensors");
  save_model(path, L, p, {{"step", "1200"}, {"run", "abc"}});

  std::vector<float> q(p.size(), 0.0f);
  load_model(path, L, q);
  EXPECT_EQ(std::memcmp(p.data(), q.data(), p.size() * 4), 0);

  auto f = read_safetensors(path);
  EXPECT_EQ(f.tensors().size(), L.views().size());
  EXPECT_EQ(f.info("transformer.h.0.attn.c_attn.weight").shape, (std::vector<int64_t>{8, 24}));  // [C, 3C]
  EXPECT_EQ(f.info("transformer.h.1.mlp.c_proj.weight").shape, (std::vector<int64_t>{32, 8}));   // [4C, C]
  EXPECT_EQ(f.info("transformer.wte.weight").shape, (std::vector<int64_t>{32, 8}));
  EXPECT_EQ(f.info("transformer.wpe.weight").shape, (std::vector<int64_t>{16, 8}));
  EXPECT_EQ(f.info("transformer.ln_f.bias").shape, (std::vector<int64_t>{8}));
  EXPECT_FALSE(f.has("lm_head.weight"));  // tied to wte
  EXPECT_EQ(f.meta("format"), "pt");      // what transformers requires
  EXPECT_EQ(f.meta("geoloco.format"), "geoloco-gpt2");
  EXPECT_EQ(f.meta("geoloco.format_version"), "1");
  EXPECT_EQ(f.meta("n_positions"), "16");
  EXPECT_EQ(f.meta("step"), "1200");
  EXPECT_EQ(f.meta("run"), "abc");
  EXPECT_EQ(read_model_config(path), small());
  // Tensor data in layout order: the file's data region is the flat buffer itself.
  EXPECT_EQ(f.tensors().front().name, "transformer.wte.weight");
  EXPECT_EQ(f.tensors().back().name, "transformer.ln_f.bias");
  EXPECT_EQ(f.tensors().back().end, static_cast<uint64_t>(L.total()) * 4);
}

TEST(ModelCheckpoint, HyperparameterMismatchIsNamed) {
  TempDir dir;
  ParamLayout L(small(2, 8));
  const auto path = dir.file("m.safetensors");
  save_model(path, L, filled(L));
  ParamLayout wide(small(2, 16));
  std::vector<float> q(static_cast<size_t>(wide.total()));
  EXPECT_EQ(file_error([&] { load_model(path, wide, q); }), path + ": checkpoint has n_embd = 8, this model has 16");
  ParamLayout deep(small(3, 8));
  std::vector<float> r(static_cast<size_t>(deep.total()));
  EXPECT_EQ(file_error([&] { load_model(path, deep, r); }), path + ": checkpoint has n_layer = 2, this model has 3");
}

TEST(ModelCheckpoint, ShapeMismatchNamesTensorExpectedAndFound) {
  // No metadata (as a foreign exporter might write; hyperparameters in config.json): the
  // per-tensor checks catch it.
  TempDir dir;
  ParamLayout L(small());
  dir.file("config.json", hf_config_json(small()));
  const auto p = filled(L);
  auto t = model_tensors(L, p);
  const auto& v = L.find("transformer.h.1.mlp.c_fc.weight");  // [8, 32]
  for (auto& w : t)
    if (w.name == v.name) w.shape = {32, 8};  // transposed: same bytes, wrong layout
  const auto path = dir.file("s.safetensors");
  write_safetensors(path, t, {});
  std::vector<float> q(p.size());
  EXPECT_EQ(file_error([&] { load_model(path, L, q); }),
            path + ": tensor 'transformer.h.1.mlp.c_fc.weight' has the wrong shape: expected [8, 32], found [32, 8]");
}

TEST(ModelCheckpoint, MissingExtraAndWrongDtypeTensors) {
  TempDir dir;
  ParamLayout L(small());
  dir.file("config.json", hf_config_json(small()));
  const auto p = filled(L);
  std::vector<float> q(p.size());
  {
    auto t = model_tensors(L, p);
    t.erase(t.begin() + 5);
    const auto path = dir.file("missing.safetensors");
    write_safetensors(path, t, {});
    EXPECT_EQ(file_error([&] { load_model(path, L, q); }),
              path + ": missing tensor '" + L.views()[5].name + "' (expected shape [" +
                  std::to_string(L.views()[5].shape[0]) +
                  (L.views()[5].shape.size() > 1 ? ", " + std::to_string(L.views()[5].shape[1]) : "") + "])");
  }
  {
    auto t = model_tensors(L, p);
    const float extra[8] = {};
    t.push_back(f32_tensor("transformer.h.2.ln_1.weight", {8}, extra));
    const auto path = dir.file("extra.safetensors");
    write_safetensors(path, t, model_metadata(L.config(), {}));  // (config.json would name the extra block)
    EXPECT_EQ(file_error([&] { load_model(path, L, q); }),
              path + ": unexpected tensor 'transformer.h.2.ln_1.weight' [8] (not part of this model)");
  }
  {
    auto t = model_tensors(L, p);
    std::vector<double> d(8, 1.0);
    for (auto& w : t)
      if (w.name == "transformer.ln_f.weight") {
        w.dtype = Dtype::F64;
        w.bytes = {reinterpret_cast<const uint8_t*>(d.data()), d.size() * 8};
      }
    const auto path = dir.file("f64.safetensors");
    write_safetensors(path, t, {});
    EXPECT_EQ(file_error([&] { load_model(path, L, q); }),
              path + ": tensor 'transformer.ln_f.weight' is F64, expected F32 (or BF16/F16, widened exactly)");
  }
}

TEST(ModelCheckpoint, MetadataIsValidated) {
  TempDir dir;
  ParamLayout L(small());
  const auto p = filled(L);
  EXPECT_THROW(save_model(dir.file("r.safetensors"), L, p, {{"n_layer", "5"}}), Error);  // reserved key
  std::vector<float> wrong(p.size() - 1);
  EXPECT_THROW(save_model(dir.file("w.safetensors"), L, wrong), Error);

  auto meta = model_metadata(L.config(), {});
  meta["n_head"] = "two";
  const auto path = dir.file("bad.safetensors");
  write_safetensors(path, model_tensors(L, p), meta);
  EXPECT_EQ(file_error([&] { read_model_config(path); }),
            path + ": __metadata__ 'n_head' is 'two', expected a positive integer");
  meta = model_metadata(L.config(), {});
  meta["geoloco.format_version"] = "2";
  write_safetensors(path, model_tensors(L, p), meta);
  EXPECT_EQ(file_error([&] { read_model_config(path); }),
            path + ": model format_version '2' is not supported (expected 1)");
  meta = model_metadata(L.config(), {});
  meta.erase("vocab_size");
  write_safetensors(path, model_tensors(L, p), meta);
  EXPECT_EQ(file_error([&] { read_model_config(path); }), path + ": __metadata__ has no 'vocab_size'");
  EXPECT_NE(file_error([&] { read_model_config(dir.file("absent.safetensors")); }).find("cannot open"),
            std::string::npos);
}

// check_model is load_model's validation without the copy: it refuses exactly what
// load_model refuses, with the same message, and accepts what it loads.
TEST(ModelCheckpoint, CheckModelRefusesWhatLoadModelRefuses) {
  TempDir dir;
  ParamLayout L(small());
  const auto path = dir.file("m.safetensors");
  save_model(path, L, filled(L));
  check_model(read_safetensors(path), L);
  ParamLayout deep(small(3, 8));
  std::vector<float> q(static_cast<size_t>(deep.total()));
  const std::string want = path + ": checkpoint has n_layer = 2, this model has 3";
  EXPECT_EQ(file_error([&] { check_model(read_safetensors(path), deep); }), want);
  EXPECT_EQ(file_error([&] { load_model(path, deep, q); }), want);
  const auto values = filled(L);
  auto t = model_tensors(L, values);
  t.pop_back();
  dir.file("config.json", hf_config_json(small()));
  const auto partial = dir.file("partial.safetensors");
  write_safetensors(partial, t, {});
  EXPECT_EQ(file_error([&] { check_model(read_safetensors(partial), L); }),
            partial + ": missing tensor 'transformer.ln_f.bias' (expected shape [8])");
}

// The places a user can point train.init_from at: a file, a checkpoint step directory, a
// site's checkpoint directory (its `latest`), and the errors for everything else.
TEST(ModelCheckpoint, FindModelFileResolvesFileStepDirAndLatest) {
  namespace fs = std::filesystem;
  TempDir dir;
  ParamLayout L(small());
  const fs::path site = dir.path() / "checkpoints" / "paris";
  fs::create_directories(site / "step_00000010");
  fs::create_directories(site / "step_00000020");
  save_model((site / "step_00000010" / "model.safetensors").string(), L, filled(L));
  save_model((site / "step_00000020" / "model.safetensors").string(), L, filled(L));
  const std::string file = (site / "step_00000010" / "model.safetensors").string();
  EXPECT_EQ(find_model_file(file), file);
  EXPECT_EQ(find_model_file((site / "step_00000010").string()), file);
  std::ofstream(site / "latest") << "step_00000020\n";
  EXPECT_EQ(find_model_file(site.string()), (site / "step_00000020" / "model.safetensors").string());

  // A run's output directory or its checkpoints/: the one site's latest; with two sites
  // ambiguous, the message lists them.
  const std::string latest_model = (site / "step_00000020" / "model.safetensors").string();
  EXPECT_EQ(find_model_file(dir.path().string()), latest_model);
  EXPECT_EQ(find_model_file((dir.path() / "checkpoints").string()), latest_model);
  fs::create_directories(dir.path() / "checkpoints" / "lyon");
  std::ofstream(dir.path() / "checkpoints" / "lyon" / "latest") << "step_00000020\n";
  const std::string run = (dir.path() / "checkpoints").string();
  EXPECT_EQ(file_error([&] { find_model_file(run); }),
            run + ": holds the checkpoints of 2 sites (lyon, paris): name one of them, e.g. " + run + "/lyon");
  EXPECT_EQ(file_error([&] { find_model_file(dir.path().string()); }),
            dir.path().string() + ": holds the checkpoints of 2 sites (lyon, paris): name one of them, e.g. " + run +
                "/lyon");

  // `latest` naming a step without a model, or something that is not a step directory.
  std::ofstream(site / "latest") << "step_00000030\n";
  EXPECT_EQ(file_error([&] { find_model_file(site.string()); }),
            (site / "latest").string() + ": names step_00000030, which has no model.safetensors");
  std::ofstream(site / "latest") << "../../elsewhere\n";
  EXPECT_EQ(file_error([&] { find_model_file(site.string()); }),
            (site / "latest").string() + ": '../../elsewhere' does not name a checkpoint directory");

  const std::string missing = dir.file("absent.safetensors");
  EXPECT_EQ(file_error([&] { find_model_file(missing); }), missing + ": no such file or directory");
  fs::create_directories(dir.path() / "empty");
  EXPECT_EQ(file_error([&] { find_model_file(dir.file("empty")); }),
            dir.file("empty") +
                ": directory has no model.safetensors, no 'latest' checkpoint pointer and no site checkpoints");
}

// Half-precision exports (bf16 and fp16 safetensors, as Hugging Face often ships them) load
// as their exact float values; a file may mix dtypes.
TEST(ModelCheckpoint, Bf16AndF16TensorsWidenExactly) {
  TempDir dir;
  ParamLayout L(small());
  std::vector<float> p(static_cast<size_t>(L.total()));
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<float>(i % 200) * 0.5f - 50.0f;  // exact in both
  p[size_t(L.views()[1].offset)] = 0x1p-20f;  // an fp16 subnormal (view 1 is stored as fp16 below)
  auto t = model_tensors(L, p);
  std::vector<std::vector<uint8_t>> storage;
  storage.reserve(t.size());  // the tensors point into it
  for (size_t k = 0; k < t.size(); ++k) {
    const bool bf16 = k % 2 == 0;  // alternate: one file, both dtypes
    const auto& v = L.views()[k];
    std::vector<uint8_t> bytes(size_t(v.numel) * 2);
    for (int64_t i = 0; i < v.numel; ++i) {
      const float x = p[size_t(v.offset + i)];
      const uint16_t h = bf16 ? static_cast<uint16_t>(std::bit_cast<uint32_t>(x) >> 16) : [&] {
        // x is an exact fp16 value: build its bits directly.
        if (x == 0) return uint16_t(0);
        int e = 0;
        const float m = std::frexp(std::fabs(x), &e);  // x = m 2^e, m in [0.5, 1)
        const uint16_t sign = x < 0 ? 0x8000 : 0;
        if (e - 1 < -14) return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::ldexp(std::fabs(x), 24)));
        return static_cast<uint16_t>(sign | ((e - 1 + 15) << 10) | static_cast<uint16_t>((m * 2 - 1) * 1024));
      }();
      bytes[size_t(2 * i)] = static_cast<uint8_t>(h & 0xff);
      bytes[size_t(2 * i + 1)] = static_cast<uint8_t>(h >> 8);
    }
    storage.push_back(std::move(bytes));
    t[k].dtype = bf16 ? Dtype::BF16 : Dtype::F16;
    t[k].bytes = storage.back();
  }
  const auto path = dir.file("half.safetensors");
  write_safetensors(path, t, {});
  dir.file("config.json", hf_config_json(small()));
  std::vector<float> q(p.size());
  load_model(path, L, q);
  EXPECT_EQ(q, p);
}
