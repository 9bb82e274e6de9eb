// The control connections importers opened to us (importer_link), and what
// each was granted. One lock covers both: a grant is checked against its
// export's life, and an export's withdrawal against every link's grants.
// Nothing is called out under it but a frame's write on a link (a revoke,
// an import's reply), which the protocol orders behind the grant.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "vmmc/core/context.h"

namespace vmmc::core::detail {

struct importer_link;
struct export_entry;
struct segment;
namespace wire {
struct fabric_ring;
}

class link_table {
 public:
  using link_ptr = std::shared_ptr<importer_link>;

  // Files a link just accepted under a new id. Of the links still without a
  // hello, at most `most_half_open` stay: beyond, the oldest is let go
  // (alive = false; the control thread closes it).
  void add(link_ptr link, std::size_t most_half_open);
  // Out of descriptors: the oldest link still without a hello is let go.
  void drop_oldest_half_open();
  void copy_to(std::vector<link_ptr>& out) const;
  // Takes `link` out (a revoke waiting for it stops waiting). What it
  // published before it went is appended to `unread` (records of exports it
  // was granted only).
  void remove(const link_ptr& link, std::vector<notification>& unread);
  std::vector<link_ptr> take_all();

  // The mapped rings: their records of granted exports go to `batch`; a
  // ring found corrupt ends its link.
  void drain_rings(std::vector<notification>& batch);
  bool rings_nonempty() const;
  void set_ring(importer_link& link, std::shared_ptr<segment> ring);

  // A fabric record of link `link_id` landed: the link and its ring, if it
  // has one.
  std::pair<link_ptr, wire::fabric_ring*> fabric_ring_of(std::uint32_t link_id) const;
  void set_fabric_ring(importer_link& link, std::shared_ptr<segment> ring);
  bool may_notify(const importer_link& link, std::uint32_t export_id) const;

  // Grants an import of `e` to `link` unless `e` was withdrawn meanwhile
  // (false). `answer` runs under the lock either way: a revoke written by a
  // concurrent withdrawal then follows the reply on the link's connection.
  bool grant(importer_link& link, const export_entry& e, bool over_fabric,
             const std::function<void(bool granted)>& answer);
  // The importer let go of one import of `export_id`; its last one settles
  // a revoke that crossed it.
  void release(importer_link& link, std::uint32_t export_id);
  // The importer says nothing of its can land in `export_id` any more.
  void acknowledge(importer_link& link, std::uint32_t export_id);
  // Asks every importer of `e` to stop, and waits up to `patience` for those
  // that imported it over the fabric (their writes may be in flight; mapped
  // imports lose the pages whatever they answer). Then no link holds a
  // grant of it. False: not every importer acknowledged in time.
  bool revoke(const export_entry& e, std::chrono::milliseconds patience);

 private:
  link_ptr oldest_half_open_locked(std::size_t& count) const;

  mutable std::mutex mutex_;
  std::vector<link_ptr> links_;
  std::unordered_map<std::uint32_t, link_ptr> by_id_;
  std::uint32_t next_id_ = 1;
  // Revokes sent and not yet acknowledged: (link, export id).
  std::map<std::pair<const importer_link*, std::uint32_t>, int> revokes_pending_;
  std::condition_variable acknowledged_;
};

}  // namespace vmmc::core::detail
