// Exports: offering memory, answering import requests (policy check), and
// withdrawing an export only after every importer has stopped writing to it.
#include <unistd.h>

#include "core.h"
#include "parse.h"

namespace vmmc::core {

using namespace detail;

result<export_handle> context::impl::export_buffer(std::string_view name, void* base,
                                                   std::size_t length, export_options options) {
  if (!base || length == 0 || name.empty() || name.size() > wire::max_name_length ||
      options.allowed == rights::none)
    return errc::invalid_argument;
  auto e = std::make_shared<export_entry>();
  e->name = name;
  e->base = static_cast<std::byte*>(base);
  e->length = length;
  e->allowed = options.allowed;
  e->policy = std::move(options.policy);
  e->on_notify = std::move(options.on_notify);
  e->wake_fd = options.wake_fd;
  // Without the mapped path every importer comes over the fabric, which
  // must be open to register with (fabric_on_demand left it closed so far).
  if (!mapped_enabled)
    if (status opened = open_fabric(); !opened) return opened.error();
  std::uint64_t offset = 0;
  if (options.mapped)
    if (auto seg = segments.find(base, length, offset))
      e->window = export_window::open(std::move(seg), offset, length);

  // Registration takes endpoint locks, which progress holds while it looks
  // exports up: register before filing the export, never under its lock.
  auto release_mrs = [&] {
    for (fabric_mr& m : e->mrs) m.endpoint->deregister_export(m);
  };
  for (auto& endpoint : fabric.endpoints()) {
    auto mr = endpoint->register_export(base, length, e->allowed);
    if (!mr) {
      release_mrs();
      return mr.error();
    }
    e->mrs.push_back(*mr);
  }
  if (!exports.add(e)) {
    release_mrs();
    return errc::already_exists;
  }
  return export_handle{e->id};
}

status context::impl::unexport_buffer(export_handle handle) {
  export_ptr e = exports.remove(handle.id);
  if (!e) return errc::unknown_handle;
  e->live.store(false);
  // Ask every importer to stop and wait for its acknowledgement: after it, no
  // mapped copy or fabric write of theirs can still land in this memory.
  if (!links.revoke(*e, std::chrono::seconds(2)))
    VMMC_WARN("export %s withdrawn without every importer's acknowledgement", e->name.c_str());
  // Enforced whatever the importers answered: their mappings lose our pages.
  if (e->window) e->window->close();
  for (fabric_mr& m : e->mrs) m.endpoint->deregister_export(m);
  return {};
}

}  // namespace vmmc::core

namespace vmmc::core::detail {
bool names_importer(const std::string& listed, const importer_link& link, std::uint64_t our_nonce) {
  auto named = decode_address(listed);
  if (!named || !named->same_context(link.address)) return false;
  if (link.conn->is_unix()) return true;  // the kernel checked its pid
  return !named->secret.empty() &&
         same_digest(link.context_proof, context_proof(named->secret, link.challenge, our_nonce));
}
}  // namespace vmmc::core::detail

namespace vmmc::core {

void context::impl::handle_import_request(const link_ptr& link, const frame& f) {
  wire::import_reply_body reply{};
  std::vector<int> fds;
  auto answer = [&](errc code) {
    // A refusal says only which request and why: nothing is lent with it. (A
    // refusal that still said "mapped" declared a descriptor it did not
    // carry, and the importer rightly took the peer for broken.)
    if (code != errc::ok) {
      const std::uint64_t request_id = reply.request_id;
      reply = {};
      reply.request_id = request_id;
      fds.clear();
    }
    reply.status = static_cast<std::uint32_t>(code);
    if (!link->conn->write_frame(wire::frame_type::import_reply, &reply, sizeof reply, fds))
      link->alive = false;
  };
  auto parsed = parse_import_request(f.body);
  if (!parsed) {
    link->alive = false;  // malformed: drop this importer, keep serving the rest
    return;
  }
  const wire::import_request_body& req = parsed->request;
  reply.request_id = req.request_id;
  std::string name(parsed->name);
  std::string provider(parsed->provider);

  export_ptr e = exports.find(name);
  if (!e) return answer(errc::unknown_export);
  switch (e->policy.who) {
    case import_policy::kind::anyone:
      break;
    case import_policy::kind::same_user:
      if (link->address.uid != self().uid) return answer(errc::permission_denied);
      break;
    case import_policy::kind::named_peers: {
      bool listed = false;
      for (const std::string& p : e->policy.peers) listed |= names_importer(p, *link, self().nonce);
      if (!listed) return answer(errc::permission_denied);
      break;
    }
  }
  reply.export_id = e->id;
  reply.length = e->length;
  reply.rights = static_cast<std::uint32_t>(e->allowed);
  unique_fd lent;
  if (req.want_mapped && e->window && link->conn->is_unix()) {
    auto fd = e->window->lend(!has_right(e->allowed, rights::write));
    if (!fd) return answer(static_cast<errc>(fd.error().value()));
    lent = std::move(*fd);
    reply.mapped = 1;
    reply.segment_offset = 0;
    fds.push_back(lent.get());
    // Open while the export is live: unexport_buffer marks it dead, then
    // revokes through the link table, under whose lock this reply is written.
    if (e->wake_fd >= 0) {
      reply.has_wake_fd = 1;
      fds.push_back(e->wake_fd);
    }
  } else {
    const fabric_mr* mr = nullptr;
    for (const fabric_mr& m : e->mrs)
      if (m.endpoint->short_name() == provider) mr = &m;
    if (!mr) return answer(errc::unreachable);
    auto ring = fabric_ring_for(link, *mr->endpoint);
    if (!ring)
      return answer(ring.error().value() == static_cast<int>(errc::resource_exhausted)
                        ? errc::resource_exhausted
                        : errc::fabric_error);
    mr->endpoint->mark_in_use();
    reply.remote_address = mr->remote_address;
    reply.key = mr->key;
    reply.ring_address = ring->remote_address;
    reply.ring_key = ring->key;
    reply.link_id = link->id;
    reply.ring_capacity = wire::ring_slots;
  }
  // Granted after re-checking liveness, under the link table's lock: a
  // concurrent unexport either sees this import (and revokes it) or we see it
  // gone. The reply goes under the same lock: a revoke written by a
  // concurrent unexport then follows it on this connection, and the importer
  // can tell an import it overtook (handle_revoke).
  (void)links.grant(*link, *e, !reply.mapped,
                    [&](bool granted) { answer(granted ? errc::ok : errc::unknown_export); });
}

// The ring this importer writes notification records into over `endpoint`:
// created at its first fabric import, registered once per endpoint.
result<fabric_mr> context::impl::fabric_ring_for(const link_ptr& link, fabric_endpoint& endpoint) {
  for (const fabric_mr& m : link->fabric_ring_mrs)
    if (m.endpoint == &endpoint) return m;
  if (!link->fabric_ring_segment) {
    auto seg = segment::create(sizeof(wire::fabric_ring), "vmmc-fabric-ring");
    if (!seg) return seg.error();
    new ((*seg)->base) wire::fabric_ring{};
    links.set_fabric_ring(*link, *seg);
  }
  auto mr = endpoint.register_export(link->fabric_ring_segment->base, sizeof(wire::fabric_ring),
                                     rights::read_write);
  if (!mr) return mr.error();
  link->fabric_ring_mrs.push_back(*mr);
  return *mr;
}

void context::impl::handle_unimport(const link_ptr& link, const frame& f) {
  wire::unimport_body body{};
  if (!f.body_as(body)) return;
  links.release(*link, body.export_id);
}

}  // namespace vmmc::core
