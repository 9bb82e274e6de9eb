// sockets/src/wire.h: the in-band upgrade protocol on a TCP connection (v2).
//
//   client -> server TCP: [offer]  raw bytes (N_c) ... doorbells
//   server -> client TCP: [accept] hello_frame  raw bytes (N_s) ... doorbells
//
// [offer] and [accept] are single TCP *urgent* bytes (MSG_OOB). Across hosts
// each is the very first byte its sender puts on the connection, and the
// offer is the only signal: a plain TCP program never reads urgent bytes
// (unless it set SO_OOBINLINE), and the accept is never sent to a plain
// client. A vmmc end decides from the first byte it receives: urgent
// offer/accept means the peer speaks vmmc, an ordinary byte means it does
// not (for good).
//
// On one host there is no offer, and nothing of ours at all until the
// connection has earned a channel (VMMC_SOCKETS_UPGRADE_AFTER calls or 256
// KiB): the client then *asks* by marking its socket's entry in the
// presence table (presence.h), if the server's listener is entered; the
// server, looking at that entry between its calls, answers with [accept]
// and a hello_frame wherever it is in its stream. A client that asked reads
// with a peek and a look at the urgent mark, so the answer is never taken
// for data. A hello_frame with length 0 declines (the server cannot serve
// it): both directions stay on TCP.
//
// The server answers with [accept] and a hello_frame naming its redirect
// channel. The client connects its channel to it; the channel hello
// (redirect::channel user payload) carries N_c, the number of raw bytes the
// client wrote before switching. The server does the same with N_s once it
// has the client's channel hello. Each reader drains exactly N raw bytes from
// TCP, then reads the channel; later TCP bytes are doorbells (one byte each)
// that wake a sleeping reader. A writer rings after placing its channel hello,
// so a reader asleep on TCP learns of the switch.
//
// Going back (v2; for fork and exec, see revert.cc). After a direction's
// switch its TCP bytes are records: [doorbell] (1 byte), [revert request]
// (1 byte: "send me your end record"), or [end record] + 8 bytes, the
// little-endian count of channel bytes the sender wrote in all. After an end
// record the sender writes on TCP only (no more doorbells): the reader takes
// that many bytes from the channel, then reads TCP as application data.
//
// Versions: 1 upgrade and doorbells; 2 adds the revert records.
#pragma once

#include <cstddef>
#include <cstdint>

namespace vmmc::sockets::wire {

inline constexpr unsigned char offer_byte = 0xD6;   // urgent, client -> server
inline constexpr unsigned char accept_byte = 0xD7;  // urgent, server -> client
inline constexpr unsigned char doorbell_byte = 0xDB;
inline constexpr unsigned char revert_request_byte = 0xDC;
inline constexpr unsigned char end_record_byte = 0xDD;  // + 8 bytes, little-endian
inline constexpr std::size_t end_record_size = 9;

inline constexpr std::uint32_t hello_magic = 0x53484d56;  // "VMHS" little-endian
inline constexpr std::uint16_t version = 2;

// Follows [accept]; then `length` bytes of the server's channel descriptor.
struct hello_frame {
  std::uint32_t magic;
  std::uint16_t version;
  std::uint16_t length;
};
static_assert(sizeof(hello_frame) == 8);

}  // namespace vmmc::sockets::wire
