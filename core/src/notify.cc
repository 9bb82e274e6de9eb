// Notifications: records arriving on the mapped rings or the fabric rings,
// dispatched to export handlers in the polling thread; sleeping and waking.
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "core.h"
#include "parse.h"
#include "vmmc/core/progress.h"

namespace vmmc::core {

using namespace detail;

// A record landed in the ring of link (immediate >> 40), with endpoint lock
// held. Records of one link arrive in order; anything else is a lying peer.
void context::impl::on_remote_record(std::uint64_t immediate) {
  const std::uint32_t link_id = wire::immediate_link(immediate);
  auto [link, ring] = links.fabric_ring_of(link_id);
  if (!ring || !wire::immediate_is(immediate, link->next_record)) {
    VMMC_WARN("dropped a notification record out of sequence (link %u)", link_id);
    if (link) link->alive = false;
    return;
  }
  const std::byte* slot = ring->slots[link->next_record % wire::ring_slots];
  wire::record_header h;
  std::memcpy(&h, slot, sizeof h);
  ++link->next_record;
  std::atomic_ref<std::uint64_t>(ring->head).store(link->next_record, std::memory_order_release);
  if (h.magic != wire::record_magic) return;
  if (!links.may_notify(*link, h.export_id)) {
    // A link's records name only exports it was granted (issue 13: one that
    // imported nothing ran another export's handler and wrote into it).
    VMMC_WARN("dropped a record for export %u its importer was never granted", h.export_id);
    return;
  }
  apply_record(h, slot + sizeof h, wire::ring_inline_max);
}

void context::impl::apply_record(const wire::record_header& h, const std::byte* payload,
                                 std::size_t payload_length) {
  export_ptr e = find_export(h.export_id);
  if (!e || !e->live || !fits(h.offset, h.length, e->length)) {
    VMMC_WARN("dropped a record for export %u outside its bounds", h.export_id);
    return;
  }
  const record_plan plan =
      plan_record(h, e->length, has_right(e->allowed, rights::write), payload_length);
  if (plan.copy) std::memcpy(e->base + h.offset, payload, h.length);
  if (plan.notify) notifications.push({h.export_id, h.offset, h.length, h.value});
}

// ---- notification_queue (notifications.h)

status detail::notification_queue::open() {
  eventfd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!eventfd_) return errc::system_error;
  auto page = segment::create(sizeof(wake_page), "vmmc-wake");
  if (!page) return page.error();
  page_segment_ = std::move(*page);
  page_ = new (page_segment_->base) wake_page{};
  // Importers read the flag; only we may set it (a peer that cleared it
  // would keep the others from waking us).
  return page_segment_->seal_for_peers(true);
}

int detail::notification_queue::wake_page_fd() const noexcept {
  return page_segment_->fd.get();
}

bool detail::notification_queue::sleeping() const noexcept {
  return page_->sleeping.load(std::memory_order_relaxed) != 0;
}

void detail::notification_queue::push(const notification& n) {
  {
    std::lock_guard lock(mutex_);
    queued_.push_back(n);
    nonempty_.store(true, std::memory_order_release);
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (sleeping()) wake();
}

void detail::notification_queue::take(std::vector<notification>& batch) {
  if (!nonempty()) return;
  std::lock_guard lock(mutex_);
  batch.insert(batch.end(), queued_.begin(), queued_.end());
  queued_.clear();
  nonempty_.store(false, std::memory_order_relaxed);
}

void detail::notification_queue::wake() const {
  std::uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(eventfd_.get(), &one, sizeof one);
}

void detail::notification_queue::raise_flag() {
  page_->sleeping.store(1, std::memory_order_relaxed);
  raised_ = true;
  // Pairs with the fences of senders: they see the flag or we see their data.
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void detail::notification_queue::lower_flag() {
  if (!raised_) return;
  raised_ = false;
  page_->sleeping.store(0, std::memory_order_relaxed);
  std::uint64_t drained;
  [[maybe_unused]] ssize_t n = ::read(eventfd_.get(), &drained, sizeof drained);
}

// ---- the context's side

bool context::impl::notification_pending() {
  return notifications.nonempty() || links.rings_nonempty();
}

std::size_t context::impl::poll_notifications() {
  last_app_poll_ns.store(now_ns(), std::memory_order_relaxed);
  std::lock_guard dispatch(notifications.dispatch_lock());
  notifications.lower_flag();
  std::vector<notification> batch;
  links.drain_rings(batch);
  if (batch.empty())
    for (auto& e : fabric.endpoints())
      if (e->in_use()) e->try_progress();
  notifications.take(batch);
  for (const notification& n : batch) {
    export_ptr e = find_export(n.export_id);
    if (!e || !fits(n.offset, n.length, e->length)) continue;
    count.notifications_received.fetch_add(1, std::memory_order_relaxed);
    if (e->on_notify) e->on_notify(n);
  }
  return batch.size();
}

bool context::impl::prepare_wait() {
  std::lock_guard dispatch(notifications.dispatch_lock());
  notifications.raise_flag();
  for (auto& e : fabric.endpoints())
    if (e->in_use()) e->try_progress();
  if (notification_pending()) return false;
  // The control thread takes over fabric progress while we sleep.
  if (!control_watching_fabric.load(std::memory_order_acquire)) control.wake();
  return true;
}

result<std::size_t> context::impl::wait_notifications(std::chrono::milliseconds timeout) {
  const auto deadline = timeout == std::chrono::milliseconds::max() ? clock::time_point::max()
                                                                    : clock::now() + timeout;
  std::size_t n = 0;
  auto sleep = [&](std::chrono::nanoseconds most) {
    if (!prepare_wait()) return true;
    std::vector<pollfd> fds{{notifications.fd(), POLLIN, 0}};
    for (auto& e : fabric.endpoints())
      if (e->in_use() && e->has_wait_fd() && e->try_arm_wait())
        fds.push_back({e->wait_fd(), POLLIN, 0});
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(most).count();
    ::poll(fds.data(), fds.size(), static_cast<int>(std::clamp<std::int64_t>(ms, 1, 1000)));
    return true;
  };
  if (wait_until([&] { return (n = poll_notifications()) != 0; }, deadline, sleep_step(sleep)) ==
      waited::timed_out)
    return errc::timed_out;
  return n;
}

}  // namespace vmmc::core
