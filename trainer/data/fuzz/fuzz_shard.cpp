// libFuzzer harness: any byte string given to the llm.c shard validator either validates
// (and then every token is < vocab) or raises FileError -- never a crash or another error.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/error.hpp"
#include "trainer/data/shard_source.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace geoloco::trainer;
  // Help the fuzzer past the magic/version check half the time.
  std::vector<uint8_t> bytes(data, data + size);
  if (size >= 12 && (data[0] & 1)) {
    const int32_t h[2] = {kShardMagic, kShardVersion};
    std::memcpy(bytes.data(), h, 8);
  }
  try {
    const uint64_t n = validate_shard(bytes, "fuzz", 1000);
    if (kShardHeaderBytes + 2 * n != bytes.size()) __builtin_trap();
  } catch (const geoloco::FileError&) {}
  return 0;
}
