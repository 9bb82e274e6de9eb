// A map from descriptor numbers to shared objects, read on every call the
// program makes on a descriptor: the stream table (table.cc) and the epoll
// sets (readiness.cc). A lookup takes no lock shared with other descriptors:
// a descriptor that holds nothing costs one relaxed load, one that holds an
// object a per-slot spin lock around a shared_ptr copy. Writers (a
// descriptor made, closed or duplicated: far rarer than calls) serialize on
// one mutex, which also gives a consistent view to walks over every slot.
#pragma once

#include <sched.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <utility>

namespace vmmc::sockets::detail {

template <class T>
class descriptor_map {
 public:
  using pointer = std::shared_ptr<T>;

  // Descriptors below 2^30 (RLIMIT_NOFILE is capped by fs.nr_open, 2^20
  // unless raised); calls on any above go to the kernel untracked. The
  // chunk pointers are 8 MiB of zeroed static storage: pages a process
  // never touches cost it nothing.
  static constexpr std::size_t chunk_slots = 1024, chunk_count = std::size_t{1} << 20;
  static constexpr std::size_t limit = chunk_slots * chunk_count;

  // Constant-initialized and trivially destroyed: a namespace-scope map is
  // usable before any constructor runs and after every destructor has.
  constexpr descriptor_map() = default;
  descriptor_map(const descriptor_map&) = delete;
  descriptor_map& operator=(const descriptor_map&) = delete;

  pointer find(int fd) const {
    slot* s = slot_of(fd);
    if (!s || !s->held.load(std::memory_order_relaxed)) return nullptr;
    s->lock();
    pointer p = s->value;
    s->unlock();
    return p;
  }

  // Whether `fd` may hold an object (no lock: for a fast negative answer).
  bool may_hold(int fd) const {
    slot* s = slot_of(fd);
    return s && s->held.load(std::memory_order_relaxed);
  }

  // Callers hold writer(): every change goes through one of these.
  std::mutex& writer() { return writer_mutex; }

  // Puts `p` in `fd`'s slot (nullptr empties it) and returns what was there.
  pointer exchange_locked(int fd, pointer p) {
    slot* s = slot_of(fd, /*make=*/p != nullptr);
    if (!s) return nullptr;  // beyond every descriptor Linux makes
    s->lock();
    std::swap(s->value, p);
    s->held.store(s->value != nullptr, std::memory_order_relaxed);
    s->unlock();
    return p;  // destroyed by the caller, outside every lock
  }

  // Calls f(fd, object) for every held slot, in descriptor order; under
  // writer(), so nothing changes meanwhile.
  template <class F>
  void for_each_locked(F&& f) const {
    const std::size_t made = chunks_made.load(std::memory_order_acquire);
    for (std::size_t c = 0; c < made; ++c) {
      chunk* k = chunks[c].load(std::memory_order_acquire);
      if (!k) continue;
      for (std::size_t i = 0; i < chunk_slots; ++i)
        if (k->slots[i].value) f(static_cast<int>(c * chunk_slots + i), k->slots[i].value);
    }
  }

 private:
  struct slot {
    std::atomic<bool> held{false};  // value != nullptr, readable without the lock
    mutable std::atomic<bool> busy{false};
    pointer value;
    // Held for a shared_ptr copy or swap: a holder that lost its CPU is
    // waited for with sched_yield(), not a spin.
    void lock() const {
      for (int spins = 0; busy.exchange(true, std::memory_order_acquire);)
        while (busy.load(std::memory_order_relaxed))
          if (++spins > 64) ::sched_yield();
    }
    void unlock() const { busy.store(false, std::memory_order_release); }
  };
  struct chunk {
    std::array<slot, chunk_slots> slots;
  };

  // Chunks are made (under writer()) on first need and never freed: a
  // reader may hold a pointer into one at any time.
  slot* slot_of(int fd, bool make = false) const {
    if (fd < 0 || static_cast<std::size_t>(fd) >= limit) return nullptr;
    const std::size_t c = static_cast<std::size_t>(fd) / chunk_slots;
    chunk* k = chunks[c].load(std::memory_order_acquire);
    if (!k && make) {
      k = new chunk;
      chunks[c].store(k, std::memory_order_release);
      if (c + 1 > chunks_made.load(std::memory_order_relaxed))
        chunks_made.store(c + 1, std::memory_order_release);
    }
    return k ? &k->slots[static_cast<std::size_t>(fd) % chunk_slots] : nullptr;
  }

  mutable std::array<std::atomic<chunk*>, chunk_count> chunks{};
  mutable std::atomic<std::size_t> chunks_made{0};  // walks stop here
  std::mutex writer_mutex;
};

}  // namespace vmmc::sockets::detail
