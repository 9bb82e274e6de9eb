// parse.h: the checks a vmmc stream applies to the upgrade bytes its peer
// sends over TCP (wire.h), apart from the descriptor they arrive on, so that
// the product and the fuzz targets (tests/fuzz) run the same code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "wire.h"

namespace vmmc::sockets::detail {

// The hello frame after [accept]: our magic and version, and a descriptor of
// 1..65535 bytes to follow.
bool hello_frame_ok(const wire::hello_frame& frame);

// N, the raw TCP bytes the peer wrote before switching, from its channel
// hello: all decimal digits. Nullopt when the hello is anything else.
std::optional<std::uint64_t> parse_raw_count(std::string_view hello);

// The records at the front of TCP bytes after the peer's switch: doorbells
// and revert requests up to the first end record (or all, without one).
struct record_scan {
  std::size_t take = 0;              // bytes to consume (<= the bytes given)
  bool revert_asked = false;         // a revert request among them
  std::optional<std::uint64_t> end;  // a whole end record's channel byte count
};
// An end record cut short stops `take` before it: it is taken whole later.
record_scan scan_records(std::span<const unsigned char> bytes);

}  // namespace vmmc::sockets::detail
