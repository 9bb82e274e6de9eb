// nx/src/runtime.cc: matching, sending, receiving and waiting (see runtime.h).
#include "runtime.h"

#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>

#include "parse.h"
#include "vmmc/core/host.h"
#include "vmmc/core/progress.h"
#include "vmmc/core/settings.h"

namespace vmmc::nx::detail {
namespace {

using clock = std::chrono::steady_clock;

// clang-format off
const core::setting start_timeout_ms {"nx", "start_timeout_ms", core::setting_type::integer,
  "30000", "how long start-up waits for the other nodes"};
// clang-format on
const core::setting print_stats{
    "nx", "stats", core::setting_type::boolean, "0",
    "at exit, print per peer the path and the bytes received by copy and by redirection"};
// clang-format off
const core::setting remote{"nx", "remote", core::setting_type::string, "auto",
  "nodes on another host: 'auto' talks over kernel TCP unless an RDMA device (verbs, efa, cxi, "
  "opx) lets the fabric beat it (libfabric's tcp provider cannot: it is TCP underneath), "
  "'fabric' always over the fabric, 'tcp' always over kernel TCP"};
// clang-format on
const core::setting table[] = {start_timeout_ms, print_stats, remote};

struct registrar {
  registrar() { core::register_settings(table); }
} const register_once;

constexpr std::size_t header_bytes = sizeof(wire::header);
constexpr std::size_t gather_max = 4096;  // header and payload copied in one write

// The CPUs this process may run on, as "0,1,5".
std::string allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::string list;
  if (::sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) list += (list.empty() ? "" : ",") + std::to_string(c);
  return list.empty() ? "0" : list;
}

// What the NX calls report of a message from node `from`.
info message_info(const wire::header& h, long from) {
  return {static_cast<long>(h.type), static_cast<long>(h.length), from, static_cast<long>(h.ptype)};
}

// A spin-wait hint between polls of memory another core writes.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

const char* describe(int code) {
  switch (code) {
    case EQDRVERR:
      return "transport failure";
    case EQPBUF:
      return "invalid buffer pointer";
    case EQBLEN:
      return "buffer length exceeds allocation";
    case EQLEN:
      return "invalid length";
    case EQTIME:
      return "time limit exceeded";
    case EQMSGLONG:
      return "message longer than the receive buffer";
    case EQPID:
      return "invalid ptype";
    case EQNODE:
      return "invalid node number";
    case EQTYPE:
      return "invalid message type";
    case EQMID:
      return "invalid message id";
    case EQHND:
      return "invalid handler";
    case EQNOPROC:
      return "no process slot";
    case EQUSEPID:
      return "ptype already in use";
    case EQPARAM:
      return "invalid parameter";
    case EQMEM:
      return "not enough memory";
    case EQNOMID:
      return "too many requests";
    case EQSET:
      return "ptype already set";
    case EQNOSET:
      return "no ptype defined";
    case EQBADNODE:
      return "node not responding (it died or its link broke)";
    default:
      return "unknown error";
  }
}

[[noreturn]] void fatal(const char* call, int code) {
  runtime* rt = runtime::current();
  long node = rt ? rt->node() : -1L;
  long peer = rt ? rt->failed_node() : -1L;
  if (peer >= 0 && code == EQBADNODE && rt->failed_node_ended())
    std::fprintf(stderr,
                 "nx: node %ld: %s: node %ld ended (it exited) while this call waited for it\n",
                 node, call, peer);
  else if (peer >= 0 && (code == EQBADNODE || code == EQDRVERR))
    std::fprintf(stderr, "nx: node %ld: %s: %s (node %ld)\n", node, call, describe(code), peer);
  else
    std::fprintf(stderr, "nx: node %ld: %s: %s\n", node, call, describe(code));
  std::fflush(stderr);
  std::_Exit(1);  // no atexit: peers must see this node die, not end in order
}

// ---------------------------------------------------------------- start-up

runtime& runtime::start_instance() {
  auto* r = new runtime;
  current_ = r;
  if (!r->start()) {
    std::fprintf(stderr, "nx: cannot join the job\n");
    std::_Exit(1);
  }
  std::atexit(finish_at_exit);
  return *r;
}

bool runtime::start() {
  boot_ = detect_bootstrap();
  if (!boot_) return false;
  node_ = boot_->rank;
  nodes_ = boot_->size;
  if (node_ < 0 || node_ >= nodes_) return false;

  // A job that spans hosts is reached where other hosts reach this one,
  // with no setting (issue 15, items 1 and 5); one on a single host stays
  // on loopback, out of the network's reach.
  const std::string reached_at =
      boot_->spans_hosts() ? core::address_other_hosts_reach() : std::string();
  // Peers on other hosts reach this node's TCP lanes at the same address.
  // A node that cannot listen (or is told not to) offers none, and such
  // pairs stay on the fabric.
  std::optional<tcp_listener> lanes;
  const std::string lane_key = tcp_key();
  if (boot_->spans_hosts() && core::kernel_tcp_to_other_hosts(core::setting_string(remote))) {
    auto l = tcp_listener::open(reached_at);
    if (l)
      lanes.emplace(std::move(*l));
    else
      std::fprintf(stderr, "nx: no kernel TCP lanes on %s (%s): other hosts over the fabric\n",
                   reached_at.c_str(), l.error().message().c_str());
  }
  // At the debug level each node says where it takes kernel TCP and which
  // path each pair took.
  const bool say_paths = core::setting_integer(core::settings::log_level) >= 3;
  if (lanes && say_paths)
    std::fprintf(stderr, "nx: node %ld takes kernel TCP from other hosts at %s\n", node_,
                 lanes->where().c_str());
  // The process's context, shared with the sockets layer (an NX code that
  // also talks TCP under the interposer runs one). Its providers open on
  // demand: this host's pairs take the mapped path, which needs none, and
  // other hosts' either take TCP lanes (the tcp provider's start saved: a
  // 2-node job across hosts 0.48 -> 0.42 s, Open MPI's own 0.40 s; a peer
  // that offers no lane is refused below) or the fabric, opened here, before
  // the mailboxes and channels it must reach.
  auto ctx = core::context::shared();
  if (!ctx) {
    std::fprintf(stderr, "nx: %s\n", ctx.error().message().c_str());
    return false;
  }
  context_ = std::move(*ctx);
  if (boot_->spans_hosts() && !lanes)
    if (status opened = context_->open_remote_paths(reached_at); !opened) {
      std::fprintf(stderr, "nx: no fabric to other hosts: %s\n", opened.error().message().c_str());
      return false;
    }
  bell_ = std::make_unique<doorbell>(boot_->job, node_);
  peers_.resize(static_cast<std::size_t>(nodes_));

  // "<host> <pid> <cpus> <context address> <channel descriptor or -> x N <mailbox or -> x N
  // <TCP lane address or -> <lane key>", the host as core defines it (host names
  // repeat across containers).
  const core::host_identity host = core::host_identity::local();
  const std::string my_cpus = allowed_cpus();
  std::string blob =
      host.text() + " " + std::to_string(::getpid()) + " " + my_cpus + " " + context_->address();
  std::string mailboxes;
  for (long j = 0; j < nodes_; ++j) {
    if (j == node_) {
      blob += " -";
      mailboxes += " -";
      continue;
    }
    auto mail = std::make_unique<redirect::mailbox>(*context_);
    if (status s = mail->create(); !s) {
      std::fprintf(stderr, "nx: mailbox: %s\n", s.error().message().c_str());
      return false;
    }
    mailboxes += " " + mail->name();
    peers_[static_cast<std::size_t>(j)].mail = std::move(mail);
    redirect::channel_options o;
    o.ring_doorbell = [this, j] { bell_->ring(j); };
    auto ch = redirect::channel::create(*context_, o);
    if (!ch) {
      std::fprintf(stderr, "nx: channel: %s\n", ch.error().message().c_str());
      return false;
    }
    blob += " " + ch->descriptor();
    peers_[static_cast<std::size_t>(j)].link.use(std::move(*ch));
  }
  blob += mailboxes;
  blob += " " + (lanes ? lanes->where() : std::string("-")) + " " + lane_key;
  std::vector<std::string> all = boot_->all_gather(blob);
  if (all.size() != peers_.size()) return false;

  // Each peer's record, parsed once: what this node needs of it.
  std::vector<startup_record> records(peers_.size());
  std::vector<bool> tcp_peers(peers_.size());
  for (long j = 0; j < nodes_; ++j) {
    if (j == node_) continue;
    auto r = parse_startup_record(all[static_cast<std::size_t>(j)], nodes_, node_);
    if (!r) {
      std::fprintf(stderr, "nx: node %ld sent a malformed start-up record\n", j);
      return false;
    }
    peer& p = peers_[static_cast<std::size_t>(j)];
    auto peer_host = core::host_identity::parse(r->host);
    p.remote = !peer_host || !peer_host->same_host(host);
    p.shares_cpus = peer_host && peer_host->same_kernel(host);
    p.pid = static_cast<pid_t>(r->pid);
    // A pair on two hosts that both offer TCP lanes takes one; the channel
    // and mailbox made for it before the records came go unused.
    if (p.remote && lanes && r->lane != "-") {
      p.link.drop_channel();
      p.mail.reset();
      tcp_peers[static_cast<std::size_t>(j)] = true;
    }
    if (say_paths)
      std::fprintf(stderr, "nx: node %ld <-> node %ld: %s\n", node_, j,
                   tcp_peers[static_cast<std::size_t>(j)] ? "kernel TCP (another host, and the "
                                                            "fabric cannot beat kernel TCP to it)"
                   : p.remote                             ? "the fabric (another host)"
                                                          : "this host's path");
    records[static_cast<std::size_t>(j)] = std::move(*r);
    // This node's mailboxes and channels were made for the lanes it
    // offered, with no fabric open to reach them by.
    if (p.remote && !tcp_peers[static_cast<std::size_t>(j)] && lanes) {
      std::fprintf(stderr,
                   "nx: node %ld is on another host (another kernel or network namespace), the "
                   "pair takes the fabric (VMMC_NX_REMOTE is 'fabric' there, or it could not "
                   "listen), and this node, taking kernel TCP from other hosts, opened no "
                   "fabric: set the same VMMC_NX_REMOTE on every node\n",
                   j);
      return false;
    }
  }

  // More nodes on this kernel than CPUs they may run on between them (a CPU
  // set, taskset, more nodes than cores; network namespaces do not count):
  // waiters must yield, not spin. Otherwise each node has a core of its own
  // (launchers bind one node to a core): spinning plainly pays. Core's spin
  // policy, which every wait of this process follows, is told.
  std::set<int> host_cpus;
  add_cpus(my_cpus, host_cpus);
  long on_host = 1;
  for (long j = 0; j < nodes_; ++j) {
    if (j == node_ || !peers_[static_cast<std::size_t>(j)].shares_cpus) continue;
    ++on_host;
    add_cpus(records[static_cast<std::size_t>(j)].cpus, host_cpus);
  }
  oversubscribed_ = on_host > static_cast<long>(std::max<std::size_t>(1, host_cpus.size()));
  core::set_peers_share_cpus(oversubscribed_);

  auto deadline = clock::now() + std::chrono::milliseconds(core::setting_integer(start_timeout_ms));
  // The lower-numbered node of each pair connects; the other accepts.
  for (long pass = 0; pass < 2; ++pass) {
    if (pass == 1 && lanes) {
      std::vector<bool> expected(peers_.size());
      for (long j = 0; j < node_; ++j)
        expected[static_cast<std::size_t>(j)] = tcp_peers[static_cast<std::size_t>(j)];
      auto accepted = lanes->accept_nodes(lane_key, expected, deadline);
      if (!accepted) {
        std::fprintf(stderr, "nx: nodes on other hosts did not connect: %s\n",
                     accepted.error().message().c_str());
        return false;
      }
      for (long j = 0; j < node_; ++j)
        if (expected[static_cast<std::size_t>(j)])
          peers_[static_cast<std::size_t>(j)].link.use(
              std::move((*accepted)[static_cast<std::size_t>(j)]));
    }
    for (long j = 0; j < nodes_; ++j) {
      if (j == node_) continue;
      peer& p = peers_[static_cast<std::size_t>(j)];
      const startup_record& r = records[static_cast<std::size_t>(j)];
      if (tcp_peers[static_cast<std::size_t>(j)]) {
        if (pass == 1 || node_ > j) continue;
        auto stream = tcp_connect(r.lane, node_, r.lane_key, deadline);
        if (!stream) {
          std::fprintf(stderr, "nx: connect to node %ld at %s: %s\n", j, r.lane.c_str(),
                       stream.error().message().c_str());
          return false;
        }
        p.link.use(std::move(*stream));
        continue;
      }
      if (pass == 1) {
        if (status s = p.mail->attach(r.address, r.mailbox); !s) {
          std::fprintf(stderr, "nx: mailbox of node %ld: %s\n", j, s.error().message().c_str());
          return false;
        }
      }
      if (pass == 0 && node_ < j) {
        if (status s = p.link.channel().connect(r.descriptor, ""); !s) {
          std::fprintf(stderr, "nx: connect to node %ld: %s\n", j, s.error().message().c_str());
          return false;
        }
      } else if (pass == 1 && node_ > j) {
        auto hello = p.link.channel().accept_peer("");
        auto connected = [&] {
          if (hello.is(errc::would_block)) hello = p.link.channel().accept_peer("");
          return !hello.is(errc::would_block);
        };
        auto how = core::wait_until(connected, deadline,
                                    core::napping(std::chrono::microseconds(100)), {.spin = false});
        if (!hello) {
          std::fprintf(
              stderr, "nx: node %ld did not connect: %s\n", j,
              how == core::waited::timed_out ? "timed out" : hello.error().message().c_str());
          return false;
        }
      }
    }
  }
  // Every node waits until all the others imported what they need of it
  // (channels, mailboxes): the exporter must be there to answer an import,
  // so a node that sent its messages and exited at once broke a slower
  // node's start-up (about 1 run in 9 of two nodes).
  for (long j = 0; j < nodes_; ++j)
    if (j != node_) send_control(j, wire::control_type::ready);
  bool late = false;
  int e =
      wait_until([&] { return ready_peers_ == nodes_ - 1 || (late = clock::now() > deadline); });
  for (long j = 0; !e && late && j < nodes_; ++j) {
    peer& p = peers_[static_cast<std::size_t>(j)];
    if (j != node_ && !p.ready) {
      std::fprintf(stderr, "nx: node %ld did not finish its start-up\n", j);
      return false;
    }
  }
  return e == 0;
}

void runtime::finish_at_exit() {
  if (current_) current_->finish();
}

// An orderly end: what is queued goes out (bounded), then each stream ends,
// so that peers tell this exit from a crash.
void runtime::finish() {
  if (dying_) return;
  stop_handler_thread();
  dying_ = true;
  // The end goes behind everything sent to each peer: once it takes it in,
  // it has all of our messages, and its waits for more from us fail.
  for (long j = 0; j < nodes_; ++j)
    if (j != node_ && !peers_[static_cast<std::size_t>(j)].closed)
      send_control(j, wire::control_type::end);
  auto deadline = clock::now() + std::chrono::seconds(30);
  (void)wait_until([&] {
    if (clock::now() > deadline) return true;
    for (const peer& p : peers_)
      if (!p.queue.empty()) return false;
    return true;
  });
  for (peer& p : peers_)
    if (p.link.open()) p.link.close_write();
  if (core::setting_bool(print_stats)) {
    for (std::size_t j = 0; j < peers_.size(); ++j) {
      if (!peers_[j].link.open()) continue;
      redirect::channel_counters c = peers_[j].link.stats();
      std::fprintf(stderr,
                   "nx: node %ld <- node %zu: %s, %llu bytes copied, %llu redirected, %llu "
                   "doorbells rung\n",
                   node_, j, peers_[j].link.path().c_str(),
                   static_cast<unsigned long long>(c.bytes_copied),
                   static_cast<unsigned long long>(c.bytes_redirected),
                   static_cast<unsigned long long>(c.doorbells_rung));
    }
  }
  if (boot_) boot_->finish();
}

runtime::~runtime() = default;

// ---------------------------------------------------------------- requests

request* runtime::new_request(bool is_send, bool tracked) {
  request* r;
  if (spare_.empty()) {
    r = new request;
  } else {
    r = spare_.back();
    spare_.pop_back();
  }
  r->is_send = is_send;
  if (tracked) {
    r->mid = ++next_mid_;
    requests_.emplace(r->mid, r);
  }
  return r;
}

void runtime::recycle(request* r) {
  if (r->mid) requests_.erase(r->mid);
  if (r->handler || r->handlerx) --with_handler_;
  *r = request{};
  spare_.push_back(r);
}

request* runtime::find(long mid) {
  auto it = requests_.find(mid);
  return it == requests_.end() || it->second->released ? nullptr : it->second;
}

void runtime::release(request* r) {
  r->released = true;
  if (r->done) recycle(r);
}

bool runtime::cancel(request* r) {
  if (r->done) return false;
  if (!r->is_send) {
    auto it = std::find(posted_.begin(), posted_.end(), r);
    if (it == posted_.end()) return false;  // its message is arriving
    posted_.erase(it);
    r->done = true;
    return true;
  }
  // A send is withdrawn from the queues it has not started in; one already
  // started must finish (the stream cannot skip bytes).
  for (peer& p : peers_) {
    for (auto it = p.queue.begin(); it != p.queue.end();) {
      if (it->owner == r && it->sent == 0) {
        it = p.queue.erase(it);
        --r->sends_left;
      } else {
        ++it;
      }
    }
  }
  if (r->sends_left > 0) return false;
  r->done = true;
  return true;
}

void runtime::abandon(request* r) {
  if (r->done || r->is_send || cancel(r)) return;
  for (peer& p : peers_) {
    if (p.receiver != r) continue;
    if (p.posting) {
      // Posted on the fabric path: take the post back. If the sender had
      // already taken it up, the channel cuts the buffer off, and how much of
      // the stream went there is unknown: nothing more is read from it.
      auto withdrawn = p.link.channel().withdraw_post();
      p.posting = false;
      if (!withdrawn || !*withdrawn) p.unreadable = true;
    }
    p.receiver = nullptr;
    p.destination = nullptr;
    p.destination_left = 0;
    r->done = true;
    r->error = EQDRVERR;
  }
}

// ---------------------------------------------------------------- sending

int runtime::send(space where, long type, const void* data, long count, long node,
                  request** async) {
  if (type < 0 || type > wire::max_type) return EQTYPE;
  if (int e = check_buffer(data, count)) return e;
  if (node < -1 || node >= nodes_) return EQNODE;
  if (failure_) return failure_;
  auto bytes = static_cast<const std::byte*>(data);
  auto length = static_cast<std::size_t>(count);
  auto header = wire::make_header(static_cast<std::uint8_t>(where), type, count, ptype);

  request* r = async ? new_request(true, true) : nullptr;
  long queued = 0;
  for (long j = node == -1 ? 0 : node; j < (node == -1 ? nodes_ : node + 1); ++j) {
    if (j == node_) {
      if (node == -1) continue;
      deliver_local(where, type, bytes, length);
      continue;
    }
    if (int e = send_to(j, header, bytes, length, r, queued)) return e;
  }
  if (r) {
    if (r->sends_left == 0) r->done = true;
    *async = r;
    return 0;
  }
  if (queued == 0) return 0;
  // Blocking: our entries leave the queues once the channel took them.
  return wait_until([&] {
    for (const peer& p : peers_)
      for (const outgoing& o : p.queue)
        if (!o.owner) return false;
    return true;
  });
}

// One message toward node j: into its mailbox when small and a slot is free
// (done at once), else onto the stream, written now when nothing is queued
// ahead of it and a blocking sender waits.
int runtime::send_to(long j, wire::header& header, const std::byte* data, std::size_t length,
                     request* r, long& queued) {
  peer& p = peers_[static_cast<std::size_t>(j)];
  if (p.ended) return 0;  // it reads nothing more: dropped
  header.sequence = p.next_sequence++;
  if (length <= wire::mailbox_payload_max && !p.closed && p.mail) {
    result<bool> placed = p.mail->try_send(&header, sizeof header, data, length);
    if (placed && *placed) {
      if (p.mail->peer_wants_wakeup()) bell_->ring(j);
      return 0;
    }
    if (!placed) return write_failed(p, placed.error());
  }
  if (!r && p.queue.empty()) {
    outgoing o{nullptr, header, data, length, 0};
    if (int e = write_some(p, o)) return e;
    if (o.sent == header_bytes + length) return 0;
    p.queue.push_back(o);
    ++queued;
    return 0;
  }
  p.queue.push_back({r, header, data, length, 0});
  ++queued;
  if (r) ++r->sends_left;
  return push(p);
}

int runtime::push(peer& p) {
  while (!p.queue.empty()) {
    outgoing& o = p.queue.front();
    if (int e = write_some(p, o)) return e;
    if (o.sent < header_bytes + o.length) return 0;
    request* owner = o.owner;
    p.queue.pop_front();
    if (owner) sent_one(owner);
  }
  return 0;
}

int runtime::write_some(peer& p, outgoing& o) {
  const std::size_t total = header_bytes + o.length;
  while (o.sent < total) {
    result<std::size_t> n = errc::would_block;
    if (o.sent < header_bytes && p.link.gathers()) {
      n = p.link.write(reinterpret_cast<const std::byte*>(&o.header) + o.sent,
                       header_bytes - o.sent, o.data, o.length);
    } else if (o.sent == 0 && total <= gather_max) {
      std::byte both[gather_max];
      std::memcpy(both, &o.header, header_bytes);
      if (o.length) std::memcpy(both + header_bytes, o.data, o.length);
      n = p.link.write(both, total);
    } else if (o.sent < header_bytes) {
      n = p.link.write(reinterpret_cast<const std::byte*>(&o.header) + o.sent,
                       header_bytes - o.sent);
    } else {
      n = p.link.write(o.data + (o.sent - header_bytes), total - o.sent);
    }
    if (n) {
      o.sent += *n;
      continue;
    }
    if (n.is(errc::would_block)) return 0;
    if (int e = write_failed(p, n.error())) return e;
    o.sent = total;  // the peer ended in order: nobody will read it
    return 0;
  }
  return 0;
}

// A write toward `p` failed: 0 when the peer ended in order (what we send is
// dropped, as nobody will read it), else the job's failure code.
int runtime::write_failed(peer& p, std::error_code error) {
  if (p.closed || p.link.peer_closed()) {
    p.closed = true;
    return 0;
  }
  // On TCP a refused write says only that the peer's kernel takes no more:
  // whether the node ended in order (its end message still to be read) or
  // died, the read side tells (check_peers). What we sent is dropped.
  if (p.link.tcp()) return 0;
  return fail_job(&p - peers_.data(), error == errc::peer_gone ? EQBADNODE : EQDRVERR);
}

int runtime::fail_job(long node, int code) {
  failed_node_ = node;
  failed_node_ended_ = false;
  return failure_ = code;
}

void runtime::send_control(long to, wire::control_type what) {
  auto h = wire::make_header(wire::control_space, static_cast<long>(what), 0, ptype);
  long queued = 0;
  (void)send_to(to, h, nullptr, 0, nullptr, queued);  // a failure is the job's: waits see it
}

void runtime::on_control(long from, long what) {
  peer& p = peers_[static_cast<std::size_t>(from)];
  if (what == static_cast<long>(wire::control_type::ready) && !p.ready) {
    p.ready = true;
    ++ready_peers_;
  } else if (what == static_cast<long>(wire::control_type::end)) {
    peer_ended(from);
  }
}

// Node j ended in order and everything it sent has been taken in: receives
// that only it could satisfy fail, and what is still queued toward it is
// dropped (it reads nothing more).
void runtime::peer_ended(long j) {
  peer& p = peers_[static_cast<std::size_t>(j)];
  if (p.ended) return;
  p.ended = p.closed = true;
  ++ended_peers_;
  last_ended_ = j;
  for (outgoing& o : p.queue)
    if (o.owner) sent_one(o.owner);
  p.queue.clear();
  for (auto it = posted_.begin(); it != posted_.end();) {
    request* r = *it;
    if (r->sel.node != j || r->handler || r->handlerx) {
      ++it;
      continue;
    }
    it = posted_.erase(it);
    fail_receive(r, j);
  }
}

long runtime::ended_sender_slow(const selector& sel) const {
  if (sel.node >= 0)
    return sel.node != node_ && peers_[static_cast<std::size_t>(sel.node)].ended ? sel.node : -1;
  return ended_peers_ == nodes_ - 1 ? last_ended_ : -1;
}

int runtime::blame_ended(long j) {
  if (!failure_) {
    failed_node_ = j;
    failed_node_ended_ = true;
  }
  return EQBADNODE;
}

void runtime::fail_receive(request* r, long ended) {
  completed_ = true;
  r->error = blame_ended(ended);
  r->done = true;
  if (r->released) recycle(r);
}

void runtime::sent_one(request* owner) {
  if (--owner->sends_left > 0) return;
  owner->done = true;
  if (owner->handler || owner->handlerx)
    handlers_due_.push_back(owner);
  else if (owner->released)
    recycle(owner);
}

void runtime::notify_sent(request* r, const request& how, const info& what) {
  r->handler = how.handler;
  r->handlerx = how.handlerx;
  r->hparam = how.hparam;
  r->got = what;
  r->released = true;  // the handler owns completion: no msgwait
  if (r->done) handlers_due_.push_back(r);
  serve_handlers();
}

// ---------------------------------------------------------------- receiving

int runtime::check_receive(const selector& sel, const void* buffer, long count) const {
  if (sel.type < -1 || sel.type > 0x7fffffffL) return EQTYPE;
  if (int e = check_buffer(buffer, count)) return e;
  if (sel.node < -1 || sel.node >= nodes_) return EQNODE;
  if (sel.ptype < -1) return EQPID;
  return 0;
}

int runtime::post_receive(const selector& sel, void* buffer, long count, request*& out,
                          const request* how, bool tracked) {
  if (int e = check_receive(sel, buffer, count)) return e;
  request* r = new_request(false, tracked);
  r->sel = sel;
  r->buffer = static_cast<std::byte*>(buffer);
  r->capacity = static_cast<std::size_t>(count);
  if (how) {
    r->user_info = how->user_info;
    r->handler = how->handler;
    r->handlerx = how->handlerx;
    r->hparam = how->hparam;
    if (r->handler || r->handlerx) serve_handlers();
  }
  out = r;
  // Messages already taken in come first; one still in a mailbox or ring is
  // younger than all of them and is matched when progress takes it in.
  for (auto it = arrivals_.begin(); it != arrivals_.end(); ++it) {
    if (!sel.matches(it->where, it->what)) continue;
    std::size_t n = std::min(it->received, r->capacity);
    if (n) std::memcpy(r->buffer, it->data.data(), n);
    if (it->complete) {
      complete_receive(r, it->what, it->where);
    } else {
      // Still arriving: the rest of the payload goes straight to the buffer.
      peer& p = peers_[static_cast<std::size_t>(it->what.node)];
      p.pending = nullptr;
      bind(p, r, it->received);
    }
    arrivals_.erase(it);
    return 0;
  }
  // From a node that ended: nothing more will come (from any node: this
  // node may still send it to itself).
  if (long j = ended_sender(sel); j >= 0 && sel.node >= 0 && !r->handler && !r->handlerx) {
    fail_receive(r, j);
    return 0;
  }
  posted_.push_back(r);
  return 0;
}

void runtime::bind(peer& p, request* r, std::size_t already) {
  p.receiver = r;
  std::size_t room = r->capacity > already ? r->capacity - already : 0;
  p.destination = room ? r->buffer + already : nullptr;
  p.destination_left = std::min(room, p.body_left);
}

void runtime::progress() {
  completed_ = false;
  for (long j = 0; j < nodes_; ++j) {
    if (j == node_) continue;
    peer& p = peers_[static_cast<std::size_t>(j)];
    if (!p.queue.empty()) (void)push(p);
    if (!p.unreadable) drain(j);
    if (completed_) return;  // a waiter may be satisfied: let it look first
  }
}

void runtime::drain(long from) {
  peer& p = peers_[static_cast<std::size_t>(from)];
  lane& ch = p.link;
  for (;;) {
    if (completed_) return;
    if (!p.in_body) {
      // The next message is in the mailbox or at the head of the stream:
      // whichever holds the sequence number we expect.
      if (take_mail(from)) continue;
      // Only this peer's failure stops its stream: what the others sent
      // before a node died is still theirs to deliver.
      if (p.unreadable) return;
      if (p.header_got < header_bytes) {
        std::size_t ready = ch.readable();
        if (ready == 0) return;
        if (p.header_got == 0 && ready > header_bytes && take_whole(from, ready)) continue;
        p.header_got += ch.read(p.header + p.header_got, header_bytes - p.header_got);
        if (p.header_got < header_bytes) return;
      }
      wire::header h;
      std::memcpy(&h, p.header, header_bytes);
      if (!wire::valid(h)) {
        p.unreadable = true;
        fail_job(from, EQDRVERR);
        return;
      }
      if (h.sequence != p.expected) return;  // a mailbox message comes first
      p.header_got = 0;
      begin_message(from, h);
      continue;
    }
    if (p.body_left == 0) {
      finish_message(p);
      continue;
    }
    std::size_t got;
    if (p.posting) {
      // The receive buffer is posted: the sender places the payload there.
      auto r = ch.channel().poll_post();
      if (r.is(errc::would_block)) return;
      p.posting = false;
      if (!r) return;  // the peer is gone: check_peers() reports it
      got = r->total();
      p.destination += got;
      p.destination_left -= got;
    } else if (p.destination_left > 0) {
      // A large payload bound for a posted receive: on the fabric path post
      // the user's buffer, which stays open across progress calls until the
      // sender has filled it (the channel decides whether posting pays).
      if (p.receiver && !ch.tcp()) {
        auto posted = ch.channel().post(p.destination, p.destination_left);
        if (posted && *posted) {
          p.posting = true;
          continue;
        }
      }
      got = ch.read(p.destination, p.destination_left);
      p.destination += got;
      p.destination_left -= got;
    } else {
      if (scratch_.size() < (64u << 10)) scratch_.resize(64u << 10);
      got = ch.read(scratch_.data(), std::min(p.body_left, scratch_.size()));
    }
    if (got == 0) return;
    p.body_left -= got;
    if (p.pending) p.pending->received += got;
  }
}

// A small message that is all there is taken in one read (one credit
// update instead of two) and copied on from a staging buffer.
bool runtime::take_whole(long from, std::size_t ready) {
  peer& p = peers_[static_cast<std::size_t>(from)];
  wire::header h;
  p.link.read(&h, header_bytes, false);
  const std::size_t total = header_bytes + static_cast<std::size_t>(h.length);
  if (!wire::valid(h) || total > gather_max || total > ready || h.sequence != p.expected)
    return false;
  std::byte staging[gather_max];
  p.link.read(staging, total);
  deliver_whole(from, h, staging + header_bytes);
  return true;
}

// A message whose payload is all at hand: matched, copied, completed.
void runtime::deliver_whole(long from, const wire::header& h, const std::byte* payload) {
  peer& p = peers_[static_cast<std::size_t>(from)];
  begin_message(from, h);
  if (p.destination_left) std::memcpy(p.destination, payload, p.destination_left);
  if (p.pending) p.pending->received = p.body_left;
  p.body_left = 0;
  finish_message(p);
}

// Inline: it is on the polling path of every receive.
inline bool runtime::next_mail(long from, wire::header& h, const std::byte*& payload) {
  peer& p = peers_[static_cast<std::size_t>(from)];
  if (!p.mail) return false;
  const redirect::mailbox::message m = p.mail->next();
  if (!m) {
    if (p.mail->broken()) unreadable_mail(from);
    return false;
  }
  if (m.length < sizeof h) return unreadable_mail(from);
  std::memcpy(&h, m.data, sizeof h);
  if (h.sequence != p.expected) return false;
  if (!wire::valid_in_mailbox(h) || m.length != sizeof h + static_cast<std::size_t>(h.length))
    return unreadable_mail(from);
  payload = m.data + sizeof h;
  return true;
}

bool runtime::unreadable_mail(long from) {
  peers_[static_cast<std::size_t>(from)].unreadable = true;
  fail_job(from, EQDRVERR);
  return false;
}

// The next message when it waits in the mailbox.
bool runtime::take_mail(long from) {
  wire::header h;
  const std::byte* payload;
  if (!next_mail(from, h, payload)) return false;
  deliver_whole(from, h, payload);
  peers_[static_cast<std::size_t>(from)].mail->consume();
  return true;
}

void runtime::begin_message(long from, const wire::header& h) {
  peer& p = peers_[static_cast<std::size_t>(from)];
  ++p.expected;
  p.in_body = true;
  p.where = static_cast<space>(h.space);
  p.current = message_info(h, from);
  p.body_left = static_cast<std::size_t>(h.length);
  p.receiver = nullptr;
  p.pending = nullptr;
  p.destination = nullptr;
  p.destination_left = 0;
  if (p.where == space::control) return on_control(from, p.current.type);
  for (auto it = posted_.begin(); it != posted_.end(); ++it) {
    if ((*it)->sel.matches(p.where, p.current)) {
      request* r = *it;
      posted_.erase(it);
      bind(p, r, 0);
      return;
    }
  }
  if (p.where == space::user && (h.type & NX_FORCE_TYPE)) return;  // nobody posted: dropped
  arrival& a = arrivals_.emplace_back();
  a.where = p.where;
  a.what = p.current;
  a.data.resize(p.body_left);
  p.pending = &a;
  p.destination = a.data.data();
  p.destination_left = p.body_left;
}

void runtime::finish_message(peer& p) {
  p.in_body = false;
  if (p.receiver) complete_receive(p.receiver, p.current, p.where);
  if (p.pending) p.pending->complete = true;
  p.receiver = nullptr;
  p.pending = nullptr;
}

void runtime::complete_receive(request* r, const info& m, space) {
  completed_ = true;
  r->got = m;
  r->error = static_cast<std::size_t>(m.count) > r->capacity ? EQMSGLONG : 0;
  r->done = true;
  m.store(r->user_info);
  if (r->handler || r->handlerx) {
    handlers_due_.push_back(r);
  } else if (r->released) {
    recycle(r);
  }
}

void runtime::deliver_local(space where, long type, const std::byte* data, std::size_t length) {
  info m{type, static_cast<long>(length), node_, ptype};
  for (auto it = posted_.begin(); it != posted_.end(); ++it) {
    request* r = *it;
    if (!r->sel.matches(where, m)) continue;
    posted_.erase(it);
    if (length) std::memcpy(r->buffer, data, std::min(length, r->capacity));
    complete_receive(r, m, where);
    return;
  }
  if (where == space::user && (type & NX_FORCE_TYPE)) return;
  arrival& a = arrivals_.emplace_back();
  a.where = where;
  a.what = m;
  a.data.assign(data, data + length);
  a.received = length;
  a.complete = true;
}

int runtime::probe(const selector& sel, bool block, bool& found, info& out) {
  found = false;
  if (int e = check_receive(sel, nullptr, 0)) return e;
  auto look = [&] {
    for (const arrival& a : arrivals_) {
      if (sel.matches(a.where, a.what)) {
        out = a.what;
        return found = true;
      }
    }
    return false;
  };
  progress();
  if (look() || !block) return failure_;
  if (int e = wait_until([&] { return look() || ended_sender(sel) >= 0; })) return e;
  return found ? 0 : blame_ended(ended_sender(sel));
}

int runtime::receive(const selector& sel, void* buffer, long count, long* user_info, info& got) {
  if (int e = check_receive(sel, buffer, count)) return e;
  int error = 0;
  if (receive_from_mailbox(sel, static_cast<std::byte*>(buffer), static_cast<std::size_t>(count),
                           got, error)) {
    got.store(user_info);
    return error;
  }
  request how;
  how.user_info = user_info;
  request* r = nullptr;
  if (int e = post_receive(sel, buffer, count, r, &how, false)) return e;
  return await_receive(r, &got);
}

int runtime::await_receive(request* r, info* got) {
  int e = wait(r);
  if (!r->done)
    abandon(r);  // the buffer is the caller's again: it takes no later message
  else if (got)
    *got = r->got;
  release(r);
  return e;
}

// The fast path of a blocking receive, for a node with nothing pending: no
// message taken in but unclaimed, no other receive posted, no stream
// message half read or queued to send. It polls the mailboxes briefly and
// takes the next message if it is there and matches; anything else (a
// stream message next, one that does not match, a quiet peer) is left to
// the general path. A full progress pass per poll is slow to notice an
// arrival, and a poll without a pause in between slows the writer's
// ownership request for the line down: 0-byte one-way 0.35 -> 0.26 us.
bool runtime::receive_from_mailbox(const selector& sel, std::byte* buffer, std::size_t capacity,
                                   info& got, int& error) {
  if (!arrivals_.empty() || !posted_.empty() || !handlers_due_.empty() || failure_ ||
      oversubscribed_)
    return false;
  for (int round = 0; round < 100; ++round) {  // ~2-4 us, then the general path
    for (long j = 0; j < nodes_; ++j) {
      if (j == node_) continue;
      peer& p = peers_[static_cast<std::size_t>(j)];
      if (p.in_body || p.header_got || !p.queue.empty()) return false;
      wire::header h;
      const std::byte* payload;
      if (!next_mail(j, h, payload)) {
        // A stream message (next in sequence, or another one) or a failure.
        if (failure_ || p.link.readable()) return false;
        continue;
      }
      const auto length = static_cast<std::size_t>(h.length);
      const info m = message_info(h, j);
      if (!sel.matches(static_cast<space>(h.space), m)) return false;
      ++p.expected;
      if (length && capacity) std::memcpy(buffer, payload, std::min(length, capacity));
      p.mail->consume();
      got = m;
      error = length > capacity ? EQMSGLONG : 0;
      return true;
    }
    cpu_relax();
    cpu_relax();
  }
  return false;
}

// ---------------------------------------------------------------- waiting

int runtime::wait(request* r) {
  if (r->done) return r->error;
  // A receive from a named node that ended failed already (peer_ended); one
  // from any node fails here once all the others ended.
  auto hopeless = [this, r] { return !r->is_send && ended_sender(r->sel) >= 0; };
  if (int e = wait_until([&] { return r->done || hopeless(); })) return e;
  return r->done ? r->error : blame_ended(ended_sender(r->sel));
}

template <class Ready>
int runtime::wait_until(Ready ready) {
  bool came = false;
  auto over = [&] {
    progress();
    if ((came = ready()) || failure_) return true;
    // A handler runs when its message arrives, also while the node waits
    // for something else (an hrecv server answering during gsync).
    if (!handlers_due_.empty()) {
      run_due_handlers();
      came = ready();
    }
    return came;
  };
  auto sleep = [&](std::chrono::nanoseconds) {
    check_peers();
    // What a node sent before it went still counts.
    if ((came = ready()) || failure_) return false;
    sleep_a_little();
    return true;
  };
  // A turn costs a few nanoseconds: the clock is looked at every 32.
  (void)core::wait_until(over, core::wait_clock::time_point::max(), core::sleep_step(sleep),
                         {.turns_per_look = 32});
  return came ? 0 : failure_;
}

// Sleeps on the doorbell after arming every channel (data from each peer,
// space toward each peer we still write to); any arm that says "something
// is on its way" means poll again instead.
void runtime::sleep_a_little() {
  int timeout_ms = bell_->fd() < 0 ? 1 : 100;
  if (!arm_doorbell(timeout_ms)) return;
  lane_fds_.push_back({bell_->fd(), POLLIN, 0});  // -1 (no doorbell): poll skips it
  ::poll(lane_fds_.data(), lane_fds_.size(), timeout_ms);
  bell_->drain();
  // This arming replaced the handler thread's, and the ring that answered
  // it is drained: the thread must arm again once this call is over.
  if (kick_fd_ >= 0) {
    const std::uint64_t one = 1;
    (void)!::write(kick_fd_, &one, sizeof one);
  }
}

bool runtime::arm_doorbell(int& timeout_ms) {
  lane_fds_.clear();
  for (long j = 0; j < nodes_; ++j) {
    if (j == node_) continue;
    peer& p = peers_[static_cast<std::size_t>(j)];
    if (p.closed || p.link.peer_closed()) continue;
    if (p.link.tcp()) {
      if (!p.link.prepare_sleep(redirect::sleep_reason::data)) return false;
      const short events = POLLIN | (p.queue.empty() ? 0 : POLLOUT);
      lane_fds_.push_back({p.link.wait_fd(), events, 0});
      continue;
    }
    if (p.remote) timeout_ms = 1;  // its fabric writes ring no doorbell here
    if (!p.mail->prepare_sleep()) return false;
    if (!p.link.prepare_sleep(redirect::sleep_reason::data)) return false;
    if (!p.queue.empty() && !p.link.prepare_sleep(redirect::sleep_reason::space)) return false;
  }
  return true;
}

// ---------------------------------------------------------------- the handler thread
// On the Paragon a handler ran when its message arrived, interrupting the
// computation. Here a thread started with the first handler receive drives
// progress while the program is outside NX calls: it sleeps on the
// doorbell (armed like any waiter, so a peer's next message rings it),
// takes in what came and runs the due handlers. It holds the calls' lock
// while it does, so it never runs beside an NX call of the program (which
// runs due handlers itself while it waits), and masktrap(1) returns only
// once no handler runs.

// A request with a handler is outstanding: the thread serves until none is.
void runtime::serve_handlers() {
  ++with_handler_;
  if (handler_thread_.joinable()) {
    const std::uint64_t one = 1;  // it may be idle: wake it to arm the doorbell
    (void)!::write(kick_fd_, &one, sizeof one);
    return;
  }
  start_handler_thread();
}

void runtime::start_handler_thread() {
  if (dying_) return;
  // Called inside an NX call (hrecv ...) that did not take the lock: it
  // takes it now, and its nx_call releases it at the end of the call.
  if (!call_locked && call_depth > 0) {
    calls_.lock();
    call_locked = true;
  }
  threaded_ = true;
  kick_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  handler_thread_ = std::thread([this] { handler_thread_main(); });
}

void runtime::stop_handler_thread() {
  if (!handler_thread_.joinable()) return;
  const bool held = call_locked;  // exit() called inside an NX call or a handler
  if (!held) calls_.lock();
  stop_handlers_ = true;
  if (!held) calls_.unlock();
  if (held || handler_thread_.get_id() == std::this_thread::get_id()) {
    handler_thread_.detach();  // it stops at its next turn, or goes with the process
    return;
  }
  const std::uint64_t one = 1;
  (void)!::write(kick_fd_, &one, sizeof one);
  handler_thread_.join();
  ::close(kick_fd_);
  kick_fd_ = -1;
}

void runtime::handler_thread_main() {
  call_depth = 1;  // the handlers' NX calls are inside this thread's turn
  std::unique_lock lock(calls_);
  call_locked = true;  // for exit() in a handler (stop_handler_thread)
  while (!stop_handlers_) {
    bell_->drain();
    std::uint64_t kicks;
    (void)!::read(kick_fd_, &kicks, sizeof kicks);
    // With no handler receive (or hsend) outstanding it leaves the
    // program's messages to the program's calls: then it sleeps until one
    // is posted.
    const bool serving = with_handler_ > 0;
    if (serving) {
      progress();
      run_handlers();
    }
    if (stop_handlers_) break;
    int timeout_ms = bell_->fd() < 0 ? 1 : 100;
    const bool armed = !serving || failure_ || arm_doorbell(timeout_ms);
    if (!serving) timeout_ms = kick_fd_ >= 0 ? -1 : 100;  // no eventfd: look now and then
    // The doorbell and the TCP lanes, and the program's kick after it slept
    // in a call; taken while the lock is held (the program's calls arm too).
    std::vector<pollfd> f{{kick_fd_, POLLIN, 0}};
    if (serving && armed) {
      f.push_back({bell_->fd(), POLLIN, 0});
      if (!failure_) f.insert(f.end(), lane_fds_.begin(), lane_fds_.end());
    }
    call_locked = false;
    lock.unlock();
    if (armed) {
      ::poll(f.data(), f.size(), timeout_ms);
    } else {
      // Something is on its way: let it land without taking the lock back
      // at once (the program's next call may want it).
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    lock.lock();
    call_locked = true;
  }
  call_locked = false;
}

void runtime::check_peers() {
  bool drained = false;
  for (long j = 0; j < nodes_; ++j) {
    if (j == node_) continue;
    peer& p = peers_[static_cast<std::size_t>(j)];
    if (p.closed || !p.link.peer_gone()) continue;
    // Its messages that arrived before it went are taken in first, as the
    // bytes before a stream's end: a node that sent its part of a gsync and
    // exited at once must not fail the others' gsync.
    if (!drained) {
      progress();
      drained = true;
    }
    if (p.closed) continue;  // its end came meanwhile
    if (p.link.peer_closed()) {
      // Ended its stream but its end message is not here: nothing more can
      // come from a process that is gone.
      peer_ended(j);
      continue;
    }
    fail_job(j, EQBADNODE);
    std::fprintf(stderr, "nx: node %ld: node %ld died\n", node_, j);
  }
}

// ---------------------------------------------------------------- handlers, control

void runtime::run_due_handlers() {
  if (masked_ || in_handler_ || dying_) return;
  in_handler_ = true;
  // A handler's own receives leave the interrupted program's msginfo as it was.
  long saved[8];
  std::memcpy(saved, msginfo, sizeof saved);
  while (!handlers_due_.empty() && !masked_) {
    request* r = handlers_due_.front();
    handlers_due_.pop_front();
    const info m = r->got;
    if (r->handlerx)
      r->handlerx(m.type, m.count, m.node, m.ptype, r->hparam);
    else
      r->handler(m.type, m.count, m.node, m.ptype);
    recycle(r);
  }
  std::memcpy(msginfo, saved, sizeof saved);
  in_handler_ = false;
}

long runtime::mask(long state) {
  long previous = masked_ ? 1 : 0;
  masked_ = state != 0;
  if (!masked_) run_handlers();
  return previous;
}

int runtime::kill_node(long node) {
  if (node < -1 || node >= nodes_) return EQNODE;
  for (long j = 0; j < nodes_; ++j) {
    if (j == node_ || (node != -1 && j != node)) continue;
    peer& p = peers_[static_cast<std::size_t>(j)];
    if (p.remote || ::kill(p.pid, SIGKILL) != 0) return EQDRVERR;
    p.closed = true;  // an end we asked for, not a failure
  }
  return 0;
}

}  // namespace vmmc::nx::detail
