// libFuzzer harness: any byte string given to the safetensors reader is either rejected with
// FileError or yields tensors whose bytes lie inside the input and match their shapes.
#include <cstddef>
#include <cstdint>

#include "core/safetensors.hpp"
#include "core/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace geoloco::trainer;
  try {
    auto f = SafetensorsFile::parse(std::vector<uint8_t>(data, data + size), "fuzz");
    for (const auto& t : f.tensors()) {
      const auto b = f.bytes(t.name);
      if (b.size() != t.numel() * dtype_size(t.dtype)) __builtin_trap();
      volatile uint8_t sink = 0;
      for (uint8_t x : b) sink = sink ^ x;  // ASan checks every byte is readable
      (void)sink;
    }
    for (const auto& [k, v] : f.metadata()) (void)f.meta(k);
  } catch (const geoloco::FileError&) {}
  return 0;
}
