// Checks of what a channel's peer wrote (see parse.h).
#include "parse.h"

#include <algorithm>
#include <atomic>
#include <charconv>

namespace vmmc::redirect::detail {

bool parse_descriptor(std::string_view text, parsed_descriptor& out) {
  auto first = text.find('#');
  if (first == std::string_view::npos || first == 0 || first >= wire::name_max) return false;
  auto second = text.find('#', first + 1);
  if (second == std::string_view::npos) return false;
  std::string_view ring = text.substr(first + 1, second - first - 1);
  auto [end, ec] = std::from_chars(ring.data(), ring.data() + ring.size(), out.ring_bytes);
  if (ec != std::errc() || end != ring.data() + ring.size()) return false;
  if (out.ring_bytes < page || out.ring_bytes > max_ring_bytes ||
      (out.ring_bytes & (out.ring_bytes - 1)))
    return false;
  out.name = std::string(text.substr(0, first));
  out.address = std::string(text.substr(second + 1));
  if (out.address.empty() || text.size() >= wire::descriptor_max) return false;
  for (char c : text)
    if (c <= ' ' || c > '~') return false;
  return true;
}

bool check_area(const std::uint64_t (&words)[3], std::uint64_t ring_bytes,
                std::uint64_t export_length) {
  const std::uint64_t ring_offset = words[2];
  // Compared without adding: an offset near 2^64 must not wrap into range.
  return words[0] == wire::area_magic && words[1] == ring_bytes && ring_offset % page == 0 &&
         ring_offset >= sizeof(wire::area_header) && ring_offset <= export_length &&
         ring_bytes <= export_length - ring_offset;
}

result<hello_copy> copy_hello(const wire::hello& h) {
  auto once = [](const std::uint32_t& word) {
    return std::atomic_ref<std::uint32_t>(const_cast<std::uint32_t&>(word))
        .load(std::memory_order_relaxed);
  };
  const std::uint32_t user_length = once(h.user_length);
  const std::uint32_t descriptor_length = once(h.descriptor_length);
  if (user_length > wire::user_hello_max || descriptor_length >= wire::descriptor_max)
    return errc::protocol_error;
  return hello_copy{std::string(h.user, user_length), std::string(h.descriptor, descriptor_length)};
}

post_placement place_in_post(std::uint64_t post_position, std::uint64_t post_length,
                             std::uint64_t start, std::size_t length) {
  if (start < post_position || start - post_position >= post_length || length == 0) return {};
  const std::uint64_t offset = start - post_position;
  return {offset, static_cast<std::size_t>(std::min<std::uint64_t>(length, post_length - offset))};
}

result<report_view> check_report(std::uint64_t start, std::uint64_t redirected,
                                 std::uint64_t post_start, std::uint64_t post_length) {
  if (start < post_start) return errc::protocol_error;
  const std::uint64_t before = start - post_start;
  if (redirected > 0 && (before > post_length || redirected > post_length - before))
    return errc::protocol_error;
  return report_view{std::min(before, post_length), redirected};
}

}  // namespace vmmc::redirect::detail
