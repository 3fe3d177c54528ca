#include "core/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <string_view>
#include <type_traits>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/atomic_file.hpp"
#include "core/strict_json.hpp"
#include "core/error.hpp"
#include "core/fd.hpp"
#include "core/hash.hpp"

namespace geoloco {

// Tensor bytes are written and read as the host holds them; the format is little-endian.
static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// The reference implementation refuses headers above 100 MB; a larger length is corruption.
constexpr uint64_t kMaxHeader = 100'000'000;

struct DtypeEntry {
  Dtype d;
  const char* name;
  size_t size;
};
constexpr DtypeEntry kDtypes[] = {
    {Dtype::BOOL, "BOOL", 1},       {Dtype::U8, "U8", 1},   {Dtype::I8, "I8", 1},   {Dtype::F8_E4M3, "F8_E4M3", 1},
    {Dtype::F8_E5M2, "F8_E5M2", 1}, {Dtype::I16, "I16", 2}, {Dtype::U16, "U16", 2}, {Dtype::F16, "F16", 2},
    {Dtype::BF16, "BF16", 2},       {Dtype::I32, "I32", 4}, {Dtype::U32, "U32", 4}, {Dtype::F32, "F32", 4},
    {Dtype::F64, "F64", 8},         {Dtype::I64, "I64", 8}, {Dtype::U64, "U64", 8},
};

const DtypeEntry& entry(Dtype d) {
  for (const auto& e : kDtypes)
    if (e.d == d) return e;
  throw Error(fmt::format("unknown dtype code {}", static_cast<int>(d)));
}

// numel(shape) * elem, or false on a negative dimension or overflow past 2^63.
bool byte_size(std::span<const int64_t> shape, size_t elem, uint64_t* out) {
  unsigned __int128 n = elem;
  for (int64_t d : shape) {
    if (d < 0) return false;
    n *= static_cast<uint64_t>(d);
    if (n > static_cast<unsigned __int128>(INT64_MAX)) return false;
  }
  *out = static_cast<uint64_t>(n);
  return true;
}

}  // namespace

const char* dtype_name(Dtype d) { return entry(d).name; }
size_t dtype_size(Dtype d) { return entry(d).size; }

bool parse_dtype(const std::string& name, Dtype* out) {
  for (const auto& e : kDtypes)
    if (name == e.name) {
      *out = e.d;
      return true;
    }
  return false;
}

std::string shape_string(std::span<const int64_t> shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

uint64_t TensorInfo::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

TensorWrite f32_tensor(std::string name, std::vector<int64_t> shape, std::span<const float> data) {
  return {std::move(name),
          Dtype::F32,
          std::move(shape),
          std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(data.data()), data.size_bytes()),
          {}};
}
TensorWrite i64_tensor(std::string name, std::vector<int64_t> shape, std::span<const int64_t> data) {
  return {std::move(name),
          Dtype::I64,
          std::move(shape),
          std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(data.data()), data.size_bytes()),
          {}};
}
TensorWrite u8_tensor(std::string name, std::vector<int64_t> shape, std::span<const uint8_t> data) {
  return {std::move(name), Dtype::U8, std::move(shape), data, {}};
}

size_t TensorWrite::size() const {
  if (parts.empty()) return bytes.size();
  size_t n = 0;
  for (const auto& p : parts) n += p.size();
  return n;
}

TensorWrite f32_parts_tensor(std::string name, const std::vector<std::span<const float>>& parts) {
  TensorWrite t{std::move(name), Dtype::F32, {0}, {}, {}};
  int64_t n = 0;
  for (const auto& p : parts) {
    t.parts.emplace_back(reinterpret_cast<const uint8_t*>(p.data()), p.size_bytes());
    n += static_cast<int64_t>(p.size());
  }
  t.shape = {n};
  return t;
}

namespace {

// The tensor's bytes in order, part by part.
template <class F>
void for_each_part(const TensorWrite& t, F f) {
  if (t.parts.empty()) {
    f(t.bytes);
    return;
  }
  for (const auto& p : t.parts) f(p);
}

// Header bytes (JSON padded with spaces to a multiple of 8) for tensors packed in order.
std::string encode_header(std::span<const TensorWrite> tensors, const std::map<std::string, std::string>& metadata) {
  ordered_json h = ordered_json::object();
  // The checksums are derived from the tensors: a caller's value for the key is replaced.
  std::string sums;
  for (const auto& t : tensors) {
    if (!sums.empty()) sums.push_back(',');
    Hasher hs;  // XXH3 streamed: the same digest as hash64 of the bytes in one piece
    for_each_part(t, [&](std::span<const uint8_t> b) { hs.update(b.data(), b.size()); });
    sums.append(hex64(hs.digest()));
  }
  if (!metadata.empty() || !tensors.empty()) {
    ordered_json m = ordered_json::object();
    for (const auto& [k, v] : metadata)
      if (k != kTensorChecksumKey) m[k] = v;
    if (!tensors.empty()) m[kTensorChecksumKey] = sums;
    h["__metadata__"] = std::move(m);
  }
  std::set<std::string> names;
  uint64_t off = 0;
  for (const auto& t : tensors) {
    GEOLOCO_CHECK(!t.name.empty() && t.name != "__metadata__", "invalid tensor name '{}'", t.name);
    GEOLOCO_CHECK(names.insert(t.name).second, "duplicate tensor name '{}'", t.name);
    uint64_t want = 0;
    GEOLOCO_CHECK(byte_size(t.shape, dtype_size(t.dtype), &want), "tensor '{}' has an invalid shape {}", t.name,
                  shape_string(t.shape));
    GEOLOCO_CHECK(want == t.size(), "tensor '{}': shape {} of {} needs {} bytes, got {}", t.name, shape_string(t.shape),
                  dtype_name(t.dtype), want, t.size());
    GEOLOCO_CHECK(t.parts.empty() || t.bytes.empty(), "tensor '{}': both bytes and parts", t.name);
    ordered_json e = ordered_json::object();
    e["dtype"] = dtype_name(t.dtype);
    e["shape"] = t.shape;
    e["data_offsets"] = {off, off + want};
    h[t.name] = std::move(e);
    off += want;
  }
  std::string text;
  try {
    text = h.dump();
  } catch (const ordered_json::exception& e) {
    throw Error(fmt::format("cannot encode safetensors header: {}", e.what()));  // e.g. invalid UTF-8
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

void put_u64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }

}  // namespace

std::vector<uint8_t> encode_safetensors(std::span<const TensorWrite> tensors,
                                        const std::map<std::string, std::string>& metadata) {
  const std::string header = encode_header(tensors, metadata);
  size_t total = 8 + header.size();
  for (const auto& t : tensors) total += t.size();
  std::vector<uint8_t> out(total);
  put_u64(out.data(), header.size());
  std::memcpy(out.data() + 8, header.data(), header.size());
  size_t at = 8 + header.size();
  for (const auto& t : tensors)
    for_each_part(t, [&](std::span<const uint8_t> b) {
      if (!b.empty()) std::memcpy(out.data() + at, b.data(), b.size());
      at += b.size();
    });
  return out;
}

void write_safetensors(const std::string& path, std::span<const TensorWrite> tensors,
                       const std::map<std::string, std::string>& metadata) {
  // Streamed: a large model is not copied into one buffer first.
  const std::string header = encode_header(tensors, metadata);
  uint8_t len[8];
  put_u64(len, header.size());
  AtomicFileWriter w(path);
  w.write(len, 8);
  w.write(header.data(), header.size());
  for (const auto& t : tensors) for_each_part(t, [&](std::span<const uint8_t> b) { w.write(b); });
  w.commit();
}

namespace {

// A read-only private mapping of a whole file, unmapped when the last SafetensorsFile copy
// that serves bytes from it goes away.
struct Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr != nullptr) ::munmap(addr, size);
  }
};

}  // namespace

SafetensorsFile SafetensorsFile::read(const std::string& path) {
  const Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!f) throw FileError(path, fmt::format("cannot open: {}", std::strerror(errno)));
  struct stat st {};
  if (::fstat(f.get(), &st) != 0) throw FileError(path, fmt::format("fstat failed: {}", std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) throw FileError(path, "not a regular file");
  auto m = std::make_shared<Mapping>();
  m->size = static_cast<size_t>(st.st_size);
  if (m->size > 0) {
    void* p = ::mmap(nullptr, m->size, PROT_READ, MAP_PRIVATE, f.get(), 0);
    if (p == MAP_FAILED) throw FileError(path, fmt::format("mmap failed: {}", std::strerror(errno)));
    m->addr = p;
  }
  const std::span<const uint8_t> bytes(static_cast<const uint8_t*>(m->addr), m->size);
  return parse_storage(std::move(m), bytes, path);
}

SafetensorsFile SafetensorsFile::parse(std::vector<uint8_t> bytes, const std::string& source) {
  auto owner = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  const std::span<const uint8_t> view(owner->data(), owner->size());
  return parse_storage(std::move(owner), view, source);
}

SafetensorsFile SafetensorsFile::parse_storage(std::shared_ptr<const void> owner, std::span<const uint8_t> bytes,
                                               const std::string& source) {
  SafetensorsFile s;
  s.path_ = source;
  s.owner_ = std::move(owner);
  s.file_ = bytes;
  auto bad = [&](const std::string& problem) { return FileError(source, problem); };
  const uint64_t size = s.file_.size();
  if (size < 8) throw bad(fmt::format("file is {} bytes, too short for the 8-byte header length", size));
  uint64_t n;
  std::memcpy(&n, s.file_.data(), 8);
  if (n > size - 8)
    throw bad(fmt::format("header length {} exceeds the {} bytes after the length field (truncated?)", n, size - 8));
  if (n > kMaxHeader) throw bad(fmt::format("header length {} exceeds the {}-byte limit", n, kMaxHeader));
  if (n < 2 || s.file_[8] != '{') throw bad("header is not a JSON object (does not start with '{')");
  s.data_start_ = 8 + n;
  const uint64_t data_size = size - s.data_start_;

  // Duplicate keys would silently shadow each other in nlohmann::json: refused below.
  std::string duplicate;
  json h;
  const char* first = reinterpret_cast<const char*>(s.file_.data() + 8);
  try {
    h = parse_json_rejecting_duplicates(std::string_view(first, n), &duplicate);
  } catch (const json::exception& e) {
    throw bad(fmt::format("header is not valid JSON: {}", e.what()));
  }
  if (!duplicate.empty()) throw bad(fmt::format("header has a duplicate key '{}'", duplicate));
  if (!h.is_object()) throw bad("header is not a JSON object");

  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) throw bad("__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) throw bad(fmt::format("__metadata__ value of '{}' is not a string", m.key()));
        s.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto where = [&](const std::string& problem) { return bad(fmt::format("tensor '{}': {}", name, problem)); };
    if (!v.is_object()) throw where("entry is not an object");
    for (auto k = v.begin(); k != v.end(); ++k)
      if (k.key() != "dtype" && k.key() != "shape" && k.key() != "data_offsets")
        throw where(fmt::format("unexpected key '{}'", k.key()));
    TensorInfo t;
    t.name = name;
    if (!v.contains("dtype") || !v["dtype"].is_string()) throw where("missing or non-string dtype");
    const auto dt = v["dtype"].get<std::string>();
    if (!parse_dtype(dt, &t.dtype)) throw where(fmt::format("unknown dtype '{}'", dt));
    if (!v.contains("shape") || !v["shape"].is_array()) throw where("missing or non-array shape");
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) throw where(fmt::format("shape entry {} is not a non-negative integer", d.dump()));
      const uint64_t x = d.get<uint64_t>();
      if (x > static_cast<uint64_t>(INT64_MAX)) throw where(fmt::format("shape entry {} is too large", x));
      t.shape.push_back(static_cast<int64_t>(x));
    }
    const json& o = v.contains("data_offsets") ? v["data_offsets"] : json();
    if (!o.is_array() || o.size() != 2 || !o[0].is_number_unsigned() || !o[1].is_number_unsigned())
      throw where("data_offsets is not a pair of non-negative integers");
    t.begin = o[0].get<uint64_t>();
    t.end = o[1].get<uint64_t>();
    if (t.begin > t.end) throw where(fmt::format("data_offsets [{}, {}] run backwards", t.begin, t.end));
    if (t.end > data_size)
      throw where(
          fmt::format("data_offsets [{}, {}] run past the {} data bytes (truncated?)", t.begin, t.end, data_size));
    uint64_t want = 0;
    if (!byte_size(t.shape, dtype_size(t.dtype), &want))
      throw where(fmt::format("shape {} overflows", shape_string(t.shape)));
    if (want != t.end - t.begin)
      throw where(fmt::format("shape {} of {} needs {} bytes but data_offsets [{}, {}] span {}", shape_string(t.shape),
                              dt, want, t.begin, t.end, t.end - t.begin));
    s.tensors_.push_back(std::move(t));
  }

  // The data region must be covered exactly once, in offset order.
  std::stable_sort(s.tensors_.begin(), s.tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  const TensorInfo* prev = nullptr;
  for (const auto& t : s.tensors_) {
    if (t.begin < at)
      throw bad(fmt::format("tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", prev->name, prev->begin, prev->end,
                            t.name, t.begin, t.end));
    if (t.begin > at)
      throw bad(fmt::format("{} unreferenced bytes before tensor '{}' at offset {}", t.begin - at, t.name, at));
    at = t.end;
    prev = &t;
  }
  if (at != data_size) throw bad(fmt::format("{} trailing bytes after the last tensor", data_size - at));
  for (size_t i = 0; i < s.tensors_.size(); ++i) s.index_[s.tensors_[i].name] = i;
  s.verify_checksums();
  return s;
}

void SafetensorsFile::verify_checksums() {
  const auto it = metadata_.find(kTensorChecksumKey);
  if (it == metadata_.end()) return;
  const std::string list = it->second;
  metadata_.erase(it);
  auto bad = [&](const std::string& problem) { return FileError(path_, problem); };
  std::vector<std::string_view> sums;
  for (size_t b = 0; b <= list.size() && !list.empty();) {
    const size_t e = std::min(list.find(',', b), list.size());
    sums.emplace_back(list.data() + b, e - b);
    b = e + 1;
  }
  if (sums.size() != tensors_.size())
    throw bad(fmt::format("__metadata__ '{}' lists {} checksums for {} tensors", kTensorChecksumKey, sums.size(),
                          tensors_.size()));
  // Tensors of equal offsets (empty ones) sort by name, not write order; their sums agree.
  for (size_t i = 0; i < sums.size(); ++i) {
    const TensorInfo& t = tensors_[i];
    const auto want = sums[i];
    if (want.size() != 16 || want.find_first_not_of("0123456789abcdef") != std::string_view::npos)
      throw bad(fmt::format("__metadata__ '{}': checksum {} ('{}') is not 16 lowercase hex digits", kTensorChecksumKey,
                            i, want));
    const std::string got = hex64(hash64(file_.data() + data_start_ + t.begin, size_t(t.end - t.begin)));
    if (got != want)
      throw bad(
          fmt::format("tensor '{}' (data bytes [{}, {})) fails its checksum: stored {}, computed {}; the "
                      "file is corrupt",
                      t.name, t.begin, t.end, want, got));
  }
  checksummed_ = true;
}

const std::string& SafetensorsFile::meta(const std::string& key) const {
  auto it = metadata_.find(key);
  if (it == metadata_.end()) throw FileError(path_, fmt::format("__metadata__ has no '{}'", key));
  return it->second;
}

namespace {

// "an integer in [0, 10]", "an integer >= 0", "a number <= 5": the expectation in an error.
template <class T>
std::string expected_range(const char* what, T lo, T hi) {
  const bool has_lo = lo != std::numeric_limits<T>::lowest(), has_hi = hi != std::numeric_limits<T>::max();
  if (has_lo && has_hi) return fmt::format("{} in [{}, {}]", what, lo, hi);
  if (has_lo) return fmt::format("{} >= {}", what, lo);
  if (has_hi) return fmt::format("{} <= {}", what, hi);
  return what;
}

// The whole of `text` as one T, or nullopt (empty, sign where T has none, junk, overflow).
// std::from_chars: no leading spaces or '+', locale-independent, no "0x".
template <class T>
std::optional<T> parse_whole(const std::string& text) {
  T v{};
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end) return std::nullopt;
  if constexpr (std::is_floating_point_v<T>)
    if (!std::isfinite(v)) return std::nullopt;
  return v;
}

template <class T>
T meta_number(const SafetensorsFile& f, const std::string& key, T lo, T hi, const char* what) {
  const std::string& text = f.meta(key);
  const auto v = parse_whole<T>(text);
  if (!v || *v < lo || *v > hi)
    throw FileError(f.path(),
                    fmt::format("__metadata__ '{}': got '{}', expected {}", key, text, expected_range(what, lo, hi)));
  return *v;
}

}  // namespace

int64_t SafetensorsFile::meta_int(const std::string& key, int64_t lo, int64_t hi) const {
  return meta_number<int64_t>(*this, key, lo, hi, "an integer");
}

uint64_t SafetensorsFile::meta_uint(const std::string& key, uint64_t lo, uint64_t hi) const {
  return meta_number<uint64_t>(*this, key, lo, hi, "a non-negative integer");
}

double SafetensorsFile::meta_double(const std::string& key, double lo, double hi) const {
  return meta_number<double>(*this, key, lo, hi, "a finite number");
}

bool SafetensorsFile::has(const std::string& name) const { return index_.count(name) != 0; }

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw FileError(path_, fmt::format("no tensor '{}'", name));
  return tensors_[it->second];
}

std::span<const uint8_t> SafetensorsFile::bytes(const std::string& name) const {
  const auto& t = info(name);
  return {file_.data() + data_start_ + t.begin, static_cast<size_t>(t.end - t.begin)};
}

void SafetensorsFile::check(const std::string& name, Dtype dtype, std::span<const int64_t> shape) const {
  const auto& t = info(name);
  if (t.dtype != dtype)
    throw FileError(path_, fmt::format("tensor '{}' is {}, expected {}", name, dtype_name(t.dtype), dtype_name(dtype)));
  if (!std::equal(shape.begin(), shape.end(), t.shape.begin(), t.shape.end()))
    throw FileError(
        path_, fmt::format("tensor '{}' has shape {}, expected {}", name, shape_string(t.shape), shape_string(shape)));
}

namespace {
template <class T>
std::vector<T> copy_as(const SafetensorsFile& f, const std::string& name, Dtype dtype) {
  const auto& t = f.info(name);
  f.check(name, dtype, t.shape);
  const auto b = f.bytes(name);
  std::vector<T> out(b.size() / sizeof(T));
  if (!b.empty()) std::memcpy(out.data(), b.data(), b.size());  // memcpy: data may be unaligned
  return out;
}
}  // namespace

std::vector<float> SafetensorsFile::f32(const std::string& name) const {
  return copy_as<float>(*this, name, Dtype::F32);
}
std::vector<int64_t> SafetensorsFile::i64(const std::string& name) const {
  return copy_as<int64_t>(*this, name, Dtype::I64);
}
std::vector<uint8_t> SafetensorsFile::u8(const std::string& name) const {
  return copy_as<uint8_t>(*this, name, Dtype::U8);
}

void SafetensorsFile::copy_f32(const std::string& name, std::span<const int64_t> shape, std::span<float> out) const {
  check(name, Dtype::F32, shape);
  const auto b = bytes(name);
  GEOLOCO_CHECK(out.size_bytes() == b.size(), "destination for '{}' holds {} floats, the tensor has {}", name,
                out.size(), b.size() / 4);
  if (!b.empty()) std::memcpy(out.data(), b.data(), b.size());
}

}  // namespace geoloco
