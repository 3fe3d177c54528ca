// The outer loop's checked envelope around frames and control messages (envelope.hpp).
#include "outer_optimizer/envelope.hpp"

#include <fmt/format.h>

#include <cstring>

#include "core/error.hpp"

namespace geoloco::outer {

namespace {
template <class T>
void put(std::vector<uint8_t>& out, size_t off, T v) {
  std::memcpy(out.data() + off, &v, sizeof v);  // little-endian hosts only (x86-64, aarch64)
}
template <class T>
T get(std::span<const uint8_t> in, size_t off) {
  T v;
  std::memcpy(&v, in.data() + off, sizeof v);
  return v;
}
}  // namespace

namespace {

// The 48-byte header of `e` with a body of `body` bytes into out[0, kEnvelopeBytes).
void put_header(const Envelope& e, uint64_t body, std::vector<uint8_t>& out) {
  GEOLOCO_CHECK(e.attachment.size() <= kMaxAttachment, "an envelope attachment of {} bytes (at most {})",
                e.attachment.size(), kMaxAttachment);
  GEOLOCO_CHECK(e.step_us == 0 || e.kind == EnvelopeKind::kPseudoGradient, "a step time on a kind {} envelope",
                static_cast<int>(e.kind));
  std::memcpy(out.data(), kEnvelopeMagic, 4);
  put<uint16_t>(out, 4, kEnvelopeVersion);
  put<uint16_t>(out, 6, static_cast<uint16_t>(e.kind));
  put<uint64_t>(out, 8, e.round);
  put<uint32_t>(out, 16, e.site);
  put<uint32_t>(out, 20, e.rank);
  put<uint64_t>(out, 24, e.value);
  put<uint64_t>(out, 32, body);
  put<uint32_t>(out, 40, static_cast<uint32_t>(e.attachment.size()));
  put<uint32_t>(out, 44, e.step_us);
}

}  // namespace

void write_envelope(const Envelope& e, std::vector<uint8_t>& out) {
  out.resize(kEnvelopeBytes + e.body.size() + e.attachment.size());
  put_header(e, e.body.size(), out);
  if (!e.body.empty()) std::memcpy(out.data() + kEnvelopeBytes, e.body.data(), e.body.size());
  if (!e.attachment.empty())
    std::memcpy(out.data() + kEnvelopeBytes + e.body.size(), e.attachment.data(), e.attachment.size());
}

void seal_envelope(const Envelope& e, std::vector<uint8_t>& buf) {
  GEOLOCO_CHECK(buf.size() >= kEnvelopeBytes, "an envelope buffer of {} bytes, no room for its {}-byte header",
                buf.size(), kEnvelopeBytes);
  const uint64_t body = buf.size() - kEnvelopeBytes;
  put_header(e, body, buf);
  buf.insert(buf.end(), e.attachment.begin(), e.attachment.end());
}

Envelope read_envelope(std::span<const uint8_t> in, EnvelopeKind kind, uint64_t round, uint32_t site, uint32_t rank,
                       uint64_t max_body, const std::string& who) {
  auto fail = [&](const std::string& what) -> Envelope {
    throw EnvelopeError(fmt::format("outer round {}: message from {} rejected: {}", round, who, what));
  };
  if (in.size() >= 6 && std::memcmp(in.data(), kEnvelopeMagic, 4) == 0 &&
      (get<uint16_t>(in, 4) < kEnvelopeOldestVersion || get<uint16_t>(in, 4) > kEnvelopeVersion))
    return fail(fmt::format("version {} (expected {}: every site must run the same geoloco)", get<uint16_t>(in, 4),
                            kEnvelopeVersion));
  if (in.size() < kEnvelopeBytes)
    return fail(fmt::format("{} bytes, shorter than the {}-byte envelope", in.size(), kEnvelopeBytes));
  if (std::memcmp(in.data(), kEnvelopeMagic, 4) != 0) return fail("bad magic");
  if (auto k = get<uint16_t>(in, 6); k != static_cast<uint16_t>(kind))
    return fail(fmt::format("kind {} (expected {})", k, static_cast<uint16_t>(kind)));
  Envelope e;
  e.kind = kind;
  e.round = get<uint64_t>(in, 8);
  e.site = get<uint32_t>(in, 16);
  e.rank = get<uint32_t>(in, 20);
  e.value = get<uint64_t>(in, 24);
  const uint64_t body = get<uint64_t>(in, 32);
  const uint64_t attachment = get<uint32_t>(in, 40);
  if (e.round != round) return fail(fmt::format("round {} (expected {}: replayed or out of order)", e.round, round));
  if (e.site != site || e.rank != rank)
    return fail(fmt::format("claims site {} rank {} (expected site {} rank {})", e.site, e.rank, site, rank));
  const uint16_t version = get<uint16_t>(in, 4);
  if (version >= 3 && kind == EnvelopeKind::kPseudoGradient)
    e.step_us = get<uint32_t>(in, 44);
  else if (get<uint32_t>(in, 44) != 0)
    return fail("reserved field not zero");
  if (body > max_body) return fail(fmt::format("body of {} bytes exceeds the {} this round allows", body, max_body));
  if (attachment > kMaxAttachment)
    return fail(fmt::format("attachment of {} bytes exceeds the {} allowed", attachment, kMaxAttachment));
  if (body + attachment != in.size() - kEnvelopeBytes)
    return fail(fmt::format("body length {} and attachment {} but {} bytes arrived", body, attachment,
                            in.size() - kEnvelopeBytes));
  e.body = in.subspan(kEnvelopeBytes, body);
  e.attachment = in.subspan(kEnvelopeBytes + body);
  return e;
}

}  // namespace geoloco::outer
