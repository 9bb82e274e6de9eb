// Objects a context hands out by id (imports, asynchronous requests), each
// found until it is taken out; ids are never reused. One shared lock, never
// held while calling out but for for_each's callback; what clear() takes out
// is destroyed after the lock is released.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

namespace vmmc::core::detail {

template <class T>
class id_table {
 public:
  // Files `v` under a new id, which `named(*v, id)` records in it before
  // another thread can find it; returns the id.
  template <class Named>
  std::uint64_t add(const std::shared_ptr<T>& v, Named&& named) {
    std::unique_lock lock(mutex_);
    const std::uint64_t id = next_id_++;
    named(*v, id);
    by_id_.emplace(id, v);
    return id;
  }
  std::uint64_t add(const std::shared_ptr<T>& v) {
    return add(v, [](T&, std::uint64_t) {});
  }
  // Null: never handed out, or taken out already.
  std::shared_ptr<T> find(std::uint64_t id) const {
    std::shared_lock lock(mutex_);
    auto it = by_id_.find(id);
    return it == by_id_.end() ? nullptr : it->second;
  }
  std::shared_ptr<T> remove(std::uint64_t id) {
    std::unique_lock lock(mutex_);
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return nullptr;
    std::shared_ptr<T> v = std::move(it->second);
    by_id_.erase(it);
    return v;
  }
  // `f(shared_ptr<T>)` for every object, under the shared lock.
  template <class F>
  void for_each(F&& f) const {
    std::shared_lock lock(mutex_);
    for (const auto& [id, v] : by_id_) f(v);
  }
  void clear() {
    std::unordered_map<std::uint64_t, std::shared_ptr<T>> gone;
    std::unique_lock lock(mutex_);
    gone.swap(by_id_);
  }

 private:
  mutable std::shared_mutex mutex_;
  std::unordered_map<std::uint64_t, std::shared_ptr<T>> by_id_;
  std::uint64_t next_id_ = 1;
};

}  // namespace vmmc::core::detail
