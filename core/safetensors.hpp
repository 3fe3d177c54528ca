// safetensors: the Hugging Face tensor file format, written and read without the Python
// package. Layout:
//
//   [8 bytes]  N, little-endian uint64: header length
//   [N bytes]  JSON: {"__metadata__": {str: str}, "<name>": {"dtype": "F32",
//              "shape": [d0, d1, ...], "data_offsets": [begin, end]}, ...}
//              (we pad with spaces so the data starts 8-byte aligned, as the reference does)
//   [rest]     tensor bytes, little-endian, row-major; offsets are relative to this region
//
// The writer emits metadata first, then tensors in the given order, packed back to back;
// same inputs -> same bytes. Writes are atomic (AtomicFileWriter).
//
// Content checksums: the writer adds `__metadata__["geoloco.tensor_xxh3_64"]`, the XXH3-64
// of every tensor's bytes as 16 hex digits, comma-separated, in data order. Other readers
// (Hugging Face, PyTorch) ignore it; ours verifies every tensor when the key is present (a
// flipped bit in the data is a FileError naming the tensor and its byte range) and accepts
// files without it (e.g. written by Python). The key never appears in metadata().
//
// The reader trusts nothing: the header length against the file size and a 100 MB cap,
// JSON syntax and types, duplicate keys, known dtypes, shape product * dtype size against
// the offsets span (with overflow checks), offsets inside the data, and the data region
// covered exactly once (no overlap, no hole, no trailing bytes) -- as the reference
// implementation requires. Every violation is a FileError naming the file and the problem.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace geoloco {

// The __metadata__ key holding the per-tensor content checksums (see above).
inline constexpr const char* kTensorChecksumKey = "geoloco.tensor_xxh3_64";

enum class Dtype : uint8_t { BOOL, U8, I8, F8_E4M3, F8_E5M2, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64 };

const char* dtype_name(Dtype d);  // "F32", ...
size_t dtype_size(Dtype d);       // bytes per element
bool parse_dtype(const std::string& name, Dtype* out);

// A tensor to write: `bytes` must hold exactly numel(shape) * dtype_size(dtype) bytes; or,
// when `parts` is not empty, the parts in order do (a tensor laid out across several buffers
// written without gathering it first: the outer loop's fragments).
struct TensorWrite {
  std::string name;
  Dtype dtype = Dtype::F32;
  std::vector<int64_t> shape;
  std::span<const uint8_t> bytes;
  std::vector<std::span<const uint8_t>> parts;
  size_t size() const;
};

// Helpers that view typed data as a TensorWrite (the span must outlive the write call).
TensorWrite f32_tensor(std::string name, std::vector<int64_t> shape, std::span<const float> data);
TensorWrite i64_tensor(std::string name, std::vector<int64_t> shape, std::span<const int64_t> data);
TensorWrite u8_tensor(std::string name, std::vector<int64_t> shape, std::span<const uint8_t> data);
// A 1-D f32 tensor of `parts` in order.
TensorWrite f32_parts_tensor(std::string name, const std::vector<std::span<const float>>& parts);

// Serializes to memory (used by write_safetensors; exposed for byte-level tests).
std::vector<uint8_t> encode_safetensors(std::span<const TensorWrite> tensors,
                                        const std::map<std::string, std::string>& metadata);
// Atomic write. Throws geoloco::Error on a caller bug (duplicate/empty name, byte count not
// matching the shape, "__metadata__" as a name) or an I/O failure.
void write_safetensors(const std::string& path, std::span<const TensorWrite> tensors,
                       const std::map<std::string, std::string>& metadata);

struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data region
  uint64_t numel() const;
};

// "[768, 2304]"
std::string shape_string(std::span<const int64_t> shape);

class SafetensorsFile {
 public:
  // Maps (read-only mmap) and validates the whole file, verifying the content checksums when
  // present (every data byte is read once, at XXH3's ~10+ GB/s). FileError on any problem. Tensor
  // bytes are served from the mapping, so opening a large checkpoint costs page cache, not a
  // heap copy. The file must not be truncated by someone else while this object lives.
  static SafetensorsFile read(const std::string& path);
  // Same, from bytes already in memory (`source` names them in errors).
  static SafetensorsFile parse(std::vector<uint8_t> bytes, const std::string& source);

  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Metadata value; FileError naming the key when absent.
  const std::string& meta(const std::string& key) const;
  // Typed metadata values (safetensors metadata is string -> string). The whole value must
  // be one decimal number (no sign for unsigned, no spaces, no trailing characters; doubles
  // finite) in [lo, hi]; otherwise FileError naming the file, the key, the value and what
  // was expected. Absent is the same FileError as meta().
  int64_t meta_int(const std::string& key, int64_t lo = std::numeric_limits<int64_t>::min(),
                   int64_t hi = std::numeric_limits<int64_t>::max()) const;
  uint64_t meta_uint(const std::string& key, uint64_t lo = 0, uint64_t hi = std::numeric_limits<uint64_t>::max()) const;
  double meta_double(const std::string& key, double lo = std::numeric_limits<double>::lowest(),
                     double hi = std::numeric_limits<double>::max()) const;
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in data order
  // True when the file carried content checksums (all verified when it was opened).
  bool checksummed() const { return checksummed_; }
  bool has(const std::string& name) const;
  // FileError "no tensor '<name>'" when absent.
  const TensorInfo& info(const std::string& name) const;
  std::span<const uint8_t> bytes(const std::string& name) const;

  // Typed copies. FileError naming the tensor when the dtype differs, or when `shape` is
  // given and differs (message: expected vs found shape).
  std::vector<float> f32(const std::string& name) const;
  std::vector<int64_t> i64(const std::string& name) const;
  std::vector<uint8_t> u8(const std::string& name) const;
  void copy_f32(const std::string& name, std::span<const int64_t> shape, std::span<float> out) const;
  void check(const std::string& name, Dtype dtype, std::span<const int64_t> shape) const;

 private:
  static SafetensorsFile parse_storage(std::shared_ptr<const void> owner, std::span<const uint8_t> bytes,
                                       const std::string& source);
  // Checks and removes the checksum key from metadata_ (FileError on a mismatch).
  void verify_checksums();

  std::string path_;
  std::shared_ptr<const void> owner_;  // keeps file_ alive: a mapping or a byte vector
  std::span<const uint8_t> file_;
  uint64_t data_start_ = 0;
  bool checksummed_ = false;
  std::map<std::string, std::string> metadata_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
};

inline SafetensorsFile read_safetensors(const std::string& path) { return SafetensorsFile::read(path); }

}  // namespace geoloco
