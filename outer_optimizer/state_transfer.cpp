// A join's state transfer: the donor's service and the joiner's multi-donor, checksummed
// fetch (state_transfer.hpp).
#include "outer_optimizer/state_transfer.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>

#include "core/hash.hpp"
#include "transport/transport_error.hpp"

namespace geoloco::outer {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kMaxChunkAttempts = 4;
constexpr auto kPoll = std::chrono::milliseconds(10);

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

// ---- donor ------------------------------------------------------------------------------------

JoinDonor::JoinDonor(const SitePeers& peers, int joiner, std::shared_ptr<const JoinSnapshot> snap, double idle_s,
                     const OuterHooks& hooks, int joiner_rank)
    : peers_(peers),
      joiner_(joiner),
      joiner_rank_(joiner_rank < 0 ? peers.partner(joiner) : joiner_rank),
      snap_(std::move(snap)),
      idle_s_(idle_s),
      hooks_(hooks) {
  thread_ = std::thread([this] { run(); });
}

JoinDonor::~JoinDonor() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void JoinDonor::run() {
  const JoinManifest& m = snap_->manifest;
  const std::string who = peers_.name_of(joiner_, joiner_rank_);
  int corrupt_left = 0;
  if (const auto& c = hooks_.corrupt_join_chunk; c && c->site == peers_.site()) corrupt_left = c->times;
  try {
    const auto body = encode_manifest(m);
    std::vector<transport::SendHandle> sends;
    sends.push_back(
        peers_.send(joiner_, EnvelopeKind::kJoinManifest, 0, kJoinManifestShard, m.round, body, joiner_rank_));
    for (uint64_t q = 1;; ++q) {
      auto r = peers_.post_recv(joiner_, q, kJoinFetchShard, 8, joiner_rank_);
      const auto t0 = Clock::now();
      while (!r.wait_for(std::chrono::milliseconds(50))) {
        if (stop_.load() || since(t0) >= idle_s_) {
          r.cancel();
          if (!stop_.load())
            spdlog::warn("join of {}: no request for {:.0f} s; the donor stops serving it", who, idle_s_);
          finished_.store(true);
          return;
        }
      }
      std::vector<uint8_t> bytes;
      const Envelope e = peers_.read(r, joiner_, EnvelopeKind::kJoinFetch, q, bytes, 8, joiner_rank_);
      const JoinFetch f = decode_fetch(e.body, m.chunks(), who);
      if (f.done()) break;
      for (uint32_t i = f.begin; i < f.end; ++i) {
        const uint64_t off = uint64_t(i) * m.chunk_bytes, n = m.chunk_size(i);
        std::vector<uint8_t> chunk(snap_->state.begin() + static_cast<std::ptrdiff_t>(off),
                                   snap_->state.begin() + static_cast<std::ptrdiff_t>(off + n));
        if (corrupt_left > 0 && i == hooks_.corrupt_join_chunk->chunk) {
          chunk[0] ^= 0x01;  // after the manifest hashed it: only the joiner's check can catch it
          --corrupt_left;
        }
        std::vector<uint8_t> msg;
        write_envelope({EnvelopeKind::kJoinChunk,
                        q,
                        static_cast<uint32_t>(peers_.site()),
                        static_cast<uint32_t>(peers_.rank()),
                        i,
                        chunk,
                        {}},
                       msg);
        sends.push_back(peers_.transport()->send(peers_.peer_of(joiner_, joiner_rank_),
                                                 transport::FrameKind::kGlobalState, q, i,
                                                 transport::make_payload(std::move(msg))));
        bytes_ += n;
      }
      std::erase_if(sends, [](transport::SendHandle& h) { return h.ready(); });
    }
  } catch (const std::exception& e) {
    if (!stop_.load()) spdlog::warn("join of {}: the donor stops serving it: {}", who, e.what());
  }
  finished_.store(true);
}

// ---- joiner -----------------------------------------------------------------------------------

JoinResult fetch_join_state(const SitePeers& peers, double wait_s, const std::atomic<bool>* abort) {
  const auto t0 = Clock::now();
  const int S = peers.sites(), self = peers.site();
  JoinResult res;
  auto check_abort = [&] {
    if (abort && abort->load()) throw JoinError("join abandoned: the outer loop is stopping");
  };
  auto timed_out = [&](const std::string& what) {
    std::string notes;
    for (const auto& n : res.notes) notes += "; " + n;
    return JoinError(fmt::format("join: {} within {:.0f} s{}", what, wait_s, notes));
  };

  // 1. Ask every site; their manifests come once they have taken this site in.
  std::map<int, transport::RecvHandle> man_recv;
  std::vector<transport::SendHandle> requests;
  const uint64_t max_manifest = kJoinManifestHeader + 8 * uint64_t(kMaxJoinChunks);
  for (int s = 0; s < S; ++s) {
    if (s == self) continue;
    man_recv.emplace(s, peers.post_recv(s, 0, kJoinManifestShard, max_manifest));
    requests.push_back(peers.send(s, EnvelopeKind::kJoinRequest, 0, kJoinShard, 0, {}));
  }
  std::map<int, JoinManifest> manifests;
  std::optional<Clock::time_point> first;
  while (!man_recv.empty()) {
    check_abort();
    for (auto it = man_recv.begin(); it != man_recv.end();) {
      if (!it->second.ready()) {
        ++it;
        continue;
      }
      const int s = it->first;
      try {
        std::vector<uint8_t> bytes;
        const Envelope e = peers.read(it->second, s, EnvelopeKind::kJoinManifest, 0, bytes, max_manifest);
        manifests.emplace(s, decode_manifest(e.body, S, peers.name(s)));
        if (!first) first = Clock::now();
      } catch (const std::exception& e) {
        res.notes.push_back(fmt::format("{}: {}", peers.name(s), e.what()));
      }
      it = man_recv.erase(it);
    }
    if (first && since(*first) >= 1.0) break;
    if (since(t0) >= wait_s) break;
    std::this_thread::sleep_for(kPoll);
  }
  for (auto& [s, h] : man_recv) {
    h.cancel();
    if (!first) res.notes.push_back(fmt::format("{}: no answer", peers.name(s)));
  }
  if (manifests.empty()) throw timed_out("no site of the running job took this site in");

  // 2. The donors: the largest group of identical manifests (ties: the lowest site's).
  std::vector<int> donors;
  for (const auto& [s, m] : manifests) {
    std::vector<int> group;
    for (const auto& [t, n] : manifests)
      if (m.same_state(n)) group.push_back(t);
    if (group.size() > donors.size()) donors = group;
  }
  const JoinManifest m = manifests.at(donors.front());
  for (const auto& [s, n] : manifests)
    if (std::find(donors.begin(), donors.end(), s) == donors.end())
      res.notes.push_back(
          fmt::format("{}: its manifest (round {}, state {}) disagrees with the others' (round {}, "
                      "state {}): not used",
                      peers.name(s), n.round, hex64(n.state_hash), m.round, hex64(m.state_hash)));
  for (int s : donors) res.donors |= SiteMask{1} << s;
  // Every other site asked is told now that it serves nothing: a donor not used (its manifest
  // disagreed, or came late) would otherwise wait for a request until its connection's
  // transfer timeout failed it, and the next round would leave this site out.
  for (int s = 0; s < S; ++s)
    if (s != self && !((res.donors >> s) & 1)) {
      try {
        peers.send(s, EnvelopeKind::kJoinFetch, 1, kJoinFetchShard, 0, encode_fetch({}));
      } catch (const transport::TransportError&) {
        // Gone already: nothing to tell.
      }
    }
  res.manifest = m;
  res.state.assign(m.state_bytes, 0);

  // 3. Chunks from every donor at once; what fails goes to another donor.
  const uint32_t N = m.chunks();
  std::vector<int> attempts(N, 0);
  std::vector<uint32_t> pending(N);
  for (uint32_t i = 0; i < N; ++i) pending[i] = i;
  std::map<int, uint64_t> seq;  // per donor: the last request number
  std::vector<int> alive = donors;
  struct Wanted {
    int donor;
    uint64_t q;
    uint32_t chunk;
    transport::RecvHandle h;
  };
  const uint64_t max_chunk = kEnvelopeBytes + m.chunk_bytes;
  while (!pending.empty()) {
    check_abort();
    if (alive.empty()) {
      std::string notes;
      for (const auto& n : res.notes) notes += "; " + n;
      throw JoinError(
          fmt::format("join: every donor was lost with {} of {} chunks missing{}", pending.size(), N, notes));
    }
    // Chunk i goes to donor (i + attempts) mod D, in contiguous runs: one request per run.
    std::map<int, std::vector<uint32_t>> plan;
    for (uint32_t i : pending) plan[alive[(i + static_cast<uint32_t>(attempts[i])) % alive.size()]].push_back(i);
    std::vector<Wanted> wanted;
    std::vector<transport::SendHandle> fetches;
    for (auto& [d, chunks] : plan) {
      for (size_t a = 0; a < chunks.size();) {
        size_t b = a + 1;
        while (b < chunks.size() && chunks[b] == chunks[b - 1] + 1) ++b;
        const uint64_t q = ++seq[d];
        for (size_t k = a; k < b; ++k)
          wanted.push_back(
              {d, q, chunks[k],
               peers.transport()->recv(peers.peer(d), transport::FrameKind::kGlobalState, q, chunks[k], max_chunk)});
        fetches.push_back(peers.send(d, EnvelopeKind::kJoinFetch, q, kJoinFetchShard, 0,
                                     encode_fetch({chunks[a], chunks[b - 1] + 1})));
        a = b;
      }
    }
    pending.clear();
    for (auto& w : wanted) {
      while (!w.h.ready()) {  // (wait_for would throw a donor's failure here, outside the try below)
        std::this_thread::sleep_for(kPoll);
        if ((abort && abort->load()) || since(t0) >= wait_s) {
          for (auto& x : wanted) x.h.cancel();
          check_abort();
          throw timed_out(fmt::format("the state ({} chunks) did not arrive", N));
        }
      }
      std::string why;
      bool donor_lost = false;
      try {
        w.h.wait();  // done: throws the donor's failure
        std::vector<uint8_t> bytes = w.h.take();
        bytes.resize(w.h.bytes());
        const Envelope e =
            read_envelope(bytes, EnvelopeKind::kJoinChunk, w.q, static_cast<uint32_t>(w.donor),
                          static_cast<uint32_t>(peers.partner(w.donor)), m.chunk_bytes, peers.name(w.donor));
        res.bytes += e.body.size();
        if (e.value != w.chunk || e.body.size() != m.chunk_size(w.chunk))
          why = fmt::format("chunk {} from {}: {} bytes labelled chunk {}", w.chunk, peers.name(w.donor), e.body.size(),
                            e.value);
        else if (hash64(e.body.data(), e.body.size()) != m.chunk_hashes[w.chunk])
          why = fmt::format("chunk {} from {} failed its checksum", w.chunk, peers.name(w.donor));
        else
          std::copy(e.body.begin(), e.body.end(),
                    res.state.begin() + static_cast<std::ptrdiff_t>(uint64_t(w.chunk) * m.chunk_bytes));
      } catch (const transport::TransportError& e) {
        why = fmt::format("{} lost: {}", peers.name(w.donor), e.what());
        donor_lost = true;
      } catch (const EnvelopeError& e) {
        why = e.what();
      }
      if (why.empty()) continue;
      if (donor_lost) {
        if (std::erase(alive, w.donor) > 0) {
          res.notes.push_back(why);
          spdlog::warn("join: {}; its chunks go to another donor", why);
        }
      } else {
        res.notes.push_back(why);
        spdlog::warn("join: {}; fetching it again", why);
        if (++attempts[w.chunk] >= kMaxChunkAttempts)
          throw JoinError(fmt::format("join: chunk {} failed {} times; last: {}", w.chunk, kMaxChunkAttempts, why));
      }
      if (donor_lost) ++attempts[w.chunk];
      pending.push_back(w.chunk);
      ++res.refetched;
    }
    std::sort(pending.begin(), pending.end());
  }
  for (int d : alive) peers.send(d, EnvelopeKind::kJoinFetch, ++seq[d], kJoinFetchShard, 0, encode_fetch({}));
  if (hash64(res.state.data(), res.state.size()) != m.state_hash)
    throw JoinError(fmt::format("join: the assembled state ({} bytes) does not hash to the manifest's {}",
                                res.state.size(), hex64(m.state_hash)));
  res.seconds = since(t0);
  return res;
}

}  // namespace geoloco::outer
