// export_table and segment_table (exports.h).
#include "exports.h"

#include "core.h"

namespace vmmc::core::detail {

bool export_table::add(const std::shared_ptr<export_entry>& e) {
  std::unique_lock lock(mutex_);
  if (by_name_.count(e->name)) return false;
  e->id = next_id_++;
  by_id_.emplace(e->id, e);
  by_name_.emplace(e->name, e->id);
  return true;
}

std::shared_ptr<export_entry> export_table::remove(std::uint32_t id) {
  std::unique_lock lock(mutex_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return nullptr;
  std::shared_ptr<export_entry> e = std::move(it->second);
  by_id_.erase(it);
  by_name_.erase(e->name);
  return e;
}

std::shared_ptr<export_entry> export_table::find(std::uint32_t id) const {
  std::shared_lock lock(mutex_);
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

std::shared_ptr<export_entry> export_table::find(std::string_view name) const {
  std::shared_lock lock(mutex_);
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : by_id_.at(it->second);
}

std::vector<std::uint32_t> export_table::ids() const {
  std::shared_lock lock(mutex_);
  std::vector<std::uint32_t> ids;
  ids.reserve(by_id_.size());
  for (const auto& [id, e] : by_id_) ids.push_back(id);
  return ids;
}

void segment_table::add(const std::shared_ptr<segment>& s) {
  std::lock_guard lock(mutex_);
  for (auto it = by_base_.begin(); it != by_base_.end();)  // forget dead segments
    it = it->second.expired() ? by_base_.erase(it) : std::next(it);
  by_base_[reinterpret_cast<std::uintptr_t>(s->base)] = s;
}

std::shared_ptr<segment> segment_table::find(const void* base, std::size_t length,
                                             std::uint64_t& offset) const {
  std::lock_guard lock(mutex_);
  const auto address = reinterpret_cast<std::uintptr_t>(base);
  auto it = by_base_.upper_bound(address);
  if (it == by_base_.begin()) return nullptr;
  std::shared_ptr<segment> seg = std::prev(it)->second.lock();
  if (!seg) return nullptr;
  const auto start = reinterpret_cast<std::uintptr_t>(seg->base);
  if (address + length > start + seg->size) return nullptr;
  offset = address - start;
  return seg;
}

}  // namespace vmmc::core::detail
