// The launcher's decisions, as a pure state machine: when to start each child, which process
// groups to stop (SIGTERM) and when to SIGKILL them, which failed group comes back after what
// backoff, when the run is over and with which exit code, and the one-line messages saying
// so. No processes, no clock, no I/O: the launcher (launcher.cpp) feeds it what happened and
// the time, and performs the actions it returns; tests drive it with made-up events and
// times (tests/launch/test_supervisor.cpp). The policy itself is launcher.hpp's header
// comment.
//
// Protocol: begin(), then events in any order, each answered with the actions to perform in
// order. A kStart is answered with started() or start_failed() before any other event (the
// next child's kStart comes with that answer: children start one at a time, so a failed
// start stops the ones after it from starting). tick() is the timer: call it at
// next_deadline(), or whenever convenient (it does nothing early). kFinish comes once, when
// no child runs and none will start again.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/subprocess.hpp"

namespace geoloco::launch {

inline constexpr int kExitOk = 0;
inline constexpr int kExitRankFailed = 1;     // a rank failed or could not be started
inline constexpr int kExitBadInput = 2;       // a rank's own code for bad input: its group is not restarted
inline constexpr int kExitInterrupted = 130;  // SIGINT (128 + 2)
inline constexpr int kExitTerminated = 143;   // SIGTERM (128 + 15)

using Time = std::chrono::steady_clock::time_point;

struct SupervisedChild {
  std::string label;         // "paris/0": named in messages
  std::string group;         // its failure domain (site); "" with isolate_groups: the whole run's
  bool restartable = false;  // it has a restart command
};

// The policy's knobs (LaunchOptions' of the same names).
struct SupervisorOptions {
  std::chrono::milliseconds grace{5000};  // SIGTERM -> SIGKILL
  bool isolate_groups = false;
  int max_restarts = 0;
  std::chrono::milliseconds restart_backoff{1000};
  std::chrono::milliseconds restart_backoff_max{30000};
  // Throws InputError for a negative grace, max_restarts or backoff.
  void validate() const;
};

struct Action {
  enum class Kind {
    kStart,    // start `child` (with its restart command when `restart`)
    kSignal,   // send `signal` to `child`'s process group
    kMessage,  // print "[launch] <text>"
    kFinish,   // the launch is over: return `code`
  };
  Kind kind = Kind::kMessage;
  size_t child = 0;
  bool restart = false;
  int signal = 0;
  std::string text;
  int code = 0;

  static Action start(size_t child, bool restart) { return {Kind::kStart, child, restart, 0, {}, 0}; }
  static Action send(size_t child, int signal) { return {Kind::kSignal, child, false, signal, {}, 0}; }
  static Action message(std::string text) { return {Kind::kMessage, 0, false, 0, std::move(text), 0}; }
  static Action finish(int code) { return {Kind::kFinish, 0, false, 0, {}, code}; }
  bool operator==(const Action&) const = default;
};

class Supervisor {
 public:
  Supervisor(std::vector<SupervisedChild> children, const SupervisorOptions& opts);

  std::vector<Action> begin(Time now);
  std::vector<Action> started(size_t child, Time now);
  // `error` says why: "exec 'x': No such file or directory".
  std::vector<Action> start_failed(size_t child, const std::string& error, Time now);
  // The child ended (its process group swept, its last output printed).
  std::vector<Action> exited(size_t child, const ExitStatus& status, Time now);
  // SIGINT or SIGTERM to the launcher.
  std::vector<Action> signaled(int sig, Time now);
  std::vector<Action> tick(Time now);

  // When tick() next has something to do; nullopt: only events can change anything.
  std::optional<Time> next_deadline() const;
  bool finished() const { return finished_; }
  size_t running() const;

 private:
  enum class Phase { kIdle, kStarting, kRunning, kDown };
  struct Child {
    SupervisedChild spec;
    size_t group = 0;  // index into groups_
    Phase phase = Phase::kIdle;
    bool restarted = false;   // this incarnation runs the restart command
    bool failed = false;      // this incarnation failed (or was never started)
    std::string start_error;  // why it was not started
    ExitStatus status;
  };
  struct Group {
    std::string name;
    bool down = false;       // leaving the run: failed or being stopped
    int restarts = 0;        // how many times it was started again
    bool bad_input = false;  // a child exited kExitBadInput: a restart would fail the same way
    bool settled = false;    // out of the run for good (said so)
    std::optional<Time> restart_at, kill_at;
  };

  void expect_event() const;
  void settle(Time now);
  void next_start();
  void begin_stop(int code, Time now);
  void stop_group(size_t child, Time now);  // isolate_groups: a child of it failed
  void kill_overdue_groups(Time now);
  void note_finished_groups();
  void schedule_restarts(Time now);
  void start_due_restart(Time now);
  void signal_running(int sig, std::optional<size_t> group = std::nullopt);
  void say(std::string text);
  std::string describe(const Child& c) const;
  std::string ranks_text(size_t n) const;
  bool whole(size_t group) const;  // every child of it exited 0
  bool another_group_runs(size_t group) const;
  int result() const;

  SupervisorOptions opts_;
  std::vector<Child> children_;
  std::vector<Group> groups_;  // in the order their first child comes
  std::vector<size_t> to_start_;
  bool begun_ = false;
  bool stopping_ = false;
  bool killed_ = false;  // SIGKILL went to everything still running
  int stop_code_ = kExitOk;
  Time kill_at_{};
  bool run_finished_ = false;  // a group finished whole: nothing is restarted any more
  bool finished_ = false;
  std::vector<Action> out_;
};

}  // namespace geoloco::launch
