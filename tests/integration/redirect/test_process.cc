// integration.redirect.process: channels whose peer process is killed, over
// each transport: bytes that arrived before the kill are all read, then the
// channel reports peer_gone within two seconds, never hangs. Also the cases
// where a hang is the failure to catch: they run in a child with an alarm.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "integration/core/child_process.h"
#include "integration/core/transports.h"
#include "integration/redirect/streams.h"

namespace vmmc::test {
namespace {

using namespace std::chrono_literals;
using redirect::channel;
using clock_type = std::chrono::steady_clock;

constexpr std::size_t ring = std::size_t{64} << 10;

redirect::channel_options options() {
  redirect::channel_options o;
  o.ring_bytes = ring;
  o.post_min = 4 << 10;
  return o;
}

constexpr std::uint64_t endless = ~std::uint64_t{0};

// The child: the passive end. Prints its descriptor, accepts the parent, then
// writes `length` bytes of pattern_stream(7) (or forever), prints "written"
// and waits to be killed, never reading.
int passive_child(const transport& t, int to_parent, std::uint64_t length) {
  core::context c = make_context(t);
  auto ch = channel::create(c, options());
  if (!ch) return 2;
  child_process::send_line(to_parent, ch->descriptor());
  if (!accept_within(*ch, "child", 10s)) return 3;
  const pattern_stream s(7);
  std::uint64_t written = 0;
  while (written < length) {
    std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(30000, length - written));
    result<std::size_t> w = ch->write(s.at(written), n);
    if (w) {
      written += *w;
    } else if (w.is(errc::would_block)) {
      ch->poll();
    } else {
      return 4;
    }
  }
  child_process::send_line(to_parent, "written");
  for (;;) {
    ch->poll();
    std::this_thread::sleep_for(1ms);
  }
}

class Process : public testing::TestWithParam<transport> {
 protected:
  // Starts passive_child(length), then creates this process's context (after
  // the fork) and end, connects it and checks the child's hello.
  void connect_to_child(std::uint64_t length) {
    child_.emplace([this, length](int out) { return passive_child(GetParam(), out, length); }, 30s);
    std::string descriptor = child_->read_line();
    ASSERT_FALSE(descriptor.empty()) << "the child printed no descriptor";
    context_.emplace(make_context(GetParam()));
    auto created = channel::create(*context_, options());
    ASSERT_TRUE(created) << describe(created.error());
    me_.emplace(std::move(*created));
    result<std::string> heard = connect_within(*me_, descriptor, "parent", 5s);
    ASSERT_TRUE(heard) << describe(heard.error());
    EXPECT_EQ(*heard, "child");
  }

  // Kills the child; returns when.
  clock_type::time_point kill_child() {
    child_->kill_now();
    auto killed = clock_type::now();
    EXPECT_EQ(child_->wait(), 128 + SIGKILL);
    return killed;
  }

  channel& me() { return *me_; }

  // After the kill at `killed`: reads what is left, then receive() and
  // write() must fail with peer_gone within 2 s of the kill. `read` counts
  // the bytes of pattern_stream(7) read so far.
  void expect_peer_gone(clock_type::time_point killed, std::uint64_t& read) {
    const pattern_stream s(7);
    std::vector<unsigned char> buffer(ring);
    result<redirect::receive_result> r = errc::timed_out;
    while (clock_type::now() - killed < 2200ms) {
      r = me().receive(buffer.data(), buffer.size(), false, 100ms);
      if (!r) {
        if (r.is(errc::timed_out)) continue;
        break;
      }
      ASSERT_GT(r->total(), 0u) << "end of stream from a killed peer";
      ASSERT_EQ(s.mismatch(buffer.data(), r->total(), read), r->total()) << "at " << read;
      read += r->total();
    }
    auto detected = clock_type::now() - killed;
    EXPECT_TRUE(r.is(errc::peer_gone)) << describe(r.error());
    EXPECT_LT(detected, 2s)
        << std::chrono::duration_cast<std::chrono::milliseconds>(detected).count() << " ms";
    EXPECT_TRUE(me().peer_gone());
    EXPECT_EQ(me().read(buffer.data(), buffer.size()), 0u);

    result<std::size_t> w = errc::would_block;
    pump(
        {&me()},
        [&] {
          w = me().write(buffer.data(), 1000);
          return !w && !w.is(errc::would_block);
        },
        2s);
    EXPECT_TRUE(w.is(errc::peer_gone)) << describe(w.error());
  }

  std::optional<child_process> child_;  // declared first: outlives the rest
  std::optional<core::context> context_;
  std::optional<channel> me_;
};

TEST_P(Process, BytesThatArrivedSurviveTheKill) {
  constexpr std::uint64_t length = 40000;  // fits in the ring
  ASSERT_NO_FATAL_FAILURE(connect_to_child(length));
  ASSERT_EQ(child_->read_line(), "written");
  ASSERT_TRUE(pump({&me()}, [&] { return me().readable() == length; }))
      << "readable() " << me().readable() << " of " << length;

  auto killed = kill_child();
  std::vector<unsigned char> buffer(length);
  ASSERT_EQ(me().read(buffer.data(), length), length) << "bytes were lost with their sender";
  const pattern_stream s(7);
  EXPECT_EQ(s.mismatch(buffer.data(), length, 0), length);
  std::uint64_t read = length;
  expect_peer_gone(killed, read);
  EXPECT_EQ(read, length);
}

TEST_P(Process, PeerKilledMidStreamIsDetectedWithinTwoSeconds) {
  ASSERT_NO_FATAL_FAILURE(connect_to_child(endless));

  // Read (and check) at least 1 MiB of the child's endless stream, then kill
  // it while it is writing.
  const pattern_stream s(7);
  std::vector<unsigned char> buffer(ring);
  std::uint64_t read = 0;
  ASSERT_TRUE(pump(
      {&me()},
      [&] {
        std::size_t n = me().read(buffer.data(), buffer.size());
        EXPECT_EQ(s.mismatch(buffer.data(), n, read), n) << "at " << read;
        read += n;
        return read >= (1 << 20);
      },
      10s))
      << "only " << read << " bytes arrived";

  // libfabric's shm provider (1.17) enqueues every operation into the
  // receiver's region under a spinlock shared between the processes: a
  // writer killed while it holds that lock leaves it held, and the survivor
  // spins in fi_cq_read for ever (seen here: 1 hang in a few runs of this
  // suite). No code of ours can release it, so over shm the child is killed
  // mid-stream but blocked on a full ring, where it sends nothing into us:
  // we stop reading until the ring stays full.
  if (std::string_view(GetParam().name) == "shm") {
    std::size_t last = 0;
    auto still_since = clock_type::now();
    ASSERT_TRUE(pump(
        {&me()},
        [&] {
          std::size_t now = me().readable();
          if (now != last) {
            last = now;
            still_since = clock_type::now();
          }
          return now > 0 && clock_type::now() - still_since > 200ms;
        },
        10s));
  }
  auto killed = kill_child();
  expect_peer_gone(killed, read);
}

// A writer whose peer died while the ring toward it was full: write() has
// no space to try a send with, and must still report peer_gone.
TEST_P(Process, WriterFacingAFullRingOfAKilledPeerGetsPeerGone) {
  ASSERT_NO_FATAL_FAILURE(connect_to_child(0));
  ASSERT_EQ(child_->read_line(), "written");
  const pattern_stream s(9);
  auto filled = fill_ring(me(), s);
  ASSERT_TRUE(filled) << describe(filled.error());
  std::uint64_t written = *filled;
  result<std::size_t> w = errc::would_block;

  auto killed = kill_child();
  pump(
      {&me()},
      [&] {
        w = me().write(s.at(written), 1000);
        return !w.is(errc::would_block);
      },
      2200ms);
  EXPECT_TRUE(w.is(errc::peer_gone)) << "write(): " << describe(w.error());
  EXPECT_LT(clock_type::now() - killed, 2s);
  EXPECT_TRUE(me().peer_gone());

  auto t0 = clock_type::now();
  w = me().write(s.at(written), 1000, true, 3s);
  EXPECT_TRUE(w.is(errc::peer_gone)) << "blocking write(): " << describe(w.error());
  EXPECT_LT(clock_type::now() - t0, 2s);
}

// Child: both ends in one process; end B blocks in a receive large enough to
// post its buffer, and end A is destroyed meanwhile. Prints "destroyed", then
// what receive() returned and after how many milliseconds from the
// destruction.
int destroy_during_receive(const transport& t, int to_parent) {
  core::context context_a = make_context(t), context_b = make_context(t);
  auto a = channel::create(context_a, options());
  auto b = channel::create(context_b, options());
  if (!a || !b) return 2;
  std::optional<channel> passive(std::move(*a));
  handshake(*passive, *b, "a", "b");
  if (testing::Test::HasFatalFailure()) return 3;
  std::vector<unsigned char> buffer(std::size_t{64} << 10);
  std::atomic<bool> inside{false};
  result<redirect::receive_result> got = errc::would_block;
  std::thread receiver([&] {
    inside = true;
    got = b->receive(buffer.data(), buffer.size(), true, 500ms);
  });
  while (!inside) std::this_thread::yield();
  std::this_thread::sleep_for(100ms);
  auto t0 = clock_type::now();
  passive.reset();
  child_process::send_line(to_parent, "destroyed");
  receiver.join();
  auto took = std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - t0);
  child_process::send_line(to_parent, got ? "ok" : describe(got.error()));
  child_process::send_line(to_parent, std::to_string(took.count()));
  return 0;
}

TEST_P(Process, ReceiveWhoseEndIsDestroyedMeanwhileDoesNotHang) {
  child_process child([&](int out) { return destroy_during_receive(GetParam(), out); }, 3s);
  std::string destroyed = child.read_line();
  std::string outcome = child.read_line(), took_ms = child.read_line();
  EXPECT_EQ(child.wait(), 0) << "the child did not finish within 3 s";
  ASSERT_EQ(destroyed, "destroyed") << "destroying the passive end hung";
  ASSERT_FALSE(outcome.empty()) << "receive() hung after its peer end was destroyed";
  EXPECT_NE(outcome, "ok") << "receive() succeeded from a destroyed end";
  EXPECT_LT(std::stoi(took_ms), 1500) << outcome;
}

INSTANTIATE_TEST_SUITE_P(Redirect, Process, testing::ValuesIn(transports), transport_name);

}  // namespace
}  // namespace vmmc::test
