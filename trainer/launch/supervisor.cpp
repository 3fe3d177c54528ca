// The launcher's policy as a pure state machine (supervisor.hpp): every decision of launch()
// and its messages, from events and the time it is given; no processes, clock or I/O here.
#include "trainer/launch/supervisor.hpp"

#include <signal.h>

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "core/error.hpp"

namespace geoloco::launch {

void SupervisorOptions::validate() const {
  if (grace.count() < 0) throw InputError("launch: grace period must not be negative");
  if (max_restarts < 0) throw InputError("launch: max_restarts must not be negative");
  if (restart_backoff.count() < 0 || restart_backoff_max.count() < 0)
    throw InputError("launch: restart backoff must not be negative");
}

Supervisor::Supervisor(std::vector<SupervisedChild> children, const SupervisorOptions& opts) : opts_(opts) {
  opts_.validate();
  for (auto& spec : children) {
    Child c;
    auto g = std::find_if(groups_.begin(), groups_.end(), [&](const Group& x) { return x.name == spec.group; });
    if (g == groups_.end()) {
      g = groups_.insert(groups_.end(), Group{});
      g->name = spec.group;
    }
    c.group = static_cast<size_t>(g - groups_.begin());
    c.spec = std::move(spec);
    children_.push_back(std::move(c));
  }
}

std::vector<Action> Supervisor::begin(Time now) {
  GEOLOCO_CHECK(!begun_, "begin() twice");
  begun_ = true;
  for (size_t i = 0; i < children_.size(); ++i) to_start_.push_back(i);
  next_start();
  settle(now);
  return std::exchange(out_, {});
}

std::vector<Action> Supervisor::started(size_t child, Time now) {
  GEOLOCO_CHECK(!to_start_.empty() && to_start_.front() == child, "started({}) was not asked for", child);
  children_[child].phase = Phase::kRunning;
  to_start_.erase(to_start_.begin());
  next_start();
  settle(now);
  return std::exchange(out_, {});
}

std::vector<Action> Supervisor::start_failed(size_t child, const std::string& error, Time now) {
  GEOLOCO_CHECK(!to_start_.empty() && to_start_.front() == child, "start_failed({}) was not asked for", child);
  Child& c = children_[child];
  c.phase = Phase::kDown;
  c.failed = true;
  c.start_error = error;
  to_start_.erase(to_start_.begin());
  if (!c.restarted) {
    // The first start: the run cannot begin as configured; the children after it stay unstarted.
    to_start_.clear();
    say(fmt::format("rank {} {}; stopping {} other {}", c.spec.label, describe(c), running(), ranks_text(running())));
    begin_stop(kExitRankFailed, now);
  } else {
    // A restart: its group goes down again; its siblings after it never start.
    for (size_t i : to_start_) {
      Child& s = children_[i];
      s.phase = Phase::kDown;
      s.failed = true;
      s.start_error = "not started: a sibling could not be started";
    }
    to_start_.clear();
    stop_group(child, now);
  }
  settle(now);
  return std::exchange(out_, {});
}

std::vector<Action> Supervisor::exited(size_t child, const ExitStatus& status, Time now) {
  expect_event();
  GEOLOCO_CHECK_LT(child, children_.size());
  Child& c = children_[child];
  GEOLOCO_CHECK(c.phase == Phase::kRunning, "exited({}): {} is not running", child, c.spec.label);
  c.phase = Phase::kDown;
  c.status = status;
  c.failed = !status.ok();
  if (c.failed && !stopping_) {
    if (opts_.isolate_groups && !c.spec.group.empty()) {
      if (status.signal == 0 && status.code == kExitBadInput) groups_[c.group].bad_input = true;
      stop_group(child, now);
    } else {
      say(fmt::format("rank {} {}; stopping {} other {}", c.spec.label, describe(c), running(), ranks_text(running())));
      begin_stop(kExitRankFailed, now);
    }
  }
  settle(now);
  return std::exchange(out_, {});
}

std::vector<Action> Supervisor::signaled(int sig, Time now) {
  GEOLOCO_CHECK(sig == SIGINT || sig == SIGTERM, "signaled({}): only SIGINT and SIGTERM stop a launch", sig);
  expect_event();
  if (finished_) return {};
  const char* name = sig == SIGINT ? "SIGINT" : "SIGTERM";
  if (!stopping_) {
    say(fmt::format("received {}; stopping {} {} (SIGTERM, SIGKILL after {} ms)", name, running(),
                    ranks_text(running()), opts_.grace.count()));
    begin_stop(128 + sig, now);
  } else if (!killed_) {
    // Asked twice: whoever asks does not want to wait for the grace.
    say(fmt::format("received {} again; killing {} {} now", name, running(), ranks_text(running())));
    signal_running(SIGKILL);
    killed_ = true;
  }
  settle(now);
  return std::exchange(out_, {});
}

std::vector<Action> Supervisor::tick(Time now) {
  expect_event();
  settle(now);
  return std::exchange(out_, {});
}

void Supervisor::expect_event() const {
  GEOLOCO_CHECK(begun_, "an event before begin()");
  GEOLOCO_CHECK(to_start_.empty(), "an event while a start is unanswered");
}

std::optional<Time> Supervisor::next_deadline() const {
  std::optional<Time> next;
  auto consider = [&](const std::optional<Time>& t) {
    if (t && (!next || *t < *next)) next = t;
  };
  if (stopping_ && !killed_ && running() > 0) consider(kill_at_);
  for (const auto& g : groups_) {
    consider(g.restart_at);
    consider(g.kill_at);
  }
  return next;
}

size_t Supervisor::running() const {
  return static_cast<size_t>(
      std::count_if(children_.begin(), children_.end(), [](const Child& c) { return c.phase == Phase::kRunning; }));
}

// What follows from the state and the time, after every event.
void Supervisor::settle(Time now) {
  if (finished_ || !begun_ || !to_start_.empty()) return;
  kill_overdue_groups(now);
  note_finished_groups();
  schedule_restarts(now);
  start_due_restart(now);
  if (!to_start_.empty()) return;
  if (stopping_ && !killed_ && now >= kill_at_ && running() > 0) {
    say(fmt::format("{} {} still running after {} ms; sending SIGKILL", running(), ranks_text(running()),
                    opts_.grace.count()));
    signal_running(SIGKILL);
    killed_ = true;
  }
  const bool restart_pending = std::any_of(groups_.begin(), groups_.end(), [](const Group& g) { return g.restart_at; });
  if (running() == 0 && !restart_pending) {
    finished_ = true;
    out_.push_back(Action::finish(result()));
  }
}

void Supervisor::next_start() {
  if (to_start_.empty()) return;
  Child& c = children_[to_start_.front()];
  c.phase = Phase::kStarting;
  out_.push_back(Action::start(to_start_.front(), c.restarted));
}

void Supervisor::begin_stop(int code, Time now) {
  if (stopping_) return;
  stopping_ = true;
  stop_code_ = code;
  for (auto& g : groups_) g.restart_at.reset();  // nothing comes back while stopping
  signal_running(SIGTERM);
  kill_at_ = now + opts_.grace;
}

void Supervisor::stop_group(size_t child, Time now) {
  const Child& c = children_[child];
  Group& g = groups_[c.group];
  if (g.down) return;  // a sibling we are stopping, or one that failed too
  g.down = true;
  size_t siblings = 0, others = 0;
  for (const auto& o : children_) {
    if (o.phase != Phase::kRunning) continue;
    (o.group == c.group ? siblings : others) += 1;
  }
  signal_running(SIGTERM, c.group);
  g.kill_at = now + opts_.grace;
  const std::string stopping =
      siblings == 0 ? std::string() : fmt::format(": stopping its {} other {}", siblings, ranks_text(siblings));
  say(fmt::format("rank {} {}; site {} leaves the run{}; {} {} of other sites go on", c.spec.label, describe(c), g.name,
                  stopping, others, ranks_text(others)));
}

void Supervisor::kill_overdue_groups(Time now) {
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (!groups_[g].kill_at) continue;
    const bool any = std::any_of(children_.begin(), children_.end(),
                                 [&](const Child& c) { return c.group == g && c.phase == Phase::kRunning; });
    if (any && now < *groups_[g].kill_at) continue;
    signal_running(SIGKILL, g);
    groups_[g].kill_at.reset();  // sent, or nothing left to send it to
  }
}

void Supervisor::note_finished_groups() {
  if (run_finished_ || !opts_.isolate_groups) return;
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (!whole(g) || groups_[g].down) continue;
    // It committed its rounds with a quorum to the end: a site that came back now would find
    // no run to join.
    run_finished_ = true;
    for (auto& h : groups_) {
      if (!h.restart_at) continue;
      h.restart_at.reset();
      h.settled = true;
      say(fmt::format("site {} finished the run; site {} is not restarted", groups_[g].name, h.name));
    }
    return;
  }
}

void Supervisor::schedule_restarts(Time now) {
  if (!opts_.isolate_groups || opts_.max_restarts <= 0) return;
  for (size_t g = 0; g < groups_.size(); ++g) {
    Group& st = groups_[g];
    if (!st.down || st.settled || st.restart_at) continue;
    bool all_down = true, restartable = true;
    for (const auto& c : children_) {
      if (c.group != g) continue;
      all_down = all_down && (c.phase == Phase::kDown || c.phase == Phase::kIdle);
      restartable = restartable && c.spec.restartable;
    }
    if (!all_down) continue;
    std::string why_not;
    if (stopping_)
      why_not = "the launch is stopping";
    else if (run_finished_)
      why_not = "the run is over";
    else if (st.bad_input)
      why_not = fmt::format("a rank exited with code {} (bad input)", kExitBadInput);
    else if (!restartable)
      why_not = "it has no restart command";
    else if (!another_group_runs(g))
      why_not = "no other site is running: there is nothing to rejoin (start the run again with --resume)";
    else if (st.restarts >= opts_.max_restarts)
      why_not = fmt::format("it failed again after {} restart{} (--max-restarts {})", st.restarts,
                            st.restarts == 1 ? "" : "s", opts_.max_restarts);
    if (!why_not.empty()) {
      st.settled = true;
      say(fmt::format("site {} stays out of the run: {}", st.name, why_not));
      continue;
    }
    auto wait = opts_.restart_backoff;
    for (int i = 0; i < st.restarts && wait < opts_.restart_backoff_max; ++i) wait *= 2;
    wait = std::min(wait, std::max(opts_.restart_backoff_max, opts_.restart_backoff));
    st.restart_at = now + wait;
    say(fmt::format("site {}: every rank is down; restart {} of {} in {:.1f} s", st.name, st.restarts + 1,
                    opts_.max_restarts, static_cast<double>(wait.count()) / 1000.0));
  }
}

// One group at a time: its children start one by one, and the next due group waits for the
// answers.
void Supervisor::start_due_restart(Time now) {
  for (size_t g = 0; g < groups_.size(); ++g) {
    Group& st = groups_[g];
    if (!st.restart_at || now < *st.restart_at) continue;
    st.restart_at.reset();
    if (!another_group_runs(g)) {
      st.settled = true;
      say(fmt::format(
          "site {} stays out of the run: no other site is running: there is nothing to rejoin (start the run again "
          "with --resume)",
          st.name));
      continue;
    }
    ++st.restarts;
    st.bad_input = false;
    st.down = false;
    size_t n = 0;
    for (size_t i = 0; i < children_.size(); ++i) {
      if (children_[i].group != g) continue;
      Child& c = children_[i];
      c.phase = Phase::kIdle;
      c.restarted = true;
      c.failed = false;
      c.start_error.clear();
      c.status = {};
      to_start_.push_back(i);
      ++n;
    }
    say(fmt::format("site {}: restart {} of {}: starting its {} {} again", st.name, st.restarts, opts_.max_restarts, n,
                    ranks_text(n)));
    next_start();
    return;
  }
}

void Supervisor::signal_running(int sig, std::optional<size_t> group) {
  for (size_t i = 0; i < children_.size(); ++i)
    if (children_[i].phase == Phase::kRunning && (!group || children_[i].group == *group))
      out_.push_back(Action::send(i, sig));
}

void Supervisor::say(std::string text) { out_.push_back(Action::message(std::move(text))); }

std::string Supervisor::describe(const Child& c) const {
  if (!c.start_error.empty()) return "could not be started: " + c.start_error;
  return c.status.describe();
}

std::string Supervisor::ranks_text(size_t n) const { return n == 1 ? "rank" : "ranks"; }

bool Supervisor::whole(size_t group) const {
  for (const auto& c : children_)
    if (c.group == group && (c.phase != Phase::kDown || c.failed)) return false;
  return true;
}

bool Supervisor::another_group_runs(size_t group) const {
  for (const auto& c : children_)
    if (c.group != group && c.phase == Phase::kRunning && !groups_[c.group].down) return true;
  return false;
}

int Supervisor::result() const {
  if (stopping_ || !opts_.isolate_groups) return stopping_ ? stop_code_ : kExitOk;
  // The run finished if some site finished whole (its rounds committed with a quorum).
  for (size_t g = 0; g < groups_.size(); ++g)
    if (whole(g) && !groups_[g].down) return kExitOk;
  return kExitRankFailed;
}

}  // namespace geoloco::launch
