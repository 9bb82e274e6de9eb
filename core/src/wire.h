// wire.h: the byte layouts vmmc::core puts on the wire.
//
// Two protocols:
//  1. The control protocol, on a kernel stream socket from importer to
//     exporter (abstract Unix socket on the same host, TCP across hosts):
//     hello, import, revoke, heartbeat. Rare, so plain framed structs.
//  2. Notification records, written by the importer into a ring in the
//     exporter's memory: on the mapped path by memcpy (notify_record in
//     core.h), on the fabric path by fi_writedata of a ring_slot whose
//     immediate data names the link and the record's sequence number.
// All integers are little-endian host order (we only run on x86-64/aarch64 LE);
// every frame starts with a magic and a version so garbage is recognised.
//
// Version history:
//   1: first version (fabric notifications as messages to posted receives).
//   2: fabric notifications as RMA writes into a per-link ring (one write
//      per small notifying send instead of a message; import_reply grew the
//      ring fields).
//   3: a hello over TCP is challenged (hello_challenge, hello_proof): the
//      importer proves its context's secret and, for "same user", the user
//      key.
//   4: import_reply may lend the exporter's wake eventfd beside the memfd
//      (has_wake_fd), for exports that sleep on one of their own.
#pragma once

#include <cstddef>
#include <cstdint>

namespace vmmc::core::detail::wire {

inline constexpr std::uint32_t control_magic = 0x434d4d56;  // "VMMC"
inline constexpr std::uint16_t control_version = 4;
inline constexpr std::uint32_t max_frame_body = 64 * 1024;  // anything larger is garbage
inline constexpr std::uint32_t max_name_length = 255;

enum class frame_type : std::uint16_t {
  hello = 1,            // importer -> exporter: body = hello_body + address blob
  hello_reply = 2,      // exporter -> importer: body = hello_reply_body; fds: wake page, eventfd
  import_request = 3,   // body = import_request_body + name bytes
  import_reply = 4,     // body = import_reply_body; fds: segment memfd when mapped, wake eventfd
  unimport = 5,         // importer -> exporter: body = unimport_body
  revoke = 6,           // exporter -> importer: body = revoke_body (export withdrawn)
  revoke_ack = 7,       // importer -> exporter: body = revoke_body; no more writes in flight
  heartbeat = 8,        // either way, empty body
  hello_challenge = 9,  // exporter -> importer over TCP, before hello_reply
  hello_proof = 10,     // importer -> exporter: the answer
};

// Every control frame: 12 bytes, then `length` body bytes.
//   bits  0..31 magic  | 32..47 version | 48..63 type | 64..95 body length
struct frame_header {
  std::uint32_t magic;
  std::uint16_t version;
  std::uint16_t type;
  std::uint32_t length;
};
static_assert(sizeof(frame_header) == 12);

struct hello_body {
  std::uint32_t uid;  // claimed uid (verified with SO_PEERCRED on Unix sockets)
  std::uint32_t pid;
  std::uint32_t address_length;  // followed by that many bytes of address blob
};

struct hello_reply_body {
  std::uint32_t status;        // vmmc::errc
  std::uint32_t has_wake_fds;  // 1 when a wake page memfd and an eventfd ride along
};

struct hello_challenge_body {
  std::uint8_t challenge[16];
};

struct hello_proof_body {
  std::uint8_t context_proof[32];  // HMAC(context secret, challenge, exporter nonce)
  std::uint8_t user_proof[32];     // HMAC(user key, challenge, exporter nonce, uid)
  std::uint32_t has_user_proof;    // 0: no user key, not "same user"
  std::uint32_t reserved;
};

struct import_request_body {
  std::uint64_t request_id;
  std::uint32_t want_mapped;  // importer can map memfds (same host, mapped path enabled)
  std::uint32_t name_length;  // followed by the name
  char provider[32];          // fabric provider the importer will use, NUL padded
};

struct import_reply_body {
  std::uint64_t request_id;
  std::uint32_t status;  // vmmc::errc
  std::uint32_t export_id;
  std::uint64_t length;
  std::uint32_t rights;
  std::uint32_t mapped;  // 1: an fd rides along; map [segment_offset, +length)
  std::uint64_t segment_offset;
  std::uint64_t remote_address;  // fabric: address to pass to fi_write for offset 0
  std::uint64_t key;             // fabric: MR key
  // fabric: the link's notification ring (see fabric_ring below)
  std::uint64_t ring_address;
  std::uint64_t ring_key;
  std::uint32_t link_id;
  std::uint32_t ring_capacity;
  // mapped: 1 when the export's wake eventfd follows the memfd
  std::uint32_t has_wake_fd;
  std::uint32_t reserved;
};

struct unimport_body {
  std::uint32_t export_id;
  std::uint32_t reserved;
};

struct revoke_body {
  std::uint32_t export_id;
  std::uint32_t reserved;
};

// ---- fabric notification ring ---------------------------------------------
inline constexpr std::uint32_t record_magic = 0x4e4d4d56;  // "VMMN"

enum class record_type : std::uint32_t {
  notify = 1,         // data already written by RMA (ordered before the record)
  inline_update = 2,  // payload follows the header; the exporter copies it in
};

// A record: 40 bytes, then `length` payload bytes for inline_update.
struct record_header {
  std::uint32_t magic;
  std::uint32_t type;
  std::uint32_t export_id;
  std::uint32_t notify;  // 1 when the exporter's handler must run
  std::uint64_t offset;
  std::uint64_t length;
  std::uint64_t value;
};
static_assert(sizeof(record_header) == 40);

// The ring one importer writes into, in the exporter's memory. The importer
// writes slot (seq % ring_slots) with fi_writedata, immediate data
//   bits 63..40 link id | bits 39..0 sequence number (low 40 bits),
// so the exporter's completion queue says which slot is complete. The
// exporter publishes `head` (records consumed); the importer reads it with
// fi_read only when its own count says the ring is full.
inline constexpr std::uint32_t ring_slots = 256;
inline constexpr std::size_t ring_slot_size = 256;
inline constexpr std::size_t ring_inline_max = ring_slot_size - sizeof(record_header);
inline constexpr int immediate_sequence_bits = 40;
inline constexpr std::uint64_t immediate_sequence_mask =
    (std::uint64_t{1} << immediate_sequence_bits) - 1;

constexpr std::uint64_t make_immediate(std::uint32_t link_id, std::uint64_t sequence) {
  return (std::uint64_t{link_id} << immediate_sequence_bits) | (sequence & immediate_sequence_mask);
}
constexpr std::uint32_t immediate_link(std::uint64_t immediate) {
  return static_cast<std::uint32_t>(immediate >> immediate_sequence_bits);
}
// Whether `immediate` names record number `sequence` (compared modulo 2^40).
constexpr bool immediate_is(std::uint64_t immediate, std::uint64_t sequence) {
  return (immediate & immediate_sequence_mask) == (sequence & immediate_sequence_mask);
}

struct fabric_ring {
  alignas(64) std::uint64_t head;
  alignas(64) std::byte slots[ring_slots][ring_slot_size];
};

}  // namespace vmmc::core::detail::wire
