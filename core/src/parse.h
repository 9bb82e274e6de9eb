// parse.h: the checks vmmc::core applies to bytes a peer sends it, apart
// from the sockets, memory and fabric state that carry them, so that the
// product and the fuzz targets (tests/fuzz) run the same code. Pure
// functions: no I/O, no locks, nothing kept.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "vmmc/core/error.h"
#include "wire.h"

namespace vmmc::core::detail {

// The frame at the front of a control stream: its body is
// input[body_offset, body_offset + body_length); `descriptors` is how many
// received fds belong to it (hello_reply with wake fds: 3; mapped import_reply: 1).
struct frame_view {
  wire::frame_type type;
  std::size_t body_offset;
  std::size_t body_length;
  std::size_t descriptors;
};
// Errors: would_block (the frame is not complete yet), protocol_error (bad
// magic or version, or a body longer than wire::max_frame_body).
result<frame_view> scan_frame(std::span<const std::uint8_t> input);

// An importer's hello: its claims and its address blob (within the body).
struct hello_view {
  wire::hello_body claims;
  std::string_view blob;
};
// Errors: protocol_error (not a hello, or a blob length that is not the rest of the body).
result<hello_view> parse_hello(wire::frame_type type, std::span<const std::uint8_t> body);

// An import request: the export name (1..max_name_length bytes, within the
// body) and the provider, cut at its first NUL.
struct import_request_view {
  wire::import_request_body request;
  std::string_view name;
  std::string_view provider;
};
// Errors: protocol_error.
result<import_request_view> parse_import_request(std::span<const std::uint8_t> body);

// An import reply. A successful one names a non-empty region; a mapped one a
// window [segment_offset, + length) that does not wrap; a fabric one the
// ring size both ends use. Errors: protocol_error.
result<wire::import_reply_body> parse_import_reply(std::span<const std::uint8_t> body);

// Whether [offset, offset + length) lies within a region of `region_length` bytes.
constexpr bool fits(std::uint64_t offset, std::uint64_t length, std::uint64_t region_length) {
  return offset <= region_length && length <= region_length - offset;
}

// What an exporter does with a fabric notification record for an export of
// `export_length` bytes; `payload_length` bytes of inline payload are at hand.
// Neither copy nor notify: the record is dropped.
struct record_plan {
  bool copy = false;    // copy h.length payload bytes to h.offset
  bool notify = false;  // then run the export's handler
};
record_plan plan_record(const wire::record_header& h, std::uint64_t export_length, bool writable,
                        std::size_t payload_length);

}  // namespace vmmc::core::detail
