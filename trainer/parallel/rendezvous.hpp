// Rendezvous inside one site: rank 0 serves a TcpStore on (store_host, store_port), every
// rank connects, announces itself and waits for all `size` ranks, all bounded by `timeout`.
// A rank that never shows up is a RendezvousTimeout naming the site, the missing ranks and
// the store address -- never a hang. The backends (Gloo, NCCL) then exchange their own
// addresses / unique ids through store().
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "trainer/parallel/tcp_store.hpp"

namespace geoloco::parallel {

struct RendezvousOptions {
  std::string site = "site";
  int rank = 0;
  int size = 1;
  // Where rank 0 serves the store (the site's address from the config) and every rank connects.
  std::string store_host = "127.0.0.1";
  int store_port = 29500;
  // Local address Gloo's TCP device binds its pair sockets to (unused by NCCL).
  std::string bind_address = "127.0.0.1";
  // Bounds the rendezvous, and each collective's wait for a peer.
  std::chrono::milliseconds timeout{30000};
  // CUDA device for the NCCL backend; -1 picks the local rank modulo the device count.
  int cuda_device = -1;
  // Gloo backend: transfers are cut into segments of this many bytes, all in flight at
  // once, so the reduction of one overlaps the transfer of the next. A multiple of 8 (so
  // segments never split an element); tests shrink it to exercise many segments.
  size_t segment_bytes = size_t{1} << 20;

  // Throws InputError naming the bad field.
  void validate() const;
};

class Rendezvous {
 public:
  // Blocks until every rank of the site has announced itself, or throws:
  //  RendezvousTimeout  some ranks (named) did not arrive before the deadline
  //  RendezvousError    the same rank joined twice, the store is not ours, ...
  explicit Rendezvous(const RendezvousOptions& opts);
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  const RendezvousOptions& options() const { return opts_; }
  TcpStore& store() { return *client_; }
  // "site paris rank 1/4": the breadcrumb every error from this group starts with.
  std::string who() const;

 private:
  RendezvousOptions opts_;
  std::unique_ptr<TcpStoreServer> server_;  // rank 0 only; outlives the client
  std::unique_ptr<TcpStore> client_;
};

}  // namespace geoloco::parallel
