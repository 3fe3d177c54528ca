#include "tests/support/ports.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace geoloco::test {

namespace {

// Bound without SO_REUSEADDR, so a port with a connection in TIME_WAIT counts as busy too:
// the stricter test (some listeners, e.g. UCX's or a tool's, may not set SO_REUSEADDR).
bool bindable(int port) {
  Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  return ::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
}

void make_lock_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 01777) == 0) {
    ::chmod(dir.c_str(), 01777);  // past the umask: every user's tests share the blocks
    return;
  }
  if (errno != EEXIST)
    throw std::runtime_error("cannot create the port lock directory " + dir + ": " + std::strerror(errno));
}

}  // namespace

int PortBlock::port(int i) const {
  if (i < 0 || i >= size_)
    throw std::out_of_range("port " + std::to_string(i) + " outside the block of " + std::to_string(size_) +
                            " ports at " + std::to_string(base_));
  return base_ + i;
}

int pool_end(const PortPool& pool) {
  if (pool.end > 0) return pool.end;
  int end = 32768;
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int lo = 0, hi = 0;
  if (range >> lo >> hi && lo > 0) end = std::min(end, lo);
  return end;
}

PortBlock claim_ports(const PortPool& pool) {
  const int end = pool_end(pool);
  const std::string where = "ports " + std::to_string(pool.first) + ".." + std::to_string(end - 1) + " (blocks of " +
                            std::to_string(pool.block) + ", locks in " + pool.lock_dir + ")";
  const int blocks = pool.block > 0 ? (end - pool.first) / pool.block : 0;
  if (blocks <= 0) throw std::runtime_error("no room for one block in " + where);
  make_lock_dir(pool.lock_dir);
  std::string trouble;
  const int start = static_cast<int>(::getpid()) % blocks;
  for (int k = 0; k < blocks; ++k) {
    const int base = pool.first + ((start + k) % blocks) * pool.block;
    const std::string path = pool.lock_dir + "/" + std::to_string(base);
    Fd lock(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666));
    if (!lock) {
      trouble = "; open " + path + ": " + std::strerror(errno);
      continue;
    }
    if (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) continue;  // another holder
    bool free = true;
    for (int p = base; p < base + pool.block && free; ++p) free = bindable(p);
    if (!free) continue;  // closing `lock` releases the block again
    return PortBlock(std::move(lock), base, pool.block);
  }
  throw std::runtime_error("every block of " + where + " is taken or has a port in use" + trouble);
}

namespace {

std::mutex g_mu;
std::vector<PortBlock> g_test_blocks;     // released when the current test ends
std::vector<PortBlock> g_process_blocks;  // claimed outside any test: held until exit
bool g_listener_added = false;

class ReleaseAtTestEnd : public ::testing::EmptyTestEventListener {
  void OnTestEnd(const ::testing::TestInfo&) override {
    std::lock_guard lock(g_mu);
    g_test_blocks.clear();
  }
};

}  // namespace

int fresh_port() {
  const bool in_test = ::testing::UnitTest::GetInstance()->current_test_info() != nullptr;
  PortBlock b = claim_ports();
  const int base = b.base();
  std::lock_guard lock(g_mu);
  if (in_test) {
    if (!g_listener_added) {
      ::testing::UnitTest::GetInstance()->listeners().Append(new ReleaseAtTestEnd);  // owned by gtest
      g_listener_added = true;
    }
    g_test_blocks.push_back(std::move(b));
  } else {
    g_process_blocks.push_back(std::move(b));
  }
  return base;
}

}  // namespace geoloco::test
