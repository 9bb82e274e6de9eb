// The presence table (sockets/src/presence.cc): a process with many
// connections on this host gets every socket entered, so none of them stays
// kernel TCP for want of a slot. (With one bucket per cookie, 2,000
// entries overflowed a bucket in one run of 500: CI saw a connection of
// integration.sockets.epoll's thousand stay on TCP, "channel set-up failed".)
#include "presence.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace {
namespace presence = vmmc::sockets::detail::presence;

class Presence : public ::testing::Test {
 protected:
  // A table of our own: the host's, shared with every other test, is not
  // ours to fill.
  void SetUp() override {
    char pattern[] = "/tmp/vmmc-presence-test.XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
    ASSERT_EQ(::setenv("VMMC_SOCKETS_STAT_DIR", dir_.c_str(), 1), 0);
  }
  void TearDown() override {
    (void)::unlink((dir_ + "/vmmc-presence-" + std::to_string(::geteuid())).c_str());
    (void)::rmdir(dir_.c_str());
  }
  // A fresh socket's cookie as entered (0: not entered). The entry outlives
  // the socket, as one of a process that closed it unseen would.
  static std::uint64_t enter_one() {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    std::uint64_t cookie = presence::enter(fd);
    ::close(fd);
    return cookie;
  }
  std::string dir_;
};

// Half the table's slots: one bucket per cookie overflowed at 2,000.
TEST_F(Presence, HalfTheTableIsEnteredWithoutAFullBucket) {
  constexpr int sockets = 8192;
  std::vector<std::uint64_t> cookies;
  cookies.reserve(sockets);
  int refused = 0;
  for (int i = 0; i < sockets; ++i) {
    std::uint64_t cookie = enter_one();
    if (cookie == 0) ++refused;
    cookies.push_back(cookie);
  }
  EXPECT_EQ(refused, 0) << "of " << sockets << " sockets";
  // Each is found where it went, and its marks are its own.
  int missing = 0;
  for (std::uint64_t cookie : cookies)
    if (cookie && presence::entry_of({::geteuid(), cookie}) != presence::entry::entered) ++missing;
  EXPECT_EQ(missing, 0);
  presence::ask(cookies.front());
  presence::decline(cookies.back());
  EXPECT_EQ(presence::entry_of({::geteuid(), cookies.front()}), presence::entry::asking);
  EXPECT_EQ(presence::entry_of({::geteuid(), cookies.back()}), presence::entry::declined);
  EXPECT_EQ(presence::entry_of({::geteuid(), cookies[sockets / 2]}), presence::entry::entered);
}

}  // namespace
