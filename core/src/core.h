// core.h: vmmc::core's private header: the model's entries and context::impl.
//
// Objects and the file that implements each:
//   peer_address, blobs ............ address.cc
//   connection ..................... connection.cc   (framed control sockets)
//   segment, notify_ring, wake_page  segment.cc      (memfd-backed shared memory)
//   fabric_endpoint, op ............ fabric.h, fabric.cc (one libfabric provider)
//   export_table, segment_table .... exports.h, exports.cc
//   peer_table ..................... imports.h, imports.cc
//   link_table ..................... links.h, links.cc (importers and grants)
//   id_table (imports, requests) ... id_table.h
//   notification_queue ............. notifications.h, notify.cc
//   context::impl .................. context.cc (lifecycle), export.cc,
//                                    import.cc, rma.cc, notify.cc,
//                                    control.cc (the control thread)
#pragma once

#include <poll.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "address.h"
#include "control_thread.h"
#include "exports.h"
#include "fabric.h"
#include "fabric_side.h"
#include "id_table.h"
#include "imports.h"
#include "links.h"
#include "notifications.h"
#include "unique_fd.h"
#include "vmmc/core/context.h"
#include "vmmc/core/reg_cache.h"
#include "vmmc/core/settings.h"
#include "wire.h"

namespace vmmc::core::detail {

// ---- logging (VMMC_CORE_LOG_LEVEL) ----------------------------------------
void log(int level, const char* format, ...) __attribute__((format(printf, 2, 3)));
#define VMMC_ERROR(...) ::vmmc::core::detail::log(1, __VA_ARGS__)
#define VMMC_WARN(...) ::vmmc::core::detail::log(2, __VA_ARGS__)
#define VMMC_DEBUG(...) ::vmmc::core::detail::log(3, __VA_ARGS__)

using clock = std::chrono::steady_clock;
inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now().time_since_epoch())
      .count();
}

// ---- identity across TCP (identity.cc) -------------------------------------
using digest = std::array<std::uint8_t, 32>;
digest hmac_sha256(std::span<const std::uint8_t> key, std::span<const std::uint8_t> message);
bool same_digest(const digest& a, const digest& b);  // in constant time
// This user's key (settings::user_key), made on first use; nullopt when
// there is none we can trust (not ours alone) or make.
std::optional<std::vector<std::uint8_t>> user_key();

// The proofs a TCP hello's sender gives for the exporter's challenge: of
// being the context (its secret) and of being the user (the user key).
digest context_proof(std::span<const std::uint8_t> secret, std::span<const std::uint8_t> challenge,
                     std::uint64_t exporter_nonce);
digest user_proof(std::span<const std::uint8_t> key, std::span<const std::uint8_t> challenge,
                  std::uint64_t exporter_nonce, std::uint32_t uid);

// ---- control sockets (connection.cc) --------------------------------------
struct frame {
  wire::frame_type type;
  std::vector<std::uint8_t> body;
  std::vector<unique_fd> fds;

  template <class T>
  bool body_as(T& out, std::size_t at = 0) const {
    if (body.size() < at + sizeof(T)) return false;
    std::memcpy(&out, body.data() + at, sizeof(T));
    return true;
  }
};

// A framed, non-blocking control connection. Writes are whole frames under a
// mutex (any thread); reads are done by one thread at a time (the control
// thread, or the importing thread during the hello exchange).
class connection {
 public:
  explicit connection(unique_fd fd, bool is_unix);
  int fd() const noexcept { return fd_.get(); }
  bool is_unix() const noexcept { return is_unix_; }

  // Sends one frame, never waiting: what the socket does not take now waits
  // in an output queue (with duplicates of `fds` if none went) for flush(). A peer that
  // lets more than max_backlog bytes pile up is as good as gone: one peer
  // that stops reading never stalls the thread serving the others.
  // Errors: peer_gone, resource_exhausted (no descriptor to duplicate).
  status write_frame(wire::frame_type type, const void* body, std::size_t length,
                     std::span<const int> fds = {});
  // Sends what waits, as far as the socket takes it. Errors: peer_gone.
  status flush();
  // Something waits for socket space: poll for POLLOUT, then flush().
  bool backlogged() const noexcept { return backlogged_.load(std::memory_order_acquire); }
  // Called by a writer whose frame had to wait (under the write lock: it
  // must only wake the thread that flushes).
  std::function<void()> on_backlog;
  static constexpr std::size_t max_backlog = 1 << 20;
  // Reads what is available and appends whole frames to `out`. Errors:
  // peer_gone (EOF/reset), protocol_error (garbage). would_block never.
  status read_available(std::vector<frame>& out);
  // The control thread's frames of this connection, reused each round. Kept
  // here, not in its locals: a fork() child (which has no such thread and
  // leaves the inherited context alone) still reaches them, so LeakSanitizer
  // does not report frames the parent was handling at fork as leaked.
  std::vector<frame> control_frames;
  // Blocks until one frame arrives or the deadline passes.
  result<frame> read_one(clock::time_point deadline);

  // True when the peer closed or reset the connection within `grace` (no
  // read needed): the exact sign that a process on the other end is gone.
  bool closed_by_peer(std::chrono::milliseconds grace = std::chrono::milliseconds(0)) const;

  // TCP: the kernel ends the connection when bytes we sent stay
  // unacknowledged for `timeout` (TCP_USER_TIMEOUT); 0 leaves its default.
  // Nothing for a Unix connection (its end is exact), so callers need not ask.
  void give_up_unacknowledged_after(std::chrono::milliseconds timeout);

  std::int64_t last_sent_ns() const { return last_sent_ns_.load(std::memory_order_relaxed); }

 private:
  status parse(std::vector<frame>& out);

  status send_queued_locked();
  // One sendmsg of bytes[from..], with `fds` when from is 0; never blocks.
  ssize_t send_some(const std::vector<std::uint8_t>& bytes, std::size_t from,
                    std::span<const int> fds);

  unique_fd fd_;
  bool is_unix_;
  std::mutex write_mutex_;
  struct pending_frame {
    std::vector<std::uint8_t> bytes;
    std::size_t sent = 0;
    std::vector<unique_fd> fds;  // travel with the first byte
  };
  std::deque<pending_frame> output_;  // write_mutex_
  std::size_t output_bytes_ = 0;
  std::atomic<bool> backlogged_{false};
  std::vector<std::uint8_t> input_;
  std::deque<unique_fd> input_fds_;
  std::atomic<std::int64_t> last_sent_ns_{0};
};

result<unique_fd> listen_unix(const std::string& abstract_name);
result<unique_fd> listen_tcp(const std::string& ip, std::string& bound_ip_port);
result<unique_fd> connect_unix(const std::string& abstract_name, clock::time_point deadline);
result<unique_fd> connect_tcp(const std::string& ip_port, clock::time_point deadline);

// ---- shared memory (segment.cc) -------------------------------------------
// A memfd mapped into this process. Exporters allocate them; same-host
// importers map them. memfds have no name in any filesystem, so nothing is
// left behind by a process that is killed. Every memfd we create is sealed
// against shrinking and growing before anyone else can hold it: no holder can
// make another's access fault with SIGBUS by truncating it.
struct segment {
  std::mutex mutex;  // guards fd and windows
  unique_fd fd;      // backs every page not lent to a window
  std::byte* base = nullptr;
  std::size_t size = 0;  // whole pages
  std::size_t used = 0;  // what was asked for; the rest of the last page is nobody's
  std::vector<std::pair<std::uint64_t, std::uint64_t>> windows;  // open ones: offset, length
  ~segment();
  static result<std::shared_ptr<segment>> create(std::size_t bytes, const char* name);
  // Seals the memfd before it is handed out: no one can add or change seals;
  // with read_only, no one can map it writable or write() it from then on
  // (our own mapping, made before, stays writable).
  status seal_for_peers(bool read_only);
};

// The pages of one mapped export, and only those: what its importers get.
// A window that covers its whole segment lends the segment's memfd; any other
// gets a memfd of its own, and its pages move onto it (content kept) while it
// is open. Closing takes the pages back: they move onto a memfd no importer
// holds, so an importer's mapping (and any mapping it made of the descriptor
// it was lent) keeps only the old pages, never reaching our memory again.
// Moving copies the window's data pages: a store by another thread of ours
// into the window while it opens or closes may be lost. When the segment's
// mappable_buffer is gone, closing moves nothing: the pages go with it.
class export_window {
 public:
  // nullptr when the range cannot be handed out alone: not page-aligned,
  // ending inside a page that holds other bytes, or overlapping an open window.
  static std::unique_ptr<export_window> open(std::shared_ptr<segment> seg, std::uint64_t offset,
                                             std::uint64_t length);
  ~export_window() { close(); }
  // A descriptor for one importer, mapping offset 0 to the window's first
  // byte. The first lend seals the memfd (read_only: never writable).
  // Errors: unknown_export once closed, resource_exhausted.
  result<unique_fd> lend(bool read_only);
  void close();

 private:
  std::shared_ptr<segment> seg_;
  std::uint64_t offset_ = 0, length_ = 0;  // page-aligned, inside seg_
  unique_fd own_;                          // the window's memfd, unless it is the whole segment
  bool lent_ = false, closed_ = false;     // under seg_->mutex
};

// Unlinks shared-memory files that libfabric's shm provider left behind for
// processes that no longer exist. Returns how many were removed.
std::size_t remove_stale_fabric_shm_files(const char* directory = "/dev/shm");

// What one sender has sent (see context::impl::tallies).
struct sender_tally {
  std::atomic<std::uint64_t> sends{0}, bytes_sent{0};
  void add(std::size_t pieces, std::size_t bytes) {  // by the sender's thread only
    sends.store(sends.load(std::memory_order_relaxed) + pieces, std::memory_order_relaxed);
    bytes_sent.store(bytes_sent.load(std::memory_order_relaxed) + bytes, std::memory_order_relaxed);
  }
};

// A mapping of (part of) another process's memfd. Only a memfd sealed against
// shrinking is mapped: a peer cannot pull pages from under our copies.
struct mapping {
  std::byte* base = nullptr;  // page-aligned start of the mapping
  std::size_t size = 0;
  std::size_t delta = 0;  // where the exported bytes start inside the mapping
  mapping() = default;
  mapping(const mapping&) = delete;
  mapping& operator=(const mapping&) = delete;
  ~mapping();
  static result<std::unique_ptr<mapping>> map(int fd, std::uint64_t offset, std::uint64_t length,
                                              bool writable);
  std::byte* data() const { return base + delta; }
  // Swaps the peer's pages for private anonymous ones, in place: a copy still
  // running through a sender lands there, never in memory the peer reuses.
  void retire();
};

// Notification records travelling from one importer to one exporter on the
// mapped path: single producer (importer, under its lock), single consumer.
struct notify_record {
  std::uint32_t export_id;
  std::uint32_t reserved;
  std::uint64_t offset;
  std::uint64_t length;
  std::uint64_t value;
};
struct notify_ring {
  static constexpr std::uint64_t capacity = 1024;
  alignas(64) std::atomic<std::uint64_t> head;  // next record to consume
  alignas(64) std::atomic<std::uint64_t> tail;  // next free slot
  alignas(64) notify_record records[capacity];
};
// Moves every published record to `out` and frees their slots. Returns false,
// consuming nothing, when the indices are impossible (a corrupt producer).
// Single consumer: callers hold the link table's lock.
bool drain_ring(notify_ring& ring, std::vector<notification>& out);

// One page per exporter, mapped by its same-host importers: tells senders
// whether the exporter sleeps on its eventfd and so needs a write() to wake.
struct wake_page {
  alignas(64) std::atomic<std::uint32_t> sleeping;
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);

// ---- the model's objects ----------------------------------------------------
struct export_entry {
  std::uint32_t id = 0;
  std::string name;
  std::byte* base = nullptr;
  std::size_t length = 0;
  rights allowed = rights::none;
  import_policy policy;
  notification_handler on_notify;
  std::unique_ptr<export_window> window;  // set when the mapped path can serve it
  int wake_fd = -1;                       // borrowed (export_options::wake_fd)
  std::vector<fabric_mr> mrs;             // one per open endpoint
  std::atomic<bool> live{true};
};

// An exporter we import from: our control connection to it.
struct remote_peer {
  peer_address address;
  std::string blob;
  std::unique_ptr<connection> conn;
  std::atomic<bool> alive{true};
  bool same_host = false;

  // mapped path: the exporter's wake page and eventfd, our ring to it
  std::unique_ptr<mapping> wake_map;
  unique_fd wake_eventfd;
  std::unique_ptr<mapping> ring_map;
  std::mutex ring_mutex;  // producers of this process

  // Import replies waiting for their caller, by request id. An import is
  // `installing` from its reply's arrival until it is in the imports table;
  // a revoke that overtakes it there marks it `overtaken`, and the import
  // fails instead of going live on withdrawn memory. A reply whose caller
  // gave up (`abandoned`) is dropped and its import given back. A reply to
  // a request that is neither `awaited` nor abandoned is a protocol error:
  // replies never pile up beyond the requests we made.
  std::mutex reply_mutex;
  std::condition_variable reply_cv;
  std::set<std::uint64_t> awaited;
  std::map<std::uint64_t, frame> replies;
  std::map<std::uint64_t, std::uint32_t> installing;  // request id -> export id
  std::set<std::uint64_t> overtaken;
  std::set<std::uint64_t> abandoned;

  // fabric addresses of this peer, per endpoint
  std::mutex av_mutex;
  std::map<fabric_endpoint*, fi_addr_t> fi_addresses;

  // fabric path: our notification ring in the exporter's memory. Records are
  // reserved and posted under record_mutex, so they land in sequence order.
  std::mutex record_mutex;
  bool ring_known = false;
  std::uint64_t ring_address = 0, ring_key = 0;
  std::uint32_t link_id = 0;
  std::uint64_t ring_tail = 0;         // records written
  std::uint64_t ring_head_cached = 0;  // records the exporter had consumed, last we looked

  wake_page* wake() const { return reinterpret_cast<wake_page*>(wake_map->data()); }
  notify_ring* ring() const { return reinterpret_cast<notify_ring*>(ring_map->data()); }
};

struct import_entry {
  std::uint64_t id = 0;
  std::shared_ptr<remote_peer> peer;
  std::uint32_t export_id = 0;
  std::uint64_t length = 0;
  rights allowed = rights::none;
  // mapped path
  std::unique_ptr<mapping> map;
  unique_fd wake_fd;  // the exporter's eventfd, when lent (context::wake)
  // fabric path
  fabric_endpoint* endpoint = nullptr;
  fi_addr_t fi_address = 0;
  std::uint64_t remote_address = 0;
  std::uint64_t key = 0;

  // Data operations hold it shared; revocation takes it exclusively, so once
  // revoked no mapped copy is running and none will start.
  std::shared_mutex state_mutex;
  std::atomic<bool> revoked{false};   // set under state_mutex; senders read it without
  std::atomic<bool> released{false};  // unimported
  // context::give_up_when: set before the import is used, then only read.
  std::function<bool()> broken;
  std::atomic<bool> given_up{false};
  bool reachable() {
    if (given_up.load(std::memory_order_relaxed)) return false;
    if (!broken || !broken()) return true;
    given_up.store(true, std::memory_order_relaxed);
    return false;
  }
  bool ack_owed = false;  // revoke ack to send once in_flight drains
  std::atomic<int> in_flight{0};
};

// An importer connected to us (we export).
struct importer_link {
  std::unique_ptr<connection> conn;
  std::int64_t accepted_ns = 0;  // a link without a hello by hello_timeout is closed
  peer_address address;          // uid: as the kernel or the user key vouches, else unverified_uid
  std::string blob;
  bool hello_done = false;
  // A TCP hello waits for the answer to its challenge: what the importer must
  // prove, and the proof of its context (checked by named_peers exports).
  bool awaiting_proof = false;
  std::uint32_t claimed_uid = 0;
  std::array<std::uint8_t, 16> challenge{};
  digest context_proof{};
  std::atomic<bool> alive{true};
  std::shared_ptr<segment> ring_segment;  // mapped path notifications from it
  std::map<std::uint32_t, int> imported;  // export id -> import count (link table's lock)
  // Of those, the ones imported over the fabric at least once: a revoke
  // waits for their acknowledgement (writes of theirs may be in flight).
  // Mapped imports need none: unexport takes the pages from under them.
  std::set<std::uint32_t> imported_over_fabric;
  // Exports this importer was ever granted (link table's lock; an id leaves with
  // its export): only their records are taken from its rings. Not only the
  // live imports: records published before a release may be read after it.
  std::set<std::uint32_t> granted;
  bool may_notify(std::uint32_t export_id) const { return granted.count(export_id) > 0; }
  // fabric path: the ring this importer writes records into
  std::uint32_t id = 0;
  std::shared_ptr<segment> fabric_ring_segment;
  std::vector<fabric_mr> fabric_ring_mrs;
  std::uint64_t next_record = 0;  // sequence number expected next (endpoint lock)
  wire::fabric_ring* fabric_ring() const {
    return fabric_ring_segment ? reinterpret_cast<wire::fabric_ring*>(fabric_ring_segment->base)
                               : nullptr;
  }
  notify_ring* ring() const {
    return ring_segment ? reinterpret_cast<notify_ring*>(ring_segment->base) : nullptr;
  }
};

// The uid of a TCP importer that did not prove to be our user: no one's.
inline constexpr std::uint32_t unverified_uid = 0xFFFFFFFF;
// Whether `listed` (an address a named_peers policy lists) names the
// importer at the other end of `link`: the same context, proven (same host:
// the kernel checked its pid; TCP: its proof with the listed secret).
bool names_importer(const std::string& listed, const importer_link& link, std::uint64_t our_nonce);

}  // namespace vmmc::core::detail

namespace vmmc::core {

class context::impl {
 public:
  using peer_ptr = std::shared_ptr<detail::remote_peer>;
  using import_ptr = std::shared_ptr<detail::import_entry>;
  using export_ptr = std::shared_ptr<detail::export_entry>;
  using link_ptr = std::shared_ptr<detail::importer_link>;

  ~impl();
  status start(const context_options& options);  // context.cc

  // export.cc
  result<export_handle> export_buffer(std::string_view name, void* base, std::size_t length,
                                      export_options options);
  status unexport_buffer(export_handle handle);
  void handle_import_request(const link_ptr& link, const detail::frame& f);
  void handle_unimport(const link_ptr& link, const detail::frame& f);
  result<detail::fabric_mr> fabric_ring_for(const link_ptr& link,
                                            detail::fabric_endpoint& endpoint);
  export_ptr find_export(std::uint32_t id) const { return exports.find(id); }

  // import.cc
  result<import_handle> import_buffer(std::string_view peer_address, std::string_view name,
                                      std::chrono::milliseconds timeout);
  status unimport_buffer(import_handle handle);
  result<peer_ptr> connect_peer(std::string_view blob, detail::clock::time_point deadline);
  import_ptr find_import(import_handle handle) const { return imports.find(handle.id); }
  void handle_revoke(const peer_ptr& peer, const detail::frame& f);
  void send_revoke_ack(detail::import_entry& imp);
  void await_writes_landed(detail::import_entry& imp);
  void await_in_flight(detail::import_entry& imp);  // this import's fabric operations
  // `why` goes to the debug log.
  void peer_died(const peer_ptr& peer, const char* why);
  // Maps a failed fabric operation to peer_gone when its exporter is gone.
  std::error_code classify_failure(const detail::import_entry& imp, std::error_code error);

  // rma.cc. start_transfer returns a null op when the transfer finished
  // during the call (mapped path, injected writes).
  result<std::shared_ptr<detail::op>> start_transfer(import_handle handle, std::uint64_t offset,
                                                     void* buffer, std::size_t length, bool is_send,
                                                     send_options options, void* user_context);
  // Checks every piece; then, on the mapped path, copies them all (true).
  // False: the checks passed and the caller sends piece by piece.
  result<bool> send_gathered(import_handle handle, std::span<const send_piece> pieces,
                             send_options options);
  status wait_op(detail::op& o, detail::clock::time_point deadline);
  status post_record(const import_ptr& imp, const std::shared_ptr<detail::op>& o,
                     const detail::wire::record_header& h, const void* payload);
  result<request> remember(std::shared_ptr<detail::op> o, void* user_context);
  result<completion> test(request r);
  result<completion> wait(request r, std::chrono::milliseconds timeout);
  void progress_all();

  // notify.cc
  void on_remote_record(std::uint64_t immediate);
  void apply_record(const detail::wire::record_header& h, const std::byte* payload,
                    std::size_t payload_length);
  std::size_t poll_notifications();
  result<std::size_t> wait_notifications(std::chrono::milliseconds timeout);
  bool prepare_wait();
  bool notification_pending();

  // control.cc
  void control_loop();  // each round of the control thread
  void handle_link_frames(const link_ptr& link);
  void handle_peer_frames(const peer_ptr& peer);
  void link_died(const link_ptr& link);
  void send_owed_acks();
  void accept_links(int listener, bool is_unix);
  std::int64_t accept_resumes_ns = 0;  // control thread only

  // state ------------------------------------------------------------------
  bool mapped_enabled = true;
  bool use_user_key = true;               // context_options::user_key
  std::chrono::milliseconds liveness{0};  // VMMC_CORE_LIVENESS_MS

  // Our address, and the fabric remote peers reach us by (fabric_side.h).
  detail::fabric_side fabric;
  const detail::peer_address& self() const noexcept { return fabric.identity(); }
  // Opens the fabric on first need, and has the control thread watch its
  // listener.
  status open_fabric(std::string_view local_address = {});  // context.cc

  detail::unique_fd unix_listener;

  // The model's tables, each with its own lock (exports.h, imports.h,
  // links.h, id_table.h, notifications.h). Nested only as: an endpoint's
  // lock (progress landing a record), then the links' or the exports'; the
  // links', then a connection's (a frame written under it).
  detail::export_table exports;
  detail::segment_table segments;  // context::allocate's
  detail::import_table imports;
  detail::peer_table peers;  // exporters we are connected to, by address blob
  std::atomic<std::uint64_t> next_import_request{1};  // ids of import requests on the wire
  detail::link_table links;                           // importers connected to us, and their grants
  detail::id_table<detail::op> requests;              // asynchronous, until reported
  detail::notification_queue notifications;

  detail::control_thread control;
  // The control thread's working sets, reused each round. Members, not the
  // thread's locals: a fork() child, which never destroys the parent's
  // context, then still reaches them (no leak reported in sanitizer builds).
  struct control_round {
    std::vector<pollfd> fds;
    std::vector<link_ptr> links;
    std::vector<peer_ptr> peers;
  } control_round_state;
  std::atomic<std::int64_t> last_app_poll_ns{0};
  std::atomic<bool> control_watching_fabric{false};
  std::atomic<int> acks_owed{0};  // imports that owe their exporter a revoke ack

  struct atomic_counters {
    std::atomic<std::uint64_t> sends{0}, fetches{0}, notifications_sent{0},
        notifications_received{0}, bytes_sent{0}, bytes_fetched{0};
  } count;

  // The senders' counts (class sender), summed by stats(). A sender's tally
  // has one writer, which adds with plain stores: a locked add on its hot
  // path would wait for the store buffer, and so for any earlier write into
  // another process's memory. A tally whose sender is gone is folded into
  // `count` when the next sender is bound.
  std::mutex tallies_mutex;
  std::vector<std::shared_ptr<detail::sender_tally>> tallies;
  std::shared_ptr<detail::sender_tally> new_tally();
};

}  // namespace vmmc::core
