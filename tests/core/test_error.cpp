// The invariant checks: GEOLOCO_CHECK names the expression and file:line; the comparison
// checks also print both operands (as gloo's ENFORCE_EQ does), each evaluated once.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "core/error.hpp"

using namespace geoloco;

namespace {

std::string failure(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST(Check, ComparisonsPrintBothOperandsAndWhere) {
  const int got = 3, want = 4;
  const std::string m = failure([&] { GEOLOCO_CHECK_EQ(got, want, "site {} rank {}", "paris", 1); });
  EXPECT_NE(m.find("test_error.cpp:"), std::string::npos) << m;
  EXPECT_NE(m.find("check 'got == want' failed (3 vs 4): site paris rank 1"), std::string::npos) << m;
  const size_t n = 10;
  EXPECT_NE(failure([&] { GEOLOCO_CHECK_LT(n, size_t{10}); }).find("check 'n < size_t{10}' failed (10 vs 10)"),
            std::string::npos);
  EXPECT_EQ(failure([&] { GEOLOCO_CHECK_LE(n, size_t{10}); }), "<no error>");
  EXPECT_EQ(failure([&] { GEOLOCO_CHECK_NE(got, want); }), "<no error>");
  EXPECT_NE(failure([&] { GEOLOCO_CHECK_GE(got, want); }).find("(3 vs 4)"), std::string::npos);
  EXPECT_NE(failure([&] { GEOLOCO_CHECK_GT(got, want); }).find("(3 vs 4)"), std::string::npos);
}

TEST(Check, EachOperandIsEvaluatedOnce) {
  int calls = 0;
  auto next = [&] { return ++calls; };
  GEOLOCO_CHECK_EQ(next(), 1);
  EXPECT_EQ(calls, 1);
  EXPECT_NE(failure([&] { GEOLOCO_CHECK_EQ(next(), 7); }).find("(2 vs 7)"), std::string::npos);
  EXPECT_EQ(calls, 2);
}

TEST(Check, PlainChecksNameTheExpressionAndTheMessage) {
  const std::string m = failure([] { GEOLOCO_CHECK(1 + 1 == 3, "arithmetic, {}", "surely"); });
  EXPECT_NE(m.find("check '1 + 1 == 3' failed: arithmetic, surely"), std::string::npos) << m;
}
