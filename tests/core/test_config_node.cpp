#include <gtest/gtest.h>

#include "core/config_node.hpp"

using geoloco::ConfigError;
using namespace geoloco::config;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST(ConfigNode, TypedValuesAndDefaults) {
  auto doc = load_string("train:\n  steps: 10\n  lr: 3.0e-4\n  name: x\n  betas: [0.9, 0.95]\n", "t.yaml");
  auto train = doc.node().child("train");
  EXPECT_EQ(train.get<int>("steps", 1), 10);
  EXPECT_DOUBLE_EQ(train.get<double>("lr", 0), 3.0e-4);
  EXPECT_EQ(train.get<std::string>("name", ""), "x");
  EXPECT_EQ(train.get<std::vector<double>>("betas", {}), (std::vector<double>{0.9, 0.95}));
  EXPECT_EQ(train.get<int>("absent", 7), 7);
  train.finish();
}

TEST(ConfigNode, BadValueNamesFileLineColumnPathValueAndAllowed) {
  auto doc = load_string("train:\n  steps: -3\n", "cfg.yaml");
  auto msg = error_of([&] { doc.node().child("train").get_int("steps", 1, 1, 1000); });
  EXPECT_EQ(msg, "cfg.yaml:2:10: train.steps: got '-3', expected an integer in [1, 1000]");
}

TEST(ConfigNode, WrongTypeIsRejected) {
  auto doc = load_string("train:\n  steps: ten\n", "cfg.yaml");
  auto msg = error_of([&] { doc.node().child("train").get<int>("steps", 1); });
  EXPECT_EQ(msg, "cfg.yaml:2:10: train.steps: got 'ten', expected an integer");
}

TEST(ConfigNode, UnknownKeySuggestsClosest) {
  auto doc = load_string("train:\n  steps: 3\n  micro_bach: 4\n", "cfg.yaml");
  auto msg = error_of([&] {
    auto t = doc.node().child("train");
    t.get<int>("steps", 1);
    t.get<int>("micro_batch", 1);
    t.finish();
  });
  EXPECT_EQ(msg,
            "cfg.yaml:3:3: train.micro_bach: unknown key (did you mean 'micro_batch'?); "
            "allowed keys: micro_batch, steps");
}

TEST(ConfigNode, ChoiceListsAllowedValues) {
  auto doc = load_string("site: {strategy: zero3}\n", "c.yaml");
  auto msg = error_of([&] { doc.node().child("site").get_choice("strategy", "ddp", {"ddp", "zero1"}); });
  EXPECT_EQ(msg, "c.yaml:1:18: site.strategy: got 'zero3', expected one of ddp | zero1");
}

TEST(ConfigNode, SetOverridesAndNamesTheOverride) {
  auto doc = load_string("train:\n  steps: 3\nsites:\n  - {name: a, port: 1}\n  - {name: b, port: 2}\n", "c.yaml",
                         {"train.steps=5", "sites.1.port=7000", "outer.interval=9", "train.lr=-1"});
  auto root = doc.node();
  EXPECT_EQ(root.child("train").get<int>("steps", 0), 5);
  EXPECT_EQ(root.child("outer").get<int>("interval", 0), 9);
  auto sites = root.items("sites");
  ASSERT_EQ(sites.size(), 2u);
  EXPECT_EQ(sites[1].get<int>("port", 0), 7000);
  EXPECT_EQ(sites[1].path(), "sites[1]");
  auto msg = error_of([&] { root.child("train").get_double("lr", 0, 0, 1); });
  EXPECT_EQ(msg, "(--set train.lr=-1): train.lr: got '-1', expected a number in [0, 1]");
}

// Every error about a key that came from --set names the override, never a position in
// the file (nodes an override made have no file position, or one into the override's text).
TEST(ConfigNode, ErrorsAboutOverriddenKeysNameTheOverride) {
  const std::string file = "model:\n  n_layer: 4\ntrain:\n  steps: 3\n";
  auto unknown = [&](const std::vector<std::string>& sets) {
    auto doc = load_string(file, "c.yaml", sets);
    return error_of([&] {
      auto root = doc.node();
      auto model = root.child("model");
      model.get<int>("n_layer", 1);
      root.child("train").get<int>("steps", 1);
      model.finish();
      root.finish();
    });
  };
  // A section the override created (a typo of "model"): the key itself is the override's.
  EXPECT_EQ(unknown({"modle.n_layer=2"}),
            "(--set modle.n_layer=2): modle: unknown key (did you mean 'model'?); allowed keys: model, train");
  // A key the override added to a section of the file.
  EXPECT_EQ(unknown({"model.n_layr=2"}),
            "(--set model.n_layr=2): model.n_layr: unknown key (did you mean "
            "'n_layer'?); allowed keys: n_layer");
  // A key inside a mapping the override gave as its value.
  EXPECT_EQ(unknown({"model={n_layer: 2, typo: 1}"}),
            "(--set model={n_layer: 2, typo: 1}): model.typo: unknown key; allowed keys: n_layer");
  // A file key next to overrides keeps file:line:col.
  auto doc = load_string(file + "  micro_bach: 1\n", "c.yaml", {"train.steps=5", "model.n_layer=2"});
  EXPECT_EQ(error_of([&] {
              auto t = doc.node().child("train");
              t.get<int>("steps", 1);
              t.finish();
            }),
            "c.yaml:5:3: train.micro_bach: unknown key; allowed keys: steps");
}

TEST(ConfigNode, BadValueAndWrongTypeFromSetNameTheOverride) {
  auto doc =
      load_string("train:\n  steps: 3\n", "c.yaml", {"train.steps=ten", "outer={interval: -1}", "run.seed=[1, 2]"});
  auto root = doc.node();
  EXPECT_EQ(error_of([&] { root.child("train").get<int>("steps", 1); }),
            "(--set train.steps=ten): train.steps: got 'ten', expected an integer");
  // Inside a mapping value: the override, not its value text's line 1.
  EXPECT_EQ(error_of([&] { root.child("outer").get_int("interval", 1, 1, 100); }),
            "(--set outer={interval: -1}): outer.interval: got '-1', expected an integer in [1, 100]");
  EXPECT_EQ(error_of([&] { root.child("run").get<int>("seed", 1); }),
            "(--set run.seed=[1, 2]): run.seed: got a list, expected an integer");
  // A list element that is not a mapping.
  auto sites = load_string("sites:\n  - {name: a}\n", "c.yaml", {"sites.0=5"});
  EXPECT_EQ(error_of([&] { sites.node().items("sites"); }), "(--set sites.0=5): sites[0]: got '5', expected a mapping");
}

TEST(ConfigNode, OverrideOriginsFollowWhatTheDocumentHolds) {
  // A key missing from a mapping an override only created is not the override's doing.
  auto doc = load_string("a: 1\n", "c.yaml", {"train.lr=0.1"});
  EXPECT_EQ(error_of([&] { doc.node().child("train").require<int>("steps"); }),
            "c.yaml: train.steps: missing required key");
  // Missing from a mapping an override gave: that override.
  doc = load_string("a: 1\n", "c.yaml", {"train={lr: 0.1}"});
  EXPECT_EQ(error_of([&] { doc.node().child("train").require<int>("steps"); }),
            "(--set train={lr: 0.1}): train.steps: missing required key");
  // A later override of a parent replaces what an earlier one set below it.
  doc = load_string("a: 1\n", "c.yaml", {"train.steps=5", "train={lr: 0.1}"});
  EXPECT_EQ(error_of([&] { doc.node().child("train").require<int>("steps"); }),
            "(--set train={lr: 0.1}): train.steps: missing required key");
  // And a later override of a key in a section an earlier one set names the later one.
  doc = load_string("a: 1\n", "c.yaml", {"train={steps: 2}", "train.steps=x"});
  EXPECT_EQ(error_of([&] { doc.node().child("train").get<int>("steps", 1); }),
            "(--set train.steps=x): train.steps: got 'x', expected an integer");
}

TEST(ConfigNode, BadOverrides) {
  EXPECT_NE(error_of([] { load_string("a: 1\n", "c", {"novalue"}); }).find("expected key.path=value"),
            std::string::npos);
  EXPECT_NE(error_of([] { load_string("a: 1\n", "c", {"a.b=2"}); }).find("is a scalar"), std::string::npos);
  EXPECT_NE(error_of([] { load_string("s: [1]\n", "c", {"s.3=2"}); }).find("out of range"), std::string::npos);
}

TEST(ConfigNode, SyntaxErrorHasLocation) {
  auto msg = error_of([] { load_string("a: [1, 2\nb: 3\n", "bad.yaml"); });
  EXPECT_NE(msg.find("bad.yaml:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("YAML syntax error"), std::string::npos) << msg;
}

TEST(ConfigNode, MissingFileIsFileError) { EXPECT_THROW(load_file("/nonexistent/geoloco.yaml"), geoloco::FileError); }

TEST(ConfigNode, SectionMustBeMapping) {
  auto doc = load_string("train: 5\n", "c.yaml");
  auto msg = error_of([&] { doc.node().child("train"); });
  EXPECT_EQ(msg, "c.yaml:1:8: train: got '5', expected a mapping");
}
