// sockets/src/sockets.h: the private header of the sockets layer.
//
// One `stream` per kernel TCP descriptor this library manages, found through
// a table indexed by descriptor. A stream is either undecided (waiting for
// the peer's first byte), plain (kernel TCP for good) or upgraded (the peer
// speaks vmmc; each direction switches from TCP to the redirect channel at
// its own byte offset, see wire.h).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "vmmc/core/context.h"
#include "vmmc/core/settings.h"
#include "vmmc/redirect/channel.h"

namespace vmmc::sockets::detail {

namespace settings {
extern const core::setting enable;
extern const core::setting hold_us;
extern const core::setting log_level;
}  // namespace settings

enum class phase : std::uint8_t {
  idle,        // created, listening, or not yet connected
  connecting,  // non-blocking connect in progress
  undecided,   // connected; the peer's first byte has not arrived
  plain,       // kernel TCP for good
  upgraded,    // the peer speaks vmmc: channel set up (directions switch separately)
};

struct stream {
  explicit stream(int descriptor) : fd(descriptor) {}

  const int fd;
  std::atomic<bool> is_client{false};
  std::atomic<phase> state{phase::idle};
  std::atomic<bool> nonblocking{false};
  // SO_RCVTIMEO / SO_SNDTIMEO; max() means none (set from any thread).
  std::atomic<std::chrono::milliseconds> receive_timeout{std::chrono::milliseconds::max()};
  std::atomic<std::chrono::milliseconds> send_timeout{std::chrono::milliseconds::max()};

  std::mutex setup_mutex;  // phase changes and channel set-up
  std::mutex read_mutex;   // readers take turns (several may call, as with the kernel)
  std::mutex write_mutex;  // one writer at a time, and our hello's byte count

  std::unique_ptr<redirect::channel> chan;
  std::string peer_descriptor;               // client: the server's channel, from its hello frame
  std::atomic<bool> peer_hello_seen{false};  // server: the client's channel hello arrived
  // Outgoing: raw bytes we wrote on TCP before our channel hello (N_self);
  // out_switched once the hello is placed: writes go to the channel.
  std::atomic<std::uint64_t> tcp_out{0};
  std::atomic<bool> out_switched{false};
  std::atomic<bool> hello_pending{false};  // a reader found the peer ready; a writer places it
  // Incoming: raw bytes read from TCP so far; the peer's N once known;
  // in_switched once all of them are read.
  std::atomic<std::uint64_t> tcp_in{0};
  std::optional<std::uint64_t> peer_raw;
  std::atomic<bool> in_switched{false};

  std::atomic<bool> write_shut{false}, read_shut{false};
  std::atomic<bool> tcp_eof{false};    // the peer's TCP side ended (FIN or reset)
  std::atomic<bool> tcp_reset{false};  // ... by a reset
  std::atomic<int> pending_error{0};   // an error to report on the next call (errno)
  std::atomic<std::uint64_t> doorbells_in{0};
  // Sleeping on the doorbell (handshake.cc, sleep_on_doorbell).
  std::mutex sleep_mutex;
  std::condition_variable sleep_cv;
  bool descriptor_sleeper = false;
  std::atomic<std::uint64_t> doorbell_generation{0};
};

using stream_ptr = std::shared_ptr<stream>;

// --- table.cc: descriptors we manage, and the process's VMMC context.
stream_ptr find(int fd);
stream_ptr adopt(int fd, bool is_client);  // starts managing a TCP descriptor
void forget(int fd);
bool enabled();
// Created on first need (a peer that speaks vmmc): a process that never meets
// one starts no threads and never opens libfabric. Null if it cannot be made.
core::context* process_context();
// After fork() the child has the parent's streams but not the threads of its
// context: new connections stay kernel TCP there, and inherited accelerated
// ones fail with EIO (following them into the child is the preload layer's
// job, issue 4).
bool in_forked_child();
void log(int level, const char* format, ...) __attribute__((format(printf, 2, 3)));

// --- handshake.cc
void send_offer(stream& s);       // client: right after the connection is up
bool check_connected(stream& s);  // connecting -> undecided once connected
void try_decide(stream& s, bool wait_for_first_byte);
bool peer_ready(stream& s);          // our channel hello may be placed now
void advance_upgrade(stream& s);     // places it unless a writer is busy (it will)
void place_hello_locked(stream& s);  // with write_mutex held
bool learn_peer_raw(stream& s);      // true once the peer's N is known
void ring_doorbell(stream& s);
void sleep_on_doorbell(stream& s, const std::function<bool()>& arm, int timeout_ms);
void discard_protocol_bytes(stream& s);  // before close: FIN, not reset
void drain_doorbells(stream& s);

// --- readiness.cc
void forget_epoll_set(int fd);

// --- io.cc
// True once every raw byte the peer sent before its switch has been read
// (then marks the stream switched in).
bool raw_prefix_done(stream& s);
ssize_t receive(stream& s, void* buffer, size_t length, int flags);
ssize_t transmit(stream& s, const void* buffer, size_t length, int flags);
// What poll should report for `s`, given what the kernel reported for its
// descriptor: kernel readiness before the switch, the channel's after it.
short ready_events(stream& s, short wanted, short kernel_events);
// Before sleeping in poll/epoll: arms the doorbell for what is wanted;
// false if something is already ready.
bool prepare_sleep(stream& s, short wanted);

}  // namespace vmmc::sockets::detail
