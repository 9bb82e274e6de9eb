// integration.redirect.mailbox: both ends of a small-message lane in one
// process, over each transport (mapped, libfabric shm, libfabric tcp):
// messages in order whatever their size, whole or refused (never cut), the
// slots' credits, sleeping without losing a wake-up, and a peer that writes
// a malformed slot.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "integration/core/transports.h"
#include "vmmc/redirect/mailbox.h"

namespace vmmc::test {
namespace {

using namespace std::chrono_literals;
using redirect::mailbox;

class Mailbox : public testing::TestWithParam<transport> {
 protected:
  void SetUp() override {
    a_ctx_.emplace(make_context(GetParam()));
    b_ctx_.emplace(make_context(GetParam()));
    a_.emplace(*a_ctx_);
    b_.emplace(*b_ctx_);
    ASSERT_TRUE(a_->create().ok());
    ASSERT_TRUE(b_->create().ok());
    auto attached = a_->attach(b_ctx_->address(), b_->name());
    ASSERT_TRUE(attached.ok()) << attached.error().message();
    ASSERT_TRUE(b_->attach(a_ctx_->address(), a_->name()).ok());
  }
  void TearDown() override {
    a_.reset();
    b_.reset();
  }

  // The next message at b, waiting up to 5 s for it to land.
  std::vector<std::byte> receive() {
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (std::chrono::steady_clock::now() < deadline) {
      if (auto m = b_->next()) {
        std::vector<std::byte> got(m.data, m.data + m.length);
        b_->consume();
        return got;
      }
    }
    ADD_FAILURE() << "no message within 5 s";
    return {};
  }

  // Sends from a, waiting up to 5 s for a free slot: credits come back
  // when b has consumed half the slots, and over the fabric they land
  // after b's consume() returned.
  bool send(const void* head, std::size_t head_length, const void* body, std::size_t body_length) {
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (std::chrono::steady_clock::now() < deadline) {
      auto sent = a_->try_send(head, head_length, body, body_length);
      if (!sent) {
        ADD_FAILURE() << sent.error().message();
        return false;
      }
      if (*sent) return true;
    }
    return false;
  }

  std::optional<core::context> a_ctx_, b_ctx_;
  std::optional<mailbox> a_, b_;  // a writes to b
};

std::vector<std::byte> bytes_of(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 31 + seed) & 0xff);
  return v;
}

TEST_P(Mailbox, MessagesOfEverySizeArriveWholeAndInOrder) {
  const std::size_t sizes[] = {0, 1, 31, 32, 33, 64, 65, 500, 1024, mailbox::max_message};
  unsigned seed = 0;
  for (int round = 0; round < 3; ++round) {
    for (std::size_t n : sizes) {
      ++seed;
      auto message = bytes_of(n, seed);
      // Split into head and body at every kind of place.
      const std::size_t head = n == 0 ? 0 : (seed % 3 == 0 ? 0 : seed % 3 == 1 ? n : n / 2);
      ASSERT_TRUE(send(message.data(), head, message.data() + head, n - head)) << n << " bytes";
      EXPECT_EQ(receive(), message) << n << " bytes";
    }
  }
}

TEST_P(Mailbox, TooLongIsRefusedWholeAndNothingIsWritten) {
  auto message = bytes_of(mailbox::max_message + 1, 7);
  auto sent = a_->try_send(message.data(), 32, message.data() + 32, message.size() - 32);
  ASSERT_TRUE(sent);
  EXPECT_FALSE(*sent);
  EXPECT_FALSE(b_->next());
  auto small = bytes_of(10, 8);
  ASSERT_TRUE(send(small.data(), small.size(), nullptr, 0));
  EXPECT_EQ(receive(), small);
}

TEST_P(Mailbox, AFullLaneRefusesUntilTheReaderConsumes) {
  int placed = 0;
  for (; placed < 100; ++placed) {
    auto m = bytes_of(100, static_cast<unsigned>(placed));
    auto sent = a_->try_send(m.data(), m.size(), nullptr, 0);
    ASSERT_TRUE(sent);
    if (!*sent) break;
  }
  EXPECT_EQ(placed, 8);  // its slots, none taken yet
  // Credits come back every half of the slots.
  for (int i = 0; i < 4; ++i) EXPECT_EQ(receive(), bytes_of(100, static_cast<unsigned>(i)));
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  int more = 0;
  while (more < 4 && std::chrono::steady_clock::now() < deadline) {
    auto m = bytes_of(100, static_cast<unsigned>(placed + more));
    if (*a_->try_send(m.data(), m.size(), nullptr, 0)) ++more;
  }
  EXPECT_EQ(more, 4);
  for (int i = 4; i < placed + more; ++i)
    EXPECT_EQ(receive(), bytes_of(100, static_cast<unsigned>(i))) << i;
  EXPECT_FALSE(b_->next());
}

TEST_P(Mailbox, ASleeperIsToldOfTheNextMessageOnce) {
  EXPECT_FALSE(a_->peer_wants_wakeup());  // nobody armed
  ASSERT_TRUE(b_->prepare_sleep());       // nothing on its way: may sleep
  auto m = bytes_of(16, 1);
  ASSERT_TRUE(*a_->try_send(m.data(), m.size(), nullptr, 0));
  EXPECT_TRUE(a_->peer_wants_wakeup());
  ASSERT_TRUE(*a_->try_send(m.data(), m.size(), nullptr, 0));
  EXPECT_FALSE(a_->peer_wants_wakeup());  // once per arming
  EXPECT_FALSE(b_->prepare_sleep());      // messages waiting: poll instead
  EXPECT_EQ(receive(), m);
  EXPECT_EQ(receive(), m);
}

// A peer that imports the area itself and writes slot 0's stamp with a
// length past a slot: the reader takes nothing from it, says the lane is
// broken, and its own sends still go.
TEST_P(Mailbox, AMalformedSlotBreaksTheLaneOnly) {
  core::context& hostile = *a_ctx_;
  auto h = hostile.import_buffer(b_ctx_->address(), b_->name());
  ASSERT_TRUE(h) << h.error().message();
  const std::uint64_t stamp = 1 | std::uint64_t{mailbox::max_message + 1} << 48;
  const std::size_t slot0 = offsetof(redirect::detail::mailbox_area, slots);
  ASSERT_TRUE(hostile.send(*h, slot0, &stamp, sizeof stamp).ok());
  const auto deadline = std::chrono::steady_clock::now() + 2s;
  while (!b_->broken() && std::chrono::steady_clock::now() < deadline) EXPECT_FALSE(b_->next());
  EXPECT_TRUE(b_->broken());
  EXPECT_FALSE(b_->next());
  auto m = bytes_of(40, 3);
  auto sent = b_->try_send(m.data(), m.size(), nullptr, 0);
  ASSERT_TRUE(sent && *sent);
  const auto until = std::chrono::steady_clock::now() + 5s;
  mailbox::message got;
  while (!(got = a_->next()) && std::chrono::steady_clock::now() < until) {
  }
  ASSERT_TRUE(got);
  EXPECT_TRUE(std::equal(got.data, got.data + got.length, m.begin(), m.end()));
  (void)hostile.unimport_buffer(*h);
}

INSTANTIATE_TEST_SUITE_P(Redirect, Mailbox, testing::ValuesIn(transports), transport_name);

}  // namespace
}  // namespace vmmc::test
