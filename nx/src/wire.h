// nx/src/wire.h: the nx message framing, version 3.
//
// Each pair of nodes shares one redirect::channel (a byte stream each way)
// and one mailbox each way (below). A message is a 32-byte header followed
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
// A node's area for one peer (see mailbox.h). The peer writes a message into
// slot n % mailbox_slots, then (ordered after it) the slot's stamp n + 1; the
// owner polls the stamp of the slot it expects next.
inline constexpr std::uint64_t mailbox_magic = 0x3378'6f62'6c69'614dull;  // "Mailbox3"
// Few slots, reused often: a ping-pong through 4 or 8 slots measured
// 0.335-0.34 us one-way against 0.345 through 16 or 64 (a C model of the
// slot protocol alone: 0.32 against 0.34; a line that crossed between the
// two cores recently crosses back faster), and 8 hold a short burst.
inline constexpr std::size_t mailbox_slots = 8;
// A slot holds up to 1 KiB of payload: the reader copies a slot's lines in
// parallel, where a stream message costs it two misses one after the other.
inline constexpr std::size_t mailbox_slot_bytes = 1088;
inline constexpr std::size_t mailbox_payload_max =
    mailbox_slot_bytes - sizeof(std::uint64_t) - sizeof(header);

struct alignas(64) mailbox_slot {
  std::uint64_t stamp;  // n + 1 once message n is complete here
  header h;
  std::byte payload[mailbox_payload_max];
};
static_assert(sizeof(mailbox_slot) == mailbox_slot_bytes);

// A message a slot can hold.
inline bool valid_in_mailbox(const header& h) {
  return valid(h) && static_cast<std::uint64_t>(h.length) <= mailbox_payload_max;
}

struct alignas(64) mailbox_area {
  std::uint64_t magic;
  // Written by the owner O: messages O placed in the peer's slots, counted
  // before each is written (the peer fetches it before it sleeps).
  alignas(64) std::uint64_t own_sent;
  // Written by the peer P.
  alignas(64) std::uint64_t credit;  // O's messages P consumed
  std::uint64_t armed;               // epoch: P sleeps until O writes again
  alignas(64) mailbox_slot slots[mailbox_slots];
};

}  // namespace vmmc::nx::detail::wire
