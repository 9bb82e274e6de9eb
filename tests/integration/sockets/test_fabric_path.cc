// Sockets over the libfabric path (CTest runs this with VMMC_CORE_MAPPED=0
// and a provider, as between hosts): a large receive posted before the data
// is sent gets it placed straight into the application's buffer (redirect
// counters: no receive-side copy), and the bytes are right.
#include <chrono>
#include <thread>

#include "integration/sockets/support.h"

namespace vmmc::test {
namespace {

constexpr std::size_t transfer = 16 << 20;

// Accepts, switches both directions with one round trip, then posts one
// receive of `transfer` bytes (MSG_WAITALL) and reports the counters' change.
const peer_role posted_receiver("posted_receiver", [](peer_context& p) {
  int port = 0;
  int listener = listen_loopback(p.io(), &port);
  p.say("port " + std::to_string(port));
  int fd = accept_within(p.io(), listener);
  if (fd < 0) return 1;
  char c = 0;
  for (int i = 0; i < 3; ++i)  // each direction switches on its first bytes
    if (read_full(p.io(), fd, &c, 1) != 1 || !write_all(p.io(), fd, &c, 1)) return 2;
  auto before = vmmc::sockets::describe(fd);
  if (!before) return 3;
  std::vector<unsigned char> buffer(transfer);
  p.say("posting");
  ssize_t n = p.io().recv(fd, buffer.data(), buffer.size(), MSG_WAITALL);
  auto after = vmmc::sockets::describe(fd);
  if (n != static_cast<ssize_t>(transfer)) p.fail("recv returned " + std::to_string(n));
  if (check_pattern(5, 0, buffer.data(), buffer.size()) != buffer.size())
    p.fail("received bytes differ from what was sent");
  p.say("path " + after->path);
  p.say("copied " + std::to_string(after->bytes_copied - before->bytes_copied));
  p.say("redirected " + std::to_string(after->bytes_redirected - before->bytes_redirected));
  p.io().close(fd);
  p.io().close(listener);
  return 0;
});

TEST(FabricPath, LargeReceivePostedFirstIsPlacedWithoutACopy) {
  watchdog guard(60s);
  peer receiver("posted_receiver", vmmc_api);
  int port = static_cast<int>(receiver.read_value("port"));
  int fd = connect_loopback(vmmc_api, port);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  char c = 'x';
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(write_all(vmmc_api, fd, &c, 1));
    ASSERT_EQ(read_full(vmmc_api, fd, &c, 1), 1);
  }
  ASSERT_EQ(check_accelerated(vmmc_api, fd), "");
  ASSERT_EQ(receiver.read_line(), "posting");
  // The receiver is about to block in recv(); no event says it has posted
  // its buffer, so give it ample time before the data leaves.
  std::this_thread::sleep_for(200ms);
  auto data = pattern(5, transfer);
  ASSERT_TRUE(write_all(vmmc_api, fd, data.data(), data.size()));
  std::string path = receiver.read_line();
  EXPECT_EQ(path.rfind("path fabric:", 0), 0u) << path;
  EXPECT_EQ(receiver.read_value("copied"), 0) << "receive-side copies of a posted receive";
  EXPECT_EQ(receiver.read_value("redirected"), static_cast<long long>(transfer));
  vmmc_api.close(fd);
  EXPECT_EQ(receiver.wait(), 0);
}

}  // namespace
}  // namespace vmmc::test
