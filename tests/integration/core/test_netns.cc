// integration.core.netns: two simulated hosts (network namespaces joined by
// a veth pair, made and removed by the test) talk over libfabric tcp; a link
// that goes down is reported as peer_gone within a second (heartbeats).
// Needs CAP_SYS_ADMIN and iproute2; skipped with the reason otherwise.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <utility>

#include "integration/core/child_process.h"
#include "user_key.h"
#include "vmmc/core/context.h"

namespace vmmc::test {
namespace {

VMMC_TEST_TEMPORARY_USER_KEY;

using namespace std::chrono_literals;

int run(const std::string& command) { return std::system((command + " >/dev/null 2>&1").c_str()); }

// In a forked child: enter `ns` and configure core to use tcp from `ip`.
bool enter(const std::string& ns, const std::string& ip) {
  int fd = ::open(("/var/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) return false;
  ::close(fd);
  ::setenv("VMMC_CORE_PROVIDERS", "tcp", 1);
  ::setenv("VMMC_CORE_TCP_ADDRESS", ip.c_str(), 1);
  return true;
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
    for (auto [ns, dev, ip] : {std::tuple{ns_a_, veth_a_, ip_a_}, std::tuple{ns_b_, veth_b_, ip_b_}}) {
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
int exporter_on_a(const std::string& ns, const std::string& ip, int out) {
  if (!enter(ns, ip)) return 10;
  auto c = core::context::create();
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
    const std::string& ns, const std::string& ip, const std::string& address) {
  if (!enter(ns, ip)) return {};
  auto c = core::context::create();
  if (!c) return {};
  auto h = c->import_buffer(address, "region");
  if (!h) return {};
  return {std::move(*c), *h};
}

TEST_F(CrossHost, TcpBetweenNamespaces) {
  child_process a([&](int out) { return exporter_on_a(ns_a_, ip_a_, out); });
  const std::string address = a.read_line();
  ASSERT_NE(address.find(ip_a_), std::string::npos) << address;
  child_process b([&](int out) {
    auto [c, h] = importer_on(ns_b_, ip_b_, address);
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

TEST_F(CrossHost, BrokenLinkIsReportedWithinOneSecond) {
  child_process a([&](int out) { return exporter_on_a(ns_a_, ip_a_, out); });
  const std::string address = a.read_line();
  child_process b([&](int out) {
    auto [c, h] = importer_on(ns_b_, ip_b_, address);
    if (!c) return 20;
    std::uint64_t v = 5;
    if (!c->send(h, 0, &v, sizeof v, {true, 5}).ok()) return 23;
    child_process::send_line(out, "sent");
    // Keep sending until the broken link is reported; print how long after
    // the parent's "down" line it took.
    auto start = std::chrono::steady_clock::now();
    status s;
    while ((s = c->send(h, 0, &v, sizeof v)).ok() &&
           std::chrono::steady_clock::now() - start < 10s)
      std::this_thread::sleep_for(1ms);
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::steady_clock::now() - start)
                  .count();
    child_process::send_line(out, s.error().message() + "|" + std::to_string(ms));
    return 0;
  });
  ASSERT_EQ(b.read_line(), "sent");
  EXPECT_EQ(a.read_line(), "5 5");
  auto down = std::chrono::steady_clock::now();
  ASSERT_EQ(run("ip -n " + ns_a_ + " link set " + veth_a_ + " down"), 0);
  std::string report = b.read_line();
  auto elapsed = std::chrono::steady_clock::now() - down;
  EXPECT_EQ(report.substr(0, report.find('|')), "peer is gone") << report;
  EXPECT_LT(elapsed, 1s) << std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count()
                         << " ms";
  EXPECT_EQ(b.wait(), 0);
}

// A fetch its caller gave up on (the exporter went silent past the liveness
// limit: peer_gone) never lands in the caller's memory afterwards, when the
// exporter wakes and answers it. It did: a bounced fetch into a local
// variable was copied there after the function had returned (TSan, a
// preloaded python3 across namespaces: "Location is stack of thread T1").
TEST_F(CrossHost, AFetchGivenUpNeverLandsLater) {
  child_process a([&](int out) { return exporter_on_a(ns_a_, ip_a_, out); });
  const std::string address = a.read_line();
  child_process b([&](int out) {
    auto [c, h] = importer_on(ns_b_, ip_b_, address);
    if (!c) return 20;
    std::vector<unsigned char> back(64);
    if (!c->fetch(h, 0, back.data(), back.size()).ok()) return 21;  // the path works
    child_process::send_line(out, "ready");
    std::this_thread::sleep_for(200ms);  // the parent stops the exporter meanwhile
    status s = c->fetch(h, 0, back.data(), back.size());
    if (!s.is(errc::peer_gone)) return 22;
    std::fill(back.begin(), back.end(), 0xAA);
    child_process::send_line(out, "gave up");
    std::this_thread::sleep_for(1500ms);  // the exporter runs again and answers
    for (unsigned char v : back)
      if (v != 0xAA) return 23;
    return 0;
  });
  ASSERT_EQ(b.read_line(), "ready");
  ::kill(a.pid(), SIGSTOP);
  ASSERT_EQ(b.read_line(), "gave up");
  ::kill(a.pid(), SIGCONT);
  EXPECT_EQ(b.wait(), 0) << "22: the fetch did not fail; 23: it landed after it failed";
  a.kill_now();
  a.wait();
}

}  // namespace
}  // namespace vmmc::test
