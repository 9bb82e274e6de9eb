// Imports: connecting to an exporter (hello), asking for an export, building
// the destination proxy on the mapped or the fabric path, and giving it up.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "core.h"
#include "parse.h"

namespace vmmc::core {

using namespace detail;

namespace {
// What the kernel says the descriptor is (not what the peer says).
bool is_eventfd(int fd) {
  char path[32], target[32] = {};
  std::snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  const ssize_t n = ::readlink(path, target, sizeof target - 1);
  return n > 0 && std::strcmp(target, "anon_inode:[eventfd]") == 0;
}
}  // namespace

result<context::impl::peer_ptr> context::impl::connect_peer(std::string_view blob_text,
                                                            clock::time_point deadline) {
  auto address = decode_address(blob_text);
  if (!address) return address.error();
  std::string key(blob_text);
  std::lock_guard connecting(peers.connecting());
  if (peer_ptr known = peers.find_live(key)) return known;
  auto peer = std::make_shared<remote_peer>();
  peer->address = std::move(*address);
  peer->blob = key;
  peer->same_host = peer->address.host == self().host;

  result<unique_fd> fd = errc::unreachable;
  if (peer->same_host)
    fd = connect_unix(control_socket_name(peer->address.pid, peer->address.nonce), deadline);
  else if (!peer->address.control_tcp.empty())
    fd = connect_tcp(peer->address.control_tcp, deadline);
  if (!fd) return fd.error();
  if (peer->same_host) {
    // Anyone may bind an abstract name: the kernel says who listens there.
    ucred cred{};
    socklen_t length = sizeof cred;
    if (::getsockopt(fd->get(), SOL_SOCKET, SO_PEERCRED, &cred, &length) != 0 ||
        static_cast<std::uint32_t>(cred.pid) != peer->address.pid)
      return errc::protocol_error;
  }
  peer->conn = std::make_unique<connection>(std::move(*fd), peer->same_host);
  peer->conn->give_up_unacknowledged_after(liveness);
  peer->conn->on_backlog = [this] { control.wake(); };

  // A peer on another host is reached over the fabric, and reaches us so.
  if (!peer->same_host) (void)open_fabric();
  const std::string mine = fabric.blob();
  std::vector<std::uint8_t> hello(sizeof(wire::hello_body) + mine.size());
  wire::hello_body h{self().uid, self().pid, static_cast<std::uint32_t>(mine.size())};
  std::memcpy(hello.data(), &h, sizeof h);
  std::memcpy(hello.data() + sizeof h, mine.data(), mine.size());
  if (auto s = peer->conn->write_frame(wire::frame_type::hello, hello.data(), hello.size()); !s)
    return s.error();
  auto reply = peer->conn->read_one(deadline);
  if (!reply) return reply.error();
  if (reply->type == wire::frame_type::hello_challenge && !peer->same_host) {
    // Prove who we are: our context's secret, and the user key if we have one.
    wire::hello_challenge_body c{};
    if (!reply->body_as(c)) return errc::protocol_error;
    wire::hello_proof_body proof{};
    const digest context = context_proof(self().secret, c.challenge, peer->address.nonce);
    std::memcpy(proof.context_proof, context.data(), context.size());
    if (auto user_secret = use_user_key ? user_key() : std::nullopt) {
      const digest user = user_proof(*user_secret, c.challenge, peer->address.nonce, self().uid);
      std::memcpy(proof.user_proof, user.data(), user.size());
      proof.has_user_proof = 1;
    }
    if (auto s = peer->conn->write_frame(wire::frame_type::hello_proof, &proof, sizeof proof); !s)
      return s.error();
    reply = peer->conn->read_one(deadline);
    if (!reply) return reply.error();
  }
  wire::hello_reply_body r{};
  if (reply->type != wire::frame_type::hello_reply || !reply->body_as(r))
    return errc::protocol_error;
  if (r.status != 0) return static_cast<errc>(r.status);
  if (r.has_wake_fds) {
    if (reply->fds.size() != 3) return errc::protocol_error;
    auto wake_map = mapping::map(reply->fds[0].get(), 0, sizeof(wake_page), false);
    auto ring_map = mapping::map(reply->fds[2].get(), 0, sizeof(notify_ring), true);
    if (!wake_map || !ring_map) return errc::protocol_error;
    peer->wake_map = std::move(*wake_map);
    peer->ring_map = std::move(*ring_map);
    peer->wake_eventfd = std::move(reply->fds[1]);
  }
  peers.add(key, peer);
  control.wake();  // start watching the new connection
  return peer;
}

result<import_handle> context::impl::import_buffer(std::string_view peer_blob,
                                                   std::string_view name,
                                                   std::chrono::milliseconds timeout) {
  if (name.empty() || name.size() > wire::max_name_length) return errc::invalid_argument;
  auto deadline = clock::now() + timeout;
  auto peer = connect_peer(peer_blob, deadline);
  if (!peer) return peer.error();
  peer_ptr p = std::move(*peer);

  // Path: the mapped one when the exporter can hand us its memfd; else the
  // first provider both ends have (shm only within a host).
  const bool want_mapped = mapped_enabled && p->same_host && p->wake_map;
  if (!want_mapped) (void)open_fabric();  // the first import that needs it
  fabric_endpoint* endpoint = nullptr;
  for (auto& e : fabric.endpoints()) {
    if ((e->short_name() == "shm") != p->same_host && fabric.endpoints().size() > 1) continue;
    if (p->address.fabric_for(e->short_name())) {
      endpoint = e.get();
      break;
    }
  }
  if (!endpoint)  // e.g. a same-host peer reachable only over tcp
    for (auto& e : fabric.endpoints())
      if (p->address.fabric_for(e->short_name()) && (e->short_name() != "shm" || p->same_host)) {
        endpoint = e.get();
        break;
      }
  if (!want_mapped && !endpoint) return errc::unreachable;

  wire::import_request_body req{};
  req.request_id = next_import_request++;
  req.want_mapped = want_mapped;
  req.name_length = static_cast<std::uint32_t>(name.size());
  if (endpoint) std::strncpy(req.provider, endpoint->short_name().c_str(), sizeof req.provider - 1);
  std::vector<std::uint8_t> body(sizeof req + name.size());
  std::memcpy(body.data(), &req, sizeof req);
  std::memcpy(body.data() + sizeof req, name.data(), name.size());
  {
    std::lock_guard lock(p->reply_mutex);
    p->awaited.insert(req.request_id);
  }
  if (auto s = p->conn->write_frame(wire::frame_type::import_request, body.data(), body.size());
      !s) {
    std::lock_guard lock(p->reply_mutex);
    p->awaited.erase(req.request_id);
    return s.error();
  }

  frame f;
  {
    std::unique_lock lock(p->reply_mutex);
    bool answered = p->reply_cv.wait_until(
        lock, deadline, [&] { return p->replies.count(req.request_id) || !p->alive; });
    if (!p->replies.count(req.request_id)) {
      if (p->awaited.erase(req.request_id) && !answered)
        p->abandoned.insert(req.request_id);  // a late reply is given back
      return answered ? errc::peer_gone : errc::timed_out;
    }
    f = std::move(p->replies[req.request_id]);
    p->replies.erase(req.request_id);
  }
  // Until it is installed (or fails), a revoke may overtake this import.
  struct installing_guard {
    remote_peer& peer;
    std::uint64_t request_id;
    // True if a revoke overtook the import; the import is no longer tracked.
    bool finish() {
      std::lock_guard lock(peer.reply_mutex);
      peer.installing.erase(request_id);
      return peer.overtaken.erase(request_id) > 0;
    }
    ~installing_guard() { (void)finish(); }
  } guard{*p, req.request_id};
  auto reply = parse_import_reply(f.body);
  if (!reply) return reply.error();
  const wire::import_reply_body& r = *reply;
  if (r.status != 0) return static_cast<errc>(r.status);

  auto imp = std::make_shared<import_entry>();
  imp->peer = p;
  imp->export_id = r.export_id;
  imp->length = r.length;
  imp->allowed = static_cast<rights>(r.rights & 3);
  if (r.mapped) {
    if (f.fds.size() != 1 + r.has_wake_fd) return errc::protocol_error;
    if (r.has_wake_fd) {
      // The peer says it is an eventfd; a descriptor that could block our
      // write (a full pipe) or is not one stays unused: no wake-ups, only
      // the caller's own doorbells.
      if (is_eventfd(f.fds[1].get()) &&
          ::fcntl(f.fds[1].get(), F_SETFL, ::fcntl(f.fds[1].get(), F_GETFL) | O_NONBLOCK) == 0)
        imp->wake_fd = std::move(f.fds[1]);
    }
    auto m = mapping::map(f.fds[0].get(), r.segment_offset, r.length,
                          has_right(imp->allowed, rights::write));
    if (!m) return m.error();
    imp->map = std::move(*m);
  } else {
    if (!endpoint) return errc::protocol_error;
    std::lock_guard lock(p->av_mutex);
    auto it = p->fi_addresses.find(endpoint);
    if (it == p->fi_addresses.end()) {
      auto a = endpoint->insert_peer(*p->address.fabric_for(endpoint->short_name()));
      if (!a) return a.error();
      it = p->fi_addresses.emplace(endpoint, *a).first;
    }
    {
      std::lock_guard ring_lock(p->record_mutex);
      if (!p->ring_known) {
        p->ring_known = true;
        p->ring_address = r.ring_address;
        p->ring_key = r.ring_key;
        p->link_id = r.link_id;
      }
    }
    endpoint->mark_in_use();
    imp->endpoint = endpoint;
    imp->fi_address = it->second;
    imp->remote_address = r.remote_address;
    imp->key = r.key;
  }
  imports.add(imp, [](import_entry& i, std::uint64_t id) { i.id = id; });
  // A revoke handled from here on finds the import in the table (see
  // handle_revoke); one handled before was noted, and acknowledged at once:
  // nothing of ours can have reached the memory.
  if (guard.finish()) {
    (void)imports.remove(imp->id);
    return errc::unknown_export;
  }
  return import_handle{imp->id};
}

status context::impl::unimport_buffer(import_handle handle) {
  import_ptr imp = imports.remove(handle.id);
  if (!imp) return errc::unknown_handle;
  {
    std::unique_lock state(imp->state_mutex);  // waits out running locked copies
    imp->released = true;
    if (imp->map) imp->map->retire();  // and cuts off a sender's
  }
  if (imp->peer->alive) {
    // The exporter stops tracking us on this frame, and may withdraw the
    // memory at once: no operation of ours may still reach it then, neither
    // a write (ordered behind the read below) nor a fetch still in flight
    // (a fetch with a deregistered key makes a tcp provider close the
    // connection under every other import of this peer).
    await_in_flight(*imp);
    await_writes_landed(*imp);
    wire::unimport_body body{imp->export_id, 0};
    (void)imp->peer->conn->write_frame(wire::frame_type::unimport, &body, sizeof body);
  }
  return {};
}

void context::impl::handle_revoke(const peer_ptr& peer, const frame& f) {
  wire::revoke_body body{};
  if (!f.body_as(body)) return;
  // Installing imports first, then the table: an import moves from the first
  // to the second (import_buffer), and in this order one of the two scans
  // sees it. The other order lets one slip between them, unrevoked.
  {
    // An import answered but not yet in the table fails when it gets there.
    std::lock_guard lock(peer->reply_mutex);
    for (const auto& [request_id, export_id] : peer->installing)
      if (export_id == body.export_id) peer->overtaken.insert(request_id);
  }
  bool owed = false;
  std::vector<import_ptr> revoked;
  imports.for_each([&](const import_ptr& imp) {
    if (imp->peer != peer || imp->export_id != body.export_id) return;
    std::unique_lock state(imp->state_mutex);  // waits out running locked copies
    imp->revoked = true;
    if (imp->map) imp->map->retire();  // a sender's copy cannot reach the memory now
    if (imp->in_flight.load() > 0) {
      imp->ack_owed = true;  // the control loop acknowledges once they drain
      acks_owed.fetch_add(1);
      owed = true;
    }
    revoked.push_back(imp);
  });
  if (owed) return;
  for (const import_ptr& imp : revoked) await_writes_landed(*imp);
  (void)peer->conn->write_frame(wire::frame_type::revoke_ack, &body, sizeof body);
}

// Bounded like await_writes_landed, for a peer that stopped answering.
void context::impl::await_in_flight(import_entry& imp) {
  if (imp.map || !imp.endpoint) return;
  const auto deadline = clock::now() + std::chrono::seconds(1);
  while (imp.in_flight.load(std::memory_order_acquire) > 0 && imp.peer->alive &&
         clock::now() < deadline)
    imp.endpoint->progress();
}

// On the fabric path a write completes once it has left this process (tcp:
// handed to the socket), not once it is in the exporter's memory, and the
// provider need not refuse writes to a region no longer registered. A read
// is ordered behind the earlier writes (FI_ORDER_RAW): once it returns they
// have landed, and the exporter may reuse its memory. It reads the head of
// our notification ring there, which lives as long as the exporter's context
// (the export's own memory may already be gone when a context is torn down).
// Bounded, for a peer that stopped answering.
void context::impl::await_writes_landed(import_entry& imp) {
  remote_peer& p = *imp.peer;
  if (imp.map || !imp.endpoint || !p.alive) return;
  std::uint64_t ring_address, ring_key;
  {
    std::lock_guard lock(p.record_mutex);
    if (!p.ring_known) return;
    ring_address = p.ring_address;
    ring_key = p.ring_key;
  }
  static std::uint64_t sink;  // the value is not wanted; a late read lands here harmlessly
  auto reader = std::make_shared<op>();
  fabric_endpoint& ep = *imp.endpoint;
  ep.begin(reader);
  status s = ep.post_read(reader, imp.fi_address, &sink, sizeof sink,
                          ring_address + offsetof(wire::fabric_ring, head), ring_key, p.alive);
  ep.finish_posting(reader, s.error());
  const auto deadline = clock::now() + std::chrono::seconds(1);
  while (s && !reader->done.load(std::memory_order_acquire) && p.alive && clock::now() < deadline)
    ep.progress();
}

void context::impl::send_revoke_ack(import_entry& imp) {
  await_writes_landed(imp);
  wire::revoke_body body{imp.export_id, 0};
  (void)imp.peer->conn->write_frame(wire::frame_type::revoke_ack, &body, sizeof body);
}

std::error_code context::impl::classify_failure(const import_entry& imp, std::error_code error) {
  if (!error) return error;
  // A transport error is often the first sign of a dead peer (a reset tcp
  // connection); the control connection tells for sure, though its end of
  // file may trail the fabric's reset by a moment: give it that moment. The
  // fabric's own "gone" (a reset) is confirmed the same way, so that every
  // later call to the peer fails at once too: a send_async after a failed
  // send and fetch was posted to a killed exporter (CI, ASan: its control
  // thread had not read the end yet).
  if (!imp.peer->alive || imp.peer->conn->closed_by_peer(std::chrono::milliseconds(200))) {
    peer_died(imp.peer, "a transfer failed and its control connection ended");
    return errc::peer_gone;
  }
  return error;
}

void context::impl::peer_died(const peer_ptr& peer, const char* why) {
  if (!peer->alive.exchange(false)) return;
  VMMC_DEBUG("exporter pid %u is gone (%s)", peer->address.pid, why);
  { std::lock_guard lock(peer->reply_mutex); }
  peer->reply_cv.notify_all();
  peers.forget(peer->blob, peer.get());
}

}  // namespace vmmc::core
