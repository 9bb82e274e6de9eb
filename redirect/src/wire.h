// redirect/src/wire.h: layout of a channel end's receive area (version 1).
//
// Each end of a channel exports one *area*: this header, then its default
// buffer (the ring). The owner (O) reads every word in place; the peer (P)
// writes the words marked "P writes" with core sends and reads the words
// marked "O writes" with core fetches. Words are 64-bit, little-endian, and
// written whole; a record of several words is published by writing its `id`
// (or `state`) word last, in a separate send, so a reader that sees the id
// sees the rest (core keeps the sends of one importer in order).
//
// Versions: 1 = first version (ring, credits, doorbell arming, one post).
#pragma once

#include <cstddef>
#include <cstdint>

namespace vmmc::redirect::wire {

inline constexpr std::uint64_t area_magic = 0x3176'6552'636d'6d76ull;  // "vmmcRev1"
inline constexpr std::size_t name_max = 48;                            // export names in posts
inline constexpr std::size_t user_hello_max = 64;
inline constexpr std::size_t descriptor_max = 3072;

// P's hello: how O reaches P back, plus the user's payload.
struct hello {
  std::uint64_t state;  // 0 empty, 1 present (written last)
  std::uint32_t descriptor_length;
  std::uint32_t user_length;
  char user[user_hello_max];
  char descriptor[descriptor_max];
};

// P asks O to place O's next bytes (stream positions from `stream_position`)
// into P's exported buffer `name`, up to `length` bytes.
struct post {
  std::uint64_t stream_position;
  std::uint64_t length;
  char name[name_max];
  std::uint64_t id;  // written last; ids count up from 1
};

// P's answer to O's post: P placed `redirected` bytes into O's buffer, at
// stream positions [start, start + redirected). Stream bytes before `start`
// went to O's ring. Written once per post, always within the P write call
// that first saw the post.
struct report {
  std::uint64_t start;
  std::uint64_t redirected;
  std::uint64_t id;  // written last
};

struct alignas(64) area_header {
  // Set by O before exporting; P fetches them once to check the area.
  std::uint64_t magic;
  std::uint64_t ring_bytes;
  std::uint64_t ring_offset;

  // --- O writes (P fetches): O's side of the sleep checks ----------------
  alignas(64) std::uint64_t own_sent;  // stream bytes O issued toward P
  std::uint64_t own_consumed;          // ring bytes of P's data O consumed
  std::uint64_t own_post_seen;         // last post id of P that O took up

  // --- P writes: the P -> O stream --------------------------------------
  alignas(64) std::uint64_t produced;  // stream bytes of P complete in O's memory
  std::uint64_t fin;                   // 1 + P's stream length once P closed writing
  std::uint64_t space_armed;           // epoch << 1 | by wait fd: P sleeps until O frees space
  report post_report;                  // about O's post
  // --- P writes: about the O -> P stream --------------------------------
  alignas(64) std::uint64_t credit;  // ring bytes of O's data P consumed
  std::uint64_t data_armed;          // epoch << 1 | by wait fd: P sleeps until O sends
  std::uint64_t withdrawn;           // highest post id of P that P withdrew
  post open_post;                    // P's post for O's next bytes

  alignas(64) hello peer_hello;  // P's hello
};

static_assert(sizeof(area_header) % 64 == 0);

}  // namespace vmmc::redirect::wire
