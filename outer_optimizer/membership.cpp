// Round membership by single-decree Paxos (membership.hpp): the wire form and the
// per-round state machine. Every rule that makes it safe or live is commented where it is
// applied; docs/elastic.md states the guarantees.
#include "outer_optimizer/membership.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>

namespace geoloco::outer {

int mask_count(SiteMask m) { return std::popcount(m); }

SiteMask all_sites(int sites) {
  GEOLOCO_CHECK(sites >= 0 && sites <= kMaxSites, "sites {} out of 0..{}", sites, kMaxSites);
  return sites == kMaxSites ? ~SiteMask{0} : ((SiteMask{1} << sites) - 1);
}

std::string mask_string(SiteMask m) {
  std::string out = "{";
  for (int s = 0; s < kMaxSites; ++s) {
    if (!(m >> s & 1)) continue;
    if (out.size() > 1) out += ',';
    out += std::to_string(s);
  }
  return out + "}";
}

int majority(int sites) { return sites / 2 + 1; }

// ---- wire form ----

namespace {

constexpr char kMagic[4] = {'G', 'L', 'M', 'B'};

template <typename T>
void put(std::vector<uint8_t>& out, size_t off, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out[off + i] = static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i));
}

template <typename T>
T get(std::span<const uint8_t> in, size_t off) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(in[off + i]) << (8 * i);
  return static_cast<T>(v);
}

const char* type_name(MemberMsgType t) {
  switch (t) {
    case MemberMsgType::kPrepare: return "prepare";
    case MemberMsgType::kPromise: return "promise";
    case MemberMsgType::kAccept: return "accept";
    case MemberMsgType::kAccepted: return "accepted";
    case MemberMsgType::kDecide: return "decide";
    case MemberMsgType::kNack: return "nack";
    case MemberMsgType::kHolds: return "holds";
  }
  return "?";
}

}  // namespace

std::vector<uint8_t> encode_member_msg(const MemberMsg& m) {
  std::vector<uint8_t> out(kMemberMsgBytes, 0);
  std::memcpy(out.data(), kMagic, 4);
  put<uint16_t>(out, 4, kMemberMsgVersion);
  out[6] = static_cast<uint8_t>(m.type);
  put<uint32_t>(out, 8, m.from);
  put<uint32_t>(out, 12, m.to);
  put<uint64_t>(out, 16, m.round);
  put<uint64_t>(out, 24, m.ballot);
  put<uint64_t>(out, 32, m.promised);
  put<uint64_t>(out, 40, m.accepted_ballot);
  put<uint64_t>(out, 48, m.value);
  put<uint64_t>(out, 56, m.holds);
  return out;
}

MemberMsg decode_member_msg(std::span<const uint8_t> bytes, int sites, uint32_t expected_from, const std::string& who) {
  auto bad = [&](const std::string& what) {
    return MembershipError(fmt::format("membership message from {}: {}", who, what));
  };
  if (bytes.size() != kMemberMsgBytes) throw bad(fmt::format("{} bytes, expected {}", bytes.size(), kMemberMsgBytes));
  if (std::memcmp(bytes.data(), kMagic, 4) != 0) throw bad("bad magic (not a GLMB record)");
  const auto version = get<uint16_t>(bytes, 4);
  if (version != kMemberMsgVersion)
    throw bad(fmt::format("version {}, this build speaks {}", version, kMemberMsgVersion));
  const uint8_t type = bytes[6];
  if (type < 1 || type > 7) throw bad(fmt::format("unknown type {}", type));
  if (bytes[7] != 0) throw bad("reserved byte 7 is not zero");
  MemberMsg m;
  m.type = static_cast<MemberMsgType>(type);
  m.from = get<uint32_t>(bytes, 8);
  m.to = get<uint32_t>(bytes, 12);
  m.round = get<uint64_t>(bytes, 16);
  m.ballot = get<uint64_t>(bytes, 24);
  m.promised = get<uint64_t>(bytes, 32);
  m.accepted_ballot = get<uint64_t>(bytes, 40);
  m.value = get<uint64_t>(bytes, 48);
  m.holds = get<uint64_t>(bytes, 56);
  const auto n = static_cast<uint32_t>(sites);
  if (m.from >= n || m.to >= n)
    throw bad(fmt::format("{} names site {} -> {}, the config has {}", type_name(m.type), m.from, m.to, sites));
  if (m.from == m.to) throw bad(fmt::format("{} from site {} to itself", type_name(m.type), m.from));
  if (m.from != expected_from)
    throw bad(fmt::format("{} claims to come from site {}, the connection is site {}", type_name(m.type), m.from,
                          expected_from));
  const SiteMask config = all_sites(sites);
  if ((m.value & ~config) != 0 || (m.holds & ~config) != 0)
    throw bad(fmt::format("{} names sites outside the config's {} (value {}, holds {})", type_name(m.type), sites,
                          mask_string(m.value), mask_string(m.holds)));
  return m;
}

// ---- the state machine ----

RoundConsensus::RoundConsensus(const ConsensusConfig& cfg, uint64_t round) : cfg_(cfg), round_(round) {
  GEOLOCO_CHECK(cfg.sites >= 1 && cfg.sites <= kMaxSites, "sites {} out of 1..{}", cfg.sites, kMaxSites);
  GEOLOCO_CHECK(cfg.self >= 0 && cfg.self < cfg.sites, "self {} out of 0..{}", cfg.self, cfg.sites - 1);
  GEOLOCO_CHECK(cfg.quorum >= 1 && cfg.quorum <= cfg.sites, "quorum {} out of 1..{}", cfg.quorum, cfg.sites);
  // A ballot that settles for a degraded quorum must not be retried before it could.
  GEOLOCO_CHECK(cfg.retry_s > 0 && cfg.degrade_s >= 0 && cfg.degrade_s < cfg.retry_s,
                "retry_s {} must be positive and above degrade_s {}", cfg.retry_s, cfg.degrade_s);
  holds_ = SiteMask{1} << cfg.self;  // a site always holds its own contribution
}

void RoundConsensus::add_holds(SiteMask holds) {
  GEOLOCO_CHECK((holds & ~all_sites(cfg_.sites)) == 0, "holds {} outside {} sites", mask_string(holds), cfg_.sites);
  holds_ |= holds;
}

int RoundConsensus::position() const { return mask_count(holds_ & ((SiteMask{1} << cfg_.self) - 1)); }

double RoundConsensus::offset() const { return patience() * cfg_.self / cfg_.sites; }

// A ballot's patience doubles with every ballot this site started (up to 8x): a retry_s
// shorter than the network's round trip then still ends in a decision instead of ballots
// pre-empting each other forever.
double RoundConsensus::patience() const {
  return cfg_.retry_s * static_cast<double>(1 << std::min(std::max(ballots_ - 1, 0), 3));
}

void RoundConsensus::ready(double now) {
  if (ready_) return;
  now_ = now;
  ready_ = true;
  // The lowest held site proposes first; the others give it `position` retry periods. A
  // foreign ballot seen while not ready postpones us as it would have if we had been.
  next_attempt_ =
      std::max(now + position() * cfg_.retry_s, last_foreign_ >= 0 ? last_foreign_ + cfg_.retry_s + offset() : now);
  if (cfg_.expected) broadcast({.type = MemberMsgType::kHolds, .holds = holds_}, /*include_self=*/false);
  std::vector<MemberMsg> queued;
  queued.swap(queued_prepares_);
  for (const auto& m : queued) handle(m);
  try_fast();
  drain_self();
}

void RoundConsensus::try_fast() {
  if (!cfg_.expected || decided_ || !ready_ || !fast_ok_ || holds_ != cfg_.expected) return;
  const SiteMask others = cfg_.expected & ~(SiteMask{1} << cfg_.self);
  if ((fast_from_ & others) == others) decide(cfg_.expected, 0);
}

void RoundConsensus::receive(const MemberMsg& m, double now) {
  GEOLOCO_CHECK(m.to == static_cast<uint32_t>(cfg_.self) && m.round == round_,
                "message for site {} round {} given to site {} round {}", m.to, m.round, cfg_.self, round_);
  now_ = now;
  handle(m);
  drain_self();
}

void RoundConsensus::tick(double now) {
  now_ = now;
  if (decided_) return;
  switch (phase_) {
    case Phase::kIdle:
      if (ready_ && next_attempt_ >= 0 && now >= next_attempt_) start_ballot();
      break;
    case Phase::kPreparing:
      // The wait for a majority ran out (degraded quorum): the promises in hand suffice.
      if (collect_until_ < 0 && mask_count(promised_by_) >= needed()) collect_until_ = now;
      if (collect_until_ >= 0 && now >= collect_until_ && mask_count(promised_by_) >= needed()) {
        propose();
      } else if (now - phase_start_ >= patience()) {
        start_ballot();  // stalled: dead acceptors or a lost ballot; a higher one re-asks all
      } else {
        resend(now, promised_by_, {.type = MemberMsgType::kPrepare, .ballot = ballot_});
      }
      break;
    case Phase::kAccepting:
      if (mask_count(accepted_by_) >= needed()) {
        decide(proposal_, ballot_);  // the wait for a majority ran out (degraded quorum)
      } else if (now - phase_start_ >= patience()) {
        start_ballot();
      } else {
        resend(now, accepted_by_, {.type = MemberMsgType::kAccept, .ballot = ballot_, .value = proposal_});
      }
      break;
  }
  drain_self();
}

std::vector<MemberMsg> RoundConsensus::take_outbox() {
  std::vector<MemberMsg> out;
  out.swap(outbox_);
  return out;
}

// A quorum at or above a majority is used as is: any two such sets intersect, which is
// Paxos's safety. Below a majority a ballot first waits `degrade_s` for a majority, so that
// a connected run still decides once; after that it settles for the configured quorum.
int RoundConsensus::needed() const {
  const int maj = majority(cfg_.sites);
  if (cfg_.quorum >= maj) return cfg_.quorum;
  return now_ - phase_start_ >= cfg_.degrade_s ? cfg_.quorum : maj;
}

void RoundConsensus::send(MemberMsg m) {
  m.from = static_cast<uint32_t>(cfg_.self);
  m.round = round_;
  if (m.to == static_cast<uint32_t>(cfg_.self)) {
    self_inbox_.push_back(m);
  } else {
    outbox_.push_back(m);
  }
}

void RoundConsensus::broadcast(MemberMsg m, bool include_self) {
  for (int s = 0; s < cfg_.sites; ++s) {
    if (s == cfg_.self && !include_self) continue;
    m.to = static_cast<uint32_t>(s);
    send(m);
  }
}

void RoundConsensus::drain_self() {
  while (!self_inbox_.empty()) {
    const MemberMsg m = self_inbox_.front();
    self_inbox_.erase(self_inbox_.begin());
    handle(m);
  }
}

void RoundConsensus::handle(const MemberMsg& m) {
  const bool request = m.type == MemberMsgType::kPrepare || m.type == MemberMsgType::kAccept;
  if (request && decided_) {  // a site that missed the decision learns it from anyone
    send({.type = MemberMsgType::kDecide, .to = m.from, .ballot = decided_ballot_, .value = *decided_});
    return;
  }
  if (outside(m.from)) {
    // The other side of a partition (in_run): its ballots, promises and acceptances are not
    // this side's, its decision is recorded and not adopted.
    if (m.type == MemberMsgType::kDecide && !foreign_) foreign_ = m.value;
    return;
  }
  highest_seen_ = std::max({highest_seen_, m.ballot, m.promised});
  switch (m.type) {
    case MemberMsgType::kHolds:
      fast_from_ |= SiteMask{1} << m.from;
      fast_ok_ = fast_ok_ && m.holds == cfg_.expected;
      try_fast();
      return;
    case MemberMsgType::kPrepare:
      if (!ready_ && m.from != static_cast<uint32_t>(cfg_.self)) {
        // Our holdings are not final yet: answering now would let a proposal leave out a
        // contribution still arriving. The deadline makes us ready soon.
        note_foreign(m.ballot);
        queued_prepares_.push_back(m);
        return;
      }
      on_prepare(m);
      return;
    case MemberMsgType::kAccept: on_accept(m); return;
    case MemberMsgType::kPromise: on_promise(m); return;
    case MemberMsgType::kAccepted: on_accepted(m); return;
    case MemberMsgType::kNack: on_nack(m); return;
    case MemberMsgType::kDecide: on_decide(m); return;
  }
}

bool RoundConsensus::outside(uint32_t site) const {
  return cfg_.in_run && cfg_.quorum < majority(cfg_.sites) && !((cfg_.in_run >> site) & 1);
}

void RoundConsensus::note_foreign(uint64_t ballot) {
  if (ballot % 64 == static_cast<uint64_t>(cfg_.self)) return;
  last_foreign_ = now_;
  // Someone else is running a ballot: give it time before we compete (duelling proposers
  // otherwise pre-empt each other forever). A lower ballot of ours is doomed anyway -- the
  // acceptors that promised the higher one refuse it -- so it steps back too.
  if (phase_ != Phase::kIdle && ballot > ballot_) phase_ = Phase::kIdle;
  if (phase_ == Phase::kIdle && ready_) next_attempt_ = std::max(next_attempt_, now_ + patience() + offset());
}

void RoundConsensus::on_prepare(const MemberMsg& m) {
  note_foreign(m.ballot);
  // Ballots are unique per proposer, so an equal ballot is the same proposer asking again
  // (a resend): promising it again changes nothing.
  if (m.ballot >= promised_) {
    promised_ = m.ballot;
    send({.type = MemberMsgType::kPromise,
          .to = m.from,
          .ballot = m.ballot,
          .accepted_ballot = accepted_ballot_,
          .value = accepted_value_,
          .holds = holds_});
  } else {
    send({.type = MemberMsgType::kNack, .to = m.from, .ballot = m.ballot, .promised = promised_});
  }
}

void RoundConsensus::on_accept(const MemberMsg& m) {
  note_foreign(m.ballot);
  // Accepting needs no readiness: the value was fixed by others' holdings, and a member
  // that lacks a contribution learns so from can_apply() and rejoins from peers.
  if (m.ballot >= promised_) {
    promised_ = m.ballot;
    accepted_ballot_ = m.ballot;
    accepted_value_ = m.value;
    send({.type = MemberMsgType::kAccepted, .to = m.from, .ballot = m.ballot, .value = m.value});
  } else {
    send({.type = MemberMsgType::kNack, .to = m.from, .ballot = m.ballot, .promised = promised_});
  }
}

// A message may be lost with a peer's connection or delayed past the ballot's patience:
// four times per patience the phase's request goes again to the sites that have not answered.
void RoundConsensus::resend(double now, SiteMask answered, MemberMsg m) {
  if (now - last_send_ < patience() / 4) return;
  last_send_ = now;
  for (int s = 0; s < cfg_.sites; ++s) {
    if (s == cfg_.self || (answered >> s & 1)) continue;
    m.to = static_cast<uint32_t>(s);
    send(m);
  }
}

void RoundConsensus::start_ballot() {
  ballot_ = (highest_seen_ / 64 + 1) * 64 + static_cast<uint64_t>(cfg_.self);
  highest_seen_ = ballot_;
  phase_ = Phase::kPreparing;
  phase_start_ = last_send_ = now_;
  collect_until_ = -1;
  promised_by_ = 0;
  promise_holds_.assign(static_cast<size_t>(cfg_.sites), 0);
  best_accepted_ballot_ = 0;
  best_accepted_value_ = 0;
  ++ballots_;
  broadcast({.type = MemberMsgType::kPrepare, .ballot = ballot_}, /*include_self=*/true);
}

void RoundConsensus::on_promise(const MemberMsg& m) {
  if (phase_ != Phase::kPreparing || m.ballot != ballot_) return;  // a stale ballot's answer
  promised_by_ |= SiteMask{1} << m.from;
  promise_holds_[m.from] = m.holds;
  if (m.accepted_ballot > best_accepted_ballot_) {
    best_accepted_ballot_ = m.accepted_ballot;
    best_accepted_value_ = m.value;
  }
  const int count = mask_count(promised_by_);
  if (count == cfg_.sites) {
    propose();
  } else if (count >= needed() && collect_until_ < 0) {
    // Enough to go on; wait a little for the rest, whose holdings make the membership one
    // that more sites can apply.
    collect_until_ = now_ + cfg_.retry_s / 4;
  }
}

MemberChoice choose_members(SiteMask promisers, std::span<const SiteMask> holds) {
  SiteMask q = promisers;
  for (;;) {
    SiteMask v = ~SiteMask{0};
    for (size_t s = 0; s < holds.size(); ++s)
      if ((q >> s) & 1) v &= holds[s];
    v &= all_sites(static_cast<int>(holds.size()));
    const SiteMask unheld = q & ~v;
    if (unheld == 0) {
      SiteMask holders = 0;
      for (size_t s = 0; s < holds.size(); ++s)
        if (((promisers >> s) & 1) && (v & ~holds[s]) == 0) holders |= SiteMask{1} << s;
      return {v, holders};
    }
    // Drop the promiser the fewest others hold (the highest index on a tie): its own
    // holdings no longer narrow the value.
    int drop = -1, fewest = 65;
    for (int s = static_cast<int>(holds.size()) - 1; s >= 0; --s) {
      if (!((unheld >> s) & 1)) continue;
      int held_by = 0;
      for (size_t o = 0; o < holds.size(); ++o)
        if (((q >> o) & 1) && ((holds[o] >> s) & 1)) ++held_by;
      if (held_by < fewest) fewest = held_by, drop = s;
    }
    q &= ~(SiteMask{1} << drop);
  }
}

void RoundConsensus::propose() {
  // Paxos: a value some acceptor may have accepted must be proposed again; only a free
  // proposer chooses (choose_members).
  SiteMask value = best_accepted_value_;
  bool enough = true;
  if (!best_accepted_ballot_) {
    // The round must be applicable by a quorum: at least that many promisers hold it all.
    // What every promiser holds; if that is too little, what every promiser left holds
    // once promisers the others do not hold are left out (choose_members).
    SiteMask all = all_sites(cfg_.sites);
    for (int s = 0; s < cfg_.sites; ++s)
      if ((promised_by_ >> s) & 1) all &= promise_holds_[static_cast<size_t>(s)];
    value = all;
    if (mask_count(all) < cfg_.quorum) {
      const MemberChoice c = choose_members(promised_by_, promise_holds_);
      value = c.members;
      enough = mask_count(c.holders) >= cfg_.quorum;
    }
  }
  if (!enough || mask_count(value) < cfg_.quorum) {
    // Too few contributions are held by all promisers: wait for more holdings or sites.
    phase_ = Phase::kIdle;
    next_attempt_ = now_ + patience() + offset();
    return;
  }
  proposal_ = value;
  phase_ = Phase::kAccepting;
  phase_start_ = last_send_ = now_;
  accepted_by_ = 0;
  broadcast({.type = MemberMsgType::kAccept, .ballot = ballot_, .value = proposal_}, /*include_self=*/true);
}

void RoundConsensus::on_accepted(const MemberMsg& m) {
  if (phase_ != Phase::kAccepting || m.ballot != ballot_) return;
  accepted_by_ |= SiteMask{1} << m.from;
  if (mask_count(accepted_by_) >= needed()) decide(proposal_, ballot_);
}

void RoundConsensus::on_nack(const MemberMsg& m) {
  if (phase_ == Phase::kIdle || m.ballot != ballot_) return;
  // A higher ballot is active: step back and let it finish; retry after a pause.
  phase_ = Phase::kIdle;
  next_attempt_ = now_ + patience() + offset();
}

void RoundConsensus::on_decide(const MemberMsg& m) {
  if (!decided_) {
    decided_ = m.value;
    decided_ballot_ = m.ballot;
    phase_ = Phase::kIdle;
    return;
  }
  if (*decided_ != m.value && !conflict_) conflict_ = m.value;
}

void RoundConsensus::decide(SiteMask value, uint64_t ballot) {
  if (decided_) {
    if (*decided_ != value && !conflict_) conflict_ = value;
    return;
  }
  decided_ = value;
  decided_ballot_ = ballot;
  phase_ = Phase::kIdle;
  broadcast({.type = MemberMsgType::kDecide, .ballot = ballot, .value = value}, /*include_self=*/false);
}

}  // namespace geoloco::outer
