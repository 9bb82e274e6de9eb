// fabric_side: a context's address, and opening its fabric once.
#include "fabric_side.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include "core.h"

namespace vmmc::core::detail {

void fabric_side::start(plan how, peer_address identity, remote_write_sink sink) {
  plan_ = std::move(how);
  sink_ = std::move(sink);
  identity_ = std::move(identity);
  std::lock_guard lock(address_mutex_);
  reached_at_ = identity_;
  blob_ = encode_address(reached_at_);
}

namespace {
// Where remote peers reach this context (context::open_remote_paths).
std::string address_for_peers(const std::string& configured, std::string_view local_address) {
  if (!configured.empty()) return configured;
  in_addr parsed{};
  const std::string hint(local_address);
  if (!hint.empty() && ::inet_pton(AF_INET, hint.c_str(), &parsed) == 1 &&
      parsed.s_addr != htonl(INADDR_ANY))
    return hint;
  // Nobody said where: out of the network's reach.
  return "127.0.0.1";
}
}  // namespace

status fabric_side::open(std::string_view local_address) {
  std::lock_guard lock(open_mutex_);
  if (tried_) return is_open() ? status{} : status{errc::unreachable};
  tried_ = true;
  auto opened = std::make_unique<paths>();
  const std::string tcp_address = address_for_peers(
      plan_.tcp_address, local_address.empty() ? plan_.local_address : local_address);
  VMMC_DEBUG("remote peers reach this context at %s", tcp_address.c_str());
  std::vector<std::pair<std::string, std::vector<std::uint8_t>>> names;
  bool remote_capable = false;
  for (const std::string& p : plan_.providers) {
    if (p == "shm") remove_stale_fabric_shm_files();
    auto e = fabric_endpoint::open(p, tcp_address, plan_.inline_max, plan_.utlb_limit, sink_);
    if (!e) continue;  // logged by open(); other providers may still serve
    names.emplace_back(p, (*e)->name());
    remote_capable |= p != "shm";
    opened->endpoints.push_back(std::move(*e));
  }
  if (opened->endpoints.empty()) return errc::unreachable;
  std::string control_tcp;
  if (remote_capable) {
    auto tcp_fd = listen_tcp(tcp_address, control_tcp);
    if (!tcp_fd) return tcp_fd.error();
    opened->tcp_listener = std::move(*tcp_fd);
  }
  {
    std::lock_guard address_lock(address_mutex_);
    for (auto& n : names) reached_at_.fabric.push_back(std::move(n));
    reached_at_.control_tcp = control_tcp;
    blob_ = encode_address(reached_at_);
  }
  owned_ = std::move(opened);
  open_.store(owned_.get(), std::memory_order_release);
  return {};
}

const fabric_side::endpoint_list& fabric_side::endpoints() const noexcept {
  static const endpoint_list none;
  const paths* p = open_.load(std::memory_order_acquire);
  return p ? p->endpoints : none;
}

int fabric_side::tcp_listener() const noexcept {
  const paths* p = open_.load(std::memory_order_acquire);
  return p && p->tcp_listener ? p->tcp_listener.get() : -1;
}

std::string fabric_side::blob() const {
  std::lock_guard lock(address_mutex_);
  return blob_;
}

std::string fabric_side::address_with_secret() const {
  std::lock_guard lock(address_mutex_);
  return encode_address_with_secret(reached_at_);
}

void fabric_side::close() {
  open_.store(nullptr);
  owned_.reset();
}

}  // namespace vmmc::core::detail
