// Gloo backend with ranks as separate processes: this test binary re-executes itself with
// GEOLOCO_TEST_GLOO_WORKER set, and the hook below runs the worker before gtest starts.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include "tests/trainer/parallel/ring_reference.hpp"
#include "tests/trainer/parallel/test_util.hpp"
#include "trainer/parallel/errors.hpp"
#include "trainer/parallel/gloo_collective.hpp"

namespace geoloco::parallel {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr int kExitOk = 0;
constexpr int kExitWrongResult = 10;
constexpr int kExitCollectiveError = 42;
constexpr int kExitOtherError = 43;
constexpr int64_t kN = 100003;

// Worker modes:
//   "allreduce": rank-fill and random all-reduce; checks exact sum and ring-order bits.
//   "loop":      all-reduces forever (until a peer dies -> CollectiveError -> exit 42).
int run_worker(const std::string& spec) {
  std::istringstream in(spec);
  std::string mode;
  int rank = 0, size = 0, port = 0;
  in >> mode >> rank >> size >> port;
  try {
    auto c = make_gloo(testing::options("paris", rank, size, port, 3s));
    if (mode == "allreduce") {
      std::vector<float> v(kN, static_cast<float>(rank));
      c->all_reduce_sum(v);
      for (float x : v)
        if (x != static_cast<float>(size * (size - 1) / 2)) return kExitWrongResult;
      std::vector<std::vector<float>> inputs;
      for (int r = 0; r < size; ++r) inputs.push_back(testing::rank_data(r, kN, 5));
      std::vector<float> mine = inputs[static_cast<size_t>(rank)];
      c->all_reduce_sum(mine);
      std::vector<float> want = testing::ring_sum(inputs);
      if (std::memcmp(mine.data(), want.data(), want.size() * sizeof(float)) != 0) return kExitWrongResult;
      return kExitOk;
    }
    if (mode == "loop") {
      std::vector<float> v(1000, 1.0f);
      for (;;) {
        c->all_reduce_sum(v);
        std::this_thread::sleep_for(5ms);
      }
    }
    return kExitOtherError;
  } catch (const CollectiveError& e) {
    std::fprintf(stderr, "worker rank %d: %s\n", rank, e.what());
    return kExitCollectiveError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "worker rank %d: other error: %s\n", rank, e.what());
    return kExitOtherError;
  }
}

// Runs before main() in the re-executed child; a no-op in the test process itself.
const int worker_hook = [] {
  const char* spec = std::getenv("GEOLOCO_TEST_GLOO_WORKER");
  if (spec == nullptr) return 0;
  std::fflush(stdout);
  ::_exit(run_worker(spec));
}();

pid_t spawn_worker(const std::string& spec) {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("GEOLOCO_TEST_GLOO_WORKER", spec.c_str(), 1);
    char* argv[] = {const_cast<char*>("test_parallel_worker"), nullptr};
    ::execv("/proc/self/exe", argv);
    ::_exit(127);
  }
  return pid;
}

// Waits for pid up to `limit`; returns the raw status, or -1 (after SIGKILL) on timeout.
int wait_with_limit(pid_t pid, std::chrono::milliseconds limit) {
  auto deadline = Clock::now() + limit;
  int status = 0;
  while (Clock::now() < deadline) {
    if (::waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(10ms);
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return -1;
}

TEST(GlooProcesses, AllReduceAcrossProcessesIsExactAndBitIdentical) {
  const int P = 3;
  const int port = test::fresh_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < P; ++r) pids.push_back(spawn_worker(fmt::format("allreduce {} {} {}", r, P, port)));
  for (int r = 0; r < P; ++r) {
    int st = wait_with_limit(pids[static_cast<size_t>(r)], 20s);
    ASSERT_NE(st, -1) << "rank " << r << " hung";
    ASSERT_TRUE(WIFEXITED(st)) << "rank " << r;
    EXPECT_EQ(WEXITSTATUS(st), kExitOk) << "rank " << r;
  }
}

TEST(GlooProcesses, KilledPeerGivesTheOthersAnErrorWithinABound) {
  const int P = 3;
  const int port = test::fresh_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < P; ++r) pids.push_back(spawn_worker(fmt::format("loop {} {} {}", r, P, port)));
  std::this_thread::sleep_for(1500ms);  // let them connect and run a few rounds
  // All still running (none failed early).
  for (pid_t p : pids) {
    int st = 0;
    ASSERT_EQ(::waitpid(p, &st, WNOHANG), 0) << "a worker exited early with status " << st;
  }
  ::kill(pids[1], SIGKILL);
  int st1 = 0;
  ::waitpid(pids[1], &st1, 0);
  const auto t0 = Clock::now();
  for (int r : {0, 2}) {
    int st = wait_with_limit(pids[static_cast<size_t>(r)], 10s);
    ASSERT_NE(st, -1) << "rank " << r << " did not notice the dead peer";
    ASSERT_TRUE(WIFEXITED(st)) << "rank " << r << " died by signal " << (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    EXPECT_EQ(WEXITSTATUS(st), kExitCollectiveError) << "rank " << r;
  }
  // The group timeout is 3 s; a closed socket is normally seen at once.
  EXPECT_LT(Clock::now() - t0, 6s);
}

}  // namespace
}  // namespace geoloco::parallel
