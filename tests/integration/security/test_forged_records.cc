// integration.security.forged_records: an importer that imported nothing
// forges notification records (issue 13, item 6). The attacker speaks the
// control protocol with raw Unix sockets (no vmmc code), as another user: it
// says hello as itself (the kernel vouches for its pid and uid), receives its notification
// ring like any same-host importer, and publishes a record naming the
// victim's export, which it never imported. Before the fix the victim ran
// that export's handler.
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "integration/security/other_user.h"
#include "integration/security/raw_control.h"
#include "vmmc/core/context.h"

namespace vmmc::test {
namespace {

TEST(ForgedRecords, AnImporterOfNothingCannotRunAnotherExportsHandler) {
  if (!other_user_process::possible()) GTEST_SKIP() << "needs root to become another user";
  other_user_process attacker([](line_channel& test) {
    // Connect to the victim's control socket and say hello.
    int s = raw::connect_control(test.receive());
    raw::frame reply;
    if (s < 0 || !raw::send_hello(s, raw::address_of("attacker", "7")) ||
        !raw::read_frame(s, reply))
      return std::string("no hello reply");
    // The reply carries the wake page, the eventfd and our ring.
    if (reply.header.type != raw::hello_reply || reply.fds.size() != 3)
      return std::string("no descriptors in the hello reply");
    const std::vector<int>& fds = reply.fds;
    void* ring = ::mmap(nullptr, raw::ring_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[2], 0);
    if (ring == MAP_FAILED) return std::string("could not map the ring");
    // Forge: export ids count from 1 (ours is the victim's only export).
    for (std::uint32_t id = 1; id <= 4; ++id) {
      raw::notify_record r{id, 0, 0, 8, 0xBAD};
      std::memcpy(static_cast<char*>(ring) + raw::ring_records_offset + (id - 1) * sizeof r, &r,
                  sizeof r);
    }
    std::atomic_ref<std::uint64_t>(
        *reinterpret_cast<std::uint64_t*>(static_cast<char*>(ring) + raw::ring_tail_offset))
        .store(4, std::memory_order_release);
    std::uint64_t one = 1;
    (void)::write(fds[1], &one, sizeof one);
    test.send("forged");
    test.receive();
    return std::string();
  });
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
  attacker.link().send(address);
  ASSERT_EQ(attacker.link().receive(), "forged");

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

  attacker.link().send("over");
  EXPECT_EQ(attacker.finish(), "");
}

}  // namespace
}  // namespace vmmc::test
