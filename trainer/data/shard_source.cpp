#include "trainer/data/shard_source.hpp"

#include <glob.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "core/error.hpp"
#include "trainer/data/mapped_file.hpp"

namespace geoloco::trainer {

// The format is little-endian; reading it with plain loads is only right on such hosts.
static_assert(std::endian::native == std::endian::little, "llm.c shards are little-endian");

namespace fs = std::filesystem;

namespace {

struct Shard {
  MappedFile file;
  uint64_t count = 0;  // tokens
  const uint16_t* tokens() const { return reinterpret_cast<const uint16_t*>(file.bytes().data() + kShardHeaderBytes); }
};

int32_t header_int(std::span<const uint8_t> bytes, size_t i) {
  int32_t v;
  std::memcpy(&v, bytes.data() + i * sizeof(int32_t), sizeof v);
  return v;
}

Shard open_shard(const std::string& path, int vocab_size) {
  Shard s{MappedFile(path)};
  s.count = validate_shard(s.file.bytes(), path, vocab_size);
  return s;
}

bool has_glob_chars(const std::string& p) { return p.find_first_of("*?[") != std::string::npos; }

class ShardStream final : public TokenStream {
 public:
  ShardStream(std::string spec, std::vector<Shard> shards, int vocab_size)
      : spec_(std::move(spec)), shards_(std::move(shards)), vocab_size_(vocab_size) {
    starts_.reserve(shards_.size());
    for (const auto& s : shards_) {
      starts_.push_back(total_);
      total_ += s.count;
    }
  }
  uint64_t size() const override { return total_; }
  int vocab_size() const override { return vocab_size_; }
  void read(uint64_t begin, size_t count, int32_t* out) const override {
    GEOLOCO_CHECK(begin <= total_ && count <= total_ - begin, "read [{}, +{}) past {} tokens of {}", begin, count,
                  total_, spec_);
    // The shard holding `begin`: the last one starting at or before it (skipping empty shards).
    size_t k = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), begin) - starts_.begin()) - 1;
    uint64_t pos = begin;
    while (count > 0) {
      while (pos - starts_[k] >= shards_[k].count) ++k;
      const uint64_t local = pos - starts_[k];
      const size_t take = static_cast<size_t>(std::min<uint64_t>(count, shards_[k].count - local));
      const uint16_t* t = shards_[k].tokens() + local;
      for (size_t i = 0; i < take; ++i) out[i] = t[i];
      out += take;
      pos += take;
      count -= take;
    }
  }
  std::string describe() const override {
    return fmt::format("shards {} ({} files, {} tokens)", spec_, shards_.size(), total_);
  }

 private:
  std::string spec_;
  std::vector<Shard> shards_;
  std::vector<uint64_t> starts_;
  uint64_t total_ = 0;
  int vocab_size_;
};

}  // namespace

uint64_t validate_shard(std::span<const uint8_t> bytes, const std::string& path, int vocab_size) {
  const size_t size = bytes.size();
  if (size < kShardHeaderBytes)
    throw FileError(
        path, fmt::format("truncated header: {} bytes, an llm.c shard header is {} bytes", size, kShardHeaderBytes));
  const int32_t magic = header_int(bytes, 0);
  if (magic != kShardMagic)
    throw FileError(path, fmt::format("bad magic {} (expected {}): not an llm.c token shard", magic, kShardMagic));
  const int32_t version = header_int(bytes, 1);
  if (version != kShardVersion)
    throw FileError(path, fmt::format("unsupported shard version {} (expected {})", version, kShardVersion));
  const int32_t count = header_int(bytes, 2);
  if (count < 0) throw FileError(path, fmt::format("negative token count {} in header", count));
  const uint64_t want = kShardHeaderBytes + 2 * static_cast<uint64_t>(count);
  if (size < want)
    throw FileError(
        path, fmt::format("truncated: header says {} tokens ({} bytes) but the file has {} bytes", count, want, size));
  if (size > want)
    throw FileError(path, fmt::format("{} trailing bytes after the {} tokens the header declares", size - want, count));
  // memcpy per token: `bytes` need not be 2-byte aligned (a mapping is; a fuzzer's input is not).
  const uint8_t* t = bytes.data() + kShardHeaderBytes;
  for (uint64_t i = 0; i < static_cast<uint64_t>(count); ++i) {
    uint16_t tok;
    std::memcpy(&tok, t + 2 * i, 2);
    if (tok >= vocab_size)
      throw FileError(path, fmt::format("token {} at index {} is >= vocab_size {}", tok, i, vocab_size));
  }
  return static_cast<uint64_t>(count);
}

std::vector<std::string> resolve_shard_paths(const std::string& path) {
  std::vector<std::string> out;
  if (has_glob_chars(path)) {
    glob_t g{};
    const int rc = ::glob(path.c_str(), GLOB_ERR, nullptr, &g);
    if (rc == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
    ::globfree(&g);
    if (rc == GLOB_NOMATCH || (rc == 0 && out.empty())) throw FileError(path, "no shard file matches this pattern");
    if (rc != 0) throw FileError(path, fmt::format("glob failed (code {})", rc));
  } else {
    std::error_code ec;
    const auto st = fs::status(path, ec);
    if (ec || !fs::exists(st)) throw FileError(path, "no such file or directory");
    if (fs::is_directory(st)) {
      for (const auto& e : fs::directory_iterator(path, ec))
        if (e.is_regular_file() && e.path().extension() == ".bin") out.push_back(e.path().string());
      if (ec) throw FileError(path, "cannot list directory: " + ec.message());
      if (out.empty()) throw FileError(path, "directory has no *.bin shard files");
    } else {
      out.push_back(path);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::shared_ptr<const TokenStream> open_shard_stream(const std::string& path, int vocab_size) {
  GEOLOCO_CHECK(vocab_size >= 1 && vocab_size <= 65536, "vocab_size {} does not fit uint16 tokens", vocab_size);
  std::vector<Shard> shards;
  for (const auto& p : resolve_shard_paths(path)) shards.push_back(open_shard(p, vocab_size));
  return std::make_shared<ShardStream>(path, std::move(shards), vocab_size);
}

void write_shard(const std::string& path, std::span<const uint16_t> tokens) {
  GEOLOCO_CHECK(tokens.size() <= 0x7fffffffu, "{} tokens do not fit an int32 header count", tokens.size());
  int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw FileError(path, "cannot open for writing");
  f.write(reinterpret_cast<const char*>(header), sizeof header);
  f.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size_bytes()));
  f.flush();
  if (!f) throw FileError(path, "write failed");
}

}  // namespace geoloco::trainer
