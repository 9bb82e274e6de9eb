// nx/src/mailbox.h: the small-message path between two nodes.
//
// A stream message costs the reader two cache misses before it can act (the
// channel's produced word, then the ring bytes it announces) and the writer
// two cross-core writes. A mailbox slot holds a whole small message next to
// the stamp that validates it, so the reader's poll of the stamp brings the
// message with it: that is what makes short ping-pongs fast (Open MPI's
// shared-memory "fastboxes" do the same). The message and then its stamp go
// in one gathered core send, whose pieces land in order on every core path.
//
// Each node exports one area per peer (layout in wire.h's mailbox section).
// The peer writes messages into its slots, returns credits and arms for
// wake-ups there; the owner only reads it, except its own `sent` count.
// Messages carry the pair's sequence number, as stream messages do, and the
// reader takes them in that order from whichever path has the next one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "vmmc/core/context.h"
#include "wire.h"

namespace vmmc::nx::detail {

class mailbox {
 public:
  explicit mailbox(core::context& ctx) : ctx_(ctx) {}
  mailbox(const mailbox&) = delete;
  mailbox& operator=(const mailbox&) = delete;
  ~mailbox();

  // Allocates and exports this end's area under a fresh unguessable name.
  status create();
  const std::string& name() const { return name_; }
  // Imports the peer's area (exported under `name` by the context at `address`).
  status attach(std::string_view address, std::string_view name);

  // --- writing toward the peer ---
  // Places a message of up to wire::mailbox_payload_max bytes in the peer's
  // next slot; false (nothing written) when it is too long or no slot is free.
  result<bool> try_send(const wire::header& h, const void* payload);
  // After a try_send: true once per arming of the peer, which then sleeps
  // until told (the caller rings its doorbell).
  bool peer_wants_wakeup();

  // --- reading from the peer ---
  // The next message, or null when none has landed yet.
  const wire::mailbox_slot* next();
  // Releases the slot `next()` returned, which held `length` payload bytes.
  void consume(std::size_t length);
  // Arms the peer to ring us when it writes again; false when a message is
  // already on its way (poll instead of sleeping).
  bool prepare_sleep();

 private:
  void put(std::size_t offset, std::uint64_t value);
  void give_credit();

  core::context& ctx_;
  std::string name_;
  core::mappable_buffer memory_;
  wire::mailbox_area* area_ = nullptr;  // ours; the peer writes into it
  core::export_handle export_{};
  bool exported_ = false;
  core::import_handle peer_{};  // the peer's area; we write into it
  core::sender to_peer_;        // its hot path
  bool attached_ = false;

  std::uint64_t sent_ = 0;          // messages placed in the peer's slots
  std::uint64_t credit_ = 0;        // of those, how many the peer consumed (last read)
  std::uint64_t last_rung_ = 0;     // the peer's arming epoch we last answered
  std::uint64_t taken_ = 0;         // messages consumed from our slots
  std::uint64_t credited_ = 0;      // `taken_` as last told to the peer
  std::uint64_t arm_epoch_ = 0;     // our arming, as last written to the peer
  std::size_t prefetch_lines_ = 0;  // slot lines past the stamp's to pull in while polling
};

}  // namespace vmmc::nx::detail
