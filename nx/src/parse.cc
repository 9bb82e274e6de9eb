// Start-up records from the other nodes (see parse.h).
#include "parse.h"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <sstream>

namespace vmmc::nx::detail {

namespace {
bool read_all(int fd, void* data, std::size_t n) {
  auto p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t k = ::read(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}
}  // namespace

bool write_all(int fd, const void* data, std::size_t n) {
  auto p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = ::write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

std::string record(std::string_view bytes) {
  auto n = static_cast<std::uint32_t>(bytes.size());
  std::string r(reinterpret_cast<const char*>(&n), sizeof n);
  r += bytes;
  return r;
}

std::vector<std::string> read_records(int fd, std::size_t count) {
  std::vector<std::string> all(count);
  for (auto& s : all) {
    std::uint32_t n = 0;
    // A length is checked before it sizes anything: 4 GiB per node is not a record.
    if (!read_all(fd, &n, sizeof n) || n > max_record_bytes(count)) return {};
    s.resize(n);
    if (!read_all(fd, s.data(), n)) return {};
  }
  return all;
}

std::optional<startup_record> parse_startup_record(const std::string& text, long nodes, long node) {
  std::istringstream in(text);
  startup_record r;
  std::string other;
  in >> r.host >> r.pid >> r.cpus >> r.address;
  for (long k = 0; k < nodes; ++k) in >> (k == node ? r.descriptor : other);
  for (long k = 0; k < nodes; ++k) in >> (k == node ? r.mailbox : other);
  in >> r.lane >> r.lane_key;
  if (!in) return std::nullopt;
  return r;
}

void add_cpus(std::string_view list, std::set<int>& into) {
  while (!list.empty()) {
    const std::size_t comma = std::min(list.find(','), list.size());
    const std::string_view cpu = list.substr(0, comma);
    int n = 0;
    auto [end, ec] = std::from_chars(cpu.data(), cpu.data() + cpu.size(), n);
    if (ec == std::errc() && end == cpu.data() + cpu.size() && n >= 0) into.insert(n);
    list.remove_prefix(std::min(comma + 1, list.size()));
  }
}

}  // namespace vmmc::nx::detail
