// safetensors writer and reader: exact bytes, round trips, atomic replacement.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "tests/support/temp_dir.hpp"
#include "core/atomic_file.hpp"
#include "core/safetensors.hpp"
#include "core/error.hpp"
#include "core/hash.hpp"

using namespace geoloco;

using geoloco::test::TempDir;

namespace {

std::vector<uint8_t> slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

}  // namespace

TEST(Safetensors, BytesMatchTheFormatExactly) {
  const float a[2] = {1.0f, -2.0f};
  const int64_t b[1] = {258};
  std::vector<TensorWrite> t = {f32_tensor("a", {2}, a), i64_tensor("b", {1, 1}, b)};
  const auto bytes = encode_safetensors(t, {{"k", "v"}});
  const std::string sums = hex64(hash64(a, 8)) + "," + hex64(hash64(b, 8));
  const std::string json = R"({"__metadata__":{"k":"v","geoloco.tensor_xxh3_64":")" + sums +
                           R"("},)"
                           R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"I64","shape":[1,1],"data_offsets":[8,16]}})";
  // 8 + N must be a multiple of 8: the JSON is padded with spaces.
  std::string header = json + std::string((8 - json.size() % 8) % 8, ' ');
  std::vector<uint8_t> want;
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) want.push_back(static_cast<uint8_t>(n >> (8 * i)));  // little-endian
  want.insert(want.end(), header.begin(), header.end());
  for (uint8_t x : {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0}) want.push_back(x);  // 1.0f, -2.0f
  for (uint8_t x : {0x02, 0x01, 0, 0, 0, 0, 0, 0}) want.push_back(x);                    // 258
  EXPECT_EQ(bytes, want);
  EXPECT_EQ((8 + header.size()) % 8, 0u);
}

TEST(Safetensors, WithoutCallerMetadataOnlyTheChecksumsAreWritten) {
  const uint8_t x[3] = {7, 8, 9};
  std::vector<TensorWrite> t = {u8_tensor("x", {3}, x)};
  const auto bytes = encode_safetensors(t, {});
  const std::string json = R"({"__metadata__":{"geoloco.tensor_xxh3_64":")" + hex64(hash64(x, 3)) +
                           R"("},"x":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}})";
  ASSERT_GE(bytes.size(), 8 + json.size());
  EXPECT_EQ(std::string(bytes.begin() + 8, bytes.begin() + 8 + static_cast<ptrdiff_t>(json.size())), json);
  // No tensors, no metadata: an empty header, as the reference writes it.
  const auto empty = encode_safetensors({}, {});
  EXPECT_EQ(std::string(empty.begin() + 8, empty.begin() + 10), "{}");
}

// Every tensor's bytes are checksummed: a flipped data bit is a FileError naming the
// tensor and its byte range; files without checksums (Python, Hugging Face) still load.
TEST(Safetensors, ChecksumsCatchCorruptDataAndAreOptional) {
  std::vector<float> w(64);
  for (size_t i = 0; i < w.size(); ++i) w[i] = float(i) * 0.5f;
  const int64_t step[1] = {7};
  std::vector<TensorWrite> t = {f32_tensor("w", {8, 8}, w), f32_tensor("none", {0}, {}), i64_tensor("step", {1}, step)};
  // A caller's value for the key is replaced by the real checksums.
  auto good = encode_safetensors(t, {{"run", "x"}, {kTensorChecksumKey, "bogus"}});
  const auto f = SafetensorsFile::parse(good, "f.st");
  EXPECT_TRUE(f.checksummed());
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"run", "x"}}));  // the key is not metadata
  uint64_t n;
  std::memcpy(&n, good.data(), 8);
  const size_t data = 8 + n;
  auto flipped = [&](size_t at) {
    auto b = good;
    b[at] ^= 0x04;
    try {
      SafetensorsFile::parse(b, "f.st");
    } catch (const FileError& e) {
      return std::string(e.what());
    }
    return std::string("<parsed>");
  };
  const std::string in_w = flipped(data + 100);
  EXPECT_NE(in_w.find("f.st: tensor 'w' (data bytes [0, 256)) fails its checksum: stored "), std::string::npos) << in_w;
  EXPECT_NE(in_w.find("the file is corrupt"), std::string::npos) << in_w;
  EXPECT_NE(flipped(data + 256).find("tensor 'step' (data bytes [256, 264))"), std::string::npos);
  for (size_t at = data; at < good.size(); ++at) EXPECT_NE(flipped(at), "<parsed>") << "data byte " << at;

  // The same tensors without the key (as Python writes them) load, unverified.
  const std::string header = R"({"__metadata__":{"run":"x"},"w":{"dtype":"F32","shape":[8,8],"data_offsets":[0,256]},)"
                             R"("step":{"dtype":"I64","shape":[1],"data_offsets":[256,264]}})";
  std::vector<uint8_t> plain(8);
  const uint64_t hn = header.size();
  std::memcpy(plain.data(), &hn, 8);
  plain.insert(plain.end(), header.begin(), header.end());
  plain.insert(plain.end(), good.begin() + static_cast<ptrdiff_t>(data), good.end());
  const auto p = SafetensorsFile::parse(plain, "py.st");
  EXPECT_FALSE(p.checksummed());
  EXPECT_EQ(p.f32("w"), w);

  // A malformed list is refused, naming the key.
  auto with_sums = [&](const std::string& sums) {
    const std::string h = R"({"__metadata__":{"geoloco.tensor_xxh3_64":")" + sums +
                          R"("},"step":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})";
    std::vector<uint8_t> b(8);
    const uint64_t len = h.size();
    std::memcpy(b.data(), &len, 8);
    b.insert(b.end(), h.begin(), h.end());
    b.insert(b.end(), reinterpret_cast<const uint8_t*>(step), reinterpret_cast<const uint8_t*>(step) + 8);
    try {
      SafetensorsFile::parse(b, "m.st");
    } catch (const FileError& e) {
      return std::string(e.what());
    }
    return std::string("<parsed>");
  };
  EXPECT_EQ(with_sums(hex64(hash64(step, 8))), "<parsed>");
  EXPECT_EQ(with_sums(""), "m.st: __metadata__ 'geoloco.tensor_xxh3_64' lists 0 checksums for 1 tensors");
  EXPECT_EQ(with_sums(hex64(hash64(step, 8)) + ","),
            "m.st: __metadata__ 'geoloco.tensor_xxh3_64' lists 2 checksums for 1 tensors");
  EXPECT_EQ(with_sums("XYZ"),
            "m.st: __metadata__ 'geoloco.tensor_xxh3_64': checksum 0 ('XYZ') is not 16 lowercase hex digits");
}

TEST(Safetensors, RoundTripKeepsEveryBitAndTheMetadata) {
  TempDir dir;
  std::vector<float> w(6 * 5);
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::sin(static_cast<float>(i)) * 1e-3f;
  w[3] = -0.0f;
  w[4] = std::numeric_limits<float>::denorm_min();
  std::vector<int64_t> step = {123456789012345LL, -1};
  std::vector<uint8_t> blob = {1, 2, 3, 4, 5};
  const float scalar[1] = {42.5f};
  std::vector<TensorWrite> t = {f32_tensor("layer.w", {6, 5}, w), i64_tensor("step", {2}, step),
                                u8_tensor("blob", {5}, blob), f32_tensor("empty", {0, 4}, {}),
                                f32_tensor("scalar", {}, scalar)};
  const std::map<std::string, std::string> meta = {{"run", "geo-1"}, {"unicode", "µ→∑"}, {"empty", ""}};
  const auto path = dir.file("x.safetensors");
  write_safetensors(path, t, meta);
  auto f = read_safetensors(path);
  EXPECT_EQ(f.metadata(), meta);
  ASSERT_EQ(f.tensors().size(), 5u);
  EXPECT_EQ(f.tensors()[0].name, "layer.w");  // data order = write order
  EXPECT_EQ(f.info("layer.w").shape, (std::vector<int64_t>{6, 5}));
  const auto w2 = f.f32("layer.w");
  ASSERT_EQ(w2.size(), w.size());
  EXPECT_EQ(std::memcmp(w2.data(), w.data(), w.size() * 4), 0);
  EXPECT_EQ(f.i64("step"), step);
  EXPECT_EQ(f.u8("blob"), blob);
  EXPECT_TRUE(f.f32("empty").empty());
  EXPECT_EQ(f.info("empty").shape, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(f.f32("scalar"), std::vector<float>{42.5f});
  EXPECT_TRUE(f.info("scalar").shape.empty());
  // Same inputs, same bytes.
  EXPECT_EQ(slurp(path), encode_safetensors(t, meta));
}

// A tensor written from parts of several buffers (the outer loop's fragments) is byte for
// byte the tensor written in one piece: same file, same checksum; a size mismatch is refused.
TEST(Safetensors, ATensorFromPartsIsTheSameAsFromOneBuffer) {
  TempDir dir;
  std::vector<float> whole(1000);
  for (size_t i = 0; i < whole.size(); ++i) whole[i] = std::cos(static_cast<float>(i));
  const std::span<const float> w(whole);
  const std::vector<std::span<const float>> parts = {w.subspan(0, 1), w.subspan(1, 0), w.subspan(1, 600),
                                                     w.subspan(601, 399)};
  std::vector<TensorWrite> one = {f32_tensor("x", {1000}, whole)};
  std::vector<TensorWrite> cut = {f32_parts_tensor("x", parts)};
  write_safetensors(dir.file("one.safetensors"), one, {{"k", "v"}});
  write_safetensors(dir.file("cut.safetensors"), cut, {{"k", "v"}});
  EXPECT_EQ(encode_safetensors(cut, {{"k", "v"}}), encode_safetensors(one, {{"k", "v"}}));
  auto a = read_safetensors(dir.file("one.safetensors")), b = read_safetensors(dir.file("cut.safetensors"));
  EXPECT_EQ(a.metadata(), b.metadata());
  EXPECT_EQ(b.f32("x"), whole);
  EXPECT_EQ(b.info("x").shape, (std::vector<int64_t>{1000}));
  // Parts that do not add up to the shape, or bytes and parts both, are refused.
  TensorWrite bad = f32_parts_tensor("x", parts);
  bad.shape = {999};
  EXPECT_THROW(encode_safetensors(std::vector<TensorWrite>{bad}, {}), Error);
  bad = f32_parts_tensor("x", parts);
  bad.bytes = one[0].bytes;
  EXPECT_THROW(encode_safetensors(std::vector<TensorWrite>{bad}, {}), Error);
}

TEST(Safetensors, TypedAccessChecksDtypeShapeAndName) {
  TempDir dir;
  const int64_t v[2] = {1, 2};
  std::vector<TensorWrite> t = {i64_tensor("n", {2}, v)};
  const auto path = dir.file("t.safetensors");
  write_safetensors(path, t, {});
  auto f = read_safetensors(path);
  try {
    f.f32("n");
    FAIL();
  } catch (const FileError& e) {
    EXPECT_EQ(std::string(e.what()), path + ": tensor 'n' is I64, expected F32");
  }
  try {
    f.info("m");
    FAIL();
  } catch (const FileError& e) {
    EXPECT_EQ(std::string(e.what()), path + ": no tensor 'm'");
  }
  const int64_t want_shape[] = {1, 2};
  try {
    f.check("n", Dtype::I64, want_shape);
    FAIL();
  } catch (const FileError& e) {
    EXPECT_EQ(std::string(e.what()), path + ": tensor 'n' has shape [2], expected [1, 2]");
  }
  EXPECT_THROW(f.meta("absent"), FileError);
}

// Typed metadata: the whole value is one number in range, or a FileError naming the file,
// the key and the value (std::stoll would take "12abc" as 12 and throw "stoll" on "abc").
TEST(Safetensors, TypedMetadataParsesWholeValuesInRange) {
  const std::map<std::string, std::string> meta = {{"step", "1200"},
                                                   {"neg", "-7"},
                                                   {"junk", "abc"},
                                                   {"trailing", "12abc"},
                                                   {"space", " 12"},
                                                   {"plus", "+12"},
                                                   {"empty", ""},
                                                   {"big", "9223372036854775808"},
                                                   {"u64max", "18446744073709551615"},
                                                   {"u64over", "18446744073709551616"},
                                                   {"hex", "0x10"},
                                                   {"wall", "12.5"},
                                                   {"exp", "1e-05"},
                                                   {"inf", "inf"},
                                                   {"nan", "nan"},
                                                   {"dbig", "1e999"},
                                                   {"dtrail", "1.5s"},
                                                   {"i64min", "-9223372036854775808"}};
  const auto f = SafetensorsFile::parse(encode_safetensors({}, meta), "m.st");
  auto error = [](const std::function<void()>& fn) -> std::string {
    try {
      fn();
    } catch (const FileError& e) {
      return e.what();
    }
    return "<no error>";
  };
  EXPECT_EQ(f.meta_int("step", 0, 10000), 1200);
  EXPECT_EQ(f.meta_int("neg"), -7);
  EXPECT_EQ(f.meta_int("i64min"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f.meta_uint("u64max"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(f.meta_uint("step", 1200, 1200), 1200u);
  EXPECT_DOUBLE_EQ(f.meta_double("wall", 0, 100), 12.5);
  EXPECT_DOUBLE_EQ(f.meta_double("exp"), 1e-05);
  EXPECT_DOUBLE_EQ(f.meta_double("step"), 1200.0);

  EXPECT_EQ(error([&] { f.meta_int("junk", 0); }), "m.st: __metadata__ 'junk': got 'abc', expected an integer >= 0");
  EXPECT_EQ(error([&] { f.meta_int("trailing"); }), "m.st: __metadata__ 'trailing': got '12abc', expected an integer");
  EXPECT_EQ(error([&] { f.meta_int("space"); }), "m.st: __metadata__ 'space': got ' 12', expected an integer");
  EXPECT_EQ(error([&] { f.meta_int("plus"); }), "m.st: __metadata__ 'plus': got '+12', expected an integer");
  EXPECT_EQ(error([&] { f.meta_int("hex"); }), "m.st: __metadata__ 'hex': got '0x10', expected an integer");
  EXPECT_EQ(error([&] { f.meta_int("empty"); }), "m.st: __metadata__ 'empty': got '', expected an integer");
  EXPECT_EQ(error([&] { f.meta_int("big"); }),  // INT64_MAX + 1: overflow, not a wrap
            "m.st: __metadata__ 'big': got '9223372036854775808', expected an integer");
  EXPECT_EQ(error([&] { f.meta_int("step", 0, 1000); }),
            "m.st: __metadata__ 'step': got '1200', expected an integer in [0, 1000]");
  EXPECT_EQ(error([&] { f.meta_int("neg", 0); }), "m.st: __metadata__ 'neg': got '-7', expected an integer >= 0");
  EXPECT_EQ(error([&] { f.meta_uint("neg"); }), "m.st: __metadata__ 'neg': got '-7', expected a non-negative integer");
  EXPECT_EQ(error([&] { f.meta_uint("u64over"); }),
            "m.st: __metadata__ 'u64over': got '18446744073709551616', expected a non-negative integer");
  EXPECT_EQ(error([&] { f.meta_uint("step", 0, 99); }),
            "m.st: __metadata__ 'step': got '1200', expected a non-negative integer <= 99");
  EXPECT_EQ(error([&] { f.meta_double("inf"); }), "m.st: __metadata__ 'inf': got 'inf', expected a finite number");
  EXPECT_EQ(error([&] { f.meta_double("nan"); }), "m.st: __metadata__ 'nan': got 'nan', expected a finite number");
  EXPECT_EQ(error([&] { f.meta_double("dbig"); }), "m.st: __metadata__ 'dbig': got '1e999', expected a finite number");
  EXPECT_EQ(error([&] { f.meta_double("dtrail", 0); }),
            "m.st: __metadata__ 'dtrail': got '1.5s', expected a finite number >= 0");
  EXPECT_EQ(error([&] { f.meta_double("empty"); }), "m.st: __metadata__ 'empty': got '', expected a finite number");
  EXPECT_EQ(error([&] { f.meta_double("wall", 0, 10); }),
            "m.st: __metadata__ 'wall': got '12.5', expected a finite number in [0, 10]");
  EXPECT_EQ(error([&] { f.meta_int("absent"); }), "m.st: __metadata__ has no 'absent'");
  EXPECT_EQ(error([&] { f.meta_double("absent"); }), "m.st: __metadata__ has no 'absent'");
}

TEST(Safetensors, UnalignedDataIsReadCorrectly) {
  // A foreign writer need not pad: header of 61 bytes puts F32 data at an odd offset.
  const std::string json = R"({"v":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::vector<uint8_t> bytes(8);
  const uint64_t n = json.size();
  std::memcpy(bytes.data(), &n, 8);
  bytes.insert(bytes.end(), json.begin(), json.end());
  const float vals[2] = {3.25f, -7.5f};
  const auto* p = reinterpret_cast<const uint8_t*>(vals);
  bytes.insert(bytes.end(), p, p + 8);
  ASSERT_NE((8 + json.size()) % 4, 0u);
  auto f = SafetensorsFile::parse(bytes, "mem");
  EXPECT_EQ(f.f32("v"), (std::vector<float>{3.25f, -7.5f}));
}

TEST(Safetensors, WriterRejectsInconsistentTensors) {
  const float a[3] = {1, 2, 3};
  std::vector<TensorWrite> wrong_size = {f32_tensor("a", {2, 2}, a)};
  EXPECT_THROW(encode_safetensors(wrong_size, {}), Error);
  std::vector<TensorWrite> dup = {f32_tensor("a", {3}, a), f32_tensor("a", {3}, a)};
  EXPECT_THROW(encode_safetensors(dup, {}), Error);
  std::vector<TensorWrite> reserved = {f32_tensor("__metadata__", {3}, a)};
  EXPECT_THROW(encode_safetensors(reserved, {}), Error);
  std::vector<TensorWrite> neg = {f32_tensor("a", {-1, -3}, a)};
  EXPECT_THROW(encode_safetensors(neg, {}), Error);
  std::vector<TensorWrite> ok = {f32_tensor("a", {3}, a)};
  EXPECT_THROW(encode_safetensors(ok, {{"bad", std::string("\xff\xfe", 2)}}), Error);  // not UTF-8
}

TEST(AtomicFile, ReplacesAtomicallyAndLeavesNoTemporary) {
  TempDir dir;
  const auto path = dir.file("ckpt.safetensors");
  const float a[1] = {1};
  const float b[1] = {2};
  std::vector<TensorWrite> ta = {f32_tensor("x", {1}, a)}, tb = {f32_tensor("x", {1}, b)};
  write_safetensors(path, ta, {});
  write_safetensors(path, tb, {});
  EXPECT_EQ(read_safetensors(path).f32("x"), std::vector<float>{2});
  {
    // A reader keeps the version it opened: the replacement is a new inode.
    auto old = read_safetensors(path);
    write_safetensors(path, ta, {});
    EXPECT_EQ(old.f32("x"), std::vector<float>{2});
    EXPECT_EQ(read_safetensors(path).f32("x"), std::vector<float>{1});
    write_safetensors(path, tb, {});
  }
  size_t entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1u) << "a temporary file was left behind";
  std::string tmp;
  {
    // A write abandoned before commit (e.g. an exception mid-save) keeps the old file.
    AtomicFileWriter w(path);
    w.write(std::vector<uint8_t>(100, 0xab));
    EXPECT_TRUE(std::filesystem::exists(w.temp_path()));
    // Unique per writer (pid, then a per-process serial): two writers never share one.
    EXPECT_EQ(w.temp_path().rfind(path + ".tmp." + std::to_string(::getpid()) + ".", 0), 0u) << w.temp_path();
    AtomicFileWriter other(path);
    EXPECT_NE(other.temp_path(), w.temp_path());
    tmp = w.temp_path();
  }
  EXPECT_EQ(read_safetensors(path).f32("x"), std::vector<float>{2});
  EXPECT_FALSE(std::filesystem::exists(tmp));
  // An unwritable destination is an Error naming the path.
  try {
    write_safetensors(dir.file("no/such/dir/c.safetensors"), tb, {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no/such/dir/c.safetensors.tmp."), std::string::npos) << e.what();
  }
}
