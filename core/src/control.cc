// The control thread: one per context, asleep in poll() unless something
// happens. It accepts importers, answers hello/import/unimport, relays revokes,
// watches liveness (a peer is gone when its connection ends, as with kernel
// TCP; VMMC_CORE_LIVENESS_MS adds heartbeats), and drives fabric progress
// while the application is not polling, so that exporters need not call
// anything for RMA to land.
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core.h"
#include "parse.h"

namespace vmmc::core {

using namespace detail;

namespace {
constexpr auto app_idle_after = std::chrono::milliseconds(2);
constexpr auto slowest_fabric_tick = std::chrono::milliseconds(10);
// A control connection must say hello this soon after it is accepted (ours
// write it with the connect); at most max_half_open wait at once.
constexpr auto hello_timeout = std::chrono::seconds(2);
constexpr std::size_t max_half_open = 64;
// How long listeners rest when the process is out of descriptors.
constexpr auto accept_rest = std::chrono::milliseconds(50);

bool send_hello_reply(const context::impl::link_ptr& link, std::vector<int> fds) {
  wire::hello_reply_body reply{};
  reply.has_wake_fds = fds.empty() ? 0 : 1;
  link->hello_done = true;
  return static_cast<bool>(
      link->conn->write_frame(wire::frame_type::hello_reply, &reply, sizeof reply, fds));
}

// Verifies and answers an importer's hello. Returns false to drop the link.
bool accept_hello(context::impl& ctx, const context::impl::link_ptr& link, const frame& f) {
  auto hello = parse_hello(f.type, f.body);
  if (!hello) return false;
  const wire::hello_body& h = hello->claims;
  std::string blob(hello->blob);
  auto address = decode_address(blob);
  if (!address || !address->secret.empty()) return false;  // a hello never carries a secret
  if (!link->conn->is_unix()) {
    // No kernel vouches across TCP: the address must point back at the
    // connection's other end, and the importer must answer a challenge.
    sockaddr_storage other_end{};
    socklen_t length = sizeof other_end;
    if (::getpeername(link->conn->fd(), reinterpret_cast<sockaddr*>(&other_end), &length) != 0 ||
        !check_points_back(ctx.self().host, *address, &other_end, length))
      return false;
    wire::hello_challenge_body challenge{};
    if (::getrandom(challenge.challenge, sizeof challenge.challenge, 0) !=
        static_cast<ssize_t>(sizeof challenge.challenge))
      return false;
    std::memcpy(link->challenge.data(), challenge.challenge, sizeof challenge.challenge);
    link->address = std::move(*address);
    link->address.uid = unverified_uid;
    link->claimed_uid = h.uid;
    link->blob = std::move(blob);
    link->awaiting_proof = true;
    return static_cast<bool>(
        link->conn->write_frame(wire::frame_type::hello_challenge, &challenge, sizeof challenge));
  }
  // The kernel vouches for who is on the other end of a Unix socket.
  ucred cred{};
  socklen_t length = sizeof cred;
  if (::getsockopt(link->conn->fd(), SOL_SOCKET, SO_PEERCRED, &cred, &length) != 0 ||
      static_cast<std::uint32_t>(cred.pid) != h.pid ||
      static_cast<std::uint32_t>(cred.uid) != h.uid || address->pid != h.pid)
    return false;
  auto ring = segment::create(sizeof(notify_ring), "vmmc-ring");
  if (!ring) return false;
  new ((*ring)->base) notify_ring{};
  if (!(*ring)->seal_for_peers(false)) return false;
  ctx.links.set_ring(*link, *ring);
  link->address = std::move(*address);
  link->address.uid = h.uid;
  link->blob = std::move(blob);
  return send_hello_reply(
      link, {ctx.notifications.wake_page_fd(), ctx.notifications.fd(), (*ring)->fd.get()});
}

// The importer's answer to a TCP hello's challenge: its uid counts only with
// a proof made with our user key.
bool accept_proof(context::impl& ctx, const context::impl::link_ptr& link, const frame& f) {
  wire::hello_proof_body proof{};
  if (f.type != wire::frame_type::hello_proof || !f.body_as(proof)) return false;
  link->awaiting_proof = false;
  std::memcpy(link->context_proof.data(), proof.context_proof, sizeof proof.context_proof);
  if (proof.has_user_proof && link->claimed_uid == ctx.self().uid && ctx.use_user_key)
    if (auto key = user_key()) {
      digest claimed{};
      std::memcpy(claimed.data(), proof.user_proof, sizeof proof.user_proof);
      if (same_digest(claimed, user_proof(*key, link->challenge, ctx.self().nonce, ctx.self().uid)))
        link->address.uid = ctx.self().uid;
    }
  return send_hello_reply(link, {});
}
}  // namespace

void context::impl::handle_link_frames(const link_ptr& link) {
  std::vector<frame>& frames = link->conn->control_frames;  // empty between rounds
  status s = link->conn->read_available(frames);
  for (const frame& f : frames) {
    if (!link->alive) break;
    if (!link->hello_done) {
      const bool accepted = link->awaiting_proof
                                ? accept_proof(*this, link, f)
                                : link->blob.empty() && accept_hello(*this, link, f);
      if (!accepted) {
        VMMC_WARN("refused a control connection: bad or unverifiable hello");
        link->alive = false;
      }
      continue;
    }
    switch (f.type) {
      case wire::frame_type::import_request:
        handle_import_request(link, f);
        break;
      case wire::frame_type::unimport:
        handle_unimport(link, f);
        break;
      case wire::frame_type::revoke_ack: {
        wire::revoke_body body{};
        if (!f.body_as(body)) break;
        links.acknowledge(*link, body.export_id);
        break;
      }
      case wire::frame_type::heartbeat:
        break;
      default:
        link->alive = false;
    }
  }
  frames.clear();  // what was not taken (descriptors) goes now, as before
  if (s.is(errc::protocol_error)) VMMC_WARN("garbage on a control connection; closed it");
  if (!s) link->alive = false;
}

void context::impl::handle_peer_frames(const peer_ptr& peer) {
  std::vector<frame>& frames = peer->conn->control_frames;  // empty between rounds
  status s = peer->conn->read_available(frames);
  for (frame& f : frames) {
    switch (f.type) {
      case wire::frame_type::import_reply: {
        wire::import_reply_body r{};
        if (!f.body_as(r)) {
          s = errc::protocol_error;
          break;
        }
        bool unwanted;
        {
          std::lock_guard lock(peer->reply_mutex);
          unwanted = peer->abandoned.erase(r.request_id) > 0;
          if (!unwanted && !peer->awaited.erase(r.request_id)) {
            s = errc::protocol_error;  // an answer to nothing we asked
            break;
          }
          if (!unwanted) {
            if (r.status == 0) peer->installing[r.request_id] = r.export_id;
            peer->replies[r.request_id] = std::move(f);
          }
        }
        if (unwanted && r.status == 0) {  // its caller timed out: give it back
          wire::unimport_body body{r.export_id, 0};
          (void)peer->conn->write_frame(wire::frame_type::unimport, &body, sizeof body);
        }
        peer->reply_cv.notify_all();
        break;
      }
      case wire::frame_type::revoke:
        handle_revoke(peer, f);
        break;
      case wire::frame_type::heartbeat:
        break;
      default:
        s = errc::protocol_error;
    }
  }
  frames.clear();  // what was not taken (descriptors) goes now, as before
  if (!s)
    peer_died(peer, s.is(errc::protocol_error) ? "garbage on its control connection"
                                               : "its control connection ended");
}

void context::impl::link_died(const link_ptr& link) {
  link->alive = false;
  // What the importer published before it went is delivered, not dropped.
  std::vector<notification> unread;
  links.remove(link, unread);
  for (fabric_mr& m : link->fabric_ring_mrs) m.endpoint->deregister_export(m);
  for (const notification& n : unread) notifications.push(n);
}

void context::impl::control_loop() {
  // With VMMC_CORE_LIVENESS_MS, heartbeats keep data unacknowledged while a
  // link is down, so the kernel's user timeout ends the connection.
  const bool heartbeats = liveness.count() > 0;
  const auto heartbeat = heartbeats ? liveness / 4 : std::chrono::milliseconds(1000);
  auto fabric_tick = std::chrono::milliseconds(1);

  auto& [fds, link_list, peer_list] = control_round_state;
  while (!control.stopping()) {
    fds.clear();
    fds.push_back({control.wake_fd(), POLLIN, 0});
    // Out of descriptors, a listener stays readable: rest it a moment
    // rather than spin on it.
    const bool listening = now_ns() >= accept_resumes_ns;
    fds.push_back({listening ? unix_listener.get() : -1, POLLIN, 0});
    fds.push_back({listening ? fabric.tcp_listener() : -1, POLLIN, 0});
    links.copy_to(link_list);
    peers.copy_to(peer_list);
    // Output waits in a connection only while its socket is full: flush it
    // when there is room.
    auto events = [](const connection& c) -> short {
      return static_cast<short>(POLLIN | (c.backlogged() ? POLLOUT : 0));
    };
    for (auto& l : link_list) fds.push_back({l->conn->fd(), events(*l->conn), 0});
    for (auto& p : peer_list) fds.push_back({p->conn->fd(), events(*p->conn), 0});

    // Fabric progress is ours only while the application is not polling.
    const bool app_idle =
        notifications.sleeping() || now_ns() - last_app_poll_ns.load(std::memory_order_relaxed) >
                                        std::chrono::nanoseconds(app_idle_after).count();
    control_watching_fabric.store(app_idle, std::memory_order_release);
    bool fabric_ready = false, has_unwaitable_endpoint = false;
    for (auto& e : fabric.endpoints()) has_unwaitable_endpoint |= e->in_use() && !e->has_wait_fd();
    if (app_idle)
      for (auto& e : fabric.endpoints())
        if (e->in_use() && e->has_wait_fd()) {
          if (e->try_arm_wait())
            fds.push_back({e->wait_fd(), POLLIN, 0});
          else
            fabric_ready = true;
        }
    auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(heartbeat);
    timeout = std::min<std::chrono::milliseconds>(timeout, hello_timeout);
    if (!listening) timeout = std::min<std::chrono::milliseconds>(timeout, accept_rest);
    if (!app_idle) timeout = std::min<std::chrono::milliseconds>(timeout, app_idle_after);
    if (app_idle && has_unwaitable_endpoint) timeout = std::min(timeout, fabric_tick);
    if (acks_owed.load()) timeout = std::min(timeout, std::chrono::milliseconds(1));
    if (fabric_ready) timeout = std::chrono::milliseconds(0);
    ::poll(fds.data(), fds.size(), static_cast<int>(timeout.count()));
    if (control.stopping()) break;

    if (fds[0].revents) control.take_wakeups();
    for (int i = 1; i <= 2; ++i)
      if (fds[static_cast<std::size_t>(i)].revents & POLLIN)
        accept_links(fds[static_cast<std::size_t>(i)].fd, i == 1);
    std::size_t at = 3;
    for (auto& l : link_list) {
      const short revents = fds[at++].revents;
      if ((revents & POLLOUT) && !l->conn->flush()) l->alive = false;
      if (revents & ~POLLOUT) handle_link_frames(l);
    }
    for (auto& p : peer_list) {
      const short revents = fds[at++].revents;
      if ((revents & POLLOUT) && !p->conn->flush()) peer_died(p, "a write to it failed");
      if (revents & ~POLLOUT) handle_peer_frames(p);
    }

    if (app_idle) {
      std::size_t handled = 0;
      for (auto& e : fabric.endpoints())
        if (e->in_use()) handled += e->try_progress();
      fabric_tick = handled
                        ? std::chrono::milliseconds(1)
                        : std::min<std::chrono::milliseconds>(fabric_tick * 2, slowest_fabric_tick);
    }

    // Liveness: a peer is gone when its connection ends (end of file, a
    // reset, the kernel's timeout), never because it was silent: a peer
    // stopped for a while, or a link down for a while, breaks nothing that
    // kernel TCP would not break (issue 15, item 2).
    const std::int64_t now = now_ns();
    const auto heartbeat_ns = std::chrono::nanoseconds(heartbeat).count();
    const auto hello_ns = std::chrono::nanoseconds(hello_timeout).count();
    auto heartbeat_due = [&](const connection& c) {
      return heartbeats && !c.is_unix() && now - c.last_sent_ns() > heartbeat_ns;
    };
    for (auto& l : link_list) {
      if (l->alive && !l->hello_done && now - l->accepted_ns > hello_ns) {
        VMMC_WARN("closed a control connection that said no hello");
        l->alive = false;
      }
      if (l->alive && heartbeat_due(*l->conn) &&
          !l->conn->write_frame(wire::frame_type::heartbeat, nullptr, 0))
        l->alive = false;
      if (!l->alive) link_died(l);
    }
    for (auto& p : peer_list)
      if (p->alive && heartbeat_due(*p->conn) &&
          !p->conn->write_frame(wire::frame_type::heartbeat, nullptr, 0))
        peer_died(p, "a heartbeat to it failed");
    if (acks_owed.load()) send_owed_acks();
  }
}

void context::impl::accept_links(int listener, bool is_unix) {
  // A round takes at most max_half_open: the links it pushes out close in
  // the next round, so a flood never holds more than twice that.
  for (std::size_t accepted = 0; accepted < max_half_open; ++accepted) {
    int c = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Make room by dropping the oldest connection still without a hello
        // (the next round closes it); rest if there is none.
        links.drop_oldest_half_open();
        accept_resumes_ns =
            now_ns() + std::chrono::duration_cast<std::chrono::nanoseconds>(accept_rest).count();
        VMMC_WARN("out of descriptors for control connections: %s", std::strerror(errno));
      }
      return;
    }
    auto link = std::make_shared<importer_link>();
    link->conn = std::make_unique<connection>(unique_fd(c), is_unix);
    link->conn->give_up_unacknowledged_after(liveness);
    link->conn->on_backlog = [this] { control.wake(); };
    link->accepted_ns = now_ns();
    links.add(std::move(link), max_half_open);
  }
}

// Acknowledges revokes whose imports have no fabric operation in flight any
// more; several imports of one export acknowledge together.
void context::impl::send_owed_acks() {
  std::vector<import_ptr> owing;
  imports.for_each([&](const import_ptr& imp) {
    if (imp->ack_owed) owing.push_back(imp);
  });
  for (auto& imp : owing) {
    if (imp->in_flight.load() > 0) continue;
    bool others_busy = false;
    for (auto& other : owing)
      others_busy |= other != imp && other->peer == imp->peer &&
                     other->export_id == imp->export_id && other->in_flight.load() > 0;
    if (others_busy) continue;
    std::unique_lock state(imp->state_mutex);
    if (!imp->ack_owed) continue;
    imp->ack_owed = false;
    acks_owed.fetch_sub(1);
    send_revoke_ack(*imp);
  }
  // Imports released while owing drop their debt: their unimport frame
  // answers the revoke (handle_unimport).
  int still = 0;
  imports.for_each([&](const import_ptr& imp) { still += imp->ack_owed; });
  acks_owed.store(still);
}

}  // namespace vmmc::core
