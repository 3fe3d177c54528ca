// Multi-process launcher: starts every rank of every site on this machine, prefixes their
// output, and makes sure that when one rank fails, or the launcher is asked to stop, every
// rank is stopped and reaped. `geoloco launch` builds the ProcessSpecs from the run config
// and calls launch(). The policy below is decided by the Supervisor (supervisor.hpp), the
// I/O done by launcher.cpp; children are started through geoloco::spawn (core/subprocess.hpp).
//
// Guarantees:
//  * each child runs in its own process group (so signals reach its helpers too, and a
//    terminal's Ctrl-C reaches only the launcher, which then stops the ranks in order);
//  * each child has PR_SET_PDEATHSIG = SIGKILL: if the launcher itself is SIGKILLed, its
//    ranks die with it. (Linux ties this to the *thread* that forked: call launch() from a
//    thread that outlives it, normally the main thread.);
//  * stdout/stderr lines are prefixed "[label] " and written whole; stdin is /dev/null;
//  * with status_sites, a status block is drawn below the output and erased at the end;
//  * the first rank that exits non-zero or by a signal ends the run: one message names it
//    and its code or signal, the others get SIGTERM (to their whole process group), then
//    SIGKILL after `grace`; all are reaped; launch() returns kExitRankFailed;
//  * SIGINT / SIGTERM to the launcher: SIGTERM to every rank, SIGKILL after `grace` (a
//    second signal skips the grace), reap, return 130 / 143;
//  * isolate_groups (a run that outlives a lost site): a child that fails takes only its
//    group (its site) down: the group's other children get SIGTERM, then SIGKILL after
//    `grace`, and the other groups go on. launch() returns 0 when at least one group
//    finished with every child exiting 0 (it finished the run with its quorum), else
//    kExitRankFailed;
//  * restarts (isolate_groups with max_restarts > 0): once every child of a failed group is
//    reaped, the group is started again after a backoff (restart_backoff, doubled per
//    restart of that group, at most restart_backoff_max), each child with its restart_argv
//    (`geoloco launch` adds --join), up to max_restarts times per group. Not restarted: a
//    group whose failure was bad input (a child exited kExitBadInput: it would fail the same
//    way), a group without restart_argv, and any group once another group has finished whole
//    (the run is over; there is nothing left to join). A restarted group that finishes whole
//    counts as finished;
//  * when a rank exits, stragglers left in its process group are SIGKILLed and reaped (the
//    launcher is their subreaper while launch() runs): no orphans, no zombies. A helper that
//    moved itself to another process group or session (setsid) escapes this sweep.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "trainer/launch/supervisor.hpp"  // the exit codes kExit*

namespace geoloco::launch {

struct ProcessSpec {
  std::string label;                                     // "paris/0": the output prefix
  std::vector<std::string> argv;                         // argv[0] is looked up in PATH
  std::vector<std::pair<std::string, std::string>> env;  // added to (or replacing in) our environment
  std::string group;                                     // its failure domain (site name); see isolate_groups
  std::vector<std::string> restart_argv;                 // its command when its group is restarted (empty: never)
  std::vector<std::pair<std::string, std::string>> restart_env;  // set over env when restarted
};

struct LaunchOptions {
  std::chrono::milliseconds grace{5000};  // SIGTERM -> SIGKILL
  int out_fd = 1;                         // where children's stdout lines go
  int err_fd = 2;                         // children's stderr lines and the launcher's messages
  // Install SIGINT/SIGTERM handlers for the duration of launch() (restored afterwards).
  bool handle_signals = true;
  // The terminal status view (status_block.hpp): one line per site (these names, config
  // order), redrawn on out_fd below the ranks' output; every child gets a status pipe as fd 3
  // (GEOLOCO_STATUS_FD=3) to report on. Empty: plain prefixed lines only.
  std::vector<std::string> status_sites;
  // A failing child stops only the children of its group (ProcessSpec::group).
  bool isolate_groups = false;
  // With isolate_groups: how many times a failed group is started again (0: never), and the
  // wait before its first restart (doubled for each further one, capped).
  int max_restarts = 0;
  std::chrono::milliseconds restart_backoff{1000};
  std::chrono::milliseconds restart_backoff_max{30000};
};

// Runs all processes to completion. Returns 0 when every one exited 0, otherwise one of the
// kExit* codes (supervisor.hpp). Throws geoloco::InputError for an empty list, empty argv or
// duplicate labels, a negative grace, max_restarts or backoff, and geoloco::Error when a
// system call the launcher itself needs fails (pipe, poll); a rank that cannot be forked or
// executed is a failed rank, not an exception.
int launch(const std::vector<ProcessSpec>& procs, const LaunchOptions& opts = {});

}  // namespace geoloco::launch
