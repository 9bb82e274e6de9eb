// vmmc/core/context.h: one process's VMMC endpoint.
//
// The model (see DESIGN.md): a process *exports* a region of its memory with
// rights and an importer restriction; another process *imports* it by
// (exporter address, export name) and then *sends* bytes into it (deliberate
// update) or *fetches* bytes from it. There is no receive call: data simply
// appears in the exporter's memory. A send may carry a *notification*, which
// runs the exporter's handler for that export after the data is in place.
//
// Paths are invisible to the model: a same-host importer of memory allocated
// with `context::allocate` maps it and copies at user level; every other case
// goes through libfabric RMA (shm on this host, tcp/verbs/... across hosts).
//
// Protection: an export is reachable only by importers its policy admits,
// with the rights it grants, until unexport_buffer returns. What enforces it:
//  - Fabric path: each export is registered with its own random 64-bit key
//    and only the granted remote access; the key dies at unexport. Buffers
//    we send or fetch from are registered for local access only.
//  - Mapped path: an importer is lent a memfd holding only the export's
//    pages (the window: page-aligned; a range that shares a page with other
//    bytes, or overlaps another mapped export, goes over fabric instead).
//    A read grant is sealed so no one can map it writable; sizes are sealed,
//    so no holder can truncate it. Unexport moves our pages off that memfd,
//    so an importer that ignores the revoke writes only into the old pages.
//    The MMU cannot map write-only: a write grant on this path also lets
//    the importer read the window (export_options::mapped = false if that
//    matters).
//  - Notification records are accepted only for exports the sending link
//    imported and still holds.
//
// Thread safety: every member function may be called from any thread.
// Notification handlers run in the thread that calls poll_notifications() or
// wait_notifications(), never concurrently with each other.
#pragma once

// Internals, declared outside the API's visibility region below: hidden in
// the library's build, so no instance of a std template over them is exported.
namespace vmmc::core::detail {
struct import_entry;
struct sender_tally;
}  // namespace vmmc::core::detail

#pragma GCC visibility push(default)  // the library's API (see cmake/layer.cmake)

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "vmmc/core/error.h"

namespace vmmc::core {

enum class rights : std::uint8_t { none = 0, write = 1, read = 2, read_write = 3 };
constexpr rights operator|(rights a, rights b) {
  return static_cast<rights>(static_cast<unsigned>(a) | static_cast<unsigned>(b));
}
constexpr bool has_right(rights granted, rights wanted) {
  return (static_cast<unsigned>(granted) & static_cast<unsigned>(wanted)) ==
         static_cast<unsigned>(wanted);
}

// Who may import an export. Checked by the exporter's library when the import
// request arrives; a refused import returns errc::permission_denied.
struct import_policy {
  enum class kind : std::uint8_t {
    // Any process whose uid equals the exporter's (the default). Same host:
    // the kernel's word (SO_PEERCRED). Other hosts, where no kernel vouches:
    // a peer that proves it holds this user's key (VMMC_CORE_USER_KEY,
    // context_options::user_key); hosts that share the home directory share
    // it, others must be given a copy.
    same_user,
    // Only the contexts whose address (context::address(), as they gave it)
    // is listed in `peers`. Same host: the kernel checks the pid; other
    // hosts: the peer proves the secret its listed address carries.
    named_peers,
    anyone,  // no restriction
  };
  kind who = kind::same_user;
  std::vector<std::string> peers;

  static import_policy same_user() { return {}; }
  static import_policy anyone() { return {kind::anyone, {}}; }
  static import_policy only(std::vector<std::string> addresses) {
    return {kind::named_peers, std::move(addresses)};
  }
};

struct notification {
  std::uint32_t export_id;  // the receiving export's handle value
  std::uint64_t offset;     // where the data of the carrying send starts in the export
  std::uint64_t length;     // how many bytes that send wrote
  std::uint64_t value;      // the sender's user value
};
using notification_handler = std::function<void(const notification&)>;

struct export_options {
  rights allowed = rights::write;
  import_policy policy = import_policy::same_user();
  notification_handler on_notify;  // may be empty: notifications are then counted and dropped
  // Let same-host importers map the export (see "Protection" below). false
  // keeps every importer on the fabric path, where a write grant cannot read.
  bool mapped = true;
  // An eventfd this export's owner sleeps on, or -1. Importers that map the
  // export are lent it, and context::wake() writes it: a waiter that sleeps
  // in poll/epoll beside its other descriptors is woken without the kernel's
  // network stack. Borrowed: it must stay open until unexport_buffer returns.
  int wake_fd = -1;
};

// Handles are small values; a released handle is never reissued with the same
// value during the context's lifetime, so stale use returns errc::unknown_handle.
struct export_handle {
  std::uint32_t id = 0;
  friend bool operator==(export_handle, export_handle) = default;
};
struct import_handle {
  std::uint64_t id = 0;
  friend bool operator==(import_handle, import_handle) = default;
};
struct request {
  std::uint64_t id = 0;
  friend bool operator==(request, request) = default;
};

struct import_info {
  std::uint64_t length;
  rights allowed;
  // This process reaches the memory with loads and stores (an exporter on
  // this host, VMMC_CORE_MAPPED): transfers need no provider and no progress
  // calls. Otherwise they go through a fabric provider, which moves them
  // only while some thread of this process calls in (manual progress).
  bool mapped = false;
  // Sends to it complete only when the exporter's process runs (libfabric
  // shm pulls large transfers from the receiving side): a sender that must
  // never wait for the peer (a non-blocking stream write) copies its bytes
  // first instead of lending its buffer until completion.
  bool completion_needs_peer = false;
  // The exporter lent its wake eventfd (export_options::wake_fd): wake()
  // reaches it.
  bool wakeable = false;
};

struct send_options {
  bool notify = false;      // run the exporter's handler after the data is in place
  std::uint64_t value = 0;  // user value carried by the notification
  // send() returns only once this send and every earlier one to the same
  // peer have left this process (libfabric's FI_TRANSMIT_COMPLETE): they then
  // reach the exporter even if this process exits or is killed right after,
  // as bytes written to a kernel socket do. Costs a completion wait on the
  // fabric path; the mapped path's copy is always complete.
  bool transmit_complete = false;
};

// One piece of a gathered send: `length` bytes from `source` to `offset`.
struct send_piece {
  std::uint64_t offset;
  const void* source;
  std::size_t length;
};

// What an asynchronous operation reports when it finishes.
struct completion {
  void* user_context;     // as passed to send_async / fetch_async
  std::error_code error;  // empty on success
};

// A block of memory that same-host importers can map. Exporting a range of it
// lets those importers copy straight into it at user level. Move-only; the
// memory is unmapped when the last owner (this handle or a live export of it)
// goes away.
class mappable_buffer {
 public:
  mappable_buffer() = default;
  mappable_buffer(mappable_buffer&&) noexcept;
  mappable_buffer& operator=(mappable_buffer&&) noexcept;
  ~mappable_buffer();

  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }

 private:
  friend class context;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  std::shared_ptr<void> segment_;
};

struct context_options {
  // libfabric providers to open, in order of preference for remote peers;
  // empty means the setting VMMC_CORE_PROVIDERS (default "shm,tcp").
  std::vector<std::string> providers;
  // Use the mapped (user-level copy) path for same-host peers; unset means the
  // setting VMMC_CORE_MAPPED (default on).
  int mapped_path = -1;
  // Open the providers only when first needed (open_remote_paths(), an
  // import that cannot be mapped, or with the mapped path off the first
  // export or address()) instead of at creation: libfabric's start costs
  // ~0.3 s that a process meeting only same-host peers never needs to pay.
  bool fabric_on_demand = false;
  // Prove and check "same user" to and from peers on other hosts with the
  // user key (VMMC_CORE_USER_KEY, default ~/.vmmc/user-key, made on first
  // use). false: no key is read or made, and no TCP importer counts as the
  // same user (for layers that never export to the same user only).
  bool user_key = true;
  // Where peers on other hosts reach the providers opened at creation (see
  // context::open_remote_paths's local_address); empty: not given.
  std::string local_address;
};

struct counters {
  std::uint64_t sends, fetches, notifications_sent, notifications_received;
  std::uint64_t bytes_sent, bytes_fetched;
  std::uint64_t utlb_lookups, utlb_hits, utlb_misses, utlb_registrations, utlb_evictions;
  std::uint64_t utlb_bytes_registered;
};

class context;

// A send path bound to one import, for code that sends to it in a loop: the
// handle is looked up once, and on the mapped path a send takes no lock and
// no locked instruction, not even for its counts (one waits for earlier
// copies into another process's memory to arrive). Same checks and errors
// as context::send; once the import is released or revoked every send fails
// with unknown_handle. Use from one thread at a time, and not after the
// context is destroyed.
class sender {
 public:
  sender() = default;
  status send(std::uint64_t offset, const void* source, std::size_t length,
              send_options options = {});
  status send(std::span<const send_piece> pieces, send_options options = {});

 private:
  friend class context;
  context* owner_ = nullptr;
  import_handle handle_{};
  std::shared_ptr<detail::import_entry> import_;
  std::shared_ptr<detail::sender_tally> tally_;
};

class context {
 public:
  // Opens the configured providers and starts the control listener.
  // Errors: unreachable (no provider could be opened), system_error.
  static result<context> create(const context_options& options = {});

  // The process's one context, which the layers above share (sockets, vRPC
  // and NX in one process run one control thread and open each provider
  // once). Made by the first call: providers opened on demand (fabric_on_demand:
  // open_remote_paths, or a peer the mapped path cannot serve), no user key
  // (the layers export to anyone under unguessable names, or to listed
  // peers). It ends when its last holder lets go, or with the process; a
  // later call makes another. A fork() child gets its own on its first call:
  // the parent's, whose threads did not come along, is for the child's
  // holders to leave alone, never to destroy.
  // Errors: as create.
  static result<std::shared_ptr<context>> shared();

  context(context&&) noexcept;
  context& operator=(context&&) noexcept;
  ~context();  // unexports everything; importers see peer_gone.

  // Printable, opaque address of this process (ASCII, no whitespace). Upper
  // layers exchange it in-band; import_buffer takes it back. It grows once,
  // when the fabric opens: hand a peer on another host the address read after
  // open_remote_paths(). It carries this context's secret, with which it
  // proves to an exporter on another host that lists it (import_policy::only)
  // that its hello is its own: hand it only to peers you mean to tell.
  std::string address() const;

  // Checks an address a peer handed us in-band over a kernel connection (a
  // TCP socket) whose other end is `other_end` (a sockaddr, as getpeername
  // fills it): it must point back at that end, not at a place of the peer's
  // choosing. An address of this host is accepted only from a local end;
  // one of another host only if its control and fabric addresses are at
  // that end's IP. Errors: permission_denied, invalid_argument (malformed,
  // or not an IPv4/IPv6 end).
  status check_address_from(std::string_view peer_address, const void* other_end,
                            std::size_t length) const;

  // Opens the fabric providers and the control listener peers on other hosts
  // reach us by, if not open yet (see context_options::fabric_on_demand).
  // They listen on VMMC_CORE_TCP_ADDRESS if set; else on `local_address`,
  // an IPv4 address of ours peers on other hosts reach (the local end of
  // the connection that carries an upgrade; address_other_hosts_reach()),
  // when the call that opens them gives one; else on 127.0.0.1, where no
  // other host reaches them. Fixed from then on: a peer that reached us at
  // another address of ours is told this one (check_address_from may then
  // refuse it).
  // Errors: unreachable (no provider could be opened).
  status open_remote_paths(std::string_view local_address = {});

  // Memory that same-host importers may map. Errors: invalid_argument (0 bytes),
  // resource_exhausted.
  result<mappable_buffer> allocate(std::size_t bytes);

  // --- exporting ---------------------------------------------------------
  // Offers [base, base+length) under `name`. Errors: invalid_argument (null,
  // zero length, empty name or name over 255 bytes), already_exists,
  // fabric_error (registration refused).
  result<export_handle> export_buffer(std::string_view name, void* base, std::size_t length,
                                      export_options options = {});
  // Withdraws the export; later operations of its importers fail with
  // unknown_handle or peer_gone. A mapped export's pages are moved off the
  // memfd its importers were lent (a copy of the pages that hold data),
  // unless its mappable_buffer was released first: done with the memory,
  // release the buffer, then unexport. Errors: unknown_handle.
  status unexport_buffer(export_handle handle);

  // --- importing ---------------------------------------------------------
  // Asks the exporter at `peer_address` for `name`. Errors: invalid_argument
  // (malformed address), unknown_export, permission_denied, peer_gone,
  // unreachable, timed_out, protocol_error.
  result<import_handle> import_buffer(std::string_view peer_address, std::string_view name,
                                      std::chrono::milliseconds timeout = std::chrono::seconds(5));
  status unimport_buffer(import_handle handle);
  // A peer on another host that goes silent (stopped, or its link down) is
  // waited for as long as it takes, as kernel TCP waits; only the end of its
  // connection says it is gone. A caller that learns sooner that the peer is
  // out of reach for good (its own kernel connection to it timed out) says
  // so here: while an operation on this import waits for the peer, `broken`
  // is asked now and then (any thread; cheap), and once it returns true that
  // operation and every later one on the import fail with peer_gone. Bytes
  // a given-up send was reading may still leave afterwards.
  // Errors: unknown_handle.
  status give_up_when(import_handle handle, std::function<bool()> broken);
  // Length and rights of an import. Errors: unknown_handle (also once the
  // exporter withdrew the export), peer_gone (the exporter is known to be
  // dead). Cheap: upper layers use it as a liveness check.
  result<import_info> describe(import_handle handle) const;
  // Wakes the exporter of a wakeable import (one write to its eventfd; never
  // blocks). Errors: unknown_handle, invalid_argument (not wakeable),
  // system_error (the write failed; the eventfd's count is full).
  status wake(import_handle handle) const;

  // --- deliberate update and fetch ---------------------------------------
  // Every range and right is checked before anything is posted; a rejected
  // call changes no byte anywhere. Errors: unknown_handle, out_of_range,
  // permission_denied, invalid_argument, peer_gone, fabric_error.
  //
  // send: returns when `source` may be reused and the data is on its way in
  // order behind earlier sends to the same peer. Small sends are copied and
  // return at once (unless options.transmit_complete); a failure that happens
  // after the copy (the peer died) is reported by the operations that follow.
  status send(import_handle to, std::uint64_t offset, const void* source, std::size_t length,
              send_options options = {});
  // Gathered send: the pieces land in order, as consecutive sends would, and
  // none is sent unless every one passes the checks. On the mapped path they
  // are copied back to back, so a flag word in the last piece becomes visible
  // right behind the data it announces. A notification (options.notify)
  // comes with the last piece.
  status send(import_handle to, std::span<const send_piece> pieces, send_options options = {});
  // A sender for `to` (see class sender). Errors: unknown_handle.
  result<sender> bind(import_handle to);
  // fetch: returns when `destination` holds the bytes.
  status fetch(import_handle from, std::uint64_t offset, void* destination, std::size_t length);

  // Asynchronous forms: the buffer must stay untouched until the request
  // completes. The same errors are returned immediately when the call is
  // rejected before posting, or later through wait()/test().
  result<request> send_async(import_handle to, std::uint64_t offset, const void* source,
                             std::size_t length, send_options options = {},
                             void* user_context = nullptr);
  result<request> fetch_async(import_handle from, std::uint64_t offset, void* destination,
                              std::size_t length, void* user_context = nullptr);
  // Finished? Returns the completion once (the request is then released), or
  // errc::would_block while it is in flight; unknown_handle for a request that
  // was never issued or was already reported.
  result<completion> test(request r);
  result<completion> wait(request r,
                          std::chrono::milliseconds timeout = std::chrono::milliseconds::max());

  // --- notifications -----------------------------------------------------
  // Runs handlers of notifications that have arrived; returns how many ran.
  std::size_t poll_notifications();
  // Like poll_notifications, but blocks up to `timeout` for the first one
  // (busy-polls briefly, then sleeps). Errors: timed_out.
  result<std::size_t> wait_notifications(std::chrono::milliseconds timeout);
  // A descriptor that becomes readable when notifications may be pending, for
  // poll/epoll loops. Before sleeping on it, call prepare_wait(): it returns
  // false when something is already pending (then poll instead of sleeping).
  int notification_fd() const noexcept;
  bool prepare_wait();

  // Drives outstanding transfers; needed only by callers that busy-wait on
  // memory instead of using notifications or wait().
  void progress();

  counters stats() const;
  // Which path an import uses ("mapped", "fabric:shm", "fabric:tcp;ofi_rxm");
  // for logs and benchmarks only: decide by describe()'s flags. Errors:
  // unknown_handle.
  result<std::string> path_of(import_handle handle) const;

  class [[gnu::visibility("hidden")]] impl;  // internal, not exported

 private:
  friend class sender;
  [[gnu::visibility("hidden")]] explicit context(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

// True while the calling thread is in libfabric for the stack, or is one of
// the stack's own threads: a descriptor opened now is the stack's. libfabric
// opens its sockets and epoll sets without FD_CLOEXEC; the interposers add
// it to what such a thread opens, so no child of the program inherits them.
bool opening_for_the_stack() noexcept;

}  // namespace vmmc::core

#pragma GCC visibility pop
