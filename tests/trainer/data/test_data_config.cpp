// data: config parsing (every error is located and says what is allowed), path resolution
// against the config directory, and the held-out validation split.
#include <gtest/gtest.h>

#include "tests/support/temp_dir.hpp"
#include "core/error.hpp"
#include "trainer/data/open_data.hpp"

using namespace geoloco;
using namespace geoloco::trainer;
using geoloco::test::TempDir;

namespace {

DataConfig parse(const std::string& yaml) {
  auto doc = config::load_string(yaml, "run.yaml");
  return DataConfig::from_yaml(doc.node().child("data"));
}

std::string config_error(const std::string& yaml) {
  try {
    parse(yaml);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST(DataConfig, ParsesTrainAndVal) {
  auto c = parse("data: {train: {kind: text, path: corpus/train.txt}, val: {kind: shards, path: 'v/*.bin'}}\n");
  EXPECT_EQ(c.train.kind, DataSourceConfig::Kind::Text);
  EXPECT_EQ(c.train.path, "corpus/train.txt");
  ASSERT_TRUE(c.val.has_value());
  EXPECT_EQ(c.val->kind, DataSourceConfig::Kind::Shards);
  EXPECT_EQ(c.val->path, "v/*.bin");
}

TEST(DataConfig, SyntheticKeysAndDefaults) {
  auto c = parse(
      "data:\n  train: {kind: synthetic, vocab: 97, branching: 5, seed: 42, tokens: 1000}\n"
      "  val_fraction: 0.2\n");
  EXPECT_EQ(c.train.kind, DataSourceConfig::Kind::Synthetic);
  EXPECT_EQ(c.train.vocab, 97);
  EXPECT_EQ(c.train.branching, 5);
  EXPECT_EQ(c.train.seed, 42u);
  EXPECT_EQ(c.train.tokens, 1000u);
  EXPECT_FALSE(c.val.has_value());
  EXPECT_DOUBLE_EQ(c.val_fraction, 0.2);
  auto d = parse("data: {train: {kind: synthetic}}\n");
  EXPECT_EQ(d.train.vocab, 256);
  EXPECT_EQ(d.train.branching, 4);
  EXPECT_DOUBLE_EQ(d.val_fraction, 0.1);
}

TEST(DataConfig, ErrorsAreLocatedAndSayWhatIsAllowed) {
  EXPECT_EQ(config_error("data: {train: {kind: csv, path: x}}\n"),
            "run.yaml:1:22: data.train.kind: got 'csv', expected one of text | shards | synthetic");
  EXPECT_NE(config_error("data: {train: {path: x}}\n").find("data.train.kind: missing"), std::string::npos);
  EXPECT_NE(config_error("data: {}\n").find("data.train: missing"), std::string::npos);
  EXPECT_NE(config_error("data: {train: {kind: text}}\n").find("data.train.path"), std::string::npos);
  EXPECT_NE(config_error("data: {train: {kind: text, path: x, vocab: 5}}\n")
                .find("data.train.vocab: applies only to kind synthetic (this source is text)"),
            std::string::npos);
  EXPECT_NE(config_error("data: {train: {kind: synthetic, path: x}}\n").find("data.train.path: applies only"),
            std::string::npos);
  EXPECT_NE(config_error("data: {train: {kind: synthetic, vocab: 4, branching: 5}}\n")
                .find("got 5, expected at most vocab (4)"),
            std::string::npos);
  EXPECT_NE(config_error("data: {train: {kind: synthetic, branching: 1}}\n").find("data.train.branching"),
            std::string::npos);
  EXPECT_NE(config_error("data: {train: {kind: text, path: x}, val: {kind: text, path: y}, val_fraction: 0.1}\n")
                .find("data.val_fraction: applies only when data.val is absent"),
            std::string::npos);
  EXPECT_NE(config_error("data: {train: {kind: text, path: x}, val_fraction: 0.95}\n").find("data.val_fraction"),
            std::string::npos);
  EXPECT_NE(config_error("data: {train: {kind: text, pth: x, path: y}}\n").find("data.train.pth: unknown key"),
            std::string::npos);
  EXPECT_NE(config_error("data: {train: {kind: synthetic}, windows: random}\n")
                .find("data.windows: random shifts windows within a token stream"),
            std::string::npos);
  EXPECT_NE(config_error("data: {train: {kind: text, path: x}, windows: rnd}\n")
                .find("data.windows: got 'rnd', expected one of aligned | random"),
            std::string::npos);
  EXPECT_NE(config_error("data: {train: {kind: text, path: x}, tain: 1}\n").find("data.tain: unknown key"),
            std::string::npos);
}

TEST(OpenData, RelativePathsResolveAgainstBaseDirAndHoldOutTheTail) {
  TempDir dir;
  std::filesystem::create_directory(dir.path() / "corpus");
  std::string text(100, '\0');
  for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<char>(i);
  dir.file("corpus/all.bin", text);
  auto cfg = parse("data: {train: {kind: text, path: corpus/all.bin}, val_fraction: 0.25}\n");
  auto s = open_data(cfg, dir.path(), 256);
  auto* tr = dynamic_cast<const StreamDataset*>(s.train.get());
  auto* va = dynamic_cast<const StreamDataset*>(s.val.get());
  ASSERT_TRUE(tr && va);
  EXPECT_EQ(tr->begin(), 0u);
  EXPECT_EQ(tr->end(), 75u);
  EXPECT_EQ(va->begin(), 75u);
  EXPECT_EQ(va->end(), 100u);
  EXPECT_EQ(s.train->num_windows(8), 9u);  // (75 - 1) / 8
  EXPECT_EQ(s.val->num_windows(8), 3u);    // (25 - 1) / 8
  std::vector<int32_t> w(9);
  s.train->window(8, 8, w.data());
  EXPECT_EQ(w.front(), 64);
  EXPECT_EQ(w.back(), 72);  // train never reads a held-out token
  s.val->window(0, 8, w.data());
  EXPECT_EQ(w.front(), 75);
  EXPECT_EQ(w.back(), 83);
  // Absolute paths are used as they are.
  auto abs = parse("data: {train: {kind: text, path: " + dir.file("corpus/all.bin") + "}, val_fraction: 0}\n");
  auto s2 = open_data(abs, "/nonexistent", 256);
  EXPECT_EQ(s2.train->num_windows(1), 99u);
  EXPECT_EQ(s2.val->num_windows(1), 0u);
  // Relative to the wrong directory: the FileError names the resolved path.
  try {
    open_data(cfg, dir.path() / "corpus", 256);
    FAIL() << "expected FileError";
  } catch (const FileError& e) {
    EXPECT_EQ(e.path(), (dir.path() / "corpus" / "corpus/all.bin").string());
  }
}

TEST(OpenData, ByteTokensNeedAVocabOf256) {
  TempDir dir;
  dir.file("t.txt", "abc");
  auto cfg = parse("data: {train: {kind: text, path: t.txt}}\n");
  EXPECT_THROW(open_data(cfg, dir.path(), 100), InputError);
  EXPECT_NO_THROW(open_data(cfg, dir.path(), 256));
}
