// The launcher's I/O (see launcher.hpp for what it guarantees): it starts the children, moves
// their output to ours line by line, turns SIGCHLD, SIGINT and SIGTERM into events through a
// self-pipe, reaps every child and sweeps its process group. Every decision -- who is stopped,
// when to SIGKILL, what is restarted, the exit code -- is the Supervisor's (supervisor.hpp):
// this file feeds it events with the time and performs the actions it returns.
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
#include <memory>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/fd.hpp"
#include "core/subprocess.hpp"
#include "trainer/launch/line_prefixer.hpp"
#include "trainer/launch/status_block.hpp"
#include "trainer/launch/supervisor.hpp"

namespace geoloco::launch {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void sys_fail(const std::string& what) {
  throw Error(fmt::format("launch: {}: {}", what, std::strerror(errno)));
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
  Subprocess proc;  // its pipes: out(), err(), and extra() = the status pipe (status view only)
  std::string status_pending;
  std::unique_ptr<LinePrefixer> out_lines, err_lines;
};

// Reads a child's status reports (JSON lines) and hands each whole one to the block.
void pump_status(Child& c, StatusBlock& block) {
  Fd& status = c.proc.extra();
  if (!status) return;
  char buf[16384];
  for (;;) {
    ssize_t n = ::read(status.get(), buf, sizeof(buf));
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
    status.reset();  // EOF
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
  Launcher(const std::vector<ProcessSpec>& procs, const LaunchOptions& opts, const SupervisorOptions& policy)
      : opts_(opts), supervisor_(supervised(procs), policy) {
    if (!opts.status_sites.empty()) block_ = std::make_unique<StatusBlock>(opts.out_fd, opts.status_sites);
    children_.resize(procs.size());
    for (size_t i = 0; i < procs.size(); ++i) children_[i].spec = &procs[i];
  }

  int run();

 private:
  static std::vector<SupervisedChild> supervised(const std::vector<ProcessSpec>& procs) {
    std::vector<SupervisedChild> out;
    for (const auto& p : procs) out.push_back({p.label, p.group, !p.restart_argv.empty()});
    return out;
  }
  void message(const std::string& text) {
    std::string line = "[launch] " + text + "\n";
    if (block_) {
      block_->print(line);
    } else {
      (void)write_all(opts_.err_fd, line.data(), line.size());
    }
  }
  // Performs `actions` in order, and those the answers to its starts bring.
  void perform(std::vector<Action> actions);
  // Returns why it could not be started ("" when it runs).
  std::string start(Child& c, bool restart);
  // Reads what a child left in its pipes until EOF or `until`, and ends its lines.
  void drain(Child& c, Clock::time_point until);
  void collect_exits();
  void handle_signal_bytes(int fd);
  // SIGKILLs what is left of a finished child's process group and reaps it (we are the
  // subreaper, so its orphans become our children), until the group is empty.
  void sweep_group(const Child& c) {
    const pid_t pgid = c.proc.pid();
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    for (;;) {
      ::kill(-pgid, SIGKILL);
      int st = 0;
      while (::waitpid(-pgid, &st, WNOHANG) > 0) {}
      if (::kill(-pgid, 0) != 0 && errno == ESRCH) return;
      if (Clock::now() >= deadline) {
        message(fmt::format("processes left by rank {} (process group {}) did not exit after SIGKILL", c.spec->label,
                            pgid));
        return;
      }
      ::usleep(1000);  // a grandchild whose parent just died is being reparented to us
    }
  }

  const LaunchOptions& opts_;
  Supervisor supervisor_;
  std::unique_ptr<StatusBlock> block_;  // the terminal status view, when asked for
  std::vector<Child> children_;
  std::optional<int> result_;  // the supervisor's kFinish
};

void Launcher::perform(std::vector<Action> actions) {
  std::deque<Action> todo(actions.begin(), actions.end());
  while (!todo.empty()) {
    const Action a = std::move(todo.front());
    todo.pop_front();
    switch (a.kind) {
      case Action::Kind::kStart: {
        const std::string error = start(children_[a.child], a.restart);
        auto next = error.empty() ? supervisor_.started(a.child, Clock::now())
                                  : supervisor_.start_failed(a.child, error, Clock::now());
        todo.insert(todo.end(), next.begin(), next.end());
        break;
      }
      case Action::Kind::kSignal: children_[a.child].proc.signal(a.signal); break;
      case Action::Kind::kMessage: message(a.text); break;
      case Action::Kind::kFinish: result_ = a.code; break;
    }
  }
}

std::string Launcher::start(Child& c, bool restart) {
  if (restart) drain(c, Clock::now() + std::chrono::milliseconds(200));  // the previous process's last lines first
  const bool status_view = block_ != nullptr;
  SpawnOptions so;
  so.argv = restart ? c.spec->restart_argv : c.spec->argv;
  so.env = c.spec->env;
  if (restart)
    for (const auto& kv : c.spec->restart_env) {  // replaces the variable when env sets it too
      auto it = std::find_if(so.env.begin(), so.env.end(), [&](const auto& e) { return e.first == kv.first; });
      if (it != so.env.end())
        it->second = kv.second;
      else
        so.env.push_back(kv);
    }
  so.in = Stdio::kNull;
  so.out = so.err = Stdio::kPipe;
  so.own_process_group = true;
  so.parent_death_signal = SIGKILL;
  if (status_view) {
    so.env.emplace_back("GEOLOCO_STATUS_FD", "3");
    so.extra_fd = 3;
  }
  try {
    c.proc = spawn(so);
  } catch (const Error& e) {
    return e.what();
  }
  c.status_pending.clear();
  if (status_view) {
    auto sink = [block = block_.get()](const std::string& line) { block->print(line); };
    c.out_lines = std::make_unique<LinePrefixer>(c.spec->label, sink);
    c.err_lines = std::make_unique<LinePrefixer>(c.spec->label, sink);
  } else {
    c.out_lines = std::make_unique<LinePrefixer>(c.spec->label, opts_.out_fd);
    c.err_lines = std::make_unique<LinePrefixer>(c.spec->label, opts_.err_fd);
  }
  return {};
}

void Launcher::drain(Child& c, Clock::time_point until) {
  for (auto s : {std::make_pair(&c.proc.out(), c.out_lines.get()), std::make_pair(&c.proc.err(), c.err_lines.get())}) {
    while (s.first->valid() && Clock::now() < until) {
      pollfd p{s.first->get(), POLLIN, 0};
      ::poll(&p, 1, 20);
      pump(*s.first, *s.second);
    }
    if (s.second) s.second->finish();
    s.first->reset();
  }
  if (block_) pump_status(c, *block_);
  c.proc.extra().reset();
}

void Launcher::collect_exits() {
  for (size_t i = 0; i < children_.size(); ++i) {
    Child& c = children_[i];
    // Looked at without reaping, so the pid (and its process group id) cannot be reused while
    // we sweep the group below.
    const std::optional<ExitStatus> status = c.proc.peek_exit();
    if (!status) continue;
    c.proc.signal(SIGKILL);  // helpers it left behind in its group: no orphans
    c.proc.wait();
    sweep_group(c);
    // Its last lines before our message about it.
    pump(c.proc.out(), *c.out_lines);
    pump(c.proc.err(), *c.err_lines);
    perform(supervisor_.exited(i, *status, Clock::now()));
  }
}

void Launcher::handle_signal_bytes(int fd) {
  unsigned char buf[64];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) return;
    for (ssize_t i = 0; i < n; ++i)
      if (buf[i] == SIGINT || buf[i] == SIGTERM) perform(supervisor_.signaled(buf[i], Clock::now()));
    // SIGCHLD: only a wake-up
  }
}

int Launcher::run() {
  int sig_fds[2];
  if (::pipe2(sig_fds, O_CLOEXEC | O_NONBLOCK) != 0) sys_fail("pipe");
  const Fd sig_read(sig_fds[0]), sig_write(sig_fds[1]);
  SignalScope signals(sig_write.get(), opts_.handle_signals);
  SubreaperScope subreaper;

  perform(supervisor_.begin(Clock::now()));
  std::vector<pollfd> pfds;
  std::vector<std::pair<Fd*, LinePrefixer*>> streams;
  std::vector<Child*> reporting;
  while (!result_) {
    pfds.clear();
    streams.clear();
    reporting.clear();
    pfds.push_back({sig_read.get(), POLLIN, 0});
    for (auto& c : children_) {
      for (auto s :
           {std::make_pair(&c.proc.out(), c.out_lines.get()), std::make_pair(&c.proc.err(), c.err_lines.get())}) {
        if (!s.first->valid()) continue;
        pfds.push_back({s.first->get(), POLLIN, 0});
        streams.push_back(s);
      }
    }
    const size_t status_first = pfds.size();
    for (auto& c : children_)
      if (c.proc.extra().valid()) {
        pfds.push_back({c.proc.extra().get(), POLLIN, 0});
        reporting.push_back(&c);
      }
    // 250 ms is only a safety net; SIGCHLD and output wake us up earlier.
    int64_t timeout_ms = 250;
    if (const auto next = supervisor_.next_deadline())
      timeout_ms = std::clamp<int64_t>(std::chrono::ceil<std::chrono::milliseconds>(*next - Clock::now()).count(), 0,
                                       timeout_ms);
    const int rc = ::poll(pfds.data(), pfds.size(), static_cast<int>(timeout_ms));
    if (rc < 0 && errno != EINTR) sys_fail("poll");
    if (rc > 0) {
      if (pfds[0].revents) handle_signal_bytes(sig_read.get());
      for (size_t i = 1; i < status_first; ++i)
        if (pfds[i].revents) pump(*streams[i - 1].first, *streams[i - 1].second);
      for (size_t i = status_first; i < pfds.size(); ++i)
        if (pfds[i].revents) pump_status(*reporting[i - status_first], *block_);
    }
    collect_exits();
    perform(supervisor_.tick(Clock::now()));
  }
  // Every child is reaped and its group swept; read what is left in the pipes (bounded, in
  // case something escaped its group and still holds a pipe open).
  const auto drain_until = Clock::now() + std::chrono::milliseconds(500);
  for (auto& c : children_) drain(c, drain_until);
  if (block_) block_->finish();  // the screen is left with the output only
  return *result_;
}

}  // namespace

int launch(const std::vector<ProcessSpec>& procs, const LaunchOptions& opts) {
  if (procs.empty()) throw InputError("launch: no processes to start");
  std::set<std::string> labels;
  for (const auto& p : procs) {
    if (p.argv.empty() || p.argv[0].empty()) throw InputError(fmt::format("launch: {}: empty command line", p.label));
    if (!labels.insert(p.label).second) throw InputError(fmt::format("launch: label '{}' is used twice", p.label));
  }
  const SupervisorOptions policy{.grace = opts.grace,
                                 .isolate_groups = opts.isolate_groups,
                                 .max_restarts = opts.max_restarts,
                                 .restart_backoff = opts.restart_backoff,
                                 .restart_backoff_max = opts.restart_backoff_max};
  policy.validate();
  bool expected = false;
  if (!g_launch_active.compare_exchange_strong(expected, true))
    throw Error("launch: another launch() is already running in this process");
  struct Release {
    ~Release() { g_launch_active.store(false); }
  } release;
  Launcher l(procs, opts, policy);
  return l.run();
}

}  // namespace geoloco::launch
