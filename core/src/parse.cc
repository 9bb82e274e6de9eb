// Checks of peer bytes (see parse.h): control frames, their bodies, and
// notification records (fabric rings; drain_ring reads the mapped ones).
// Everything a peer says is bounded here before any of it is used as a
// length, an offset or an index.
#include "parse.h"

#include <cstddef>
#include <cstring>

#include "core.h"

namespace vmmc::core::detail {

namespace {
template <class T>
bool read_at(std::span<const std::uint8_t> bytes, T& out) {
  if (bytes.size() < sizeof(T)) return false;
  std::memcpy(&out, bytes.data(), sizeof(T));
  return true;
}

std::string_view text_of(std::span<const std::uint8_t> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}
}  // namespace

result<frame_view> scan_frame(std::span<const std::uint8_t> input) {
  wire::frame_header h;
  if (!read_at(input, h)) return errc::would_block;
  if (h.magic != wire::control_magic || h.version != wire::control_version ||
      h.length > wire::max_frame_body)
    return errc::protocol_error;
  if (input.size() - sizeof h < h.length) return errc::would_block;
  frame_view v{static_cast<wire::frame_type>(h.type), sizeof h, h.length, 0};
  const auto body = input.subspan(sizeof h, h.length);
  // Descriptors belong to the frames that declare them.
  if (v.type == wire::frame_type::hello_reply) {
    wire::hello_reply_body b{};
    if (read_at(body, b) && b.has_wake_fds) v.descriptors = 3;
  } else if (v.type == wire::frame_type::import_reply) {
    wire::import_reply_body b{};
    if (read_at(body, b) && b.mapped) v.descriptors = b.has_wake_fd == 1 ? 2 : 1;
  }
  return v;
}

result<hello_view> parse_hello(wire::frame_type type, std::span<const std::uint8_t> body) {
  hello_view v{};
  if (type != wire::frame_type::hello || !read_at(body, v.claims) ||
      body.size() - sizeof v.claims != v.claims.address_length)
    return errc::protocol_error;
  v.blob = text_of(body.subspan(sizeof v.claims));
  return v;
}

result<import_request_view> parse_import_request(std::span<const std::uint8_t> body) {
  import_request_view v{};
  if (!read_at(body, v.request) || v.request.name_length > wire::max_name_length ||
      body.size() - sizeof v.request != v.request.name_length)
    return errc::protocol_error;
  v.name = text_of(body.subspan(sizeof v.request));
  // A view of the body's own bytes, not of v.request's copy: v is returned by value.
  const auto provider =
      body.subspan(offsetof(wire::import_request_body, provider), sizeof v.request.provider);
  v.provider = text_of(provider.first(strnlen(v.request.provider, sizeof v.request.provider)));
  return v;
}

result<wire::import_reply_body> parse_import_reply(std::span<const std::uint8_t> body) {
  wire::import_reply_body r{};
  if (!read_at(body, r)) return errc::protocol_error;
  if (r.status != 0) return r;
  if (r.length == 0) return errc::protocol_error;
  if (r.mapped ? r.segment_offset > UINT64_MAX - r.length : r.ring_capacity != wire::ring_slots)
    return errc::protocol_error;
  if (r.has_wake_fd > 1 || (r.has_wake_fd && !r.mapped)) return errc::protocol_error;
  return r;
}

bool drain_ring(notify_ring& ring, std::vector<notification>& out) {
  std::uint64_t head = ring.head.load(std::memory_order_relaxed);
  const std::uint64_t tail = ring.tail.load(std::memory_order_acquire);
  if (tail - head > notify_ring::capacity) return false;  // a corrupt producer
  for (; head != tail; ++head) {
    const notify_record& r = ring.records[head % notify_ring::capacity];
    out.push_back({r.export_id, r.offset, r.length, r.value});
  }
  ring.head.store(head, std::memory_order_release);
  return true;
}

record_plan plan_record(const wire::record_header& h, std::uint64_t export_length, bool writable,
                        std::size_t payload_length) {
  // The importer checked all of this; we check again, as a peer may lie.
  if (h.magic != wire::record_magic || !fits(h.offset, h.length, export_length)) return {};
  const bool notify = h.notify != 0;
  if (h.type == static_cast<std::uint32_t>(wire::record_type::inline_update)) {
    if (payload_length < h.length || !writable) return {};
    return {true, notify};
  }
  if (h.type != static_cast<std::uint32_t>(wire::record_type::notify)) return {};
  return {false, notify};
}

}  // namespace vmmc::core::detail
