// peer_table (imports.h).
#include "imports.h"

#include "core.h"

namespace vmmc::core::detail {

peer_table::peer_ptr peer_table::find_live(const std::string& blob) {
  std::lock_guard lock(mutex_);
  auto it = by_blob_.find(blob);
  if (it == by_blob_.end()) return nullptr;
  if (it->second->alive) return it->second;
  by_blob_.erase(it);
  return nullptr;
}

void peer_table::add(const std::string& blob, peer_ptr peer) {
  std::lock_guard lock(mutex_);
  by_blob_.emplace(blob, std::move(peer));
}

void peer_table::forget(const std::string& blob, const remote_peer* peer) {
  std::lock_guard lock(mutex_);
  if (auto it = by_blob_.find(blob); it != by_blob_.end() && it->second.get() == peer)
    by_blob_.erase(it);
}

void peer_table::copy_to(std::vector<peer_ptr>& out) const {
  std::lock_guard lock(mutex_);
  out.clear();
  for (const auto& [blob, peer] : by_blob_) out.push_back(peer);
}

void peer_table::clear() {
  std::map<std::string, peer_ptr> gone;
  std::lock_guard lock(mutex_);
  gone.swap(by_blob_);
}

}  // namespace vmmc::core::detail
