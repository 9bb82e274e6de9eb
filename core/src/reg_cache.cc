// reg_cache: the UTLB. An address index (Boost.Intrusive set keyed by start)
// of non-overlapping entries, and an LRU list of the unused ones.
//
// Two rules shape this file:
// - Nothing is freed and the registrar is never called with mutex_ held. free()
//   may unmap watched memory, which waits for the monitor thread, which may be
//   waiting for mutex_ in on_unmapped(): a deadlock. Entries to deregister are
//   parked on graveyard_ under the lock and disposed of after unlocking.
// - The monitor thread (on_unmapped) only moves entries between containers;
//   the next caller of acquire/invalidate/lease release disposes of them.
#include "vmmc/core/reg_cache.h"

#include <unistd.h>

#include <algorithm>
#include <boost/intrusive/list.hpp>
#include <boost/intrusive/set.hpp>
#include <cassert>
#include <iterator>
#include <mutex>
#include <utility>

#include "vmmc/core/memory_monitor.h"

namespace vmmc::core {
namespace detail {
namespace bi = boost::intrusive;

struct reg_entry {
  enum class place : std::uint8_t {
    registering,  // on in_flight_: register_memory is running
    cached,       // in index_ (and on lru_ while unused)
    detached,     // out of the index: deregistered when its last lease ends
  };
  std::uintptr_t start = 0;
  std::uintptr_t end = 0;
  registration reg;
  std::uint32_t users = 0;
  place where = place::registering;
  bool stale = false;  // invalidated while registering: must not be cached
  bi::set_member_hook<bi::link_mode<bi::safe_link>> index_hook;
  // On at most one of lru_, in_flight_, graveyard_ or a local list.
  bi::list_member_hook<bi::link_mode<bi::safe_link>> list_hook;

  std::size_t length() const { return end - start; }
};

struct start_of {
  using type = std::uintptr_t;
  type operator()(const reg_entry& e) const { return e.start; }
};
using entry_index =
    bi::set<reg_entry,
            bi::member_hook<reg_entry, decltype(reg_entry::index_hook), &reg_entry::index_hook>,
            bi::key_of_value<start_of>>;
using entry_list =
    bi::list<reg_entry,
             bi::member_hook<reg_entry, decltype(reg_entry::list_hook), &reg_entry::list_hook>>;

class reg_cache_impl final : public unmap_listener {
 public:
  reg_cache_impl(registrar& r, std::size_t limit, memory_monitor* monitor)
      : registrar_(r),
        limit_(limit),
        monitor_(monitor),
        page_mask_(static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE)) - 1) {
    if (monitor_ != nullptr) monitor_->attach(*this);
  }

  ~reg_cache_impl() {
    if (monitor_ != nullptr) monitor_->detach(*this);  // before taking mutex_
    entry_list doomed;
    {
      std::lock_guard lock(mutex_);
      assert(in_flight_.empty());
      while (!index_.empty()) {
        reg_entry& e = *index_.begin();
        assert(e.users == 0);  // a lease outlived its cache
        retire(e);
      }
      collect(doomed);
    }
    dispose(doomed);
  }

  result<reg_cache::lease> acquire(const void* addr, std::size_t length);
  void invalidate(const void* addr, std::size_t length);
  void release(reg_entry& e) noexcept;
  reg_cache_counters counters() const {
    std::lock_guard lock(mutex_);
    return counters_;
  }

  void on_unmapped(const void* addr, std::size_t length) noexcept override {
    const auto start = reinterpret_cast<std::uintptr_t>(addr);
    std::lock_guard lock(mutex_);
    invalidate_locked(start, start + length);  // disposal waits for an app thread
  }

 private:
  reg_entry* find_covering(std::uintptr_t start, std::uintptr_t end);
  entry_index::iterator first_overlapping(std::uintptr_t start);
  void retire(reg_entry& e);
  void invalidate_locked(std::uintptr_t start, std::uintptr_t end);
  void collect(entry_list& out);
  void dispose(entry_list& doomed) noexcept;

  registrar& registrar_;
  const std::size_t limit_;
  memory_monitor* const monitor_;
  const std::uintptr_t page_mask_;

  mutable std::mutex mutex_;
  entry_index index_;
  entry_list lru_;          // unused cached entries, least recently released first
  entry_list in_flight_;    // being registered (lock not held)
  entry_list graveyard_;    // to deregister once the lock is dropped
  std::size_t pinned_ = 0;  // registered + reserved for in_flight_, for the limit
  std::size_t unused_ = 0;  // bytes on lru_ (evictable)
  reg_cache_counters counters_{};
};

reg_entry* reg_cache_impl::find_covering(std::uintptr_t start, std::uintptr_t end) {
  auto it = index_.upper_bound(start);  // entries do not overlap: only the predecessor can cover
  if (it == index_.begin()) return nullptr;
  --it;
  return it->end >= end ? &*it : nullptr;
}

entry_index::iterator reg_cache_impl::first_overlapping(std::uintptr_t start) {
  auto it = index_.upper_bound(start);
  if (it != index_.begin() && std::prev(it)->end > start) --it;
  return it;
}

// Takes a cached entry out of the index; unused ones go to the graveyard,
// leased ones are deregistered by their last release.
void reg_cache_impl::retire(reg_entry& e) {
  index_.erase(index_.iterator_to(e));
  e.where = reg_entry::place::detached;
  if (e.users == 0) {
    lru_.erase(lru_.iterator_to(e));
    unused_ -= e.length();
    graveyard_.push_back(e);
  }
}

void reg_cache_impl::invalidate_locked(std::uintptr_t start, std::uintptr_t end) {
  for (auto it = first_overlapping(start); it != index_.end() && it->start < end;) {
    reg_entry& e = *it++;
    retire(e);
    ++counters_.invalidations;
  }
  for (reg_entry& e : in_flight_) {
    if (e.start < end && start < e.end && !e.stale) {
      e.stale = true;
      ++counters_.invalidations;
    }
  }
}

// Moves the graveyard out for disposal; its bytes stop counting now.
void reg_cache_impl::collect(entry_list& out) {
  for (const reg_entry& e : graveyard_) {
    pinned_ -= e.length();
    counters_.bytes_registered -= e.length();
  }
  out.splice(out.end(), graveyard_);
}

void reg_cache_impl::dispose(entry_list& doomed) noexcept {
  while (!doomed.empty()) {
    reg_entry& e = doomed.front();
    doomed.pop_front();
    registrar_.deregister_memory(e.reg);
    delete &e;
  }
}

result<reg_cache::lease> reg_cache_impl::acquire(const void* addr, std::size_t length) {
  const auto start = reinterpret_cast<std::uintptr_t>(addr);
  std::uintptr_t end = 0;
  if (addr == nullptr || length == 0 || __builtin_add_overflow(start, length, &end) ||
      end > UINTPTR_MAX - page_mask_)
    return errc::invalid_argument;
  // An munmap that returned before this call must be seen (memory_monitor.h).
  if (monitor_ != nullptr) monitor_->synchronize();

  entry_list doomed;
  std::unique_lock lock(mutex_);
  collect(doomed);  // first, so that pinned_ counts only live registrations
  ++counters_.lookups;
  if (reg_entry* hit = find_covering(start, end)) {
    ++counters_.hits;
    if (hit->users++ == 0) {
      lru_.erase(lru_.iterator_to(*hit));
      unused_ -= hit->length();
    }
    reg_cache::lease l(this, hit, hit->reg);
    lock.unlock();
    dispose(doomed);
    return l;
  }
  ++counters_.misses;

  std::uintptr_t first = start & ~page_mask_;
  std::uintptr_t last = (end + page_mask_) & ~page_mask_;
  // The room left if every unused entry were evicted.
  const std::size_t busy = pinned_ - unused_;
  const std::size_t room = limit_ > busy ? limit_ - busy : 0;
  if (last - first > room) {
    lock.unlock();
    dispose(doomed);
    return errc::resource_exhausted;
  }
  // Register the union with overlapping entries if it fits, so that the index
  // stays free of overlaps and a lookup needs one tree search.
  std::uintptr_t union_first = first;
  std::uintptr_t union_last = last;
  for (auto it = first_overlapping(first); it != index_.end() && it->start < last; ++it) {
    union_first = std::min(union_first, it->start);
    union_last = std::max(union_last, it->end);
  }
  if (union_last - union_first <= room) {
    first = union_first;
    last = union_last;
  }
  for (auto it = first_overlapping(first); it != index_.end() && it->start < last;) retire(*it++);
  collect(doomed);
  while (pinned_ + (last - first) > limit_ && !lru_.empty()) {  // `room` says this ends in time
    retire(lru_.front());
    collect(doomed);
    ++counters_.evictions;
  }
  auto* fresh = new reg_entry;  // malloc never unmaps; only free() must wait for the unlock
  fresh->start = first;
  fresh->end = last;
  in_flight_.push_back(*fresh);
  pinned_ += last - first;
  lock.unlock();
  dispose(doomed);

  // Watch before registering, so that an unmap racing with the registration
  // is reported (it marks `fresh` stale) rather than missed.
  const auto* base = reinterpret_cast<const void*>(fresh->start);
  const bool watched = monitor_ == nullptr || monitor_->watch(base, fresh->length()).ok();
  result<registration> reg = registrar_.register_memory(base, fresh->length());

  lock.lock();
  in_flight_.erase(in_flight_.iterator_to(*fresh));
  if (!reg) {
    pinned_ -= fresh->length();
    lock.unlock();
    delete fresh;
    return reg.error();
  }
  ++counters_.registrations;
  counters_.bytes_registered += fresh->length();
  fresh->reg = reg.value();
  fresh->users = 1;
  if (watched && !fresh->stale) {
    // Entries cached by a concurrent miss meanwhile are superseded as well.
    for (auto it = first_overlapping(fresh->start); it != index_.end() && it->start < fresh->end;)
      retire(*it++);
    index_.insert(*fresh);
    fresh->where = reg_entry::place::cached;
  } else {
    fresh->where = reg_entry::place::detached;  // registered for this lease only
  }
  reg_cache::lease l(this, fresh, fresh->reg);
  collect(doomed);
  lock.unlock();
  dispose(doomed);
  return l;
}

void reg_cache_impl::invalidate(const void* addr, std::size_t length) {
  if (length == 0) return;
  const auto start = reinterpret_cast<std::uintptr_t>(addr);
  const std::uintptr_t end = length > UINTPTR_MAX - start ? UINTPTR_MAX : start + length;
  entry_list doomed;
  {
    std::lock_guard lock(mutex_);
    invalidate_locked(start & ~page_mask_, end);
    collect(doomed);
  }
  dispose(doomed);
}

void reg_cache_impl::release(reg_entry& e) noexcept {
  entry_list doomed;
  {
    std::lock_guard lock(mutex_);
    if (--e.users == 0) {
      if (e.where == reg_entry::place::cached) {
        lru_.push_back(e);
        unused_ += e.length();
      } else {
        graveyard_.push_back(e);
      }
    }
    collect(doomed);
  }
  dispose(doomed);
}

}  // namespace detail

reg_cache::reg_cache(registrar& r, std::size_t limit_bytes, memory_monitor* monitor)
    : impl_(std::make_unique<detail::reg_cache_impl>(r, limit_bytes, monitor)) {}

reg_cache::~reg_cache() = default;

result<reg_cache::lease> reg_cache::acquire(const void* addr, std::size_t length) {
  return impl_->acquire(addr, length);
}

void reg_cache::invalidate(const void* addr, std::size_t length) {
  impl_->invalidate(addr, length);
}

reg_cache_counters reg_cache::counters() const {
  return impl_->counters();
}

reg_cache::lease& reg_cache::lease::operator=(lease&& other) noexcept {
  if (this != &other) {
    reset();
    cache_ = std::exchange(other.cache_, nullptr);
    entry_ = std::exchange(other.entry_, nullptr);
    registration_ = std::exchange(other.registration_, {});
  }
  return *this;
}

void reg_cache::lease::reset() noexcept {
  if (entry_ == nullptr) return;
  cache_->release(*entry_);
  cache_ = nullptr;
  entry_ = nullptr;
  registration_ = {};
}

}  // namespace vmmc::core
