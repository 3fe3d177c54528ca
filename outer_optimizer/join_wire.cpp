// The join wire: manifest and fetch encodings, bounds-checked (join_wire.hpp).
#include "outer_optimizer/join_wire.hpp"

#include <fmt/format.h>

#include <cstring>

#include "core/hash.hpp"

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

uint64_t JoinManifest::chunk_size(uint32_t i) const {
  const uint64_t begin = uint64_t(i) * chunk_bytes;
  return begin >= state_bytes ? 0 : std::min<uint64_t>(chunk_bytes, state_bytes - begin);
}

bool JoinManifest::same_state(const JoinManifest& o) const {
  return round == o.round && step == o.step && members == o.members && state_bytes == o.state_bytes &&
         chunk_bytes == o.chunk_bytes && state_hash == o.state_hash && weights_hash == o.weights_hash &&
         chunk_hashes == o.chunk_hashes;
}

JoinManifest describe_state(std::span<const uint8_t> state, uint32_t chunk_bytes, uint64_t round, int64_t step,
                            SiteMask members, uint64_t weights_hash) {
  GEOLOCO_CHECK(chunk_bytes >= kMinJoinChunkBytes && chunk_bytes <= kMaxJoinChunkBytes, "join chunk of {} bytes",
                chunk_bytes);
  JoinManifest m;
  m.round = round;
  m.step = step;
  m.members = members;
  m.state_bytes = state.size();
  m.chunk_bytes = chunk_bytes;
  m.state_hash = hash64(state.data(), state.size());
  m.weights_hash = weights_hash;
  const uint64_t n = (state.size() + chunk_bytes - 1) / chunk_bytes;
  if (n > kMaxJoinChunks)
    throw JoinError(fmt::format("join: a state of {} bytes needs {} chunks of {} bytes (at most {})", state.size(), n,
                                chunk_bytes, kMaxJoinChunks));
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t b = i * chunk_bytes, e = std::min<uint64_t>(b + chunk_bytes, state.size());
    m.chunk_hashes.push_back(hash64(state.data() + b, e - b));
  }
  return m;
}

std::vector<uint8_t> encode_manifest(const JoinManifest& m) {
  std::vector<uint8_t> out(kJoinManifestHeader + 8 * m.chunk_hashes.size(), 0);
  std::memcpy(out.data(), kJoinManifestMagic, 4);
  put<uint16_t>(out, 4, kJoinManifestVersion);
  put<uint64_t>(out, 8, m.round);
  put<int64_t>(out, 16, m.step);
  put<uint64_t>(out, 24, m.members);
  put<uint64_t>(out, 32, m.state_bytes);
  put<uint32_t>(out, 40, m.chunk_bytes);
  put<uint32_t>(out, 44, m.chunks());
  put<uint64_t>(out, 48, m.state_hash);
  put<uint64_t>(out, 56, m.weights_hash);
  for (size_t i = 0; i < m.chunk_hashes.size(); ++i) put<uint64_t>(out, kJoinManifestHeader + 8 * i, m.chunk_hashes[i]);
  return out;
}

JoinManifest decode_manifest(std::span<const uint8_t> in, int sites, const std::string& who) {
  auto fail = [&](const std::string& what) -> JoinManifest {
    throw JoinError(fmt::format("join manifest from {} rejected: {}", who, what));
  };
  if (in.size() < kJoinManifestHeader)
    return fail(fmt::format("{} bytes, shorter than the {}-byte header", in.size(), kJoinManifestHeader));
  if (std::memcmp(in.data(), kJoinManifestMagic, 4) != 0) return fail("bad magic");
  if (auto v = get<uint16_t>(in, 4); v != kJoinManifestVersion)
    return fail(fmt::format("version {} (expected {})", v, kJoinManifestVersion));
  if (get<uint16_t>(in, 6) != 0) return fail("reserved field not zero");
  JoinManifest m;
  m.round = get<uint64_t>(in, 8);
  m.step = get<int64_t>(in, 16);
  m.members = get<uint64_t>(in, 24);
  m.state_bytes = get<uint64_t>(in, 32);
  m.chunk_bytes = get<uint32_t>(in, 40);
  const uint32_t chunks = get<uint32_t>(in, 44);
  m.state_hash = get<uint64_t>(in, 48);
  m.weights_hash = get<uint64_t>(in, 56);
  if (m.step < 0) return fail(fmt::format("negative step {}", m.step));
  if (m.members == 0 || (sites < 64 && (m.members >> sites) != 0))
    return fail(fmt::format("members {} outside the config's {} sites", mask_string(m.members), sites));
  if (m.chunk_bytes < kMinJoinChunkBytes || m.chunk_bytes > kMaxJoinChunkBytes)
    return fail(fmt::format("chunk size {} outside [{}, {}]", m.chunk_bytes, kMinJoinChunkBytes, kMaxJoinChunkBytes));
  if (chunks > kMaxJoinChunks) return fail(fmt::format("{} chunks (at most {})", chunks, kMaxJoinChunks));
  if (m.state_bytes == 0 || (m.state_bytes + m.chunk_bytes - 1) / m.chunk_bytes != chunks)
    return fail(
        fmt::format("{} chunks of {} bytes cannot hold a state of {} bytes", chunks, m.chunk_bytes, m.state_bytes));
  if (in.size() != kJoinManifestHeader + 8 * uint64_t(chunks))
    return fail(fmt::format("{} bytes for {} chunk hashes (expected {})", in.size(), chunks,
                            kJoinManifestHeader + 8 * uint64_t(chunks)));
  m.chunk_hashes.resize(chunks);
  for (uint32_t i = 0; i < chunks; ++i) m.chunk_hashes[i] = get<uint64_t>(in, kJoinManifestHeader + 8 * size_t(i));
  return m;
}

std::vector<uint8_t> encode_fetch(const JoinFetch& f) {
  std::vector<uint8_t> out(8);
  put<uint32_t>(out, 0, f.begin);
  put<uint32_t>(out, 4, f.end);
  return out;
}

JoinFetch decode_fetch(std::span<const uint8_t> in, uint32_t chunks, const std::string& who) {
  if (in.size() != 8)
    throw JoinError(fmt::format("join fetch from {} rejected: {} bytes (expected 8)", who, in.size()));
  JoinFetch f{get<uint32_t>(in, 0), get<uint32_t>(in, 4)};
  if (!f.done() && !(f.begin < f.end && f.end <= chunks))
    throw JoinError(fmt::format("join fetch from {} rejected: chunks [{}, {}) of {}", who, f.begin, f.end, chunks));
  return f;
}

}  // namespace geoloco::outer
