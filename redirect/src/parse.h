// parse.h: the checks a channel end applies to what its peer wrote (the
// words of wire.h and the channel descriptor), apart from the channel's
// state, so that the product and the fuzz targets (tests/fuzz) run the same
// code. Pure functions over values the caller has loaded once: a peer may
// change its words at any time, so none is read twice.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "vmmc/core/error.h"
#include "wire.h"

namespace vmmc::redirect::detail {

inline constexpr std::size_t page = 4096;
inline constexpr std::size_t max_ring_bytes = std::size_t{1} << 30;

// "<export name>#<ring bytes>#<context address>": a name of 1..name_max-1
// bytes, a power-of-two ring of page..max_ring_bytes, a non-empty address;
// printable without spaces and shorter than wire::descriptor_max in all.
struct parsed_descriptor {
  std::string name;
  std::uint64_t ring_bytes = 0;
  std::string address;
};
bool parse_descriptor(std::string_view text, parsed_descriptor& out);

// The first words of the peer's area (magic, ring bytes, ring offset) as
// fetched, against the ring size its descriptor announced and the length of
// its export: the ring must lie within the export, after the header.
bool check_area(const std::uint64_t (&words)[3], std::uint64_t ring_bytes,
                std::uint64_t export_length);

// P's hello, copied out of our area with each length read once.
// Errors: protocol_error (a length over its field).
struct hello_copy {
  std::string user;
  std::string descriptor;
};
result<hello_copy> copy_hello(const wire::hello& h);

// Where the first of `length` bytes we write at stream position `start` go
// in P's post of `post_length` bytes from `post_position`: `count` bytes at
// `offset` in the posted buffer (count 0: none fall inside it).
struct post_placement {
  std::uint64_t offset = 0;
  std::size_t count = 0;
};
post_placement place_in_post(std::uint64_t post_position, std::uint64_t post_length,
                             std::uint64_t start, std::size_t length);

// P's report on our post of `post_length` bytes from `post_start`: the
// bytes before `start` came through the ring, then `redirected` were placed
// in the posted buffer. A report that starts before the post or places
// bytes outside it is a lying peer. Errors: protocol_error.
struct report_view {
  std::uint64_t from_ring = 0;   // ring bytes that belong to the post
  std::uint64_t redirected = 0;  // from_ring + redirected <= post_length
};
result<report_view> check_report(std::uint64_t start, std::uint64_t redirected,
                                 std::uint64_t post_start, std::uint64_t post_length);

}  // namespace vmmc::redirect::detail
