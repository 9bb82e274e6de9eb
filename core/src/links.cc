// link_table (links.h).
#include "links.h"

#include "core.h"

namespace vmmc::core::detail {

namespace {
// Keeps the records of `batch` from `from` on that name exports `link` was
// granted (issue 13: one that imported nothing ran another export's handler
// and wrote into it).
void keep_granted(const importer_link& link, std::vector<notification>& batch, std::size_t from) {
  auto first = batch.begin() + static_cast<std::ptrdiff_t>(from);
  auto kept = std::remove_if(first, batch.end(),
                             [&](const notification& n) { return !link.may_notify(n.export_id); });
  if (kept != batch.end())
    VMMC_WARN("dropped %zu records for exports their importer was never granted",
              static_cast<std::size_t>(batch.end() - kept));
  batch.erase(kept, batch.end());
}
}  // namespace

link_table::link_ptr link_table::oldest_half_open_locked(std::size_t& count) const {
  link_ptr oldest;
  for (const link_ptr& l : links_)
    if (l->alive && !l->hello_done) {
      ++count;
      if (!oldest || l->accepted_ns < oldest->accepted_ns) oldest = l;
    }
  return oldest;
}

void link_table::add(link_ptr link, std::size_t most_half_open) {
  std::lock_guard lock(mutex_);
  std::size_t half_open = 0;
  link_ptr oldest = oldest_half_open_locked(half_open);
  if (half_open >= most_half_open) oldest->alive = false;  // a flood ages out its own first
  link->id = next_id_++;
  by_id_.emplace(link->id, link);
  links_.push_back(std::move(link));
}

void link_table::drop_oldest_half_open() {
  std::lock_guard lock(mutex_);
  std::size_t half_open = 0;
  if (link_ptr oldest = oldest_half_open_locked(half_open)) oldest->alive = false;
}

void link_table::copy_to(std::vector<link_ptr>& out) const {
  std::lock_guard lock(mutex_);
  out = links_;
}

void link_table::remove(const link_ptr& link, std::vector<notification>& unread) {
  {
    std::lock_guard lock(mutex_);
    const std::size_t from = unread.size();
    if (notify_ring* ring = link->ring()) (void)drain_ring(*ring, unread);
    keep_granted(*link, unread, from);
    std::erase(links_, link);
    by_id_.erase(link->id);
  }
  acknowledged_.notify_all();
}

std::vector<link_table::link_ptr> link_table::take_all() {
  std::lock_guard lock(mutex_);
  by_id_.clear();
  return std::exchange(links_, {});
}

void link_table::drain_rings(std::vector<notification>& batch) {
  std::lock_guard lock(mutex_);
  for (const link_ptr& link : links_) {
    const std::size_t from = batch.size();
    if (notify_ring* ring = link->ring(); ring && !drain_ring(*ring, batch))
      link->alive = false;  // stop reading a corrupt producer
    keep_granted(*link, batch, from);
  }
}

bool link_table::rings_nonempty() const {
  std::lock_guard lock(mutex_);
  for (const link_ptr& link : links_)
    if (notify_ring* ring = link->ring())
      if (ring->head.load(std::memory_order_relaxed) != ring->tail.load(std::memory_order_acquire))
        return true;
  return false;
}

void link_table::set_ring(importer_link& link, std::shared_ptr<segment> ring) {
  std::lock_guard lock(mutex_);
  link.ring_segment = std::move(ring);
}

std::pair<link_table::link_ptr, wire::fabric_ring*> link_table::fabric_ring_of(
    std::uint32_t link_id) const {
  std::lock_guard lock(mutex_);
  auto it = by_id_.find(link_id);
  if (it == by_id_.end()) return {};
  return {it->second, it->second->fabric_ring()};
}

void link_table::set_fabric_ring(importer_link& link, std::shared_ptr<segment> ring) {
  std::lock_guard lock(mutex_);  // fabric_ring_of reads it under the lock
  link.fabric_ring_segment = std::move(ring);
}

bool link_table::may_notify(const importer_link& link, std::uint32_t export_id) const {
  std::lock_guard lock(mutex_);
  return link.may_notify(export_id);
}

bool link_table::grant(importer_link& link, const export_entry& e, bool over_fabric,
                       const std::function<void(bool granted)>& answer) {
  std::lock_guard lock(mutex_);
  if (!e.live) {
    answer(false);
    return false;
  }
  ++link.imported[e.id];
  if (over_fabric) link.imported_over_fabric.insert(e.id);
  link.granted.insert(e.id);
  answer(true);
  return true;
}

void link_table::release(importer_link& link, std::uint32_t export_id) {
  {
    std::lock_guard lock(mutex_);
    auto it = link.imported.find(export_id);
    if (it == link.imported.end() || --it->second > 0) return;
    link.imported.erase(it);
    link.imported_over_fabric.erase(export_id);
    // The importer let go with nothing of its in flight: as good as an
    // acknowledgement of a revoke that crossed this frame.
    revokes_pending_.erase({&link, export_id});
  }
  acknowledged_.notify_all();
}

void link_table::acknowledge(importer_link& link, std::uint32_t export_id) {
  {
    std::lock_guard lock(mutex_);
    revokes_pending_.erase({&link, export_id});
  }
  acknowledged_.notify_all();
}

bool link_table::revoke(const export_entry& e, std::chrono::milliseconds patience) {
  std::unique_lock lock(mutex_);
  std::vector<link_ptr> asked;
  for (const link_ptr& link : links_) {
    if (!link->alive || !link->imported.count(e.id)) continue;
    wire::revoke_body body{e.id, 0};
    if (link->conn->write_frame(wire::frame_type::revoke, &body, sizeof body) &&
        link->imported_over_fabric.count(e.id)) {
      revokes_pending_[{link.get(), e.id}] = 1;
      asked.push_back(link);
    }
  }
  auto all_acknowledged = [&] {
    for (const link_ptr& link : asked)
      if (link->alive && revokes_pending_.count({link.get(), e.id})) return false;
    return true;
  };
  const bool acknowledged = acknowledged_.wait_for(lock, patience, all_acknowledged);
  for (const link_ptr& link : asked) revokes_pending_.erase({link.get(), e.id});
  for (const link_ptr& link : links_) {
    link->imported.erase(e.id);
    link->imported_over_fabric.erase(e.id);
    link->granted.erase(e.id);
  }
  return acknowledged;
}

}  // namespace vmmc::core::detail
