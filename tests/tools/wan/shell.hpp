// Shell helper for the WAN tests: a bash command under a hard time limit, stdout and stderr
// together, with its exit status (-1 when it did not exit normally).
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace geoloco::wan_test {

struct Result {
  int rc = -1;
  std::string out;
};

inline Result sh(const std::string& cmd, int timeout_s = 90) {
  const std::string full = "timeout -k 5 " + std::to_string(timeout_s) + " bash -c '" + cmd + "' 2>&1";
  Result r;
  FILE* p = popen(full.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

}  // namespace geoloco::wan_test
