// wire.h: the byte layouts vmmc::core puts on the wire.
//
// Two protocols:
//  1. The control protocol, on a kernel stream socket from importer to
//     exporter (abstract Unix socket on the same host, TCP across hosts):
//     hello, import, revoke, heartbeat. Rare, so plain framed structs.
//  2. Fabric messages, on the libfabric endpoint beside RMA: notifications and
//     inline updates (header followed by up to inline_max payload bytes).
// All integers are little-endian host order (we only run on x86-64/aarch64 LE);
// every frame starts with a magic and a version so garbage is recognised.
//
// Version history:
//   1: first version.
#pragma once

#include <cstdint>

namespace vmmc::core::detail::wire {

inline constexpr std::uint32_t control_magic = 0x434d4d56;  // "VMMC"
inline constexpr std::uint16_t control_version = 1;
inline constexpr std::uint32_t max_frame_body = 64 * 1024;  // anything larger is garbage
inline constexpr std::uint32_t max_name_length = 255;

enum class frame_type : std::uint16_t {
  hello = 1,          // importer -> exporter: body = hello_body + address blob
  hello_reply = 2,    // exporter -> importer: body = hello_reply_body; fds: wake page, eventfd
  import_request = 3, // body = import_request_body + name bytes
  import_reply = 4,   // body = import_reply_body; fds: segment memfd when mapped
  unimport = 5,       // importer -> exporter: body = unimport_body
  revoke = 6,         // exporter -> importer: body = revoke_body (export withdrawn)
  revoke_ack = 7,     // importer -> exporter: body = revoke_body; no more writes in flight
  heartbeat = 8,      // either way, empty body
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
  std::uint32_t uid;           // claimed uid (verified with SO_PEERCRED on Unix sockets)
  std::uint32_t pid;
  std::uint32_t address_length;  // followed by that many bytes of address blob
};

struct hello_reply_body {
  std::uint32_t status;        // vmmc::errc
  std::uint32_t has_wake_fds;  // 1 when a wake page memfd and an eventfd ride along
};

struct import_request_body {
  std::uint64_t request_id;
  std::uint32_t want_mapped;   // importer can map memfds (same host, mapped path enabled)
  std::uint32_t name_length;   // followed by the name
  char provider[32];           // fabric provider the importer will use, NUL padded
};

struct import_reply_body {
  std::uint64_t request_id;
  std::uint32_t status;        // vmmc::errc
  std::uint32_t export_id;
  std::uint64_t length;
  std::uint32_t rights;
  std::uint32_t mapped;        // 1: an fd rides along; map [segment_offset, +length)
  std::uint64_t segment_offset;
  std::uint64_t remote_address;  // fabric: address to pass to fi_write for offset 0
  std::uint64_t key;             // fabric: MR key
};

struct unimport_body {
  std::uint32_t export_id;
  std::uint32_t reserved;
};

struct revoke_body {
  std::uint32_t export_id;
  std::uint32_t reserved;
};

// ---- fabric messages ----------------------------------------------------
inline constexpr std::uint32_t message_magic = 0x4e4d4d56;  // "VMMN"

enum class message_type : std::uint32_t {
  notify = 1,         // data already written by RMA (ordered before this message)
  inline_update = 2,  // payload follows; receiver copies it to (export, offset)
};

// 40 bytes, then `length` payload bytes for inline_update.
struct message_header {
  std::uint32_t magic;
  std::uint32_t type;
  std::uint32_t export_id;
  std::uint32_t notify;   // 1 when the exporter's handler must run
  std::uint64_t offset;
  std::uint64_t length;
  std::uint64_t value;
};
static_assert(sizeof(message_header) == 40);

}  // namespace vmmc::core::detail::wire
