// vmmc/redirect/mailbox.h: a small-message lane between two processes, beside
// a channel's byte streams.
//
// A stream message costs the reader two cache misses before it can act (the
// channel's produced word, then the ring bytes it announces) and the writer
// two cross-core writes. A mailbox slot holds a whole small message next to
// the stamp that validates it, so the reader's poll of the stamp brings the
// message with it: that is what makes short ping-pongs fast (Open MPI's
// shared-memory "fastboxes" do the same). The message and then its stamp go
// in one gathered core send, whose pieces land in order on every core path.
//
// The payload is opaque: a message is up to max_message bytes, given as a
// head and a body (a protocol's header and its payload, gathered without a
// copy) and read back as one span. Order between a mailbox and other paths
// (a channel) is the user's: NX numbers its messages and takes them in that
// order from whichever path has the next one.
//
// Each end exports one area, to anyone who knows its unguessable name. The
// peer writes messages into its slots, returns credits and arms for wake-ups
// there; the owner only reads it, except its own `sent` count. A peer that
// writes a malformed slot breaks the lane (broken()), nothing else.
//
// Sleeping without losing a wake-up: as for a channel, a reader about to
// sleep calls prepare_sleep(); a writer asks peer_wants_wakeup() after each
// message and rings the peer's doorbell (the user's) when it says so.
//
// Thread safety: one thread writes while another reads; set-up and
// destruction need exclusive access.
#pragma once
#pragma GCC visibility push(default)  // the library's API (see cmake/layer.cmake)

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "vmmc/core/context.h"

namespace vmmc::redirect {

namespace detail {
// The area an end exports. The peer writes message n into slot n % slots,
// then (ordered after it) the slot's stamp; the owner polls the stamp of the
// slot it expects next. A stamp is n + 1 in its low 48 bits (compared modulo
// 2^48: 89 years at 100 million messages a second) and the message's length
// in its high 16, so that one word validates and sizes the message. Here for
// the inline reading path only.
inline constexpr std::uint64_t mailbox_magic = 0x3478'6f62'6c69'614dull;  // "Mailbox4"
// Few slots, reused often: a ping-pong through 4 or 8 slots measured
// 0.335-0.34 us one-way against 0.345 through 16 or 64 (a C model of the
// slot protocol alone: 0.32 against 0.34; a line that crossed between the
// two cores recently crosses back faster), and 8 hold a short burst.
inline constexpr std::size_t mailbox_slots = 8;
inline constexpr std::uint64_t stamp_count_mask = (std::uint64_t{1} << 48) - 1;
inline constexpr std::size_t mailbox_slot_bytes = 1088;  // 17 cache lines

struct alignas(64) mailbox_slot {
  std::uint64_t stamp;
  std::byte message[mailbox_slot_bytes - sizeof(std::uint64_t)];
};
static_assert(sizeof(mailbox_slot) == mailbox_slot_bytes);

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
}  // namespace detail

class mailbox {
 public:
  // The largest message a slot holds.
  static constexpr std::size_t max_message = sizeof(detail::mailbox_slot::message);

  // A message in its slot (data null: none).
  struct message {
    const std::byte* data = nullptr;
    std::size_t length = 0;
    explicit operator bool() const { return data != nullptr; }
  };

  explicit mailbox(core::context& ctx) : ctx_(ctx) {}
  mailbox(const mailbox&) = delete;
  mailbox& operator=(const mailbox&) = delete;
  ~mailbox();

  // Allocates and exports this end's area under a fresh unguessable name.
  status create();
  const std::string& name() const { return name_; }
  // Imports the peer's area (exported under `name` by the context at
  // `address`). Errors: core's import errors, protocol_error (not a mailbox).
  status attach(std::string_view address, std::string_view name);

  // --- writing toward the peer ---
  // Places the message head + body (together up to max_message bytes) in
  // the peer's next slot; false (nothing written) when it is too long, not
  // attached, or no slot is free (the peer has not consumed them yet).
  // Errors: core's send errors (the peer is gone).
  result<bool> try_send(const void* head, std::size_t head_length, const void* body,
                        std::size_t body_length);
  // After a try_send: true once per arming of the peer, which then sleeps
  // until told (the caller rings its doorbell).
  bool peer_wants_wakeup();

  // --- reading from the peer (inline: a receiver's polling path) ---
  // The next message, in the order sent, or none when none has landed yet
  // (or the lane is broken). Valid until consume().
  message next() {
    const detail::mailbox_slot& s = area_->slots[taken_ % detail::mailbox_slots];
    const std::uint64_t stamp =
        std::atomic_ref<const std::uint64_t>(s.stamp).load(std::memory_order_acquire);
    if (((stamp ^ (taken_ + 1)) & detail::stamp_count_mask) == 0 && !broken_) {
      current_length_ = static_cast<std::size_t>(stamp >> 48);
      if (current_length_ <= max_message) return {s.message, current_length_};
      broken_ = true;
      return {};
    }
    // Not there yet. While polling, pull in the slot's further lines, as
    // many as the last message had (the next is likely the same size): read
    // after the stamp, each would cost one more transfer between the cores
    // in turn (64 B one-way 0.48-0.50 against 0.36-0.37 us). Prefetching
    // never faults, and a line the writer then takes is simply fetched again.
    const auto* line = reinterpret_cast<const char*>(&s);
    for (std::size_t l = 1; l <= prefetch_lines_; ++l) __builtin_prefetch(line + 64 * l);
    return {};
  }
  // Releases the message next() returned.
  void consume() {
    // Past 8 lines, prefetching races the writer still copying the rest (a
    // 1 KiB message measured slower with it).
    const std::size_t lines =
        (offsetof(detail::mailbox_slot, message) + current_length_ + 63) / 64 - 1;
    prefetch_lines_ = lines <= 8 ? lines : 0;
    ++taken_;
    // A reader kept busy returns credits every half of the slots; the
    // writer falls back to its other path meanwhile, so it never waits.
    if (taken_ - credited_ >= detail::mailbox_slots / 2) give_credit();
  }
  // Arms the peer to ring us when it writes again; false when a message is
  // already on its way (poll instead of sleeping).
  bool prepare_sleep();
  // The peer wrote a slot no sender of ours would (a length past
  // max_message): nothing more is read from it.
  bool broken() const { return broken_; }

 private:
  void put(std::size_t offset, std::uint64_t value);
  void give_credit();

  core::context& ctx_;
  std::string name_;
  core::mappable_buffer memory_;
  detail::mailbox_area* area_ = nullptr;  // ours; the peer writes into it
  core::export_handle export_{};
  bool exported_ = false;
  core::import_handle peer_{};  // the peer's area; we write into it
  core::sender to_peer_;        // its hot path
  bool attached_ = false;
  bool broken_ = false;

  std::uint64_t sent_ = 0;          // messages placed in the peer's slots
  std::uint64_t credit_ = 0;        // of those, how many the peer consumed (last read)
  std::uint64_t last_rung_ = 0;     // the peer's arming epoch we last answered
  std::uint64_t taken_ = 0;         // messages consumed from our slots
  std::uint64_t credited_ = 0;      // `taken_` as last told to the peer
  std::uint64_t arm_epoch_ = 0;     // our arming, as last written to the peer
  std::size_t current_length_ = 0;  // of the message next() returned
  std::size_t prefetch_lines_ = 0;  // slot lines past the stamp's to pull in while polling
};

}  // namespace vmmc::redirect

#pragma GCC visibility pop
