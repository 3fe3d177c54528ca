// The geoloco binary as a user runs it: exit codes (0 ok, 2 bad input, 1 failure) and the
// one-line error messages.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "test_util.hpp"

using geoloco::testing::TempDir;
using geoloco::testing::tiny_config;

namespace {

struct Result {
  int code;
  std::string out;  // stdout + stderr
};

Result run(const std::string& args) {
  std::string cmd = std::string(GEOLOCO_BINARY_DIR) + "/geoloco " + args + " 2>&1";
  Result r{0, {}};
  FILE* p = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

}  // namespace

TEST(Cli, HelpForEveryCommand) {
  for (const char* c : {"", "train ", "eval ", "validate "}) {
    auto r = run(std::string(c) + "--help");
    EXPECT_EQ(r.code, 0) << c << r.out;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << c;
  }
}

TEST(Cli, ValidateOkAndBadConfigExitCodes) {
  TempDir d;
  auto good = d.file("good.yaml", tiny_config(d.path() / "out"));
  auto r = run("validate " + good);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("OK"), std::string::npos);

  auto bad = d.file("bad.yaml", tiny_config(d.path() / "out", "  warmup: 3\n"));
  r = run("validate " + bad);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("bad.yaml:12:3: train.warmup: unknown key"), std::string::npos) << r.out;

  r = run("validate " + good + " --set train.steps=0");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("(--set train.steps=0): train.steps: got '0'"), std::string::npos) << r.out;

  r = run("validate /nonexistent.yaml");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("/nonexistent.yaml: cannot open config file"), std::string::npos) << r.out;

  r = run("frobnicate");
  EXPECT_EQ(r.code, 2);
}

TEST(Cli, MissingDataFileIsBadInput) {
  TempDir d;
  auto cfg = d.file("c.yaml", "model: {n_layer: 1, n_head: 1, n_embd: 8, block_size: 8}\n"
                              "data: {train: {kind: text, path: missing.txt}}\n");
  auto r = run("train " + cfg);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("missing.txt"), std::string::npos) << r.out;
}

TEST(Cli, TrainThenEvalPrintsJson) {
  TempDir d;
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  d.file("corpus.txt", text);
  auto cfg = d.file("c.yaml", "run: {name: e, output_dir: " + (d.path() / "out").string() + "}\n"
                              "model: {n_layer: 1, n_head: 2, n_embd: 16, block_size: 16, vocab_size: 256}\n"
                              "data: {train: {kind: text, path: corpus.txt}}\n"
                              "train: {steps: 30, micro_batch: 4, optimizer: {lr: 1.0e-2}}\n");
  auto r = run("train " + cfg);
  ASSERT_EQ(r.code, 0) << r.out;
  auto summary = nlohmann::json::parse(std::ifstream(d.path() / "out" / "summary.json"));
  EXPECT_EQ(summary["steps"].get<int>(), 30);
  for (const char* k : {"final_loss", "val_loss", "tokens", "wall_s", "params"}) EXPECT_TRUE(summary.contains(k)) << k;

  auto ckpt = (d.path() / "out" / "checkpoints" / "local" / "step_00000030" / "model.safetensors").string();
  r = run("eval --checkpoint " + ckpt + " --data " + (d.path() / "corpus.txt").string() + " --tokens 320");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["tokens"].get<int>(), 320);
  EXPECT_LT(j["loss"].get<double>(), std::log(256.0));  // learned something

  // A checkpoint whose shapes do not match / a corrupt file: exit 2, file named.
  std::filesystem::resize_file(ckpt, 100);
  r = run("eval --checkpoint " + ckpt + " --data " + (d.path() / "corpus.txt").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("model.safetensors"), std::string::npos) << r.out;
}

TEST(Cli, TrainRefusesAMultiRankConfig) {
  TempDir d;
  auto cfg = d.file("c.yaml", tiny_config(d.path() / "out", "", "sites: [{name: a, ranks: 2, port: 31000}]\n"));
  auto r = run("train " + cfg);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("use `geoloco launch"), std::string::npos) << r.out;
}
