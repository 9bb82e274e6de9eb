// sockets/src/flow.h: one direction of a stream's state, as one word.
#pragma once

#include <atomic>
#include <cassert>
#include <cstdint>

namespace vmmc::sockets::detail {

// One direction of a stream as one word: how its bytes travel now, and
// what a call in that direction must look at before it moves any. The
// carrier only moves forward: TCP (raw bytes), then the channel from a byte
// count on (our hello placed / every raw byte of the peer's read: wire.h),
// then TCP again after an end record (revert.cc). Each change is one of the
// transitions below, a single read-modify-write of the word; nothing else
// writes it. A call that finds the word exactly `channel` has nothing to
// look at but the channel: the fast paths of transmit() and receive() are
// that one load (taken again under the direction's lock).
//
// Legal words: tcp_again and records_closed only with channel, in's
// end_due too (out's may come first: the peer asks before our hello);
// records_closed only while our end record goes out (then tcp_again, or
// cleared if the record could not go); stashed only in. orphaned and
// failed are for good: every later call takes the slow path.
class flow {
 public:
  using word = std::uint8_t;
  static constexpr word channel = 1;    // switched: the channel carries it
  static constexpr word tcp_again = 2;  // reverted: back on TCP after an end record
  static constexpr word shut = 4;       // shut by the program, or the stream failed
  // out: the peer asked for our end record (revert_request_byte);
  // in: the peer's end record arrived (peer_channel_end is known).
  static constexpr word end_due = 8;
  static constexpr word records_closed = 16;  // out: no doorbell now, our end record goes out
  static constexpr word stashed = 32;         // in: bytes taken back before a revert come first
  static constexpr word orphaned = 64;        // a fork() copy of a stream on VMMC: unusable (EIO)
  static constexpr word failed = 128;         // an error waits to be reported (pending_error)

  word load() const { return bits_.load(); }
  bool switched() const { return load() & channel; }  // even if back on TCP since
  bool reverted() const { return load() & tcp_again; }
  bool on_channel() const { return (load() & (channel | tcp_again)) == channel; }
  bool is_shut() const { return load() & shut; }
  bool has(word bit) const { return load() & bit; }

  void to_channel() { bits_.fetch_or(channel); }
  void to_tcp_again() {
    [[maybe_unused]] const word before = bits_.fetch_or(tcp_again);
    assert(before & channel);
  }
  // Returns whether it was shut already.
  bool shut_down() { return bits_.fetch_or(shut) & shut; }
  void shutdown_refused() { bits_.fetch_and(static_cast<word>(~shut)); }  // the kernel's failed
  void note_end_due() { bits_.fetch_or(end_due); }
  void close_records() {
    [[maybe_unused]] const word before = bits_.fetch_or(records_closed);
    assert(before & channel);
  }
  void reopen_records() { bits_.fetch_and(static_cast<word>(~records_closed)); }
  void note_stash() { bits_.fetch_or(stashed); }
  void orphan() { bits_.fetch_or(orphaned); }
  void note_failure() { bits_.fetch_or(failed); }

 private:
  std::atomic<word> bits_{0};
};

}  // namespace vmmc::sockets::detail
