// nx/src/wire.h: the nx message framing, version 3.
//
// Each pair of nodes shares one redirect::channel (a byte stream each way)
// and one redirect::mailbox each way (below). A message is a 32-byte header followed
// by `length` payload bytes. Every message toward a peer takes the next
// sequence number of that pair, whichever path carries it; the reader takes
// them in that order, which gives NX's pairwise FIFO ordering. All fields
// are little-endian (both ends run this code).
//
//   offset  size  field
//   0       4     magic: 'N','X', version (3), space (1 user, 2 internal,
//                 3 control)
//   4       4     sequence (uint32, counts up from 0 per ordered pair, wraps)
//   8       8     type   (int64; user types 0..2^31-1, bit 30 = FORCE)
//   16      8     length (int64, payload bytes)
//   24      8     ptype  (int64, the sender's process type)
//
// Control messages (space 3) have no payload and are never matched by a
// receive; their type says what they mean (control_type below).
//
// Versions: 2 the mailbox; 3 control messages (start-up ready, orderly end).
#pragma once

#include <cstddef>
#include <cstdint>

#include "vmmc/redirect/mailbox.h"

namespace vmmc::nx::detail::wire {

inline constexpr std::uint8_t version = 3;

struct header {
  std::uint8_t magic[2];
  std::uint8_t version;
  std::uint8_t space;
  std::uint32_t sequence;
  std::int64_t type;
  std::int64_t length;
  std::int64_t ptype;
};
static_assert(sizeof(header) == 32);

inline header make_header(std::uint8_t space, long type, long length, long ptype) {
  return {{'N', 'X'}, version, space, 0, type, length, ptype};  // sequence: set per peer
}
inline constexpr std::int64_t max_type = 0x7fffffff;  // senders refuse larger (EQTYPE)
inline constexpr std::uint8_t control_space = 3;
enum class control_type : std::int64_t {
  // The sender's start-up is complete: it imported everything it needs of
  // ours, so we may exit without breaking it.
  ready = 1,
  // The sender's last message to us: it ended in order (exit, return from
  // main); every message it sent before came first.
  end = 2,
};
inline bool valid(const header& h) {
  if (h.magic[0] != 'N' || h.magic[1] != 'X' || h.version != version || h.length < 0) return false;
  if (h.space == control_space)
    return h.length == 0 && (h.type == static_cast<std::int64_t>(control_type::ready) ||
                             h.type == static_cast<std::int64_t>(control_type::end));
  return h.type >= 0 && h.type <= max_type && (h.space == 1 || h.space == 2);
}

// ---------------------------------------------------------------- mailbox
// A small message goes whole, header and payload, through the pair's
// redirect::mailbox when a slot is free.
inline constexpr std::size_t mailbox_payload_max = redirect::mailbox::max_message - sizeof(header);

// A message a slot can hold.
inline bool valid_in_mailbox(const header& h) {
  return valid(h) && static_cast<std::uint64_t>(h.length) <= mailbox_payload_max;
}

}  // namespace vmmc::nx::detail::wire
