// The context's exports, by id and by name, and the mappable segments
// (context::allocate) exports may lie in. Each table has its own lock;
// neither calls out while holding it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace vmmc::core::detail {

struct export_entry;
struct segment;

class export_table {
 public:
  // Files `e` under its name and a new id (set in `e`). False: the name is
  // taken, and nothing changed.
  bool add(const std::shared_ptr<export_entry>& e);
  // Takes export `id` out of the table (its name is free again); null when
  // there is none.
  std::shared_ptr<export_entry> remove(std::uint32_t id);
  std::shared_ptr<export_entry> find(std::uint32_t id) const;
  std::shared_ptr<export_entry> find(std::string_view name) const;
  std::vector<std::uint32_t> ids() const;

 private:
  mutable std::shared_mutex mutex_;
  std::unordered_map<std::uint32_t, std::shared_ptr<export_entry>> by_id_;
  std::unordered_map<std::string, std::uint32_t> by_name_;
  std::uint32_t next_id_ = 1;
};

// Segments are held weakly: one whose buffer is gone is forgotten.
class segment_table {
 public:
  void add(const std::shared_ptr<segment>& s);
  // The live segment that holds [base, base + length), with the range's
  // offset in it; null when none does.
  std::shared_ptr<segment> find(const void* base, std::size_t length, std::uint64_t& offset) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, std::weak_ptr<segment>> by_base_;
};

}  // namespace vmmc::core::detail
