// The messages of the probe protocol. Each one is the payload of one transport frame of kind
// FrameKind::kProbe and starts with this 24-byte, little-endian header:
//
//   off size field
//     0    4 magic     'GLPB' (0x42504C47)
//     4    2 version   kProbeVersion
//     6    2 type      MsgType
//     8    4 session   the probe_peer call it belongs to (both sides pass the same)
//    12    4 flags     kFlagStop on the tail of a stream, else 0
//    16    8 seq       command index, ping number or data message number
//
// then the type's fields (below), bounds-checked on decode; DATA and PING/PONG messages are
// padded to their announced size with a byte pattern that is not interpreted.
//
// Transport key of a message: kind kProbe, shard = type, round = round_of(session, command, seq)
// (session in bits 40..63, command index in bits 24..39, seq in bits 0..23), so every message
// of every probe on one Transport has its own key (the transport refuses replayed keys).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace geoloco::probe {

inline constexpr uint32_t kProbeMagic = 0x42504C47;  // "GLPB" little-endian
inline constexpr uint16_t kProbeVersion = 1;
inline constexpr size_t kHeaderBytes = 24;
inline constexpr uint32_t kFlagStop = 1;

// Limits both sides enforce (a plan outside them is refused before anything is allocated).
inline constexpr uint32_t kMaxSession = (1u << 24) - 1;
inline constexpr uint32_t kMaxCommands = (1u << 16) - 1;
inline constexpr uint64_t kMaxSeq = (1ull << 24) - 1;
inline constexpr size_t kMaxControlBytes = 64 * 1024;  // commands, reports, results
inline constexpr uint32_t kMaxPingBytes = 1 << 20;
inline constexpr uint32_t kMaxPings = 100000;
inline constexpr uint64_t kMinMessageBytes = 4096;
inline constexpr uint64_t kMaxMessageBytes = 256ull << 20;
inline constexpr uint32_t kMaxWindow = 64;
inline constexpr size_t kMaxPhases = 8;

enum class MsgType : uint16_t {
  kPingPhase = 1,  // initiator -> responder: {count, warmup, bytes}
  kPing = 2,       // initiator -> responder, padded to `bytes`
  kPong = 3,       // responder -> initiator: the ping echoed (type changed)
  kStream = 4,     // initiator -> responder: {phase, lane, message_bytes, window, omit_s}
  kData = 5,       // initiator -> responder, padded to message_bytes (header only with kFlagStop)
  kReport = 6,     // responder -> initiator: what arrived in a stream (StreamReport)
  kResult = 7,     // initiator -> responder: the whole ProbeResult (both sides return it)
  kResultAck = 8,  // responder -> initiator
  kShare = 9,      // config mode: every site sends the pair results it holds to every other
};
const char* to_string(MsgType t);

struct Header {
  MsgType type = MsgType::kPing;
  uint32_t session = 0;
  uint32_t flags = 0;
  uint64_t seq = 0;
};

uint64_t round_of(uint32_t session, uint32_t command, uint64_t seq);

// Writes the header into out[0..kHeaderBytes).
void encode_header(const Header& h, std::span<uint8_t> out);
// Decodes and checks magic and version; the error names the field ("magic: ...").
std::optional<Header> decode_header(std::span<const uint8_t> in, std::string& error);

struct PingPhase {
  uint32_t count = 0;
  uint32_t warmup = 0;
  uint32_t bytes = 0;  // whole message, >= kHeaderBytes
};

struct StreamPhase {
  uint32_t phase = 0;
  int32_t lane = -1;  // -1: all lanes, else this lane only
  uint64_t message_bytes = 0;
  uint32_t window = 0;
  double omit_s = 0;
};

// Measured at the receiver of a stream.
struct StreamReport {
  uint32_t phase = 0;
  uint64_t messages = 0;       // full data messages received
  uint64_t bytes = 0;          // their payload bytes
  uint64_t counted_bytes = 0;  // bytes that arrived after the omitted start
  double counted_s = 0;        // the time over which they arrived
  double first_to_last_s = 0;  // first to last message, nothing omitted
  double omitted_s = 0;        // what was actually omitted
  bool coarse = false;         // fewer than 3 x window messages: first to last completion
};

// Every encode returns a complete message (header + fields); every decode checks type,
// lengths and ranges and returns nullopt with `error` set ("field: problem").
std::vector<uint8_t> encode_ping_phase(const Header& h, const PingPhase& p);
std::optional<PingPhase> decode_ping_phase(std::span<const uint8_t> body, std::string& error);
std::vector<uint8_t> encode_stream_phase(const Header& h, const StreamPhase& s);
std::optional<StreamPhase> decode_stream_phase(std::span<const uint8_t> body, std::string& error);
std::vector<uint8_t> encode_report(const Header& h, const StreamReport& r);
std::optional<StreamReport> decode_report(std::span<const uint8_t> body, std::string& error);

// `body` = the message after its header.
inline std::span<const uint8_t> body_of(std::span<const uint8_t> msg) {
  return msg.size() < kHeaderBytes ? std::span<const uint8_t>() : msg.subspan(kHeaderBytes);
}

}  // namespace geoloco::probe
