// The delay line's netfilter life cycle, in-process: bind, run for a bounded time, write
// stats; and the failure path of a queue that is already taken. Needs root (CAP_NET_ADMIN);
// uses a high queue number in the test's own network namespace (unshare) so nothing else on
// the machine can be affected.
#include <gtest/gtest.h>

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/support/temp_dir.hpp"
#include "tools/wan/delayline.hpp"
#include "core/error.hpp"

namespace geoloco::wan {
namespace {

TEST(WanDelayline, BindsRunsAndWritesStats) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (NFQUEUE bind requires CAP_NET_ADMIN)";
  // Run the whole test body in a child with its own network namespace.
  const geoloco::test::TempDir tmp("wan-dl");
  const std::filesystem::path& dir = tmp.path();
  const std::string stats = (dir / "stats.json").string();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (unshare(CLONE_NEWNET) != 0) _exit(10);
    DelaylineOptions o;
    o.queue = 65123;
    o.delay_ms = 5;
    o.jitter_ms = 1;
    o.loss_pct = 1;
    o.seed = 9;
    o.stats_file = stats;
    o.ready_file = (dir / "ready").string();
    o.duration_s = 0.3;
    // A second listener on the same queue must fail to bind (the first holds it).
    auto first = std::async(std::launch::async, [o] { return run_delayline(o); });
    for (int i = 0; i < 100 && !std::filesystem::exists(o.ready_file); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    int second_failed = 0;
    try {
      DelaylineOptions o2 = o;
      o2.stats_file.clear();
      o2.ready_file.clear();
      run_delayline(o2);
    } catch (const Error& e) {
      second_failed = std::string(e.what()).find("cannot bind NFQUEUE 65123") != std::string::npos ? 1 : 2;
    }
    const int rc = first.get();
    _exit(rc == 0 && second_failed == 1 ? 0 : 20 + second_failed);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 10) GTEST_SKIP() << "cannot create a network namespace here (unshare failed)";
  ASSERT_EQ(WEXITSTATUS(status), 0) << "20 = second bind succeeded, 22 = failed with another message";
  std::ifstream f(stats);
  ASSERT_TRUE(f.good()) << stats;
  const auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j["format"], "geoloco-wan-delayline-stats");
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["queue"], 65123);
  EXPECT_EQ(j["received"], 0);  // no rule feeds this queue
  EXPECT_EQ(j["dropped"], 0);
  EXPECT_EQ(j["seed"], 9);
}

TEST(WanDelayline, RejectsBadOptions) {
  DelaylineOptions o;
  o.delay_ms = 1;
  o.jitter_ms = 2;
  EXPECT_THROW(run_delayline(o), InputError);
  o.jitter_ms = 0;
  o.loss_pct = 100;
  EXPECT_THROW(run_delayline(o), InputError);
  o.loss_pct = 0;
  o.queue = 70000;
  EXPECT_THROW(run_delayline(o), InputError);
}

}  // namespace
}  // namespace geoloco::wan
