#include <gtest/gtest.h>

#include <filesystem>

#include "test_util.hpp"
#include "trainer/checkpoint/model_checkpoint.hpp"
#include "trainer/model/gpt.hpp"
#include "trainer/loop/run_config.hpp"

using namespace geoloco;
using namespace geoloco::trainer;

namespace {

std::string error_of(const std::string& yaml, std::vector<std::string> sets = {}) {
  try {
    parse_run_config(config::load_string(yaml, "run.yaml", sets));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}

const char* kBase =
    "run: {name: x}\n"
    "model: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 64}\n"
    "data: {train: {kind: synthetic}}\n";

}  // namespace

TEST(RunConfig, DefaultsAndDerivedValues) {
  auto c = parse_run_config(config::load_string(kBase, "run.yaml"));
  EXPECT_EQ(c.run.output_dir, "runs/x");
  EXPECT_EQ(c.sites.size(), 1u);
  EXPECT_EQ(c.sites[0].name, "local");
  EXPECT_EQ(c.world_size(), 1);
  EXPECT_EQ(c.seq_len(), 16);
  EXPECT_EQ(c.train.micro_batch, 8);
  EXPECT_DOUBLE_EQ(c.peak_lr(), 3.0e-4);
}

TEST(RunConfig, LinearLrScalingUsesTheSiteBatch) {
  auto c = parse_run_config(config::load_string(
      std::string(kBase) +
          "train: {micro_batch: 4, grad_accum: 2, optimizer: {lr: 1.0e-3}, lr_scaling: {kind: linear, base_batch: 4}}\n"
          "sites: [{name: a, ranks: 2, port: 30000}]\n",
      "run.yaml"));
  EXPECT_EQ(c.site_batch(0), 16);
  EXPECT_EQ(c.global_batch(), 16);
  EXPECT_DOUBLE_EQ(c.peak_lr(), 4.0e-3);
  EXPECT_EQ(c.global_rank(0, 1), 1);
}

TEST(RunConfig, PerRankHostsForASiteOnSeveralNodes) {
  auto c = parse_run_config(config::load_string(
      std::string(kBase) + "sites: [{name: a, ranks: 2, hosts: [10.0.0.1, 10.0.0.2], port: 30000}]\n", "run.yaml"));
  EXPECT_EQ(c.sites[0].host_of(0), "10.0.0.1");
  EXPECT_EQ(c.sites[0].host_of(1), "10.0.0.2");
  EXPECT_EQ(c.sites[0].host, "10.0.0.1");  // rank 0 serves the rendezvous
  EXPECT_NE(error_of(std::string(kBase) + "sites: [{name: a, ranks: 3, hosts: [h1, h2], port: 30000}]\n")
                .find("sites[0].hosts: got 2 addresses for 3 ranks"),
            std::string::npos);
}

TEST(RunConfig, MultiSiteNeedsATransportAndEqualRanks) {
  EXPECT_NE(error_of(std::string(kBase) + "sites: [{name: a, port: 30000}, {name: b, port: 30100}]\n")
                .find("transport: missing: a multi-site run needs a transport section"),
            std::string::npos);
}

// Each class of config error: message and location.
TEST(RunConfig, UnknownKeyAnywhereIsAnError) {
  EXPECT_EQ(
      error_of(std::string(kBase) + "train: {stpes: 3}\n"),
      "run.yaml:4:9: train.stpes: unknown key (did you mean 'steps'?); allowed keys: attention, checkpoint_every, "
      "eval_batches, eval_every, grad_accum, grad_clip, init_from, keep_checkpoints, log_every, lr_scaling, "
      "micro_batch, optimizer, precision, rehearsal, schedule, seq_len, steps, threads");
  EXPECT_NE(error_of(std::string(kBase) + "trian: {steps: 3}\n")
                .find("run.yaml:4:1: trian: unknown key (did you mean 'train'?)"),
            std::string::npos);
}

TEST(RunConfig, WrongTypeRangeAndChoice) {
  EXPECT_EQ(error_of(std::string(kBase) + "train: {steps: many}\n"),
            "run.yaml:4:16: train.steps: got 'many', expected an integer");
  EXPECT_EQ(error_of(std::string(kBase) + "train: {micro_batch: 0}\n"),
            "run.yaml:4:22: train.micro_batch: got '0', expected an integer in [1, 1048576]");
  EXPECT_EQ(error_of(std::string(kBase) + "site: {strategy: zero3}\n"),
            "run.yaml:4:18: site.strategy: got 'zero3', expected one of ddp | zero1 | zero2 | fsdp | hybrid | auto");
  EXPECT_EQ(
      error_of(std::string(kBase) + "train: {optimizer: {betas: [0.9]}}\n"),
      "run.yaml:4:28: train.optimizer.betas: got a list, expected a list of two numbers in [0, 1), e.g. [0.9, 0.95]");
}

TEST(RunConfig, CrossFieldChecks) {
  EXPECT_NE(
      error_of("model: {n_embd: 30, n_head: 4}\n").find("model.n_embd: got 30, expected a multiple of n_head (4)"),
      std::string::npos);
  EXPECT_NE(error_of(std::string(kBase) + "train: {seq_len: 17}\n").find("expected at most model.block_size (16)"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(kBase) + "sites: [{name: a, port: 30000}, {name: a, port: 31000}]\n")
                .find("sites[1].name: duplicate site name 'a'"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(kBase) + "sites: [{name: a, ranks: 4, port: 30000}, {name: b, port: 30003}]\n")
                .find("sites[1].port: port range 30003..30004 on 127.0.0.1 overlaps another site's"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(kBase) + "train: {lr_scaling: {kind: linear}}\n")
                .find("train.lr_scaling.base_batch: missing"),
            std::string::npos);
}

TEST(RunConfig, SetOverridesAreValidatedWithTheirOrigin) {
  EXPECT_EQ(error_of(kBase, {"train.steps=-5"}),
            "(--set train.steps=-5): train.steps: got '-5', expected an integer in [1, 1099511627776]");
  auto c = parse_run_config(config::load_string(kBase, "run.yaml", {"train.steps=77", "model.n_layer=3"}));
  EXPECT_EQ(c.train.steps, 77);
  EXPECT_EQ(c.model.n_layer, 3);
}

TEST(RunConfig, HashFollowsTheContent) {
  auto a = parse_run_config(config::load_string(kBase, "a.yaml"));
  auto b = parse_run_config(config::load_string(kBase, "b.yaml"));
  auto c = parse_run_config(config::load_string(kBase, "a.yaml", {"train.steps=5"}));
  EXPECT_EQ(a.hash, b.hash);
  EXPECT_NE(a.hash, c.hash);
}

// train.init_from resolves against the config's directory (like data and key paths), names
// the model file it found, and is checked against the model when the config loads: a wrong
// file is a config error with the key's location, before any rank starts.
TEST(RunConfig, InitFromIsResolvedAgainstTheConfigAndCheckedAtLoad) {
  geoloco::test::TempDir d;
  std::filesystem::create_directories(d.path() / "warm" / "step_00000100");
  const ParamLayout two(
      ModelConfig{.n_layer = 2, .n_head = 2, .n_embd = 32, .block_size = 16, .vocab_size = 64});  // kBase's
  std::vector<float> p(static_cast<size_t>(two.total()), 0.5f);
  const std::string file = (d.path() / "warm" / "step_00000100" / "model.safetensors").string();
  save_model(file, two, p);
  d.file("warm/latest", "step_00000100\n");
  auto c = load_run_config(d.file("run.yaml", std::string(kBase) + "train: {init_from: warm}\n"));
  EXPECT_EQ(c.train.init_from, file);
  c = load_run_config(d.file("run.yaml", std::string(kBase) + "train: {init_from: " + file + "}\n"));
  EXPECT_EQ(c.train.init_from, file);
  EXPECT_TRUE(load_run_config(d.file("run.yaml", kBase)).train.init_from.empty());

  auto error = [&](const std::string& yaml, std::vector<std::string> sets = {}) {
    try {
      load_run_config(d.file("run.yaml", yaml), sets);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  const std::string yaml = d.path() / "run.yaml";
  EXPECT_EQ(error(std::string(kBase) + "train: {init_from: nowhere}\n"),
            yaml + ":4:20: train.init_from: " + (d.path() / "nowhere").string() + ": no such file or directory");
  EXPECT_EQ(error(std::string(kBase) + "train: {init_from: warm}\n", {"model.n_layer=3"}),
            yaml + ":4:20: train.init_from: " + file + ": checkpoint has n_layer = 2, this model has 3");
  d.file("junk.safetensors", "not a safetensors file");
  EXPECT_NE(error(std::string(kBase) + "train: {init_from: junk.safetensors}\n")
                .find(":4:20: train.init_from: " + (d.path() / "junk.safetensors").string() + ": "),
            std::string::npos);
}

// outer.quantize_on: device is refused, naming the key, where the device could not quantize
// the rounds: a codec other than int8/int4/fp4/int2, top-k, a plan that may pick 16 or 32
// bits, or a run without a GPU site; auto and host take any codec.
TEST(RunConfig, QuantizeOnDeviceIsRefusedWhereTheDeviceCannotQuantize) {
  const std::string gpu = "sites: [{name: a, device: cuda, port: 30000}]\n";
  auto outer = [&](const std::string& body, const std::string& sites) {
    return error_of(std::string(kBase) + "outer: {interval: 4, " + body + "}\n" + sites);
  };
  EXPECT_EQ(outer("quantize_on: device, compression: {codec: int4, error_feedback: true}", gpu), "<no error>");
  EXPECT_EQ(outer("quantize_on: device, plan: auto, plan_bits: [8, 4, 2]", gpu), "<no error>");
  EXPECT_EQ(outer("quantize_on: auto, compression: {codec: bf16}", gpu), "<no error>");
  EXPECT_EQ(outer("quantize_on: host, compression: {codec: int8, topk: 0.1}", gpu), "<no error>");
  const std::string fp32 = outer("quantize_on: device", gpu);
  EXPECT_NE(fp32.find("outer.quantize_on"), std::string::npos) << fp32;
  EXPECT_NE(fp32.find("not fp32"), std::string::npos) << fp32;
  const std::string topk = outer("quantize_on: device, compression: {codec: int8, topk: 0.1}", gpu);
  EXPECT_NE(topk.find("remove compression.topk"), std::string::npos) << topk;
  const std::string bits = outer("quantize_on: device, plan: auto", gpu);  // plan_bits [16, 8, 4]
  EXPECT_NE(bits.find("may pick 16 bits"), std::string::npos) << bits;
  const std::string cpu = outer("quantize_on: device, compression: {codec: int8}", "sites: [{name: a, port: 30000}]\n");
  EXPECT_NE(cpu.find("no site has device: cuda"), std::string::npos) << cpu;
  const std::string bad = outer("quantize_on: gpu", gpu);
  EXPECT_NE(bad.find("quantize_on"), std::string::npos) << bad;
}

// run.command: the ranks run the user's program (the Python package's loop): its model and data
// are its own (refused here), train: holds only what the outer loop and the records need, and
// the outer loop's fragments are checked against the program's parameters instead.
TEST(RunConfig, ACommandRunReadsSitesOuterAndTransportButNotTheModel) {
  const std::string base =
      "run: {name: x, command: [python3, train.py, --flag]}\n"
      "train: {steps: 40, log_every: 5, checkpoint_every: 20}\n"
      "sites: [{name: a, ranks: 2}]\n"
      "outer: {interval: 10, fragments: 8}\n";
  auto c = parse_run_config(config::load_string(base, "run.yaml"));
  EXPECT_TRUE(c.external_inner_loop());
  EXPECT_EQ(c.run.command, (std::vector<std::string>{"python3", "train.py", "--flag"}));
  EXPECT_EQ(c.train.steps, 40);
  EXPECT_EQ(c.train.log_every, 5);
  EXPECT_EQ(c.train.checkpoint_every, 20);
  EXPECT_EQ(c.outer.fragments, 8);  // not checked against a model the config does not hold
  EXPECT_FALSE(parse_run_config(config::load_string(kBase, "run.yaml")).external_inner_loop());

  EXPECT_NE(error_of(base + "model: {n_layer: 2}\n").find("run.yaml:5:"), std::string::npos);
  EXPECT_NE(error_of(base + "model: {n_layer: 2}\n").find("the model and data are the program's own"),
            std::string::npos);
  EXPECT_NE(error_of(base + "data: {train: {kind: synthetic}}\n").find("data"), std::string::npos);
  const std::string lr =
      error_of("run: {name: x, command: [python3, t.py]}\ntrain: {steps: 4, micro_batch: 8}\nsites: [{name: a}]\n");
  EXPECT_NE(lr.find("train.micro_batch"), std::string::npos) << lr;
  EXPECT_NE(error_of("run: {name: x, command: []}\n").find("a non-empty list"), std::string::npos);
  EXPECT_NE(error_of("run: {name: x, command: [python3, '']}\n").find("non-empty arguments"), std::string::npos);
}
