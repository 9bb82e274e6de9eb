// Unit tests of vrpc's record marking (record_stream, vrpc/src/record.cc):
// what it writes for records mixing small and large values, seen from a
// plain socket.
#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "vrpc_impl.h"

using vmmc::vrpc::detail::record_stream;

namespace {

// One XDR value of a test record: a 4-byte integer (length 0) or opaque
// bytes of `length` (large ones go out without staging).
struct item {
  std::size_t length;
};

bool encode(XDR* x, const std::vector<item>& items, std::vector<std::string>& storage) {
  storage.clear();
  for (std::size_t k = 0; k < items.size(); ++k) {
    if (items[k].length == 0) {
      int v = static_cast<int>(k);
      if (!xdr_int(x, &v)) return false;
      continue;
    }
    storage.emplace_back(items[k].length, static_cast<char>('a' + k % 26));
    char* p = storage.back().data();
    u_int n = static_cast<u_int>(items[k].length);
    if (!xdr_bytes(x, &p, &n, ~0u)) return false;
  }
  return true;
}

// The record's body as xdrmem encodes the same values.
std::string expected_body(const std::vector<item>& items) {
  std::size_t size = 0;
  for (const item& i : items) size += 4 + (i.length + 3) / 4 * 4;
  std::string body(size, '\0');
  XDR x;
  xdrmem_create(&x, body.data(), static_cast<u_int>(body.size()), XDR_ENCODE);
  std::vector<std::string> storage;
  EXPECT_TRUE(encode(&x, items, storage));
  return body;
}

struct written_record {
  std::string body;
  std::vector<std::uint32_t> fragments;  // lengths, in order
  int writes = 0;                        // packets, one per write
};

// Encodes `items` as one record on one end of a SOCK_SEQPACKET pair, where
// every write arrives as one packet, and takes it apart at the other.
written_record write_record(const std::vector<item>& items) {
  int fds[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET, 0, fds), 0);
  int size = 8 << 20;
  ::setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
  ::setsockopt(fds[1], SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
  std::vector<std::string> storage;
  {
    record_stream out(fds[0]);
    EXPECT_TRUE(encode(out.encoder(), items, storage));
    EXPECT_TRUE(out.end_record());
  }
  ::shutdown(fds[0], SHUT_WR);
  std::string stream;
  written_record r;
  // One buffer for every record: 340 fresh 4 MiB ones took 30 s under TSan.
  static std::vector<char> packet(4 << 20);
  while (true) {
    ssize_t n = ::recv(fds[1], packet.data(), packet.size(), 0);
    if (n <= 0) break;
    stream.append(packet.data(), static_cast<std::size_t>(n));
    ++r.writes;
  }
  ::close(fds[0]);
  ::close(fds[1]);
  for (std::size_t at = 0; at < stream.size();) {
    EXPECT_LE(at + 4, stream.size());
    std::uint32_t header;
    std::memcpy(&header, stream.data() + at, 4);
    header = ntohl(header);
    const std::uint32_t length = header & 0x7fffffffu;
    r.fragments.push_back(length);
    r.body.append(stream, at + 4, length);
    at += 4 + length;
    EXPECT_EQ(static_cast<bool>(header & 0x80000000u), at == stream.size())
        << "the last-fragment bit is on the last fragment only";
  }
  return r;
}

std::string describe(const written_record& r) {
  std::string s = std::to_string(r.writes) + " writes, fragments:";
  for (std::uint32_t f : r.fragments) s += " " + std::to_string(f);
  return s;
}

}  // namespace

// A call or reply with one large value between small ones leaves in one
// write. (The bytes before the value went out in a write of their own: a
// second system call and segment per call, and a 16 KiB argument across
// hosts at 0.8x libtirpc's speed.)
TEST(record, one_large_value_among_small_ones_is_one_write) {
  for (std::size_t large : {std::size_t{16} << 10, std::size_t{40} << 10, std::size_t{512} << 10}) {
    const std::vector<item> items = {{0}, {100}, {0}, {large}, {0}, {3}};
    const written_record r = write_record(items);
    EXPECT_EQ(r.body, expected_body(items)) << large;
    EXPECT_EQ(r.writes, 1) << large << ": " << describe(r);
    ASSERT_FALSE(r.fragments.empty());
    EXPECT_GT(r.fragments.back(), 0u) << "a record ends in a fragment with data";
  }
}

// The large value at either end of the record.
TEST(record, a_large_value_first_or_last_is_one_write) {
  for (const auto& items : {std::vector<item>{{0}, {0}, {64 << 10}}, std::vector<item>{{64 << 10}},
                            std::vector<item>{{64 << 10}, {0}}}) {
    const written_record r = write_record(items);
    EXPECT_EQ(r.body, expected_body(items));
    EXPECT_EQ(r.writes, 1) << describe(r);
  }
}

// Every record of up to four values from {integer, 15 KiB (buffered: four
// of them fill the buffer), 16 KiB and 70 KiB (not staged)}: the bytes are
// XDR's, in fragments that are never empty, and a record takes one write
// more than it holds large values only when the buffer fills or a second
// large value comes.
TEST(record, every_mix_of_small_buffered_and_large_values_is_framed_right) {
  const std::size_t kinds[] = {0, 15 << 10, 16 << 10, 70 << 10};
  int records = 0;
  for (int length = 1; length <= 4; ++length) {
    int combinations = 1;
    for (int k = 0; k < length; ++k) combinations *= 4;
    for (int c = 0; c < combinations; ++c) {
      std::vector<item> items;
      int large = 0;
      for (int k = 0, code = c; k < length; ++k, code /= 4) {
        items.push_back({kinds[code % 4]});
        large += kinds[code % 4] >= (16 << 10);
      }
      const written_record r = write_record(items);
      ++records;
      ASSERT_EQ(r.body, expected_body(items)) << "record " << c << " of " << length;
      for (std::uint32_t f : r.fragments) ASSERT_GT(f, 0u) << describe(r);
      // One write, plus one per large value after the first, plus one per
      // buffer that fills (at most one here: four 15 KiB values are 60 KiB).
      EXPECT_LE(r.writes, 1 + std::max(large - 1, 0) + 1) << describe(r);
      if (large <= 1 && items.size() < 4) {
        EXPECT_EQ(r.writes, 1) << describe(r);
      }
    }
  }
  EXPECT_EQ(records, 4 + 16 + 64 + 256);
}

// Over kernel TCP (this socket pair is not vmmc's) a write takes at most
// 1 MiB: a long one holds the socket while the peer's acknowledgements wait.
TEST(record, over_kernel_tcp_a_write_takes_at_most_a_mebibyte) {
  const std::vector<item> items = {{0}, {5 << 20}, {0}};
  const written_record r = write_record(items);
  EXPECT_EQ(r.body, expected_body(items));
  EXPECT_EQ(r.writes, 6) << describe(r);  // 5 MiB and some bytes, 1 MiB at a time
}

// A held large value and then more small values than the buffer takes.
TEST(record, small_values_past_the_buffer_after_a_large_one) {
  std::vector<item> items = {{0}, {32 << 10}};
  items.resize(2 + 40000, item{0});  // 160 KB of integers
  const written_record r = write_record(items);
  EXPECT_EQ(r.body, expected_body(items));
  for (std::uint32_t f : r.fragments) EXPECT_GT(f, 0u) << describe(r);
}
