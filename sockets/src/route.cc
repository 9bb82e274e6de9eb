// Where a connection's peer is, and whether VMMC can beat kernel TCP to it.
//
// On this host the mapped path always wins. To another host VMMC goes over a
// libfabric provider; one without an RDMA device underneath (tcp, which is
// kernel TCP plus its own framing and progress) can only lose to the kernel
// TCP it would replace, and a healthy connection would then also depend on
// a second transport's liveness. So by default such peers keep kernel TCP,
// decided before the client puts an offer byte on the wire.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "sockets.h"
#include "vmmc/core/host.h"

namespace vmmc::sockets::detail {
namespace {

// The IP address of a socket address, IPv4-mapped IPv6 as IPv4.
std::string ip_of(const sockaddr* a) {
  if (a->sa_family == AF_INET) {
    auto* v4 = reinterpret_cast<const sockaddr_in*>(a);
    return std::string(reinterpret_cast<const char*>(&v4->sin_addr), 4);
  }
  if (a->sa_family != AF_INET6) return {};
  auto* v6 = reinterpret_cast<const sockaddr_in6*>(a);
  if (IN6_IS_ADDR_V4MAPPED(&v6->sin6_addr))
    return std::string(reinterpret_cast<const char*>(&v6->sin6_addr) + 12, 4);
  return std::string(reinterpret_cast<const char*>(&v6->sin6_addr), 16);
}

// Our interfaces' addresses, listed again at most once a second: a
// getifaddrs() dump per connection would cost more than the connection.
bool one_of_our_addresses(const std::string& ip) {
  using clock = std::chrono::steady_clock;
  static std::mutex mutex;
  static std::vector<std::string> addresses;
  static clock::time_point listed{};
  std::lock_guard lock(mutex);
  if (clock::now() - listed > std::chrono::seconds(1)) {
    ifaddrs* interfaces = nullptr;
    if (::getifaddrs(&interfaces) != 0) return false;
    addresses.clear();
    for (ifaddrs* i = interfaces; i; i = i->ifa_next)
      if (i->ifa_addr) addresses.push_back(ip_of(i->ifa_addr));
    ::freeifaddrs(interfaces);
    listed = clock::now();
  }
  for (const std::string& a : addresses)
    if (!a.empty() && a == ip) return true;
  return false;
}

}  // namespace

bool peer_on_this_host(const sockaddr* peer, const sockaddr* local) {
  const std::string ip = ip_of(peer);
  if (ip.empty()) return false;
  if ((ip.size() == 4 && ip[0] == 127) || ip == std::string(15, '\0') + '\1') return true;
  if (local && ip == ip_of(local)) return true;
  return one_of_our_addresses(ip);
}

void keep_ends(stream& s, const sockaddr_storage& local, const sockaddr_storage& peer,
               bool peer_here) {
  s.local_end = local;
  s.peer_end = peer;
  s.peer_here = peer_here;
  s.ends_known.store(true, std::memory_order_release);
}

bool learn_ends(stream& s) {
  if (s.ends_known.load(std::memory_order_acquire)) return true;
  sockaddr_storage peer{}, local{};
  socklen_t peer_length = sizeof peer, local_length = sizeof local;
  if (::getpeername(s.fd, reinterpret_cast<sockaddr*>(&peer), &peer_length) != 0 ||
      ::getsockname(s.fd, reinterpret_cast<sockaddr*>(&local), &local_length) != 0)
    return false;
  keep_ends(s, local, peer,
            peer_on_this_host(reinterpret_cast<const sockaddr*>(&peer),
                              reinterpret_cast<const sockaddr*>(&local)));
  return true;
}

std::string ipv4_text(const sockaddr* address) {
  const std::string ip = ip_of(address);
  char text[INET_ADDRSTRLEN];
  if (ip.size() != 4 || !::inet_ntop(AF_INET, ip.data(), text, sizeof text)) return {};
  return text;
}

bool wildcard(const sockaddr* address) {
  if (address->sa_family == AF_INET)
    return reinterpret_cast<const sockaddr_in*>(address)->sin_addr.s_addr == htonl(INADDR_ANY);
  return address->sa_family == AF_INET6 &&
         IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr);
}

std::optional<fallback> keep_on_tcp_to(bool peer_here) {
  static const std::string mode = core::setting_string(settings::remote);
  if (peer_here || !core::kernel_tcp_to_other_hosts(mode)) return std::nullopt;
  return mode == "tcp" ? fallback::remote_tcp : fallback::remote_no_rdma;
}

}  // namespace vmmc::sockets::detail
