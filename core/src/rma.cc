// Deliberate update (send) and fetch: every check first, then a user-level
// copy on the mapped path or RMA on the fabric path; requests and waiting.
#include <unistd.h>

#include <thread>

#include "core.h"
#include "vmmc/core/progress.h"

namespace vmmc::core {

using namespace detail;

namespace {
// Publishes one record on the mapped path's ring to the exporter, waking it
// only when it sleeps. Waits (flow control) while the ring is full.
status push_notification(remote_peer& peer, const notify_record& record) {
  notify_ring* ring = peer.ring();
  std::lock_guard lock(peer.ring_mutex);
  std::uint64_t tail = ring->tail.load(std::memory_order_relaxed);
  auto has_space_or_gone = [&] {
    return tail - ring->head.load(std::memory_order_acquire) < notify_ring::capacity ||
           !peer.alive.load(std::memory_order_acquire);
  };
  (void)wait_until(has_space_or_gone, clock::time_point::max(),
                   napping(std::chrono::microseconds(20)));  // no doorbell for space
  if (tail - ring->head.load(std::memory_order_acquire) >= notify_ring::capacity)
    return errc::peer_gone;
  ring->records[tail % notify_ring::capacity] = record;
  ring->tail.store(tail + 1, std::memory_order_release);
  // Pairs with the fence in prepare_wait(): either the exporter sees our
  // record when it re-checks, or we see its sleeping flag here.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (peer.wake()->sleeping.load(std::memory_order_relaxed)) {
    std::uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(peer.wake_eventfd.get(), &one, sizeof one);
  }
  return {};
}

// The checks every transfer passes before anything is posted. An errc, not
// a std::error_code: the hot path builds one only for a failure.
inline errc check_range(const import_entry& imp, std::uint64_t offset, const void* buffer,
                        std::size_t length, bool is_send) {
  if (!buffer && length) return errc::invalid_argument;
  if (offset > imp.length || length > imp.length - offset) return errc::out_of_range;
  if (!has_right(imp.allowed, is_send ? rights::write : rights::read))
    return errc::permission_denied;
  if (!imp.peer->alive.load(std::memory_order_acquire)) return errc::peer_gone;
  if (imp.given_up.load(std::memory_order_relaxed)) return errc::peer_gone;
  return errc::ok;
}

// A gathered send counts as one send per piece, as on the fabric path.
void count_send(context::impl::atomic_counters& count, std::size_t length, bool notify,
                std::size_t pieces = 1) {
  count.sends.fetch_add(pieces, std::memory_order_relaxed);
  count.bytes_sent.fetch_add(length, std::memory_order_relaxed);
  if (notify) count.notifications_sent.fetch_add(1, std::memory_order_relaxed);
}

// Every piece of a gathered send is checked before any is written: the
// pieces' own arguments first, then the import's right and its peer, once.
// `bytes` is their total.
inline errc check_pieces(const import_entry& imp, std::span<const send_piece> pieces,
                         std::size_t& bytes) {
  bytes = 0;
  for (const send_piece& p : pieces) {
    if (!p.source && p.length) return errc::invalid_argument;
    if (p.offset > imp.length || p.length > imp.length - p.offset) return errc::out_of_range;
    bytes += p.length;
  }
  return check_range(imp, 0, nullptr, 0, true);
}

// The mapped path of a gathered send: the pieces copied back to back.
inline void copy_pieces(const import_entry& imp, std::span<const send_piece> pieces) {
  std::byte* const base = imp.map->data();
  for (const send_piece& p : pieces)
    if (p.length) std::memcpy(base + p.offset, p.source, p.length);
}
}  // namespace

result<bool> context::impl::send_gathered(import_handle handle, std::span<const send_piece> pieces,
                                          send_options options) {
  import_ptr imp = find_import(handle);
  if (!imp) return errc::unknown_handle;
  std::size_t bytes = 0;
  if (errc e = check_pieces(*imp, pieces, bytes); e != errc::ok) return e;
  if (!imp->map || pieces.empty()) return false;
  std::shared_lock state(imp->state_mutex);
  if (imp->revoked) return errc::unknown_handle;
  // Counted before the copies: a locked add after them would wait for the
  // copies' cache lines to arrive.
  count_send(count, bytes, options.notify, pieces.size());
  copy_pieces(*imp, pieces);
  if (options.notify) {
    const send_piece& last = pieces.back();
    notify_record rec{imp->export_id, 0, last.offset, last.length, options.value};
    if (auto s = push_notification(*imp->peer, rec); !s) return s.error();
  }
  return true;
}

// ------------------------------------------------------------------ sender

std::shared_ptr<sender_tally> context::impl::new_tally() {
  auto tally = std::make_shared<sender_tally>();
  std::lock_guard lock(tallies_mutex);
  std::erase_if(tallies, [this](const std::shared_ptr<sender_tally>& t) {
    if (t.use_count() > 1) return false;
    // Its sender is gone (the fence pairs with the release in the sender's
    // shared_ptr destructor): its counts are final.
    std::atomic_thread_fence(std::memory_order_acquire);
    count.sends.fetch_add(t->sends.load(std::memory_order_relaxed), std::memory_order_relaxed);
    count.bytes_sent.fetch_add(t->bytes_sent.load(std::memory_order_relaxed),
                               std::memory_order_relaxed);
    return true;
  });
  tallies.push_back(tally);
  return tally;
}

result<sender> context::bind(import_handle to) {
  auto imp = impl_->find_import(to);
  if (!imp) return errc::unknown_handle;
  sender s;
  s.owner_ = this;
  s.handle_ = to;
  s.import_ = std::move(imp);
  s.tally_ = impl_->new_tally();
  return s;
}

status sender::send(std::uint64_t offset, const void* source, std::size_t length,
                    send_options options) {
  const send_piece piece{offset, source, length};
  return send(std::span(&piece, 1), options);
}

status sender::send(std::span<const send_piece> pieces, send_options options) {
  if (!import_) return errc::unknown_handle;
  const import_entry& imp = *import_;
  if (imp.released.load(std::memory_order_acquire) || imp.revoked.load(std::memory_order_acquire))
    return errc::unknown_handle;
  // Notifications and the fabric path take the general route.
  if (!imp.map || options.notify) return owner_->send(handle_, pieces, options);
  std::size_t bytes = 0;
  if (errc e = check_pieces(imp, pieces, bytes); e != errc::ok) return e;
  // No lock: a release or revocation swaps the mapped pages for private ones
  // (mapping::retire) before it completes, so a copy racing with it is lost,
  // never misplaced.
  tally_->add(pieces.size(), bytes);
  copy_pieces(imp, pieces);
  return {};
}

result<std::shared_ptr<op>> context::impl::start_transfer(import_handle handle,
                                                          std::uint64_t offset, void* buffer,
                                                          std::size_t length, bool is_send,
                                                          send_options options,
                                                          void* user_context) {
  import_ptr imp = find_import(handle);
  if (!imp) return errc::unknown_handle;
  if (errc e = check_range(*imp, offset, buffer, length, is_send); e != errc::ok) return e;

  std::shared_lock state(imp->state_mutex);
  if (imp->revoked) return errc::unknown_handle;
  if (is_send) {
    count_send(count, length, options.notify);
  } else {
    count.fetches.fetch_add(1, std::memory_order_relaxed);
    count.bytes_fetched.fetch_add(length, std::memory_order_relaxed);
  }

  if (imp->map) {  // mapped path: the copy is the transfer
    std::byte* region = imp->map->data() + offset;
    if (is_send) {
      std::memcpy(region, buffer, length);
      if (options.notify) {
        notify_record rec{imp->export_id, 0, offset, length, options.value};
        if (auto s = push_notification(*imp->peer, rec); !s) return s.error();
      }
    } else {
      std::memcpy(buffer, region, length);
    }
    return std::shared_ptr<op>();
  }

  // Fabric path. A small plain send is injected: the provider copies it, so
  // the caller has nothing to wait for (unless it asked for transmit_complete).
  fabric_endpoint& ep = *imp->endpoint;
  if (is_send && !options.notify && !options.transmit_complete && length <= ep.inject_size()) {
    if (status s = ep.inject_write(imp->fi_address, buffer, length, imp->remote_address + offset,
                                   imp->key, imp->peer->alive);
        !s)
      return classify_failure(*imp, s.error());
    return std::shared_ptr<op>();
  }
  auto o = std::make_shared<op>();
  o->user_context = user_context;
  o->import = imp;
  imp->in_flight.fetch_add(1, std::memory_order_acq_rel);
  const std::atomic<bool>& alive = imp->peer->alive;
  ep.begin(o);
  status s;
  if (!is_send) {
    s = ep.post_read(o, imp->fi_address, buffer, length, imp->remote_address + offset, imp->key,
                     alive);
  } else if (!options.notify) {
    s = ep.post_write(o, imp->fi_address, buffer, length, imp->remote_address + offset, imp->key,
                      alive, /*may_inject=*/!options.transmit_complete);
  } else {
    wire::record_header h{wire::record_magic,
                          static_cast<std::uint32_t>(wire::record_type::notify),
                          imp->export_id,
                          1,
                          offset,
                          length,
                          options.value};
    if (length <= wire::ring_inline_max) {
      // Data and notification in one record: one RMA write, copied in by
      // the exporter.
      h.type = static_cast<std::uint32_t>(wire::record_type::inline_update);
      s = post_record(imp, o, h, buffer);
    } else {
      s = ep.post_write(o, imp->fi_address, buffer, length, imp->remote_address + offset, imp->key,
                        alive);
      // Ordered after the data (FI_ORDER_WAW): the handler sees it in place.
      if (s) s = post_record(imp, o, h, nullptr);
    }
  }
  ep.finish_posting(o, s.error());
  // One look: a completion landing between two would be taken for a failure
  // with no error (a transfer that succeeded reported as failed).
  if (!o->done.load(std::memory_order_acquire)) return o;
  if (!o->error) return std::shared_ptr<op>();
  return classify_failure(*imp, o->error);
}

// Appends one record to our ring at the exporter. Under the peer's record
// lock, so records are posted (and, ordered, land) in sequence order.
status context::impl::post_record(const import_ptr& imp, const std::shared_ptr<op>& o,
                                  const wire::record_header& h, const void* payload) {
  remote_peer& p = *imp->peer;
  fabric_endpoint& ep = *imp->endpoint;
  std::lock_guard lock(p.record_mutex);
  if (!p.ring_known) return errc::protocol_error;
  // Flow control: learn how far the exporter has consumed only when our own
  // count says the ring is full, one fi_read a turn; no doorbell rings for
  // space here, so turns are 20 us apart.
  status failed;
  auto has_space = [&] {
    if (p.ring_tail - p.ring_head_cached < wire::ring_slots) return true;
    auto reader = std::make_shared<op>();
    reader->import = imp;
    imp->in_flight.fetch_add(1, std::memory_order_acq_rel);
    std::uint64_t head = 0;
    ep.begin(reader);
    status s =
        ep.post_read(reader, imp->fi_address, &head, sizeof head,
                     p.ring_address + offsetof(wire::fabric_ring, head), p.ring_key, p.alive);
    ep.finish_posting(reader, s.error());
    if (s) s = wait_op(*reader, clock::time_point::max());
    if (s && head > p.ring_tail) s = errc::protocol_error;
    if (!s)
      failed = s;
    else
      p.ring_head_cached = head;
    return !s || p.ring_tail - p.ring_head_cached < wire::ring_slots;
  };
  (void)wait_until(has_space, clock::time_point::max(), napping(std::chrono::microseconds(20)),
                   {.spin = false});
  if (!failed) return failed;
  std::byte record[wire::ring_slot_size];
  std::memcpy(record, &h, sizeof h);
  std::size_t size = sizeof h;
  if (h.type == static_cast<std::uint32_t>(wire::record_type::inline_update)) {
    if (h.length) std::memcpy(record + sizeof h, payload, h.length);
    size += h.length;
  }
  const std::uint64_t immediate = wire::make_immediate(p.link_id, p.ring_tail);
  const std::uint64_t address = p.ring_address + offsetof(wire::fabric_ring, slots) +
                                (p.ring_tail % wire::ring_slots) * wire::ring_slot_size;
  status s = ep.post_write_with_data(o, imp->fi_address, record, size, address, p.ring_key,
                                     immediate, p.alive);
  if (s) ++p.ring_tail;
  return s;
}

status context::impl::wait_op(op& o, clock::time_point deadline) {
  fabric_endpoint* ep = o.import ? o.import->endpoint : nullptr;
  auto done = [&] { return o.done.load(std::memory_order_acquire); };
  // Giving up for good: what completes later must not land in the caller's
  // memory (a fetch into a local variable was written after its function had
  // returned). A zero-copy read the provider still holds writes the caller's
  // buffer directly: give the provider a moment to fail it first (a dead
  // peer's connection fails at once; bytes it sent before are landed here).
  auto give_up = [&] {
    if (!ep) return errc::peer_gone;
    ep->abandon(o);
    auto landed_or_failed = [&] {
      ep->progress();
      return !o.lands_in_caller || done();
    };
    (void)wait_until(landed_or_failed, clock::now() + std::chrono::milliseconds(200),
                     napping(std::chrono::microseconds(50)));
    return errc::peer_gone;
  };
  bool gone = false, nudged = false;
  auto finished = [&] {
    if (ep) ep->progress();
    if (done()) return true;
    gone = o.import && !o.import->peer->alive.load(std::memory_order_acquire);
    return gone;
  };
  auto sleep = [&](std::chrono::nanoseconds most) {
    if (o.import && o.import->peer->conn->closed_by_peer()) {
      peer_died(o.import->peer, "its control connection ended while we waited");
      gone = true;
    } else if (o.import && !o.import->reachable()) {
      gone = true;
    }
    if (gone) return false;
    // A provider without a wait object (shm) is progressed, in an exporter
    // whose application is idle, on its control thread's tick, which backs
    // off to 10 ms; a transfer that needs the target's progress (shm's
    // beyond its inline size) waited that long. An empty frame on the
    // control connection wakes that thread now, once an op.
    if (ep && !ep->has_wait_fd() && o.import && !nudged) {
      nudged = true;
      (void)o.import->peer->conn->write_frame(wire::frame_type::heartbeat, nullptr, 0);
    }
    if (ep)
      ep->sleep_for_completions(std::min<std::chrono::microseconds>(
          std::chrono::milliseconds(1), std::chrono::ceil<std::chrono::microseconds>(most)));
    return true;
  };
  if (wait_until(finished, deadline, sleep_step(sleep)) == waited::timed_out)
    return errc::timed_out;
  if (gone && !done()) return give_up();
  return o.import ? classify_failure(*o.import, o.error) : o.error;
}

result<request> context::impl::remember(std::shared_ptr<op> o, void* user_context) {
  if (!o) {  // finished already: a done op keeps the request contract uniform
    o = std::make_shared<op>();
    o->user_context = user_context;
    o->done = true;
  }
  return request{requests.add(std::move(o))};
}

result<completion> context::impl::test(request r) {
  std::shared_ptr<op> o = requests.find(r.id);
  if (!o) return errc::unknown_handle;
  if (!o->done && o->import) o->import->endpoint->progress();
  std::error_code error;
  if (o->done) {
    error = o->import ? classify_failure(*o->import, o->error) : o->error;
  } else if (o->import && (!o->import->peer->alive || !o->import->reachable())) {
    error = errc::peer_gone;
  } else {
    return errc::would_block;
  }
  requests.remove(r.id);
  return completion{o->user_context, error};
}

result<completion> context::impl::wait(request r, std::chrono::milliseconds timeout) {
  std::shared_ptr<op> o = requests.find(r.id);
  if (!o) return errc::unknown_handle;
  auto deadline = timeout == std::chrono::milliseconds::max() ? clock::time_point::max()
                                                              : clock::now() + timeout;
  status s = wait_op(*o, deadline);
  if (s.is(errc::timed_out)) return errc::timed_out;  // still pending; may be waited again
  requests.remove(r.id);
  return completion{o->user_context, s.error()};
}

void context::impl::progress_all() {
  last_app_poll_ns.store(now_ns(), std::memory_order_relaxed);
  for (auto& e : fabric.endpoints())
    if (e->in_use()) e->progress();
}

}  // namespace vmmc::core
