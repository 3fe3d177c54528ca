#include "trainer/launch/launcher.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/fd.hpp"
#include "trainer/launch/line_prefixer.hpp"
#include "trainer/launch/status_block.hpp"

extern char** environ;

namespace geoloco::launch {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void sys_fail(const std::string& what) {
  throw Error(fmt::format("launch: {}: {}", what, std::strerror(errno)));
}

struct Pipe {
  Fd read, write;
};
Pipe make_pipe() {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) sys_fail("pipe");
  return {Fd(p[0]), Fd(p[1])};
}

// Self-pipe: signal handlers write the signal number, the poll loop reads it.
std::atomic<int> g_signal_write_fd{-1};
std::atomic<bool> g_launch_active{false};

extern "C" void on_signal(int sig) {
  const int saved = errno;
  const int fd = g_signal_write_fd.load();
  if (fd >= 0) {
    unsigned char c = static_cast<unsigned char>(sig);
    [[maybe_unused]] ssize_t n = ::write(fd, &c, 1);  // pipe full = a wake-up is already pending
  }
  errno = saved;
}

// Installs our handlers for the duration of launch() and restores the previous ones.
class SignalScope {
 public:
  SignalScope(int write_fd, bool handle_term) {
    g_signal_write_fd.store(write_fd);
    install(SIGCHLD, SA_NOCLDSTOP);
    if (handle_term) {
      install(SIGINT, 0);
      install(SIGTERM, 0);
    }
    // Writing to a closed output (e.g. `geoloco launch | head`) must not kill the launcher
    // before it has stopped its ranks.
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    struct sigaction old {};
    ::sigaction(SIGPIPE, &ign, &old);
    saved_.push_back({SIGPIPE, old});
  }
  ~SignalScope() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) ::sigaction(it->first, &it->second, nullptr);
    g_signal_write_fd.store(-1);
  }

 private:
  void install(int sig, int flags) {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = flags | SA_RESTART;
    struct sigaction old {};
    if (::sigaction(sig, &sa, &old) != 0) sys_fail("sigaction");
    saved_.push_back({sig, old});
  }
  std::vector<std::pair<int, struct sigaction>> saved_;
};

// Makes this process the subreaper of its descendants for the duration of launch(), so
// helpers a rank leaves behind are re-parented to us (not to init) and can be reaped.
class SubreaperScope {
 public:
  SubreaperScope() {
    ::prctl(PR_GET_CHILD_SUBREAPER, &old_);
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  }
  ~SubreaperScope() { ::prctl(PR_SET_CHILD_SUBREAPER, old_); }

 private:
  int old_ = 0;
};

struct Child {
  const ProcessSpec* spec = nullptr;
  pid_t pid = -1;
  Fd out, err, status;  // status: the status pipe's read end (status view only)
  std::string status_pending;
  std::unique_ptr<LinePrefixer> out_lines, err_lines;
  bool reaped = false;
  int exit_code = 0;    // when exited normally
  int term_signal = 0;  // when killed by a signal
  std::string start_error;
};

// argv/envp as the char* arrays execvpe wants, built before fork (no allocation after it).
struct ExecArgs {
  std::vector<std::string> strings_env;
  std::vector<char*> argv, envp;
};

ExecArgs build_exec_args(const ProcessSpec& spec, const std::vector<std::pair<std::string, std::string>>& extra) {
  ExecArgs a;
  std::set<std::string> overridden;
  for (const auto& [k, v] : spec.env) overridden.insert(k);
  for (const auto& [k, v] : extra) overridden.insert(k);
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string entry(*e);
    auto eq = entry.find('=');
    if (eq != std::string::npos && overridden.count(entry.substr(0, eq))) continue;
    a.strings_env.push_back(std::move(entry));
  }
  for (const auto& [k, v] : spec.env) a.strings_env.push_back(k + "=" + v);
  for (const auto& [k, v] : extra) a.strings_env.push_back(k + "=" + v);
  for (const auto& s : spec.argv) a.argv.push_back(const_cast<char*>(s.c_str()));
  a.argv.push_back(nullptr);
  for (auto& s : a.strings_env) a.envp.push_back(s.data());
  a.envp.push_back(nullptr);
  return a;
}

std::string describe_exit(const Child& c) {
  if (!c.start_error.empty()) return "could not be started: " + c.start_error;
  if (c.term_signal != 0) {
    const char* abbrev = ::sigabbrev_np(c.term_signal);
    return fmt::format("was killed by signal {} (SIG{}: {})", c.term_signal, abbrev ? abbrev : "?",
                       ::strsignal(c.term_signal));
  }
  return fmt::format("exited with code {}", c.exit_code);
}

bool failed(const Child& c) { return !c.start_error.empty() || c.term_signal != 0 || c.exit_code != 0; }

// Forks and execs one child; fills pid/out/err or start_error.
void start_child(Child& c, int devnull, const sigset_t& original_mask, const LaunchOptions& opts, StatusBlock* block) {
  const bool status_view = block != nullptr;
  ExecArgs args = build_exec_args(
      *c.spec, status_view ? std::vector<std::pair<std::string, std::string>>{{"GEOLOCO_STATUS_FD", "3"}}
                           : std::vector<std::pair<std::string, std::string>>{});
  Pipe out = make_pipe(), err = make_pipe(), exec_status = make_pipe();
  Pipe status;
  if (status_view) status = make_pipe();
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) sys_fail(fmt::format("fork for {}", c.spec->label));
  if (pid == 0) {
    // Child: async-signal-safe calls only until exec.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the launcher died before prctl took effect
    ::dup2(devnull, 0);
    ::dup2(out.write.get(), 1);
    ::dup2(err.write.get(), 2);
    int exec_fd = exec_status.write.get();
    if (status_view) {
      if (exec_fd == 3) exec_fd = ::fcntl(3, F_DUPFD_CLOEXEC, 10);  // keep it out of fd 3's way
      if (status.write.get() != 3) ::dup2(status.write.get(), 3);
      ::fcntl(3, F_SETFD, 0);
    }
    for (int fd = 0; fd <= 2; ++fd) ::fcntl(fd, F_SETFD, 0);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (int sig : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE, SIGHUP, SIGQUIT}) ::sigaction(sig, &dfl, nullptr);
    ::pthread_sigmask(SIG_SETMASK, &original_mask, nullptr);
    ::execvpe(args.argv[0], args.argv.data(), args.envp.data());
    int e = errno;
    [[maybe_unused]] ssize_t n = ::write(exec_fd, &e, sizeof(e));
    ::_exit(127);
  }
  // Parent. Set the group here too, so kill(-pid) works even before the child runs.
  ::setpgid(pid, pid);
  c.pid = pid;
  out.write.reset();
  err.write.reset();
  exec_status.write.reset();
  status.write.reset();
  int e = 0;
  ssize_t n;
  do {
    n = ::read(exec_status.read.get(), &e, sizeof(e));  // EOF (0) = exec succeeded (CLOEXEC)
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof(e)))
    c.start_error = fmt::format("exec '{}': {}", c.spec->argv[0], std::strerror(e));
  ::fcntl(out.read.get(), F_SETFL, O_NONBLOCK);
  ::fcntl(err.read.get(), F_SETFL, O_NONBLOCK);
  c.out = std::move(out.read);
  c.err = std::move(err.read);
  if (status_view) {
    ::fcntl(status.read.get(), F_SETFL, O_NONBLOCK);
    c.status = std::move(status.read);
    auto sink = [block](const std::string& line) { block->print(line); };
    c.out_lines = std::make_unique<LinePrefixer>(c.spec->label, sink);
    c.err_lines = std::make_unique<LinePrefixer>(c.spec->label, sink);
  } else {
    c.out_lines = std::make_unique<LinePrefixer>(c.spec->label, opts.out_fd);
    c.err_lines = std::make_unique<LinePrefixer>(c.spec->label, opts.err_fd);
  }
}

// Reads a child's status reports (JSON lines) and hands each whole one to the block.
void pump_status(Child& c, StatusBlock& block) {
  if (c.status.get() < 0) return;
  char buf[16384];
  for (;;) {
    ssize_t n = ::read(c.status.get(), buf, sizeof(buf));
    if (n > 0) {
      c.status_pending.append(buf, static_cast<size_t>(n));
      for (size_t nl; (nl = c.status_pending.find('\n')) != std::string::npos;) {
        auto j = nlohmann::json::parse(c.status_pending.substr(0, nl), nullptr, false);
        c.status_pending.erase(0, nl + 1);
        if (!j.is_discarded()) block.update(j);  // a garbled report is dropped, not fatal
      }
      if (c.status_pending.size() > 65536) c.status_pending.clear();
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    c.status.reset();  // EOF
    return;
  }
}

// Reads what is available now; closes the fd at EOF. Returns false when nothing was read.
bool pump(Fd& fd, LinePrefixer& lines) {
  if (fd.get() < 0) return false;
  char buf[65536];
  bool any = false;
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n > 0) {
      lines.feed(buf, static_cast<size_t>(n));
      any = true;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return any;
    lines.finish();  // EOF or a read error: this stream is over
    fd.reset();
    return any;
  }
}

class Launcher {
 public:
  Launcher(const std::vector<ProcessSpec>& procs, const LaunchOptions& opts) : opts_(opts) {
    if (!opts.status_sites.empty()) block_ = std::make_unique<StatusBlock>(opts.out_fd, opts.status_sites);
    children_.resize(procs.size());
    for (size_t i = 0; i < procs.size(); ++i) children_[i].spec = &procs[i];
  }

  int run();

 private:
  void message(const std::string& text) {
    std::string line = "[launch] " + text + "\n";
    if (block_) {
      block_->print(line);
    } else {
      (void)write_all(opts_.err_fd, line.data(), line.size());
    }
  }
  size_t live() const {
    size_t n = 0;
    for (const auto& c : children_) n += (c.pid > 0 && !c.reaped);
    return n;
  }
  void signal_all(int sig) {
    for (const auto& c : children_)
      if (c.pid > 0 && !c.reaped) ::kill(-c.pid, sig);
  }
  void begin_stop(int code) {
    if (stopping_) return;
    stopping_ = true;
    result_ = code;
    for (auto& [g, st] : group_state_) st.restart_at.reset();  // nothing comes back while stopping
    signal_all(SIGTERM);
    kill_at_ = Clock::now() + opts_.grace;
  }
  void collect_exits();
  // isolate_groups: the failed child's site leaves; its other ranks are stopped.
  void stop_group(const Child& c);
  void kill_overdue_groups();
  int isolated_result() const;
  // SIGKILLs what is left of a finished child's process group and reaps it (we are the
  // subreaper, so its orphans become our children), until the group is empty.
  void sweep_group(const Child& c) {
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    for (;;) {
      ::kill(-c.pid, SIGKILL);
      int st = 0;
      while (::waitpid(-c.pid, &st, WNOHANG) > 0) {}
      if (::kill(-c.pid, 0) != 0 && errno == ESRCH) return;
      if (Clock::now() >= deadline) {
        message(fmt::format("processes left by rank {} (process group {}) did not exit after SIGKILL", c.spec->label,
                            c.pid));
        return;
      }
      ::usleep(1000);  // a grandchild whose parent just died is being reparented to us
    }
  }
  void handle_signal_bytes(int fd);
  // Restarts (isolate_groups, max_restarts): which failed groups come back, and when.
  void note_finished_groups();
  void schedule_restarts();
  void start_due_restarts();
  bool restart_pending() const;
  int ms_to_next_restart() const;
  void start(Child& c);  // fork + exec with our signals blocked
  std::string group_size_text(const std::string& g) const;
  bool another_group_runs(const std::string& g) const;  // one with a live child that is not going down

  struct GroupState {
    int restarts = 0;        // how many times it was started again
    bool bad_input = false;  // a child exited kExitBadInput: a restart would fail the same way
    bool settled = false;    // down for good (message given)
    std::optional<Clock::time_point> restart_at;
  };

  const LaunchOptions& opts_;
  Fd devnull_;
  sigset_t original_mask_{};
  std::deque<ProcessSpec> restart_specs_;  // stable addresses: Child::spec points here after a restart
  std::map<std::string, GroupState> group_state_;
  bool run_finished_ = false;           // some group finished whole: nothing is restarted any more
  std::unique_ptr<StatusBlock> block_;  // the terminal status view, when asked for
  std::vector<Child> children_;
  bool stopping_ = false;
  bool killed_ = false;
  int result_ = kExitOk;
  Clock::time_point kill_at_{};
  std::set<std::string> groups_down_;
  std::map<std::string, Clock::time_point> group_kill_at_;
};

void Launcher::collect_exits() {
  for (auto& c : children_) {
    if (c.pid <= 0 || c.reaped) continue;
    siginfo_t info{};
    // WNOWAIT: look without reaping, so the pid (and its process group id) cannot be reused
    // while we sweep the group below.
    if (::waitid(P_PID, static_cast<id_t>(c.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) continue;
    if (info.si_pid != c.pid) continue;  // still running
    if (info.si_code == CLD_EXITED) {
      c.exit_code = info.si_status;
    } else {
      c.term_signal = info.si_status;
    }
    ::kill(-c.pid, SIGKILL);  // helpers it left behind in its group: no orphans
    int st = 0;
    while (::waitpid(c.pid, &st, 0) < 0 && errno == EINTR) {}
    c.reaped = true;
    sweep_group(c);
    // Its last lines before our message about it.
    pump(c.out, *c.out_lines);
    pump(c.err, *c.err_lines);
    if (failed(c) && !stopping_) {
      if (opts_.isolate_groups && !c.spec->group.empty()) {
        if (c.start_error.empty() && c.term_signal == 0 && c.exit_code == kExitBadInput)
          group_state_[c.spec->group].bad_input = true;
        stop_group(c);
        continue;
      }
      const size_t others = live();
      message(fmt::format("rank {} {}; stopping {} other rank{}", c.spec->label, describe_exit(c), others,
                          others == 1 ? "" : "s"));
      begin_stop(kExitRankFailed);
    }
  }
}

void Launcher::stop_group(const Child& c) {
  const std::string& g = c.spec->group;
  if (groups_down_.count(g)) return;  // a sibling we are stopping, or one that failed too
  groups_down_.insert(g);
  size_t siblings = 0, others = 0;
  for (const auto& o : children_) {
    if (o.pid <= 0 || o.reaped) continue;
    if (o.spec->group == g) {
      ++siblings;
      ::kill(-o.pid, SIGTERM);
    } else {
      ++others;
    }
  }
  group_kill_at_[g] = Clock::now() + opts_.grace;
  const std::string stopping =
      siblings == 0 ? std::string() : fmt::format(": stopping its {} other rank{}", siblings, siblings == 1 ? "" : "s");
  message(fmt::format("rank {} {}; site {} leaves the run{}; {} rank{} of other sites go on", c.spec->label,
                      describe_exit(c), g, stopping, others, others == 1 ? "" : "s"));
}

void Launcher::kill_overdue_groups() {
  const auto now = Clock::now();
  for (auto it = group_kill_at_.begin(); it != group_kill_at_.end();) {
    if (now < it->second) {
      ++it;
      continue;
    }
    for (const auto& o : children_)
      if (o.pid > 0 && !o.reaped && o.spec->group == it->first) ::kill(-o.pid, SIGKILL);
    it = group_kill_at_.erase(it);
  }
}

std::string Launcher::group_size_text(const std::string& g) const {
  size_t n = 0;
  for (const auto& c : children_) n += c.spec->group == g;
  return fmt::format("{} rank{}", n, n == 1 ? "" : "s");
}

bool Launcher::another_group_runs(const std::string& g) const {
  for (const auto& c : children_)
    if (c.spec->group != g && c.pid > 0 && !c.reaped && !groups_down_.count(c.spec->group)) return true;
  return false;
}

void Launcher::note_finished_groups() {
  if (run_finished_ || !opts_.isolate_groups) return;
  std::map<std::string, bool> whole;  // every child reaped and exited 0
  for (const auto& c : children_) {
    auto [it, fresh] = whole.emplace(c.spec->group, true);
    if (c.pid <= 0 || !c.reaped || failed(c)) it->second = false;
  }
  for (const auto& [g, ok] : whole) {
    if (!ok || groups_down_.count(g)) continue;
    run_finished_ = true;
    for (auto& [h, st] : group_state_)
      if (st.restart_at) {
        st.restart_at.reset();
        st.settled = true;
        message(fmt::format("site {} finished the run; site {} is not restarted", g, h));
      }
    return;
  }
}

void Launcher::schedule_restarts() {
  if (!opts_.isolate_groups || opts_.max_restarts <= 0) return;
  for (const auto& g : groups_down_) {
    GroupState& st = group_state_[g];
    if (st.settled || st.restart_at) continue;
    bool all_reaped = true, restartable = true;
    for (const auto& c : children_) {
      if (c.spec->group != g) continue;
      all_reaped = all_reaped && (c.pid <= 0 || c.reaped);
      restartable = restartable && !c.spec->restart_argv.empty();
    }
    if (!all_reaped) continue;
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
      message(fmt::format("site {} stays out of the run: {}", g, why_not));
      continue;
    }
    auto wait = opts_.restart_backoff;
    for (int i = 0; i < st.restarts && wait < opts_.restart_backoff_max; ++i) wait *= 2;
    wait = std::min(wait, std::max(opts_.restart_backoff_max, opts_.restart_backoff));
    st.restart_at = Clock::now() + wait;
    message(fmt::format("site {}: every rank is down; restart {} of {} in {:.1f} s", g, st.restarts + 1,
                        opts_.max_restarts, static_cast<double>(wait.count()) / 1000.0));
  }
}

bool Launcher::restart_pending() const {
  for (const auto& [g, st] : group_state_)
    if (st.restart_at) return true;
  return false;
}

int Launcher::ms_to_next_restart() const {
  int64_t best = 250;
  const auto now = Clock::now();
  for (const auto& [g, st] : group_state_)
    if (st.restart_at)
      best =
          std::min<int64_t>(best, std::chrono::duration_cast<std::chrono::milliseconds>(*st.restart_at - now).count());
  return static_cast<int>(std::max<int64_t>(best, 0));
}

void Launcher::start(Child& c) {
  sigset_t block, saved;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGTERM);
  sigaddset(&block, SIGCHLD);
  ::pthread_sigmask(SIG_BLOCK, &block, &saved);
  try {
    start_child(c, devnull_.get(), original_mask_, opts_, block_.get());
  } catch (const Error& e) {
    c.start_error = e.what();
  }
  ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  if (!c.start_error.empty() && c.pid > 0) {
    int st = 0;
    ::waitpid(c.pid, &st, 0);
    c.reaped = true;
  }
}

void Launcher::start_due_restarts() {
  const auto now = Clock::now();
  for (auto& [g, st] : group_state_) {
    if (!st.restart_at || now < *st.restart_at) continue;
    st.restart_at.reset();
    if (stopping_ || run_finished_) continue;
    if (!another_group_runs(g)) {
      st.settled = true;
      message(fmt::format(
          "site {} stays out of the run: no other site is running: there is nothing to rejoin (start the run again "
          "with --resume)",
          g));
      continue;
    }
    ++st.restarts;
    st.bad_input = false;
    groups_down_.erase(g);
    group_kill_at_.erase(g);  // its old processes are reaped; the SIGKILL due to them must not hit the new ones
    message(fmt::format("site {}: restart {} of {}: starting its {} again", g, st.restarts, opts_.max_restarts,
                        group_size_text(g)));
    Child* failed_start = nullptr;
    for (auto& c : children_) {
      if (c.spec->group != g) continue;
      // The previous process's last lines first (it is reaped; its pipes are at EOF or close).
      for (auto s : {std::make_pair(&c.out, c.out_lines.get()), std::make_pair(&c.err, c.err_lines.get())}) {
        const auto until = Clock::now() + std::chrono::milliseconds(200);
        while (s.first->get() >= 0 && Clock::now() < until) {
          pollfd p{s.first->get(), POLLIN, 0};
          ::poll(&p, 1, 20);
          pump(*s.first, *s.second);
        }
        if (s.second) s.second->finish();
      }
      if (block_) pump_status(c, *block_);
      restart_specs_.push_back(*c.spec);
      restart_specs_.back().argv = c.spec->restart_argv;
      c = Child{};
      c.spec = &restart_specs_.back();
      if (failed_start == nullptr) {
        start(c);
        if (!c.start_error.empty()) failed_start = &c;
      } else {
        c.reaped = true;  // not started: its group is going down again
        c.start_error = "not started: a sibling could not be started";
      }
    }
    if (failed_start) stop_group(*failed_start);
  }
}

int Launcher::isolated_result() const {
  // The run finished if some site finished whole (its rounds committed with a quorum).
  std::map<std::string, bool> clean;
  for (const auto& c : children_) {
    auto [it, fresh] = clean.emplace(c.spec->group, true);
    if (failed(c)) it->second = false;
  }
  for (const auto& [g, ok] : clean)
    if (ok && !groups_down_.count(g)) return kExitOk;
  return kExitRankFailed;
}

void Launcher::handle_signal_bytes(int fd) {
  unsigned char buf[64];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) return;
    for (ssize_t i = 0; i < n; ++i) {
      const int sig = buf[i];
      if (sig != SIGINT && sig != SIGTERM) continue;  // SIGCHLD: just a wake-up
      if (!stopping_) {
        message(fmt::format("received SIG{}; stopping {} rank{} (SIGTERM, SIGKILL after {} ms)", ::sigabbrev_np(sig),
                            live(), live() == 1 ? "" : "s", opts_.grace.count()));
        begin_stop(128 + sig);
      } else if (!killed_) {
        message(fmt::format("received SIG{} again; killing {} rank{} now", ::sigabbrev_np(sig), live(),
                            live() == 1 ? "" : "s"));
        signal_all(SIGKILL);
        killed_ = true;
      }
    }
  }
}

int Launcher::run() {
  Pipe sig_pipe = make_pipe();
  ::fcntl(sig_pipe.read.get(), F_SETFL, O_NONBLOCK);
  ::fcntl(sig_pipe.write.get(), F_SETFL, O_NONBLOCK);
  devnull_ = Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (devnull_.get() < 0) sys_fail("open /dev/null");

  SignalScope signals(sig_pipe.write.get(), opts_.handle_signals);
  SubreaperScope subreaper;

  // Block our signals while forking so a child never runs our handler between fork and
  // exec; they stay pending and are handled by the loop below.
  sigset_t block, original;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGTERM);
  sigaddset(&block, SIGCHLD);
  ::pthread_sigmask(SIG_BLOCK, &block, &original);
  original_mask_ = original;
  for (auto& c : children_) {
    start(c);
    if (!c.start_error.empty()) {
      message(fmt::format("rank {} {}; stopping {} other rank{}", c.spec->label, describe_exit(c), live(),
                          live() == 1 ? "" : "s"));
      begin_stop(kExitRankFailed);
      break;
    }
  }
  ::pthread_sigmask(SIG_SETMASK, &original, nullptr);

  std::vector<pollfd> pfds;
  std::vector<std::pair<Fd*, LinePrefixer*>> streams;
  while (live() > 0 || restart_pending()) {
    pfds.clear();
    streams.clear();
    pfds.push_back({sig_pipe.read.get(), POLLIN, 0});
    for (auto& c : children_) {
      if (c.out.get() >= 0) {
        pfds.push_back({c.out.get(), POLLIN, 0});
        streams.push_back({&c.out, c.out_lines.get()});
      }
      if (c.err.get() >= 0) {
        pfds.push_back({c.err.get(), POLLIN, 0});
        streams.push_back({&c.err, c.err_lines.get()});
      }
    }
    const size_t status_first = pfds.size();
    std::vector<Child*> reporting;
    for (auto& c : children_)
      if (c.status.get() >= 0) {
        pfds.push_back({c.status.get(), POLLIN, 0});
        reporting.push_back(&c);
      }
    // 250 ms is only a safety net; SIGCHLD and output wake us up earlier.
    int timeout_ms = ms_to_next_restart();
    if (stopping_ && !killed_) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(kill_at_ - Clock::now()).count();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left, 0, 250));
    }
    int rc = ::poll(pfds.data(), pfds.size(), timeout_ms);
    if (rc < 0 && errno != EINTR) sys_fail("poll");
    if (rc > 0) {
      if (pfds[0].revents) handle_signal_bytes(sig_pipe.read.get());
      for (size_t i = 1; i < status_first; ++i)
        if (pfds[i].revents) pump(*streams[i - 1].first, *streams[i - 1].second);
      for (size_t i = status_first; i < pfds.size(); ++i)
        if (pfds[i].revents) pump_status(*reporting[i - status_first], *block_);
    }
    collect_exits();
    kill_overdue_groups();
    note_finished_groups();
    schedule_restarts();
    start_due_restarts();
    if (stopping_ && !killed_ && Clock::now() >= kill_at_ && live() > 0) {
      message(fmt::format("{} rank{} still running after {} ms; sending SIGKILL", live(), live() == 1 ? "" : "s",
                          opts_.grace.count()));
      signal_all(SIGKILL);
      killed_ = true;
    }
  }
  // Every child is reaped and its group swept; read what is left in the pipes (bounded, in
  // case something escaped its group and still holds a pipe open).
  const auto drain_until = Clock::now() + std::chrono::milliseconds(500);
  for (auto& c : children_) {
    for (auto s : {std::make_pair(&c.out, c.out_lines.get()), std::make_pair(&c.err, c.err_lines.get())}) {
      while (s.first->get() >= 0 && Clock::now() < drain_until) {
        pollfd p{s.first->get(), POLLIN, 0};
        ::poll(&p, 1, 50);
        pump(*s.first, *s.second);
      }
      if (s.second) s.second->finish();
      s.first->reset();
    }
    if (block_) pump_status(c, *block_);
    c.status.reset();
  }
  if (block_) block_->finish();  // the screen is left with the output only
  if (opts_.isolate_groups && !stopping_) return isolated_result();
  return result_;
}

}  // namespace

int launch(const std::vector<ProcessSpec>& procs, const LaunchOptions& opts) {
  if (procs.empty()) throw InputError("launch: no processes to start");
  std::set<std::string> labels;
  for (const auto& p : procs) {
    if (p.argv.empty() || p.argv[0].empty()) throw InputError(fmt::format("launch: {}: empty command line", p.label));
    if (!labels.insert(p.label).second) throw InputError(fmt::format("launch: label '{}' is used twice", p.label));
  }
  if (opts.grace.count() < 0) throw InputError("launch: grace period must not be negative");
  if (opts.max_restarts < 0) throw InputError("launch: max_restarts must not be negative");
  if (opts.restart_backoff.count() < 0 || opts.restart_backoff_max.count() < 0)
    throw InputError("launch: restart backoff must not be negative");
  bool expected = false;
  if (!g_launch_active.compare_exchange_strong(expected, true))
    throw Error("launch: another launch() is already running in this process");
  struct Release {
    ~Release() { g_launch_active.store(false); }
  } release;
  Launcher l(procs, opts);
  return l.run();
}

}  // namespace geoloco::launch
