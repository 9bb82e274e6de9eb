// What a context imported (id_table.h), and the exporters it is connected
// to (one remote_peer per address, whose control connection carries the
// imports' requests). Each table has its own lock.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "id_table.h"

namespace vmmc::core::detail {

struct import_entry;
struct remote_peer;

// What a context imported, by id (import_handle).
using import_table = id_table<import_entry>;

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
