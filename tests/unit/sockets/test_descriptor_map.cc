// unit.sockets.descriptor_map: the map behind the stream table and the
// epoll sets (every call on a descriptor looks it up without a lock).
#include "descriptor_map.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace vmmc::sockets::detail {
namespace {

struct counted {
  static inline std::atomic<int> alive{0};
  explicit counted(int v) : value(v) { alive.fetch_add(1); }
  ~counted() {
    value = -1;
    alive.fetch_sub(1);
  }
  int value;
};

constinit descriptor_map<counted> shared_map;

TEST(DescriptorMap, HoldsFindsAndGivesBackWhatWasThere) {
  static constinit descriptor_map<counted> m;
  EXPECT_EQ(m.find(3), nullptr);
  EXPECT_FALSE(m.may_hold(3));
  EXPECT_EQ(m.find(-1), nullptr);
  {
    std::lock_guard lock(m.writer());
    EXPECT_EQ(m.exchange_locked(3, std::make_shared<counted>(30)), nullptr);
    // Far apart: their own chunks.
    EXPECT_EQ(m.exchange_locked(5'000'000, std::make_shared<counted>(50)), nullptr);
  }
  ASSERT_NE(m.find(3), nullptr);
  EXPECT_EQ(m.find(3)->value, 30);
  EXPECT_TRUE(m.may_hold(3));
  EXPECT_EQ(m.find(5'000'000)->value, 50);
  EXPECT_EQ(m.find(4), nullptr);
  std::vector<int> seen;
  {
    std::lock_guard lock(m.writer());
    m.for_each_locked([&](int fd, const std::shared_ptr<counted>& c) {
      seen.push_back(fd);
      EXPECT_EQ(c->value, fd == 3 ? 30 : 50);
    });
    auto old = m.exchange_locked(3, std::make_shared<counted>(31));
    ASSERT_NE(old, nullptr);
    EXPECT_EQ(old->value, 30);
    EXPECT_EQ(m.exchange_locked(3, nullptr)->value, 31);
    EXPECT_EQ(m.exchange_locked(5'000'000, nullptr)->value, 50);
  }
  EXPECT_EQ(seen, (std::vector<int>{3, 5'000'000}));
  EXPECT_EQ(m.find(3), nullptr);
  EXPECT_FALSE(m.may_hold(3));
  EXPECT_EQ(counted::alive.load(), 0);
}

TEST(DescriptorMap, DescriptorsBeyondTheLimitAreNeverHeld) {
  const int beyond = static_cast<int>(descriptor_map<counted>::limit);
  std::lock_guard lock(shared_map.writer());
  EXPECT_EQ(shared_map.exchange_locked(beyond, std::make_shared<counted>(1)), nullptr);
  EXPECT_EQ(shared_map.find(beyond), nullptr);
  EXPECT_EQ(counted::alive.load(), 0);  // not kept either
}

// Readers that look a descriptor up while a writer replaces and removes its
// object always get a whole, live object or none (ASan and TSan builds run
// this too).
TEST(DescriptorMap, ReadersAlwaysGetALiveObjectWhileWritersReplaceIt) {
  constexpr int fds = 8, rounds = 20000;
  std::atomic<bool> done{false};
  std::atomic<long> found{0};
  std::atomic<int> started{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r)
    readers.emplace_back([&] {
      started.fetch_add(1);
      while (!done.load()) {
        for (int fd = 0; fd < fds; ++fd)
          if (auto c = shared_map.find(fd)) {
            EXPECT_EQ(c->value % fds, fd);
            found.fetch_add(1, std::memory_order_relaxed);
          }
      }
    });
  while (started.load() < 2) std::this_thread::yield();
  // Every round, and on until the readers met objects (bounded).
  for (int i = 0; i < rounds || (found.load() < 1000 && i < 1000 * rounds); ++i) {
    const int fd = i % fds;
    std::shared_ptr<counted> gone;
    std::lock_guard lock(shared_map.writer());
    gone = shared_map.exchange_locked(fd, (i / fds) % 3 ? std::make_shared<counted>(i) : nullptr);
  }
  done.store(true);
  for (auto& t : readers) t.join();
  std::lock_guard lock(shared_map.writer());
  for (int fd = 0; fd < fds; ++fd) shared_map.exchange_locked(fd, nullptr);
  EXPECT_EQ(counted::alive.load(), 0);
  EXPECT_GT(found.load(), 0);
}

}  // namespace
}  // namespace vmmc::sockets::detail
