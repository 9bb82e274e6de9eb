// Helpers of the redirect integration tests: checked byte streams (a pattern
// whose byte at stream offset o is fixed, so a lost, duplicated or misplaced
// byte shows up as a mismatch at a known offset), bounded polling, and the
// channel set-up handshake.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "vmmc/redirect/channel.h"

namespace vmmc::test {

// Byte o of the stream is text[o % period]. The period is odd, so it never
// lines up with a ring (a power of two): every wrap-around sees new bytes.
// Any chunk up to max_chunk is one contiguous slice of `text`, so writers
// send straight from it and readers compare with memcmp.
class pattern_stream {
 public:
  static constexpr std::size_t period = (std::size_t{1} << 20) + 7;
  static constexpr std::size_t max_chunk = std::size_t{256} << 10;

  explicit pattern_stream(unsigned seed) : text_(period + max_chunk) {
    std::mt19937 rng(seed);
    for (std::size_t i = 0; i < period; ++i) text_[i] = static_cast<unsigned char>(rng());
    std::memcpy(text_.data() + period, text_.data(), max_chunk);
  }

  // The next `length` (<= max_chunk) bytes of the stream from `offset`.
  const unsigned char* at(std::uint64_t offset) const { return text_.data() + offset % period; }

  // s[offset, offset + length) of any length.
  std::vector<unsigned char> copy(std::uint64_t offset, std::size_t length) const {
    std::vector<unsigned char> out(length);
    for (std::size_t done = 0; done < length; done += max_chunk)
      std::memcpy(out.data() + done, at(offset + done), std::min(max_chunk, length - done));
    return out;
  }

  // Index of the first byte of data[0, length) that is not the stream's
  // byte at offset + index, or `length` when all match.
  std::size_t mismatch(const void* data, std::size_t length, std::uint64_t offset) const {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t done = 0; done < length;) {
      std::size_t n = std::min(length - done, max_chunk);
      if (std::memcmp(p + done, at(offset + done), n) != 0) {
        for (std::size_t i = 0; i < n; ++i)
          if (p[done + i] != at(offset + done)[i]) return done + i;
      }
      done += n;
    }
    return length;
  }

 private:
  std::vector<unsigned char> text_;
};

// Sizes from 1 byte up to `max`, spread evenly over the powers of two so
// that tiny writes are as common as large ones.
inline std::size_t random_size(std::mt19937& rng, std::size_t max) {
  std::size_t bits = rng() % 19;  // 1 .. 256 Ki
  std::size_t n = 1 + rng() % (std::size_t{1} << bits);
  return std::min(n, max);
}

// Calls poll() on every end in `ends` until `done()` holds or `timeout`
// passed; returns done().
template <class Done>
bool pump(std::initializer_list<redirect::channel*> ends, Done done,
          std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return done();
    bool changed = false;
    for (redirect::channel* c : ends) changed |= c->poll();
    if (!changed) std::this_thread::yield();
  }
  return true;
}

// Writes s[offset, offset + length) from `from`, polling `polled` while the
// ring is full, for at most `timeout`. Stops at the first error other than
// would_block.
struct write_outcome {
  std::size_t written = 0;
  status error;
};
inline write_outcome write_pattern(redirect::channel& from,
                                   std::initializer_list<redirect::channel*> polled,
                                   const pattern_stream& s, std::uint64_t offset,
                                   std::size_t length,
                                   std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  write_outcome out;
  pump(
      polled,
      [&] {
        result<std::size_t> w = from.write(s.at(offset + out.written), length - out.written);
        if (w) {
          out.written += *w;
        } else if (!w.is(errc::would_block)) {
          out.error = w.error();
          return true;
        }
        return out.written == length;
      },
      timeout);
  return out;
}

// Writes s from `offset` on until `from` would block (the peer's ring is
// full, nobody reading); returns how many bytes that took, or the error that
// stopped it.
inline result<std::uint64_t> fill_ring(redirect::channel& from, const pattern_stream& s,
                                       std::uint64_t offset = 0) {
  std::uint64_t written = 0;
  for (;;) {
    result<std::size_t> w = from.write(s.at(offset + written), 10000);
    if (!w) {
      if (w.is(errc::would_block)) return written;
      return w.error();
    }
    written += *w;
  }
}

inline std::string describe(const std::error_code& e) {
  return e ? e.message() + " (" + std::to_string(e.value()) + ")" : "ok";
}

// The passive end's side of the set-up when the active end is another
// process: accept_peer polled until it completes or `timeout` passed.
inline result<std::string> accept_within(redirect::channel& passive, std::string_view hello,
                                         std::chrono::milliseconds timeout) {
  result<std::string> accepted = errc::would_block;
  pump(
      {&passive},
      [&] {
        accepted = passive.accept_peer(hello);
        return !accepted.is(errc::would_block);
      },
      timeout);
  return accepted;
}

// The active end's side of the set-up when the passive end is another
// process: connect to `descriptor`, then peer_hello polled until it comes
// (the passive end's hello) or `timeout` passed.
inline result<std::string> connect_within(redirect::channel& active, std::string_view descriptor,
                                          std::string_view hello,
                                          std::chrono::milliseconds timeout) {
  if (status s = active.connect(descriptor, hello); !s) return s.error();
  result<std::string> heard = errc::would_block;
  pump(
      {&active},
      [&] {
        heard = active.peer_hello();
        return !heard.is(errc::would_block);
      },
      timeout);
  return heard;
}

// Runs the set-up between `passive` and `active`: connect, then accept_peer
// and peer_hello polled until both complete; checks both hellos.
inline void handshake(redirect::channel& passive, redirect::channel& active,
                      std::string_view passive_hello, std::string_view active_hello) {
  status s = active.connect(passive.descriptor(), active_hello);
  ASSERT_TRUE(s.ok()) << describe(s.error());
  result<std::string> accepted = errc::would_block;
  ASSERT_TRUE(pump({&passive, &active}, [&] {
    accepted = passive.accept_peer(passive_hello);
    return !accepted.is(errc::would_block);
  })) << "accept_peer still would_block after 5 s";
  ASSERT_TRUE(accepted) << describe(accepted.error());
  EXPECT_EQ(*accepted, active_hello);
  result<std::string> heard = errc::would_block;
  ASSERT_TRUE(pump({&passive, &active}, [&] {
    heard = active.peer_hello();
    return !heard.is(errc::would_block);
  })) << "peer_hello still would_block after 5 s";
  ASSERT_TRUE(heard) << describe(heard.error());
  EXPECT_EQ(*heard, passive_hello);
}

}  // namespace vmmc::test
