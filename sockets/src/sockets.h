// sockets/src/sockets.h: the private header of the sockets layer.
//
// One `stream` per kernel TCP descriptor this library manages, found through
// a table indexed by descriptor. A stream is either undecided (waiting for
// the peer's first byte), plain (kernel TCP for good), deferred (kernel TCP,
// counted, until the connection has carried enough to pay for a channel:
// see the phase) or upgraded (the peer speaks vmmc; each direction switches
// from TCP to the redirect channel at its own byte offset, see wire.h).
#pragma once

#include <sys/epoll.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "flow.h"
#include "presence.h"
#include "vmmc/core/context.h"
#include "vmmc/core/progress.h"
#include "vmmc/core/settings.h"
#include "vmmc/redirect/channel.h"
#include "vmmc/sockets/socket.h"
#include "vmmc/sockets/stat.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

namespace vmmc::sockets::detail {

namespace settings {
extern const core::setting enable;
extern const core::setting hold_us;
extern const core::setting log_level;
extern const core::setting ports;
extern const core::setting exclude;
extern const core::setting remote;
extern const core::setting preload_enable;
extern const core::setting stat;
extern const core::setting stat_dir;
extern const core::setting inherit;
extern const core::setting upgrade_after;
}  // namespace settings

enum class phase : std::uint8_t {
  idle,        // created, listening, or not yet connected
  connecting,  // non-blocking connect in progress
  undecided,   // connected; the peer's first byte has not arrived
  plain,       // kernel TCP for good
  // Kernel TCP, counted, until the connection earns a channel (earn_channel,
  // handshake.cc): a connection that makes a few calls and closes pays
  // nothing for one. A client on another host has the server's answer (its
  // channel waits for our hello). On this host neither end has sent a byte
  // of ours: the client asks once it earned (it enters its socket in the
  // presence table), and the server, looking now and then (look_for_ask),
  // answers mid-stream with its accept byte and hello frame.
  deferred,
  upgraded,  // the peer speaks vmmc: channel set up (directions switch separately)
};

struct epoll_set;  // readiness.cc

struct stream {
  explicit stream(int descriptor) : fd(descriptor) {}

  // The descriptor kernel calls go through; another alias of the same socket
  // (dup) once this one is closed.
  std::atomic<int> fd;
  std::atomic<int> aliases{1};      // descriptors of this process naming the stream
  std::atomic<bool> closed{false};  // the last of them was closed
  std::atomic<bool> is_client{false};
  // Its entry in our user's presence table (a listener, or a client until
  // it has decided), 0 if none (presence.h).
  std::atomic<std::uint64_t> presence_cookie{0};
  // Server: the client entered itself (presence.h): it asked for the
  // upgrade without an offer byte, which only a client on another host sends.
  std::atomic<bool> client_vouched{false};
  // Client on this host: the upgrade is asked for once the connection earns
  // it (set before connect). `asked` once our socket is entered: the
  // server's answer may then come at any byte of its stream (watched_receive).
  std::atomic<bool> ask_later{false};
  std::atomic<bool> asked{false};
  // On this host, deferred: the call count at which the server next looks
  // for the client's ask, or the client for a server without a listener
  // (looks_made so far); the client's socket once the server found it.
  // Under setup_mutex.
  std::atomic<std::uint32_t> next_look{0};
  std::uint32_t looks_made = 0;
  std::optional<presence::socket_id> client_socket;
  // Server: what of our mid-stream answer the kernel did not take at once;
  // sent before any later byte of ours (set before the phase says
  // upgraded, then under write_mutex).
  std::string answer_rest;
  // Client: our offer byte went out (the kernel counts it; vmmc-stat does not).
  std::atomic<bool> offer_sent{false};
  // Client: connect() published the connection's row (vmmc-stat).
  std::atomic<bool> connect_listed{false};
  std::atomic<phase> state{phase::idle};
  // The connection's two ends, asked of the kernel once it connected (at
  // accept, or when the client offers) and kept for every later decision
  // and description; valid once ends_known (release/acquire). A listener
  // bound to one address keeps it in local_end (its connections' local
  // end), asked at its first accept (listen_address_asked).
  sockaddr_storage local_end{}, peer_end{};
  bool peer_here = false;  // the peer runs on this host
  std::atomic<bool> ends_known{false};
  std::atomic<bool> listen_address_asked{false};
  std::atomic<fallback> fallback_reason{fallback::none};  // why it is kernel TCP (vmmc-stat)
  std::atomic<bool> nonblocking{false};
  // SO_RCVTIMEO / SO_SNDTIMEO; max() means none (set from any thread).
  std::atomic<std::chrono::milliseconds> receive_timeout{std::chrono::milliseconds::max()};
  std::atomic<std::chrono::milliseconds> send_timeout{std::chrono::milliseconds::max()};

  std::mutex setup_mutex;        // phase changes and channel set-up
  std::timed_mutex read_mutex;   // readers take turns (several may call, as with the kernel)
  std::timed_mutex write_mutex;  // one writer at a time, and our hello's byte count

  std::unique_ptr<redirect::channel> chan;
  std::string peer_descriptor;  // client: the server's channel, from its hello frame
  // Deferred: calls in the kernel now, and calls that moved bytes so far.
  // Leaving the phase claims the stream first, then waits for no call in
  // the kernel (a read there could take the peer's first record for data).
  std::atomic<int> in_kernel{0};
  std::atomic<bool> upgrade_claimed{false};
  // A claim found a call in the kernel: until the stream leaves the phase,
  // reads that would block wait for the kernel's bytes outside it, so that
  // a thread blocked for its peer's next bytes does not hold the upgrade
  // off (deferred_call).
  std::atomic<bool> upgrade_due{false};
  std::atomic<std::uint32_t> tcp_calls{0};
  std::atomic<bool> peer_hello_seen{false};  // server: the client's channel hello arrived
  // Server: this stream's channel counts against max_awaiting_client until
  // the client's hello arrives or the stream goes (release_awaiting_slot).
  std::atomic<bool> awaiting_slot{false};
  // Each direction's carrier and state (see flow).
  flow out, in;
  // Outgoing: raw bytes we wrote on TCP before our channel hello (N_self);
  // out switches to the channel once the hello is placed.
  std::atomic<std::uint64_t> tcp_out{0};
  // A writer holding write_mutex sits in the kernel's send (our writes still
  // on TCP, or reverted): it stays there while the reader is stopped, and
  // only the kernel's shutdown, not our lock, can send it back.
  std::atomic<bool> sending_on_tcp{false};
  // TCP_NODELAY as the application set it (the kernel default is off). Once
  // a direction switched, the kernel's stays on for our doorbells.
  std::atomic<bool> app_nodelay{false};
  std::atomic<bool> hello_pending{false};  // a reader found the peer ready; a writer places it
  // Doorbells are records: they may follow our hello and must precede our
  // end record, never sit among our raw or reverted bytes (ring_doorbell).
  // A ring asked for before our hello is owed until it is placed; ringers
  // counts the doorbells being sent; out's records_closed stops new ones
  // while our end record goes out.
  std::atomic<bool> ring_owed{false};
  std::atomic<int> ringers{0};
  // Our hello was placed from the read side: the doorbell telling a peer
  // asleep on TCP of the switch goes with our next write (handshake.cc).
  // Under write_mutex, like everything that places the hello.
  bool switch_doorbell_owed = false;
  // No hello placed before this (steady clock, ns): the peer's process did
  // not answer the import of its area (stopped), hello_tries times so far.
  // Under write_mutex.
  std::int64_t next_hello_try = 0;
  int hello_tries = 0;
  // Incoming: raw bytes read from TCP so far; the peer's N once known;
  // in switches to the channel once all of them are read.
  std::atomic<std::uint64_t> tcp_in{0};
  std::optional<std::uint64_t> peer_raw;

  std::atomic<bool> tcp_eof{false};  // the peer's TCP side ended (FIN or an error)
  // ... by an error the kernel found (a reset, a keepalive or user timeout):
  // its errno, reported once by the next call, as the kernel's socket error.
  std::atomic<int> tcp_error{0};
  std::atomic<bool> tcp_error_told{false};
  std::atomic<std::int64_t> next_tcp_look{0};  // see tcp_failed() (io.cc)
  // An error to report on the next call (errno): set with report_next().
  std::atomic<int> pending_error{0};
  std::atomic<std::uint64_t> doorbells_in{0};
  // Sleeping on the doorbell (handshake.cc, sleep_on_doorbell).
  std::mutex sleep_mutex;
  std::condition_variable sleep_cv;
  bool descriptor_sleeper = false;
  std::atomic<std::uint64_t> doorbell_generation{0};
  // The application sleeps on this stream in our poll, select or epoll
  // (watching the channel's wait descriptor): an EAGAIN arms for it too.
  std::atomic<bool> sleeps_in_our_waits{false};
  // A listening socket: its readiness is the kernel's alone, for good.
  std::atomic<bool> listening{false};
  // Epoll sets holding this stream with the caller's own event while it is
  // deferred (its readiness the kernel's until it upgrades): each set, the
  // descriptor it holds it by and the caller's event (readiness.cc,
  // epoll_members_from_now). Most streams are in one set: no allocation.
  struct held_in_set {
    std::weak_ptr<epoll_set> set;
    int fd = -1;
    epoll_event user{};
  };
  std::mutex epoll_mutex;
  held_in_set held_first;
  std::vector<held_in_set> held_more;

  // --- Going back to TCP (revert.cc; wire.h's revert records).
  // Channel bytes we wrote, and those we consumed (read or stashed).
  // (out: end_due once the peer asked us to revert our writes, tcp_again
  // once our end record is out.)
  std::atomic<std::uint64_t> channel_out{0}, channel_in{0};
  // The peer's end record: its writes after this many channel bytes are on
  // TCP (in: end_due once known, tcp_again once we consumed them all).
  std::atomic<std::uint64_t> peer_channel_end{no_end};
  // A fork() copy: the channel (if any) belongs to another process.
  std::atomic<bool> inherited{false};
  std::atomic<bool> shared{false};  // another process may hold the socket since fork()
  // Bytes taken off the connection before it went back to TCP, delivered
  // before anything the kernel holds; shared with fork() children (one copy).
  struct stash_area* stash = nullptr;

  static constexpr std::uint64_t no_end = ~std::uint64_t{0};
  // The channel runs on the same-host mapped path (known once connected).
  bool chan_mapped() {
    int m = mapped.load(std::memory_order_relaxed);
    if (m < 0 && chan && chan->connected()) mapped.store(m = chan->capabilities().mapped);
    return m > 0;
  }
  std::atomic<int> mapped{-1};
  ~stream();
};

using stream_ptr = std::shared_ptr<stream>;

// The next call on the stream, in either direction, reports `error`.
inline void report_next(stream& s, int error) {
  s.pending_error.store(error);
  s.out.note_failure();
  s.in.note_failure();
}

// Lets go of `owner`'s object for good, without destroying it: what a fork()
// child inherited (a channel, the context) belongs to the parent, whose
// threads and peers it would otherwise tear down. Marked as deliberately
// kept for LeakSanitizer.
template <class T>
void abandon(std::unique_ptr<T>& owner) {
  [[maybe_unused]] T* kept = owner.release();
#if defined(__SANITIZE_ADDRESS__)
  if (kept) __lsan_ignore_object(kept);
#endif
}
template <class T>
void abandon(std::shared_ptr<T>& holder) {
  if (!holder) return;
  auto* kept = new std::shared_ptr<T>(std::move(holder));  // never let go
#if defined(__SANITIZE_ADDRESS__)
  __lsan_ignore_object(kept);
#else
  (void)kept;
#endif
}

// Set while the calling thread is inside a call of this library's API,
// whether it came through an interposer or straight from a program linked
// with us: the interposer then sends the calls we (and the layers below,
// libfabric included) make to libc (socket.h, inside_flag). Initial-exec:
// one load; the library is loaded at start-up by whatever uses it.
extern thread_local bool inside_api __attribute__((tls_model("initial-exec")));
struct api_call {
  api_call() : outer(inside_api) { inside_api = true; }
  ~api_call() { inside_api = outer; }
  api_call(const api_call&) = delete;
  api_call& operator=(const api_call&) = delete;
  bool outer;
};

// --- readiness.cc: the stream leaves the deferred phase with a channel:
// the epoll sets that held it with the caller's event translate it now.
void epoll_members_from_now(stream& s);

// --- table.cc: descriptors we manage, and the process's VMMC context.
// Set once the context is gone at exit: channels destroyed later are let go.
extern std::atomic<bool> context_ended;
// Calls that may be using streams and their channels (receive, transmit,
// poll, epoll_wait) hold one of these: the teardown at exit tears nothing
// down while another thread is inside one (exit() from one thread while
// another waits in read()), and a call that starts once the process is
// exiting waits for its end, as a thread blocked in the kernel does.
extern std::atomic<int> busy_calls;
extern std::atomic<bool> exiting;
bool exiting_elsewhere();  // exiting, and not from this thread (whose exit handlers go on)
[[noreturn]] void wait_for_the_end();
struct busy_call {
  busy_call() {
    busy_calls.fetch_add(1);
    if (exiting.load() && exiting_elsewhere()) wait_for_the_end();
  }
  ~busy_call() { busy_calls.fetch_sub(1); }
  busy_call(const busy_call&) = delete;
  busy_call& operator=(const busy_call&) = delete;
};
stream_ptr find(int fd);
stream_ptr adopt(int fd, bool is_client);  // starts managing a TCP descriptor
// Whatever brings the layer in (the interposer, vRPC, a program linked with
// it) gets fork() right: installed with the first stream (revert.cc).
void install_fork_handlers();
void alias(int fd, const stream_ptr& s);  // `fd` names `s` too (dup)
// Drops `fd` from the table; returns the stream if that was its last name.
stream_ptr release_slot(int fd);
void forget(int fd);
std::vector<stream_ptr> all_streams();
std::vector<int> descriptors();  // every descriptor in the table
bool context_started();
bool enabled();
// Created on first need (a peer that speaks vmmc): a process that never meets
// one starts no threads and never opens libfabric. Null if it cannot be made.
core::context* process_context();
// After fork() the child gets a context of its own on first need (the
// parent's copy is left alone); see revert.cc for inherited connections.
void log(int level, const char* format, ...) __attribute__((format(printf, 2, 3)));

// --- route.cc: where the peer is, and whether VMMC beats kernel TCP to it.
// Keeps the connection's ends on `s` (ends_known), and whether the other
// end is on this host (in this network namespace: loopback, or an address
// of one of our interfaces); learn_ends asks the kernel for them, false
// when it cannot tell (not connected).
void keep_ends(stream& s, const sockaddr_storage& local, const sockaddr_storage& peer,
               bool peer_here);
bool learn_ends(stream& s);
// Whether `peer` is on this host, also for the address a connect() names
// (`local`: null if not bound yet).
bool peer_on_this_host(const sockaddr* peer, const sockaddr* local = nullptr);
// The IPv4 address (dotted, IPv4-mapped IPv6 too) of `address`; empty for
// IPv6.
std::string ipv4_text(const sockaddr* address);
// Why a connection stays on kernel TCP although both ends may speak VMMC,
// if it does: its peer is on another host and no fabric there can beat
// kernel TCP (VMMC_SOCKETS_REMOTE). Decided before any byte of ours, once
// the caller knows whether the peer is on this host.
std::optional<fallback> keep_on_tcp_to(bool peer_here);
// The address is a wildcard (INADDR_ANY, in6addr_any).
bool wildcard(const sockaddr* address);

// --- handshake.cc
// Sends all of a small control message, waiting for the socket (bounded).
bool send_all(int fd, const void* data, std::size_t length, int flags);
void send_offer(stream& s);  // client: right after the connection is up
// Kernel TCP for good, for `why` (said in the debug log). The caller
// publishes the stream's row (a connect or accept publishes it anyway).
void mark_plain(stream& s, fallback why);
// Server channels made for an offer whose client has not said hello yet
// (each holds two descriptors, its area's memfd and its wait eventfd, and
// a mapping): at most an eighth of the process's descriptor limit (a
// quarter of the descriptors), and at least 32. A flood of offer bytes then
// costs bounded state; later offers are answered as plain TCP, while a
// burst of real clients (their hellos follow within a round trip) fits.
int max_awaiting_client();
void release_awaiting_slot(stream& s);
bool check_connected(stream& s);  // connecting -> undecided once connected
void try_decide(stream& s, bool wait_for_first_byte);
// The call may not block (MSG_DONTWAIT, or O_NONBLOCK on the socket).
bool wants_no_wait(const stream& s, int flags);
// When a read with SO_RCVTIMEO gives up; never without one.
std::chrono::steady_clock::time_point receive_deadline(const stream& s);
// What a deferred kernel call does, for the phase's rules (deferred_call).
struct kernel_call {
  // A read that may block: it waits outside the kernel while an upgrade is
  // due (stream::upgrade_due).
  bool blocking_read = false;
  // A read that would step over the urgent mark (any but watched_receive's):
  // never made once the client asked, as the answer may be at the head.
  bool unwatched_read = false;
};
// Deferred: one kernel call (`call` returns its result), counted towards the
// channel; the bytes it moved add to `counter` (tcp_in or tcp_out; null for
// a peek). Returns false, without calling, if the stream left the phase
// meanwhile, or if an unwatched read finds the client asked: the caller
// starts over.
bool deferred_call(stream& s, core::function_ref<ssize_t()> call,
                   std::atomic<std::uint64_t>* counter, ssize_t& result, kernel_call kind = {});
// VMMC_SOCKETS_UPGRADE_AFTER, read once: the calls a connection makes on
// kernel TCP before its channel (0: at once).
std::uint32_t upgrade_after();
// Deferred client on this host that asked: a read that never steps over the
// server's answer (which may come at any byte of its stream) and takes it.
// Returns false, without reading, once the stream has no ask open or left
// the phase (the answer was taken): the caller starts over.
bool watched_receive(stream& s, void* buffer, size_t length, int flags,
                     std::chrono::steady_clock::time_point deadline, ssize_t& result);
// Server, with write_mutex held: sends what is left of our answer to the
// client's ask (answer_rest), waiting for room unless `no_wait`. False with
// errno set (EAGAIN; or the connection failed) if some is left.
bool flush_answer(stream& s, bool no_wait);
// Deferred, before fork(): the socket may be shared from now on, and a
// channel of one process would take bytes the other reads: kernel TCP.
void stay_on_tcp(stream& s);
bool peer_ready(stream& s);       // our channel hello may be placed now
void advance_upgrade(stream& s);  // places it unless a writer is busy (it will)
void place_hello_locked(stream& s, bool ring_now = true);  // with write_mutex held
bool learn_peer_raw(stream& s);                            // true once the peer's N is known
// Wakes the peer if it sleeps on TCP (the channel rings for data or space).
// Any thread: the doorbell never enters our raw prefix (owed until our hello
// is placed) nor follows our end record.
void ring_doorbell(stream& s);
// Before our end record: no doorbell is sent from here on (waits for those
// being sent). reopen_records() undoes it if the record could not go.
void close_records(stream& s);
void reopen_records(stream& s);
// Once our writes switched, our TCP bytes are doorbells: Nagle would hold
// one back until the previous one is acknowledged, and a sleeping peer would
// wait for it. Turns it off whatever the application set (see app_nodelay).
void nagle_off_for_doorbells(stream& s);
void sleep_on_doorbell(stream& s, const std::function<bool()>& arm, int timeout_ms);
void discard_protocol_bytes(stream& s);  // before close: FIN, not reset
// Registers, once, an exit handler that discards them from every stream.
void exit_takes_protocol_bytes();
// The stream's last descriptor goes (close(), or exit with it open): the
// peer gets every byte sent, then the end; our protocol bytes are taken.
void end_stream(stream& s);

// --- revert.cc: connections going back to kernel TCP (fork, exec).
// Parses doorbells and revert records after the switch (never past an end
// record: what follows it is application data).
void drain_doorbells(stream& s);
// The peer asked: place our end record once no writer is busy (with
// write_mutex held: `_locked`).
void answer_revert(stream& s);
void answer_revert_locked(stream& s);
// Every channel byte the peer wrote before its end record is consumed: the
// rest of its stream is on TCP.
bool input_on_tcp(stream& s);
std::size_t stash_size(const stream& s);
std::size_t take_stash(stream& s, void* buffer, std::size_t length, bool consume);

// --- stat.cc: the rows vmmc-stat reads (vmmc/sockets/stat.h). Connection
// events only, never the data path; errno is left alone.
// Writes `s`'s row, with no system call (a reader's request completes it);
// `first` (a connect or accept) makes the file if needed; `remote` is the
// address connect() names.
void stat_publish(stream& s, bool first = false, const sockaddr* remote = nullptr,
                  socklen_t remote_length = 0);
void stat_forget(int fd);  // `fd` no longer names a stream here
void stat_before_exec();   // rows made whole (their inodes) for a reader after exec()
// The process has its VMMC context: a thread answers for fresh counters.
void stat_context_ready();

// --- readiness.cc
void forget_epoll_set(int fd);                          // `fd` closed
void forget_epoll_sets(unsigned first, unsigned last);  // a range closed
void duplicated_epoll_set(int fd, int copy);            // `copy` names what `fd` does

// --- io.cc
// The kernel ended the TCP connection under the stream (a reset, a
// keepalive or user timeout): notes its error. Looks at the descriptor at
// most every few milliseconds; any thread.
bool tcp_failed(stream& s);
// The kernel ended the TCP connection under an upgraded stream with
// `error`: the stream ends too (a writer blocked on the channel returns).
void note_tcp_error(stream& s, int error);
// True once every raw byte the peer sent before its switch has been read
// (then marks the stream switched in).
bool raw_prefix_done(stream& s);
// The peer's raw bytes (those before its switch) off TCP, never a record
// after them (io.cc). Returns the bytes, 0 at end of file or with
// `at_switch` set when none are left before the peer's switch, -1 (errno).
ssize_t take_raw(stream& s, char* buffer, size_t length, bool peek, bool no_wait, bool& at_switch);
// `rw`: the program called read()/write() (not recv()/send()). Bytes the
// kernel carries then go through that same system call: a seccomp filter
// may allow write but not sendto (OpenSSH's pre-authentication sandbox).
ssize_t receive(stream& s, void* buffer, size_t length, int flags, bool rw = false);
ssize_t transmit(stream& s, const void* buffer, size_t length, int flags, bool rw = false);
// Whether the kernel carries this stream's writes / reads as they are now.
bool kernel_writes(const stream& s);
bool kernel_reads(const stream& s);
// What poll should report for `s`, given what the kernel reported for its
// descriptor: kernel readiness before the switch, the channel's after it.
short ready_events(stream& s, short wanted, short kernel_events);
// Before sleeping in poll/epoll: arms the doorbell for what is wanted, to
// be rung as `how` says (wait_fd: the sleep watches the channel's wait
// descriptor too); false if something is already ready.
bool prepare_sleep(stream& s, short wanted, redirect::wake_by how);
// The channel's wait descriptor, when the stream has one to watch.
int wait_fd_of(const stream& s);

}  // namespace vmmc::sockets::detail
