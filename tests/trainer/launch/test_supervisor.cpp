// The launcher's policy without processes or a clock: events and times made up, the actions
// compared whole (tests/launch/test_launcher.cpp proves the I/O that performs them).
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "trainer/launch/supervisor.hpp"

namespace geoloco::launch {
namespace {

using namespace std::chrono_literals;
using Lines = std::vector<std::string>;

Time at(std::chrono::milliseconds t) { return Time{} + t; }

std::string show(const Action& a) {
  switch (a.kind) {
    case Action::Kind::kStart: return (a.restart ? "restart " : "start ") + std::to_string(a.child);
    case Action::Kind::kSignal:
      return (a.signal == SIGTERM   ? "TERM "
              : a.signal == SIGKILL ? "KILL "
                                    : "signal " + std::to_string(a.signal) + " ") +
             std::to_string(a.child);
    case Action::Kind::kMessage: return a.text;
    case Action::Kind::kFinish: return "finish " + std::to_string(a.code);
  }
  return "?";
}

Lines show(const std::vector<Action>& actions) {
  Lines out;
  for (const auto& a : actions) out.push_back(show(a));
  return out;
}

ExitStatus code(int c) { return {c, 0}; }
ExitStatus killed(int sig) { return {0, sig}; }

SupervisorOptions options(bool isolate = false, int max_restarts = 0) {
  SupervisorOptions o;
  o.grace = 2s;
  o.isolate_groups = isolate;
  o.max_restarts = max_restarts;
  o.restart_backoff = 100ms;
  o.restart_backoff_max = 300ms;
  return o;
}

// Starts every child at t = 0, each start answered as asked; returns what came after the last.
Lines start_all(Supervisor& s) {
  auto actions = s.begin(at(0ms));
  for (;;) {
    if (actions.empty() || actions.back().kind != Action::Kind::kStart) return show(actions);
    EXPECT_EQ(actions.size(), 1u) << "a start comes alone";
    actions = s.started(actions.back().child, at(0ms));
  }
}

// Answers a (re)start sequence: every kStart with started(), the other actions collected.
Lines answer_starts(Supervisor& s, std::vector<Action> actions, Time now) {
  Lines out;
  while (!actions.empty()) {
    std::vector<Action> next;
    for (const auto& a : actions) {
      out.push_back(show(a));
      if (a.kind == Action::Kind::kStart) next = s.started(a.child, now);
    }
    actions = std::move(next);
  }
  return out;
}

std::vector<SupervisedChild> paris_paris_tokyo(bool restartable = false) {
  return {{"paris/0", "paris", restartable}, {"paris/1", "paris", restartable}, {"tokyo/0", "tokyo", restartable}};
}

TEST(Supervisor, StartsOneChildAtATimeAndFinishesWhenAllExitCleanly) {
  Supervisor s(paris_paris_tokyo(), options());
  auto a = s.begin(at(0ms));
  EXPECT_EQ(show(a), Lines{"start 0"});
  EXPECT_EQ(show(s.started(0, at(0ms))), Lines{"start 1"});
  EXPECT_EQ(show(s.started(1, at(0ms))), Lines{"start 2"});
  EXPECT_EQ(show(s.started(2, at(0ms))), Lines{});
  EXPECT_EQ(s.running(), 3u);
  EXPECT_FALSE(s.next_deadline());  // nothing is timed: only events move it
  EXPECT_EQ(show(s.exited(1, code(0), at(5ms))), Lines{});
  EXPECT_EQ(show(s.exited(0, code(0), at(6ms))), Lines{});
  EXPECT_FALSE(s.finished());
  EXPECT_EQ(show(s.exited(2, code(0), at(7ms))), Lines{"finish 0"});
  EXPECT_TRUE(s.finished());
  EXPECT_EQ(show(s.tick(at(10s))), Lines{});
}

TEST(Supervisor, TheFirstFailureStopsEveryOtherRankAndSigkillsAfterTheGrace) {
  Supervisor s(paris_paris_tokyo(), options());
  start_all(s);
  EXPECT_EQ(show(s.exited(1, code(3), at(300ms))),
            (Lines{"rank paris/1 exited with code 3; stopping 2 other ranks", "TERM 0", "TERM 2"}));
  EXPECT_EQ(s.next_deadline(), at(2300ms));
  // paris/0 goes at SIGTERM; its exit by that signal is no second failure.
  EXPECT_EQ(show(s.exited(0, killed(SIGTERM), at(310ms))), Lines{});
  EXPECT_EQ(show(s.tick(at(2299ms))), Lines{});
  EXPECT_EQ(show(s.tick(at(2300ms))), (Lines{"1 rank still running after 2000 ms; sending SIGKILL", "KILL 2"}));
  EXPECT_FALSE(s.next_deadline());
  EXPECT_EQ(show(s.tick(at(2400ms))), Lines{});  // said and sent once
  EXPECT_EQ(show(s.exited(2, killed(SIGKILL), at(2301ms))), Lines{"finish 1"});
}

TEST(Supervisor, ASignalledRankIsNamedWithItsSignal) {
  Supervisor s({{"a/0", "", false}, {"a/1", "", false}}, options());
  start_all(s);
  EXPECT_EQ(show(s.exited(0, killed(SIGKILL), at(1ms))),
            (Lines{"rank a/0 was killed by signal 9 (SIGKILL: Killed); stopping 1 other rank", "TERM 1"}));
  EXPECT_EQ(show(s.exited(1, code(0), at(2ms))), Lines{"finish 1"});  // a clean exit while stopping
}

// Groups are ignored without isolate_groups: a failure anywhere stops everything.
TEST(Supervisor, WithoutIsolationGroupsDoNotLimitTheStop) {
  Supervisor s(paris_paris_tokyo(true), options(false, 3));
  start_all(s);
  EXPECT_EQ(show(s.exited(2, code(1), at(1ms))),
            (Lines{"rank tokyo/0 exited with code 1; stopping 2 other ranks", "TERM 0", "TERM 1"}));
  s.exited(0, killed(SIGTERM), at(2ms));
  EXPECT_EQ(show(s.exited(1, killed(SIGTERM), at(3ms))), Lines{"finish 1"});  // no restart either
}

TEST(Supervisor, ARankThatCannotStartStopsTheStartedOnesAndTheRestNeverStart) {
  Supervisor s({{"a/0", "", false}, {"a/1", "", false}, {"a/2", "", false}}, options());
  s.begin(at(0ms));
  s.started(0, at(0ms));
  EXPECT_EQ(show(s.start_failed(1, "exec '/nonexistent/w': No such file or directory", at(0ms))),
            (Lines{"rank a/1 could not be started: exec '/nonexistent/w': No such file or directory; stopping 1 other "
                   "rank",
                   "TERM 0"}));
  EXPECT_EQ(show(s.exited(0, killed(SIGTERM), at(5ms))), Lines{"finish 1"});
  // With isolated groups too: a run that cannot start as configured does not start.
  Supervisor t(paris_paris_tokyo(true), options(true, 3));
  t.begin(at(0ms));
  EXPECT_EQ(
      show(t.start_failed(0, "exec 'w': Permission denied", at(0ms))),
      (Lines{"rank paris/0 could not be started: exec 'w': Permission denied; stopping 0 other ranks", "finish 1"}));
}

TEST(Supervisor, IsolatedGroupsAFailureStopsOnlyItsGroup) {
  Supervisor s(paris_paris_tokyo(), options(true));
  start_all(s);
  EXPECT_EQ(show(s.exited(1, code(3), at(200ms))),
            (Lines{"TERM 0",
                   "rank paris/1 exited with code 3; site paris leaves the run: stopping its 1 other rank; 1 "
                   "rank of other sites go on"}));
  EXPECT_EQ(s.next_deadline(), at(2200ms));
  EXPECT_EQ(show(s.tick(at(2200ms))), Lines{"KILL 0"});  // the group's grace, not tokyo's
  EXPECT_EQ(show(s.exited(0, killed(SIGKILL), at(2210ms))), Lines{});
  EXPECT_EQ(show(s.exited(2, code(0), at(3s))), Lines{"finish 0"});  // tokyo finished the run whole
}

TEST(Supervisor, IsolatedGroupsEveryGroupLostFailsTheLaunch) {
  Supervisor s({{"paris/0", "paris", false}, {"tokyo/0", "tokyo", false}}, options(true));
  start_all(s);
  EXPECT_EQ(show(s.exited(0, code(1), at(1ms))),
            Lines{"rank paris/0 exited with code 1; site paris leaves the run; 1 rank of other sites go on"});
  EXPECT_EQ(
      show(s.exited(1, code(2), at(2ms))),
      (Lines{"rank tokyo/0 exited with code 2; site tokyo leaves the run; 0 ranks of other sites go on", "finish 1"}));
}

// A group of two: the failure takes both down, both come back after the backoff with their
// restart command, and a restarted group that finishes whole counts as finished.
TEST(Supervisor, AFailedGroupIsRestartedOnceEveryChildIsDown) {
  Supervisor s(paris_paris_tokyo(true), options(true, 2));
  start_all(s);
  s.exited(1, code(3), at(200ms));
  EXPECT_EQ(s.next_deadline(), at(2200ms)) << "only paris/0's SIGKILL: no restart before it is down too";
  EXPECT_EQ(show(s.exited(0, killed(SIGTERM), at(250ms))),
            Lines{"site paris: every rank is down; restart 1 of 2 in 0.1 s"});
  EXPECT_EQ(s.next_deadline(), at(350ms));
  EXPECT_EQ(show(s.tick(at(349ms))), Lines{});
  EXPECT_EQ(answer_starts(s, s.tick(at(350ms)), at(350ms)),
            (Lines{"site paris: restart 1 of 2: starting its 2 ranks again", "restart 0", "restart 1"}));
  EXPECT_EQ(s.running(), 3u);
  // The SIGKILL that was due to the old processes at 2.2 s does not reach the new ones.
  EXPECT_FALSE(s.next_deadline());
  EXPECT_EQ(show(s.tick(at(2200ms))), Lines{});
  EXPECT_EQ(show(s.exited(2, code(0), at(3s))), Lines{});
  EXPECT_EQ(show(s.exited(0, code(0), at(4s))), Lines{});
  EXPECT_EQ(show(s.exited(1, code(0), at(4s))), Lines{"finish 0"});
}

// Each restart waits twice the last, capped at restart_backoff_max; after max_restarts the
// group stays out, and the run still ends well because another group finished.
TEST(Supervisor, RestartsBackOffDoublingUpToTheCapAndStopAtTheLimit) {
  SupervisorOptions o = options(true, 5);
  o.restart_backoff = 100ms;
  o.restart_backoff_max = 1000ms;
  Supervisor s({{"paris/0", "paris", true}, {"tokyo/0", "tokyo", true}}, o);
  start_all(s);
  auto now = at(0ms);
  const Lines waits = {"0.1", "0.2", "0.4", "0.8", "1.0"};
  for (int r = 1; r <= 5; ++r) {
    now += 10ms;
    const Lines said = show(s.exited(0, code(3), now));
    ASSERT_EQ(said.size(), 2u);
    EXPECT_EQ(said[1], "site paris: every rank is down; restart " + std::to_string(r) + " of 5 in " +
                           waits[size_t(r - 1)] + " s");
    const auto due = *s.next_deadline();
    EXPECT_EQ(due - now, std::chrono::milliseconds(std::lround(std::stod(waits[size_t(r - 1)]) * 1000)));
    now = due;
    EXPECT_EQ(answer_starts(s, s.tick(now), now),
              (Lines{"site paris: restart " + std::to_string(r) + " of 5: starting its 1 rank again", "restart 0"}));
  }
  now += 10ms;
  EXPECT_EQ(show(s.exited(0, code(3), now)),
            (Lines{"rank paris/0 exited with code 3; site paris leaves the run; 1 rank of other sites go on",
                   "site paris stays out of the run: it failed again after 5 restarts (--max-restarts 5)"}));
  EXPECT_FALSE(s.next_deadline());
  EXPECT_EQ(show(s.exited(1, code(0), now + 1s)), Lines{"finish 0"});
}

TEST(Supervisor, ABackoffMaxBelowTheBackoffIsTheBackoff) {
  SupervisorOptions o = options(true, 3);
  o.restart_backoff = 500ms;
  o.restart_backoff_max = 100ms;
  Supervisor s({{"paris/0", "paris", true}, {"tokyo/0", "tokyo", true}}, o);
  start_all(s);
  EXPECT_EQ(show(s.exited(0, code(1), at(0ms))).back(), "site paris: every rank is down; restart 1 of 3 in 0.5 s");
  answer_starts(s, s.tick(at(500ms)), at(500ms));
  EXPECT_EQ(show(s.exited(0, code(1), at(600ms))).back(), "site paris: every rank is down; restart 2 of 3 in 0.5 s");
}

// Exit 2 is a rank's word for bad input: started again, it would fail the same way. A rank
// killed by signal 2 is not that.
TEST(Supervisor, BadInputIsNotRestartedButSignalTwoIs) {
  Supervisor s(paris_paris_tokyo(true), options(true, 3));
  start_all(s);
  s.exited(0, code(kExitBadInput), at(1ms));
  EXPECT_EQ(show(s.exited(1, killed(SIGTERM), at(2ms))),
            Lines{"site paris stays out of the run: a rank exited with code 2 (bad input)"});
  EXPECT_FALSE(s.next_deadline()) << "no restart pending";
  EXPECT_EQ(show(s.exited(2, code(0), at(3ms))), Lines{"finish 0"});

  Supervisor t({{"paris/0", "paris", true}, {"tokyo/0", "tokyo", true}}, options(true, 3));
  start_all(t);
  EXPECT_EQ(show(t.exited(0, killed(SIGINT), at(1ms))).back(),
            "site paris: every rank is down; restart 1 of 3 in 0.1 s");
}

TEST(Supervisor, AGroupWithoutARestartCommandStaysOut) {
  Supervisor s({{"paris/0", "paris", true}, {"paris/1", "paris", false}, {"tokyo/0", "tokyo", true}}, options(true, 3));
  start_all(s);
  s.exited(0, code(1), at(1ms));
  EXPECT_EQ(show(s.exited(1, killed(SIGTERM), at(2ms))),
            Lines{"site paris stays out of the run: it has no restart command"});
}

// Once a group finished whole the run is over: a pending restart is dropped, and a group that
// fails later is not restarted either.
TEST(Supervisor, NoRestartOnceAnotherGroupFinishedWhole) {
  Supervisor s({{"paris/0", "paris", true}, {"tokyo/0", "tokyo", true}}, options(true, 3));
  start_all(s);
  s.exited(0, code(1), at(0ms));
  EXPECT_EQ(s.next_deadline(), at(100ms));
  EXPECT_EQ(show(s.exited(1, code(0), at(50ms))),
            (Lines{"site tokyo finished the run; site paris is not restarted", "finish 0"}));

  Supervisor t({{"paris/0", "paris", true}, {"tokyo/0", "tokyo", true}, {"lyon/0", "lyon", true}}, options(true, 3));
  start_all(t);
  EXPECT_EQ(show(t.exited(1, code(0), at(10ms))), Lines{});
  EXPECT_EQ(show(t.exited(0, code(1), at(20ms))),
            (Lines{"rank paris/0 exited with code 1; site paris leaves the run; 1 rank of other sites go on",
                   "site paris stays out of the run: the run is over"}));
  EXPECT_EQ(show(t.exited(2, code(0), at(30ms))), Lines{"finish 0"});
}

TEST(Supervisor, NoRestartWhenNoOtherGroupRuns) {
  Supervisor s({{"paris/0", "paris", true}, {"tokyo/0", "tokyo", true}}, options(true, 1));
  start_all(s);
  s.exited(0, code(1), at(0ms));
  // tokyo is lost before paris's restart is due: there is no run left to join.
  EXPECT_EQ(show(s.exited(1, code(1), at(50ms))),
            (Lines{"rank tokyo/0 exited with code 1; site tokyo leaves the run; 0 ranks of other sites go on",
                   "site tokyo stays out of the run: no other site is running: there is nothing to rejoin (start the "
                   "run again with --resume)"}));
  EXPECT_EQ(show(s.tick(at(100ms))),
            (Lines{"site paris stays out of the run: no other site is running: there is nothing to rejoin (start the "
                   "run again with --resume)",
                   "finish 1"}));
}

// A restart whose first child cannot start: the ones after it in the group never start, the
// ones before it are stopped, and the group is down again (and may come back).
TEST(Supervisor, ARestartThatCannotStartTakesItsGroupDownAgain) {
  Supervisor s(
      {{"paris/0", "paris", true}, {"paris/1", "paris", true}, {"paris/2", "paris", true}, {"tokyo/0", "tokyo", true}},
      options(true, 2));
  start_all(s);
  s.exited(0, code(1), at(0ms));
  s.exited(1, killed(SIGTERM), at(1ms));
  s.exited(2, killed(SIGTERM), at(1ms));
  auto a = s.tick(at(101ms));
  EXPECT_EQ(show(a), (Lines{"site paris: restart 1 of 2: starting its 3 ranks again", "restart 0"}));
  EXPECT_EQ(show(s.started(0, at(101ms))), Lines{"restart 1"});
  EXPECT_EQ(show(s.start_failed(1, "fork for 'w': Resource temporarily unavailable", at(101ms))),
            (Lines{"TERM 0",
                   "rank paris/1 could not be started: fork for 'w': Resource temporarily unavailable; site paris "
                   "leaves the run: stopping its 1 other rank; 1 rank of other sites go on"}));
  EXPECT_EQ(show(s.exited(0, killed(SIGTERM), at(110ms))),
            Lines{"site paris: every rank is down; restart 2 of 2 in 0.2 s"});
}

TEST(Supervisor, SignalsStopEveryRankWithAGraceAndASecondSignalSkipsIt) {
  for (const int sig : {SIGINT, SIGTERM}) {
    const std::string name = sig == SIGINT ? "SIGINT" : "SIGTERM";
    Supervisor s({{"a/0", "", false}, {"a/1", "", false}}, options());
    start_all(s);
    EXPECT_EQ(show(s.signaled(sig, at(1s))),
              (Lines{"received " + name + "; stopping 2 ranks (SIGTERM, SIGKILL after 2000 ms)", "TERM 0", "TERM 1"}));
    EXPECT_EQ(s.next_deadline(), at(3s));
    EXPECT_EQ(show(s.exited(0, killed(SIGTERM), at(1100ms))), Lines{});
    EXPECT_EQ(show(s.signaled(sig, at(1200ms))), (Lines{"received " + name + " again; killing 1 rank now", "KILL 1"}));
    EXPECT_FALSE(s.next_deadline());
    EXPECT_EQ(show(s.signaled(sig, at(1300ms))), Lines{});  // a third one: nothing more to do
    EXPECT_EQ(show(s.exited(1, killed(SIGKILL), at(1210ms))),
              Lines{"finish " + std::to_string(sig == SIGINT ? kExitInterrupted : kExitTerminated)});
  }
}

TEST(Supervisor, ASignalWithoutASecondWaitsForTheGrace) {
  Supervisor s({{"a/0", "", false}}, options());
  start_all(s);
  s.signaled(SIGTERM, at(0ms));
  EXPECT_EQ(show(s.tick(at(1999ms))), Lines{});
  EXPECT_EQ(show(s.tick(at(2000ms))), (Lines{"1 rank still running after 2000 ms; sending SIGKILL", "KILL 0"}));
  EXPECT_EQ(show(s.exited(0, killed(SIGKILL), at(2001ms))), Lines{"finish 143"});
}

// A stop while a group waits for its restart: the restart is dropped (the launch ends as soon
// as the rest is down, not after the backoff), and the exit code is the signal's.
TEST(Supervisor, AStopDropsAPendingRestart) {
  SupervisorOptions o = options(true, 2);
  o.restart_backoff = 10s;
  Supervisor s({{"paris/0", "paris", true}, {"tokyo/0", "tokyo", true}}, o);
  start_all(s);
  s.exited(0, code(1), at(0ms));
  EXPECT_EQ(s.next_deadline(), at(10s));
  EXPECT_EQ(show(s.signaled(SIGTERM, at(300ms))),
            (Lines{"received SIGTERM; stopping 1 rank (SIGTERM, SIGKILL after 2000 ms)", "TERM 1",
                   "site paris stays out of the run: the launch is stopping"}));
  EXPECT_EQ(s.next_deadline(), at(2300ms));
  EXPECT_EQ(show(s.exited(1, killed(SIGTERM), at(400ms))), Lines{"finish 143"});
}

// A failure while stopping is no new decision; the code stays the signal's.
TEST(Supervisor, AFailureDuringAStopKeepsTheSignalsCode) {
  Supervisor s({{"a/0", "", false}, {"a/1", "", false}}, options());
  start_all(s);
  s.signaled(SIGINT, at(0ms));
  EXPECT_EQ(show(s.exited(0, code(1), at(1ms))), Lines{});
  EXPECT_EQ(show(s.exited(1, killed(SIGTERM), at(2ms))), Lines{"finish 130"});
}

TEST(Supervisor, EventsOutOfProtocolAreErrors) {
  Supervisor s({{"a/0", "", false}, {"a/1", "", false}}, options());
  EXPECT_THROW(s.tick(at(0ms)), Error) << "before begin()";
  s.begin(at(0ms));
  EXPECT_THROW(s.exited(0, code(0), at(0ms)), Error) << "a start is unanswered";
  EXPECT_THROW(s.started(1, at(0ms)), Error) << "child 1 was not asked for";
  s.started(0, at(0ms));
  s.started(1, at(0ms));
  EXPECT_THROW(s.signaled(SIGHUP, at(0ms)), Error);
  s.exited(0, code(0), at(0ms));
  EXPECT_THROW(s.exited(0, code(0), at(0ms)), Error) << "it is down already";
  EXPECT_THROW(s.begin(at(0ms)), Error);
}

TEST(Supervisor, OptionsRejectNegatives) {
  auto bad = [](auto change) {
    SupervisorOptions o;
    change(o);
    EXPECT_THROW(o.validate(), InputError);
    EXPECT_THROW(Supervisor({{"a", "", false}}, o), InputError);
  };
  bad([](SupervisorOptions& o) { o.grace = -1ms; });
  bad([](SupervisorOptions& o) { o.max_restarts = -1; });
  bad([](SupervisorOptions& o) { o.restart_backoff = -1ms; });
  bad([](SupervisorOptions& o) { o.restart_backoff_max = -1ms; });
  EXPECT_NO_THROW(SupervisorOptions{}.validate());
}

}  // namespace
}  // namespace geoloco::launch
