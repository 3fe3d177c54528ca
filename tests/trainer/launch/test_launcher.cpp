// Launcher tests with small /bin/sh children (no dependency on the geoloco binary).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fcntl.h>

#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "tests/support/temp_dir.hpp"
#include "core/error.hpp"
#include "trainer/launch/launcher.hpp"

namespace geoloco::launch {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

ProcessSpec sh(const std::string& label, const std::string& script) {
  return {label, {"/bin/sh", "-c", script}, {}, "", {}};
}

std::string read_all(FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) s.append(buf, n);
  return s;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string l;
  while (std::getline(in, l)) out.push_back(l);
  return out;
}

// A process is gone when it no longer exists, or is a zombie awaiting init after we
// killed it (a grandchild reparented away from us).
bool process_dead(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string content((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  auto close = content.rfind(')');
  return close != std::string::npos && close + 2 < content.size() && content[close + 2] == 'Z';
}

// Strict: the process no longer exists at all (killed and reaped).
bool gone(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

bool wait_dead(pid_t pid, std::chrono::milliseconds limit) {
  auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (process_dead(pid)) return true;
    std::this_thread::sleep_for(10ms);
  }
  return process_dead(pid);
}

// Every "<word> <pid>" the children printed, e.g. "pid 123", "bg 456".
std::vector<pid_t> printed_pids(const std::string& out) {
  std::vector<pid_t> pids;
  std::regex re(R"(\] (pid|bg) (\d+))");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it)
    pids.push_back(static_cast<pid_t>(std::stoi((*it)[2])));
  return pids;
}

struct Captured {
  FILE* out = std::tmpfile();
  FILE* err = std::tmpfile();
  ~Captured() {
    std::fclose(out);
    std::fclose(err);
  }
  LaunchOptions options(std::chrono::milliseconds grace = 2s) const {
    LaunchOptions o;
    o.out_fd = fileno(out);
    o.err_fd = fileno(err);
    o.grace = grace;
    return o;
  }
};

TEST(Launcher, NormalExitPrefixesEveryLine) {
  Captured cap;
  std::vector<ProcessSpec> procs = {
      sh("paris/0", "echo one; echo two; echo oops >&2; printf partial"),
      sh("paris/1", "echo \"site=$GEOLOCO_SITE rank=$GEOLOCO_RANK\""),
  };
  procs[1].env = {{"GEOLOCO_SITE", "paris"}, {"GEOLOCO_RANK", "1"}};
  EXPECT_EQ(launch(procs, cap.options()), kExitOk);
  auto out = lines_of(read_all(cap.out));
  auto err = lines_of(read_all(cap.err));
  std::vector<std::string> p0, p1;
  for (auto& l : out) (l.rfind("[paris/0] ", 0) == 0 ? p0 : p1).push_back(l);
  EXPECT_EQ(p0, (std::vector<std::string>{"[paris/0] one", "[paris/0] two", "[paris/0] partial"}));
  EXPECT_EQ(p1, (std::vector<std::string>{"[paris/1] site=paris rank=1"}));
  EXPECT_EQ(err, (std::vector<std::string>{"[paris/0] oops"}));
}

TEST(Launcher, ConcurrentOutputNeverInterleavesMidLine) {
  Captured cap;
  const int kLines = 3000;
  std::vector<ProcessSpec> procs;
  for (int r = 0; r < 3; ++r)
    procs.push_back(sh("s/" + std::to_string(r),
                       "i=0; while [ $i -lt " + std::to_string(kLines) +
                           " ]; do echo \"line $i xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"; "
                           "i=$((i+1)); done"));
  EXPECT_EQ(launch(procs, cap.options()), kExitOk);
  std::map<std::string, int> next;  // per label: the next line number expected
  std::regex re(R"(\[(s/\d)\] line (\d+) x+)");
  for (const auto& l : lines_of(read_all(cap.out))) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(l, m, re)) << "malformed line: " << l;
    ASSERT_EQ(std::stoi(m[2]), next[m[1]]) << l;  // and in order per rank
    next[m[1]]++;
  }
  for (int r = 0; r < 3; ++r) EXPECT_EQ(next["s/" + std::to_string(r)], kLines);
}

TEST(Launcher, FailingRankStopsAllWithinABound) {
  Captured cap;
  std::vector<ProcessSpec> procs = {
      sh("paris/0", "echo pid $$; sleep 100 & echo bg $!; wait"),
      sh("paris/1", "echo pid $$; sleep 0.3; echo bye; exit 3"),
      sh("tokyo/0", "echo pid $$; sleep 100 & echo bg $!; wait"),
  };
  auto t0 = Clock::now();
  EXPECT_EQ(launch(procs, cap.options(5s)), kExitRankFailed);
  auto took = Clock::now() - t0;
  EXPECT_LT(took, 3s);  // well inside the 5 s grace: SIGTERM is enough for sh + sleep
  std::string out = read_all(cap.out), err = read_all(cap.err);
  EXPECT_NE(err.find("[launch] rank paris/1 exited with code 3; stopping 2 other ranks"), std::string::npos) << err;
  // The failed rank's last line comes before the launcher's message about it.
  EXPECT_NE(out.find("[paris/1] bye"), std::string::npos);
  auto pids = printed_pids(out);
  ASSERT_EQ(pids.size(), 5u) << out;
  for (pid_t p : pids) {
    // Strict: gone, not even a zombie (the launcher reaped its ranks and their helpers).
    EXPECT_TRUE(gone(p)) << "pid " << p << " survived or was not reaped";
    int st;
    EXPECT_EQ(::waitpid(p, &st, WNOHANG), -1) << "pid " << p << " left unreaped";  // ECHILD: reaped already
  }
}

ProcessSpec in_group(ProcessSpec p, const std::string& g, const std::string& restart_script = "") {
  p.group = g;
  if (!restart_script.empty()) p.restart_argv = {"/bin/sh", "-c", restart_script};
  return p;
}

// Waits (in the shell) until `path` exists: children that must act in a given order wait for
// each other's files, not for sleeps that race.
std::string wait_for(const std::string& path) { return "while [ ! -e " + path + " ]; do sleep 0.01; done; "; }

// A site is one failure domain: paris/1 fails, so paris/0 is stopped (SIGTERM to its group
// alone), while tokyo, which waits until paris/0 got that SIGTERM, finishes its work; the
// launch succeeds because a site finished whole. (The policy's cases: test_supervisor.cpp.)
TEST(Launcher, IsolatedGroupsAFailedRankTakesOnlyItsSiteDown) {
  const geoloco::test::TempDir tmp("geoloco-launch-test");
  const std::string ready = tmp.file("paris0-ready"), stopped = tmp.file("paris0-stopped");
  Captured cap;
  std::vector<ProcessSpec> procs = {
      in_group(sh("paris/0", "trap 'touch " + stopped + "; exit 143' TERM; touch " + ready +
                                 "; echo pid $$; sleep 100 & echo bg $!; wait"),
               "paris"),
      in_group(sh("paris/1", wait_for(ready) + "exit 3"), "paris"),
      in_group(sh("tokyo/0", wait_for(stopped) + "echo done"), "tokyo"),
  };
  LaunchOptions o = cap.options(5s);
  o.isolate_groups = true;
  EXPECT_EQ(launch(procs, o), kExitOk);
  std::string out = read_all(cap.out), err = read_all(cap.err);
  EXPECT_NE(err.find("[launch] rank paris/1 exited with code 3; site paris leaves the run: stopping its 1 other "
                     "rank; 1 rank of other sites go on"),
            std::string::npos)
      << err;
  EXPECT_NE(out.find("[tokyo/0] done"), std::string::npos) << out;  // not stopped
  for (pid_t p : printed_pids(out)) EXPECT_TRUE(gone(p)) << "pid " << p;
}

// A failed site comes back: once both of paris's ranks are down (paris/1 failed, paris/0 was
// stopped), both start again with their restart commands after the backoff; the restarted
// site finishes, and tokyo, which waits for the restarted ranks' files, is never touched.
TEST(Launcher, AFailedGroupIsRestartedWithItsRestartCommand) {
  const geoloco::test::TempDir tmp("geoloco-launch-test");
  const std::string again0 = tmp.file("again0"), again1 = tmp.file("again1");
  Captured cap;
  std::vector<ProcessSpec> procs = {
      in_group(sh("paris/0", "echo pid $$; sleep 100"), "paris", "echo again 0 $GEOLOCO_SITE; touch " + again0),
      in_group(sh("paris/1", "exit 3"), "paris", "echo again 1; touch " + again1),
      in_group(sh("tokyo/0", wait_for(again0) + wait_for(again1) + "echo done"), "tokyo", "echo tokyo restarted"),
  };
  procs[0].env = {{"GEOLOCO_SITE", "paris"}};  // a restart keeps its environment
  LaunchOptions o = cap.options(1s);
  o.isolate_groups = true;
  o.max_restarts = 2;
  o.restart_backoff = 100ms;
  EXPECT_EQ(launch(procs, o), kExitOk);
  std::string out = read_all(cap.out), err = read_all(cap.err);
  EXPECT_NE(err.find("[launch] site paris: every rank is down; restart 1 of 2 in 0.1 s"), std::string::npos) << err;
  EXPECT_NE(err.find("[launch] site paris: restart 1 of 2: starting its 2 ranks again"), std::string::npos) << err;
  EXPECT_NE(out.find("[paris/0] again 0 paris"), std::string::npos) << out;
  EXPECT_NE(out.find("[paris/1] again 1"), std::string::npos) << out;
  EXPECT_NE(out.find("[tokyo/0] done"), std::string::npos) << out;
  EXPECT_EQ(out.find("tokyo restarted"), std::string::npos) << out;
  EXPECT_EQ(err.find("restart 2 of 2"), std::string::npos) << err;  // the restarted site finished
  for (pid_t p : printed_pids(out)) EXPECT_TRUE(gone(p)) << "pid " << p;
}

// The status view: each child gets the status pipe as fd 3 (GEOLOCO_STATUS_FD=3), its reports
// reach the block drawn on out_fd, and its lines are printed above the block.
TEST(Launcher, StatusReportsOnFdThreeReachTheStatusBlock) {
  Captured cap;
  std::vector<ProcessSpec> procs = {
      sh("paris/0",
         "echo \"fd=$GEOLOCO_STATUS_FD\"; "
         "printf '{\"site\":\"paris\",\"step\":3,\"steps\":10,\"done\":true}\\n' >&3; echo oops >&2"),
  };
  LaunchOptions o = cap.options();
  o.status_sites = {"paris"};
  EXPECT_EQ(launch(procs, o), kExitOk);
  const std::string out = read_all(cap.out);
  EXPECT_NE(out.find("[paris/0] fd=3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("[paris/0] oops\n"), std::string::npos) << out;  // stderr goes above the block too
  EXPECT_NE(out.find("paris  step 3/10"), std::string::npos) << out;
  EXPECT_EQ(read_all(cap.err), "");
}

TEST(Launcher, KilledRankIsReportedWithItsSignal) {
  Captured cap;
  std::vector<ProcessSpec> procs = {
      sh("a/0", "echo pid $$; sleep 0.2; kill -9 $$"),
      sh("a/1", "echo pid $$; exec sleep 100"),
  };
  auto t0 = Clock::now();
  EXPECT_EQ(launch(procs, cap.options(5s)), kExitRankFailed);
  EXPECT_LT(Clock::now() - t0, 3s);
  std::string err = read_all(cap.err);
  EXPECT_NE(err.find("[launch] rank a/0 was killed by signal 9 (SIGKILL: Killed); stopping 1 other rank"),
            std::string::npos)
      << err;
  for (pid_t p : printed_pids(read_all(cap.out))) EXPECT_TRUE(gone(p)) << p;
}

TEST(Launcher, RankIgnoringSigtermIsKilledAfterGrace) {
  Captured cap;
  std::vector<ProcessSpec> procs = {
      sh("a/0", "trap '' TERM; echo pid $$; exec sleep 100"),
      sh("a/1", "sleep 0.2; exit 1"),
  };
  auto t0 = Clock::now();
  EXPECT_EQ(launch(procs, cap.options(400ms)), kExitRankFailed);
  auto took = Clock::now() - t0;
  EXPECT_GE(took, 550ms);  // 0.2 s + 0.4 s grace (minus scheduling slack)
  EXPECT_LT(took, 3s);
  std::string err = read_all(cap.err);
  EXPECT_NE(err.find("1 rank still running after 400 ms; sending SIGKILL"), std::string::npos) << err;
  for (pid_t p : printed_pids(read_all(cap.out))) EXPECT_TRUE(gone(p)) << p;
}

TEST(Launcher, CommandThatCannotStartStopsTheOthers) {
  Captured cap;
  std::vector<ProcessSpec> procs = {
      sh("a/0", "echo pid $$; exec sleep 100"),
      {"a/1", {"/nonexistent/geoloco-worker", "--rank", "1"}, {}, "", {}},
      sh("a/2", "echo never"),
  };
  auto t0 = Clock::now();
  EXPECT_EQ(launch(procs, cap.options()), kExitRankFailed);
  EXPECT_LT(Clock::now() - t0, 3s);
  std::string err = read_all(cap.err), out = read_all(cap.out);
  EXPECT_NE(err.find("[launch] rank a/1 could not be started: exec '/nonexistent/geoloco-worker': No such file or "
                     "directory; stopping 1 other rank"),
            std::string::npos)
      << err;
  EXPECT_EQ(out.find("never"), std::string::npos);  // a/2 was never started
  for (pid_t p : printed_pids(out)) EXPECT_TRUE(gone(p)) << p;
}

TEST(Launcher, RejectsBadInput) {
  {
    LaunchOptions o;
    o.max_restarts = -1;
    EXPECT_THROW(launch({sh("a", "true")}, o), InputError);
    o.max_restarts = 1;
    o.restart_backoff = -1ms;
    EXPECT_THROW(launch({sh("a", "true")}, o), InputError);
  }
  EXPECT_THROW(launch({}), InputError);
  EXPECT_THROW(launch({{"a/0", {}, {}, "", {}}}), InputError);
  EXPECT_THROW(launch({sh("a/0", "true"), sh("a/0", "true")}), InputError);
}

// Runs launch() in a forked helper (so the signal goes to it alone), signals it once its
// children are up, and checks the helper's exit code and that every child is gone.
class LauncherSignal : public ::testing::TestWithParam<int> {};

TEST_P(LauncherSignal, StopsEveryRankAndReturnsTheDocumentedCode) {
  const int sig = GetParam();
  const geoloco::test::TempDir tmp("geoloco-launch-test");
  const std::string dir = tmp.str();
  pid_t helper = ::fork();
  if (helper == 0) {
    std::vector<ProcessSpec> procs;
    for (int r = 0; r < 3; ++r)
      procs.push_back(sh("x/" + std::to_string(r), "echo $$ > " + dir + "/" + std::to_string(r) + ".tmp && mv " + dir +
                                                       "/" + std::to_string(r) + ".tmp " + dir + "/" +
                                                       std::to_string(r) + "; exec sleep 100"));
    LaunchOptions o;
    o.grace = 2s;
    o.out_fd = o.err_fd = ::open("/dev/null", O_WRONLY);
    ::_exit(launch(procs, o));
  }
  std::vector<pid_t> kids;
  auto deadline = Clock::now() + 5s;
  for (int r = 0; r < 3; ++r) {
    std::string path = dir + "/" + std::to_string(r);
    std::ifstream f;
    while (Clock::now() < deadline) {
      f.open(path);
      if (f) break;
      std::this_thread::sleep_for(10ms);
    }
    pid_t p = 0;
    ASSERT_TRUE(f >> p) << "child " << r << " never started";
    kids.push_back(p);
  }
  auto t0 = Clock::now();
  ::kill(helper, sig);
  int st = 0;
  while (::waitpid(helper, &st, WNOHANG) == 0 && Clock::now() - t0 < 5s) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(WIFEXITED(st)) << "launcher did not exit in time";
  EXPECT_EQ(WEXITSTATUS(st), sig == SIGINT ? kExitInterrupted : kExitTerminated);
  EXPECT_LT(Clock::now() - t0, 3s);
  // The launcher reaped them before exiting: gone at once, not even zombies.
  for (pid_t p : kids) EXPECT_TRUE(gone(p)) << "child " << p << " survived the launcher";
}

INSTANTIATE_TEST_SUITE_P(Signals, LauncherSignal, ::testing::Values(SIGTERM, SIGINT),
                         [](const auto& info) { return info.param == SIGINT ? std::string("SIGINT") : "SIGTERM"; });

TEST(Launcher, SecondSignalSkipsTheGrace) {
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t helper = ::fork();
  if (helper == 0) {
    ::close(ready[0]);
    ::dup2(ready[1], 3);
    // The rank ignores SIGTERM; only SIGKILL stops it. The grace is far beyond the bound.
    std::vector<ProcessSpec> procs = {sh("t/0", "trap '' TERM; echo $$ >&3; exec sleep 100")};
    LaunchOptions o;
    o.grace = 30s;
    o.out_fd = o.err_fd = ::open("/dev/null", O_WRONLY);
    ::_exit(launch(procs, o));
  }
  ::close(ready[1]);
  FILE* in = ::fdopen(ready[0], "r");
  int kid = 0;
  ASSERT_EQ(std::fscanf(in, "%d", &kid), 1);
  std::fclose(in);
  auto t0 = Clock::now();
  ::kill(helper, SIGTERM);
  std::this_thread::sleep_for(200ms);
  ::kill(helper, SIGTERM);
  int st = 0;
  while (::waitpid(helper, &st, WNOHANG) == 0 && Clock::now() - t0 < 5s) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(WIFEXITED(st)) << "launcher still waiting for the grace period";
  EXPECT_EQ(WEXITSTATUS(st), kExitTerminated);
  EXPECT_LT(Clock::now() - t0, 3s);
  EXPECT_TRUE(gone(kid));
}

TEST(Launcher, RanksDieWhenTheLauncherIsKilled) {
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t helper = ::fork();
  if (helper == 0) {
    ::close(ready[0]);
    std::vector<ProcessSpec> procs = {sh("k/0", "echo $$ >&3; exec sleep 100"),
                                      sh("k/1", "echo $$ >&3; exec sleep 100")};
    // Hand the children the pipe as fd 3 so they can report their pids.
    ::dup2(ready[1], 3);
    LaunchOptions o;
    o.out_fd = o.err_fd = ::open("/dev/null", O_WRONLY);
    ::_exit(launch(procs, o));
  }
  ::close(ready[1]);
  FILE* in = ::fdopen(ready[0], "r");
  std::vector<pid_t> kids;
  for (int i = 0; i < 2; ++i) {
    int p = 0;
    ASSERT_EQ(std::fscanf(in, "%d", &p), 1);
    kids.push_back(p);
  }
  std::fclose(in);
  ::kill(helper, SIGKILL);
  int st = 0;
  ::waitpid(helper, &st, 0);
  for (pid_t p : kids) EXPECT_TRUE(wait_dead(p, 2s)) << "child " << p << " outlived a SIGKILLed launcher";
}

}  // namespace
}  // namespace geoloco::launch
