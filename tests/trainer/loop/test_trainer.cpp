#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "test_util.hpp"
#include "trainer/checkpoint/model_checkpoint.hpp"
#include "core/hash.hpp"
#include "trainer/loop/run_config.hpp"
#include "trainer/loop/trainer.hpp"
#include "trainer/model/gpt.hpp"

using namespace geoloco;
using namespace geoloco::trainer;
using geoloco::test::TempDir;
using geoloco::testing::tiny_config;

namespace {

RunConfig load(const TempDir& d, const std::string& yaml, std::vector<std::string> sets = {}) {
  return load_run_config(d.file("run.yaml", yaml), sets);
}

TrainerOptions quiet() {
  TrainerOptions o;
  o.progress = false;
  return o;
}

std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& p) {
  std::vector<nlohmann::json> out;
  std::ifstream in(p);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace

TEST(Trainer, LearnsAndWritesOutputs) {
  TempDir d;
  auto cfg = load(d, tiny_config(d.path() / "out"), {"train.steps=40"});
  Trainer t(cfg, quiet());
  auto s = t.run();
  auto lines = read_jsonl(d.path() / "out" / "metrics.jsonl");
  ASSERT_EQ(lines.size(), 8u);  // every 5 steps
  EXPECT_LT(lines.back()["loss"].get<double>(), lines.front()["loss"].get<double>() - 0.5);
  for (const char* k : {"step", "loss", "lr", "grad_norm", "tokens_per_s", "tokens"})
    EXPECT_TRUE(lines[0].contains(k)) << k;
  EXPECT_TRUE(lines.back().contains("val_loss"));
  EXPECT_EQ(s["tokens"].get<int64_t>(), 40 * 4 * 2 * 16);
  EXPECT_EQ(s["params"].get<int64_t>(), cfg.model.num_params());
  EXPECT_TRUE(
      std::filesystem::exists(d.path() / "out" / "checkpoints" / "local" / "step_00000040" / "model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(d.path() / "out" / "sites" / "local" / "rank0.json"));
}

// Stop at step 9 (with a checkpoint), resume, finish: bit-identical to the uninterrupted run.
TEST(Trainer, ResumeAfterStopEqualsUninterruptedRunBitForBit) {
  TempDir a, b;
  std::vector<float> whole, resumed;
  {
    auto cfg = load(a, tiny_config(a.path() / "out"));
    Trainer t(cfg, quiet());
    t.run();
    whole = t.parameters();
  }
  {
    auto cfg = load(b, tiny_config(b.path() / "out"));
    auto o = quiet();
    o.stop_at_step = 9;
    Trainer t(cfg, o);
    auto s = t.run();
    EXPECT_EQ(s["steps"].get<int64_t>(), 9);
    EXPECT_FALSE(s["completed"].get<bool>());
  }
  {
    auto cfg = load(b, tiny_config(b.path() / "out"));
    auto o = quiet();
    o.resume = true;
    Trainer t(cfg, o);
    auto s = t.run();
    EXPECT_EQ(s["steps"].get<int64_t>(), 20);
    resumed = t.parameters();
  }
  ASSERT_EQ(whole.size(), resumed.size());
  EXPECT_EQ(hash64(whole.data(), whole.size() * 4), hash64(resumed.data(), resumed.size() * 4));
  EXPECT_EQ(0, std::memcmp(whole.data(), resumed.data(), whole.size() * 4));
}

// data.windows: random (windows at seeded offsets, sampler.hpp): a run stopped at step 9 and
// resumed ends bit-identical to the uninterrupted one, and the run trains on other windows
// than the aligned one (different parameters).
TEST(Trainer, RandomWindowsResumeBitForBitAndDifferFromAligned) {
  const std::vector<std::string> text = {"data.train={kind: text, path: /usr/share/common-licenses}",
                                         "model.vocab_size=256"};
  auto with = [&](std::vector<std::string> extra) {
    auto v = text;
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
  };
  TempDir a, b, c;
  std::vector<float> whole, resumed, aligned;
  // (The trainer keeps a reference to its config: each one outlives its trainer.)
  {
    const auto cfg = load(a, tiny_config(a.path() / "out"), with({"data.windows=random"}));
    Trainer t(cfg, quiet());
    t.run();
    whole = t.parameters();
  }
  {
    auto o = quiet();
    o.stop_at_step = 9;
    const auto cfg = load(b, tiny_config(b.path() / "out"), with({"data.windows=random"}));
    Trainer t(cfg, o);
    t.run();
  }
  {
    auto o = quiet();
    o.resume = true;
    const auto cfg = load(b, tiny_config(b.path() / "out"), with({"data.windows=random"}));
    Trainer t(cfg, o);
    t.run();
    resumed = t.parameters();
  }
  {
    const auto cfg = load(c, tiny_config(c.path() / "out"), with({}));
    Trainer t(cfg, quiet());
    t.run();
    aligned = t.parameters();
  }
  ASSERT_EQ(whole.size(), resumed.size());
  EXPECT_EQ(0, std::memcmp(whole.data(), resumed.data(), whole.size() * 4));
  EXPECT_NE(whole, aligned);
  // Resuming a random-window run's checkpoint as aligned is refused, naming both modes.
  auto o = quiet();
  o.resume = true;
  const auto cfg = load(b, tiny_config(b.path() / "out"), with({"data.windows=aligned"}));
  try {
    Trainer t(cfg, o);
    t.run();
    ADD_FAILURE() << "resumed a random-window checkpoint with aligned windows";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("saved with data.windows: random, this run has aligned"), std::string::npos)
        << e.what();
  }
}

TEST(Trainer, SameSeedSameBits) {
  TempDir a, b;
  auto ca = load(a, tiny_config(a.path() / "out"), {"train.steps=6"});
  auto cb = load(b, tiny_config(b.path() / "out"), {"train.steps=6"});
  Trainer ta(ca, quiet()), tb(cb, quiet());
  ta.run();
  tb.run();
  EXPECT_EQ(ta.parameters(), tb.parameters());
}

TEST(Trainer, CheckpointRoundTripsThroughSafetensors) {
  TempDir d;
  auto cfg = load(d, tiny_config(d.path() / "out"), {"train.steps=5"});
  Trainer t(cfg, quiet());
  t.run();
  auto params = t.parameters();
  auto path = (d.path() / "out" / "checkpoints" / "local" / "step_00000005" / "model.safetensors").string();
  EXPECT_EQ(read_model_config(path), cfg.model);
  Gpt m(cfg.model);
  std::vector<float> loaded(params.size());
  load_model(path, m.layout(), loaded);
  EXPECT_EQ(loaded, params);
}

namespace {
// Trains 4 steps, lets `damage` alter rank 0's state file, resumes to step 8: the
// FileError's message, or "<no error>".
std::string resume_error_after(const std::function<void(const std::filesystem::path&)>& damage) {
  TempDir d;
  {
    auto cfg = load(d, tiny_config(d.path() / "out"), {"train.steps=4"});
    Trainer t(cfg, quiet());
    t.run();
  }
  damage(d.path() / "out" / "checkpoints" / "local" / "step_00000004" / "state.r0.safetensors");
  auto cfg = load(d, tiny_config(d.path() / "out"), {"train.steps=8"});
  auto o = quiet();
  o.resume = true;
  try {
    Trainer t(cfg, o);
    t.run();
  } catch (const FileError& e) {
    return e.what();
  }
  return "<no error>";
}
}  // namespace

TEST(Trainer, CorruptCheckpointOnResumeIsAFileError) {
  const std::string w = resume_error_after([](const std::filesystem::path& state) {
    std::filesystem::resize_file(state, std::filesystem::file_size(state) / 2);
  });
  EXPECT_NE(w.find("state.r0.safetensors"), std::string::npos) << w;
}

// One flipped bit inside a tensor (sizes and offsets intact): the checksums catch it on
// resume, naming the file and the tensor, before any state is used. (Resume reads the
// rank's state file; model.safetensors is the export, checked by `geoloco eval`: test_cli.)
TEST(Trainer, BitFlipInACheckpointOnResumeIsAFileError) {
  const std::string w = resume_error_after([](const std::filesystem::path& state) {
    std::fstream f(state, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-64, std::ios::end);
    const char c = char(f.get() ^ 0x10);
    f.seekp(-64, std::ios::end);
    f.put(c);
  });
  EXPECT_NE(w.find("state.r0.safetensors: tensor '"), std::string::npos) << w;
  EXPECT_NE(w.find("fails its checksum"), std::string::npos) << w;
}

// A damaged metadata value (here: bytes of the header rewritten in place, same length, so
// the file still parses and every tensor checksum holds) is a FileError naming the file,
// the key and the value, not std::stoll's "stoll" with exit 1.

TEST(Trainer, DamagedCheckpointMetadataOnResumeIsAFileErrorNamingTheKey) {
  std::string state;
  std::string w = resume_error_after([&](const std::filesystem::path& p) {
    state = p.string();
    geoloco::testing::damage_metadata(p, "geoloco_step", [](size_t n) { return std::string(n, 'x'); });
  });
  EXPECT_EQ(w, state + ": __metadata__ 'geoloco_step': got 'x', expected an integer >= 0");
  w = resume_error_after([&](const std::filesystem::path& p) {
    state = p.string();
    geoloco::testing::damage_metadata(p, "wall_s",
                                      [](size_t n) { return "1" + std::string(n - 1, '#'); });  // trailing junk
  });
  EXPECT_NE(w.find(state + ": __metadata__ 'wall_s': got '1#"), std::string::npos) << w;
  EXPECT_NE(w.find("', expected a finite number >= 0"), std::string::npos) << w;
}

TEST(Trainer, ResumeRefusesAnotherStrategy) {
  TempDir d;
  {
    auto cfg = load(d, tiny_config(d.path() / "out"), {"train.steps=4"});
    Trainer t(cfg, quiet());
    t.run();
  }
  auto cfg = load(d, tiny_config(d.path() / "out"), {"train.steps=8", "site.strategy=zero2"});
  auto o = quiet();
  o.resume = true;
  EXPECT_THROW(
      {
        Trainer t(cfg, o);
        t.run();
      },
      FileError);
}

// train.optimizer.kind: muon: stopped at step 9 and resumed, bit-identical to the whole run
// (the momentum is in the checkpoint); a Muon checkpoint resumed as AdamW (and back) is refused
// naming both, since adamw.m holds Muon's momentum there.
TEST(Trainer, MuonResumesBitForBitAndRefusesAnotherOptimizer) {
  TempDir a, b;
  const std::vector<std::string> muon = {"train.optimizer.kind=muon"};
  std::vector<float> whole, resumed;
  {
    const auto cfg = load(a, tiny_config(a.path() / "out"), muon);
    Trainer t(cfg, quiet());
    t.run();
    whole = t.parameters();
  }
  {
    auto o = quiet();
    o.stop_at_step = 9;
    const auto cfg = load(b, tiny_config(b.path() / "out"), muon);
    Trainer t(cfg, o);
    t.run();
  }
  {
    auto o = quiet();
    o.resume = true;
    const auto cfg = load(b, tiny_config(b.path() / "out"), muon);
    Trainer t(cfg, o);
    t.run();
    resumed = t.parameters();
  }
  ASSERT_EQ(whole.size(), resumed.size());
  EXPECT_EQ(0, std::memcmp(whole.data(), resumed.data(), whole.size() * 4));
  auto o = quiet();
  o.resume = true;
  const auto cfg = load(b, tiny_config(b.path() / "out"), {"train.steps=30"});
  try {
    Trainer t(cfg, o);
    t.run();
    ADD_FAILURE() << "resumed a Muon checkpoint with AdamW";
  } catch (const FileError& e) {
    EXPECT_NE(std::string(e.what()).find("holds the state of a muon inner optimizer; this run's train.optimizer.kind "
                                         "is adamw"),
              std::string::npos)
        << e.what();
  }
}

// Gradient accumulation: k micro-batches of b rows give the gradient of one batch of k*b.
TEST(Trainer, AccumulationOfKMicroBatchesEqualsOneBigBatch) {
  ModelConfig mc;
  mc.n_layer = 2;
  mc.n_head = 2;
  mc.n_embd = 16;
  mc.block_size = 8;
  mc.vocab_size = 20;
  Gpt m(mc);
  std::vector<float> p(static_cast<size_t>(m.layout().total()));
  Gpt::init_params(m.layout(), p, 3);
  const int k = 3, b = 2, T = 8;
  std::vector<int32_t> in(k * b * T), tg(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    in[i] = static_cast<int32_t>((i * 7 + 3) % 20);
    tg[i] = static_cast<int32_t>((i * 11 + 5) % 20);
  }
  std::vector<float> g_big(p.size(), 0.0f), g_acc(p.size(), 0.0f);
  float loss_big = m.forward(p, in.data(), tg.data(), k * b, T);
  m.backward(p, g_big, 1.0f);
  double loss_acc = 0;
  for (int i = 0; i < k; ++i) {
    loss_acc += m.forward(p, in.data() + i * b * T, tg.data() + i * b * T, b, T) / k;
    m.backward(p, g_acc, 1.0f / k);
  }
  EXPECT_NEAR(loss_acc, loss_big, 1e-5);
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    max_diff = std::max(max_diff, double(std::fabs(g_big[i] - g_acc[i])));
    max_abs = std::max(max_abs, double(std::fabs(g_big[i])));
  }
  // Float summation order differs: tolerance relative to the largest gradient.
  EXPECT_LT(max_diff, 1e-5 * max_abs) << max_diff << " vs " << max_abs;
}

// train.init_from: the trainer's parameters are the file's, bit for bit (not the seeded
// init), and training continues from them; --resume ignores it (the checkpoint wins).
TEST(Trainer, InitFromStartsFromTheFileBitForBit) {
  TempDir d;
  auto cfg = load(d, tiny_config(d.path() / "a"));
  Gpt m(cfg.model);
  std::vector<float> p(static_cast<size_t>(m.layout().total()));
  Gpt::init_params(m.layout(), p, 999);  // another seed than the run's
  const std::string file = (d.path() / "start.safetensors").string();
  save_model(file, m.layout(), p);

  auto warm = load(d, tiny_config(d.path() / "b"), {"train.init_from=" + file, "train.steps=6"});
  {
    Trainer t(warm, quiet());
    EXPECT_EQ(t.parameters(), p);
    Trainer seeded(cfg, quiet());
    EXPECT_NE(seeded.parameters(), p);
  }
  auto stop = quiet();
  stop.stop_at_step = 4;
  Trainer t(warm, stop);
  auto s = t.run();
  EXPECT_EQ(s["init_from"].get<std::string>(), file);
  EXPECT_NE(t.parameters(), p);  // it trained

  // Resuming continues from the step-4 checkpoint, not from the file: bit-identical to the
  // uninterrupted run from the file.
  auto o = quiet();
  o.resume = true;
  Trainer r(warm, o);
  r.run();
  TempDir e;
  const auto straight = load(e, tiny_config(e.path() / "c"), {"train.init_from=" + file, "train.steps=6"});
  Trainer whole(straight, quiet());
  whole.run();
  EXPECT_EQ(r.parameters(), whole.parameters());
  EXPECT_EQ(read_jsonl(d.path() / "b" / "metrics.jsonl").back()["step"].get<int64_t>(), 6);
}

// A model trained by one run warm-starts another: its loss starts where the first ended,
// far below a fresh run's.
TEST(Trainer, WarmStartContinuesFromTheTrainedModel) {
  TempDir d;
  const auto first_cfg = load(d, tiny_config(d.path() / "first"), {"train.steps=40"});
  Trainer first(first_cfg, quiet());  // (a Trainer keeps a reference to its config)
  const double first_loss = first.run()["final_loss"].get<double>();
  const std::string site = (d.path() / "first" / "checkpoints" / "local").string();
  const auto warm_cfg = load(d, tiny_config(d.path() / "warm"), {"train.steps=5", "train.init_from=" + site});
  const auto fresh_cfg = load(d, tiny_config(d.path() / "fresh"), {"train.steps=5"});
  Trainer warm(warm_cfg, quiet());
  Trainer fresh(fresh_cfg, quiet());
  const double warm_loss = warm.run()["final_loss"].get<double>();
  const double fresh_loss = fresh.run()["final_loss"].get<double>();
  EXPECT_LT(warm_loss, fresh_loss - 0.3) << "first run ended at " << first_loss;
  EXPECT_LT(std::abs(warm_loss - first_loss), 0.3);
}
