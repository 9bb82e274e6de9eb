// The checks vmmc-stat applies to a published file (stat_page.h) before it
// believes anything in it: the file is another process's, another user's
// for root. Apart from the reading (stat_reader.cc) so that the fuzz target
// (tests/fuzz/fuzz_sockets_stat.cc) runs the same code.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>
#include <string>

#include "stat_page.h"

namespace vmmc::sockets::detail::stat_page {

namespace {
std::string text_of(const endpoint& e) {
  char address[INET6_ADDRSTRLEN] = "";
  if (e.family == AF_INET) {
    ::inet_ntop(AF_INET, e.address, address, sizeof address);
    return std::string(address) + ":" + std::to_string(e.port);
  }
  if (e.family == AF_INET6) {
    ::inet_ntop(AF_INET6, e.address, address, sizeof address);
    return "[" + std::string(address) + "]:" + std::to_string(e.port);
  }
  return "?";
}
}  // namespace

std::string bounded(const char* text, std::size_t capacity) {
  return std::string(text, ::strnlen(text, capacity));
}

bool header_ok(const header& h, std::uint64_t file_bytes, std::int64_t pid) {
  return std::memcmp(h.magic, magic, sizeof h.magic) == 0 && h.version == version &&
         h.row_size == row_bytes && h.row_count <= max_rows && h.pid == pid && pid > 0 &&
         file_bytes >= header_bytes + std::uint64_t{h.row_count} * row_bytes;
}

std::optional<published_connection> parse_row(const row& r, std::uint32_t index) {
  static const char* const states[] = {"connecting", "undecided", "upgrading", "accelerated",
                                       "tcp"};
  static_assert(std::size(states) == row_state_count);
  if (!r.in_use || r.state >= row_state_count || r.fd < 0 ||
      static_cast<std::uint32_t>(r.fd) != index)
    return std::nullopt;
  published_connection c;
  c.fd = r.fd;
  c.is_client = r.is_client != 0;
  c.inode = r.inode;
  c.local = text_of(r.local);
  c.remote = text_of(r.remote);
  c.state = states[r.state];
  c.path = bounded(r.path, sizeof r.path);
  c.why = r.fallback <= static_cast<std::uint8_t>(fallback::last_reason)
              ? static_cast<fallback>(r.fallback)
              : fallback::none;
  c.tcp_bytes_in = r.tcp_bytes_in;
  c.tcp_bytes_out = r.tcp_bytes_out;
  c.vmmc_bytes_in = r.vmmc_bytes_in;
  c.vmmc_bytes_out = r.vmmc_bytes_out;
  c.bytes_copied = r.bytes_copied;
  c.bytes_redirected = r.bytes_redirected;
  c.protocol_bytes_in = r.protocol_bytes_in;
  c.protocol_bytes_out = r.protocol_bytes_out;
  return c;
}

}  // namespace vmmc::sockets::detail::stat_page
