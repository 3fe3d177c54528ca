#include "planner/host_topology.hpp"

#include <fmt/format.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.hpp"
#include "core/fd.hpp"

extern char** environ;

namespace geoloco::planner {

namespace {

// Reads both pipes to their end or the deadline; false on the deadline.
bool drain(const Fd& out, const Fd& err, std::string& out_text, std::string& err_text,
           std::chrono::steady_clock::time_point deadline) {
  bool out_open = true, err_open = true;
  char buf[65536];
  while (out_open || err_open) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd fds[2] = {{out_open ? out.get() : -1, POLLIN, 0}, {err_open ? err.get() : -1, POLLIN, 0}};
    const int n = ::poll(fds, 2, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t got = ::read(fds[i].fd, buf, sizeof(buf));
      if (got > 0) {
        (i == 0 ? out_text : err_text).append(buf, static_cast<size_t>(got));
        if (out_text.size() > (size_t{1} << 20)) return false;
      } else if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN)) {
        (i == 0 ? out_open : err_open) = false;
      }
    }
  }
  return true;
}

}  // namespace

std::string read_nvidia_smi_topo(double timeout_s) {
  const char* env = std::getenv("GEOLOCO_NVIDIA_SMI");
  const std::string exe = env != nullptr && *env != '\0' ? env : "nvidia-smi";
  const std::string what = exe + " topo -m";
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) throw InputError(fmt::format("{}: pipe: {}", what, std::strerror(errno)));
  Fd out_r(out_pipe[0]), out_w(out_pipe[1]);
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) throw InputError(fmt::format("{}: pipe: {}", what, std::strerror(errno)));
  Fd err_r(err_pipe[0]), err_w(err_pipe[1]);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_w.get(), STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err_w.get(), STDERR_FILENO);
  std::vector<char*> argv = {const_cast<char*>(exe.c_str()), const_cast<char*>("topo"), const_cast<char*>("-m"),
                             nullptr};
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, exe.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0)
    throw InputError(fmt::format("{}: cannot run it: {} (give site.topology.file instead)", what, std::strerror(rc)));
  out_w.reset();
  err_w.reset();
  std::string text, errors;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  const bool finished = drain(out_r, err_r, text, errors, deadline);
  if (!finished) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  if (!finished) throw InputError(fmt::format("{}: no complete answer within {} s", what, timeout_s));
  while (!errors.empty() && (errors.back() == '\n' || errors.back() == '\r')) errors.pop_back();
  if (WIFSIGNALED(status)) throw InputError(fmt::format("{}: killed by signal {}", what, WTERMSIG(status)));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw InputError(
        fmt::format("{}: exit status {}{}{}", what, WEXITSTATUS(status), errors.empty() ? "" : ": ", errors));
  if (text.empty()) throw InputError(fmt::format("{}: printed nothing", what));
  return text;
}

}  // namespace geoloco::planner
