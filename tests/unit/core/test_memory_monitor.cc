// unit.core.memory_monitor: userfaultfd events reach listeners; watched memory
// is never trapped; unwatchable ranges are refused; an idle monitor sleeps.
#include <fcntl.h>
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "unit/core/file_mapping.h"
#include "vmmc/core/memory_monitor.h"

namespace {
using namespace vmmc::core;

constexpr std::size_t page = 4096;

struct recording_listener final : unmap_listener {
  void on_unmapped(const void* addr, std::size_t length) noexcept override {
    std::lock_guard lock(mutex);
    ranges.emplace_back(reinterpret_cast<std::uintptr_t>(addr), length);
  }
  // True if a reported range covers [addr, addr + length).
  bool saw(const void* addr, std::size_t length) {
    return saw(reinterpret_cast<std::uintptr_t>(addr), length);
  }
  bool saw(std::uintptr_t a, std::size_t length) {
    std::lock_guard lock(mutex);
    for (auto [start, len] : ranges)
      if (start <= a && a + length <= start + len) return true;
    return false;
  }
  std::mutex mutex;
  std::vector<std::pair<std::uintptr_t, std::size_t>> ranges;
};

char* map_anonymous(std::size_t length) {
  void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
}

class MemoryMonitor : public ::testing::Test {
 protected:
  void SetUp() override {
    auto created = memory_monitor::create();
    if (!created) GTEST_SKIP() << "userfaultfd unavailable: " << created.error().message();
    monitor_ = std::move(created).value();
    monitor_->attach(listener_);
  }
  void TearDown() override {
    if (monitor_) monitor_->detach(listener_);
  }
  recording_listener listener_;
  std::unique_ptr<memory_monitor> monitor_;
};

TEST_F(MemoryMonitor, MunmapIsReportedBeforeSynchronizeReturns) {
  char* p = map_anonymous(16 * page);
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(monitor_->watch(p + page, 2 * page).ok());
  ASSERT_EQ(munmap(p, 16 * page), 0);
  monitor_->synchronize();
  EXPECT_TRUE(listener_.saw(p + page, 2 * page));
}

TEST_F(MemoryMonitor, WatchedMemoryIsNeverTrapped) {
  // Reads and writes (including first touch) must not wait for the monitor:
  // if they did, the monitor would see page faults (it would also unblock them).
  char* p = map_anonymous(64 * page);
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(monitor_->watch(p, 64 * page).ok());
  const auto before = monitor_->events();
  std::memset(p, 0x5a, 64 * page);
  volatile char sum = 0;
  for (std::size_t i = 0; i < 64 * page; i += page) sum = static_cast<char>(sum + p[i]);
  EXPECT_EQ(monitor_->events(), before);
  ASSERT_EQ(munmap(p, 64 * page), 0);
}

TEST_F(MemoryMonitor, DiscardAndRemapAreReported) {
  char* p = map_anonymous(8 * page);
  ASSERT_NE(p, nullptr);
  p[0] = 1;
  ASSERT_TRUE(monitor_->watch(p, 8 * page).ok());
  ASSERT_EQ(madvise(p, page, MADV_DONTNEED), 0);
  monitor_->synchronize();
  EXPECT_TRUE(listener_.saw(p, page));
  ASSERT_EQ(madvise(p + page, page, MADV_FREE), 0);
  monitor_->synchronize();
  EXPECT_TRUE(listener_.saw(p + page, page));

  // Move the upper half elsewhere: its old addresses must be reported.
  void* moved = mremap(p + 4 * page, 4 * page, 4 * page, MREMAP_MAYMOVE | MREMAP_FIXED,
                       map_anonymous(4 * page));
  ASSERT_NE(moved, MAP_FAILED);
  monitor_->synchronize();
  EXPECT_TRUE(listener_.saw(p + 4 * page, 4 * page));
  munmap(moved, 4 * page);
  munmap(p, 4 * page);
}

TEST_F(MemoryMonitor, SharedMemoryCanBeWatched) {
  void* v = mmap(nullptr, 4 * page, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(v, MAP_FAILED);
  ASSERT_TRUE(monitor_->watch(v, 4 * page).ok());
  static_cast<char*>(v)[0] = 1;
  ASSERT_EQ(munmap(v, 4 * page), 0);
  monitor_->synchronize();
  EXPECT_TRUE(listener_.saw(v, 4 * page));
}

TEST_F(MemoryMonitor, LargeMallocFreeIsReported) {
  // glibc serves blocks above M_MMAP_THRESHOLD with mmap and free() unmaps
  // them. Fixing the threshold disables glibc's sliding threshold.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  constexpr std::size_t size = 8 << 20;
  void* block = std::malloc(size);
  ASSERT_NE(block, nullptr);
  ASSERT_TRUE(monitor_->watch(block, size).ok());
  const auto address = reinterpret_cast<std::uintptr_t>(block);  // compared after free()
  std::free(block);
  monitor_->synchronize();
  if (!listener_.saw(address, size))
    GTEST_SKIP() << "the allocator kept the block mapped after free() (sanitizer build?)";
}

TEST_F(MemoryMonitor, RefusesWhatItCannotWatch) {
  EXPECT_TRUE(monitor_->watch(nullptr, page).is(vmmc::errc::invalid_argument));
  char* p = map_anonymous(page);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(monitor_->watch(p, 0).is(vmmc::errc::invalid_argument));
  munmap(p, page);

  // A regular file mapping: write-protect mode does not support it.
  vmmc::test::file_mapping file(4 * page);
  ASSERT_NE(file.data(), nullptr);
  EXPECT_TRUE(monitor_->watch(file.data(), file.size()).is(vmmc::errc::system_error));
}

TEST_F(MemoryMonitor, DetachedListenerHearsNothing) {
  recording_listener other;
  monitor_->attach(other);
  monitor_->detach(other);
  char* p = map_anonymous(page);
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(monitor_->watch(p, page).ok());
  munmap(p, page);
  monitor_->synchronize();
  EXPECT_TRUE(listener_.saw(p, page));
  EXPECT_TRUE(other.ranges.empty());
}

TEST_F(MemoryMonitor, IdleMonitorBurnsNoCpu) {
  timespec before{}, after{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &before);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &after);
  const double used = static_cast<double>(after.tv_sec - before.tv_sec) +
                      static_cast<double>(after.tv_nsec - before.tv_nsec) * 1e-9;
  EXPECT_LT(used, 0.03) << "process used " << used << " s of CPU while idle for 0.3 s";
}

TEST(MemoryMonitorProcessWide, IsCreatedOnceOrNotAtAll) {
  memory_monitor* a = memory_monitor::process_wide();
  EXPECT_EQ(a, memory_monitor::process_wide());
  if (a == nullptr) GTEST_SKIP() << "userfaultfd unavailable";
}

}  // namespace
