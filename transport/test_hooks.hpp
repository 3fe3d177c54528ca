// Test-only hooks of a transport (either backend): a protocol version to announce, and a
// tamper function that sees every outgoing chunk (decoded header + payload) and returns the
// frames to send instead -- header bytes (any size) + payload bytes. Returning {} drops the
// chunk, two entries replay it. Product code never sets them.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "transport/frame.hpp"

namespace geoloco::transport {

struct TamperedFrame {
  std::vector<uint8_t> header;
  std::vector<uint8_t> payload;
};

struct TestHooks {
  uint16_t protocol_version = 0;  // 0 = the real one
  std::function<std::vector<TamperedFrame>(const FrameHeader&, std::span<const uint8_t>)> tamper;
};

}  // namespace geoloco::transport
