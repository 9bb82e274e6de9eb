// The asynchronous requests a context handed out (send_async, fetch_async)
// and has not yet reported: each is reported once, and ids are never reused.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace vmmc::core::detail {

struct op;

class request_table {
 public:
  std::uint64_t add(std::shared_ptr<op> o) {
    std::lock_guard lock(mutex_);
    const std::uint64_t id = next_id_++;
    ops_.emplace(id, std::move(o));
    return id;
  }
  // Null: never handed out, or reported already.
  std::shared_ptr<op> find(std::uint64_t id) const {
    std::lock_guard lock(mutex_);
    auto it = ops_.find(id);
    return it == ops_.end() ? nullptr : it->second;
  }
  void remove(std::uint64_t id) {
    std::lock_guard lock(mutex_);
    ops_.erase(id);
  }
  void clear() {
    std::unordered_map<std::uint64_t, std::shared_ptr<op>> gone;
    std::lock_guard lock(mutex_);
    gone.swap(ops_);
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<std::uint64_t, std::shared_ptr<op>> ops_;
  std::uint64_t next_id_ = 1;
};

}  // namespace vmmc::core::detail
