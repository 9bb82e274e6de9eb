// A channel end: its exported area, set-up, and the word-level protocol of
// wire.h (ring writes and credits, doorbell arming, one redirection post).
#include "vmmc/redirect/channel.h"

#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "parse.h"
#include "settings.h"
#include "vmmc/core/progress.h"
#include "wire.h"

namespace vmmc::redirect {

namespace {
using clock = std::chrono::steady_clock;
using wire::area_header;

using detail::max_ring_bytes;
using detail::page;
using detail::parsed_descriptor;
constexpr std::size_t cached_buffers = 4;  // posted-buffer exports/imports kept per end

std::uint64_t load(const std::uint64_t& word) {
  return std::atomic_ref<std::uint64_t>(const_cast<std::uint64_t&>(word))
      .load(std::memory_order_acquire);
}
void store(std::uint64_t& word, std::uint64_t value) {
  std::atomic_ref<std::uint64_t>(word).store(value, std::memory_order_release);
}
void full_fence() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

// Export names must be unique per process and unguessable across processes:
// exported to anyone, a name is the capability to its memory, handed to one
// peer in-band. Each carries 128 random bits of its own: knowing some names
// (a client learns its own connection's) tells nothing of the others.
std::string unique_name(const char* kind) {
  std::uint64_t r[2];
  if (::getrandom(r, sizeof r, 0) != static_cast<ssize_t>(sizeof r)) {
    std::random_device rd;  // a sandbox may refuse the system call
    for (auto& word : r) word = (std::uint64_t{rd()} << 32) ^ rd();
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "rd%s.%016llx%016llx", kind, static_cast<unsigned long long>(r[0]),
                static_cast<unsigned long long>(r[1]));
  return buf;
}

// Copies go through a ring in slices published (or credited) one at a
// time, so the other side works on one slice while we copy the next.
std::size_t slice_of(std::size_t ring_bytes) {
  return std::max<std::size_t>(ring_bytes / 8, 16 * 1024);
}

// A deadline `timeout` from now; max() means none.
clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  return timeout == std::chrono::milliseconds::max() ? clock::time_point::max()
                                                     : clock::now() + timeout;
}

// Arming words: the epoch times two, plus this bit when the sleeper watches
// its wait descriptor (channel_options::wait_fd).
constexpr std::uint64_t armed_by_wait_fd = 1;

// An eventfd for a sleeper to watch, or -1: past half of the process's
// descriptor limit the application's own descriptors come first (each
// stream would take two more: this one and the peer's copy).
int open_wait_fd() {
  const int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  rlimit limit{};
  if (fd >= 0 && ::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
      static_cast<rlim_t>(fd) >= limit.rlim_cur / 2) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::size_t round_up_pow2(std::size_t n) {
  std::size_t p = page;
  while (p < n) p <<= 1;
  return p;
}

}  // namespace

class channel::impl {
 public:
  impl(core::context& c, channel_options o) : ctx(c), options(std::move(o)) {}
  ~impl();

  status create_area();
  // Imports the peer's area and binds to it; `attached` becomes true (with
  // release ordering) only once every peer field below is set.
  status attach(const parsed_descriptor& peer_area,
                std::chrono::milliseconds patience = std::chrono::seconds(5));
  status bind_peer(const parsed_descriptor& peer_area);
  status place_hello(std::string_view user_hello);
  result<std::string> read_hello() const;

  // `lend`: the caller waits anyway, so the fabric may read its buffer in
  // place until the transfer completes (the blocking form); otherwise, on a
  // path whose completions wait for the peer, the bytes go through
  // `staging` and the call never waits for the peer.
  result<std::size_t> write(const std::byte* data, std::size_t length, bool lend);
  status send_slice(const std::byte* data, std::size_t piece, bool lend);
  void reap_staged(clock::duration patience);
  result<std::size_t> write_wait(const std::byte* data, std::size_t length, bool all,
                                 std::chrono::milliseconds timeout);
  std::size_t redirect_into_post(const std::byte* data, std::size_t length, status& error);
  void ring_if_armed(const std::uint64_t& armed_word, std::uint64_t& last_rung);
  status close_write();

  std::size_t readable();
  std::size_t copy_out(std::byte* data, std::size_t length, bool consume);
  // Copies `n` bytes starting at ring position `at`, across the wrap.
  void copy_from_ring(std::uint64_t at, std::byte* data, std::size_t n) const {
    std::size_t i = static_cast<std::size_t>(at & (ring_bytes - 1));
    std::size_t first = std::min(n, ring_bytes - i);
    std::memcpy(data, ring + i, first);
    if (first < n) std::memcpy(data + first, ring, n - first);
  }
  void return_credit();
  result<receive_result> receive(std::byte* data, std::size_t length, bool wait_all,
                                 std::chrono::milliseconds timeout);
  result<receive_result> complete_post(std::byte* data, std::size_t length, bool wait_all,
                                       clock::time_point deadline);
  result<std::optional<receive_result>> step_post(std::byte* data, std::size_t length,
                                                  bool wait_all, bool promised, bool must_leave);
  status post_buffer(std::byte* data, std::size_t length);
  result<bool> withdraw_post();
  void abandon_post(std::byte* data, std::size_t length);
  status wait(clock::time_point deadline, sleep_reason reason,
              core::function_ref<core::turn()> step);
  template <core::predicate Ready>
  status wait(clock::time_point deadline, sleep_reason reason, Ready&& ready) {
    auto step = [&] { return ready() ? core::turn::done : core::turn::waiting; };
    return wait(deadline, reason, core::function_ref<core::turn()>(step));
  }
  bool poll();
  std::uint64_t activity() const;
  bool prepare_sleep(sleep_reason reason, wake_by how);
  std::size_t writable();
  bool at_end();
  bool gone();
  // What a failed send to the peer means: its area's export is revoked
  // (core says unknown_handle) when the peer closed or died: peer_gone.
  std::error_code send_failure(const status& s) {
    return gone() ? make_error_code(errc::peer_gone) : s.error();
  }

  status put(std::size_t offset, std::uint64_t value, core::send_options how = {}) {
    return to_peer.send(offset, &value, sizeof value, how);
  }
  // A record's bytes up to its id word, then (ordered behind them) the id,
  // which the peer reads as "the record is complete".
  status put_record(std::size_t offset, const void* record, std::size_t id_offset,
                    std::uint64_t id) {
    const core::send_piece pieces[] = {{offset, record, id_offset},
                                       {offset + id_offset, &id, sizeof id}};
    return to_peer.send(pieces);
  }
  // Tells the peer how far our stream reached. Returns once everything sent
  // so far has left this process: bytes a writer saw accepted then reach the
  // peer even if the writer exits or is killed at once, as with a kernel
  // socket (on the fabric path they could otherwise still sit in libfabric).
  status publish_produced() {
    return put(offsetof(area_header, produced), stream_sent, {.transmit_complete = true});
  }
  result<std::uint64_t> get(std::size_t offset) {
    std::uint64_t v = 0;
    if (status s = ctx.fetch(peer, offset, &v, sizeof v); !s) return s.error();
    return v;
  }
  // The user's connection beside the channel broke (channel_options).
  bool broken() const { return options.connection_broken && options.connection_broken(); }
  // Our earlier writes are in the peer's memory once this returns: on the
  // fabric path a fetch is ordered behind them (read-after-write ordering).
  // Bounded: over libfabric shm a fetch between two live processes that are
  // both ending was seen never to complete (nx jobs hanging in exit), and an
  // end of stream must not hang a process. A fetch given up on may still
  // land later, so its 8-byte target is left allocated then.
  status flush() {
    if (caps.mapped) return {};
    auto target = std::make_unique<std::uint64_t>(0);
    auto r = ctx.fetch_async(peer, offsetof(area_header, own_sent), target.get(), sizeof *target);
    if (!r) return r.error();
    auto done = ctx.wait(*r, flush_timeout);
    if (done.is(errc::timed_out)) {
      (void)target.release();
      return errc::timed_out;
    }
    if (!done) return done.error();
    return done->error ? status(done->error) : status{};
  }
  static constexpr std::chrono::seconds flush_timeout{2};
  static constexpr std::chrono::milliseconds staged_wait{2};
  // `caps` is one of the fields attach() publishes: read it only after.
  void progress() {
    if (attached.load(std::memory_order_acquire) && caps.needs_progress) ctx.progress();
  }

  core::context& ctx;
  channel_options options;
  std::size_t post_min = 0;

  // This end's area.
  core::mappable_buffer memory;
  area_header* area = nullptr;
  std::byte* ring = nullptr;
  std::size_t ring_bytes = 0;
  std::string area_name;
  core::export_handle area_export{};
  bool exported = false;
  int wait_fd = -1;  // channel_options::wait_fd; closed after the area's export

  // The peer's area.
  core::import_handle peer{};
  core::sender to_peer;               // sends into the peer's area
  std::atomic<bool> attached{false};  // set once by attach(), read by any thread
  // attach() found the peer gone, or its area withdrawn (its end destroyed):
  // what it wrote into our area before it went is all there will be.
  std::atomic<bool> departed{false};
  redirect::channel_capabilities caps;
  bool completion_needs_peer = false;  // see core::import_info
  bool peer_wakeable = false;          // core::import_info::wakeable
  std::string path_name;
  std::uint64_t peer_ring_bytes = 0, peer_ring_offset = 0;
  std::string peer_address;

  // Writer side (one thread at a time).
  std::uint64_t stream_sent = 0, ring_written = 0, credit = 0;
  std::uint64_t handled_post = 0, last_rung_data = 0, space_epoch = 0;
  bool write_closed = false;
  std::atomic<bool> writes_stopped{false};  // stop_writing(), from any thread
  // What a non-blocking write() sent over a path whose completions wait for
  // the peer (libfabric shm: the receiver pulls large writes), at the same
  // positions as in the peer's ring: a stopped reader must not stop our
  // writer's call, as it would while the fabric reads the caller's buffer.
  // A position is rewritten only after the peer consumed it, so nothing
  // sent from here is overwritten while the fabric may still read it. The
  // copy costs: over shm, iperf3 (non-blocking) 104-108 Gbit/s lent, 43-55
  // staged; kernel TCP 23.
  std::unique_ptr<std::byte[]> staging;
  std::deque<core::request> staged;  // sends from `staging` not seen complete
  struct buffer_import {
    std::string name;
    core::import_handle handle;
  };
  std::vector<buffer_import> buffer_imports;

  // Reader side (one thread at a time).
  std::uint64_t stream_read = 0, ring_read = 0, credited = 0;
  std::uint64_t data_epoch = 0, last_rung_space = 0, post_id = 0, post_start = 0;
  bool post_open = false;
  std::byte* post_data = nullptr;  // an open post's buffer (post()/poll_post())
  std::size_t post_length = 0;
  std::uint64_t polled_activity = 0;
  struct buffer_export {
    const std::byte* base;
    std::size_t length;
    std::string name;
    core::export_handle handle;
  };
  std::vector<buffer_export> buffer_exports;
  // The cached export of exactly [data, data + length), or end().
  std::vector<buffer_export>::iterator cached_export(const std::byte* data, std::size_t length) {
    return std::find_if(buffer_exports.begin(), buffer_exports.end(), [&](const buffer_export& b) {
      return b.base == data && b.length == length;
    });
  }

  std::atomic<std::uint64_t> bytes_sent{0}, bytes_received{0}, bytes_copied{0}, bytes_redirected{0},
      posts{0}, doorbells{0};
};

// ------------------------------------------------------------------ set-up

status channel::impl::create_area() {
  std::size_t want = options.ring_bytes
                         ? options.ring_bytes
                         : static_cast<std::size_t>(core::setting_integer(settings::ring_bytes));
  if (want > max_ring_bytes) return errc::invalid_argument;
  ring_bytes = round_up_pow2(want);
  post_min = options.post_min ? options.post_min
                              : static_cast<std::size_t>(core::setting_integer(settings::post_min));

  std::size_t header = (sizeof(area_header) + page - 1) / page * page;
  auto mem = ctx.allocate(header + ring_bytes);
  if (!mem) return mem.error();
  memory = std::move(*mem);
  area = new (memory.data()) area_header{};
  area->magic = wire::area_magic;
  area->ring_bytes = ring_bytes;
  area->ring_offset = header;
  ring = memory.data() + header;

  area_name = unique_name("a");
  core::export_options eo;
  if (options.wait_fd) eo.wake_fd = wait_fd = open_wait_fd();
  eo.allowed = core::rights::read_write;
  // The name is the capability: only the peer it is handed to in-band knows it.
  eo.policy = core::import_policy::anyone();
  auto h = ctx.export_buffer(area_name, memory.data(), memory.size(), std::move(eo));
  if (!h) return h.error();
  area_export = *h;
  exported = true;
  return {};
}

channel::impl::~impl() {
  // Sends still reading `staging` keep it: bounded as flush(), then leaked.
  reap_staged(flush_timeout);
  if (!staged.empty()) (void)staging.release();
  if (attached) {
    for (auto& b : buffer_imports) (void)ctx.unimport_buffer(b.handle);
    (void)ctx.unimport_buffer(peer);
  }
  for (auto& b : buffer_exports) (void)ctx.unexport_buffer(b.handle);
  // The area's memory goes with its export (nothing of ours uses it again),
  // so unexport need not move its pages away from the peer first.
  memory = core::mappable_buffer{};
  if (exported) (void)ctx.unexport_buffer(area_export);
  if (wait_fd >= 0) ::close(wait_fd);  // lent to importers until the unexport
}

status channel::impl::attach(const parsed_descriptor& peer_area,
                             std::chrono::milliseconds patience) {
  if (options.reached_over)
    if (status s = ctx.check_address_from(peer_area.address, &*options.reached_over,
                                          sizeof(sockaddr_storage));
        !s)
      return s;
  // Its area was exported before its hello named it: gone now means the
  // peer went, or is going (its end destroyed, the export withdrawn). A
  // wait that never attached has no import to ask later (gone()), so it
  // must learn it here: a reader whose writer was killed as it switched
  // waited for ever (its import succeeded, the first fetch found the peer
  // gone).
  auto failed = [&](std::error_code e) {
    if (e == errc::peer_gone || e == errc::unknown_export || e == errc::unknown_handle)
      departed.store(true, std::memory_order_relaxed);
    return e;
  };
  auto h = ctx.import_buffer(peer_area.address, peer_area.name, patience);
  if (!h) return failed(h.error());
  peer = *h;
  if (options.connection_broken) (void)ctx.give_up_when(peer, options.connection_broken);
  if (status s = bind_peer(peer_area); !s) {
    (void)ctx.unimport_buffer(peer);
    return failed(s.error());
  }
  // Published last: other threads read the fields above once they see it.
  attached.store(true, std::memory_order_release);
  return {};
}

status channel::impl::bind_peer(const parsed_descriptor& peer_area) {
  auto bound = ctx.bind(peer);
  if (!bound) return bound.error();
  to_peer = std::move(*bound);
  peer_address = peer_area.address;
  auto info = ctx.describe(peer);
  if (!info) return info.error();
  std::uint64_t words[3] = {};
  if (status s = ctx.fetch(peer, 0, words, sizeof words); !s) return s;
  if (!detail::check_area(words, peer_area.ring_bytes, info->length)) return errc::protocol_error;
  peer_ring_bytes = words[1];
  peer_ring_offset = words[2];
  auto p = ctx.path_of(peer);
  path_name = p ? *p : "unknown";
  caps.mapped = info->mapped;
  caps.needs_progress = caps.zero_copy_receive = !info->mapped;
  completion_needs_peer = info->completion_needs_peer;
  peer_wakeable = info->wakeable;
  return {};
}

status channel::impl::place_hello(std::string_view user_hello) {
  std::string me = area_name + "#" + std::to_string(ring_bytes) + "#" + ctx.address();
  wire::hello h{};
  h.descriptor_length = static_cast<std::uint32_t>(me.size());
  h.user_length = static_cast<std::uint32_t>(user_hello.size());
  std::memcpy(h.user, user_hello.data(), user_hello.size());
  std::memcpy(h.descriptor, me.data(), me.size());
  constexpr std::size_t at = offsetof(area_header, peer_hello);
  std::size_t body = offsetof(wire::hello, descriptor) + me.size();
  if (status s = ctx.send(peer, at + sizeof h.state, reinterpret_cast<std::byte*>(&h) + 8,
                          body - sizeof h.state);
      !s)
    return s;
  if (status s = put(at, 1); !s) return s;
  return flush();  // visible before we return
}

result<std::string> channel::impl::read_hello() const {
  if (load(area->peer_hello.state) != 1) return errc::would_block;
  auto hello = detail::copy_hello(area->peer_hello);
  if (!hello) return hello.error();
  return std::move(hello->user);
}

// ------------------------------------------------------------------ sending

// Rings the peer's doorbell once per arming epoch it published in our area.
void channel::impl::ring_if_armed(const std::uint64_t& armed_word, std::uint64_t& last_rung) {
  std::uint64_t armed = load(armed_word);
  if (armed <= last_rung) return;
  last_rung = armed;
  doorbells.fetch_add(1, std::memory_order_relaxed);
  if ((armed & armed_by_wait_fd) && peer_wakeable && ctx.wake(peer)) return;
  if (options.ring_doorbell) options.ring_doorbell();
}

// Takes up the peer's open post, if any: places the first bytes of `data`
// that fall inside it straight into the posted buffer and reports. Every post
// seen is answered within this call, so the poster never waits on our future.
std::size_t channel::impl::redirect_into_post(const std::byte* data, std::size_t length,
                                              status& error) {
  const wire::post& p = area->open_post;
  std::uint64_t id = load(p.id);
  if (id <= handled_post) return 0;
  handled_post = id;
  store(area->own_post_seen, id);
  full_fence();  // pairs with the poster's withdraw-then-fetch
  std::size_t placed = 0;
  std::uint64_t start = stream_sent;
  const auto [offset, n] =
      load(area->withdrawn) < id
          ? detail::place_in_post(load(p.stream_position), load(p.length), start, length)
          : detail::post_placement{};
  if (n > 0) {
    std::string name(p.name, strnlen(p.name, wire::name_max));
    auto it = std::find_if(buffer_imports.begin(), buffer_imports.end(),
                           [&](const buffer_import& b) { return b.name == name; });
    core::import_handle target{};
    if (it != buffer_imports.end()) {
      target = it->handle;
    } else if (auto h = ctx.import_buffer(peer_address, name); h) {
      if (buffer_imports.size() >= cached_buffers) {
        (void)ctx.unimport_buffer(buffer_imports.front().handle);
        buffer_imports.erase(buffer_imports.begin());
      }
      buffer_imports.push_back({name, *h});
      target = *h;
    }
    if (target.id != 0) {
      store(area->own_sent, stream_sent + n);
      status s = ctx.send(target, offset, data, n);
      if (s) {
        placed = n;
      } else {
        store(area->own_sent, stream_sent);  // nothing went: the sleep check must agree
        if (!s.is(errc::unknown_handle) && !s.is(errc::out_of_range)) {
          error = s;  // the peer is gone: nothing more to report
          return 0;
        }
      }
    }
  }
  wire::report r{start, placed, 0};
  constexpr std::size_t at = offsetof(area_header, post_report);
  if (status s = put_record(at, &r, offsetof(wire::report, id), id); !s) error = s;
  if (placed && error) {
    stream_sent += placed;
    store(area->own_sent, stream_sent);
    if (status s = publish_produced(); !s) error = s;
    bytes_sent.fetch_add(placed, std::memory_order_relaxed);
  }
  return error ? placed : 0;
}

// Sends `piece` bytes of `data` to the ring's next position, then the
// produced word that announces them (ordered behind: on the mapped path it
// follows the bytes at once). Lent (and on the mapped path): transmitted
// before we return, as publish_produced(). Staged: copied, sent from the
// copy, not waited for here (see write()).
status channel::impl::send_slice(const std::byte* data, std::size_t piece, bool lend) {
  const std::size_t at = static_cast<std::size_t>(ring_written & (peer_ring_bytes - 1));
  const std::size_t first = std::min<std::size_t>(piece, peer_ring_bytes - at);
  const std::uint64_t produced = stream_sent + piece;
  store(area->own_sent, produced);
  if (lend || !completion_needs_peer) {
    core::send_piece parts[3];
    std::size_t count = 0;
    parts[count++] = {peer_ring_offset + at, data, first};
    if (first < piece) parts[count++] = {peer_ring_offset, data + first, piece - first};
    parts[count++] = {offsetof(area_header, produced), &produced, sizeof produced};
    return to_peer.send(std::span(parts, count), {.transmit_complete = true});
  }
  if (!staging) staging = std::make_unique<std::byte[]>(peer_ring_bytes);
  std::memcpy(staging.get() + at, data, first);
  if (first < piece) std::memcpy(staging.get(), data + first, piece - first);
  const std::pair<std::size_t, std::size_t> parts[] = {{at, first}, {0, piece - first}};
  for (auto [from, n] : parts) {
    if (n == 0) continue;
    auto r = ctx.send_async(peer, peer_ring_offset + from, staging.get() + from, n);
    if (!r) return r.error();
    staged.push_back(*r);
  }
  return put(offsetof(area_header, produced), produced);
}

// Releases the staged sends seen complete, waiting up to `patience` for
// them. A failed one means the peer is gone, which the next call finds out.
void channel::impl::reap_staged(clock::duration patience) {
  const auto until = clock::now() + patience;
  while (!staged.empty()) {
    auto left = std::chrono::ceil<std::chrono::milliseconds>(until - clock::now());
    auto done = left.count() > 0 ? ctx.wait(staged.front(), left) : ctx.test(staged.front());
    if (done.is(errc::timed_out) || done.is(errc::would_block)) return;
    staged.pop_front();
  }
}

result<std::size_t> channel::impl::write(const std::byte* data, std::size_t length, bool lend) {
  if (!attached) return errc::not_connected;
  if (write_closed || writes_stopped.load(std::memory_order_relaxed)) return errc::closed;
  reap_staged(clock::duration::zero());
  status error;
  std::size_t done = redirect_into_post(data, length, error);
  if (!error) return send_failure(error);
  if (done < length) {
    std::uint64_t granted = load(area->credit);
    if (granted > credit) credit = granted;
    std::size_t space = static_cast<std::size_t>(peer_ring_bytes - (ring_written - credit));
    // Published a slice at a time, so the receiver copies out while we copy in.
    std::size_t slice = slice_of(peer_ring_bytes);
    std::size_t n = std::min(length - done, space);
    for (std::size_t end = done + n; done < end;) {
      std::size_t piece = std::min(end - done, slice);
      // Bytes already placed are reported; the failure comes with the next call.
      if (status s = send_slice(data + done, piece, lend); !s)
        return done > 0 ? result<std::size_t>(done) : send_failure(s);
      ring_written += piece;
      stream_sent += piece;
      done += piece;
      bytes_sent.fetch_add(piece, std::memory_order_relaxed);
    }
    // A post that arrived while we wrote is answered now, not later, with
    // what the ring had no room for.
    done += redirect_into_post(data + done, length - done, error);
    if (!error) return done > 0 ? result<std::size_t>(done) : send_failure(error);
  }
  if (done == 0) {
    progress();
    // No send was tried: find out whether the peer is still there at all.
    if (gone()) return errc::peer_gone;
    return errc::would_block;
  }
  full_fence();  // our own_sent/data before the peer's arming word (see prepare_sleep)
  ring_if_armed(area->data_armed, last_rung_data);
  // Staged bytes reach a live peer as lent ones do, before we return, so a
  // writer that exits at once loses none; a peer that does not progress (a
  // stopped reader over shm) holds us at most this long.
  if (!staged.empty()) reap_staged(staged_wait);
  return done;
}

result<std::size_t> channel::impl::write_wait(const std::byte* data, std::size_t length, bool all,
                                              std::chrono::milliseconds timeout) {
  std::size_t done = 0;
  std::error_code failed;
  auto write_more = [&] {
    auto n = write(data + done, length - done, true);
    if (n) {
      done += *n;
      return done == length || !all ? core::turn::done : core::turn::progressed;
    }
    if (n.is(errc::would_block)) return core::turn::waiting;
    failed = n.error();
    return core::turn::done;
  };
  if (length == 0) return 0;
  // Most writes find room at once: they never wait.
  if (write_more() != core::turn::done) {
    if (status s = wait(deadline_after(timeout), sleep_reason::space, write_more); !s)
      failed = s.error();
  }
  if (failed && done == 0) return failed;
  return done;
}

status channel::impl::close_write() {
  if (!attached) return errc::not_connected;
  if (write_closed) return {};
  status error;
  (void)redirect_into_post(nullptr, 0, error);
  write_closed = true;
  if (error) error = put(offsetof(area_header, fin), stream_sent + 1);
  // On the fabric path the end must be in the peer's memory before anything
  // else tells it we are done (our TCP close, our area going away).
  if (error) error = flush();
  full_fence();
  ring_if_armed(area->data_armed, last_rung_data);
  return error;
}

std::size_t channel::impl::writable() {
  if (!attached || write_closed) return 0;
  std::uint64_t granted = load(area->credit);
  if (granted > credit) credit = granted;
  return static_cast<std::size_t>(peer_ring_bytes - (ring_written - credit));
}

// ---------------------------------------------------------------- receiving

bool channel::impl::poll() {
  progress();
  std::uint64_t now = activity();
  bool changed = now != polled_activity;
  polled_activity = now;
  return changed;
}

std::uint64_t channel::impl::activity() const {
  return load(area->produced) + load(area->credit) + load(area->fin) +
         load(area->peer_hello.state) + load(area->post_report.id);
}

std::size_t channel::impl::readable() {
  progress();
  if (post_open) return 0;  // bytes in flight belong to the post's accounting
  return static_cast<std::size_t>(load(area->produced) - stream_read);
}

bool channel::impl::at_end() {
  std::uint64_t fin = load(area->fin);
  return fin != 0 && !post_open && stream_read == fin - 1;
}

// Copies ring bytes (never more than have arrived) and releases them.
std::size_t channel::impl::copy_out(std::byte* data, std::size_t length, bool consume) {
  std::size_t n =
      std::min<std::size_t>(length, static_cast<std::size_t>(load(area->produced) - stream_read));
  if (n == 0) return 0;
  if (!consume) {
    copy_from_ring(ring_read, data, n);
    return n;
  }
  // A slice at a time, crediting as we go, so the sender refills meanwhile.
  for (std::size_t done = 0; done < n;) {
    std::size_t piece = std::min(n - done, slice_of(ring_bytes));
    copy_from_ring(ring_read, data + done, piece);
    done += piece;
    stream_read += piece;
    ring_read += piece;
    return_credit();
  }
  bytes_received.fetch_add(n, std::memory_order_relaxed);
  bytes_copied.fetch_add(n, std::memory_order_relaxed);
  return n;
}

// Credits go back lazily (a quarter ring at a time) unless the sender sleeps
// waiting for them; own_consumed always tells the truth for its sleep check.
void channel::impl::return_credit() {
  store(area->own_consumed, ring_read);
  full_fence();  // pairs with the sender's arm-then-fetch in prepare_sleep(space)
  std::uint64_t armed = load(area->space_armed);
  bool sender_waits = armed > last_rung_space;
  if (!sender_waits && ring_read - credited < ring_bytes / 4) return;
  if (!attached) return;
  if (!put(offsetof(area_header, credit), ring_read)) return;  // peer gone: reads still work
  credited = ring_read;
  if (sender_waits) ring_if_armed(area->space_armed, last_rung_space);
}

bool channel::impl::prepare_sleep(sleep_reason reason, wake_by how) {
  if (!attached) return true;
  const std::uint64_t by = how == wake_by::wait_fd && wait_fd >= 0 ? armed_by_wait_fd : 0;
  if (reason == sleep_reason::data) {
    if (readable() > 0 || load(area->fin) != 0) return false;
    if (!put(offsetof(area_header, data_armed), ++data_epoch << 1 | by)) return false;
    full_fence();
    auto sent = get(offsetof(area_header, own_sent));  // ordered behind the arming write
    if (!sent) return false;                           // gone: let the caller find out
    // Sleep only if we consumed everything the writer had sent when our arm
    // landed: bytes that arrived while we armed (the writer looked at the arm
    // before it landed, so it will not ring for them) must be read first.
    return *sent <= stream_read && load(area->fin) == 0;
  }
  if (writable() > 0) return false;
  if (!put(offsetof(area_header, space_armed), ++space_epoch << 1 | by)) return false;
  full_fence();
  auto consumed = get(offsetof(area_header, own_consumed));
  if (!consumed) return false;
  if (*consumed > credit) {
    credit = *consumed;  // the peer's own count is authoritative
    return false;
  }
  // A post that arrived while we armed: the reader rang before our arm
  // landed, or not at all; our next write takes it up instead of sleeping.
  const std::uint64_t post = load(area->open_post.id);
  return post <= handled_post || load(area->withdrawn) >= post;
}

// The peer process died, or its end was destroyed (its area withdrawn).
bool channel::impl::gone() {
  return departed.load(std::memory_order_relaxed) || (attached && !ctx.describe(peer));
}

// Waits until `step` says done: busy-polls while core's spin policy says so,
// then sleeps on the doorbell (or naps when the user gave no doorbell) with
// the arming protocol. Errors: timed_out; peer_gone, found before a sleep.
status channel::impl::wait(clock::time_point deadline, sleep_reason reason,
                           core::function_ref<core::turn()> step) {
  auto sleep = [&](std::chrono::nanoseconds most) {
    if (gone() || broken()) return false;
    if (!attached) {
      // Cannot arm a doorbell before we reach the peer's area: nap instead.
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      return true;
    }
    auto slice = std::min<std::chrono::nanoseconds>(most, std::chrono::milliseconds(100));
    if (options.await_doorbell) {
      options.await_doorbell(
          [&] { return prepare_sleep(reason, wake_by::wait_fd); },
          static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(slice).count()));
    } else if (prepare_sleep(reason, wake_by::doorbell)) {
      std::this_thread::sleep_for(
          std::min<std::chrono::nanoseconds>(slice, std::chrono::microseconds(200)));
    }
    return true;
  };
  switch (core::wait_until(step, deadline, core::sleep_step(sleep))) {
    case core::waited::done:
      return {};
    case core::waited::timed_out:
      return errc::timed_out;
    case core::waited::stopped:
      break;
  }
  return errc::peer_gone;
}

status channel::impl::post_buffer(std::byte* data, std::size_t length) {
  auto it = cached_export(data, length);
  std::string name;
  if (it != buffer_exports.end()) {
    name = it->name;
  } else {
    name = unique_name("b");
    core::export_options eo;
    eo.allowed = core::rights::write;
    eo.policy = core::import_policy::anyone();
    auto h = ctx.export_buffer(name, data, length, std::move(eo));
    if (!h) return h.error();
    if (buffer_exports.size() >= cached_buffers) {
      (void)ctx.unexport_buffer(buffer_exports.front().handle);
      buffer_exports.erase(buffer_exports.begin());
    }
    buffer_exports.push_back({data, length, name, *h});
  }
  wire::post p{};
  p.stream_position = stream_read;
  p.length = length;
  std::memcpy(p.name, name.data(), std::min(name.size(), wire::name_max));
  constexpr std::size_t at = offsetof(area_header, open_post);
  ++post_id;
  if (status s = put_record(at, &p, offsetof(wire::post, id), post_id); !s) return s;
  post_open = true;
  post_start = stream_read;
  posts.fetch_add(1, std::memory_order_relaxed);
  // A sender asleep waiting for ring space can fill the post instead.
  ring_if_armed(area->space_armed, last_rung_space);
  return {};
}

// Takes the open post back unless the sender already took it up: true when
// withdrawn, false when a report is coming within the sender's call.
// Errors: those of reaching the peer's area (it is gone).
result<bool> channel::impl::withdraw_post() {
  if (status s = put(offsetof(area_header, withdrawn), post_id); !s) return s.error();
  full_fence();
  auto seen = get(offsetof(area_header, own_post_seen));
  if (!seen) return seen.error();
  if (*seen >= post_id) return false;
  post_open = false;
  return true;
}

// The post can no longer be settled with the peer (it is gone, or its
// report broke the rules): close it and stop exporting its buffer, which
// the caller may free as soon as we return. What the post placed is not a
// stream anyone can vouch for any more; ring bytes before it are still read.
void channel::impl::abandon_post(std::byte* data, std::size_t length) {
  if (auto it = cached_export(data, length); it != buffer_exports.end()) {
    (void)ctx.unexport_buffer(it->handle);
    buffer_exports.erase(it);
  }
  post_open = false;
}

// One look at the open post: the finished receive, or nothing yet (it stays
// open). `must_leave` takes it back unless the sender already took it up.
result<std::optional<receive_result>> channel::impl::step_post(std::byte* data, std::size_t length,
                                                               bool wait_all, bool promised,
                                                               bool must_leave) {
  progress();
  const wire::report& r = area->post_report;
  if (load(r.id) == post_id) {
    std::uint64_t start = load(r.start), placed = load(r.redirected);
    auto report = detail::check_report(start, placed, post_start, length);
    if (!report) return report.error();
    // Ring bytes before `start` were written before the report; redirected
    // ones are complete once `produced` covers them.
    while (load(area->produced) < start + placed) {
      progress();
      if (gone() || broken()) return errc::peer_gone;
    }
    post_open = false;
    receive_result out;
    out.copied = copy_out(data, static_cast<std::size_t>(report->from_ring), true);
    if (placed) {
      stream_read += placed;
      out.redirected = static_cast<std::size_t>(placed);
      bytes_received.fetch_add(placed, std::memory_order_relaxed);
      bytes_redirected.fetch_add(placed, std::memory_order_relaxed);
    }
    return std::optional(out);
  }
  // Bytes in the ring (the sender wrote them before it saw the post), the
  // end of the stream or our deadline: take the post back if we still can.
  // A sender that already took it answers within its current call.
  // With wait_all, ring bytes alone are no reason: a busy sender takes the
  // post up with its next write. An idle one (all it sent has landed) never
  // will, unless the bytes are `promised` (the caller knows they are coming:
  // a sender that looks idle is between two writes, or waits for the ring
  // we stopped reading and takes the post up next). A post the ring already
  // fills cannot gain anything.
  std::uint64_t produced = load(area->produced);
  bool ring_has_bytes = produced > post_start;
  bool give_up_post = ring_has_bytes && (!wait_all || produced >= post_start + length);
  if (ring_has_bytes && !give_up_post && !promised) {
    auto sent = get(offsetof(area_header, own_sent));
    give_up_post = !sent || *sent <= produced;
  }
  bool ended = load(area->fin) != 0 && load(area->fin) - 1 == post_start;
  if (!give_up_post && !ended && !must_leave) return std::optional<receive_result>();
  auto withdrawn = withdraw_post();
  if (!withdrawn) return gone() ? errc::peer_gone : withdrawn.error();
  if (!*withdrawn) {
    if (gone()) return errc::peer_gone;
    return std::optional<receive_result>();  // the report is on its way
  }
  receive_result out;
  out.copied = copy_out(data, length, true);
  if (out.copied == 0 && must_leave && !ended) return errc::timed_out;
  return std::optional(out);
}

result<receive_result> channel::impl::complete_post(std::byte* data, std::size_t length,
                                                    bool wait_all, clock::time_point deadline) {
  result<std::optional<receive_result>> step = std::optional<receive_result>();
  auto finished = [&] {
    step = step_post(data, length, wait_all, false, clock::now() >= deadline);
    return !step || *step;
  };
  if (status s = wait(clock::time_point::max(), sleep_reason::data, finished); !s) {
    abandon_post(data, length);
    return s.error();
  }
  if (!step) {
    if (post_open) abandon_post(data, length);
    return step.error();
  }
  return **step;
}

result<receive_result> channel::impl::receive(std::byte* data, std::size_t length, bool wait_all,
                                              std::chrono::milliseconds timeout) {
  auto deadline = deadline_after(timeout);
  receive_result total;
  while (total.total() < length) {
    std::size_t want = length - total.total();
    if (readable() > 0) {
      total.copied += copy_out(data + total.total(), want, true);
      if (!wait_all) break;
      continue;
    }
    if (at_end()) break;
    if (total.total() > 0 && !wait_all) break;
    // `attached` first: it publishes caps.
    if (attached && caps.zero_copy_receive && want >= post_min) {
      if (status s = post_buffer(data + total.total(), want); !s) return s.error();
      auto got = complete_post(data + total.total(), want, wait_all, deadline);
      if (!got) {
        if (got.is(errc::timed_out) && total.total() > 0) break;
        return got.error();
      }
      total.copied += got->copied;
      total.redirected += got->redirected;
      if (got->total() == 0 && at_end()) break;
      continue;
    }
    auto news = [&] {
      return readable() > 0 || at_end() || (attached && caps.zero_copy_receive && want >= post_min);
    };
    if (status s = wait(deadline, sleep_reason::data, news); !s) {
      if (s.is(errc::timed_out) && total.total() > 0) break;
      // The peer may have ended its stream just before it went away.
      if (s.is(errc::peer_gone) && (readable() > 0 || at_end())) continue;
      if (total.total() > 0) break;
      return s.error();
    }
  }
  return total;
}

// ------------------------------------------------------------------ channel

channel::channel(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
channel::channel(channel&&) noexcept = default;
channel& channel::operator=(channel&&) noexcept = default;
channel::~channel() = default;

result<channel> channel::create(core::context& ctx, channel_options options) {
  auto p = std::make_unique<impl>(ctx, std::move(options));
  if (status s = p->create_area(); !s) return s.error();
  return channel(std::move(p));
}

std::string channel::descriptor() const {
  return impl_->area_name + "#" + std::to_string(impl_->ring_bytes) + "#" + impl_->ctx.address();
}

status channel::connect(std::string_view peer_descriptor, std::string_view user_hello,
                        std::chrono::milliseconds patience) {
  if (impl_->attached) return errc::already_exists;
  parsed_descriptor d;
  if (!detail::parse_descriptor(peer_descriptor, d) || user_hello.size() > wire::user_hello_max)
    return errc::invalid_argument;
  if (status s = impl_->attach(d, patience); !s) return s;
  return impl_->place_hello(user_hello);
}

result<std::string> channel::accept_peer(std::string_view user_hello,
                                         std::chrono::milliseconds patience) {
  if (impl_->attached) return errc::already_exists;
  if (user_hello.size() > wire::user_hello_max) return errc::invalid_argument;
  if (load(impl_->area->peer_hello.state) != 1) return errc::would_block;
  // One copy of the hello for both parts: the peer may rewrite it meanwhile.
  auto theirs = detail::copy_hello(impl_->area->peer_hello);
  if (!theirs) return theirs.error();
  parsed_descriptor d;
  if (!detail::parse_descriptor(theirs->descriptor, d)) return errc::protocol_error;
  if (status s = impl_->attach(d, patience); !s) return s.error();
  if (status s = impl_->place_hello(user_hello); !s) return s.error();
  return std::move(theirs->user);
}

result<std::string> channel::peer_hello() {
  return impl_->read_hello();
}
bool channel::connected() const noexcept {
  return impl_->attached;
}

result<std::size_t> channel::write(const void* data, std::size_t length) {
  return impl_->write(static_cast<const std::byte*>(data), length, false);
}
result<std::size_t> channel::write(const void* data, std::size_t length, bool all,
                                   std::chrono::milliseconds timeout) {
  return impl_->write_wait(static_cast<const std::byte*>(data), length, all, timeout);
}
status channel::close_write() {
  return impl_->close_write();
}
std::size_t channel::readable() {
  return impl_->readable();
}
bool channel::at_end() {
  return impl_->at_end();
}
bool channel::peer_closed() {
  return load(impl_->area->fin) != 0;
}
std::size_t channel::read(void* data, std::size_t length, bool consume) {
  impl_->progress();
  if (impl_->post_open) return 0;
  return impl_->copy_out(static_cast<std::byte*>(data), length, consume);
}
result<receive_result> channel::receive(void* data, std::size_t length, bool wait_all,
                                        std::chrono::milliseconds timeout) {
  return impl_->receive(static_cast<std::byte*>(data), length, wait_all, timeout);
}
result<bool> channel::post(void* data, std::size_t length) {
  impl& i = *impl_;
  if (i.post_open) return errc::already_exists;
  if (!i.attached || !i.caps.zero_copy_receive || length < i.post_min)
    return false;  // attached first
  i.progress();
  // Bytes already in the ring are copied when the post completes; it pays
  // when at least post_min bytes are still to come.
  const std::size_t ready = i.readable();
  if (length < ready || length - ready < i.post_min || i.at_end()) return false;
  if (status s = i.post_buffer(static_cast<std::byte*>(data), length); !s) return s.error();
  i.post_data = static_cast<std::byte*>(data);
  i.post_length = length;
  return true;
}
result<receive_result> channel::poll_post() {
  impl& i = *impl_;
  if (!i.post_open || !i.post_data) return errc::invalid_argument;
  auto step = i.step_post(i.post_data, i.post_length, true, true, false);
  if (!step) {
    if (i.post_open) i.abandon_post(i.post_data, i.post_length);
    i.post_data = nullptr;
    return step.error();
  }
  if (!*step) return errc::would_block;
  i.post_data = nullptr;
  return **step;
}
result<bool> channel::withdraw_post() {
  impl& i = *impl_;
  if (!i.post_open || !i.post_data) return errc::invalid_argument;
  auto withdrawn = i.withdraw_post();
  if (withdrawn && *withdrawn) {
    i.post_data = nullptr;
    return true;
  }
  // Taken up, or the peer cannot be reached to ask: cut the buffer off.
  i.abandon_post(i.post_data, i.post_length);
  i.post_data = nullptr;
  return false;
}
void channel::stop_writing() noexcept {
  impl_->writes_stopped.store(true);
}
bool channel::poll() {
  return impl_->poll();
}
bool channel::prepare_sleep(sleep_reason reason, wake_by how) {
  return impl_->prepare_sleep(reason, how);
}

int channel::wait_fd() const {
  return impl_->wait_fd;
}

void channel::clear_wait_fd() {
  std::uint64_t count = 0;
  if (impl_->wait_fd >= 0) (void)!::read(impl_->wait_fd, &count, sizeof count);
}
std::size_t channel::writable() {
  return impl_->writable();
}
std::uint64_t channel::activity() {
  return impl_->activity();
}
bool channel::peer_gone() {
  return impl_->gone();
}

channel_counters channel::stats() const {
  const impl& i = *impl_;
  return {i.bytes_sent.load(),       i.bytes_received.load(), i.bytes_copied.load(),
          i.bytes_redirected.load(), i.posts.load(),          i.doorbells.load()};
}

channel_capabilities channel::capabilities() const {
  return impl_->attached ? impl_->caps : channel_capabilities{};
}

std::string channel::path() const {
  return impl_->attached ? impl_->path_name : std::string();
}

}  // namespace vmmc::redirect
