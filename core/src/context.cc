// context: the public handle and the lifecycle of its implementation (start:
// providers, listeners, wake page, control thread; stop: in reverse).
#include <pthread.h>
#include <sys/random.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>

#include "core.h"
#include "vmmc/core/host.h"

namespace vmmc::core {

using namespace detail;

// ---- mappable_buffer ---------------------------------------------------------
mappable_buffer::mappable_buffer(mappable_buffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      segment_(std::move(o.segment_)) {}
mappable_buffer& mappable_buffer::operator=(mappable_buffer&& o) noexcept {
  data_ = std::exchange(o.data_, nullptr);
  size_ = std::exchange(o.size_, 0);
  segment_ = std::move(o.segment_);
  return *this;
}
mappable_buffer::~mappable_buffer() = default;

// ---- impl lifecycle -------------------------------------------------------------
status context::impl::start(const context_options& options) {
  std::vector<std::string> providers = options.providers;
  if (providers.empty()) {
    std::stringstream list(setting_string(settings::providers));
    for (std::string p; std::getline(list, p, ',');)
      if (!p.empty()) providers.push_back(p);
  }
  mapped_enabled =
      options.mapped_path < 0 ? setting_bool(settings::mapped_path) : options.mapped_path != 0;
  liveness = std::chrono::milliseconds(setting_integer(settings::liveness_ms));
  use_user_key = options.user_key;
  fabric_side::plan plan;
  plan.providers = std::move(providers);
  plan.inline_max = static_cast<std::size_t>(
      std::clamp<std::int64_t>(setting_integer(settings::inline_max), 64, 64 * 1024));
  plan.utlb_limit = static_cast<std::size_t>(setting_integer(settings::utlb_limit));
  plan.tcp_address = setting_string(settings::tcp_address);
  plan.local_address = options.local_address;

  peer_address me;
  me.host = host_identity::local().text();
  me.pid = static_cast<std::uint32_t>(::getpid());
  me.uid = static_cast<std::uint32_t>(::getuid());
  me.nonce = random_nonce();
  me.secret.resize(16);
  if (::getrandom(me.secret.data(), me.secret.size(), 0) != static_cast<ssize_t>(me.secret.size()))
    return errc::system_error;
  fabric.start(std::move(plan), std::move(me),
               [this](std::uint64_t immediate) { on_remote_record(immediate); });

  if (status s = control.open(); !s) return s;
  if (status s = notifications.open(); !s) return s;

  auto unix_fd = listen_unix(control_socket_name(self().pid, self().nonce));
  if (!unix_fd) return unix_fd.error();
  unix_listener = std::move(*unix_fd);

  // Same-host peers need no provider while the mapped path serves them:
  // libfabric's start costs ~0.3 s (its providers' libraries), so on demand it
  // waits for a peer on another host (or, the mapped path off, for the
  // first export or import: by then a layer that spans hosts has said
  // where other hosts reach us).
  if (!options.fabric_on_demand) {
    status opened = open_fabric();
    if (!opened && !mapped_enabled) return opened;
  }
  control.start([this] { control_loop(); });
  return {};
}

context::impl::~impl() {
  // Withdraw every export the way unexport_buffer does, while the control
  // thread still runs to collect acknowledgements: no importer may be in the
  // middle of writing into us when our memory and endpoints go away.
  for (std::uint32_t id : exports.ids()) (void)unexport_buffer(export_handle{id});
  control.stop();
  // Endpoints of this process that know ours let go of them while our
  // notifications, requests and imports are still there to complete.
  for (const auto& e : fabric.endpoints()) e->leave_in_process_peers();
  // Importers see our connections close (peer_gone); then regions go away.
  std::vector<link_ptr> closing = links.take_all();
  for (const link_ptr& link : closing)
    for (fabric_mr& m : link->fabric_ring_mrs) m.endpoint->deregister_export(m);
  closing.clear();
  peers.clear();
  imports.clear();
  requests.clear();
  fabric.close();
}

status context::impl::open_fabric(std::string_view local_address) {
  const bool was_open = fabric.is_open();
  status opened = fabric.open(local_address);
  if (opened && !was_open) control.wake();  // to watch the new listener
  return opened;
}

// ---- public handle ---------------------------------------------------------------
context::context(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
context::context(context&&) noexcept = default;
context& context::operator=(context&&) noexcept = default;
context::~context() = default;

result<context> context::create(const context_options& options) {
  auto p = std::make_unique<impl>();
  if (status s = p->start(options); !s) return s.error();
  return context(std::move(p));
}

namespace {
struct process_slot {
  std::mutex mutex;
  std::weak_ptr<context> held;
  pid_t owner = 0;
};
// Never destroyed: holders may let go in exit handlers after statics.
process_slot* slot = nullptr;
pthread_once_t slot_made = PTHREAD_ONCE_INIT;
// A fork() while another thread made the context (the lock is held for the
// whole creation) left the child's copy locked for ever: the child starts
// from a fresh slot (the parent's weak reference is let go of without
// touching it: it may have been half-written). pthread_once, not a static
// initializer: a fork() during glibc's once runs it again in the child,
// where a static's guard would stay taken by a thread that is not there.
void make_slot() {
  slot = new process_slot;
  ::pthread_atfork(nullptr, nullptr, [] { new (slot) process_slot; });
}
}  // namespace

result<std::shared_ptr<context>> context::shared() {
  ::pthread_once(&slot_made, make_slot);
  std::lock_guard lock(slot->mutex);
  const pid_t self = ::getpid();
  if (slot->owner == self)
    if (std::shared_ptr<context> ctx = slot->held.lock()) return ctx;
  context_options options;
  options.fabric_on_demand = true;
  options.user_key = false;
  auto made = create(options);
  if (!made) return made.error();
  auto ctx = std::make_shared<context>(std::move(*made));
  slot->held = ctx;
  slot->owner = self;
  return ctx;
}

std::string context::address() const {
  // Without the mapped path every peer comes over the fabric: the address
  // handed out must name it (fabric_on_demand left it closed so far).
  if (!impl_->mapped_enabled) (void)impl_->open_fabric();
  return impl_->fabric.address_with_secret();
}

status context::open_remote_paths(std::string_view local_address) {
  return impl_->open_fabric(local_address);
}

status context::check_address_from(std::string_view peer_address, const void* other_end,
                                   std::size_t length) const {
  auto claimed = decode_address(peer_address);
  if (!claimed) return claimed.error();
  return check_points_back(impl_->self().host, *claimed, other_end, length);
}

result<mappable_buffer> context::allocate(std::size_t bytes) {
  auto seg = segment::create(bytes, "vmmc-buffer");
  if (!seg) return seg.error();
  mappable_buffer b;
  b.data_ = (*seg)->base;
  b.size_ = bytes;
  impl_->segments.add(*seg);
  b.segment_ = std::move(*seg);
  return b;
}

result<export_handle> context::export_buffer(std::string_view name, void* base, std::size_t length,
                                             export_options options) {
  return impl_->export_buffer(name, base, length, std::move(options));
}
status context::unexport_buffer(export_handle h) {
  return impl_->unexport_buffer(h);
}

result<import_handle> context::import_buffer(std::string_view peer_address, std::string_view name,
                                             std::chrono::milliseconds timeout) {
  return impl_->import_buffer(peer_address, name, timeout);
}
status context::unimport_buffer(import_handle h) {
  return impl_->unimport_buffer(h);
}

status context::give_up_when(import_handle h, std::function<bool()> broken) {
  auto imp = impl_->find_import(h);
  if (!imp) return errc::unknown_handle;
  imp->broken = std::move(broken);
  return {};
}

result<import_info> context::describe(import_handle h) const {
  auto imp = impl_->find_import(h);
  if (!imp) return errc::unknown_handle;
  if (!imp->peer->alive.load(std::memory_order_acquire)) return errc::peer_gone;
  std::shared_lock state(imp->state_mutex);
  if (imp->revoked) return errc::unknown_handle;
  return import_info{imp->length, imp->allowed, imp->map != nullptr,
                     !imp->map && imp->endpoint && imp->endpoint->completion_needs_peer(),
                     static_cast<bool>(imp->wake_fd)};
}

status context::wake(import_handle h) const {
  auto imp = impl_->find_import(h);
  if (!imp) return errc::unknown_handle;
  if (!imp->wake_fd) return errc::invalid_argument;
  const std::uint64_t one = 1;
  if (::write(imp->wake_fd.get(), &one, sizeof one) != sizeof one) return errc::system_error;
  return {};
}

result<std::string> context::path_of(import_handle h) const {
  auto imp = impl_->find_import(h);
  if (!imp) return errc::unknown_handle;
  if (imp->map) return std::string("mapped");
  return "fabric:" + imp->endpoint->full_name();
}

status context::send(import_handle to, std::uint64_t offset, const void* source, std::size_t length,
                     send_options options) {
  auto o =
      impl_->start_transfer(to, offset, const_cast<void*>(source), length, true, options, nullptr);
  if (!o) return o.error();
  if (!*o) return {};  // completed during the call (mapped path, injected write)
  // Copied into bounce buffers: the source may be reused now, and the data
  // is ordered ahead of later operations; a failure shows on those (the
  // peer is then gone). Only zero-copy sends must wait for their completion,
  // and those asked to be transmitted before we return (an inject has no
  // completion, so those were posted as tracked copies).
  if (!(*o)->zero_copy && !options.transmit_complete) return {};
  return impl_->wait_op(**o, clock::time_point::max());
}

status context::send(import_handle to, std::span<const send_piece> pieces, send_options options) {
  auto copied = impl_->send_gathered(to, pieces, options);
  if (!copied) return copied.error();
  if (*copied) return {};
  // Fabric path: consecutive sends to one peer land in order. Small pieces
  // that continue each other in the destination go as one write.
  constexpr std::size_t merge_max = 4096;
  for (std::size_t i = 0; i < pieces.size();) {
    std::uint64_t offset = pieces[i].offset;
    const void* source = pieces[i].source;
    std::size_t length = pieces[i].length;
    std::size_t next = i + 1;
    auto continues = [&](std::size_t j) {
      return j < pieces.size() && pieces[j].offset == offset + length &&
             length + pieces[j].length <= merge_max;
    };
    std::byte staged[merge_max];
    if (continues(next)) {
      if (length) std::memcpy(staged, source, length);
      for (; continues(next); ++next) {
        if (pieces[next].length)
          std::memcpy(staged + length, pieces[next].source, pieces[next].length);
        length += pieces[next].length;
      }
      source = staged;
    }
    const bool last = next == pieces.size();
    send_options o = options;
    o.notify = options.notify && last;
    o.transmit_complete = options.transmit_complete && last;  // covers the earlier ones
    if (status s = send(to, offset, source, length, o); !s) return s;
    // Counted per piece, as on the mapped path.
    if (next - i > 1) impl_->count.sends.fetch_add(next - i - 1, std::memory_order_relaxed);
    i = next;
  }
  return {};
}

status context::fetch(import_handle from, std::uint64_t offset, void* destination,
                      std::size_t length) {
  auto o = impl_->start_transfer(from, offset, destination, length, false, {}, nullptr);
  if (!o) return o.error();
  if (!*o) return {};
  return impl_->wait_op(**o, clock::time_point::max());
}

result<request> context::send_async(import_handle to, std::uint64_t offset, const void* source,
                                    std::size_t length, send_options options, void* user_context) {
  auto o = impl_->start_transfer(to, offset, const_cast<void*>(source), length, true, options,
                                 user_context);
  if (!o) return o.error();
  return impl_->remember(std::move(*o), user_context);
}

result<request> context::fetch_async(import_handle from, std::uint64_t offset, void* destination,
                                     std::size_t length, void* user_context) {
  auto o = impl_->start_transfer(from, offset, destination, length, false, {}, user_context);
  if (!o) return o.error();
  return impl_->remember(std::move(*o), user_context);
}

result<completion> context::test(request r) {
  return impl_->test(r);
}
result<completion> context::wait(request r, std::chrono::milliseconds timeout) {
  return impl_->wait(r, timeout);
}

std::size_t context::poll_notifications() {
  return impl_->poll_notifications();
}
result<std::size_t> context::wait_notifications(std::chrono::milliseconds timeout) {
  return impl_->wait_notifications(timeout);
}
int context::notification_fd() const noexcept {
  return impl_->notifications.fd();
}
bool context::prepare_wait() {
  return impl_->prepare_wait();
}
void context::progress() {
  impl_->progress_all();
}

counters context::stats() const {
  counters c{};
  {
    // Under the lock: a tally folded into `count` meanwhile is seen once.
    std::lock_guard lock(impl_->tallies_mutex);
    c.sends = impl_->count.sends;
    c.bytes_sent = impl_->count.bytes_sent;
    for (const auto& t : impl_->tallies) {
      c.sends += t->sends.load(std::memory_order_relaxed);
      c.bytes_sent += t->bytes_sent.load(std::memory_order_relaxed);
    }
  }
  c.fetches = impl_->count.fetches;
  c.notifications_sent = impl_->count.notifications_sent;
  c.notifications_received = impl_->count.notifications_received;
  c.bytes_fetched = impl_->count.bytes_fetched;
  for (const auto& e : impl_->fabric.endpoints()) {
    reg_cache_counters u = e->utlb().counters();
    c.utlb_lookups += u.lookups;
    c.utlb_hits += u.hits;
    c.utlb_misses += u.misses;
    c.utlb_registrations += u.registrations;
    c.utlb_evictions += u.evictions;
    c.utlb_bytes_registered += u.bytes_registered;
  }
  return c;
}

}  // namespace vmmc::core
