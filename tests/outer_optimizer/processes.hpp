// `geoloco` as separate processes for the outer-loop tests: spawn one with its output in a
// log file, wait for it (bounded, killed past the limit), read the log.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace geoloco::testing {

using Clock = std::chrono::steady_clock;

struct Proc {
  pid_t pid = -1;
  std::string log;
};

inline Proc spawn(const std::vector<std::string>& args, const std::string& log) {
  Proc p;
  p.log = log;
  p.pid = fork();
  if (p.pid == 0) {
    FILE* f = freopen(log.c_str(), "w", stdout);
    (void)f;
    dup2(fileno(stdout), 2);
    std::vector<char*> argv;
    std::string exe = std::string(GEOLOCO_BINARY_DIR) + "/geoloco";
    argv.push_back(exe.data());
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(exe.c_str(), argv.data());
    _exit(127);
  }
  return p;
}

// Waits up to `limit`; returns the exit code (or 128 + signal), -1 on timeout (then kills).
inline int wait_for(Proc& p, std::chrono::seconds limit) {
  auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    int status = 0;
    pid_t r = waitpid(p.pid, &status, WNOHANG);
    if (r == p.pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(p.pid, SIGKILL);
  waitpid(p.pid, nullptr, 0);
  return -1;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline bool contains(const std::string& path, const std::string& needle, std::chrono::seconds limit) {
  auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (slurp(path).find(needle) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

}  // namespace geoloco::testing
