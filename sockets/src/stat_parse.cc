// The checks vmmc-stat applies to a published file (stat_page.h) before it
// believes anything in it: the file is another process's, another user's
// for root. Apart from the reading (stat_reader.cc) so that the fuzz target
// (tests/fuzz/fuzz_sockets_stat.cc) runs the same code.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <string>
#include <string_view>

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

// One address of /proc/net/tcp{,6}: "0100007F:1F90" (the address's 32-bit
// words as the kernel holds them, in hex; the port in host order).
bool endpoint_of_proc_net(std::string_view text, endpoint& e) {
  const std::size_t colon = text.find(':');
  if (colon == std::string_view::npos || (colon != 8 && colon != 32)) return false;
  auto hex = [](std::string_view digits, std::uint32_t& value) {
    if (digits.empty() || digits.size() > 8) return false;
    value = 0;
    for (char c : digits) {
      int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) return false;
      value = value << 4 | static_cast<std::uint32_t>(d);
    }
    return true;
  };
  e = {};
  e.family = colon == 8 ? AF_INET : AF_INET6;
  for (std::size_t word = 0; word < colon / 8; ++word) {
    std::uint32_t value;
    if (!hex(text.substr(word * 8, 8), value)) return false;
    std::memcpy(e.address + word * 4, &value, 4);
  }
  std::uint32_t port;
  if (!hex(text.substr(colon + 1), port) || port > 65535) return false;
  e.port = static_cast<std::uint16_t>(port);
  return true;
}
}  // namespace

bool ends_in_proc_net(std::string_view table, std::uint64_t inode, std::string& local,
                      std::string& remote) {
  if (inode == 0) return false;
  const std::string wanted = std::to_string(inode);
  while (!table.empty()) {
    const std::size_t end = std::min(table.find('\n'), table.size());
    std::string_view line = table.substr(0, end);
    table.remove_prefix(std::min(end + 1, table.size()));
    // sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
    std::string_view fields[10];
    std::size_t n = 0;
    while (n < std::size(fields)) {
      const std::size_t start = line.find_first_not_of(' ');
      if (start == std::string_view::npos) break;
      line.remove_prefix(start);
      const std::size_t stop = std::min(line.find(' '), line.size());
      fields[n++] = line.substr(0, stop);
      line.remove_prefix(stop);
    }
    endpoint ours, theirs;
    if (n == std::size(fields) && fields[9] == wanted && endpoint_of_proc_net(fields[1], ours) &&
        endpoint_of_proc_net(fields[2], theirs)) {
      local = text_of(ours);
      remote = text_of(theirs);
      return true;
    }
  }
  return false;
}

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
