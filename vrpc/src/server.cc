// The vRPC server transports: a listening SVCXPRT and one SVCXPRT per
// accepted connection, registered with libtirpc's dispatch (xprt_register)
// on their kernel descriptors so that an unmodified svc_run() serves them.
//
// svc_run sleeps in the kernel's poll(). A connection upgraded to VMMC
// becomes readable in the kernel only when its client rang the doorbell, and
// the client rings only if this end armed it. So a connection never goes
// back to svc_run with bytes buffered (it answers XPRT_MOREREQS, as svc_vc
// does), and before it goes back idle it drains old doorbells and arms
// (a non-blocking read that finds nothing arms the sockets layer's doorbell).
// Between a reply and the client's next call it watches the channel for as
// long as core's spin policy lets a wait spin (core/progress.h), without a
// system call, unless other transports are waiting: a closed-loop client
// then pays no doorbell. Where the sockets layer has a wake-up descriptor
// for the connection (a client on this host), a second, small SVCXPRT puts
// it in svc_run's poll too: the client then wakes an idle connection with
// an eventfd write, not a TCP segment each way.
#include <rpc/rpc.h>
// After rpc.h, which they rely on:
#include <rpc/rpc_com.h>
#include <rpc/svc_auth.h>
#include <rpc/svc_mt.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "vmmc/core/progress.h"
#include "vmmc/sockets/socket.h"
#include "vmmc/vrpc/vrpc.h"
#include "vrpc_impl.h"

namespace vmmc::vrpc::detail {
namespace {

using clock = std::chrono::steady_clock;
char tcp_netid[] = "tcp";

// libtirpc keeps each call's server-side auth handle in an extension that
// xp_p3 points to (rpc/svc_mt.h); its dispatch sets it before each call.
struct listener {
  SVCXPRT xprt{};
  SVCXPRT_EXT extension{};
  sockaddr_in local{};
};

struct connection {
  explicit connection(int fd) : stream(fd) {}

  SVCXPRT xprt{};
  SVCXPRT_EXT extension{};
  // The waker: svc_run polls the wake-up descriptor through it (no xp_ops:
  // none; asked once, when the connection is first on VMMC).
  SVCXPRT waker{};
  SVCXPRT_EXT waker_extension{};
  bool waker_asked = false;
  bool woken_by_waker = false;  // svc_run found the wake-up descriptor readable
  record_stream stream;
  char verifier[MAX_AUTH_BYTES]{};
  sockaddr_in peer{}, local{};
  std::uint32_t xid = 0;
  bool dead = false;
  bool served = false;  // the last recv produced a call
  bool resume = false;  // we answered MOREREQS: no doorbell to drain
  unsigned streak = 0;  // calls served since we last went back to svc_run
  std::string path;
};

struct connection;
void track(connection* c);  // the sweeper, below
void untrack(connection* c);

connection& conn(SVCXPRT* xprt) {
  return *static_cast<connection*>(xprt->xp_p1);
}

// The longest a connection watches for its client's next call, whatever the
// spin budget: other connections' calls may wait meanwhile (others_waiting
// looks only every 4th call). 50 us, the watch vRPC always had.
constexpr std::chrono::microseconds watch_for_next_call{50};

bool would_block(int e) {
  return e == EAGAIN || e == EWOULDBLOCK || e == EINTR;
}

// Some other transport of svc_run's has something to do.
bool others_waiting(const connection& c) {
  thread_local std::vector<pollfd> fds;
  if (!svc_pollfd || svc_max_pollfd <= 1) return false;
  fds.assign(svc_pollfd, svc_pollfd + svc_max_pollfd);
  for (pollfd& p : fds)
    if (p.fd == c.xprt.xp_fd || (c.waker.xp_ops && p.fd == c.waker.xp_fd)) p.fd = -1;
  return ::poll(fds.data(), fds.size(), 0) > 0;
}

void watch_wakeups(connection& c);  // the waker, below

// Nothing buffered: drain doorbells and take what is there, arming the
// doorbell if nothing is. True when bytes came. On kernel TCP for good, a
// read of what is there is all (svc_run's poll says when more comes): the
// look and the arming cost a connection across hosts three system calls a
// call, and 4 client threads got 0.86x libtirpc's calls/s. `look_at_tcp`:
// first let the sockets layer see what the kernel holds (doorbells, the
// peer's records, the end); needless where the wake-up descriptor woke us
// or will, since svc_run's poll watches the kernel descriptor anyway.
bool take_or_arm(connection& c, bool look_at_tcp) {
  const bool kernel_tcp = c.stream.on_kernel_tcp();
  if (!kernel_tcp && look_at_tcp) {
    pollfd p{c.xprt.xp_fd, POLLIN, 0};
    sockets::poll(&p, 1, 0);
  }
  long n = c.stream.try_fill();
  if (n > 0) return true;
  if (n == 0 || !would_block(errno)) {
    c.dead = true;
    return false;
  }
  if (kernel_tcp) return false;
  // Armed. A call the client finished writing while we armed may not ring:
  // redirect's prepare_sleep looks for readable bytes only before it arms,
  // and afterwards only for bytes still in flight. Look once more, now that
  // anything later is sure to ring.
  int ready = 0;
  return sockets::ioctl(c.xprt.xp_fd, FIONREAD, &ready) == 0 && ready > 0;
}

bool_t connection_recv(SVCXPRT* xprt, rpc_msg* msg) {
  connection& c = conn(xprt);
  c.served = false;
  if (c.dead) return FALSE;
  c.stream.clear_failure();
  if (c.stream.in_record() && !c.stream.skip_record()) return c.dead = true, FALSE;
  const bool by_waker = std::exchange(c.woken_by_waker, false);
  if (c.stream.buffered() == 0 && !c.resume && !take_or_arm(c, !by_waker)) return FALSE;
  c.resume = false;
  c.stream.begin_record();
  if (!xdr_callmsg(c.stream.decoder(), msg)) {
    // A call we cannot read is dropped; the record is skipped before the next
    // one. Broken framing or a broken connection ends the connection.
    failure f = c.stream.last_failure();
    if (f != failure::none && f != failure::short_record) c.dead = true;
    return FALSE;
  }
  c.xid = msg->rm_xid;
  c.served = true;
  return TRUE;
}

xprt_stat connection_stat(SVCXPRT* xprt) {
  connection& c = conn(xprt);
  if (c.dead) return XPRT_DIED;
  c.stream.clear_failure();
  if (c.stream.in_record() && !c.stream.skip_record()) {
    c.dead = true;
    return XPRT_DIED;
  }
  c.resume = true;
  if (c.stream.buffered() > 0) return XPRT_MOREREQS;
  if (c.served && c.stream.on_vmmc() && !(++c.streak % 4 == 0 && others_waiting(c))) {
    auto next_call_came = [&] {
      int ready = 0;
      return sockets::ioctl(c.xprt.xp_fd, FIONREAD, &ready) == 0 && ready > 0;
    };
    if (core::wait_until(next_call_came, core::wait_clock::time_point::max(), std::nullopt,
                         {.spin_most = watch_for_next_call}) == core::waited::done)
      return XPRT_MOREREQS;
  }
  c.served = false;
  // Before the read that arms: it arms for the wake-up descriptor from then on.
  if (!c.waker_asked && c.stream.on_vmmc()) watch_wakeups(c);
  // On kernel TCP, svc_run's poll looks for the next call, as it does for
  // libtirpc's own connections (a read here would mostly find nothing).
  if (!c.stream.on_kernel_tcp() && take_or_arm(c, c.waker.xp_ops == nullptr)) return XPRT_MOREREQS;
  c.resume = false;
  c.streak = 0;
  return c.dead ? XPRT_DIED : XPRT_IDLE;
}

bool transport_broken(const record_stream& s) {
  return s.last_failure() != failure::none && s.last_failure() != failure::short_record;
}

bool_t connection_getargs(SVCXPRT* xprt, xdrproc_t xdr_args, void* args) {
  connection& c = conn(xprt);
  XDR* in = c.stream.decoder();
  SVCAUTH& auth = SVC_XP_AUTH(xprt);
  bool ok = auth.svc_ah_ops ? SVCAUTH_UNWRAP(&auth, in, xdr_args, static_cast<caddr_t>(args))
                            : xdr_args(in, args);
  if (!ok && transport_broken(c.stream)) c.dead = true;
  return ok;
}

bool_t connection_reply(SVCXPRT* xprt, rpc_msg* msg) {
  connection& c = conn(xprt);
  if (c.dead) return FALSE;
  msg->rm_xid = c.xid;
  xdrproc_t xdr_results = nullptr;
  caddr_t results = nullptr;
  bool has_results = msg->rm_reply.rp_stat == MSG_ACCEPTED && msg->acpted_rply.ar_stat == SUCCESS;
  if (has_results) {
    xdr_results = msg->acpted_rply.ar_results.proc;
    results = msg->acpted_rply.ar_results.where;
    msg->acpted_rply.ar_results.proc = as_xdrproc(&xdr_void);
    msg->acpted_rply.ar_results.where = nullptr;
  }
  XDR* out = c.stream.encoder();
  SVCAUTH& auth = SVC_XP_AUTH(xprt);
  bool ok = xdr_replymsg(out, msg) &&
            (!has_results || (auth.svc_ah_ops ? SVCAUTH_WRAP(&auth, out, xdr_results, results)
                                              : xdr_results(out, results)));
  if (!c.stream.end_record() || transport_broken(c.stream)) c.dead = true;
  return ok && !c.dead;
}

bool_t free_args(SVCXPRT*, xdrproc_t xdr_args, void* args) {
  return free_decoded(xdr_args, args);
}

void connection_destroy(SVCXPRT* xprt) {
  connection* c = &conn(xprt);
  untrack(c);
  xprt_unregister(xprt);
  if (c->waker.xp_ops) {
    xprt_unregister(&c->waker);
    ::close(c->waker.xp_fd);
  }
  if (SVC_XP_AUTH(xprt).svc_ah_ops) SVCAUTH_DESTROY(&SVC_XP_AUTH(xprt));
  sockets::close(xprt->xp_fd);
  delete c;
}

bool_t no_control(SVCXPRT*, const u_int, void*) {
  return FALSE;
}

const struct __rpc_svcxprt::xp_ops connection_ops = {connection_recv,    connection_stat,
                                                     connection_getargs, connection_reply,
                                                     free_args,          connection_destroy};
const struct __rpc_svcxprt::xp_ops2 control_ops = {no_control};

// --- the sweeper: a safety net under the doorbells. svc_run sleeps without
// a timeout, so a wake-up lost anywhere below (a doorbell not rung, not seen)
// would leave a call unanswered for good. While connections exist, a timerfd
// wakes svc_run every 100 ms and calls found waiting in a channel are served
// through svc_getreq_common, as svc_run would have. (The sockets layer's own
// sleeps re-check on the same period.) Used from svc_run's thread only.
struct sweeper_state {
  SVCXPRT xprt{};
  SVCXPRT_EXT extension{};
  std::vector<connection*> connections;  // live connections
};
sweeper_state* sweeper = nullptr;
constexpr long sweep_period_ns = 100'000'000;

void set_sweeping(bool on) {
  itimerspec t{};
  if (on) t.it_interval = t.it_value = {0, sweep_period_ns};
  timerfd_settime(sweeper->xprt.xp_fd, 0, &t, nullptr);
}

bool_t sweeper_recv(SVCXPRT* xprt, rpc_msg*) {
  std::uint64_t expirations;
  if (::read(xprt->xp_fd, &expirations, sizeof expirations) < 0) return FALSE;
  const std::vector<connection*> all = sweeper->connections;  // a call may end a connection
  for (connection* c : all) {
    int ready = 0;
    auto& live = sweeper->connections;
    if (std::find(live.begin(), live.end(), c) == live.end()) continue;
    const int fd = c->xprt.xp_fd;
    if (sockets::ioctl(fd, FIONREAD, &ready) != 0 || ready == 0) continue;
    svc_getreq_common(fd);
  }
  return FALSE;
}

xprt_stat idle_stat(SVCXPRT*) {
  return XPRT_IDLE;
}
bool_t no_getargs(SVCXPRT*, xdrproc_t, void*) {
  return FALSE;
}
bool_t no_reply(SVCXPRT*, rpc_msg*) {
  return FALSE;
}
void never_destroyed(SVCXPRT*) {}

const struct __rpc_svcxprt::xp_ops sweeper_ops = {sweeper_recv, idle_stat, no_getargs,
                                                  no_reply,     free_args, never_destroyed};

void track(connection* c) {
  if (!sweeper) {
    int timer = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (timer < 0) return;
    sweeper = new sweeper_state;
    sweeper->xprt.xp_fd = timer;
    sweeper->xprt.xp_ops = &sweeper_ops;
    sweeper->xprt.xp_ops2 = &control_ops;
    sweeper->xprt.xp_p3 = &sweeper->extension;
    xprt_register(&sweeper->xprt);
  }
  sweeper->connections.push_back(c);
  if (sweeper->connections.size() == 1) set_sweeping(true);
}

void untrack(connection* c) {
  if (!sweeper) return;
  auto& live = sweeper->connections;
  live.erase(std::remove(live.begin(), live.end(), c), live.end());
  if (live.empty()) set_sweeping(false);
}

// --- the waker: a readable wake-up descriptor means the client wrote a
// call to an idle connection. Served through svc_getreq_common on the
// connection's own descriptor, as the sweeper does: the dispatch and
// svc_vmmc_path see the connection's SVCXPRT, never this one. (If that ends
// the connection, svc_getreq_common finds this SVCXPRT unregistered and
// stops.)

bool_t waker_recv(SVCXPRT* xprt, rpc_msg*) {
  std::uint64_t wakeups;
  (void)!::read(xprt->xp_fd, &wakeups, sizeof wakeups);
  connection& c = conn(xprt);
  const int fd = c.xprt.xp_fd;
  c.woken_by_waker = true;  // the next recv's (it may end the connection)
  svc_getreq_common(fd);
  return FALSE;
}

const struct __rpc_svcxprt::xp_ops waker_ops = {waker_recv, idle_stat, no_getargs,
                                                no_reply,   free_args, never_destroyed};

void watch_wakeups(connection& c) {
  c.waker_asked = true;
  // xprt_register ignores descriptors beyond libtirpc's table.
  const int fd = sockets::wakeup_descriptor(c.xprt.xp_fd, _rpc_dtablesize());
  if (fd < 0) return;  // the client rings over TCP, as before
  SVCXPRT& w = c.waker;
  w.xp_fd = fd;
  w.xp_ops = &waker_ops;
  w.xp_ops2 = &control_ops;
  w.xp_netid = tcp_netid;
  w.xp_p1 = &c;
  w.xp_p3 = &c.waker_extension;
  xprt_register(&w);
}

// --- the listener: a readable descriptor means a connection to accept.

bool_t listener_recv(SVCXPRT* xprt, rpc_msg*) {
  sockaddr_in peer{};
  socklen_t length = sizeof peer;
  int fd = sockets::accept(xprt->xp_fd, reinterpret_cast<sockaddr*>(&peer), &length);
  if (fd < 0) return FALSE;
  int one = 1;
  sockets::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  set_io_timeout(fd, static_cast<int>(core::setting_integer(settings::io_timeout_ms)));
  auto* c = new connection(fd);
  c->peer = peer;
  length = sizeof c->local;
  sockets::getsockname(fd, reinterpret_cast<sockaddr*>(&c->local), &length);
  SVCXPRT& x = c->xprt;
  x.xp_fd = fd;
  x.xp_ops = &connection_ops;
  x.xp_ops2 = &control_ops;
  x.xp_addrlen = sizeof peer;
  std::memcpy(&x.xp_raddr, &peer, sizeof peer);
  x.xp_rtaddr = {sizeof c->peer, sizeof c->peer, &c->peer};
  x.xp_ltaddr = {sizeof c->local, sizeof c->local, &c->local};
  x.xp_netid = tcp_netid;
  x.xp_verf.oa_base = c->verifier;
  x.xp_p1 = c;
  x.xp_p3 = &c->extension;
  xprt_register(&x);
  track(c);
  return FALSE;
}

void listener_destroy(SVCXPRT* xprt) {
  xprt_unregister(xprt);
  sockets::close(xprt->xp_fd);
  delete static_cast<listener*>(xprt->xp_p1);
}

const struct __rpc_svcxprt::xp_ops listener_ops = {listener_recv, idle_stat, no_getargs,
                                                   no_reply,      free_args, listener_destroy};

}  // namespace
}  // namespace vmmc::vrpc::detail

using namespace vmmc::vrpc::detail;
namespace sockets = vmmc::sockets;

extern "C" SVCXPRT* svc_vmmc_create(const sockaddr_in* address) {
  sockaddr_in local{};
  local.sin_family = AF_INET;
  if (address) local = *address;
  int fd = sockets::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return nullptr;
  int one = 1;
  socklen_t length = sizeof local;
  if (sockets::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      sockets::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0 ||
      sockets::listen(fd, SOMAXCONN) != 0 ||
      sockets::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) != 0 ||
      sockets::fcntl(fd, F_SETFL, O_NONBLOCK) != 0) {
    int saved = errno;
    sockets::close(fd);
    errno = saved;
    return nullptr;
  }
  auto* l = new listener;
  l->local = local;
  SVCXPRT& x = l->xprt;
  x.xp_fd = fd;
  x.xp_port = ntohs(local.sin_port);
  x.xp_ops = &listener_ops;
  x.xp_ops2 = &control_ops;
  x.xp_ltaddr = {sizeof l->local, sizeof l->local, &l->local};
  x.xp_netid = tcp_netid;
  x.xp_p1 = l;
  x.xp_p3 = &l->extension;
  xprt_register(&x);
  return &x;
}

extern "C" const char* svc_vmmc_path(const SVCXPRT* xprt) {
  if (!xprt) return nullptr;
  if (xprt->xp_ops == &listener_ops) return "listener";
  if (xprt->xp_ops != &connection_ops) return nullptr;
  connection& c = *static_cast<connection*>(xprt->xp_p1);
  c.path = path_of(c.xprt.xp_fd);
  return c.path.c_str();
}
