// Replays the committed frame corpus (tests/compression/corpus) through the fuzz harness:
//   valid/      must decode;
//   malformed/  must fail with the fault its name starts with ("<fault>-...");
//   fuzz/       inputs the fuzzer found interesting: any outcome but a crash or a non-FrameError.
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

std::vector<fs::path> files_in(const std::string& sub) {
  std::vector<fs::path> out;
  const fs::path dir = fs::path(GEOLOCO_FRAME_CORPUS) / sub;
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
  size_t seen = 0;
  for (const auto& f : files_in("fuzz")) {
    EXPECT_NO_THROW(fuzz::run_frame_input(read_file(f))) << f.filename();
    ++seen;
  }
  RecordProperty("fuzz_inputs", static_cast<int>(seen));
}
