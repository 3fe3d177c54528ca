// geoloco::Fd: owns one descriptor, closes it exactly once (never a descriptor number that
// was closed and handed out again), moves, releases, and reports close() errors.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "core/fd.hpp"

namespace geoloco {
namespace {

bool is_open(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

int open_null() {
  const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0);
  return fd;
}

TEST(Fd, ClosesOnDestruction) {
  int raw = open_null();
  {
    Fd f(raw);
    EXPECT_TRUE(f.valid());
    EXPECT_EQ(f.get(), raw);
    EXPECT_TRUE(is_open(raw));
  }
  EXPECT_FALSE(is_open(raw));
  EXPECT_EQ(errno, EBADF);
}

TEST(Fd, DefaultAndNegativeOwnNothing) {
  Fd a;
  Fd b(-5);
  EXPECT_FALSE(a.valid());
  EXPECT_FALSE(b);
  EXPECT_EQ(b.get(), -1);
  EXPECT_EQ(a.close(), 0);
}

// The number of a closed descriptor is handed out again by the next open(): an owner that
// closed twice would close that stranger. Moved-from and released owners must not.
TEST(Fd, ClosesExactlyOnceAcrossMovesAndReuse) {
  const int raw = open_null();
  Fd a(raw);
  Fd b(std::move(a));
  EXPECT_FALSE(a.valid());  // NOLINT(bugprone-use-after-move): moved-from owns nothing
  EXPECT_EQ(b.get(), raw);
  b.reset();
  EXPECT_FALSE(is_open(raw));
  const int reused = open_null();
  ASSERT_EQ(reused, raw) << "the kernel hands out the lowest free number";
  {
    Fd gone(std::move(a));  // NOLINT(bugprone-use-after-move)
    b.reset();
    Fd c;
    c = std::move(gone);
  }
  EXPECT_TRUE(is_open(reused)) << "a moved-from or reset owner closed a descriptor it no longer owns";
  ::close(reused);
}

TEST(Fd, MoveAssignClosesTheOldOneAndSelfMoveKeepsIt) {
  const int x = open_null(), y = open_null();
  Fd a(x), b(y);
  a = std::move(b);
  EXPECT_FALSE(is_open(x));
  EXPECT_EQ(a.get(), y);
  Fd& self = a;
  a = std::move(self);
  EXPECT_EQ(a.get(), y);
  EXPECT_TRUE(is_open(y));
}

TEST(Fd, ResetToTheSameDescriptorKeepsItOpen) {
  const int x = open_null();
  Fd a(x);
  a.reset(x);
  EXPECT_TRUE(is_open(x));
  EXPECT_EQ(a.get(), x);
  const int y = open_null();
  a.reset(y);
  EXPECT_FALSE(is_open(x));
  EXPECT_EQ(a.get(), y);
}

TEST(Fd, ReleaseGivesUpOwnership) {
  const int x = open_null();
  int taken = -1;
  {
    Fd a(x);
    taken = a.release();
    EXPECT_FALSE(a.valid());
  }
  EXPECT_EQ(taken, x);
  EXPECT_TRUE(is_open(x));
  ::close(x);
}

TEST(Fd, CloseReportsTheErrorAndReleasesEitherWay) {
  Fd ok(open_null());
  EXPECT_EQ(ok.close(), 0);
  EXPECT_FALSE(ok.valid());
  // A descriptor closed behind the owner's back: close() says EBADF instead of hiding it.
  const int x = open_null();
  Fd stale(x);
  ::close(x);
  EXPECT_EQ(stale.close(), EBADF);
  EXPECT_FALSE(stale.valid());
  EXPECT_EQ(close_fd(-1), 0);
}

}  // namespace
}  // namespace geoloco
