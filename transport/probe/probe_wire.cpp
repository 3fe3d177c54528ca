#include "transport/probe/probe_wire.hpp"

#include <fmt/format.h>

#include <bit>
#include <cmath>

#include "transport/wire.hpp"

namespace geoloco::probe {

using transport::wire::Reader;
using transport::wire::Writer;

const char* to_string(MsgType t) {
  switch (t) {
    case MsgType::kPingPhase: return "ping-phase";
    case MsgType::kPing: return "ping";
    case MsgType::kPong: return "pong";
    case MsgType::kStream: return "stream";
    case MsgType::kData: return "data";
    case MsgType::kReport: return "report";
    case MsgType::kResult: return "result";
    case MsgType::kResultAck: return "result-ack";
    case MsgType::kShare: return "share";
  }
  return "?";
}

uint64_t round_of(uint32_t session, uint32_t command, uint64_t seq) {
  return (static_cast<uint64_t>(session & kMaxSession) << 40) | (static_cast<uint64_t>(command & kMaxCommands) << 24) |
         (seq & kMaxSeq);
}

namespace {

void put_header(Writer& w, const Header& h) {
  w.u32(kProbeMagic);
  w.u16(kProbeVersion);
  w.u16(static_cast<uint16_t>(h.type));
  w.u32(h.session);
  w.u32(h.flags);
  w.u64(h.seq);
}

void put_f64(Writer& w, double v) { w.u64(std::bit_cast<uint64_t>(v)); }
bool get_f64(Reader& r, double& v) {
  uint64_t x = 0;
  if (!r.u64(x)) return false;
  v = std::bit_cast<double>(x);
  return true;
}

bool valid_type(uint16_t t) { return t >= 1 && t <= static_cast<uint16_t>(MsgType::kShare); }

// Shared tail check: nothing may follow the fields.
template <class T>
std::optional<T> finish(const Reader& r, T v, const char* what, std::string& error) {
  if (r.left() != 0) {
    error = fmt::format("{}: {} trailing bytes", what, r.left());
    return std::nullopt;
  }
  return v;
}

std::optional<double> checked_seconds(Reader& r, const char* field, double max, std::string& error) {
  double v = 0;
  if (!get_f64(r, v)) {
    error = fmt::format("{}: truncated", field);
    return std::nullopt;
  }
  if (!std::isfinite(v) || v < 0 || v > max) {
    error = fmt::format("{}: {} is outside [0, {}]", field, v, max);
    return std::nullopt;
  }
  return v;
}

}  // namespace

void encode_header(const Header& h, std::span<uint8_t> out) {
  Writer w;
  put_header(w, h);
  auto& b = w.buffer();
  std::copy(b.begin(), b.end(), out.begin());
}

std::optional<Header> decode_header(std::span<const uint8_t> in, std::string& error) {
  Reader r(in);
  uint32_t magic = 0;
  uint16_t version = 0, type = 0;
  Header h;
  if (in.size() < kHeaderBytes) {
    error = fmt::format("size: {} bytes, shorter than the {}-byte probe header", in.size(), kHeaderBytes);
    return std::nullopt;
  }
  r.u32(magic);
  r.u16(version);
  r.u16(type);
  r.u32(h.session);
  r.u32(h.flags);
  r.u64(h.seq);
  if (magic != kProbeMagic) {
    error = fmt::format("magic: 0x{:08x}, expected 0x{:08x} ('GLPB')", magic, kProbeMagic);
    return std::nullopt;
  }
  if (version != kProbeVersion) {
    error = fmt::format("version: {}, this build speaks probe protocol {}", version, kProbeVersion);
    return std::nullopt;
  }
  if (!valid_type(type)) {
    error = fmt::format("type: unknown message type {}", type);
    return std::nullopt;
  }
  if ((h.flags & ~kFlagStop) != 0) {
    error = fmt::format("flags: unknown bits 0x{:x}", h.flags);
    return std::nullopt;
  }
  h.type = static_cast<MsgType>(type);
  return h;
}

std::vector<uint8_t> encode_ping_phase(const Header& h, const PingPhase& p) {
  Writer w;
  put_header(w, h);
  w.u32(p.count);
  w.u32(p.warmup);
  w.u32(p.bytes);
  return w.take();
}

std::optional<PingPhase> decode_ping_phase(std::span<const uint8_t> body, std::string& error) {
  Reader r(body);
  PingPhase p;
  if (!r.u32(p.count) || !r.u32(p.warmup) || !r.u32(p.bytes)) {
    error = "ping-phase: truncated";
    return std::nullopt;
  }
  if (p.count < 1 || p.count > kMaxPings || p.warmup > kMaxPings) {
    error = fmt::format("ping-phase: count {} / warmup {} outside [1, {}] / [0, {}]", p.count, p.warmup, kMaxPings,
                        kMaxPings);
    return std::nullopt;
  }
  if (p.bytes < kHeaderBytes || p.bytes > kMaxPingBytes) {
    error = fmt::format("ping-phase: bytes {} outside [{}, {}]", p.bytes, kHeaderBytes, kMaxPingBytes);
    return std::nullopt;
  }
  return finish(r, p, "ping-phase", error);
}

std::vector<uint8_t> encode_stream_phase(const Header& h, const StreamPhase& s) {
  Writer w;
  put_header(w, h);
  w.u32(s.phase);
  w.u32(static_cast<uint32_t>(s.lane));
  w.u64(s.message_bytes);
  w.u32(s.window);
  put_f64(w, s.omit_s);
  return w.take();
}

std::optional<StreamPhase> decode_stream_phase(std::span<const uint8_t> body, std::string& error) {
  Reader r(body);
  StreamPhase s;
  uint32_t lane = 0;
  if (!r.u32(s.phase) || !r.u32(lane) || !r.u64(s.message_bytes) || !r.u32(s.window)) {
    error = "stream: truncated";
    return std::nullopt;
  }
  s.lane = static_cast<int32_t>(lane);
  auto omit = checked_seconds(r, "stream: omit_s", 3600, error);
  if (!omit) return std::nullopt;
  s.omit_s = *omit;
  if (s.phase >= kMaxPhases) {
    error = fmt::format("stream: phase {} >= {}", s.phase, kMaxPhases);
    return std::nullopt;
  }
  if (s.lane < -1) {
    error = fmt::format("stream: lane {}", s.lane);
    return std::nullopt;
  }
  if (s.message_bytes < kMinMessageBytes || s.message_bytes > kMaxMessageBytes) {
    error =
        fmt::format("stream: message_bytes {} outside [{}, {}]", s.message_bytes, kMinMessageBytes, kMaxMessageBytes);
    return std::nullopt;
  }
  if (s.window < 1 || s.window > kMaxWindow) {
    error = fmt::format("stream: window {} outside [1, {}]", s.window, kMaxWindow);
    return std::nullopt;
  }
  return finish(r, s, "stream", error);
}

std::vector<uint8_t> encode_report(const Header& h, const StreamReport& x) {
  Writer w;
  put_header(w, h);
  w.u32(x.phase);
  w.u64(x.messages);
  w.u64(x.bytes);
  w.u64(x.counted_bytes);
  put_f64(w, x.counted_s);
  put_f64(w, x.first_to_last_s);
  put_f64(w, x.omitted_s);
  w.u8(x.coarse ? 1 : 0);
  return w.take();
}

std::optional<StreamReport> decode_report(std::span<const uint8_t> body, std::string& error) {
  Reader r(body);
  StreamReport x;
  if (!r.u32(x.phase) || !r.u64(x.messages) || !r.u64(x.bytes) || !r.u64(x.counted_bytes)) {
    error = "report: truncated";
    return std::nullopt;
  }
  constexpr double kMaxS = 1e7;
  auto a = checked_seconds(r, "report: counted_s", kMaxS, error);
  if (!a) return std::nullopt;
  auto b = checked_seconds(r, "report: first_to_last_s", kMaxS, error);
  if (!b) return std::nullopt;
  auto c = checked_seconds(r, "report: omitted_s", kMaxS, error);
  if (!c) return std::nullopt;
  x.counted_s = *a;
  x.first_to_last_s = *b;
  x.omitted_s = *c;
  uint8_t coarse = 0;
  if (!r.u8(coarse) || coarse > 1) {
    error = "report: coarse flag truncated or not 0/1";
    return std::nullopt;
  }
  x.coarse = coarse == 1;
  if (x.counted_bytes > x.bytes || x.messages > kMaxSeq + 1) {
    error = fmt::format("report: counted_bytes {} > bytes {} or messages {} > {}", x.counted_bytes, x.bytes, x.messages,
                        kMaxSeq + 1);
    return std::nullopt;
  }
  return finish(r, x, "report", error);
}

}  // namespace geoloco::probe
