// integration.security.forged_records: an importer that imported nothing
// forges notification records (issue 13, item 6). The attacker speaks the
// control protocol with raw Unix sockets (no vmmc code): it says hello as
// itself (the kernel vouches for its pid and uid), receives its notification
// ring like any same-host importer, and publishes a record naming the
// victim's export, which it never imported. Before the fix the victim ran
// that export's handler.
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "vmmc/core/context.h"

namespace vmmc::test {
namespace {

// The control protocol as an outsider reads it (core/src/wire.h, core.h).
constexpr std::uint32_t control_magic = 0x434d4d56;
constexpr std::uint16_t control_version = 2;
constexpr std::uint16_t frame_hello = 1;
struct frame_header {
  std::uint32_t magic;
  std::uint16_t version, type;
  std::uint32_t length;
};
struct hello_body {
  std::uint32_t uid, pid, address_length;
};
struct notify_record {
  std::uint32_t export_id, reserved;
  std::uint64_t offset, length, value;
};
constexpr std::size_t ring_tail_offset = 64, ring_records_offset = 128, ring_capacity = 1024;

// The value of `key` in a printable context address ("...;key=value;...").
std::string field(const std::string& address, const std::string& key) {
  auto at = address.find(";" + key + "=");
  if (at == std::string::npos) return {};
  at += key.size() + 2;
  return address.substr(at, address.find(';', at) - at);
}

TEST(ForgedRecords, AnImporterOfNothingCannotRunAnotherExportsHandler) {
  auto victim = core::context::create({});
  ASSERT_TRUE(victim) << victim.error().message();
  std::vector<std::byte> memory(4096);
  std::atomic<int> handled{0};
  core::export_options o;
  o.policy = core::import_policy::anyone();
  o.on_notify = [&](const core::notification&) { ++handled; };
  auto e = victim->export_buffer("victim", memory.data(), memory.size(), o);
  ASSERT_TRUE(e) << e.error().message();
  const std::string address = victim->address();

  // Connect to the victim's control socket and say hello.
  int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(s, 0);
  const std::string name = "vmmc." + field(address, "p") + "." + field(address, "n");
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  ASSERT_EQ(::connect(s, reinterpret_cast<sockaddr*>(&a), length), 0) << std::strerror(errno);
  const std::string me = "vmmc1;h=attacker;p=" + std::to_string(::getpid()) +
                         ";u=" + std::to_string(::getuid()) + ";n=7";
  std::vector<char> frame(sizeof(frame_header) + sizeof(hello_body) + me.size());
  frame_header fh{control_magic, control_version, frame_hello,
                  static_cast<std::uint32_t>(sizeof(hello_body) + me.size())};
  hello_body hb{::getuid(), static_cast<std::uint32_t>(::getpid()),
                static_cast<std::uint32_t>(me.size())};
  std::memcpy(frame.data(), &fh, sizeof fh);
  std::memcpy(frame.data() + sizeof fh, &hb, sizeof hb);
  std::memcpy(frame.data() + sizeof fh + sizeof hb, me.data(), me.size());
  ASSERT_EQ(::send(s, frame.data(), frame.size(), 0), static_cast<ssize_t>(frame.size()));

  // The reply carries the wake page, the eventfd and our ring.
  char body[64];
  char control[CMSG_SPACE(3 * sizeof(int))];
  iovec iov{body, sizeof body};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof control;
  ASSERT_GT(::recvmsg(s, &m, 0), 0) << std::strerror(errno);
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  ASSERT_TRUE(c && c->cmsg_type == SCM_RIGHTS) << "no descriptors in the hello reply";
  int fds[3];
  std::memcpy(fds, CMSG_DATA(c), sizeof fds);
  const std::size_t ring_size = ring_records_offset + ring_capacity * sizeof(notify_record);
  void* ring = ::mmap(nullptr, ring_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[2], 0);
  ASSERT_NE(ring, MAP_FAILED) << std::strerror(errno);

  // Forge: export ids count from 1 (ours is the victim's only export).
  for (std::uint32_t id = 1; id <= 4; ++id) {
    notify_record r{id, 0, 0, 8, 0xBAD};
    std::memcpy(static_cast<char*>(ring) + ring_records_offset + (id - 1) * sizeof r, &r, sizeof r);
  }
  std::atomic_ref<std::uint64_t>(
      *reinterpret_cast<std::uint64_t*>(static_cast<char*>(ring) + ring_tail_offset))
      .store(4, std::memory_order_release);
  std::uint64_t one = 1;
  (void)::write(fds[1], &one, sizeof one);

  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  while (std::chrono::steady_clock::now() < until)
    (void)victim->wait_notifications(std::chrono::milliseconds(20));
  EXPECT_EQ(handled.load(), 0) << "a forged record ran the victim's handler";

  // The victim still serves a real importer.
  auto importer = core::context::create({});
  ASSERT_TRUE(importer);
  auto h = importer->import_buffer(address, "victim");
  ASSERT_TRUE(h) << h.error().message();
  const std::uint64_t word = 42;
  ASSERT_TRUE(importer->send(*h, 0, &word, sizeof word, {.notify = true}).ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (handled.load() == 0 && std::chrono::steady_clock::now() < deadline)
    (void)victim->wait_notifications(std::chrono::milliseconds(20));
  EXPECT_EQ(handled.load(), 1) << "the real importer's notification";

  ::munmap(ring, ring_size);
  for (int fd : fds) ::close(fd);
  ::close(s);
}

}  // namespace
}  // namespace vmmc::test
