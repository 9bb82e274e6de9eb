// integration.core.process: behaviour between real processes over each
// transport: data and notifications across processes, a killed exporter or
// importer, garbage on the control listeners, and no shared-memory leftovers.
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <set>
#include <thread>

#include "integration/core/child_process.h"
#include "integration/core/transports.h"

namespace vmmc::test {
namespace {

using namespace std::chrono_literals;

class Process : public testing::TestWithParam<transport> {};

// Child: exports a 1 MiB region as "region" (read/write), prints its address,
// then serves notifications: each notification's value is echoed back as a
// line "<value> <checksum of the notified bytes>" until value 0 arrives.
int exporter_child(const transport& t, int to_parent) {
  core::context c = make_context(t);
  guarded_region region(c, 1 << 20, t.mappable);
  bool done = false;
  core::export_options o;
  o.allowed = core::rights::read_write;
  o.on_notify = [&](const core::notification& n) {
    std::uint64_t sum = 0;
    for (std::size_t i = 0; i < n.length; ++i)
      sum = sum * 131 + static_cast<unsigned char>(region.data()[n.offset + i]);
    child_process::send_line(to_parent, std::to_string(n.value) + " " + std::to_string(sum));
    done = n.value == 0;
  };
  if (!c.export_buffer("region", region.data(), region.size(), o)) return 2;
  child_process::send_line(to_parent, c.address());
  while (!done) (void)c.wait_notifications(1000ms);
  return 0;
}

std::uint64_t checksum(const std::vector<unsigned char>& v) {
  std::uint64_t sum = 0;
  for (unsigned char b : v) sum = sum * 131 + b;
  return sum;
}

TEST_P(Process, SendsAndNotificationsCrossProcesses) {
  child_process child([&](int out) { return exporter_child(GetParam(), out); });
  std::string address = child.read_line();
  core::context me = make_context(GetParam());
  auto h = me.import_buffer(address, "region");
  ASSERT_TRUE(h) << h.error().message();
  EXPECT_EQ(*me.path_of(*h), GetParam().expect);
  for (std::size_t size : {std::size_t{8}, std::size_t{5000}, std::size_t{1} << 20}) {
    std::vector<unsigned char> data(size);
    for (std::size_t i = 0; i < size; ++i) data[i] = static_cast<unsigned char>(i ^ size);
    ASSERT_TRUE(me.send(*h, 0, data.data(), size, {true, size}).ok());
    EXPECT_EQ(child.read_line(), std::to_string(size) + " " + std::to_string(checksum(data)));
    std::vector<unsigned char> back(size);
    ASSERT_TRUE(me.fetch(*h, 0, back.data(), size).ok());
    EXPECT_EQ(back, data);
  }
  std::uint64_t zero = 0;
  ASSERT_TRUE(me.send(*h, 0, &zero, sizeof zero, {true, 0}).ok());
  child.read_line();
  EXPECT_EQ(child.wait(), 0);
}

// A killed exporter turns every operation on its imports into peer_gone
// within one second, including a request that was in flight.
TEST_P(Process, KilledExporterIsDetectedWithinOneSecond) {
  child_process child([&](int out) { return exporter_child(GetParam(), out); });
  std::string address = child.read_line();
  core::context me = make_context(GetParam());
  auto h = me.import_buffer(address, "region");
  ASSERT_TRUE(h) << h.error().message();
  std::vector<std::byte> data(1 << 20, std::byte{1});
  ASSERT_TRUE(me.send(*h, 0, data.data(), 64).ok());

  child.kill_now();
  auto killed = std::chrono::steady_clock::now();
  status s;
  while ((s = me.send(*h, 0, data.data(), data.size())).ok() &&
         std::chrono::steady_clock::now() - killed < 3s) {
  }
  auto detected = std::chrono::steady_clock::now() - killed;
  EXPECT_TRUE(s.is(errc::peer_gone)) << s.error().message();
  EXPECT_LT(detected, 1s) << std::chrono::duration_cast<std::chrono::milliseconds>(detected).count()
                          << " ms";
  EXPECT_TRUE(me.fetch(*h, 0, data.data(), 8).is(errc::peer_gone));
  EXPECT_TRUE(me.send_async(*h, 0, data.data(), 8).is(errc::peer_gone));
  // Importing again from the dead address fails cleanly.
  auto again = me.import_buffer(address, "region", 1000ms);
  EXPECT_FALSE(again);
  child.wait();
}

// The exporter survives an importer killed mid-stream, can withdraw the
// export promptly, and serves a new importer. Over libfabric's shm the
// importer is killed between its transfers: a writer killed inside one can
// leave the shared spinlock of the exporter's region held, and libfabric
// 1.17 then spins in fi_cq_read for ever (README, "Known limit"; seen here
// once in ~400 runs, the lock word at offset 0x18 of /dev/shm/<pid>:0:<n>
// held by the dead importer).
TEST_P(Process, KilledImporterLeavesTheExporterServing) {
  core::context me = make_context(GetParam());
  guarded_region region(me, 1 << 20, GetParam().mappable);
  auto e = me.export_buffer("target", region.data(), region.size());
  ASSERT_TRUE(e);
  std::string address = me.address();
  const bool between_transfers = std::string(GetParam().name) == "shm";
  auto importer_body = [&](int out) {
    core::context c = make_context(GetParam());
    auto h = c.import_buffer(address, "target");
    if (!h) return 3;
    child_process::send_line(out, "ready");
    std::vector<std::byte> chunk(1 << 18, std::byte{9});
    for (int sent = 0;; ++sent) {
      if (between_transfers && sent == 64) {
        child_process::send_line(out, "idle");
        ::pause();
      }
      if (!c.send(*h, 0, chunk.data(), chunk.size(), {true, 1}).ok()) return 4;
    }
  };
  {
    child_process child(importer_body);
    ASSERT_EQ(child.read_line(), "ready");
    if (between_transfers) {
      EXPECT_EQ(child.read_line(), "idle");
    }
    for (int i = 0; i < 20; ++i) me.poll_notifications();
    std::this_thread::sleep_for(50ms);
    child.kill_now();
    child.wait();
  }
  std::this_thread::sleep_for(100ms);
  me.poll_notifications();
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(me.unexport_buffer(*e).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 500ms);
  ASSERT_TRUE(me.export_buffer("target", region.data(), region.size()));
  child_process second(importer_body);
  EXPECT_EQ(second.read_line(), "ready");
  if (between_transfers) {
    EXPECT_EQ(second.read_line(), "idle");  // before it is killed
  }
}

// Extracts "key=value" from an address blob (white-box: tests only).
std::string field(const std::string& blob, const std::string& key) {
  auto at = blob.find(";" + key + "=");
  if (at == std::string::npos) return "";
  auto start = at + key.size() + 2;
  return blob.substr(start, blob.find(';', start) - start);
}

int connect_control(const std::string& blob, bool tcp) {
  if (tcp) {
    std::string c = field(blob, "c");
    if (c.empty()) return -1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(std::stoi(c.substr(c.rfind(':') + 1))));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return -1;
    return fd;
  }
  std::string name = "vmmc." + field(blob, "p") + "." + field(blob, "n");
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), len) != 0) return -1;
  return fd;
}

TEST_P(Process, GarbageOnTheControlListenerIsRefused) {
  core::context me = make_context(GetParam());
  guarded_region region(me, 4096, GetParam().mappable);
  std::atomic<int> seen{0};
  core::export_options o;
  o.on_notify = [&](const core::notification&) { ++seen; };
  ASSERT_TRUE(me.export_buffer("victim", region.data(), region.size(), o));
  const bool tcp = GetParam().providers[0] == "tcp";
  const std::string garbage[] = {
      "GET / HTTP/1.0\r\n\r\n",
      std::string("VMMC\x01\x00\x01\x00\xff\xff\xff\x7f", 12),  // magic, huge length
      std::string("VMMC\x01\x00\x03\x00\x04\x00\x00\x00"
                  "abcd",
                  16),  // import before hello
      std::string("VMMC\x01\x00\x01\x00\x10\x00\x00\x00", 12) + std::string(16, '\xff'),
      std::string(100000, '\0'),
  };
  for (const std::string& g : garbage) {
    int fd = connect_control(me.address(), tcp);
    ASSERT_GE(fd, 0);
    [[maybe_unused]] ssize_t n = ::send(fd, g.data(), g.size(), MSG_NOSIGNAL);
    char buf[64];
    timeval tv{2, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    // The exporter closes such a connection rather than answering it.
    EXPECT_LE(::recv(fd, buf, sizeof buf, 0), 0);
    ::close(fd);
  }
  // And still serves a real importer in another process.
  std::string address = me.address();
  child_process child([&](int) {
    core::context c = make_context(GetParam());
    auto h = c.import_buffer(address, "victim");
    if (!h) return 3;
    std::uint32_t v = 7;
    return c.send(*h, 0, &v, sizeof v, {true, 7}).ok() ? 0 : 4;
  });
  EXPECT_EQ(child.wait(), 0);
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (seen == 0 && std::chrono::steady_clock::now() < deadline)
    (void)me.wait_notifications(100ms);
  EXPECT_EQ(seen.load(), 1);
}

// Shared-memory files in /dev/shm that belong to process `pid` (libfabric's
// shm provider names them "<pid>:<n>:<n>"; our own memfds have no name).
std::set<std::string> shm_files_of(pid_t pid) {
  std::set<std::string> names;
  const std::string prefix = std::to_string(pid) + ":";
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d))
      if (std::string(e->d_name).rfind(prefix, 0) == 0) names.insert(e->d_name);
    ::closedir(d);
  }
  return names;
}

TEST_P(Process, NoSharedMemoryFilesOutliveTheirProcess) {
  {  // normal exit
    child_process child([&](int out) { return exporter_child(GetParam(), out); });
    std::string address = child.read_line();
    core::context me = make_context(GetParam());
    auto h = me.import_buffer(address, "region");
    ASSERT_TRUE(h);
    std::uint64_t zero = 0;
    ASSERT_TRUE(me.send(*h, 0, &zero, sizeof zero, {true, 0}).ok());
    child.read_line();
    EXPECT_EQ(child.wait(), 0);
    EXPECT_TRUE(shm_files_of(child.pid()).empty());
  }
  EXPECT_TRUE(shm_files_of(::getpid()).empty());
  pid_t killed;
  {  // killed: whatever it left is removed by the next context that starts
    child_process child([&](int out) { return exporter_child(GetParam(), out); });
    child.read_line();
    killed = child.pid();
    child.kill_now();
    child.wait();
  }
  { core::context next = make_context(transports[0]); }
  EXPECT_TRUE(shm_files_of(killed).empty());
}

INSTANTIATE_TEST_SUITE_P(Core, Process, testing::ValuesIn(transports), transport_name);

// context::shared(): one context a process while anyone holds it; a fork()
// child gets a working one of its own (the parent's copy has no threads
// there); once every holder lets go it ends, and the next call makes another.
TEST(SharedContext, OneAProcessWhileHeldOwnInAForkChildAnotherAfter) {
  auto a = core::context::shared();
  auto b = core::context::shared();
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->get(), b->get());
  const std::string first = (*a)->address();

  child_process child([&](int out) {
    auto mine = core::context::shared();
    if (!mine || mine->get() == a->get()) return 2;
    auto memory = (*mine)->allocate(4096);
    if (!memory) return 3;
    std::memcpy(memory->data(), "child", 6);
    core::export_options o;
    o.allowed = core::rights::read;
    o.policy = core::import_policy::anyone();
    if (!(*mine)->export_buffer("page", memory->data(), memory->size(), o)) return 4;
    child_process::send_line(out, (*mine)->address());
    for (;;) ::pause();  // killed by the parent when done
  });
  const std::string theirs = child.read_line();
  EXPECT_NE(theirs, first);
  auto h = (*a)->import_buffer(theirs, "page");
  ASSERT_TRUE(h) << h.error().message();
  char got[6] = {};
  auto fetched = (*a)->fetch(*h, 0, got, sizeof got);
  ASSERT_TRUE(fetched.ok()) << fetched.error().message();
  EXPECT_STREQ(got, "child");
  ASSERT_TRUE((*a)->unimport_buffer(*h).ok());

  std::weak_ptr<core::context> held = *a;
  a->reset();
  EXPECT_FALSE(held.expired());  // b still holds it
  b->reset();
  EXPECT_TRUE(held.expired());
  auto next = core::context::shared();
  ASSERT_TRUE(next);
  EXPECT_NE((*next)->address(), first);
}

// A fork() made while another thread creates the process's context (its
// lock held for the whole creation) must not leave the child unable to get
// one: it waited for ever on the copy of the lock.
TEST(SharedContext, AForkDuringCreationLeavesTheChildAbleToCreateItsOwn) {
#if defined(__SANITIZE_ADDRESS__)
  // GCC 12's AddressSanitizer does not hand its allocator's locks over a
  // fork(): a child forked while the other thread allocates waits in
  // operator new for ever (seen in CI: gdb shows the child in
  // SizeClassAllocator64::GetFromAllocator). The default and TSan builds
  // run this test.
  GTEST_SKIP() << "AddressSanitizer's allocator is not fork-safe with a second thread allocating";
#endif
  std::atomic<bool> stop{false};
  std::thread maker([&] {
    while (!stop.load()) {
      auto ctx = core::context::shared();  // made and let go of, over and over
      ASSERT_TRUE(ctx);
    }
  });
  for (int i = 0; i < 50; ++i) {  // about one fork in 20 hit the lock before
    pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::alarm(10);  // a deadlocked child dies of SIGALRM
      auto mine = core::context::shared();
      std::_Exit(mine ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "child " << i << ": status " << status << " (SIGALRM 14: it never got a context)";
  }
  stop.store(true);
  maker.join();
}

}  // namespace
}  // namespace vmmc::test
