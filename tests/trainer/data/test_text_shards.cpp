// Text and llm.c shard sources: exact windows, and every class of bad shard is a FileError
// that names the file and the problem.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <numeric>

#include "tests/support/temp_dir.hpp"
#include "core/error.hpp"
#include "trainer/data/shard_source.hpp"
#include "trainer/data/text_source.hpp"

using namespace geoloco;
using namespace geoloco::trainer;
using geoloco::test::TempDir;

namespace {

std::vector<int32_t> window_of(const TokenDataset& d, size_t i, int T) {
  std::vector<int32_t> w(static_cast<size_t>(T) + 1);
  d.window(i, T, w.data());
  return w;
}

// The FileError message of f(), with its path() checked.
std::string file_error(const std::function<void()>& f, const std::string& expect_path) {
  try {
    f();
  } catch (const FileError& e) {
    EXPECT_EQ(e.path(), expect_path);
    return e.what();
  }
  ADD_FAILURE() << "no FileError";
  return "";
}

std::vector<uint16_t> iota16(size_t n, uint16_t start) {
  std::vector<uint16_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

void put_i32(const std::string& path, size_t index, int32_t value) {
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(static_cast<std::streamoff>(index * 4));
  f.write(reinterpret_cast<const char*>(&value), 4);
}

}  // namespace

TEST(TextSource, WindowsAreBytesEveryTTokens) {
  TempDir dir;
  const auto p = dir.file("t.txt", "hello world");
  StreamDataset d(open_text_stream(p));
  EXPECT_EQ(d.vocab_size(), 256);
  EXPECT_EQ(d.num_windows(3), 3u);  // (11 - 1) / 3
  EXPECT_EQ(d.num_windows(10), 1u);
  EXPECT_EQ(d.num_windows(11), 0u);
  EXPECT_EQ(window_of(d, 0, 3), (std::vector<int32_t>{'h', 'e', 'l', 'l'}));
  EXPECT_EQ(window_of(d, 1, 3), (std::vector<int32_t>{'l', 'o', ' ', 'w'}));
  EXPECT_EQ(window_of(d, 2, 3), (std::vector<int32_t>{'w', 'o', 'r', 'l'}));
  EXPECT_THROW(window_of(d, 3, 3), Error);
}

TEST(TextSource, HighBytesAreTokensAbove127) {
  TempDir dir;
  const auto p = dir.file("b.bin", std::string("\xff\x80\x00\x01", 4));
  StreamDataset d(open_text_stream(p));
  EXPECT_EQ(window_of(d, 0, 3), (std::vector<int32_t>{255, 128, 0, 1}));
}

TEST(TextSource, EmptyFileHasNoWindowsAndMissingFileIsFileError) {
  TempDir dir;
  StreamDataset d(open_text_stream(dir.file("e.txt", "")));
  EXPECT_EQ(d.num_windows(1), 0u);
  const auto missing = dir.file("nope.txt");
  auto msg = file_error([&] { open_text_stream(missing); }, missing);
  EXPECT_NE(msg.find("No such file"), std::string::npos) << msg;
}

// A directory is the concatenation of its regular files in name order; symlinks are skipped
// (so GPL -> GPL-3 style links do not duplicate text), and reads cross file boundaries.
TEST(TextSource, DirectoryConcatenatesRegularFilesInOrder) {
  TempDir dir;
  std::filesystem::create_directory(dir.path() / "d");
  std::filesystem::create_directory(dir.path() / "empty");
  dir.file("d/b.txt", "def");
  dir.file("d/a.txt", "abc");
  std::filesystem::create_symlink("a.txt", dir.path() / "d" / "c-link.txt");
  StreamDataset d(open_text_stream((dir.path() / "d").string()));
  EXPECT_EQ(d.num_tokens(), 6u);
  EXPECT_EQ(window_of(d, 0, 5), (std::vector<int32_t>{'a', 'b', 'c', 'd', 'e', 'f'}));
  EXPECT_EQ(window_of(d, 1, 2), (std::vector<int32_t>{'c', 'd', 'e'}));
  const auto empty = (dir.path() / "empty").string();
  auto msg = file_error([&] { open_text_stream(empty); }, empty);
  EXPECT_NE(msg.find("no regular files"), std::string::npos) << msg;
}

TEST(ShardSource, ConcatenatesShardsInSortedOrderAcrossBoundaries) {
  TempDir dir;
  std::filesystem::create_directory(dir.path() / "s");
  // Written out of order: the directory listing must be sorted (a < b).
  write_shard(dir.file("s/b.bin"), iota16(500, 1000));
  write_shard(dir.file("s/a.bin"), iota16(1000, 0));
  std::ofstream(dir.file("s/README.txt")) << "not a shard";  // ignored: not *.bin
  for (const std::string& spec : {dir.file("s"), dir.file("s/*.bin"), dir.file("s/?.bin")}) {
    SCOPED_TRACE(spec);
    StreamDataset d(open_shard_stream(spec, 2000));
    EXPECT_EQ(d.num_tokens(), 1500u);
    EXPECT_EQ(d.num_windows(7), 1499u / 7);
    // Window 142 covers tokens [994, 1001]: it crosses from a.bin into b.bin, and the
    // tokens are their own positions by construction.
    auto w = window_of(d, 142, 7);
    for (int t = 0; t <= 7; ++t) EXPECT_EQ(w[static_cast<size_t>(t)], 994 + t);
    auto last = window_of(d, d.num_windows(7) - 1, 7);
    EXPECT_EQ(last.back(), static_cast<int32_t>(213 * 7 + 7));
  }
  EXPECT_EQ(resolve_shard_paths(dir.file("s")), (std::vector<std::string>{dir.file("s/a.bin"), dir.file("s/b.bin")}));
}

TEST(ShardSource, SingleFileAndEmptyShardInTheMiddle) {
  TempDir dir;
  write_shard(dir.file("0.bin"), iota16(4, 10));
  write_shard(dir.file("1.bin"), {});
  write_shard(dir.file("2.bin"), iota16(4, 14));
  StreamDataset one(open_shard_stream(dir.file("0.bin"), 100));
  EXPECT_EQ(one.num_tokens(), 4u);
  StreamDataset all(open_shard_stream(dir.path().string(), 100));
  EXPECT_EQ(all.num_tokens(), 8u);
  EXPECT_EQ(window_of(all, 0, 7), (std::vector<int32_t>{10, 11, 12, 13, 14, 15, 16, 17}));
  EXPECT_EQ(window_of(all, 1, 3), (std::vector<int32_t>{13, 14, 15, 16}));
}

TEST(ShardSource, TruncatedTokensAreFileError) {
  TempDir dir;
  const auto p = dir.file("t.bin");
  write_shard(p, iota16(100, 0));
  std::filesystem::resize_file(p, kShardHeaderBytes + 199);
  auto msg = file_error([&] { open_shard_stream(p, 1000); }, p);
  EXPECT_NE(msg.find("truncated: header says 100 tokens (1224 bytes) but the file has 1223 bytes"), std::string::npos)
      << msg;
}

TEST(ShardSource, TruncatedHeaderIsFileError) {
  TempDir dir;
  const auto p = dir.file("h.bin", std::string(100, '\0'));
  auto msg = file_error([&] { open_shard_stream(p, 1000); }, p);
  EXPECT_NE(msg.find("truncated header: 100 bytes"), std::string::npos) << msg;
}

TEST(ShardSource, TrailingBytesAreFileError) {
  TempDir dir;
  const auto p = dir.file("t.bin");
  write_shard(p, iota16(10, 0));
  std::filesystem::resize_file(p, kShardHeaderBytes + 21);
  auto msg = file_error([&] { open_shard_stream(p, 1000); }, p);
  EXPECT_NE(msg.find("1 trailing bytes"), std::string::npos) << msg;
}

TEST(ShardSource, BadMagicIsFileError) {
  TempDir dir;
  const auto p = dir.file("m.bin");
  write_shard(p, iota16(10, 0));
  put_i32(p, 0, 20240521);
  auto msg = file_error([&] { open_shard_stream(p, 1000); }, p);
  EXPECT_NE(msg.find("bad magic 20240521 (expected 20240520)"), std::string::npos) << msg;
}

TEST(ShardSource, BadVersionIsFileError) {
  TempDir dir;
  const auto p = dir.file("v.bin");
  write_shard(p, iota16(10, 0));
  put_i32(p, 1, 2);
  auto msg = file_error([&] { open_shard_stream(p, 1000); }, p);
  EXPECT_NE(msg.find("unsupported shard version 2 (expected 1)"), std::string::npos) << msg;
}

TEST(ShardSource, NegativeCountIsFileError) {
  TempDir dir;
  const auto p = dir.file("n.bin");
  write_shard(p, iota16(10, 0));
  put_i32(p, 2, -5);
  auto msg = file_error([&] { open_shard_stream(p, 1000); }, p);
  EXPECT_NE(msg.find("negative token count -5"), std::string::npos) << msg;
}

TEST(ShardSource, TokenAtOrAboveVocabNamesIndexAndValue) {
  TempDir dir;
  std::filesystem::create_directory(dir.path() / "d");
  write_shard(dir.file("d/0.bin"), iota16(10, 0));
  auto bad = iota16(30, 0);
  bad[17] = 2000;
  const auto p = dir.file("d/1.bin");
  write_shard(p, bad);
  // The error names the bad file (not the directory), the index and the value.
  auto msg = file_error([&] { open_shard_stream(dir.file("d"), 2000); }, p);
  EXPECT_NE(msg.find("token 2000 at index 17 is >= vocab_size 2000"), std::string::npos) << msg;
  EXPECT_NO_THROW(open_shard_stream(dir.file("d"), 2001));
}

TEST(ShardSource, NothingToOpenIsFileError) {
  TempDir dir;
  std::filesystem::create_directory(dir.path() / "empty");
  auto m1 = file_error([&] { open_shard_stream(dir.file("empty"), 10); }, dir.file("empty"));
  EXPECT_NE(m1.find("no *.bin shard files"), std::string::npos) << m1;
  auto m2 = file_error([&] { open_shard_stream(dir.file("x*.bin"), 10); }, dir.file("x*.bin"));
  EXPECT_NE(m2.find("no shard file matches"), std::string::npos) << m2;
  auto m3 = file_error([&] { open_shard_stream(dir.file("absent.bin"), 10); }, dir.file("absent.bin"));
  EXPECT_NE(m3.find("no such file or directory"), std::string::npos) << m3;
  // A FileError is an InputError: the CLI exits 2.
  EXPECT_THROW(open_shard_stream(dir.file("absent.bin"), 10), InputError);
}

TEST(ShardSource, RandomGarbageNeverCrashes) {
  TempDir dir;
  const auto p = dir.file("g.bin");
  uint64_t x = 12345;
  for (int trial = 0; trial < 200; ++trial) {
    std::string bytes(static_cast<size_t>(trial * 13), '\0');
    for (auto& c : bytes) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      c = static_cast<char>(x >> 56);
    }
    // Keep a valid magic and version on some trials so the later checks are reached.
    if (trial % 2 == 0 && bytes.size() >= 12) {
      const int32_t h[2] = {kShardMagic, kShardVersion};
      std::memcpy(bytes.data(), h, 8);
    }
    dir.file("g.bin", bytes);
    EXPECT_THROW(open_shard_stream(p, 300), FileError) << "trial " << trial;
  }
}
