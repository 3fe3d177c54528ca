// Replays the committed frame corpus (tests/compression/corpus) through the fuzz harness:
//   valid/      must decode;
//   malformed/  must fail with the fault its name starts with ("<fault>-...");
//   fuzz/       inputs the fuzzer found interesting: any outcome but a crash or a non-FrameError.
// The folders are committed (GEOLOCO_FRAME_CORPUS is this source tree's corpus/, so CI's clone
// has them); a missing or empty folder fails the test naming it, since replaying nothing
// would pass without testing anything.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "compression/fuzz/frame_harness.hpp"

using namespace geoloco::compression;
namespace fs = std::filesystem;

namespace {

std::vector<uint8_t> read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

fs::path corpus_dir(const std::string& sub) { return fs::path(GEOLOCO_FRAME_CORPUS) / sub; }

std::vector<fs::path> files_in(const std::string& sub) {
  std::vector<fs::path> out;
  const fs::path dir = corpus_dir(sub);
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

std::string fault_str(const std::optional<FrameFault>& f) {
  return f ? std::string(fault_name(*f)) : std::string("ok");
}

}  // namespace

TEST(FrameCorpus, ValidFramesDecode) {
  const auto files = files_in("valid");
  ASSERT_GE(files.size(), 29u) << "corpus missing: regenerate with compression_make_corpus";
  for (const auto& f : files) {
    const auto o = fuzz::run_frame_input(read_file(f));
    EXPECT_EQ(fault_str(o.as_given), "ok") << f.filename();
    EXPECT_EQ(fault_str(o.resealed), "ok") << f.filename();
  }
}

TEST(FrameCorpus, MalformedFramesFailWithTheirFault) {
  const auto files = files_in("malformed");
  ASSERT_GE(files.size(), 25u);
  for (const auto& f : files) {
    const std::string name = f.filename().string();
    const std::string want = name.substr(0, name.find('-'));
    const auto o = fuzz::run_frame_input(read_file(f));
    EXPECT_EQ(fault_str(o.as_given), want) << name;
  }
}

TEST(FrameCorpus, FuzzFindingsNeverCrash) {
  const fs::path dir = corpus_dir("fuzz");
  ASSERT_TRUE(fs::is_directory(dir)) << dir.string()
                                     << ": missing; it holds the committed fuzz findings this test replays";
  const auto files = files_in("fuzz");
  ASSERT_FALSE(files.empty()) << dir.string() << ": no inputs to replay (the committed fuzz findings are gone)";
  for (const auto& f : files) EXPECT_NO_THROW(fuzz::run_frame_input(read_file(f))) << f.filename();
  RecordProperty("fuzz_inputs", static_cast<int>(files.size()));
}
