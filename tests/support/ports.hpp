// geoloco::test ports: the one way tests pick TCP ports that no other test uses at the same
// time, also across the processes `ctest -j N` runs at once (pid-derived ranges overlap).
//
// The port space [first, end) is cut into blocks of consecutive ports. A block belongs to
// whoever holds an exclusive flock(2) on its lock file, <lock_dir>/<first port of the block>,
// for as long as the lock is held: the kernel drops it when the holder closes the file or
// dies, so a crashed test never leaks a block. A block is handed out only when, in addition,
// every one of its ports can be bound on 127.0.0.1 right now (a listener, or a connection in
// TIME_WAIT, left by some other program or by the block's previous user skips it).
// `end` stays below the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range),
// so no outgoing connection can be given a port of a block as its source port.
//
// tests/support/ports.sh speaks the same protocol for shell tests (same directory, names and
// geometry): change both together.
#pragma once

#include <string>

#include "core/fd.hpp"

namespace geoloco::test {

// Ports per block: the largest span any test uses from one base. The widest is a 4-site
// config (site i at base + 10 i, its ranks at + r, its store at + ranks): under 40.
inline constexpr int kPortBlockSize = 64;

struct PortPool {
  std::string lock_dir = "/tmp/geoloco-test-ports";
  int first = 20000;           // first port of block 0
  int end = 0;                 // one past the last port; 0: min(32768, ephemeral range start)
  int block = kPortBlockSize;  // ports per block
};

// A claimed block: ports base() .. base() + size() - 1 are this object's until it is
// destroyed. Move-only.
class PortBlock {
 public:
  PortBlock(Fd lock, int base, int size) : lock_(std::move(lock)), base_(base), size_(size) {}
  PortBlock(PortBlock&&) noexcept = default;
  PortBlock& operator=(PortBlock&&) noexcept = default;

  int base() const { return base_; }
  int size() const { return size_; }
  // base() + i; throws std::out_of_range outside the block.
  int port(int i) const;

 private:
  Fd lock_;
  int base_ = 0;
  int size_ = 0;
};

// The end `pool` really uses: pool.end, or (0) the lower of 32768 and the ephemeral start.
int pool_end(const PortPool& pool);

// Claims a free block of `pool` (see above), searching from a pid-dependent block so that
// concurrent processes rarely contend. Throws std::runtime_error naming the pool when every
// block is taken or busy.
PortBlock claim_ports(const PortPool& pool = {});

// The first port of a freshly claimed block of the default pool. Inside a GoogleTest test the
// block is held until that test ends (a whole test binary run in one process does not hoard
// blocks); outside one, until the process exits. Thread-safe.
int fresh_port();

}  // namespace geoloco::test
