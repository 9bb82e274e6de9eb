// integration.redirect.faults: checksummed channel streams under injected
// faults (tests/support/fault.h), over each transport:
//   - the reader process stopped (SIGSTOP) while the writer goes on: the
//     writer fills the ring and no more (flow control), and once the reader
//     is continued every byte arrives once, in order;
//   - the same with the reader held in-process by a gate in its loop;
//   - the reader process killed mid-stream: the writer gets peer_gone
//     within two seconds, never a hang, and the reader had verified every
//     byte it got;
//   - the core control connections between the two contexts shut down
//     (the "bootstrap says the peer is gone" case without a death): both
//     ends get peer_gone, the bytes that arrived before are intact.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "integration/core/child_process.h"
#include "integration/core/transports.h"
#include "integration/redirect/streams.h"
#include "support/fault.h"
#include "time_scale.h"

namespace vmmc::test {
namespace {

using namespace std::chrono_literals;
using redirect::channel;
using clock_type = std::chrono::steady_clock;

constexpr std::size_t ring = std::size_t{64} << 10;
constexpr std::uint64_t seed = 0xC4A1;

redirect::channel_options options() {
  redirect::channel_options o;
  o.ring_bytes = ring;
  o.post_min = 4 << 10;
  return o;
}

// The child: the passive end and the reader. Prints its descriptor, accepts
// the parent, then reads and verifies pattern `seed` until end of stream,
// printing "at <bytes>" after every `report_every` bytes (0: never), and at the end
// "read <verified> <checksum> <ok or the verifier's error>".
int reading_child(const transport& t, int to_parent, std::uint64_t report_every) {
  core::context c = make_context(t);
  auto ch = channel::create(c, options());
  if (!ch) return 2;
  child_process::send_line(to_parent, ch->descriptor());
  if (!accept_within(*ch, "child", 10s)) return 3;
  fault::stream_verifier v(seed);
  std::vector<unsigned char> buffer(ring);
  std::uint64_t next_report = report_every;
  for (;;) {
    std::size_t n = ch->read(buffer.data(), buffer.size());
    if (n > 0) {
      v.feed(buffer.data(), n);
      if (report_every > 0 && v.verified() >= next_report) {
        child_process::send_line(to_parent, "at " + std::to_string(v.verified()));
        next_report += report_every;
      }
      continue;
    }
    if (ch->at_end()) break;
    if (ch->peer_gone()) return 4;
    if (!ch->poll()) std::this_thread::yield();
  }
  std::string verdict = v.ok() ? "ok" : v.error();
  child_process::send_line(to_parent, "read " + std::to_string(v.verified()) + " " +
                                          std::to_string(v.checksum()) + " " + verdict);
  return 0;
}

// Writes pattern bytes [written, until) from `from` without blocking,
// polling while the ring is full, until `deadline`; `each` runs after every
// attempt. Returns the error that stopped it (ok at `until` or the deadline).
status write_pattern(channel& from, std::uint64_t& written, std::uint64_t until,
                     clock_type::time_point deadline, const std::function<void()>& each = {}) {
  std::vector<unsigned char> chunk(100000);
  while (written < until && clock_type::now() < deadline) {
    std::size_t n =
        static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size(), until - written));
    fault::fill_pattern(seed, written, chunk.data(), n);
    result<std::size_t> w = from.write(chunk.data(), n);
    if (w) {
      written += *w;
    } else if (w.is(errc::would_block)) {
      if (!from.poll()) std::this_thread::yield();
    } else {
      return w.error();
    }
    if (each) each();
  }
  return {};
}

class Faults : public testing::TestWithParam<transport> {
 protected:
  // Starts reading_child, then connects this process's end to it.
  void connect_to_child(std::uint64_t report_every) {
    child_.emplace(
        [this, report_every](int out) { return reading_child(GetParam(), out, report_every); },
        40s);
    std::string descriptor = child_->read_line();
    ASSERT_FALSE(descriptor.empty()) << "the child printed no descriptor";
    context_.emplace(make_context(GetParam()));
    auto created = channel::create(*context_, options());
    ASSERT_TRUE(created) << describe(created.error());
    me_.emplace(std::move(*created));
    result<std::string> heard = connect_within(*me_, descriptor, "parent", 5s);
    ASSERT_TRUE(heard) << describe(heard.error());
  }

  std::optional<child_process> child_;  // declared first: outlives the rest
  std::optional<core::context> context_;
  std::optional<channel> me_;
};

TEST_P(Faults, ReaderStoppedWhileTheWriterFillsTheRingGetsEveryByteOnce) {
  constexpr std::uint64_t total = 16 << 20;
  ASSERT_NO_FATAL_FAILURE(connect_to_child(0));  // reports only at the end
  std::uint64_t written = 0;
  ASSERT_TRUE(write_pattern(*me_, written, 1 << 20, clock_type::now() + 10s).ok());
  ASSERT_EQ(written, 1u << 20);
  {
    // Continued after 3 s at the latest, or as soon as the window closes.
    fault::paused_for stopped(child_->pid(), 3000ms);
    ASSERT_TRUE(stopped.ok()) << std::strerror(stopped.error());
    std::uint64_t at_pause = written;
    auto window = clock_type::now();
    status s = write_pattern(*me_, written, total, window + 800ms);
    auto took = clock_type::now() - window;
    EXPECT_TRUE(s.ok()) << describe(s.error());
    EXPECT_LT(written, total);
    // write() and poll() must return while the reader is stopped: over
    // libfabric shm the reader pulls large writes itself, so a write that
    // waited for its transfer would wait for the reader's continuation.
    if (fault::is_stopped(child_->pid())) {
      EXPECT_LE(written - at_pause, ring) << "more than a ring written to a stopped reader";
    } else {
      ADD_FAILURE() << "write()/poll() did not return while the reader was stopped: the window "
                       "took "
                    << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                    << " ms (the reader was continued after 3000 ms)";
    }
  }
  status s = write_pattern(*me_, written, total, clock_type::now() + 20s * time_scale());
  ASSERT_TRUE(s.ok()) << describe(s.error());
  ASSERT_EQ(written, total);
  ASSERT_TRUE(me_->close_write().ok());
  std::string expected = "read " + std::to_string(total) + " " +
                         std::to_string(fault::pattern_checksum(seed, total)) + " ok";
  EXPECT_EQ(child_->read_line(), expected);
  EXPECT_EQ(child_->wait(), 0);
}

TEST_P(Faults, ReaderHeldByAGateWhileTheWriterFillsTheRingGetsEveryByteOnce) {
  constexpr std::uint64_t total = 8 << 20;
  core::context context_a = make_context(GetParam()), context_b = make_context(GetParam());
  auto a = channel::create(context_a, options());
  auto b = channel::create(context_b, options());
  ASSERT_TRUE(a && b);
  ASSERT_NO_FATAL_FAILURE(handshake(*a, *b, "a", "b"));

  fault::reader_gate gate(20s);
  gate.close();
  fault::stream_verifier v(seed);
  std::string reader_error;
  std::thread reader([&] {
    std::vector<unsigned char> buffer(ring);
    auto deadline = clock_type::now() + 30s;
    while (clock_type::now() < deadline) {
      if (!gate.pass()) {
        reader_error = "the gate stayed closed";
        return;
      }
      auto r = a->receive(buffer.data(), buffer.size(), false, 100ms);
      if (r && r->total() == 0) return;  // end of stream
      if (r) {
        v.feed(buffer.data(), r->total());
      } else if (!r.is(errc::timed_out)) {
        reader_error = describe(r.error());
        return;
      }
    }
    reader_error = "the stream did not end within 30 s";
  });
  ASSERT_TRUE(gate.wait_parked(5s));
  // The reader is parked: the writer fills the ring, then would block.
  std::uint64_t written = 0;
  status s = write_pattern(*b, written, total, clock_type::now() + 500ms);
  EXPECT_TRUE(s.ok()) << describe(s.error());
  EXPECT_LE(written, ring);
  EXPECT_GE(written, ring / 2) << "the ring did not fill";
  EXPECT_EQ(v.verified(), 0u);
  gate.open();
  s = write_pattern(*b, written, total, clock_type::now() + 20s * time_scale());
  ASSERT_TRUE(s.ok()) << describe(s.error());
  ASSERT_EQ(written, total);
  ASSERT_TRUE(b->close_write().ok());
  reader.join();
  EXPECT_EQ(reader_error, "");
  EXPECT_TRUE(v.ok()) << v.error();
  EXPECT_EQ(v.verified(), total);
  EXPECT_EQ(v.checksum(), fault::pattern_checksum(seed, total));
}

TEST_P(Faults, ReaderKilledMidStreamGivesTheWriterPeerGoneNotAHang) {
  constexpr std::uint64_t kill_after = 8 << 20;
  ASSERT_NO_FATAL_FAILURE(connect_to_child(1 << 20));
  std::uint64_t written = 0;
  bool killed = false;
  clock_type::time_point killed_at;
  status s =
      write_pattern(*me_, written, ~std::uint64_t{0}, clock_type::now() + 20s * time_scale(), [&] {
        if (!killed && written >= kill_after) {
          killed = true;
          killed_at = clock_type::now();
          EXPECT_EQ(fault::kill_peer(child_->pid()), 0);
        }
      });
  ASSERT_TRUE(killed);
  auto detected = clock_type::now() - killed_at;
  EXPECT_TRUE(s.is(errc::peer_gone)) << describe(s.error());
  EXPECT_LT(detected, 2s) << std::chrono::duration_cast<std::chrono::milliseconds>(detected).count()
                          << " ms";
  EXPECT_TRUE(me_->peer_gone());
  EXPECT_EQ(child_->wait(), 128 + SIGKILL);
  // Every byte the reader got before the kill was verified in place: its
  // reports reach (nearly) all that was written, a ring short at most.
  std::uint64_t last = 0;
  for (std::string line = child_->read_line(); !line.empty(); line = child_->read_line()) {
    std::istringstream words(line);
    std::string word;
    std::uint64_t at = 0;
    words >> word >> at;
    EXPECT_EQ(word, "at") << line;
    last = std::max(last, at);
  }
  EXPECT_GE(last, kill_after - (std::uint64_t{1} << 20) - ring);
}

TEST_P(Faults, ControlConnectionsShutDownAreAPeerGoneOnBothEnds) {
  constexpr std::uint64_t sent = 1 << 20;
  core::context context_a = make_context(GetParam()), context_b = make_context(GetParam());
  auto a = channel::create(context_a, options());
  auto b = channel::create(context_b, options());
  ASSERT_TRUE(a && b);
  fault::socket_snapshot before;  // the imports made by the handshake come after it
  ASSERT_NO_FATAL_FAILURE(handshake(*a, *b, "a", "b"));

  fault::stream_verifier v(seed);
  std::vector<unsigned char> buffer(ring);
  std::uint64_t written = 0;
  ASSERT_TRUE(write_pattern(*b, written, sent, clock_type::now() + 10s, [&] {
                v.feed(buffer.data(), a->read(buffer.data(), buffer.size()));
              }).ok());
  int shut = fault::close_control_connection(before);
  EXPECT_GE(shut, 2) << "control connection sockets found: " << shut;
  auto closed_at = clock_type::now();

  // The reader takes what is left, then peer_gone; the writer peer_gone.
  result<redirect::receive_result> r = errc::timed_out;
  while (clock_type::now() - closed_at < 2200ms) {
    r = a->receive(buffer.data(), buffer.size(), false, 100ms);
    if (!r) {
      if (r.is(errc::timed_out)) continue;
      break;
    }
    ASSERT_GT(r->total(), 0u) << "end of stream, but the peer never closed it";
    v.feed(buffer.data(), r->total());
  }
  EXPECT_TRUE(r.is(errc::peer_gone)) << describe(r.error());
  EXPECT_LT(clock_type::now() - closed_at, 2s);
  EXPECT_TRUE(v.ok()) << v.error();
  EXPECT_EQ(v.verified(), sent);
  std::uint64_t more = written;
  status s = write_pattern(*b, more, written + 10 * ring, clock_type::now() + 2200ms);
  EXPECT_TRUE(s.is(errc::peer_gone)) << describe(s.error());
  EXPECT_TRUE(a->peer_gone());
  EXPECT_TRUE(b->peer_gone());
}

INSTANTIATE_TEST_SUITE_P(Redirect, Faults, testing::ValuesIn(transports), transport_name);

}  // namespace
}  // namespace vmmc::test
