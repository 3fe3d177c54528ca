#include "trainer/parallel/rendezvous.hpp"

#include <fmt/ranges.h>
#include <unistd.h>

#include <thread>
#include <vector>

#include "trainer/parallel/errors.hpp"

namespace geoloco::parallel {

void RendezvousOptions::validate() const {
  if (site.empty()) throw InputError("rendezvous: site name is empty");
  if (size < 1) throw InputError(fmt::format("site {}: rank count {} must be >= 1", site, size));
  if (rank < 0 || rank >= size)
    throw InputError(fmt::format("site {}: rank {} is outside [0, {})", site, rank, size));
  if (store_host.empty()) throw InputError(fmt::format("site {}: store host is empty", site));
  if (store_port < 1 || store_port > 65535)
    throw InputError(fmt::format("site {}: store port {} is outside [1, 65535]", site, store_port));
  if (timeout.count() <= 0) throw InputError(fmt::format("site {}: rendezvous timeout must be positive", site));
  if (segment_bytes < 8 || segment_bytes % 8 != 0)
    throw InputError(fmt::format("site {}: segment_bytes {} must be a positive multiple of 8", site, segment_bytes));
}

namespace {

std::string rank_key(int r) { return fmt::format("rdzv/rank/{}", r); }

constexpr const char* kFailedKey = "rdzv/failed";

std::vector<char> encode_ranks(const std::vector<int>& ranks) {
  std::string t = fmt::format("{}", fmt::join(ranks, ","));
  return {t.begin(), t.end()};
}

std::vector<int> parse_ranks(const std::vector<char>& bytes) {
  std::vector<int> out;
  int cur = -1;
  for (char ch : bytes) {
    if (ch >= '0' && ch <= '9') {
      cur = (cur < 0 ? 0 : cur * 10) + (ch - '0');
      if (cur > 1'000'000) throw RendezvousError("rendezvous: malformed failure record from rank 0");
    } else if (ch == ',' && cur >= 0) {
      out.push_back(cur);
      cur = -1;
    } else {
      throw RendezvousError("rendezvous: malformed failure record from rank 0");
    }
  }
  if (cur >= 0) out.push_back(cur);
  return out;
}

// Rank 0 gave up: publish who is missing, then keep the store up (at most 1 s) until every
// rank that did arrive has read the verdict and left.
void publish_failure_and_linger(TcpStore& store, const std::vector<int>& missing, const std::vector<bool>& present,
                                int size) {
  try {
    store.set(kFailedKey, encode_ranks(missing));
    std::vector<std::string> left;
    for (int r = 1; r < size; ++r)
      if (present[static_cast<size_t>(r)]) left.push_back(fmt::format("rdzv/left/{}", r));
    if (!left.empty()) store.wait(left, std::chrono::seconds(1));
  } catch (const StoreError&) {
    // Best effort: the timeout we are about to throw is the real news.
  }
}

std::string rank_list(const std::vector<int>& ranks) {
  const size_t shown = std::min<size_t>(ranks.size(), 16);
  std::string s = fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks",
                              fmt::join(ranks.begin(), ranks.begin() + static_cast<std::ptrdiff_t>(shown), ", "));
  if (shown < ranks.size()) s += fmt::format(" and {} more", ranks.size() - shown);
  return s;
}

}  // namespace

std::string Rendezvous::who() const { return fmt::format("site {} rank {}/{}", opts_.site, opts_.rank, opts_.size); }

Rendezvous::Rendezvous(const RendezvousOptions& opts) : opts_(opts) {
  opts_.validate();
  using Clock = TcpStore::Clock;
  const auto deadline = Clock::now() + opts_.timeout;
  const std::string where = fmt::format("{}:{}", opts_.store_host, opts_.store_port);

  if (opts_.rank == 0) {
    try {
      server_ = std::make_unique<TcpStoreServer>(opts_.store_host, opts_.store_port);
    } catch (const Error& e) {
      throw RendezvousError(fmt::format("site {}: rank 0 cannot serve the rendezvous store: {}", opts_.site, e.what()));
    }
  }

  StoreClientOptions so;
  so.host = opts_.store_host;
  so.port = opts_.store_port;
  so.site = opts_.site;
  so.timeout = opts_.timeout;
  try {
    client_ = std::make_unique<TcpStore>(so, deadline);
  } catch (const StoreError& e) {
    throw RendezvousTimeout(fmt::format("site {}: rendezvous timed out after {} waiting for rank 0 at {} "
                                        "(rank {} could not reach its store: {})",
                                        opts_.site, net::seconds_text(opts_.timeout), where, opts_.rank, e.what()),
                            opts_.site, {0});
  }

  try {
    // Claim the rank first: two processes launched with the same rank would otherwise
    // deadlock later inside the backend with a far less useful message.
    const int64_t claims = client_->add(fmt::format("rdzv/claim/{}", opts_.rank), 1);
    if (claims != 1)
      throw RendezvousError(fmt::format("site {}: rank {} joined the rendezvous at {} twice (another process "
                                        "already claimed it)",
                                        opts_.site, opts_.rank, where));
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    std::string me = fmt::format("{} pid {}", host, ::getpid());
    client_->set(rank_key(opts_.rank), std::vector<char>(me.begin(), me.end()));

    std::vector<std::string> keys;
    for (int r = 0; r < opts_.size; ++r) keys.push_back(rank_key(r));
    // The last key is rank 0's verdict: when it gives up it publishes the missing ranks, so
    // every rank reports the same timeout instead of "connection closed" when rank 0's
    // store goes away.
    keys.push_back(kFailedKey);
    auto sleep = std::chrono::milliseconds(1);
    for (;;) {
      auto present = client_->check(keys);
      std::vector<int> missing;
      for (int r = 0; r < opts_.size; ++r)
        if (!present[static_cast<size_t>(r)]) missing.push_back(r);
      if (missing.empty()) break;
      const bool verdict = present.back();
      if (verdict) missing = parse_ranks(client_->get(kFailedKey));
      if (verdict || Clock::now() >= deadline) {
        RendezvousTimeout timeout(fmt::format("site {}: rendezvous timed out after {} waiting for {} at {}",
                                              opts_.site, net::seconds_text(opts_.timeout), rank_list(missing), where),
                                  opts_.site, missing);
        if (opts_.rank == 0) {
          publish_failure_and_linger(*client_, missing, present, opts_.size);
        } else {
          try {
            client_->set(fmt::format("rdzv/left/{}", opts_.rank), {});
          } catch (const StoreError&) {
            // Rank 0 already left; the timeout is still the news.
          }
        }
        throw timeout;
      }
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, std::chrono::milliseconds(50));
    }
  } catch (const StoreError& e) {
    // The store went away mid-rendezvous: rank 0 died or the network broke.
    throw RendezvousError(fmt::format("site {}: rendezvous failed (rank {}): {}", opts_.site, opts_.rank, e.what()));
  }
}

Rendezvous::~Rendezvous() {
  client_.reset();  // close our connection before the server (rank 0) stops
  server_.reset();
}

}  // namespace geoloco::parallel
