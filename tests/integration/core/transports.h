// The transports every core integration test runs over, and memory with
// guard pages for the range tests.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "vmmc/core/context.h"

namespace vmmc::test {

struct transport {
  const char* name;
  std::vector<std::string> providers;
  int mapped;          // context_options::mapped_path
  bool mappable;       // export memory from context::allocate
  const char* expect;  // the path imports should take
};

inline const transport transports[] = {
    {"mapped", {"shm"}, 1, true, "mapped"},
    {"shm", {"shm"}, 0, false, "fabric:shm"},
    {"tcp", {"tcp"}, 0, false, "fabric:tcp;ofi_rxm"},
};

inline std::string transport_name(const testing::TestParamInfo<transport>& info) {
  return info.param.name;
}

inline core::context make_context(const transport& t) {
  core::context_options o;
  o.providers = t.providers;
  o.mapped_path = t.mapped;
  auto c = core::context::create(o);
  if (!c) {
    ADD_FAILURE() << "context::create: " << c.error().message();
    std::abort();
  }
  return std::move(*c);
}

// `size` bytes of exportable memory with one filled, inaccessible-to-copy
// guard page on each side, so a stray byte shows up as a changed pattern.
class guarded_region {
 public:
  static constexpr unsigned char guard_pattern = 0xA5;

  guarded_region(core::context& c, std::size_t size, bool mappable) : size_(size) {
    page_ = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    std::size_t total = size + 2 * page_;
    if (mappable) {
      auto b = c.allocate(total);
      if (!b) std::abort();
      buffer_ = std::move(*b);
      base_ = buffer_.data();
    } else {
      void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      base_ = static_cast<std::byte*>(p);
      owned_ = true;
    }
    std::memset(base_, guard_pattern, page_);
    std::memset(base_ + page_ + size, guard_pattern, page_);
    std::memset(base_ + page_, 0, size);
  }
  ~guarded_region() {
    if (owned_) ::munmap(base_, size_ + 2 * page_);
  }
  std::byte* data() const { return base_ + page_; }
  std::size_t size() const { return size_; }
  bool guards_intact() const {
    for (std::size_t i = 0; i < page_; ++i)
      if (base_[i] != std::byte{guard_pattern} ||
          base_[page_ + size_ + i] != std::byte{guard_pattern})
        return false;
    return true;
  }

 private:
  core::mappable_buffer buffer_;
  std::byte* base_ = nullptr;
  std::size_t size_ = 0;
  std::size_t page_ = 0;
  bool owned_ = false;
};

}  // namespace vmmc::test
