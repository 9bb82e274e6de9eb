// integration.sockets.stream: a stream of gigabytes in both directions at
// once between two processes, cut into random pieces (1 B .. 1 MiB) with mixed
// read/readv/recv and write/writev/send, loses, doubles and reorders nothing:
// every byte is checked against a pattern derived from its stream offset, and
// both ends compare running checksums. Prints the throughput.
#include <signal.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <sstream>
#include <thread>
#include <vector>

#include "integration/sockets/support.h"
#include "time_scale.h"

namespace vmmc::test {
namespace {

// Bytes each way: vmmc gets the full size; the kernel oracle, which only has
// to show the test is right, a smaller one to keep the run short.
constexpr std::uint64_t vmmc_stream_bytes = std::uint64_t{2} << 30;
constexpr std::uint64_t kernel_stream_bytes = std::uint64_t{256} << 20;

// The stream must end within this (the peer's lifetime): 2 GiB each way
// then needs at least 36 MB/s per direction, a tenth of kernel TCP here
// (stretched in slow builds: tests/time_scale.h).
const auto stream_time_limit = 60s * time_scale();

constexpr std::uint64_t parent_to_child_seed = 0x5EED0001;
constexpr std::uint64_t child_to_parent_seed = 0x5EED0002;

// In a slow build (ThreadSanitizer: time_scale() 4) vmmc streams a quarter
// of it, 512 MiB each way: still 256 wraps of a 2 MiB ring, every byte
// checked, and the test takes 44 s there instead of 110 s (the whole CI run
// must stay under 45 minutes).
std::uint64_t stream_bytes(const api& a) {
  if (!a.vmmc) return kernel_stream_bytes;
  return std::max(kernel_stream_bytes, vmmc_stream_bytes / static_cast<unsigned>(time_scale()));
}

// The other end: connects to port arg 0 and streams arg 1 bytes each way with
// piece sizes from seed arg 2, then says
// "result <sent> <received> <sent checksum> <received checksum>".
const peer_role stream_peer("stream", [](peer_context& p) {
  ::signal(SIGPIPE, SIG_IGN);
  int fd = p.connect_to_parent();
  if (fd < 0) return 1;
  stream_result r =
      stream_both_ways(p.io(), fd, static_cast<std::uint64_t>(p.arg_int(1)), child_to_parent_seed,
                       parent_to_child_seed, static_cast<std::uint64_t>(p.arg_int(2)),
                       [&](const stream_result& done) {
                         p.expect(check_accelerated(p.io(), fd));
                         p.expect(check_counters(p.io(), fd, done.received, done.sent));
                       });
  if (!r.error.empty()) p.fail("child end: " + r.error);
  p.say("result " + std::to_string(r.sent) + " " + std::to_string(r.received) + " " +
        std::to_string(r.sent_checksum) + " " + std::to_string(r.received_checksum));
  p.io().close(fd);
  return r.error.empty() ? 0 : 1;
});

class Stream : public api_test {};

TEST_P(Stream, GigabytesBothWaysAtOnceLoseAndReorderNothing) {
  guard_.rearm(stream_time_limit + 30s);
  auto old_sigpipe = ::signal(SIGPIPE, SIG_IGN);
  const std::uint64_t bytes = stream_bytes(io());
  int port = 0;
  int listener = listen_loopback(io(), &port);
  ASSERT_GE(listener, 0) << std::strerror(errno);
  peer child("stream", io(), {std::to_string(port), std::to_string(bytes), "11"},
             stream_time_limit);
  int fd = accept_within(io(), listener);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  io().close(listener);

  stream_result r =
      stream_both_ways(io(), fd, bytes, parent_to_child_seed, child_to_parent_seed, 22,
                       [&](const stream_result& done) {
                         EXPECT_EQ(check_accelerated(io(), fd), "");
                         EXPECT_EQ(check_counters(io(), fd, done.received, done.sent), "");
                       });
  double mb_per_s = static_cast<double>(r.received) / r.seconds / 1e6;
  std::printf("[ stream   ] %s: %" PRIu64 " of %" PRIu64
              " MiB each way in %.2f s: %.0f MB/s per direction\n",
              io().name, r.received >> 20, bytes >> 20, r.seconds, mb_per_s);
  RecordProperty("mb_per_s_each_way", std::to_string(static_cast<long>(mb_per_s)));
  EXPECT_EQ(r.error, "") << "parent end";
  EXPECT_EQ(r.sent, bytes);
  EXPECT_EQ(r.received, bytes);

  std::istringstream result(child.read_line(stream_time_limit));
  std::string word;
  std::uint64_t child_sent = 0, child_received = 0, child_sent_sum = 0, child_received_sum = 0;
  result >> word >> child_sent >> child_received >> child_sent_sum >> child_received_sum;
  if (word == "result") {
    EXPECT_EQ(child_sent, bytes);
    EXPECT_EQ(child_received, bytes);
    EXPECT_EQ(r.received_checksum, child_sent_sum) << "child -> parent checksum";
    EXPECT_EQ(r.sent_checksum, child_received_sum) << "parent -> child checksum";
  }
  EXPECT_EQ(child.wait(30s), 0) << "(" << 128 + SIGALRM << ": the stream outlasted its "
                                << stream_time_limit.count() << " s limit)";
  io().close(fd);
  ::signal(SIGPIPE, old_sigpipe);
}

// Doorbells are records: the peer takes every TCP byte before our hello
// for data. A reader that returned credit (and so rang the waiting writer)
// while its own end placed its hello (the channel attached, the hello not
// yet visible) put a doorbell behind the raw bytes; a peer reader that had
// caught up with them read 0xDB as data (once in CI, at offset 1,481,011 of
// integration.sockets.stream). Each round: the server writes in small raw
// pieces, which the client reads as they come, while the client switches
// and writes on its channel faster than the server reads, so it waits for
// space when the server's hello goes out. Every byte must arrive as sent.
TEST_P(Stream, DoorbellsNeverEnterARawPrefix) {
  guard_.rearm(90s);
  auto old_sigpipe = ::signal(SIGPIPE, SIG_IGN);
  // The server's first write is raw (its hello waits for it), the second
  // goes on the channel: the client reads on past the raw bytes.
  constexpr std::size_t server_piece = std::size_t{32} << 20;
  constexpr std::size_t server_bytes = server_piece + (1 << 20);
  constexpr std::size_t channel_bytes = std::size_t{4} << 20;
  const std::vector<unsigned char> raw = pattern(0xA1, server_bytes);
  for (int round = 0; round < 20; ++round) {
    socket_pair pair = connect_pair(io());
    ASSERT_GE(pair.client, 0) << std::strerror(errno);
    ASSERT_GE(pair.server, 0) << std::strerror(errno);
    // Small kernel buffers: when the server's write returns, the client is
    // about to read its last raw byte and then waits for the next.
    int small = 64 << 10;
    io().setsockopt(pair.server, SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
    io().setsockopt(pair.client, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    std::string server_error, client_error, reader_error;
    std::thread server_writer([&] {
      std::size_t done = 0;
      while (done < server_bytes) {
        ssize_t n =
            io().write(pair.server, raw.data() + done, std::min(server_piece, server_bytes - done));
        if (n <= 0) {
          server_error = std::string("server write: ") + std::strerror(errno);
          return;
        }
        done += static_cast<std::size_t>(n);
      }
    });
    std::thread client_writer([&] {
      std::vector<unsigned char> piece(1 << 20);
      for (std::size_t offset = 0; offset < channel_bytes; offset += piece.size()) {
        fill_pattern(0xB2, offset, piece.data(), piece.size());
        if (!write_all(io(), pair.client, piece.data(), piece.size(), 0, 30s)) {
          client_error = std::string("client write: ") + std::strerror(errno);
          return;
        }
      }
    });
    std::thread server_reader([&] {
      std::this_thread::sleep_for(5ms);  // the client fills the ring meanwhile
      std::vector<unsigned char> piece(16 << 10);
      std::uint64_t offset = 0;
      while (offset < channel_bytes) {
        ssize_t n = io().read(pair.server, piece.data(), piece.size());
        if (n <= 0) {
          reader_error = "server read: " + std::string(n == 0 ? "early end" : std::strerror(errno));
          return;
        }
        std::size_t bad = check_pattern(0xB2, offset, piece.data(), static_cast<std::size_t>(n));
        if (bad != static_cast<std::size_t>(n)) {
          reader_error = "server read a wrong byte at offset " + std::to_string(offset + bad);
          return;
        }
        offset += static_cast<std::uint64_t>(n);
        std::this_thread::sleep_for(200us);
      }
    });
    std::vector<unsigned char> piece(1 << 20);
    std::uint64_t offset = 0;
    std::string error;
    while (offset < server_bytes) {
      ssize_t n = io().read(pair.client, piece.data(),
                            std::min<std::size_t>(piece.size(), server_bytes - offset));
      if (n <= 0) {
        error = "client read: " + std::string(n == 0 ? "early end" : std::strerror(errno));
        break;
      }
      std::size_t bad = check_pattern(0xA1, offset, piece.data(), static_cast<std::size_t>(n));
      if (bad != static_cast<std::size_t>(n)) {
        char seen[64];
        std::snprintf(seen, sizeof seen, "0x%02X where the server wrote 0x%02X", piece[bad],
                      raw[offset + bad]);
        error = "client read " + std::string(seen) + " at offset " + std::to_string(offset + bad);
        break;
      }
      offset += static_cast<std::uint64_t>(n);
    }
    if (!error.empty()) {  // failed: unblock the others
      io().shutdown(pair.client, SHUT_RDWR);
      io().shutdown(pair.server, SHUT_RDWR);
    }
    server_writer.join();
    client_writer.join();
    server_reader.join();
    io().close(pair.client);
    io().close(pair.server);
    ASSERT_EQ(error, "") << "round " << round;
    ASSERT_EQ(server_error, "") << "round " << round;
    ASSERT_EQ(client_error, "") << "round " << round;
    ASSERT_EQ(reader_error, "") << "round " << round;
  }
  ::signal(SIGPIPE, old_sigpipe);
}

VMMC_INSTANTIATE_FOR_APIS(Stream);

}  // namespace
}  // namespace vmmc::test
