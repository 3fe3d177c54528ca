// geoloco::spawn and run_capture with real programs (/bin/sh, cat, sleep). Most tests run
// twice: without a parent-death signal (posix_spawn) and with one (fork + exec), the two ways
// spawn() starts a child, which must give it the same things.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "core/error.hpp"
#include "core/subprocess.hpp"

namespace geoloco {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Everything until EOF (the descriptors spawn() hands out are non-blocking).
std::string read_to_end(Fd& fd) {
  std::string s;
  char buf[4096];
  while (fd) {
    pollfd p{fd.get(), POLLIN, 0};
    if (::poll(&p, 1, 10000) <= 0) break;
    const ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n > 0) {
      s.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EAGAIN) {
      fd.reset();
    }
  }
  return s;
}

bool gone(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

// A line of /proc/<pid>/status, e.g. "SigIgn", as the hex mask it holds.
uint64_t status_mask(const std::string& status, const std::string& field) {
  std::istringstream in(status);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1), nullptr, 16);
  ADD_FAILURE() << "no " << field << " in " << status;
  return 0;
}

uint64_t bit(int sig) { return uint64_t{1} << (sig - 1); }

class Spawn : public ::testing::TestWithParam<int> {
 protected:
  SpawnOptions with(std::vector<std::string> argv) const {
    SpawnOptions o;
    o.argv = std::move(argv);
    o.parent_death_signal = GetParam();
    return o;
  }
};

TEST_P(Spawn, PipesEnvironmentAndExitCode) {
  ::setenv("GEOLOCO_TEST_KEPT", "kept", 1);
  ::setenv("GEOLOCO_TEST_REPLACED", "old", 1);
  SpawnOptions o = with({"/bin/sh", "-c",
                         "echo \"$GEOLOCO_TEST_KEPT $GEOLOCO_TEST_REPLACED $GEOLOCO_TEST_ADDED\"; env | grep -c "
                         "'^GEOLOCO_TEST_REPLACED='; echo to-stderr >&2; exit 3"});
  o.env = {{"GEOLOCO_TEST_REPLACED", "new"}, {"GEOLOCO_TEST_ADDED", "added"}};
  o.out = o.err = Stdio::kPipe;
  Subprocess p = spawn(o);
  EXPECT_GT(p.pid(), 0);
  EXPECT_FALSE(p.in().valid()) << "stdin was not asked for as a pipe";
  EXPECT_EQ(read_to_end(p.out()), "kept new added\n1\n");  // replaced, not doubled
  EXPECT_EQ(read_to_end(p.err()), "to-stderr\n");
  EXPECT_EQ(p.wait(), (ExitStatus{3, 0}));
  EXPECT_EQ(p.wait(), (ExitStatus{3, 0})) << "the status again, not a second waitpid";
  EXPECT_EQ(p.wait().describe(), "exited with code 3");
  ::unsetenv("GEOLOCO_TEST_KEPT");
  ::unsetenv("GEOLOCO_TEST_REPLACED");
}

TEST_P(Spawn, StdinFromAPipeOrDevNull) {
  SpawnOptions o = with({"cat"});
  o.in = o.out = Stdio::kPipe;
  Subprocess p = spawn(o);
  ASSERT_EQ(write_all(p.in().get(), "hello\n", 6), 0);
  p.in().reset();
  EXPECT_EQ(read_to_end(p.out()), "hello\n");
  EXPECT_TRUE(p.wait().ok());
  o.in = Stdio::kNull;
  Subprocess q = spawn(o);
  EXPECT_EQ(read_to_end(q.out()), "");
  EXPECT_TRUE(q.wait().ok());
}

TEST_P(Spawn, AProgramThatCannotBeExecutedIsASpawnErrorNamingIt) {
  try {
    spawn(with({"/nonexistent/geoloco-prog", "x"}));
    ADD_FAILURE() << "no error";
  } catch (const SpawnError& e) {
    EXPECT_STREQ(e.what(), "exec '/nonexistent/geoloco-prog': No such file or directory");
    EXPECT_EQ(e.program(), "/nonexistent/geoloco-prog");
    EXPECT_EQ(e.error(), ENOENT);
  }
  char dir[] = "/tmp/geoloco-spawn-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string plain = std::string(dir) + "/not-executable";
  std::ofstream(plain) << "#!/bin/sh\necho no\n";
  EXPECT_THROW(
      {
        try {
          spawn(with({plain}));
        } catch (const SpawnError& e) {
          EXPECT_EQ(e.error(), EACCES) << e.what();
          throw;
        }
      },
      SpawnError);
  ::unlink(plain.c_str());
  ::rmdir(dir);
  // The child that could not exec was reaped: none is left to wait for.
  int st = 0;
  EXPECT_EQ(::waitpid(-1, &st, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

TEST_P(Spawn, AnExtraPipeOnTheDescriptorAskedFor) {
  for (const int fd : {3, 7}) {
    SpawnOptions o = with({"/bin/sh", "-c", "echo report >&" + std::to_string(fd) + "; echo out"});
    o.out = Stdio::kPipe;
    o.extra_fd = fd;
    Subprocess p = spawn(o);
    EXPECT_EQ(read_to_end(p.extra()), "report\n") << "fd " << fd;
    EXPECT_EQ(read_to_end(p.out()), "out\n");
    EXPECT_TRUE(p.wait().ok());
  }
}

TEST_P(Spawn, ItsOwnProcessGroupAndSignalsToTheWholeGroup) {
  // Field 5 of /proc/<pid>/stat is the process group.
  const std::string script = "read -r a b c d pgrp rest < /proc/$$/stat; echo $pgrp; sleep 100 & echo $!; wait";
  SpawnOptions o = with({"/bin/sh", "-c", script});
  o.out = Stdio::kPipe;
  o.own_process_group = true;
  Subprocess p = spawn(o);
  std::string first;
  char c;
  pid_t pgrp = 0, bg = 0;
  // Two lines: its group, and its background sleep.
  for (int lines = 0; lines < 2;) {
    pollfd pf{p.out().get(), POLLIN, 0};
    ASSERT_GT(::poll(&pf, 1, 10000), 0);
    while (::read(p.out().get(), &c, 1) == 1) {
      if (c != '\n') {
        first += c;
        continue;
      }
      (lines == 0 ? pgrp : bg) = static_cast<pid_t>(std::stoi(first));
      first.clear();
      ++lines;
    }
  }
  EXPECT_EQ(pgrp, p.pid());
  EXPECT_FALSE(p.peek_exit());
  p.signal(SIGTERM);
  EXPECT_EQ(p.wait(), (ExitStatus{0, SIGTERM}));
  EXPECT_EQ(p.wait().describe(), "was killed by signal 15 (SIGTERM: Terminated)");
  // The background sleep was in the group: it got the SIGTERM too (reaped by init, or a
  // zombie waiting for it; either way it does not run).
  const auto deadline = Clock::now() + 5s;
  auto dead = [&] {
    std::ifstream stat("/proc/" + std::to_string(bg) + "/stat");
    std::string s((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const auto close = s.rfind(')');
    return gone(bg) || (close != std::string::npos && s.size() > close + 2 && s[close + 2] == 'Z');
  };
  while (!dead() && Clock::now() < deadline) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(dead()) << "the group's other process " << bg << " survived";

  SpawnOptions same = with({"/bin/sh", "-c", "read -r a b c d pgrp rest < /proc/$$/stat; echo $pgrp"});
  same.out = Stdio::kPipe;
  Subprocess q = spawn(same);
  EXPECT_EQ(read_to_end(q.out()), std::to_string(::getpgrp()) + "\n") << "without own_process_group: ours";
  q.wait();
}

// A parent that ignores SIGPIPE (the launcher does) or handles SIGTERM does not hand that on;
// the caller's signal mask is.
TEST_P(Spawn, DefaultSignalActionsAndTheCallersMask) {
  struct sigaction ign {
  }, old_pipe{}, old_hup{};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  ::sigaction(SIGPIPE, &ign, &old_pipe);
  ::sigaction(SIGHUP, &ign, &old_hup);
  sigset_t usr1, old_mask;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  ::pthread_sigmask(SIG_BLOCK, &usr1, &old_mask);
  sigset_t caller;
  ::pthread_sigmask(SIG_BLOCK, nullptr, &caller);
  uint64_t caller_bits = 0;  // the standard signals only: glibc keeps some real-time ones to itself
  for (int sig = 1; sig < 32; ++sig)
    if (sigismember(&caller, sig)) caller_bits |= bit(sig);
  SpawnOptions o = with({"cat", "/proc/self/status"});
  o.out = Stdio::kPipe;
  Subprocess p = spawn(o);
  const std::string status = read_to_end(p.out());
  p.wait();
  ::pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  ::sigaction(SIGPIPE, &old_pipe, nullptr);
  ::sigaction(SIGHUP, &old_hup, nullptr);
  EXPECT_EQ(status_mask(status, "SigIgn") & (bit(SIGPIPE) | bit(SIGHUP)), 0u) << status;
  EXPECT_EQ(status_mask(status, "SigBlk") & 0xffffffffu, caller_bits) << status;
  EXPECT_NE(caller_bits & bit(SIGUSR1), 0u);
}

TEST_P(Spawn, LettingGoOfARunningChildKillsAndReapsIt) {
  pid_t pid = 0;
  {
    Subprocess p = spawn(with({"sleep", "100"}));
    pid = p.pid();
    EXPECT_TRUE(p.running());
    Subprocess moved = std::move(p);
    EXPECT_FALSE(p.running());
    EXPECT_EQ(moved.pid(), pid);
  }
  EXPECT_TRUE(gone(pid)) << "killed and reaped, not even a zombie";
  // Move-assigning over a running child does the same to it.
  Subprocess a = spawn(with({"sleep", "100"}));
  const pid_t first = a.pid();
  a = spawn(with({"true"}));
  EXPECT_TRUE(gone(first));
  EXPECT_TRUE(a.wait().ok());
}

TEST_P(Spawn, PeekingAtTheExitDoesNotReap) {
  Subprocess p = spawn(with({"/bin/sh", "-c", "exit 4"}));
  const auto deadline = Clock::now() + 10s;
  std::optional<ExitStatus> seen;
  while (!(seen = p.peek_exit()) && Clock::now() < deadline) std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(seen);
  EXPECT_EQ(*seen, (ExitStatus{4, 0}));
  EXPECT_FALSE(gone(p.pid())) << "a zombie until wait(): its pid cannot be reused yet";
  EXPECT_EQ(p.wait(), (ExitStatus{4, 0}));
  EXPECT_TRUE(gone(p.pid()));
  EXPECT_FALSE(p.peek_exit());
}

INSTANTIATE_TEST_SUITE_P(BothWays, Spawn, ::testing::Values(0, SIGKILL),
                         [](const auto& info) { return info.param == 0 ? "PosixSpawn" : "ForkWithDeathSignal"; });

TEST(Spawn, RejectsAnEmptyCommandAndAnExtraFdOverStdio) {
  EXPECT_THROW(spawn(SpawnOptions{}), InputError);
  SpawnOptions o;
  o.argv = {"true"};
  o.extra_fd = 2;
  EXPECT_THROW(spawn(o), InputError);
}

// The parent-death signal: a SIGKILLed parent takes its child with it.
TEST(Spawn, TheChildDiesWithItsParent) {
  int report[2];
  ASSERT_EQ(::pipe(report), 0);
  const pid_t parent = ::fork();
  if (parent == 0) {
    ::close(report[0]);
    SpawnOptions o;
    o.argv = {"sleep", "100"};
    o.parent_death_signal = SIGKILL;
    Subprocess p = spawn(o);
    const pid_t pid = p.pid();
    (void)!::write(report[1], &pid, sizeof(pid));
    ::pause();
    ::_exit(0);
  }
  ::close(report[1]);
  pid_t child = 0;
  ASSERT_EQ(::read(report[0], &child, sizeof(child)), static_cast<ssize_t>(sizeof(child)));
  ::close(report[0]);
  ::kill(parent, SIGKILL);
  int st = 0;
  ::waitpid(parent, &st, 0);
  const auto deadline = Clock::now() + 5s;
  while (!gone(child) && Clock::now() < deadline) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(gone(child)) << "sleep " << child << " outlived its SIGKILLed parent";
}

TEST(RunCapture, OutputErrorsAndStatus) {
  const Captured c = run_capture({"/bin/sh", "-c", "echo out; echo err >&2; exit 5"});
  EXPECT_EQ(c.out, "out\n");
  EXPECT_EQ(c.err, "err\n");
  EXPECT_EQ(c.status, (ExitStatus{5, 0}));
  const Captured k = run_capture({"/bin/sh", "-c", "kill -9 $$"});
  EXPECT_EQ(k.status, (ExitStatus{0, SIGKILL}));
  EXPECT_THROW(run_capture({"/nonexistent/geoloco-prog"}), SpawnError);
}

TEST(RunCapture, TheDeadlineHoldsWhileItPrintsAndAfterItClosesItsOutput) {
  for (const std::string script : {"echo started; sleep 100", "exec >&- 2>&-; sleep 100"}) {
    const auto t0 = Clock::now();
    try {
      run_capture({"/bin/sh", "-c", script}, {.timeout = 300ms});
      ADD_FAILURE() << script << ": no error";
    } catch (const CaptureError& e) {
      EXPECT_EQ(e.why(), CaptureError::Why::kDeadline);
      EXPECT_STREQ(e.what(), "'/bin/sh': no complete answer within 0.3 s");
    }
    const auto took = Clock::now() - t0;
    EXPECT_GE(took, 300ms) << script;
    EXPECT_LT(took, 5s) << script << ": the sleep was not waited for";
  }
}

TEST(RunCapture, OutputBeyondTheLimitStopsIt) {
  try {
    run_capture({"yes"}, {.timeout = 10s, .max_output = 10000});
    ADD_FAILURE() << "no error";
  } catch (const CaptureError& e) {
    EXPECT_EQ(e.why(), CaptureError::Why::kTooMuchOutput);
    EXPECT_STREQ(e.what(), "'yes': more than 10000 bytes on stdout");
  }
}

}  // namespace
}  // namespace geoloco
