// Checks of the upgrade and revert bytes a peer sends (see parse.h).
#include "parse.h"

#include <charconv>

namespace vmmc::sockets::detail {

bool hello_frame_ok(const wire::hello_frame& frame) {
  return frame.magic == wire::hello_magic && frame.version == wire::version && frame.length != 0;
}

std::optional<std::uint64_t> parse_raw_count(std::string_view hello) {
  std::uint64_t n = 0;
  auto [end, ec] = std::from_chars(hello.data(), hello.data() + hello.size(), n);
  if (ec != std::errc() || end != hello.data() + hello.size()) return std::nullopt;
  return n;
}

record_scan scan_records(std::span<const unsigned char> bytes) {
  record_scan scan;
  scan.take = bytes.size();
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] == wire::revert_request_byte) scan.revert_asked = true;
    if (bytes[i] != wire::end_record_byte) continue;
    scan.take = i;
    if (bytes.size() - i >= wire::end_record_size) {
      std::uint64_t v = 0;
      for (std::size_t k = wire::end_record_size - 1; k > 0; --k) v = (v << 8) | bytes[i + k];
      scan.end = v;  // little-endian
      scan.take = i + wire::end_record_size;
    }
    break;
  }
  return scan;
}

}  // namespace vmmc::sockets::detail
