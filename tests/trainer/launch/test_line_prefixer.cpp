#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "trainer/launch/line_prefixer.hpp"

namespace geoloco::launch {
namespace {

std::string read_all(FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) s.append(buf, n);
  return s;
}

TEST(LinePrefixer, SplitsPiecesIntoWholePrefixedLines) {
  FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  LinePrefixer p("paris/1", fileno(f));
  p.feed("hel", 3);
  p.feed("lo\nwor", 6);
  p.feed("ld\n\nlast", 8);
  EXPECT_EQ(read_all(f), "[paris/1] hello\n[paris/1] world\n[paris/1] \n");
  std::fseek(f, 0, SEEK_END);
  p.finish();
  EXPECT_EQ(read_all(f), "[paris/1] hello\n[paris/1] world\n[paris/1] \n[paris/1] last\n");
  p.finish();  // nothing pending: no extra line
  EXPECT_EQ(read_all(f), "[paris/1] hello\n[paris/1] world\n[paris/1] \n[paris/1] last\n");
  std::fclose(f);
}

TEST(LinePrefixer, CutsOverlongLines) {
  FILE* f = std::tmpfile();
  LinePrefixer p("x", fileno(f));
  std::string big(LinePrefixer::kMaxLine + 10, 'a');
  big += "\n";
  p.feed(big.data(), big.size());
  EXPECT_EQ(read_all(f), "[x] " + std::string(LinePrefixer::kMaxLine, 'a') + "\n[x] " + std::string(10, 'a') + "\n");
  std::fclose(f);
}

}  // namespace
}  // namespace geoloco::launch
