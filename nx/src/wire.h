// nx/src/wire.h: the nx message framing on a redirect channel, version 1.
//
// Each pair of nodes shares one redirect::channel (a byte stream each way).
// A message is a 32-byte header followed by `length` payload bytes; headers
// and payloads follow each other in send order, which gives NX's pairwise
// FIFO ordering. All fields are little-endian (both ends run this code).
//
//   offset  size  field
//   0       4     magic: 'N','X', version (1), space (1 user, 2 internal)
//   4       4     reserved, 0
//   8       8     type   (int64; user types 0..2^31-1, bit 30 = FORCE)
//   16      8     length (int64, payload bytes)
//   24      8     ptype  (int64, the sender's process type)
#pragma once

#include <cstdint>

namespace vmmc::nx::detail::wire {

inline constexpr std::uint8_t version = 1;

struct header {
  std::uint8_t magic[2];
  std::uint8_t version;
  std::uint8_t space;
  std::uint32_t reserved;
  std::int64_t type;
  std::int64_t length;
  std::int64_t ptype;
};
static_assert(sizeof(header) == 32);

inline header make_header(std::uint8_t space, long type, long length, long ptype) {
  return {{'N', 'X'}, version, space, 0, type, length, ptype};
}
inline bool valid(const header& h) {
  return h.magic[0] == 'N' && h.magic[1] == 'X' && h.version == version && h.length >= 0 &&
         (h.space == 1 || h.space == 2);
}

}  // namespace vmmc::nx::detail::wire
