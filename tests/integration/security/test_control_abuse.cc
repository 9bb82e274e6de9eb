// integration.security.control_abuse: another user misuses a victim's
// control socket (issue 13, item 7) with raw Unix sockets. However it
// misbehaves, the victim's control thread must keep serving others within
// 100 ms, never spin, and hold bounded state for it. Before the fix: half-open
// connections never timed out, the accept loop spun at one core once the
// descriptors ran out, each reply to a peer that does not read blocked the
// thread for 2 s, and unsolicited import replies piled up without bound.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "integration/security/other_user.h"
#include "integration/security/raw_control.h"
#include "time_scale.h"
#include "vmmc/core/context.h"

namespace vmmc::test {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

core::context make_context() {
  auto c = core::context::create({});
  if (!c) std::abort();
  return std::move(*c);
}

struct served_export {
  std::vector<std::byte> memory = std::vector<std::byte>(4096);
  core::export_handle handle;
};

void export_to_anyone(core::context& c, const char* name, served_export& e) {
  core::export_options o;
  o.policy = core::import_policy::anyone();
  auto h = c.export_buffer(name, e.memory.data(), e.memory.size(), o);
  if (!h) std::abort();
  e.handle = *h;
}

// How long a fresh importer takes to import `name` from `address`.
milliseconds time_an_import(const std::string& address, const char* name) {
  core::context importer = make_context();
  const auto start = steady_clock::now();
  auto h = importer.import_buffer(address, name, std::chrono::seconds(10));
  const auto took = std::chrono::duration_cast<milliseconds>(steady_clock::now() - start);
  EXPECT_TRUE(h) << h.error().message();
  return took;
}

// The serving bound of the issue, stretched for sanitizer builds.
milliseconds served_within() {
  return milliseconds(100 * time_scale());
}

double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

TEST(ControlAbuse, ConnectionsThatNeverSayHelloAreBoundedAndTimedOut) {
  if (!other_user_process::possible()) GTEST_SKIP() << "needs root to become another user";
  constexpr int count = 300;
  other_user_process attacker([](line_channel& test) {
    const std::string address = test.receive();
    std::vector<int> held;
    for (int i = 0; i < count; ++i) held.push_back(raw::connect_control(address));
    test.send("connected");
    test.receive();  // the victim served someone else meanwhile
    ::sleep(3);      // past the hello timeout
    int open = 0;
    for (int s : held) {
      pollfd p{s, POLLIN, 0};
      char byte;
      if (s >= 0 && !(::poll(&p, 1, 0) == 1 && ::recv(s, &byte, 1, MSG_DONTWAIT) <= 0)) ++open;
    }
    return open ? std::to_string(open) + " of " + std::to_string(count) +
                      " silent connections still open after 3 s"
                : std::string();
  });
  core::context victim = make_context();
  served_export e;
  export_to_anyone(victim, "served", e);
  attacker.link().send(victim.address());
  ASSERT_EQ(attacker.link().receive(), "connected");
  EXPECT_LE(time_an_import(victim.address(), "served"), served_within());
  attacker.link().send("go on");
  EXPECT_EQ(attacker.finish(), "");
}

TEST(ControlAbuse, OutOfDescriptorsTheControlThreadRestsAndRecovers) {
  if (!other_user_process::possible()) GTEST_SKIP() << "needs root to become another user";
  other_user_process attacker([](line_channel& test) {
    const std::string address = test.receive();
    std::vector<int> held;
    const auto until = steady_clock::now() + std::chrono::seconds(2);
    while (steady_clock::now() < until) {  // keeps the victim's backlog full
      int s = raw::connect_control(address, /*nonblocking=*/true);
      if (s >= 0) held.push_back(s);
      if (held.size() > 400) {
        ::close(held.front());
        held.erase(held.begin());
      }
      ::usleep(1000);
    }
    for (int s : held) ::close(s);
    test.send("done");
    return std::string();
  });
  core::context victim = make_context();
  served_export e;
  export_to_anyone(victim, "served", e);
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  // Room for what is open now and a few more: the flood runs out of it.
  int open_now = 0;
  for (int fd = 0; fd < 4096; ++fd) open_now += ::fcntl(fd, F_GETFD) != -1;
  rlimit low = saved;
  low.rlim_cur = static_cast<rlim_t>(open_now + 16);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  const double cpu_before = cpu_seconds();
  attacker.link().send(victim.address());
  const std::string said = attacker.link().receive();
  const double cpu_used = cpu_seconds() - cpu_before;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  EXPECT_EQ(said, "done");
  // Two seconds of flood: a spinning accept loop burns about all of it.
  EXPECT_LT(cpu_used, 0.6) << "the victim spun while out of descriptors";
  EXPECT_LE(time_an_import(victim.address(), "served"), served_within());
  EXPECT_EQ(attacker.finish(), "");
}

TEST(ControlAbuse, APeerThatDoesNotReadStallsNoOneElse) {
  if (!other_user_process::possible()) GTEST_SKIP() << "needs root to become another user";
  other_user_process attacker([](line_channel& test) {
    const std::string address = test.receive();
    int s = raw::connect_control(address);
    raw::frame reply;
    if (s < 0 || !raw::send_hello(s, raw::address_of("attacker", "3")) ||
        !raw::read_frame(s, reply))
      return std::string("could not say hello");
    for (auto& fd : reply.fds) ::close(fd);
    // Requests whose replies we never read, sent as fast as the victim takes
    // them: more replies than our socket holds.
    ::fcntl(s, F_SETFL, ::fcntl(s, F_GETFL) | O_NONBLOCK);
    int sent = 0;
    for (std::uint64_t id = 1; id <= 3000; ++id, ++sent) {
      if (raw::send_import_request(s, id, "no-such-export")) continue;
      pollfd p{s, POLLOUT, 0};  // a victim that takes nothing for 50 ms is stuck
      if (errno != EAGAIN || ::poll(&p, 1, 50) != 1) break;
    }
    test.send("flooding " + std::to_string(sent));
    test.receive();
    return std::string();
  });
  core::context victim = make_context();
  served_export e;
  export_to_anyone(victim, "served", e);
  attacker.link().send(victim.address());
  const std::string said = attacker.link().receive();
  ASSERT_EQ(said.rfind("flooding", 0), 0u) << said;
  EXPECT_LE(time_an_import(victim.address(), "served"), served_within());
  attacker.link().send("over");
  EXPECT_EQ(attacker.finish(), "");
}

TEST(ControlAbuse, RepliesToNothingAskedEndTheConnection) {
  if (!other_user_process::possible()) GTEST_SKIP() << "needs root to become another user";
  other_user_process exporter([](line_channel& test) {
    std::string why;
    int s = raw::pose_as_exporter(
        test.receive(), "77", [&](const std::string& a) { test.send(a); }, why);
    if (s < 0) return why;
    raw::frame f;
    if (!raw::read_frame(s, f) || f.header.type != raw::hello) return std::string("no hello");
    raw::hello_reply_body hr{0, 0};  // no mapped path: nothing to map
    (void)raw::send_frame(s, raw::hello_reply, &hr, sizeof hr);
    // Answers to requests never made, as fast as the victim takes them.
    raw::import_reply_body r{};
    r.status = 0;
    r.length = 4096;
    r.ring_capacity = 256;
    const auto until = steady_clock::now() + std::chrono::seconds(2);
    std::uint64_t sent = 0;
    while (steady_clock::now() < until && raw::send_frame(s, raw::import_reply, &r, sizeof r))
      r.request_id = 1000 + ++sent;
    const bool cut_off = steady_clock::now() < until;
    test.send("sent " + std::to_string(sent));
    test.receive();
    return cut_off ? std::string()
                   : "the victim took " + std::to_string(sent) + " replies to nothing for 2 s";
  });
  core::context victim = make_context();
  exporter.link().send(victim.address());
  const std::string hostile = exporter.link().receive();
  ASSERT_FALSE(hostile.empty());
  // Connects (hello), then fails: there is no path to the hostile "exporter".
  auto h = victim.import_buffer(hostile, "anything", std::chrono::seconds(3));
  EXPECT_FALSE(h);
  const std::string said = exporter.link().receive();
  EXPECT_EQ(said.rfind("sent", 0), 0u) << said;
  exporter.link().send("over");
  EXPECT_EQ(exporter.finish(), "");
}

}  // namespace
}  // namespace vmmc::test
