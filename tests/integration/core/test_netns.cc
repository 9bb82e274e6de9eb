// integration.core.netns: two simulated hosts (network namespaces joined by
// a veth pair, made and removed by the test) talk over libfabric tcp; a link
// down for a while breaks nothing (as with kernel TCP), and one down for good
// is reported as peer_gone when VMMC_CORE_LIVENESS_MS asks for it.
// Needs CAP_SYS_ADMIN and iproute2; skipped with the reason otherwise.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <thread>
#include <utility>

#include "integration/core/child_process.h"
#include "user_key.h"
#include "vmmc/core/context.h"
#include "vmmc/core/host.h"

namespace vmmc::test {
namespace {

VMMC_TEST_TEMPORARY_USER_KEY;

using namespace std::chrono_literals;

int run(const std::string& command) {
  return std::system((command + " >/dev/null 2>&1").c_str());
}

// In a forked child: enter `ns` and use tcp.
bool enter(const std::string& ns) {
  int fd = ::open(("/var/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) return false;
  ::close(fd);
  ::setenv("VMMC_CORE_PROVIDERS", "tcp", 1);
  return true;
}

// What a user of core whose peers are on other hosts asks for: no address
// setting, core finds where other hosts reach this one (here the
// namespace's one interface besides loopback).
core::context_options across_hosts() {
  core::context_options o;
  o.local_address = core::address_other_hosts_reach();
  return o;
}

class CrossHost : public testing::Test {
 protected:
  void SetUp() override {
    const std::string tag = std::to_string(::getpid() % 100000);
    ns_a_ = "vmmc-a-" + tag;
    ns_b_ = "vmmc-b-" + tag;
    veth_a_ = "vma" + tag;
    veth_b_ = "vmb" + tag;
    const std::string subnet = "10.231." + std::to_string(::getpid() % 250) + ".";
    ip_a_ = subnet + "1";
    ip_b_ = subnet + "2";
    if (run("ip netns add " + ns_a_) != 0) GTEST_SKIP() << "cannot create network namespaces";
    created_ = true;
    ASSERT_EQ(run("ip netns add " + ns_b_), 0);
    ASSERT_EQ(run("ip link add " + veth_a_ + " type veth peer name " + veth_b_), 0);
    ASSERT_EQ(run("ip link set " + veth_a_ + " netns " + ns_a_), 0);
    ASSERT_EQ(run("ip link set " + veth_b_ + " netns " + ns_b_), 0);
    for (auto [ns, dev, ip] :
         {std::tuple{ns_a_, veth_a_, ip_a_}, std::tuple{ns_b_, veth_b_, ip_b_}}) {
      ASSERT_EQ(run("ip -n " + ns + " addr add " + ip + "/24 dev " + dev), 0);
      ASSERT_EQ(run("ip -n " + ns + " link set " + dev + " up"), 0);
      ASSERT_EQ(run("ip -n " + ns + " link set lo up"), 0);
    }
  }
  void TearDown() override {
    if (!created_) return;
    run("ip netns del " + ns_a_);
    run("ip netns del " + ns_b_);
  }

  std::string ns_a_, ns_b_, veth_a_, veth_b_, ip_a_, ip_b_;
  bool created_ = false;
};

// Host A exports and answers each notification with "<value> <byte sum>".
int exporter_on_a(const std::string& ns, int out) {
  if (!enter(ns)) return 10;
  auto c = core::context::create(across_hosts());
  if (!c) return 11;
  std::vector<unsigned char> region(1 << 20);
  bool done = false;
  core::export_options o;
  o.allowed = core::rights::read_write;
  o.on_notify = [&](const core::notification& n) {
    std::uint64_t sum = 0;
    for (std::size_t i = 0; i < n.length; ++i) sum += region[n.offset + i];
    child_process::send_line(out, std::to_string(n.value) + " " + std::to_string(sum));
    done = n.value == 0;
  };
  if (!c->export_buffer("region", region.data(), region.size(), o)) return 12;
  child_process::send_line(out, c->address());
  for (int i = 0; i < 300 && !done; ++i) (void)c->wait_notifications(100ms);
  return 0;
}

// In a forked child: host B's context and its import of A's "region"
// (a null context on any failure).
std::pair<std::optional<core::context>, core::import_handle> importer_on(
    const std::string& ns, const std::string& address) {
  if (!enter(ns)) return {};
  auto c = core::context::create(across_hosts());
  if (!c) return {};
  auto h = c->import_buffer(address, "region");
  if (!h) return {};
  return {std::move(*c), *h};
}

TEST_F(CrossHost, TcpBetweenNamespaces) {
  child_process a([&](int out) { return exporter_on_a(ns_a_, out); });
  const std::string address = a.read_line();
  ASSERT_NE(address.find(ip_a_), std::string::npos) << address;
  child_process b([&](int out) {
    auto [c, h] = importer_on(ns_b_, address);
    if (!c) return 20;
    if (*c->path_of(h) != "fabric:tcp;ofi_rxm") return 23;
    std::vector<unsigned char> data(1 << 20);
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 7);
    std::uint64_t sum = 0;
    for (unsigned char v : data) sum += v;
    if (!c->send(h, 0, data.data(), data.size(), {true, 1}).ok()) return 24;
    std::vector<unsigned char> back(data.size());
    if (!c->fetch(h, 0, back.data(), back.size()).ok() || back != data) return 25;
    child_process::send_line(out, std::to_string(sum));
    std::uint64_t zero = 0;
    return c->send(h, 0, &zero, 0, {true, 0}).ok() ? 0 : 26;
  });
  std::string sum = b.read_line();
  EXPECT_EQ(b.wait(), 0);
  EXPECT_EQ(a.read_line(), "1 " + sum);
  EXPECT_EQ(a.read_line(), "0 0");
  EXPECT_EQ(a.wait(), 0);
}

// Keeps sending to A's region every millisecond for `for_how_long`; prints
// "ok <sends>" or the first error and when it came.
int keep_sending(core::context& c, core::import_handle h, std::chrono::milliseconds for_how_long,
                 int out) {
  std::uint64_t v = 5;
  if (!c.send(h, 0, &v, sizeof v, {true, 5}).ok()) return 23;
  child_process::send_line(out, "sent");
  auto start = std::chrono::steady_clock::now();
  status s;
  long sends = 0;
  while ((s = c.send(h, 0, &v, sizeof v)).ok() &&
         std::chrono::steady_clock::now() - start < for_how_long) {
    ++sends;
    std::this_thread::sleep_for(1ms);
  }
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                  start)
                .count();
  child_process::send_line(
      out, s ? "ok " + std::to_string(sends) : s.error().message() + "|" + std::to_string(ms));
  return 0;
}

// Like a kernel TCP connection, the path to a peer outlives a link that is
// down for a while: nothing fails, and what was sent meanwhile arrives. It
// did not: silence for 600 ms (a heartbeat limit) declared the peer gone,
// and a preloaded iperf3 lost the bytes in flight (issue 15, item 2).
TEST_F(CrossHost, ALinkDownForAWhileBreaksNothing) {
  child_process a([&](int out) { return exporter_on_a(ns_a_, out); });
  const std::string address = a.read_line();
  child_process b([&](int out) {
    auto [c, h] = importer_on(ns_b_, address);
    if (!c) return 20;
    if (int e = keep_sending(*c, h, 5s, out)) return e;
    std::uint64_t zero = 0;
    return c->send(h, 0, &zero, 0, {true, 0}).ok() ? 0 : 26;
  });
  ASSERT_EQ(b.read_line(), "sent");
  EXPECT_EQ(a.read_line(), "5 5");
  std::this_thread::sleep_for(500ms);
  ASSERT_EQ(run("ip -n " + ns_a_ + " link set " + veth_a_ + " down"), 0);
  std::this_thread::sleep_for(3s);
  ASSERT_EQ(run("ip -n " + ns_a_ + " link set " + veth_a_ + " up"), 0);
  std::string report = b.read_line();
  EXPECT_EQ(report.substr(0, 3), "ok ") << report;
  EXPECT_EQ(b.wait(), 0);
  EXPECT_EQ(a.read_line(), "0 0");  // the last notification, after the outage
  EXPECT_EQ(a.wait(), 0);
}

// VMMC_CORE_LIVENESS_MS asks for sooner: heartbeats that stay
// unacknowledged that long end the connection (TCP_USER_TIMEOUT), and the
// peer is reported gone.
TEST_F(CrossHost, ALivenessLimitReportsALinkDownForGood) {
  child_process a([&](int out) { return exporter_on_a(ns_a_, out); });
  const std::string address = a.read_line();
  child_process b([&](int out) {
    ::setenv("VMMC_CORE_LIVENESS_MS", "800", 1);
    auto [c, h] = importer_on(ns_b_, address);
    if (!c) return 20;
    return keep_sending(*c, h, 20s, out);
  });
  ASSERT_EQ(b.read_line(), "sent");
  EXPECT_EQ(a.read_line(), "5 5");
  auto down = std::chrono::steady_clock::now();
  ASSERT_EQ(run("ip -n " + ns_a_ + " link set " + veth_a_ + " down"), 0);
  std::string report = b.read_line();
  auto elapsed = std::chrono::steady_clock::now() - down;
  EXPECT_EQ(report.substr(0, report.find('|')), "peer is gone") << report;
  // The kernel checks its user timeout when a retransmission is due.
  EXPECT_LT(elapsed, 5s) << std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count()
                         << " ms";
  EXPECT_EQ(b.wait(), 0);
  a.kill_now();
  a.wait();
}

// A fetch its caller gave up on (the exporter was reported gone) never
// lands in the caller's memory afterwards, when the link comes back and the
// exporter's answer arrives. It did: a bounced fetch into a local variable
// was copied there after the function had returned (TSan, a preloaded
// python3 across namespaces: "Location is stack of thread T1").
TEST_F(CrossHost, AFetchGivenUpNeverLandsLater) {
  child_process a([&](int out) { return exporter_on_a(ns_a_, out); });
  const std::string address = a.read_line();
  child_process b([&](int out) {
    ::setenv("VMMC_CORE_LIVENESS_MS", "500", 1);
    auto [c, h] = importer_on(ns_b_, address);
    if (!c) return 20;
    std::vector<unsigned char> back(64);
    if (!c->fetch(h, 0, back.data(), back.size()).ok()) return 21;  // the path works
    child_process::send_line(out, "ready");
    std::this_thread::sleep_for(200ms);  // the parent takes the link down meanwhile
    status s = c->fetch(h, 0, back.data(), back.size());
    if (!s.is(errc::peer_gone)) return 22;
    std::fill(back.begin(), back.end(), 0xAA);
    child_process::send_line(out, "gave up");
    std::this_thread::sleep_for(2000ms);  // the link is back; the exporter answers
    for (unsigned char v : back)
      if (v != 0xAA) return 23;
    return 0;
  });
  ASSERT_EQ(b.read_line(), "ready");
  ASSERT_EQ(run("ip -n " + ns_a_ + " link set " + veth_a_ + " down"), 0);
  ASSERT_EQ(b.read_line(), "gave up");
  ASSERT_EQ(run("ip -n " + ns_a_ + " link set " + veth_a_ + " up"), 0);
  EXPECT_EQ(b.wait(), 0) << "22: the fetch did not fail; 23: it landed after it failed";
  a.kill_now();
  a.wait();
}

}  // namespace
}  // namespace vmmc::test
