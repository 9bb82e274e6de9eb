// What a context imported, and the exporters it is connected to (one
// remote_peer per address, whose control connection carries the imports'
// requests). Each table has its own lock; neither calls out while holding
// it, but import_table::for_each's callback, which may lock an import.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace vmmc::core::detail {

struct import_entry;
struct remote_peer;

class import_table {
 public:
  // Files `imp` under a new id (set in it); returns the id.
  std::uint64_t add(const std::shared_ptr<import_entry>& imp);
  std::shared_ptr<import_entry> find(std::uint64_t id) const;
  std::shared_ptr<import_entry> remove(std::uint64_t id);  // null: none
  // `f(import_entry&)` for every import, under the table's shared lock.
  template <class F>
  void for_each(F&& f) const {
    std::shared_lock lock(mutex_);
    for (const auto& [id, imp] : by_id_) f(imp);
  }
  void clear();

 private:
  mutable std::shared_mutex mutex_;
  std::unordered_map<std::uint64_t, std::shared_ptr<import_entry>> by_id_;
  std::uint64_t next_id_ = 1;
};

class peer_table {
 public:
  using peer_ptr = std::shared_ptr<remote_peer>;
  // The live peer at `blob`; a dead one found there is forgotten.
  peer_ptr find_live(const std::string& blob);
  void add(const std::string& blob, peer_ptr peer);
  // Forgets the peer at `blob` if it is `peer` (a newer one may have taken
  // its place).
  void forget(const std::string& blob, const remote_peer* peer);
  void copy_to(std::vector<peer_ptr>& out) const;
  void clear();
  // Held while connecting to a new peer: one connect at a time, without the
  // table's lock (the control thread needs it meanwhile).
  std::mutex& connecting() noexcept { return connect_mutex_; }

 private:
  mutable std::mutex mutex_;
  std::map<std::string, peer_ptr> by_blob_;
  std::mutex connect_mutex_;
};

}  // namespace vmmc::core::detail
