// geoloco::spawn and geoloco::run_capture: the one way the code base starts a program (the
// launcher's ranks, the host's nvidia-smi). Owns the child (Subprocess: reaped exactly once,
// SIGKILLed and reaped if its owner lets go of it first) and every pipe end it hands out (Fd).
//
// What a child gets, whichever way it is started:
//  * argv[0] looked up in PATH, the parent's environment with SpawnOptions::env added (an
//    entry of the same name replaced);
//  * stdin, stdout and stderr inherited, /dev/null, or a pipe whose other end the parent
//    holds; optionally one more pipe on a descriptor of its choosing (extra_fd: the
//    launcher's status pipe on fd 3); every other descriptor of ours that is close-on-exec
//    stays out of it (all of geoloco's are; an inherited one without the flag goes through,
//    as it would with exec);
//  * the default action for SIGINT, SIGTERM, SIGQUIT, SIGHUP, SIGPIPE and SIGCHLD (a parent
//    that ignores SIGPIPE, as the launcher does, must not hand that on), and the signal mask
//    the calling thread had;
//  * optionally its own process group (a signal to the group reaches its helpers too, and a
//    terminal's Ctrl-C does not), and a parent-death signal (PR_SET_PDEATHSIG, tied by Linux
//    to the calling *thread*: spawn from a thread that outlives the child).
//
// A program that cannot be executed is a SpawnError naming it and the errno text, thrown by
// spawn() itself (the child is reaped by then), never a child that exits 127.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "core/fd.hpp"

namespace geoloco {

// How a child ended: exited with `code`, or was killed by `signal` (then code is 0).
struct ExitStatus {
  int code = 0;
  int signal = 0;

  bool ok() const { return code == 0 && signal == 0; }
  // "exited with code 3", "was killed by signal 9 (SIGKILL: Killed)".
  std::string describe() const;
  bool operator==(const ExitStatus&) const = default;
};

// A program was not started: `what` is the step that failed ("exec", "fork", "pipe"),
// error() its errno. The message: "exec 'prog': No such file or directory".
class SpawnError : public Error {
 public:
  SpawnError(const std::string& what, const std::string& program, int error);
  const std::string& program() const { return program_; }
  int error() const { return error_; }

 private:
  std::string program_;
  int error_;
};

enum class Stdio {
  kInherit,  // the parent's descriptor
  kNull,     // /dev/null
  kPipe,     // a pipe: the parent holds the other end (Subprocess::in/out/err)
};

struct SpawnOptions {
  std::vector<std::string> argv;                         // argv[0]: the program, looked up in PATH
  std::vector<std::pair<std::string, std::string>> env;  // added to (or replacing in) our environment
  Stdio in = Stdio::kInherit, out = Stdio::kInherit, err = Stdio::kInherit;
  // A pipe the child writes to on this descriptor (> 2), the parent reading Subprocess::extra();
  // -1: none.
  int extra_fd = -1;
  bool own_process_group = false;
  int parent_death_signal = 0;  // 0: none
};

class Subprocess {
 public:
  Subprocess() = default;  // owns nothing
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  // A child still running is SIGKILLed (its group, when it has its own) and reaped.
  ~Subprocess();

  // Its pid, also after it was reaped (then only an id for messages: the number may be reused).
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && !reaped_; }
  // The parent's ends of the pipes asked for (invalid otherwise), non-blocking; the caller may
  // read, close or move them at will.
  Fd& in() { return in_; }
  Fd& out() { return out_; }
  Fd& err() { return err_; }
  Fd& extra() { return extra_; }

  // How it ended, without reaping it (waitid WNOWAIT): until wait(), its pid and process
  // group id cannot be reused, so its group can still be signalled safely. nullopt: still
  // running (or already reaped).
  std::optional<ExitStatus> peek_exit() const;
  // Waits for it to end and reaps it; an ended child's status again after that.
  ExitStatus wait();
  // Sends `sig` to its process group when it has its own, else to it; nothing once reaped.
  void signal(int sig) const;

 private:
  friend Subprocess spawn(const SpawnOptions& opts);
  pid_t pid_ = -1;
  bool own_group_ = false;
  bool reaped_ = false;
  ExitStatus status_;
  Fd in_, out_, err_, extra_;
};

// Starts argv[0]. Throws InputError for an empty argv or a bad extra_fd, SpawnError when the
// program could not be started (any pipe made for it is closed, any child reaped).
Subprocess spawn(const SpawnOptions& opts);

struct CaptureOptions {
  std::chrono::milliseconds timeout{20000};
  size_t max_output = size_t{1} << 20;  // bytes on stdout, and on stderr; more is no complete answer
};

// A program's whole output and how it ended.
struct Captured {
  ExitStatus status;
  std::string out, err;
};

// The program ran past CaptureOptions::timeout, or printed more than max_output: it was
// SIGKILLed and reaped.
class CaptureError : public Error {
 public:
  enum class Why { kDeadline, kTooMuchOutput };
  CaptureError(Why why, const std::string& what) : Error(what), why_(why) {}
  Why why() const { return why_; }

 private:
  Why why_;
};

// Runs `argv` with stdin on /dev/null, reads its stdout and stderr to their end and waits for
// it to exit, all within the timeout. Throws SpawnError or CaptureError.
Captured run_capture(const std::vector<std::string>& argv, const CaptureOptions& opts = {});

}  // namespace geoloco
