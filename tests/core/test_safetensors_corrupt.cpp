// The reader trusts nothing: every class of corruption is a FileError naming the file and
// the problem, never a crash or an out-of-bounds read (run under ASan to check the latter).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "tests/support/temp_dir.hpp"
#include "core/safetensors.hpp"
#include "core/error.hpp"

using namespace geoloco;

using geoloco::test::TempDir;

namespace {

std::vector<uint8_t> file_bytes(const std::string& header, size_t data_bytes, uint64_t declared = UINT64_MAX) {
  // Sized once and filled with memcpy (GCC 12 -O3 misreports vector::insert here).
  std::vector<uint8_t> b(8 + header.size() + data_bytes, 0x5a);
  const uint64_t n = declared == UINT64_MAX ? header.size() : declared;
  std::memcpy(b.data(), &n, 8);
  if (!header.empty()) std::memcpy(b.data() + 8, header.data(), header.size());
  return b;
}

// The problem text of parsing `bytes` (must be a FileError whose path is "f.st").
std::string problem(const std::vector<uint8_t>& bytes) {
  try {
    SafetensorsFile::parse(bytes, "f.st");
  } catch (const FileError& e) {
    EXPECT_EQ(e.path(), "f.st");
    const std::string w = e.what();
    return w.substr(std::string("f.st: ").size());
  }
  return "<parsed>";
}

std::string problem(const std::string& header, size_t data_bytes) { return problem(file_bytes(header, data_bytes)); }

std::vector<uint8_t> valid_file() {
  static const float a[4] = {1, 2, 3, 4};
  static const int64_t b[2] = {5, 6};
  std::vector<TensorWrite> t = {f32_tensor("a", {2, 2}, a), i64_tensor("b", {2}, b)};
  return encode_safetensors(t, {{"step", "10"}});
}

}  // namespace

TEST(SafetensorsCorrupt, LengthField) {
  EXPECT_EQ(problem(std::vector<uint8_t>{}), "file is 0 bytes, too short for the 8-byte header length");
  EXPECT_EQ(problem(std::vector<uint8_t>{1, 2, 3}), "file is 3 bytes, too short for the 8-byte header length");
  EXPECT_EQ(problem(file_bytes("{}", 0, 3)), "header length 3 exceeds the 2 bytes after the length field (truncated?)");
  EXPECT_EQ(problem(file_bytes("{}", 0, UINT64_MAX - 1)).find("header length 18446744073709551614 exceeds"), 0u);
  EXPECT_EQ(problem(file_bytes("", 0)), "header is not a JSON object (does not start with '{')");
  EXPECT_EQ(problem(file_bytes("[1, 2]", 0)), "header is not a JSON object (does not start with '{')");
}

TEST(SafetensorsCorrupt, HeaderOverTheSizeCapIsRefused) {
  // A sparse file just over the cap: the length is consistent with the size but absurd.
  TempDir dir;
  const auto p = dir.file("big.st");
  {
    std::ofstream f(p, std::ios::binary);
    const uint64_t n = 100'000'001;
    f.write(reinterpret_cast<const char*>(&n), 8);
  }
  std::filesystem::resize_file(p, 8 + 100'000'001);
  try {
    read_safetensors(p);
    FAIL();
  } catch (const FileError& e) {
    EXPECT_EQ(std::string(e.what()), p + ": header length 100000001 exceeds the 100000000-byte limit");
  }
}

TEST(SafetensorsCorrupt, Json) {
  EXPECT_EQ(problem("{\"a\": ", 0).find("header is not valid JSON: "), 0u);
  EXPECT_EQ(problem("{} trailing", 0).find("header is not valid JSON: "), 0u);
  EXPECT_EQ(
      problem(
          R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
          2),
      "header has a duplicate key 'a'");
  EXPECT_EQ(problem(R"({"a":{"dtype":"U8","dtype":"F32","shape":[1],"data_offsets":[0,1]}})", 1),
            "header has a duplicate key 'dtype'");
  EXPECT_EQ(problem(R"({"__metadata__":[1]})", 0), "__metadata__ is not an object");
  EXPECT_EQ(problem(R"({"__metadata__":{"k":1}})", 0), "__metadata__ value of 'k' is not a string");
}

TEST(SafetensorsCorrupt, TensorEntries) {
  EXPECT_EQ(problem(R"({"a":5})", 0), "tensor 'a': entry is not an object");
  EXPECT_EQ(problem(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}})", 1),
            "tensor 'a': unexpected key 'x'");
  EXPECT_EQ(problem(R"({"a":{"shape":[1],"data_offsets":[0,1]}})", 1), "tensor 'a': missing or non-string dtype");
  EXPECT_EQ(problem(R"({"a":{"dtype":"F31","shape":[1],"data_offsets":[0,1]}})", 1), "tensor 'a': unknown dtype 'F31'");
  EXPECT_EQ(problem(R"({"a":{"dtype":"U8","shape":3,"data_offsets":[0,3]}})", 3),
            "tensor 'a': missing or non-array shape");
  EXPECT_EQ(problem(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 1),
            "tensor 'a': shape entry -1 is not a non-negative integer");
  EXPECT_EQ(problem(R"({"a":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})", 1),
            "tensor 'a': shape entry 1.5 is not a non-negative integer");
  EXPECT_EQ(problem(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 1),
            "tensor 'a': data_offsets is not a pair of non-negative integers");
  EXPECT_EQ(problem(R"({"a":{"dtype":"U8","shape":[1]}})", 1),
            "tensor 'a': data_offsets is not a pair of non-negative integers");
  EXPECT_EQ(problem(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[2,1]}})", 2),
            "tensor 'a': data_offsets [2, 1] run backwards");
}

TEST(SafetensorsCorrupt, OffsetsAgainstShapesAndData) {
  // Truncated data: offsets past the end.
  EXPECT_EQ(problem(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 12),
            "tensor 'a': data_offsets [0, 16] run past the 12 data bytes (truncated?)");
  // Shape product * dtype size != span.
  EXPECT_EQ(problem(R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 12),
            "tensor 'a': shape [2, 2] of F32 needs 16 bytes but data_offsets [0, 12] span 12");
  // Overflowing shape product.
  EXPECT_EQ(problem(R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
            "tensor 'a': shape [4294967296, 4294967296] overflows");
  // Two tensors over the same bytes.
  EXPECT_EQ(
      problem(
          R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
          4),
      "tensors 'a' [0, 4) and 'b' [2, 4) overlap");
  // A hole between tensors.
  EXPECT_EQ(
      problem(
          R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})",
          5),
      "1 unreferenced bytes before tensor 'b' at offset 2");
  // Bytes nobody owns after the last tensor.
  EXPECT_EQ(problem(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 7),
            "5 trailing bytes after the last tensor");
  // Fine when consistent, in any key order.
  EXPECT_EQ(
      problem(
          R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},"a":{"data_offsets":[0,2],"shape":[2],"dtype":"U8"}})",
          4),
      "<parsed>");
}

TEST(SafetensorsCorrupt, EveryTruncationIsAFileError) {
  const auto good = valid_file();
  ASSERT_EQ(problem(good), "<parsed>");
  for (size_t len = 0; len < good.size(); ++len) {
    std::vector<uint8_t> cut(good.begin(), good.begin() + static_cast<ptrdiff_t>(len));
    EXPECT_NE(problem(cut), "<parsed>") << "prefix of " << len << " bytes parsed";
  }
}

TEST(SafetensorsCorrupt, ByteFlipsNeverCrash) {
  // Flip each header byte to several values: the reader either rejects the file with a
  // FileError or (for harmless flips, e.g. inside a metadata string) accepts it; nothing
  // else may escape.
  const auto good = valid_file();
  uint64_t n;
  std::memcpy(&n, good.data(), 8);
  size_t rejected = 0, tried = 0;
  for (size_t i = 0; i < 8 + n; ++i)
    for (uint8_t v : {0x00, 0x22, 0x2c, 0x5b, 0x7d, 0xff}) {
      auto b = good;
      if (b[i] == v) continue;
      b[i] = v;
      ++tried;
      try {
        SafetensorsFile::parse(b, "f.st");
      } catch (const FileError&) {
        ++rejected;
      }
    }
  EXPECT_GT(rejected * 10, tried * 7) << rejected << " of " << tried << " flips rejected";
}
