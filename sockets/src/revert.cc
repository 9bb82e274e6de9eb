// Connections going back to kernel TCP: the revert records (wire.h, v2), the
// stash of bytes taken off a connection before it went back, and what
// fork() and exec() do with accelerated connections (see sockets/README.md).
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "parse.h"
#include "sockets.h"
#include "vmmc/core/progress.h"
#include "vmmc/sockets/socket.h"
#include "wire.h"

namespace vmmc::sockets::detail {

// A stash lives in a shared mapping of a memfd: a fork() child shares it (and
// its read position) with its parent, so each byte is delivered once; across
// exec() a fresh memfd carries what is left.
struct stash_area {
  std::atomic<std::uint64_t> read_at;
  std::uint64_t length;
  std::uint64_t mapped;  // bytes of the mapping, this header included
  char* data() { return reinterpret_cast<char*>(this + 1); }
};

namespace {
using clock = std::chrono::steady_clock;

int make_stash_memfd(const char* bytes, std::size_t length) {
  int fd = ::memfd_create("vmmc-stash", 0);
  if (fd < 0) return -1;
  std::uint64_t header[3] = {0, length, sizeof(stash_area) + length};
  if (::ftruncate(fd, static_cast<off_t>(header[2])) != 0 ||
      ::pwrite(fd, header, sizeof header, 0) != static_cast<ssize_t>(sizeof header) ||
      ::pwrite(fd, bytes, length, sizeof header) != static_cast<ssize_t>(length)) {
    ::close(fd);
    return -1;
  }
  return fd;
}

stash_area* map_stash(int memfd) {
  std::uint64_t header[3];
  if (::pread(memfd, header, sizeof header, 0) != static_cast<ssize_t>(sizeof header))
    return nullptr;
  void* p = ::mmap(nullptr, header[2], PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  return p == MAP_FAILED ? nullptr : static_cast<stash_area*>(p);
}

void install_stash(stream& s, const std::string& bytes) {
  if (bytes.empty()) return;
  int fd = make_stash_memfd(bytes.data(), bytes.size());
  if (fd < 0) return;
  s.stash = map_stash(fd);
  s.in.note_stash();
  ::close(fd);
}

void wake_sleepers(stream& s) {
  std::lock_guard lock(s.sleep_mutex);
  s.doorbell_generation.fetch_add(1);
  s.sleep_cv.notify_all();
}
}  // namespace

stream::~stream() {
  release_awaiting_slot(*this);
  if (stash) ::munmap(stash, stash->mapped);
  // Its context was torn down at exit (a program closing an epoll set in an
  // atexit handler of its own, as apr's does in ab): nothing to detach from.
  if (context_ended.load()) abandon(chan);
}

std::size_t stash_size(const stream& s) {
  return s.stash ? s.stash->length - s.stash->read_at.load() : 0;
}

std::size_t take_stash(stream& s, void* buffer, std::size_t length, bool consume) {
  if (!s.stash) return 0;
  std::uint64_t at = s.stash->read_at.load();
  while (true) {
    std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(length, s.stash->length - at));
    if (n == 0) return 0;
    std::memcpy(buffer, s.stash->data() + at, n);
    if (!consume || s.stash->read_at.compare_exchange_weak(at, at + n)) return n;
  }
}

void drain_doorbells(stream& s) {
  // Before the switch TCP bytes are application data; after the peer's end
  // record they are again.
  if (!s.in.switched() || s.peer_channel_end.load() != stream::no_end) return;
  unsigned char scratch[256];
  while (true) {
    ssize_t n = ::recv(s.fd, scratch, sizeof scratch, MSG_PEEK | MSG_DONTWAIT);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno != EAGAIN) note_tcp_error(s, errno);
      if (n == 0) s.tcp_eof.store(true);
      return;
    }
    const record_scan scan = scan_records(std::span(scratch, static_cast<std::size_t>(n)));
    const std::size_t take = scan.take;
    const std::uint64_t end = scan.end.value_or(stream::no_end);
    const bool asked = scan.revert_asked;
    if (take > 0 && ::recv(s.fd, scratch, take, MSG_DONTWAIT) != static_cast<ssize_t>(take)) return;
    s.doorbells_in.fetch_add(take);
    if (asked) s.out.note_end_due();
    if (end != stream::no_end) {
      s.peer_channel_end.store(end);
      s.in.note_end_due();
    }
    wake_sleepers(s);
    if (end != stream::no_end || take < static_cast<std::size_t>(n) ||
        n < static_cast<ssize_t>(sizeof scratch))
      return;
  }
}

void answer_revert_locked(stream& s) {
  if (!s.out.has(flow::end_due) || s.out.reverted() || !s.chan) return;
  // Our writes must be on the channel to be followed by an end record.
  if (!s.out.switched() && peer_ready(s)) place_hello_locked(s);
  if (!s.out.switched()) return;
  unsigned char record[wire::end_record_size] = {wire::end_record_byte};
  std::uint64_t total = s.channel_out.load();
  for (int i = 0; i < 8; ++i) record[1 + i] = static_cast<unsigned char>(total >> (8 * i));
  close_records(s);  // no doorbell may follow the record: after it comes data
  if (!send_all(s.fd, record, sizeof record, 0)) {
    reopen_records(s);
    return;
  }
  s.out.to_tcp_again();
  // Our direction had ended in the channel (shutdown after the switch): the
  // peer now reads TCP after our end record, so the end goes there too.
  if (s.out.is_shut()) (void)::shutdown(s.fd, SHUT_WR);
  log(3, "fd %d: writes back on TCP after %llu channel bytes", s.fd.load(),
      static_cast<unsigned long long>(total));
}

void answer_revert(stream& s) {
  if (!s.out.has(flow::end_due) || s.out.reverted()) return;
  std::unique_lock lock(s.write_mutex, std::try_to_lock);
  if (lock) answer_revert_locked(s);
}

bool input_on_tcp(stream& s) {
  const flow::word in = s.in.load();
  if (in & flow::tcp_again) return true;
  if (!(in & flow::end_due) || s.channel_in.load() < s.peer_channel_end.load()) return false;
  s.in.to_tcp_again();
  return true;
}

namespace {
// One connection going back to TCP, this end initiating: it asks the peer
// for its end record, moves every byte the peer sent before it (raw prefix
// and channel) into the stash, then places its own end record. Readers and
// writers of the stream are held off meanwhile.
struct taking {
  stream_ptr s;
  std::unique_lock<std::timed_mutex> read_lock, write_lock;
  std::string taken;
  bool requested = false;
  bool never_switched = false;  // both directions stay on TCP for good
};

// Neither direction switched, and neither ever will: nothing to take back.
// The server switches only after the client's hello, and a client whose
// writes ended on TCP never places one (place_hello_locked); the server
// knows that when the client's end of file came with no hello before it
// (the hello is placed before the end is sent). socat's fork right after
// accept, with a client that had written all and shut down, met this.
bool stays_on_tcp(stream& s) {
  if (s.out.switched()) return false;
  if (s.is_client) return s.out.is_shut();
  if (s.chan->peer_hello()) return false;
  pollfd pfd{s.fd, POLLRDHUP, 0};
  if (::poll(&pfd, 1, 0) != 1 || !(pfd.revents & (POLLRDHUP | POLLHUP | POLLERR))) return false;
  return !s.chan->peer_hello();
}

// A server waiting for the client's hello reads the client's TCP bytes
// meanwhile: a client blocked writing them would otherwise never get to its
// end of file (stays_on_tcp) nor, perhaps, to its hello. Only raw bytes:
// records after a hello that shows meanwhile stay for drain_doorbells.
bool take_before_hello(taking& t, std::vector<char>& buffer) {
  stream& s = *t.s;
  constexpr std::size_t most = 64u << 20;  // then the peer waits for the child
  if (s.is_client || s.out.switched() || t.taken.size() >= most) return false;
  bool at_switch = false;
  ssize_t n = take_raw(s, buffer.data(), buffer.size(), false, true, at_switch);
  if (n <= 0) return false;
  t.taken.append(buffer.data(), static_cast<std::size_t>(n));
  return true;
}

// Moves what the peer sent towards the stash; true if something moved.
bool step(taking& t) {
  stream& s = *t.s;
  thread_local std::vector<char> buffer(1 << 16);
  if (!t.requested) {
    // Our writes must reach the channel first: only then does the peer
    // parse our records.
    if (!s.out.switched() && peer_ready(s)) place_hello_locked(s);
    if (!s.out.switched()) {
      bool moved = take_before_hello(t, buffer);
      t.never_switched = stays_on_tcp(s);
      return moved;
    }
    unsigned char request = wire::revert_request_byte;
    t.requested = s.out.reverted() || send_all(s.fd, &request, 1, 0);
    return t.requested;
  }
  bool moved = false;
  if (!raw_prefix_done(s)) {
    if (learn_peer_raw(s)) {
      std::uint64_t left = *s.peer_raw - s.tcp_in.load();
      ssize_t n =
          ::recv(s.fd, buffer.data(), std::min<std::uint64_t>(left, buffer.size()), MSG_DONTWAIT);
      if (n > 0) {
        t.taken.append(buffer.data(), static_cast<std::size_t>(n));
        s.tcp_in += static_cast<std::uint64_t>(n);
        moved = true;
      }
    }
  } else {
    drain_doorbells(s);
    std::uint64_t end = s.peer_channel_end.load();
    std::size_t want = buffer.size();
    if (end != stream::no_end) want = std::min<std::uint64_t>(want, end - s.channel_in.load());
    std::size_t n = want ? s.chan->read(buffer.data(), want) : 0;
    if (n > 0) {
      t.taken.append(buffer.data(), n);
      s.channel_in += n;
      moved = true;
    }
  }
  if (s.out.has(flow::end_due)) answer_revert_locked(s);  // the peer asked too
  return moved;
}

// Bytes taken so far go to the stash, after any left from before.
void keep_taken(taking& t) {
  stream& s = *t.s;
  if (s.stash) {
    t.taken.insert(0, s.stash->data() + s.stash->read_at.load(), stash_size(s));
    ::munmap(s.stash, s.stash->mapped);
    s.stash = nullptr;
  }
  install_stash(s, t.taken);
}

constexpr auto revert_patience = std::chrono::milliseconds(2000);
constexpr auto lock_patience = std::chrono::milliseconds(100);

// Takes every accelerated connection (with only_inheritable: those without
// FD_CLOEXEC) back to TCP, all at once: a connection whose peer is in this
// very process (or thread) goes back too. Needs each peer to run (any call
// on the socket, or a wait in poll/epoll); after revert_patience, the ones
// left stay on VMMC.
void revert_all(bool only_inheritable) {
  auto deadline = clock::now() + revert_patience;
  std::vector<taking> pending;
  for (auto& s : all_streams()) {
    if (s->state.load() != phase::upgraded || !s->chan || s->inherited.load()) continue;
    if (only_inheritable) {
      int flags = ::fcntl(s->fd, F_GETFD);
      if (flags < 0 || (flags & FD_CLOEXEC)) continue;
    }
    taking t{s,
             std::unique_lock(s->read_mutex, std::defer_lock),
             std::unique_lock(s->write_mutex, std::defer_lock),
             {},
             false};
    // A reader or writer blocked in another thread keeps its connection on
    // VMMC (unusable in a fork child) rather than stall the fork.
    auto lock_deadline = clock::now() + lock_patience;
    if (!t.read_lock.try_lock_until(lock_deadline) || !t.write_lock.try_lock_until(lock_deadline))
      continue;
    if (s->state.load() == phase::upgraded) pending.push_back(std::move(t));
  }
  auto take_back = [&] {
    bool moved = false;
    for (std::size_t i = 0; i < pending.size(); ++i) {
      taking& t = pending[i];
      moved |= step(t);
      stream& s = *t.s;
      if (t.never_switched) {
        keep_taken(t);
        s.state.store(phase::plain);
        log(3, "fd %d: neither direction switched; plain TCP", s.fd.load());
        pending.erase(pending.begin() + static_cast<long>(i--));
        continue;
      }
      if (!t.requested || !input_on_tcp(s)) continue;
      s.out.note_end_due();
      answer_revert_locked(s);
      if (!s.out.reverted()) continue;
      keep_taken(t);
      s.state.store(phase::plain);
      log(3, "fd %d: back on TCP (%zu bytes kept)", s.fd.load(), t.taken.size());
      pending.erase(pending.begin() + static_cast<long>(i--));
    }
    if (pending.empty()) return core::turn::done;
    return moved ? core::turn::progressed : core::turn::waiting;
  };
  // Answers come over TCP (the peer's revert record) or its channel.
  std::vector<pollfd> fds;
  auto sleep = [&](std::chrono::nanoseconds) {
    fds.clear();
    for (auto& t : pending) {
      (void)t.s->chan->poll();
      fds.push_back({t.s->fd, POLLIN, 0});
    }
    ::poll(fds.data(), fds.size(), 1);
    return true;
  };
  if (!pending.empty())
    (void)core::wait_until(core::function_ref<core::turn()>(take_back), deadline,
                           core::sleep_step(sleep));
  for (auto& t : pending) {
    // The peer did not answer in time: the connection stays on VMMC here
    // (a fork() child cannot use it); what was taken is read first.
    log(2, "fd %d: the peer did not answer; connection stays on VMMC", t.s->fd.load());
    keep_taken(t);
  }
}

void fork_prepare() {
  for (auto& s : all_streams()) stay_on_tcp(*s);
  revert_all(false);
}

void fork_parent() {
  for (auto& s : all_streams()) s->shared.store(true);
}

void fork_child() {
  for (auto& s : all_streams()) {
    s->shared.store(true);
    s->inherited.store(true);
    s->ringers.store(0);  // a doorbell another thread was sending is the parent's
    if (s->state.load() == phase::upgraded && s->chan) {
      s->in.orphan();
      s->out.orphan();
    }
  }
}
}  // namespace

void install_fork_handlers() {
  // Every socket asks: once installed, the guard's one load.
  [[maybe_unused]] static const int installed =
      ::pthread_atfork(fork_prepare, fork_parent, fork_child);
}

}  // namespace vmmc::sockets::detail

namespace vmmc::sockets {

using namespace detail;

int stack_cloexec() noexcept {
  return core::opening_for_the_stack() ? SOCK_CLOEXEC : 0;
}

bool interposer_enabled() {
  return core::setting_bool(settings::preload_enable);
}

void interposer_install() {
  detail::api_call entered;
  static std::once_flag once;
  std::call_once(once, [] {
    install_fork_handlers();
    // Connections an exec()ing image handed over with bytes it had taken
    // off them: "fd:memfd,fd:memfd".
    if (!core::setting_given(settings::inherit)) return;
    std::string list = core::setting_string(settings::inherit);
    ::unsetenv(core::environment_name(settings::inherit).c_str());
    std::size_t at = 0;
    while (at < list.size()) {
      int fd = -1, memfd = -1;
      if (std::sscanf(list.c_str() + at, "%d:%d", &fd, &memfd) == 2 && fd >= 0 && memfd >= 0) {
        auto s = adopt(fd, false);
        s->state.store(phase::plain);
        s->stash = map_stash(memfd);
        ::close(memfd);
      }
      std::size_t comma = list.find(',', at);
      at = comma == std::string::npos ? list.size() : comma + 1;
    }
  });
}

char* const* prepare_exec(char* const* envp) {
  detail::api_call entered;
  revert_all(true);
  stat_before_exec();
  std::string handed;
  for (auto& s : all_streams()) {
    // The new image may not run vmmc: none of our sockets vouches for it,
    // and an answer to our ask that came already is taken off the head.
    presence::remove(s->presence_cookie.exchange(0));
    if (s->asked.load()) discard_protocol_bytes(*s);
    std::size_t left = stash_size(*s);
    if (left == 0) continue;
    int flags = ::fcntl(s->fd, F_GETFD);
    if (flags < 0 || (flags & FD_CLOEXEC)) continue;
    int memfd = make_stash_memfd(s->stash->data() + s->stash->read_at.load(), left);
    if (memfd < 0) continue;
    if (!handed.empty()) handed += ',';
    handed += std::to_string(s->fd.load()) + ":" + std::to_string(memfd);
  }
  if (handed.empty()) return envp;
  // The new image's interposer adopts them (exec does not return on success;
  // on failure this small array is what is lost).
  static std::vector<std::string> strings;
  static std::vector<char*> pointers;
  strings.clear();
  pointers.clear();
  std::string prefix = core::environment_name(settings::inherit) + "=";
  for (char* const* e = envp; e && *e; ++e)
    if (std::strncmp(*e, prefix.c_str(), prefix.size()) != 0) strings.emplace_back(*e);
  strings.push_back(prefix + handed);
  for (auto& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers.data();
}

}  // namespace vmmc::sockets
