// nx/src/lane.h: the byte stream from one node to another, on the path that
// pays for that pair (internal).
//
// Nodes on one host, or on hosts an RDMA device joins, talk through a
// redirect::channel (with a mailbox beside it for small messages). Between
// hosts that only libfabric's tcp provider joins, the provider is kernel TCP
// plus its own framing and progress and can only lose to it (one-way 20 us
// against Open MPI's 7 us over the same veth), so such a pair talks over one
// kernel TCP connection instead, as the sockets layer keeps such peers on
// kernel TCP. A waiter then sleeps in poll() on that connection: a message
// from another host wakes it at once, where no doorbell reaches across.
//
// A lane offers the runtime the calls it needs of either, with the
// channel's meaning; the ones only a channel has (posting a receive buffer)
// say "not here" on TCP.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "vmmc/core/error.h"
#include "vmmc/redirect/channel.h"

namespace vmmc::nx::detail {

using clock_point = std::chrono::steady_clock::time_point;

// One end of a connected, nonblocking kernel TCP connection, with a small
// input buffer so that a poll costs one recv() and a header can be looked
// at before it is taken.
class tcp_stream {
 public:
  explicit tcp_stream(int fd) : fd_(fd) {}  // takes fd over
  tcp_stream(const tcp_stream&) = delete;
  tcp_stream& operator=(const tcp_stream&) = delete;
  ~tcp_stream();

  // What the kernel accepts now (would_block: nothing); peer_gone once the
  // connection failed or the peer will not read (EPIPE, ECONNRESET).
  result<std::size_t> write(const void* data, std::size_t length);
  // `first` then `second` in one call (one segment where they fit): what
  // the kernel accepted of the two together.
  result<std::size_t> write(const void* first, std::size_t first_length, const void* second,
                            std::size_t second_length);
  // Bytes at hand, taking in what the kernel holds when none are.
  std::size_t readable();
  // Copies up to `length` bytes out (without `consume`, only looks: at most
  // what readable() reported). Large reads go straight to `data`.
  std::size_t read(void* data, std::size_t length, bool consume = true);
  // The peer's end of stream or a failure was seen, and every byte before
  // it was taken.
  bool gone();
  void close_write();
  int fd() const { return fd_; }
  std::uint64_t received() const { return received_; }
  // Bytes taken in but not read yet: a sleeper must not wait for the
  // kernel to announce them.
  bool holds_input() const { return begin_ != end_; }

 private:
  // One recv() into the buffer when it is empty; false if nothing came.
  bool fill();
  bool ready(short event);
  std::size_t take_in(void* data, std::size_t length);

  int fd_;
  std::vector<std::byte> in_;
  std::size_t begin_ = 0, end_ = 0;  // unread bytes of in_
  bool ended_ = false;               // end of stream or an error came
  // The last recv() / send() found nothing to do: until poll() says the
  // connection is ready, a spinning waiter asks poll(), which does not take
  // the socket's lock that the kernel's receive and ACK processing needs.
  bool starved_ = false, blocked_ = false;
  std::uint64_t received_ = 0;
};

// ---- set-up: the lower-numbered node of a pair connects, as for channels.

// A fresh random key a node publishes to the job (its start-up record):
// connecting nodes must present it.
std::string tcp_key();

// Where a node takes its TCP lanes, listening on one address of its own.
class tcp_listener {
 public:
  static result<tcp_listener> open(const std::string& address);  // IPv4, any port
  tcp_listener() = default;
  tcp_listener(tcp_listener&& o) noexcept : fd_(std::exchange(o.fd_, -1)), where_(o.where_) {}
  tcp_listener& operator=(tcp_listener&& o) noexcept {
    std::swap(fd_, o.fd_);
    where_ = o.where_;
    return *this;
  }
  ~tcp_listener();
  const std::string& where() const { return where_; }  // "ip:port"
  // The connections of the nodes marked in `expected`, indexed by node,
  // each introduced by our `key`; anything else that connects is closed.
  result<std::vector<std::unique_ptr<tcp_stream>>> accept_nodes(std::string_view key,
                                                                const std::vector<bool>& expected,
                                                                clock_point deadline);

 private:
  int fd_ = -1;
  std::string where_;
};

// Connects to the listener at `where` as `node`, presenting its `key`.
result<std::unique_ptr<tcp_stream>> tcp_connect(const std::string& where, long node,
                                                std::string_view key, clock_point deadline);

class lane {
 public:
  lane() = default;
  void use(redirect::channel c) { channel_.emplace(std::move(c)); }
  void use(std::unique_ptr<tcp_stream> s) { tcp_ = std::move(s); }
  // Drops the channel set up before the pair's path was known.
  void drop_channel() { channel_.reset(); }
  bool tcp() const { return tcp_ != nullptr; }
  bool open() const { return tcp_ || channel_; }
  redirect::channel& channel() { return *channel_; }

  result<std::size_t> write(const void* data, std::size_t length) {
    return tcp_ ? tcp_->write(data, length) : channel_->write(data, length);
  }
  // A message's header and payload: on TCP in one call, with no copy.
  bool gathers() const { return tcp_ != nullptr; }
  result<std::size_t> write(const void* first, std::size_t first_length, const void* second,
                            std::size_t second_length) {
    return tcp_->write(first, first_length, second, second_length);
  }
  std::size_t readable() { return tcp_ ? tcp_->readable() : channel_->readable(); }
  std::size_t read(void* data, std::size_t length, bool consume = true) {
    return tcp_ ? tcp_->read(data, length, consume) : channel_->read(data, length, consume);
  }
  // Only a channel ends in order apart from the messages on it: on TCP the
  // runtime's end message tells an exit from a death (a killed process's
  // kernel closes its connections in order too).
  bool peer_closed() { return !tcp_ && channel_->peer_closed(); }
  bool peer_gone() { return tcp_ ? tcp_->gone() : channel_->peer_gone(); }
  void close_write() {
    if (tcp_)
      tcp_->close_write();
    else
      (void)channel_->close_write();
  }
  // Before sleeping: false when input is at hand already (look again). A
  // channel is armed to ring the doorbell; TCP needs no arming.
  bool prepare_sleep(redirect::sleep_reason reason) {
    return tcp_ ? !tcp_->holds_input() : channel_->prepare_sleep(reason);
  }
  // Where the waiter must look besides its doorbell: the TCP connection,
  // or -1 (a channel rings the doorbell once armed).
  int wait_fd() const { return tcp_ ? tcp_->fd() : -1; }
  std::string path() const { return tcp_ ? "kernel TCP" : channel_->path(); }
  // On TCP every byte received is copied (by the kernel), none redirected.
  redirect::channel_counters stats() const {
    if (!tcp_) return channel_->stats();
    redirect::channel_counters c{};
    c.bytes_received = c.bytes_copied = tcp_->received();
    return c;
  }

 private:
  std::optional<redirect::channel> channel_;
  std::unique_ptr<tcp_stream> tcp_;
};

}  // namespace vmmc::nx::detail
