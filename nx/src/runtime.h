// nx/src/runtime.h: one node's message-passing engine (internal).
//
// One redirect::channel per other node carries messages framed as in wire.h.
// Sending copies header and payload into the peer's ring (write() accepts
// what fits; the rest waits in a per-peer queue, so pairwise order holds and
// a slow receiver only slows its senders). Receiving reads headers as they
// come and places each payload straight into the matching posted receive's
// buffer; a message nobody asked for yet is copied into an "arrival" kept in
// arrival order (FORCE messages are dropped instead), and a receive posted
// later takes it from there (or takes over the rest of the payload when it
// is still arriving). Every wait drives all channels, so no two nodes can
// block each other; a waiter busy-polls briefly, then sleeps on its doorbell.
//
// Error results are NX codes (EQ* from <nx.h>), 0 for success.
// NX programs call it from one thread. Once a handler receive (hrecv ...)
// has been posted, a handler thread also drives progress while the program
// computes outside NX calls and runs due handlers there; from then on every
// NX call holds the runtime's lock (nx_call), so the two never run in it at
// once, and a handler never runs concurrently with another or nested.
#pragma once

#include <poll.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bootstrap.h"
#include "lane.h"
#include "nx.h"
#include "vmmc/core/context.h"
#include "vmmc/redirect/channel.h"
#include "vmmc/redirect/mailbox.h"
#include "wire.h"

namespace vmmc::nx::detail {

enum class space : std::uint8_t { user = 1, internal = 2, control = wire::control_space };

struct info {
  long type = 0, count = 0, node = 0, ptype = 0;
  // Into an NX info array (msginfo, the x forms' info[]); null: nowhere.
  void store(long* to) const {
    if (!to) return;
    to[NX_INFO_TYPE] = type;
    to[NX_INFO_COUNT] = count;
    to[NX_INFO_NODE] = node;
    to[NX_INFO_PTYPE] = ptype;
  }
};

// Which messages a receive or probe accepts; -1 = any (any non-FORCE type).
struct selector {
  space where = space::user;
  long type = -1, node = -1, ptype = -1;
  bool matches(space s, const info& m) const {
    return s == where && (type == -1 ? (m.type & NX_FORCE_TYPE) == 0 : m.type == type) &&
           (node == -1 || node == m.node) && (ptype == -1 || ptype == m.ptype);
  }
};

struct request {
  long mid = 0;
  bool is_send = false;
  bool done = false;
  bool released = false;  // nobody will ask for it: freed once done
  int error = 0;
  // receives
  selector sel;
  std::byte* buffer = nullptr;
  std::size_t capacity = 0;
  info got;
  long* user_info = nullptr;  // the x forms' info[]
  nx_handler handler = nullptr;
  nx_handlerx handlerx = nullptr;
  long hparam = 0;
  // sends
  long sends_left = 0;
};

class runtime {
 public:
  // The node's runtime, started at the first NX call; prints the reason and
  // exits with status 1 if the job cannot be joined.
  static runtime& instance() { return current_ ? *current_ : start_instance(); }
  static runtime* current() { return current_; }  // null before the first NX call
  ~runtime();

  long node() const { return node_; }
  long nodes() const { return nodes_; }
  // The peer the last EQBADNODE is about (it died, or it ended while a call
  // waited for it), or -1.
  long failed_node() const { return failed_node_; }
  // Whether that peer ended in order (exit) rather than died.
  bool failed_node_ended() const { return failed_node_ended_; }
  long ptype = 0;

  // Sends to `node` (-1: all others). With `async` null, returns when `data`
  // may be reused; else *async is a request that finishes then.
  int send(space where, long type, const void* data, long count, long node, request** async);
  // Posts a receive. The request is done when the message is in `buffer`;
  // `how` (may be null) supplies user_info and the handler fields.
  // Without `tracked` the request has no mid (blocking receives).
  int post_receive(const selector& sel, void* buffer, long count, request*& out,
                   const request* how = nullptr, bool tracked = true);
  // A blocking receive: returns once the message is in `buffer` (0, or
  // EQMSGLONG when only the first `count` bytes fit) or the job failed; `got`
  // then describes it, and `user_info` (may be null) is filled as by the x
  // forms.
  int receive(const selector& sel, void* buffer, long count, long* user_info, info& got);
  // Waits for a receive from post_receive and releases it. When the message
  // arrived (0, or EQMSGLONG) `got` (may be null) describes it; after a
  // failure the receive is abandoned.
  int await_receive(request* r, info* got);
  // Blocks until `r` is done (or a node died); does not release it.
  int wait(request* r);
  // Looks for an arrived message; with `block`, waits for one.
  int probe(const selector& sel, bool block, bool& found, info& out);
  // hsend: once send request `r` is done (now, if it is), `how`'s handler
  // runs with `what` (the sent message); r is freed after it.
  void notify_sent(request* r, const request& how, const info& what);
  // Withdraws an unmatched receive / an unstarted send; false if too late.
  bool cancel(request* r);
  // After a failed wait, when the receive's buffer is about to go away: the
  // receive is withdrawn, or the rest of its arriving message discarded (a
  // buffer posted on the fabric path is taken back from the channel).
  void abandon(request* r);
  request* find(long mid);
  void release(request* r);  // the caller is done with r (frees it once done)

  void progress();
  // Runs handlers of completed hrecv's unless masked or already inside one.
  void run_handlers() {
    if (!handlers_due_.empty()) run_due_handlers();
  }
  long mask(long state);
  int kill_node(long node);

  // Whether NX calls must take the lock: a handler thread runs.
  static bool threaded() { return threaded_.load(std::memory_order_relaxed); }
  static std::mutex& calls() { return calls_; }
  // Sequence number of the next collective (the same on every node).
  long next_collective() { return ++collectives_; }

 private:
  struct outgoing {
    request* owner = nullptr;  // null for a blocking send
    wire::header header;
    const std::byte* data = nullptr;
    std::size_t length = 0;
    std::size_t sent = 0;  // header and payload bytes accepted by the channel
  };
  struct arrival {
    space where;
    info what;
    std::vector<std::byte> data;
    std::size_t received = 0;
    bool complete = false;
  };
  struct peer {
    lane link;                                // the stream, both ways
    std::unique_ptr<redirect::mailbox> mail;  // small messages, both ways (null on TCP)
    std::uint32_t next_sequence = 0;          // of our next message to this peer
    std::uint32_t expected = 0;               // sequence of its next message to us
    bool remote = false;       // other host (core::host_identity): doorbells do not reach it
    bool shares_cpus = false;  // same kernel, whatever its network namespace
    bool closed = false;       // ended its stream (orderly exit), or killed by us
    bool ready = false;        // its start-up is complete (wire::ready came)
    bool ended = false;        // its last message came (wire::end): nothing more will
    pid_t pid = 0;
    std::deque<outgoing> queue;
    // the message being read
    std::byte header[sizeof(wire::header)];
    std::size_t header_got = 0;
    bool in_body = false;
    space where = space::user;
    info current;
    std::size_t body_left = 0;
    std::byte* destination = nullptr;  // null: discard
    std::size_t destination_left = 0;
    request* receiver = nullptr;
    arrival* pending = nullptr;
    bool posting = false;  // destination is posted on the channel (fabric path)
    // A post was cut off mid-message, or the peer sent a malformed message:
    // nothing more is read from it.
    bool unreadable = false;
  };

  runtime() = default;
  static runtime& start_instance();
  bool start();
  void run_due_handlers();
  void finish();
  static void finish_at_exit();

  request* new_request(bool is_send, bool tracked);
  void recycle(request* r);
  int push(peer& p);
  int write_some(peer& p, outgoing& o);
  int write_failed(peer& p, std::error_code error);
  void drain(long from);
  int check_receive(const selector& sel, const void* buffer, long count) const;
  bool receive_from_mailbox(const selector& sel, std::byte* buffer, std::size_t capacity, info& got,
                            int& error);
  bool take_whole(long from, std::size_t ready);
  bool take_mail(long from);
  // The next message from `from` when it waits in the mailbox, in sequence:
  // its header and payload (else false: a stream message comes first); a
  // malformed one fails the job.
  bool next_mail(long from, wire::header& h, const std::byte*& payload);
  bool unreadable_mail(long from);  // fails the job; false
  void deliver_whole(long from, const wire::header& h, const std::byte* payload);
  int send_to(long j, wire::header& header, const std::byte* data, std::size_t length, request* r,
              long& queued);
  void begin_message(long from, const wire::header& h);
  void bind(peer& p, request* r, std::size_t already);
  void finish_message(peer& p);
  void complete_receive(request* r, const info& m, space where);
  void deliver_local(space where, long type, const std::byte* data, std::size_t length);
  void sent_one(request* owner);
  void send_control(long to, wire::control_type what);
  void on_control(long from, long what);
  void peer_ended(long j);
  // A node that ended and so can never send what `sel` selects: the one
  // named by it, or, for any node, the last of all the others to end; -1
  // while someone may still send it.
  long ended_sender(const selector& sel) const {
    return ended_peers_ == 0 ? -1 : ended_sender_slow(sel);
  }
  long ended_sender_slow(const selector& sel) const;
  // Fails a wait on node j's account: EQBADNODE, and j named by fatal().
  int blame_ended(long j);
  void fail_receive(request* r, long ended);
  int fail_job(long node, int code);
  void sleep_a_little();
  // Asks every peer to ring this node's doorbell when it next writes (data,
  // or space toward a peer with queued sends); false when something is on
  // its way already (poll again instead of sleeping). `timeout_ms` becomes
  // 1 when a peer cannot ring (other host).
  bool arm_doorbell(int& timeout_ms);
  void serve_handlers();
  void start_handler_thread();
  void stop_handler_thread();
  void handler_thread_main();
  void check_peers();
  template <class Ready>
  int wait_until(Ready ready);

  static inline runtime* current_ = nullptr;  // this process's node, once started
  static inline std::atomic<bool> threaded_{false};
  static inline std::mutex calls_;
  std::thread handler_thread_;
  int kick_fd_ = -1;            // eventfd: wakes the handler thread to arm again
  long with_handler_ = 0;       // outstanding requests with a handler
  bool stop_handlers_ = false;  // under calls_
  std::unique_ptr<bootstrap> boot_;
  std::shared_ptr<core::context> context_;  // the process's (core::context::shared)
  std::unique_ptr<doorbell> bell_;
  // Where a sleeper must look besides its doorbell (TCP lanes), as the
  // last arm_doorbell() found.
  std::vector<pollfd> lane_fds_;
  std::vector<peer> peers_;
  long node_ = 0, nodes_ = 1;
  std::vector<request*> posted_;  // in posting order
  std::list<arrival> arrivals_;
  std::unordered_map<long, request*> requests_;  // the ones with a mid
  std::vector<request*> spare_;                  // recycled (the runtime lives until exit)
  std::deque<request*> handlers_due_;
  long next_mid_ = 0;
  long collectives_ = 0;
  bool masked_ = false, in_handler_ = false, dying_ = false;
  bool completed_ = false;  // progress() completed a posted receive
  int failure_ = 0;
  long failed_node_ = -1;
  bool failed_node_ended_ = false;
  long ready_peers_ = 0, ended_peers_ = 0, last_ended_ = -1;
  bool oversubscribed_ = false;
  std::vector<std::byte> scratch_;
};

// NX calls on this thread, counting nested ones (a handler's calls, gsendx's
// sends); initial-exec: one %fs access, no __tls_get_addr on the fast path.
[[gnu::tls_model("initial-exec")]] inline thread_local int call_depth = 0;
[[gnu::tls_model("initial-exec")]] inline thread_local bool call_locked = false;

// Held for the length of every NX call that touches the runtime: takes the
// runtime's lock at the outermost call once a handler thread runs. Without
// handlers it costs two thread-local updates and a load.
class nx_call {
 public:
  nx_call() {
    if (call_depth++ == 0 && runtime::threaded()) {
      runtime::calls().lock();
      call_locked = true;
    }
  }
  ~nx_call() {
    if (--call_depth == 0 && call_locked) {
      call_locked = false;
      runtime::calls().unlock();
    }
  }
  nx_call(const nx_call&) = delete;
  nx_call& operator=(const nx_call&) = delete;
};

// Prints "nx: <call>: <reason>" and exits with status 1 (peers see this
// node die, not end).
[[noreturn]] void fatal(const char* call, int code);

// A buffer argument's check: EQLEN for a negative length, EQPBUF for a null
// buffer with a nonzero length, else 0.
inline int check_buffer(const void* buffer, long count) {
  if (count < 0) return EQLEN;
  return count > 0 && !buffer ? EQPBUF : 0;
}

// The text of an NX error code (nx_perror, the plain forms' message).
const char* describe(int code);

// NX's two error conventions for a call's result code.
// Underscore forms: `value` on success, else -1 with errno = code.
inline long checked(int code, long value = 0) {
  if (code == 0) return value;
  errno = code;
  return -1;
}
// Plain forms: `value` on success; an error ends the process.
inline long or_die(const char* call, int code, long value = 0) {
  if (code) fatal(call, code);
  return value;
}

}  // namespace vmmc::nx::detail
