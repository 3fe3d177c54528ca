// Starting programs (subprocess.hpp): posix_spawn where it can, fork + exec where a
// parent-death signal needs code in the child; and run_capture's deadline loop.
#include "core/subprocess.hpp"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "core/net.hpp"

extern char** environ;

namespace geoloco {

std::string ExitStatus::describe() const {
  if (signal != 0) {
    const char* abbrev = ::sigabbrev_np(signal);
    return fmt::format("was killed by signal {} (SIG{}: {})", signal, abbrev ? abbrev : "?", ::strsignal(signal));
  }
  return fmt::format("exited with code {}", code);
}

SpawnError::SpawnError(const std::string& what, const std::string& program, int error)
    : Error(fmt::format("{} '{}': {}", what, program, std::strerror(error))), program_(program), error_(error) {}

namespace {

constexpr int kDefaultSignals[] = {SIGINT, SIGTERM, SIGQUIT, SIGHUP, SIGPIPE, SIGCHLD};

struct Pipe {
  Fd read, write;
};

Pipe make_pipe(const std::string& program) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw SpawnError("pipe", program, errno);
  return {Fd(p[0]), Fd(p[1])};
}

// A descriptor the child dup2()s onto 0..reserved must not already have one of those numbers:
// dup2(fd, fd) leaves it close-on-exec, and a later dup2 onto its number would overwrite it.
// (Numbers are free down there when the parent itself runs without stdin, say.)
void keep_above(Fd& fd, int reserved, const std::string& program) {
  if (!fd || fd.get() > reserved) return;
  const int moved = ::fcntl(fd.get(), F_DUPFD_CLOEXEC, reserved + 1);
  if (moved < 0) throw SpawnError("fcntl", program, errno);
  fd.reset(moved);
}

// argv and envp as the char* arrays exec wants, built before the child exists (nothing is
// allocated between fork and exec).
struct ExecArgs {
  std::vector<std::string> env;
  std::vector<char*> argv, envp;
};

ExecArgs exec_args(const SpawnOptions& o) {
  ExecArgs a;
  std::set<std::string> replaced;
  for (const auto& [k, v] : o.env) replaced.insert(k);
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string entry(*e);
    const auto eq = entry.find('=');
    if (eq != std::string::npos && replaced.count(entry.substr(0, eq))) continue;
    a.env.push_back(std::move(entry));
  }
  for (const auto& [k, v] : o.env) a.env.push_back(k + "=" + v);
  for (const auto& s : o.argv) a.argv.push_back(const_cast<char*>(s.c_str()));
  a.argv.push_back(nullptr);
  for (auto& s : a.env) a.envp.push_back(s.data());
  a.envp.push_back(nullptr);
  return a;
}

// What the child's descriptors `target` become (`source`: a descriptor of ours above every
// target). The parent's ends of the pipes go to the Subprocess.
struct Redirect {
  int target;
  Fd source;
};

struct Plan {
  std::vector<Redirect> redirects;
  Fd in, out, err, extra;  // the parent's ends
};

Plan plan_descriptors(const SpawnOptions& o) {
  const std::string& program = o.argv[0];
  const int reserved = std::max(2, o.extra_fd);
  Plan plan;
  Fd null;
  auto add = [&](int target, Stdio how, bool child_reads, Fd& parent_end) {
    if (how == Stdio::kInherit) return;
    Fd source;
    if (how == Stdio::kNull) {
      if (!null) {
        null = Fd(::open("/dev/null", O_RDWR | O_CLOEXEC));
        if (!null) throw SpawnError("open /dev/null for", program, errno);
        keep_above(null, reserved, program);
      }
      source = Fd(::fcntl(null.get(), F_DUPFD_CLOEXEC, reserved + 1));
      if (!source) throw SpawnError("fcntl", program, errno);
    } else {
      Pipe p = make_pipe(program);
      source = std::move(child_reads ? p.read : p.write);
      parent_end = std::move(child_reads ? p.write : p.read);
      keep_above(source, reserved, program);
      net::set_nonblocking(parent_end.get(), true);
    }
    plan.redirects.push_back({target, std::move(source)});
  };
  add(STDIN_FILENO, o.in, true, plan.in);
  add(STDOUT_FILENO, o.out, false, plan.out);
  add(STDERR_FILENO, o.err, false, plan.err);
  if (o.extra_fd >= 0) add(o.extra_fd, Stdio::kPipe, false, plan.extra);
  return plan;
}

// fork + exec: the way that can set a parent-death signal (posix_spawn has no hook to run
// prctl in the child). The child learns its exec's errno through a close-on-exec pipe: EOF
// means the exec succeeded.
pid_t fork_exec(const SpawnOptions& o, const Plan& plan, const ExecArgs& args) {
  const std::string& program = o.argv[0];
  Pipe exec_status = make_pipe(program);
  keep_above(exec_status.write, std::max(2, o.extra_fd), program);
  // Every signal blocked across fork, so the child never runs one of our handlers before
  // exec; it gets the caller's mask back just before exec.
  sigset_t all, caller;
  sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, &caller);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    // The child: async-signal-safe calls only until exec.
    int e = 0;
    if (o.own_process_group) ::setpgid(0, 0);
    if (o.parent_death_signal != 0) {
      ::prctl(PR_SET_PDEATHSIG, o.parent_death_signal);
      if (::getppid() != parent) ::_exit(127);  // the parent died before prctl took effect
    }
    for (const auto& r : plan.redirects)
      if (::dup2(r.source.get(), r.target) < 0) e = errno;
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (int sig : kDefaultSignals) ::sigaction(sig, &dfl, nullptr);
    ::sigprocmask(SIG_SETMASK, &caller, nullptr);
    if (e == 0) {
      ::execvpe(args.argv[0], args.argv.data(), args.envp.data());
      e = errno;
    }
    [[maybe_unused]] ssize_t n = ::write(exec_status.write.get(), &e, sizeof(e));
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &caller, nullptr);
  if (pid < 0) throw SpawnError("fork for", program, fork_errno);
  // Here too, so that signalling the group works before the child has run at all.
  if (o.own_process_group) ::setpgid(pid, pid);
  exec_status.write.reset();
  int e = 0;
  ssize_t n;
  do {
    n = ::read(exec_status.read.get(), &e, sizeof(e));
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof(e))) {
    int st = 0;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    throw SpawnError("exec", program, e);
  }
  return pid;
}

struct FileActions {
  posix_spawn_file_actions_t a;
  explicit FileActions(const std::string& program) {
    if (const int rc = ::posix_spawn_file_actions_init(&a); rc != 0) throw SpawnError("posix_spawn for", program, rc);
  }
  ~FileActions() { ::posix_spawn_file_actions_destroy(&a); }
  FileActions(const FileActions&) = delete;
  FileActions& operator=(const FileActions&) = delete;
};

struct SpawnAttr {
  posix_spawnattr_t a;
  explicit SpawnAttr(const std::string& program) {
    if (const int rc = ::posix_spawnattr_init(&a); rc != 0) throw SpawnError("posix_spawn for", program, rc);
  }
  ~SpawnAttr() { ::posix_spawnattr_destroy(&a); }
  SpawnAttr(const SpawnAttr&) = delete;
  SpawnAttr& operator=(const SpawnAttr&) = delete;
};

// posix_spawn: glibc starts the child with CLONE_VFORK, without copying our address space.
// That matters to a rank that runs nvidia-smi with gigabytes mapped and a CUDA context:
// fork() would copy its page tables (or fail outright where overcommit is strict). glibc
// reports a failed exec as the return value.
pid_t posix_spawn_exec(const SpawnOptions& o, const Plan& plan, const ExecArgs& args) {
  const std::string& program = o.argv[0];
  FileActions actions(program);
  for (const auto& r : plan.redirects)
    if (const int rc = ::posix_spawn_file_actions_adddup2(&actions.a, r.source.get(), r.target); rc != 0)
      throw SpawnError("posix_spawn for", program, rc);
  SpawnAttr attr(program);
  sigset_t defaults, mask;
  sigemptyset(&defaults);
  for (int sig : kDefaultSignals) sigaddset(&defaults, sig);
  ::pthread_sigmask(SIG_BLOCK, nullptr, &mask);
  short flags = POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK;
  if (o.own_process_group) flags |= POSIX_SPAWN_SETPGROUP;
  ::posix_spawnattr_setsigdefault(&attr.a, &defaults);
  ::posix_spawnattr_setsigmask(&attr.a, &mask);
  ::posix_spawnattr_setpgroup(&attr.a, 0);
  ::posix_spawnattr_setflags(&attr.a, flags);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, args.argv[0], &actions.a, &attr.a, args.argv.data(), args.envp.data());
  if (rc != 0) throw SpawnError("exec", program, rc);
  return pid;
}

ExitStatus decode(int wait_status) {
  if (WIFSIGNALED(wait_status)) return {0, WTERMSIG(wait_status)};
  return {WEXITSTATUS(wait_status), 0};
}

}  // namespace

Subprocess spawn(const SpawnOptions& o) {
  if (o.argv.empty() || o.argv[0].empty()) throw InputError("spawn: empty command line");
  if (o.extra_fd >= 0 && o.extra_fd <= 2)
    throw InputError(fmt::format("spawn '{}': extra_fd {} is one of stdin, stdout, stderr", o.argv[0], o.extra_fd));
  const ExecArgs args = exec_args(o);
  Plan plan = plan_descriptors(o);
  Subprocess p;
  p.pid_ = o.parent_death_signal != 0 ? fork_exec(o, plan, args) : posix_spawn_exec(o, plan, args);
  p.own_group_ = o.own_process_group;
  p.in_ = std::move(plan.in);
  p.out_ = std::move(plan.out);
  p.err_ = std::move(plan.err);
  p.extra_ = std::move(plan.extra);
  return p;  // the child's ends (plan.redirects) close here: its copies are all it has
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      own_group_(other.own_group_),
      reaped_(other.reaped_),
      status_(other.status_),
      in_(std::move(other.in_)),
      out_(std::move(other.out_)),
      err_(std::move(other.err_)),
      extra_(std::move(other.extra_)) {}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  Subprocess taken(std::move(other));
  std::swap(pid_, taken.pid_);
  std::swap(own_group_, taken.own_group_);
  std::swap(reaped_, taken.reaped_);
  std::swap(status_, taken.status_);
  std::swap(in_, taken.in_);
  std::swap(out_, taken.out_);
  std::swap(err_, taken.err_);
  std::swap(extra_, taken.extra_);
  return *this;  // the child this held, now in `taken`, is killed and reaped here
}

Subprocess::~Subprocess() {
  if (!running()) return;
  signal(SIGKILL);
  int st = 0;
  while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {}
  reaped_ = true;
}

std::optional<ExitStatus> Subprocess::peek_exit() const {
  if (!running()) return std::nullopt;
  siginfo_t info{};
  if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0) return std::nullopt;
  if (info.si_pid != pid_) return std::nullopt;
  if (info.si_code == CLD_EXITED) return ExitStatus{info.si_status, 0};
  return ExitStatus{0, info.si_status};
}

ExitStatus Subprocess::wait() {
  if (pid_ <= 0) throw Error("wait: no process");
  if (reaped_) return status_;
  int st = 0;
  pid_t got;
  while ((got = ::waitpid(pid_, &st, 0)) < 0 && errno == EINTR) {}
  if (got < 0) throw Error(fmt::format("waitpid {}: {}", pid_, std::strerror(errno)));
  reaped_ = true;
  status_ = decode(st);
  return status_;
}

void Subprocess::signal(int sig) const {
  if (running()) ::kill(own_group_ ? -pid_ : pid_, sig);
}

Captured run_capture(const std::vector<std::string>& argv, const CaptureOptions& opts) {
  const auto deadline = net::Clock::now() + opts.timeout;
  SpawnOptions so;
  so.argv = argv;
  so.in = Stdio::kNull;
  so.out = so.err = Stdio::kPipe;
  // Its own group: the SIGKILL at the deadline reaches what a wrapper script started too.
  so.own_process_group = true;
  Subprocess p = spawn(so);  // from here on, an exception leaves p to kill and reap the child
  const std::string& program = argv[0];
  auto past_deadline = [&] {
    return CaptureError(CaptureError::Why::kDeadline,
                        fmt::format("'{}': no complete answer within {}", program, net::seconds_text(opts.timeout)));
  };
  Captured c;
  char buf[65536];
  while (p.out() || p.err()) {
    pollfd fds[2] = {{p.out().get(), POLLIN, 0}, {p.err().get(), POLLIN, 0}};
    const int n = net::poll_until(fds, deadline);
    if (n == 0) throw past_deadline();
    if (n < 0) throw Error(fmt::format("'{}': poll: {}", program, std::strerror(errno)));
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      Fd& fd = i == 0 ? p.out() : p.err();
      const ssize_t got = ::read(fd.get(), buf, sizeof(buf));
      if (got > 0) {
        std::string& text = i == 0 ? c.out : c.err;
        text.append(buf, static_cast<size_t>(got));
        if (text.size() > opts.max_output)
          throw CaptureError(
              CaptureError::Why::kTooMuchOutput,
              fmt::format("'{}': more than {} bytes on {}", program, opts.max_output, i == 0 ? "stdout" : "stderr"));
      } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
        fd.reset();
      }
    }
  }
  // Both pipes at EOF: normally it has exited already; a program that closed them and goes
  // on is held to the same deadline.
  for (auto pause = std::chrono::milliseconds(1); !p.peek_exit(); pause = std::min(pause * 2, decltype(pause)(20))) {
    if (net::Clock::now() >= deadline) throw past_deadline();
    std::this_thread::sleep_for(std::min<net::Clock::duration>(pause, deadline - net::Clock::now()));
  }
  c.status = p.wait();
  return c;
}

}  // namespace geoloco
