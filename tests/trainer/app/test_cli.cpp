// The geoloco binary as a user runs it: exit codes (0 ok, 2 bad input, 1 failure) and the
// one-line error messages.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "tests/trainer/loop/test_util.hpp"
#include "tests/trainer/checkpoint/hf_export.hpp"
#include "tests/support/ports.hpp"
#include "trainer/checkpoint/model_checkpoint.hpp"
#include "trainer/loop/device_site.hpp"
#include "trainer/parallel/gpu.hpp"

using geoloco::test::fresh_port;
using geoloco::test::TempDir;
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
  for (const char* c : {"", "train ", "eval ", "validate ", "sample "}) {
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

// Sites of different shapes: validate says how they exchange and whether their batches differ
// (and how the pseudo-gradients are then weighed).
TEST(Cli, ValidateDescribesSitesOfDifferentShapes) {
  TempDir d;
  d.file("k.psk", "0123456789abcdef-test-key");
  const int port = fresh_port();
  const std::string sites = "sites:\n  - {name: paris, ranks: 2, port: " + std::to_string(port) +
                            "}\n  - {name: lyon, ranks: 1, port: " + std::to_string(port + 10) +
                            "}\ntransport: {psk_file: k.psk}\n";
  auto cfg = d.file("c.yaml", tiny_config(d.path() / "out", "", sites));
  auto r = run("validate " + cfg);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("the parameters are cut into 2 pieces"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("sites train different batches per inner step (paris 16, lyon 8 sequences); their "
                       "pseudo-gradients count equally"),
            std::string::npos)
      << r.out;
  r = run("validate " + cfg + " --set outer.weighting=tokens");
  EXPECT_NE(r.out.find("weighed by the tokens each trained"), std::string::npos) << r.out;
  r = run("validate " + cfg + " --set sites.1.grad_accum=4");  // 4 x 4 x 1 = 16: even again
  EXPECT_EQ(r.out.find("different batches"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lyonx1 (ddp, grad_accum 4)"), std::string::npos) << r.out;
  // A site across nodes that finds its addresses: validate says how its nodes start.
  r = run("validate " + cfg + " --set sites.0.nodes=2");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("site paris: 2 ranks on 2 nodes (1 per node); node 0's bind 127.0.0.1, the others find their "
                       "own address"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("--site paris --node I"), std::string::npos) << r.out;
}

// Every example in configs/ validates as shipped (a GPU config where CUDA is built in; without
// it, refused naming the device), and the GPU example's validate says where it quantizes.
TEST(Cli, EveryExampleConfigValidates) {
  int checked = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::string(GEOLOCO_SOURCE_DIR) + "/configs")) {
    if (e.path().extension() != ".yaml") continue;
    std::ifstream in(e.path());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const bool gpu = text.find("device: cuda") != std::string::npos;
    const auto r = run("validate " + e.path().string());
    if (gpu && !geoloco::trainer::built_with_cuda()) {
      EXPECT_EQ(r.code, 2) << e.path() << ": " << r.out;
    } else {
      EXPECT_EQ(r.code, 0) << e.path() << ": " << r.out;
      // A GPU config says where its sites quantize (outer.quantize_on).
      if (gpu && e.path().filename() == "gpu-two-campus.yaml") {
        EXPECT_NE(r.out.find("GPU site(s) paris, lyon: int4 quantized on the device"), std::string::npos) << r.out;
      }
    }
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

// validate notes a manual schedule whose outer lr the quality grid measured as harmful at its
// H (planner/quality_floor.hpp), and says when the run is a rehearsal.
TEST(Cli, ValidateNotesALargeOuterLrAtASmallHAndARehearsal) {
  TempDir d;
  d.file("k.psk", "0123456789abcdef-test-key");
  const int port = fresh_port();
  const std::string sites = "sites:\n  - {name: paris, port: " + std::to_string(port) +
                            "}\n  - {name: lyon, port: " + std::to_string(port + 10) +
                            "}\ntransport: {psk_file: k.psk}\n";
  auto cfg = d.file("c.yaml", tiny_config(d.path() / "out", "", sites));
  auto r = run("validate " + cfg + " --set outer.interval=10 --set outer.optimizer.lr=1.0");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("note: outer lr 1 at H 10"), std::string::npos) << r.out;
  for (const char* ok : {" --set outer.interval=10 --set outer.optimizer.lr=0.7",
                         " --set outer.interval=50 --set outer.optimizer.lr=1.0"}) {
    r = run("validate " + cfg + ok);
    EXPECT_EQ(r.out.find("note: outer lr"), std::string::npos) << ok << ": " << r.out;
  }
  r = run("validate " + cfg + " --set train.rehearsal.step_seconds=0.5");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("rehearsal (train.rehearsal): stand-in inner steps of 0.5 s"), std::string::npos) << r.out;
}

// An error about a key given with --set names the override, not the file it overrides (the
// key has no line in it): exit 2, one line. Keys from the file keep file:line:col.
TEST(Cli, SetOverrideErrorsNameTheOverride) {
  TempDir d;
  auto good = d.file("good.yaml", tiny_config(d.path() / "out"));
  auto first_line = [](const std::string& out) { return out.substr(0, out.find('\n')); };

  // Unknown key: a section the override created (the key itself is the typo).
  auto r = run("validate " + good + " --set modle.n_layer=2");
  EXPECT_EQ(r.code, 2) << r.out;
  const std::string unknown =
      "geoloco: error: (--set modle.n_layer=2): modle: unknown key (did you mean 'model'?); allowed keys: ";
  EXPECT_EQ(first_line(r.out).substr(0, unknown.size()), unknown) << r.out;
  EXPECT_EQ(r.out.find(good), std::string::npos) << r.out;  // the file is not where it came from
  // Unknown key inside a section of the file.
  r = run("validate " + good + " --set train.warmup=3");
  EXPECT_EQ(r.code, 2) << r.out;
  const std::string inner = "geoloco: error: (--set train.warmup=3): train.warmup: unknown key";
  EXPECT_EQ(first_line(r.out).substr(0, inner.size()), inner) << r.out;

  // A bad value and a wrong type: the exact message.
  r = run("validate " + good + " --set train.micro_batch=-1");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(r.out,
            "geoloco: error: (--set train.micro_batch=-1): train.micro_batch: got '-1', expected an "
            "integer in [1, 1048576]\n");
  r = run("validate " + good + " --set train.steps=ten");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(r.out, "geoloco: error: (--set train.steps=ten): train.steps: got 'ten', expected an integer\n");
  // Inside a mapping given as the value: the override, not a line of its value text.
  const std::string model = "model={n_layer: 2, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 32, layers: 3}";
  r = run("validate " + good + " --set '" + model + "'");
  EXPECT_EQ(r.code, 2) << r.out;
  const std::string in_value = "geoloco: error: (--set " + model + "): model.layers: unknown key";
  EXPECT_EQ(first_line(r.out).substr(0, in_value.size()), in_value) << r.out;

  // The same mistakes in the file name the file's line and column.
  auto bad = d.file("bad.yaml", tiny_config(d.path() / "out") + "modle: {n_layer: 2}\n");
  r = run("validate " + bad);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find(bad + ":12:1: modle: unknown key"), std::string::npos) << r.out;
}

TEST(Cli, MissingDataFileIsBadInput) {
  TempDir d;
  auto cfg = d.file("c.yaml",
                    "model: {n_layer: 1, n_head: 1, n_embd: 8, block_size: 8}\n"
                    "data: {train: {kind: text, path: missing.txt}}\n");
  auto r = run("train " + cfg);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("missing.txt"), std::string::npos) << r.out;
}

namespace {
// A one-layer byte-level run over a small text corpus in `d`, writing to d/<out>.
std::string text_run(const TempDir& d, const std::string& out = "out") {
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  d.file("corpus.txt", text);
  return d.file(out + ".yaml", "run: {name: e, output_dir: " + (d.path() / out).string() +
                                   "}\n"
                                   "model: {n_layer: 1, n_head: 2, n_embd: 16, block_size: 16, vocab_size: 256}\n"
                                   "data: {train: {kind: text, path: corpus.txt}}\n"
                                   "train: {steps: 30, micro_batch: 4, optimizer: {lr: 1.0e-2}}\n");
}

void flip_bit_near_end(const std::string& file) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-40, std::ios::end);
  const char c = char(f.get() ^ 0x01);
  f.seekp(-40, std::ios::end);
  f.put(c);
}
}  // namespace

TEST(Cli, TrainThenEvalPrintsJson) {
  TempDir d;
  auto cfg = text_run(d);
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
  // The run's directory names its latest model: the same figures.
  auto by_dir = run("eval --checkpoint " + (d.path() / "out").string() + " --data " +
                    (d.path() / "corpus.txt").string() + " --tokens 320");
  ASSERT_EQ(by_dir.code, 0) << by_dir.out;
  auto jd = nlohmann::json::parse(by_dir.out);
  EXPECT_EQ(jd["checkpoint"].get<std::string>(), ckpt);
  EXPECT_EQ(jd["loss"].get<double>(), j["loss"].get<double>());

  // A flipped bit in a weight: exit 2, the file and the tensor named.
  flip_bit_near_end(ckpt);
  r = run("eval --checkpoint " + ckpt + " --data " + (d.path() / "corpus.txt").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("model.safetensors: tensor '"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fails its checksum"), std::string::npos) << r.out;

  // A checkpoint whose shapes do not match / a corrupt file: exit 2, file named.
  std::filesystem::resize_file(ckpt, 100);
  r = run("eval --checkpoint " + ckpt + " --data " + (d.path() / "corpus.txt").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("model.safetensors"), std::string::npos) << r.out;
}

// Warm start through the binary: a second run starts from the first one's checkpoint
// directory; a damaged or mismatched file is refused at validation with exit 2, naming the
// key and the file.
TEST(Cli, InitFromAnotherRunsCheckpoint) {
  TempDir d;
  auto first = text_run(d, "first");
  ASSERT_EQ(run("train " + first).code, 0);
  const std::string site = (d.path() / "first" / "checkpoints" / "local").string();
  auto second = text_run(d, "second");
  const std::string model = site + "/step_00000030/model.safetensors";
  // The run's output directory names its one site's latest checkpoint.
  auto r = run("validate " + second + " --set train.init_from=" + (d.path() / "first").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("parameters start from " + model + " (train.init_from; checked)"), std::string::npos) << r.out;
  r = run("train " + second + " --set train.steps=5 --set train.init_from=" + site);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("parameters from " + model + " (train.init_from)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("started from " + model + " (train.init_from)"), std::string::npos) << r.out;
  auto summary = nlohmann::json::parse(std::ifstream(d.path() / "second" / "summary.json"));
  EXPECT_EQ(summary["init_from"].get<std::string>(), model);

  r = run("validate " + second + " --set train.init_from=" + site + " --set model.n_embd=32");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("(--set train.init_from=" + site + "): train.init_from: " + model +
                       ": checkpoint has n_embd = 16, this model has 32"),
            std::string::npos)
      << r.out;
  flip_bit_near_end(model);
  for (const char* cmd : {"validate ", "train "}) {
    r = run(cmd + second + " --set train.init_from=" + site);
    EXPECT_EQ(r.code, 2) << cmd << r.out;
    EXPECT_NE(r.out.find("train.init_from: " + model + ": tensor '"), std::string::npos) << cmd << r.out;
    EXPECT_NE(r.out.find("fails its checksum"), std::string::npos) << cmd << r.out;
  }
}

// A Hugging Face export (save_pretrained's layout: format "pt", config.json beside it, mask
// buffers, the tied lm_head) of a trained model: eval gives the loss of the model it came
// from, exactly; train.init_from takes it; a bad config.json is exit 2 naming it. And the
// trainer's step directories carry the config.json that makes them such a directory.
TEST(Cli, EvalAndInitFromAHuggingFaceExport) {
  using namespace geoloco::trainer;
  TempDir d;
  const auto cfg = text_run(d);
  ASSERT_EQ(run("train " + cfg).code, 0);
  const auto step = d.path() / "out" / "checkpoints" / "local" / "step_00000030";
  ASSERT_TRUE(std::filesystem::exists(step / "config.json"));
  const ModelConfig mc = read_model_config((step / "model.safetensors").string());
  const ParamLayout layout(mc);
  std::vector<float> params(static_cast<size_t>(layout.total()));
  load_model((step / "model.safetensors").string(), layout, params);
  const auto hf = d.path() / "hf";
  geoloco::test::write_hf_export(hf, layout, params, {.lm_head = true});

  const std::string data = " --data " + (d.path() / "corpus.txt").string() + " --tokens 320";
  auto ours = run("eval --checkpoint " + step.string() + data);
  auto theirs = run("eval --checkpoint " + hf.string() + data);
  ASSERT_EQ(ours.code, 0) << ours.out;
  ASSERT_EQ(theirs.code, 0) << theirs.out;
  const auto a = nlohmann::json::parse(ours.out), b = nlohmann::json::parse(theirs.out);
  EXPECT_EQ(b["checkpoint"].get<std::string>(), (hf / "model.safetensors").string());
  EXPECT_EQ(b["loss"].get<double>(), a["loss"].get<double>());
  EXPECT_LT(b["loss"].get<double>(), std::log(256.0));

  auto r = run("validate " + cfg + " --set train.init_from=" + hf.string());
  EXPECT_EQ(r.code, 0) << r.out;
  r = run("train " + text_run(d, "warm") + " --set train.steps=3 --set train.init_from=" + hf.string());
  EXPECT_EQ(r.code, 0) << r.out;

  std::ofstream(hf / "config.json", std::ios::trunc) << "{\"n_layer\": 1}";
  r = run("eval --checkpoint " + hf.string() + data);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find((hf / "config.json").string() + ": missing key 'n_head'"), std::string::npos) << r.out;
  r = run("validate " + cfg + " --set train.init_from=" + hf.string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("train.init_from: " + (hf / "config.json").string() + ": missing key 'n_head'"),
            std::string::npos)
      << r.out;
}

// geoloco sample: a trained byte-level model continues a prompt; same seed, same text; the
// JSON carries the tokens; bad input exits 2 naming it.
TEST(Cli, SampleFromATrainedModel) {
  TempDir d;
  ASSERT_EQ(run("train " + text_run(d) + " --set train.steps=300").code, 0);  // ~1 s; loss ~0.07
  const std::string run_dir = (d.path() / "out").string();
  const std::string base = "sample --checkpoint " + run_dir + " --prompt 'the quick' --tokens 40 --seed 3";
  auto a = run(base + " --json"), b = run(base + " --json"), c = run(base + " --json --seed 4");
  ASSERT_EQ(a.code, 0) << a.out;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
  const auto j = nlohmann::json::parse(a.out);
  EXPECT_EQ(j["tokens"].size(), 40u);
  EXPECT_EQ(j["prompt_tokens"].size(), 9u);
  EXPECT_EQ(j["text"].get<std::string>().size(), 40u);
  // The corpus is one sentence repeated: greedy decoding continues it exactly.
  auto g = run("sample --checkpoint " + run_dir + " --prompt 'the quick brown' --tokens 12 --temperature 0");
  ASSERT_EQ(g.code, 0) << g.out;
  EXPECT_EQ(g.out, "the quick brown fox jumps o\n");
  auto plain = run(base);
  ASSERT_EQ(plain.code, 0) << plain.out;
  EXPECT_EQ(plain.out, "the quick" + j["text"].get<std::string>() + "\n");

  for (const std::string& bad :
       {std::string("--prompt-ids 1,x"), std::string("--prompt-ids 300"), std::string("--prompt a --prompt-ids 1")}) {
    auto r = run("sample --checkpoint " + run_dir + " " + bad);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.out;
  }
  auto r = run("sample --checkpoint " + run_dir + " --prompt-ids 300");
  EXPECT_NE(r.out.find("prompt token 300 at position 0 is outside [0, 256)"), std::string::npos) << r.out;
  r = run("sample --checkpoint " + (d.path() / "nothing").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("no such file or directory"), std::string::npos) << r.out;
  EXPECT_EQ(run("sample --checkpoint " + run_dir + " --temperature -1").code, 2);
}

TEST(Cli, TrainRefusesAMultiRankConfig) {
  TempDir d;
  const std::string sites = "sites: [{name: a, ranks: 2, port: " + std::to_string(fresh_port()) + "}]\n";
  auto cfg = d.file("c.yaml", tiny_config(d.path() / "out", "", sites));
  auto r = run("train " + cfg);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("use `geoloco launch"), std::string::npos) << r.out;
}

// site.device: cuda through the real binary. A build without CUDA refuses the config at load
// time (validate, train, launch: exit 2, says so); a CUDA build on a machine without a usable
// GPU fails each rank with one line naming the site, the rank and the runtime's reason (exit 1).
namespace {

bool built_with_cuda_backend() {
#ifdef GEOLOCO_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int count_lines_with(const std::string& out, const std::string& what) {
  int n = 0;
  for (size_t p = out.find(what); p != std::string::npos; p = out.find(what, p + 1)) ++n;
  return n;
}

}  // namespace

TEST(Cli, DeviceCudaWithoutCudaInTheBuildIsAConfigError) {
  if (built_with_cuda_backend()) GTEST_SKIP() << "this build has the CUDA backend (see DeviceCudaWithoutAGpu...)";
  TempDir d;
  auto one = d.file("one.yaml", tiny_config(d.path() / "out", "", "site: {device: cuda}\n"));
  for (const char* cmd : {"validate ", "train ", "launch "}) {
    auto r = run(cmd + one);
    EXPECT_EQ(r.code, 2) << cmd << r.out;
    EXPECT_NE(r.out.find("site.device: cuda, but this geoloco binary was built without CUDA"), std::string::npos)
        << cmd << r.out;
  }
  const std::string sites = "sites: [{name: a, ranks: 2, port: " + std::to_string(fresh_port()) + ", device: cuda}]\n";
  auto two = d.file("two.yaml", tiny_config(d.path() / "out", "", sites));
  auto r = run("launch " + two);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("device: cuda, but this geoloco binary was built without CUDA"), std::string::npos) << r.out;
}

TEST(Cli, Bf16OnACpuSiteIsAConfigError) {
  TempDir d;
  auto cfg = d.file("c.yaml", tiny_config(d.path() / "out", "  precision: bf16\n"));
  auto r = run("validate " + cfg);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("train.precision: bf16 needs site.device: cuda, but site 'local' runs on the CPU"),
            std::string::npos)
      << r.out;
}

TEST(Cli, DeviceCudaWithoutAGpuFailsEachRankWithTheRuntimesReason) {
  if (!built_with_cuda_backend()) GTEST_SKIP() << "built without CUDA (see DeviceCudaWithoutCudaInTheBuild...)";
  if (geoloco::parallel::gpu_available()) GTEST_SKIP() << "a GPU is usable here: the no-device path cannot be shown";
  TempDir d;
  auto one = d.file("one.yaml", tiny_config(d.path() / "out", "", "site: {device: cuda}\n"));
  auto r = run("validate " + one);
  EXPECT_EQ(r.code, 0) << r.out;  // the config is fine for a CUDA build
  r = run("train " + one);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_EQ(count_lines_with(r.out, "geoloco: failed: "), 1) << r.out;
  EXPECT_NE(r.out.find("geoloco: failed: site local rank 0: site.device: cuda, but CUDA error in "), std::string::npos)
      << r.out;
  // The runtime's own reason is in the line (e.g. "no CUDA-capable device is detected").
  const std::string reason = geoloco::parallel::gpu_unavailable_reason();
  EXPECT_FALSE(reason.empty());

  const std::string sites = "sites: [{name: a, ranks: 2, port: " + std::to_string(fresh_port()) + ", device: cuda}]\n";
  auto two = d.file("two.yaml", tiny_config(d.path() / "out2", "", sites));
  r = run("launch " + two);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("site a rank "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("site.device: cuda, but CUDA error in "), std::string::npos) << r.out;
}
