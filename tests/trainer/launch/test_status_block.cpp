// StatusBlock: the terminal status view's line per site and its drawing protocol (erase the
// block, print the log lines, draw it again; erase it at the end).
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "trainer/launch/status_block.hpp"

using geoloco::launch::StatusBlock;

namespace {

std::string drain(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, size_t(n));
  }
  return out;
}

}  // namespace

TEST(StatusBlock, OneLinePerSiteWithEveryFigure) {
  const nlohmann::json s = {{"site", "paris"},       {"step", 150},
                            {"steps", 300},          {"loss", 2.34567},
                            {"val_loss", 2.8},       {"tokens_per_s", 24200.0},
                            {"elapsed_s", 30.0},     {"sync_s", 0.25},
                            {"exposed_wait_s", 0.5}, {"compute_utilization", 0.954},
                            {"members", 2},          {"sites", 2}};
  const std::string line = StatusBlock::format_line("paris", 5, s, 200);
  EXPECT_EQ(line,
            "paris  step 150/300 [########--------]  50%  loss 2.3457 (val 2.8000)  24.2k tok/s  ETA 30s  "
            "sync 0.25s (wait 0.50s)  util 95.4%  sites 2/2");
  // Cut to the terminal's width; a site that has not reported yet says so.
  EXPECT_EQ(StatusBlock::format_line("paris", 5, s, 20), "paris  step 150/300 ");
  EXPECT_EQ(StatusBlock::format_line("lyon", 5, nullptr, 80), "lyon   starting...");
  nlohmann::json done = s;
  done["step"] = 300;
  done["done"] = true;
  EXPECT_NE(
      StatusBlock::format_line("paris", 5, done, 200).find("100%  loss 2.3457 (val 2.8000)  24.2k tok/s  done in 30s"),
      std::string::npos);
}

TEST(StatusBlock, LogLinesGoAboveTheBlockAndTheEndLeavesNoBlock) {
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  std::string out;
  {
    StatusBlock b(p[1], {"paris", "lyon"});
    b.update({{"site", "paris"}, {"step", 1}, {"steps", 10}});  // first report: drawn at once
    b.print("[paris/0] info hello\n");
    b.finish();
    b.print("[launch] after the end\n");  // plain once finished
    ::close(p[1]);
    out = drain(p[0]);
  }
  ::close(p[0]);
  const std::string block = "paris  step 1/10 [#---------------]  10%  ? tok/s\nlyon   starting...\n";
  const std::string erase = "\r\x1b[2A\x1b[J";
  EXPECT_EQ(out, block + erase + "[paris/0] info hello\n" + block + erase + "[launch] after the end\n");
}
