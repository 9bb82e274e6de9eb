// vmmc/core/reg_cache.h: the UTLB, a user-level cache of memory registrations.
//
// Registering memory with the fabric (pinning it) is expensive, so a buffer is
// registered the first time a transfer uses it and later transfers find the
// registration here. A lookup is an uncontended lock and a tree search.
//
// - Entries cover page-rounded ranges and never overlap: a miss whose range
//   overlaps cached entries registers the union and retires them (as UCX's
//   rcache does), unless the union would exceed the limit. Merely adjacent
//   entries are not merged: re-registering a growing union would re-pin every
//   page each time a neighbour is used.
// - The bytes this cache keeps registered never exceed `limit_bytes`:
//   least-recently released entries are evicted to make room; a range that
//   cannot fit even then is refused with errc::resource_exhausted (a hard
//   limit keeps RLIMIT_MEMLOCK-style budgets honest; callers split or copy).
//   A registration that is being torn down may briefly overlap a new one.
// - A lease keeps its entry registered and unevictable until it is released.
// - Stale entries: memory that is unmapped, moved or discarded must never be
//   reached through its old registration. With a memory_monitor, the cache
//   caches only ranges the monitor watches and the monitor invalidates them
//   when they go away (see memory_monitor.h for the mechanism and its limits);
//   a range it cannot watch is registered for one lease and deregistered when
//   the lease ends. The monitor thread may not call the registrar, so entries
//   it invalidates are deregistered by the next acquire(), invalidate() or
//   lease release in any thread. Without a monitor, everything is cached and the owner must
//   call invalidate() before memory is unmapped or reused (unit tests, or
//   memory whose lifetime the owner controls).
//
// Thread safety: every member function may be called from any thread; leases
// may be released from any thread. The registrar is never called with the
// cache's lock held, so it may block or re-enter the cache.
#pragma once
#pragma GCC visibility push(default)  // the library's API (see cmake/layer.cmake)

#include <cstddef>
#include <cstdint>
#include <memory>

#include "vmmc/core/error.h"

namespace vmmc::core {

class memory_monitor;
// Internals (hidden: only what this header declares is exported).
namespace detail {
class [[gnu::visibility("hidden")]] reg_cache_impl;
struct [[gnu::visibility("hidden")]] reg_entry;
}  // namespace detail

// What a registration yields: `descriptor` is the local descriptor passed to
// transfers (fi_mr_desc() for the fabric), `token` is opaque to the cache
// (e.g. the fid_mr*).
struct registration {
  void* descriptor = nullptr;
  std::uint64_t token = 0;
};

// What the cache registers memory with: the fabric implements it with
// fi_mr_reg/fi_close, unit tests with a counting fake. Called from whichever
// thread uses the cache, concurrently, never with the cache's lock held.
class registrar {
 public:
  virtual ~registrar() = default;
  // Registers [addr, addr + length) (page-aligned). Any error is returned to
  // the caller of reg_cache::acquire unchanged.
  virtual result<registration> register_memory(const void* addr, std::size_t length) = 0;
  // Releases a registration returned by register_memory; called exactly once.
  virtual void deregister_memory(const registration& r) = 0;
};

struct reg_cache_counters {
  std::uint64_t lookups = 0;           // acquire() calls with valid arguments
  std::uint64_t hits = 0;              // found a cached entry covering the range
  std::uint64_t misses = 0;            // lookups - hits
  std::uint64_t registrations = 0;     // successful register_memory calls
  std::uint64_t evictions = 0;         // entries deregistered to stay under the limit
  std::uint64_t invalidations = 0;     // entries (or registrations in progress) invalidated
  std::uint64_t bytes_registered = 0;  // bytes registered now (a gauge, not a total)
};

class reg_cache {
 public:
  class lease;

  // `limit_bytes`: most bytes kept registered. `monitor` may be null (see the
  // banner); if not, it must outlive the cache.
  reg_cache(registrar& r, std::size_t limit_bytes, memory_monitor* monitor = nullptr);
  // Deregisters every entry. Precondition: no lease is alive and no acquire()
  // is running.
  ~reg_cache();
  reg_cache(const reg_cache&) = delete;
  reg_cache& operator=(const reg_cache&) = delete;

  // A registration covering [addr, addr + length). A hit if a cached entry
  // covers it; otherwise registers the page-rounded range (or its union with
  // overlapping entries), evicting least-recently-used unused entries as the
  // limit requires.
  // Errors: errc::invalid_argument for null addr, zero length or a range that
  // wraps; errc::resource_exhausted if the range cannot fit under the limit
  // even after evicting every unused entry; otherwise the registrar's error.
  result<lease> acquire(const void* addr, std::size_t length);

  // The pages covering [addr, addr + length) were (or are about to be) freed,
  // unmapped or remapped: every entry overlapping them leaves the cache at
  // once and is never returned again. Unused entries are deregistered before
  // invalidate() returns; entries under a lease when their last lease ends.
  // A zero length is a no-op.
  void invalidate(const void* addr, std::size_t length);

  reg_cache_counters counters() const;

 private:
  std::unique_ptr<detail::reg_cache_impl> impl_;
};

// Move-only. While alive, its registration stays valid and is not evicted;
// releasing the last lease of an invalidated or uncached entry deregisters it.
// Must not outlive its cache.
class reg_cache::lease {
 public:
  lease() noexcept = default;
  lease(lease&& other) noexcept { *this = std::move(other); }
  lease& operator=(lease&& other) noexcept;
  ~lease() { reset(); }

  // The registration's descriptor and token; null/0 for an empty lease.
  void* descriptor() const noexcept { return registration_.descriptor; }
  std::uint64_t token() const noexcept { return registration_.token; }
  explicit operator bool() const noexcept { return entry_ != nullptr; }
  // Releases early; the lease becomes empty.
  void reset() noexcept;

 private:
  friend class detail::reg_cache_impl;
  lease(detail::reg_cache_impl* cache, detail::reg_entry* entry, registration r) noexcept
      : cache_(cache), entry_(entry), registration_(r) {}

  detail::reg_cache_impl* cache_ = nullptr;
  detail::reg_entry* entry_ = nullptr;
  registration registration_;
};

}  // namespace vmmc::core

#pragma GCC visibility pop
