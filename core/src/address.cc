// Address blobs: what one process tells others so they can reach it.
//
// Printable ASCII without whitespace: "vmmc1;h=<host>;p=<pid>;u=<uid>;
// n=<nonce>;c=<ip:port>;f.<provider>=<hex fabric address>...;k=<hex secret>".
// The secret is only in what a context hands out itself (context::address),
// never in a hello. The host is core::host_identity's text (boot id +
// network namespace), so peers in different namespaces (our simulated
// hosts) never try the same-host paths.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <random>

#include "core.h"

namespace vmmc::core::detail {

namespace {
constexpr std::string_view blob_prefix = "vmmc1";

std::string hex_encode(const std::vector<std::uint8_t>& bytes) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (std::uint8_t b : bytes) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

bool hex_decode(std::string_view text, std::vector<std::uint8_t>& out) {
  if (text.size() % 2 != 0) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  out.clear();
  for (std::size_t i = 0; i < text.size(); i += 2) {
    int hi = nibble(text[i]), lo = nibble(text[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out.push_back(static_cast<std::uint8_t>(hi * 16 + lo));
  }
  return true;
}

// Decimal up to `max`: a number that does not fit is refused, not wrapped.
bool parse_u64(std::string_view text, std::uint64_t& out, std::uint64_t max = UINT64_MAX) {
  if (text.empty() || text.size() > 20) return false;
  std::uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    const auto digit = static_cast<std::uint64_t>(c - '0');
    if (v > (max - digit) / 10) return false;
    v = v * 10 + digit;
  }
  out = v;
  return true;
}
}  // namespace

std::uint64_t random_nonce() {
  std::random_device rd;
  return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
}

std::string encode_address(const peer_address& a) {
  std::string s(blob_prefix);
  s += ";h=" + a.host;
  s += ";p=" + std::to_string(a.pid);
  s += ";u=" + std::to_string(a.uid);
  s += ";n=" + std::to_string(a.nonce);
  if (!a.control_tcp.empty()) s += ";c=" + a.control_tcp;
  for (const auto& [provider, bytes] : a.fabric) s += ";f." + provider + "=" + hex_encode(bytes);
  return s;
}

std::string encode_address_with_secret(const peer_address& a) {
  return encode_address(a) + ";k=" + hex_encode(a.secret);
}

result<peer_address> decode_address(std::string_view text) {
  peer_address a;
  if (text.size() > 4096 || text.substr(0, blob_prefix.size()) != blob_prefix)
    return errc::invalid_argument;
  std::size_t pos = blob_prefix.size();
  bool have_host = false, have_pid = false, have_uid = false, have_nonce = false;
  while (pos < text.size()) {
    if (text[pos] != ';') return errc::invalid_argument;
    std::size_t end = text.find(';', pos + 1);
    if (end == std::string_view::npos) end = text.size();
    std::string_view field = text.substr(pos + 1, end - pos - 1);
    std::size_t eq = field.find('=');
    if (eq == std::string_view::npos || eq == 0) return errc::invalid_argument;
    std::string_view key = field.substr(0, eq), value = field.substr(eq + 1);
    for (char c : field)
      if (c <= ' ' || c > '~') return errc::invalid_argument;
    std::uint64_t n = 0;
    if (key == "h") {
      a.host = value;
      have_host = !value.empty();
    } else if (key == "p") {
      if (!parse_u64(value, n, UINT32_MAX)) return errc::invalid_argument;
      a.pid = static_cast<std::uint32_t>(n);
      have_pid = true;
    } else if (key == "u") {
      if (!parse_u64(value, n, UINT32_MAX)) return errc::invalid_argument;
      a.uid = static_cast<std::uint32_t>(n);
      have_uid = true;
    } else if (key == "n") {
      if (!parse_u64(value, a.nonce)) return errc::invalid_argument;
      have_nonce = true;
    } else if (key == "c") {
      a.control_tcp = value;
    } else if (key == "k") {
      if (!hex_decode(value, a.secret) || a.secret.size() < 16) return errc::invalid_argument;
    } else if (key.substr(0, 2) == "f.") {
      std::vector<std::uint8_t> bytes;
      if (!hex_decode(value, bytes) || bytes.empty()) return errc::invalid_argument;
      a.fabric.emplace_back(std::string(key.substr(2)), std::move(bytes));
    }  // unknown keys are skipped: later versions may add fields
    pos = end;
  }
  if (!have_host || !have_pid || !have_uid || !have_nonce) return errc::invalid_argument;
  return a;
}

namespace {
// The IP of an IPv4 or IPv6 socket address, IPv4-mapped IPv6 as IPv4; nullopt
// for anything else. Port and scope are dropped.
std::optional<sockaddr_storage> ip_of(const void* address, std::size_t length) {
  sockaddr_storage ip{};
  sa_family_t family = AF_UNSPEC;
  if (length >= sizeof(sa_family_t)) std::memcpy(&family, address, sizeof family);
  if (family == AF_INET && length >= sizeof(sockaddr_in)) {
    auto& v4 = reinterpret_cast<sockaddr_in&>(ip);
    std::memcpy(&v4, address, sizeof v4);
    v4.sin_port = 0;
    return ip;
  }
  if (family != AF_INET6 || length < sizeof(sockaddr_in6)) return std::nullopt;
  sockaddr_in6 v6{};
  std::memcpy(&v6, address, sizeof v6);
  if (IN6_IS_ADDR_V4MAPPED(&v6.sin6_addr)) {
    auto& v4 = reinterpret_cast<sockaddr_in&>(ip);
    v4.sin_family = AF_INET;
    std::memcpy(&v4.sin_addr, v6.sin6_addr.s6_addr + 12, 4);
    return ip;
  }
  auto& out = reinterpret_cast<sockaddr_in6&>(ip);
  out.sin6_family = AF_INET6;
  out.sin6_addr = v6.sin6_addr;
  return ip;
}

bool same_ip(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET)
    return reinterpret_cast<const sockaddr_in&>(a).sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in&>(b).sin_addr.s_addr;
  return std::memcmp(&reinterpret_cast<const sockaddr_in6&>(a).sin6_addr,
                     &reinterpret_cast<const sockaddr_in6&>(b).sin6_addr, 16) == 0;
}

// The IP of "ip:port" or "[ip6]:port".
std::optional<sockaddr_storage> ip_of_text(const std::string& ip_port) {
  auto colon = ip_port.rfind(':');
  if (colon == std::string::npos) return std::nullopt;
  std::string host = ip_port.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  sockaddr_in v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4.sin_addr) == 1) {
    v4.sin_family = AF_INET;
    return ip_of(&v4, sizeof v4);
  }
  sockaddr_in6 v6{};
  if (::inet_pton(AF_INET6, host.c_str(), &v6.sin6_addr) == 1) {
    v6.sin6_family = AF_INET6;
    return ip_of(&v6, sizeof v6);
  }
  return std::nullopt;
}

// Whether `ip` belongs to this host (this network namespace): only a local
// address can be bound.
bool is_local(const sockaddr_storage& ip) {
  if (ip.ss_family == AF_INET &&  // 127/8: no system call for the common case
      (ntohl(reinterpret_cast<const sockaddr_in&>(ip).sin_addr.s_addr) >> 24) == 127)
    return true;
  if (ip.ss_family == AF_INET6 &&
      IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6&>(ip).sin6_addr))
    return true;
  const int probe = ::socket(ip.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  const socklen_t length = ip.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  const bool bound =
      probe >= 0 && ::bind(probe, reinterpret_cast<const sockaddr*>(&ip), length) == 0;
  if (probe >= 0) ::close(probe);  // a plain descriptor: the fuzz targets link this file alone
  return bound;
}
}  // namespace

status check_points_back(const std::string& our_host, const peer_address& claimed,
                         const void* other_end, std::size_t length) {
  auto ip = ip_of(other_end, length);
  if (!ip) return errc::invalid_argument;
  // "This host" is for peers on this host, and only for them: a remote peer
  // claiming it would steer us to a local process of its choice, a local one
  // claiming another host to a local port of its choice.
  const bool local = is_local(*ip);
  if ((claimed.host == our_host) != local) return errc::permission_denied;
  if (local) return {};
  // Elsewhere: every place it asks us to connect to must be where it is.
  if (!claimed.control_tcp.empty()) {
    auto control = ip_of_text(claimed.control_tcp);
    if (!control || !same_ip(*control, *ip)) return errc::permission_denied;
  }
  for (const auto& [provider, bytes] : claimed.fabric) {
    if (provider == "shm") continue;  // a name on one host; never used across hosts
    auto at = ip_of(bytes.data(), bytes.size());
    if (at && !same_ip(*at, *ip)) return errc::permission_denied;
  }
  return {};
}

std::string control_socket_name(std::uint32_t pid, std::uint64_t nonce) {
  // Abstract namespace (leading NUL added by the caller): no file to leave behind.
  return "vmmc." + std::to_string(pid) + "." + std::to_string(nonce);
}

}  // namespace vmmc::core::detail
