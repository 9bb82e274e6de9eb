// tests/support/fault.cc: fault injection for tests (see fault.h).
#include "support/fault.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <optional>
#include <random>
#include <set>
#include <sstream>

#include "presence.h"  // sockets/src: a relay that passes upgrades vouches for its sockets

namespace vmmc::test::fault {

using clock_type = std::chrono::steady_clock;

// ---- Process faults.

namespace {
bool refused(pid_t pid) {
  return pid <= 1 || pid == ::getpid();
}

// State letter of one /proc/.../stat file ('?' when unreadable). The command
// name (field 2) is in parentheses and may hold spaces: the state follows
// the last ')'.
char stat_state(const std::string& path) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return '?';
  return text[close + 2];
}
}  // namespace

int kill_peer(pid_t pid, int signal) {
  if (refused(pid)) return EINVAL;
  return ::kill(pid, signal) == 0 ? 0 : errno;
}

bool is_stopped(pid_t pid) {
  // Every thread: a group stop is complete only when all have stopped.
  std::string task = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = ::opendir(task.c_str());
  if (!d) return false;
  bool all = true, any = false;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char s = stat_state(task + "/" + e->d_name + "/stat");
    any = true;
    all &= s == 'T' || s == 't';
  }
  ::closedir(d);
  return any && all;
}

int pause_peer(pid_t pid) {
  if (refused(pid)) return EINVAL;
  if (::kill(pid, SIGSTOP) != 0) return errno;
  auto deadline = clock_type::now() + std::chrono::seconds(2);
  while (!is_stopped(pid)) {
    if (::kill(pid, 0) != 0) return errno;
    if (clock_type::now() > deadline) return ETIMEDOUT;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return 0;
}

int resume_peer(pid_t pid) {
  if (refused(pid)) return EINVAL;
  return ::kill(pid, SIGCONT) == 0 ? 0 : errno;
}

paused_for::paused_for(pid_t pid, std::chrono::milliseconds duration) : pid_(pid) {
  error_ = pause_peer(pid);
  resumer_ = std::thread([this, duration] {
    std::unique_lock lock(mutex_);
    cv_.wait_for(lock, duration, [&] { return resumed_; });
    resume_peer(pid_);  // also after a failed pause: never leave it stopped
    resumed_ = true;
    cv_.notify_all();
  });
}

paused_for::~paused_for() {
  {
    std::lock_guard lock(mutex_);
    resumed_ = true;
  }
  cv_.notify_all();
  resumer_.join();
}

void paused_for::wait() {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return resumed_; });
}

// ---- Relay.

namespace {

constexpr std::size_t lane_capacity = std::size_t{1} << 20;
constexpr std::size_t read_size = 64 * 1024;

struct item {
  enum kind_type { data, urgent, end, close_fault, reset_fault, reset_passed_on } kind;
  std::vector<unsigned char> bytes;
  std::size_t sent = 0;
  clock_type::time_point due{};
  bool stall_before = false;
};

// One direction of a relayed connection.
struct lane {
  int from = -1, to = -1;  // the connection's descriptors, borrowed
  fault_plan plan;
  std::mt19937_64 rng;
  std::uint64_t offset = 0;  // bytes received from `from`
  std::deque<item> queue;
  std::size_t queued = 0;
  clock_type::time_point last_due{}, not_before{};
  std::vector<unsigned char> held;  // the reordered range, until complete
  bool reading = true;              // `from` has not ended
  bool ended = false;               // the end (or a fault) was passed on
  bool stall_pending = false;
  bool blocked = false;  // the last send to `to` would block: wait for POLLOUT
  bool to_target = true;
};

struct link {
  int client = -1, target = -1;
  lane up, down;  // client -> target, target -> client
  // Upgrades passed: the client's presence entry, mirrored on our socket to
  // the target (its cookie) once the client asks or declines.
  std::optional<sockets::detail::presence::socket_id> client_entry;
  std::uint64_t target_cookie = 0;
  bool mirrored = false;
  bool discarding = false;  // after a close fault: read and drop until both end
  bool client_eof = false, target_eof = false;
  bool finished = false;
};

void set_reset_on_close(int fd) {
  linger abort{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &abort, sizeof abort);
}

}  // namespace

class relay::impl {
 public:
  impl(const sockaddr_in& target, fault_plan up, fault_plan down, upgrades mode)
      : target_(target), up_plan_(up), down_plan_(down), pass_upgrades_(mode == upgrades::pass) {}

  int start() {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    wake_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (listener_ < 0 || wake_ < 0) return 0;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof a;
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(listener_, 64) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &length) != 0)
      return 0;
    if (pass_upgrades_ && sockets::detail::presence::enter(listener_) == 0) return 0;
    thread_ = std::thread([this] { run(); });
    return ntohs(a.sin_port);
  }

  ~impl() {
    stopping_.store(true);
    poke();
    if (thread_.joinable()) thread_.join();
    for (auto& l : links_) close_link(*l, false);
    if (listener_ >= 0) ::close(listener_);
    if (wake_ >= 0) ::close(wake_);
  }

  void stall(std::chrono::milliseconds d) {
    {
      std::lock_guard lock(mutex_);
      stalled_until_ = std::max(stalled_until_, clock_type::now() + d);
    }
    poke();
  }
  void reset_all() {
    reset_requested_.store(true);
    poke();
  }
  void close_all() {
    close_requested_.store(true);
    poke();
  }
  relay_counters counters() const {
    std::lock_guard lock(mutex_);
    return counters_;
  }

 private:
  void poke() {
    std::uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_, &one, sizeof one);
  }

  void count(std::uint64_t relay_counters::*field, std::uint64_t n) {
    std::lock_guard lock(mutex_);
    counters_.*field += n;
  }

  void run() {
    std::vector<pollfd> fds;
    while (!stopping_.load()) {
      fds.clear();
      fds.push_back({wake_, POLLIN, 0});
      fds.push_back({listener_, POLLIN, 0});
      for (auto& l : links_) {
        fds.push_back({l->client, events(*l, l->up, l->down, l->client_eof), 0});
        fds.push_back({l->target, events(*l, l->down, l->up, l->target_eof), 0});
      }
      ::poll(fds.data(), fds.size(), timeout_ms());
      if (stopping_.load()) break;
      if (fds[0].revents) {
        std::uint64_t drained;
        [[maybe_unused]] ssize_t n = ::read(wake_, &drained, sizeof drained);
      }
      bool reset = reset_requested_.exchange(false), close = close_requested_.exchange(false);
      for (auto& l : links_) {
        if (reset) abort_link(*l, &relay_counters::reset);
        if (close) close_fault(*l);
      }
      if (fds[1].revents & POLLIN) accept_clients();
      std::size_t at = 2;
      for (std::size_t i = 0; i < links_.size() && at < fds.size(); ++i, at += 2) {
        link& l = *links_[i];
        if (l.finished) continue;
        if (fds[at].revents & POLLOUT) l.down.blocked = false;
        if (fds[at + 1].revents & POLLOUT) l.up.blocked = false;
        // Before the client's bytes pass: a client asks, then writes.
        mirror_client_entry(l);
        if (fds[at].revents & (POLLIN | POLLHUP | POLLERR)) take_in(l, l.up, l.client_eof);
        if (!l.finished && (fds[at + 1].revents & (POLLIN | POLLHUP | POLLERR)))
          take_in(l, l.down, l.target_eof);
      }
      for (auto& l : links_) {
        if (l->finished) continue;
        pass_on(*l, l->up);
        if (!l->finished) pass_on(*l, l->down);
        maybe_finish(*l);
      }
      std::erase_if(links_, [](const std::unique_ptr<link>& l) { return l->finished; });
    }
  }

  // What to poll `fd` for: reading its lane (`in`) while there is room,
  // writing the other lane (`out`) when it is blocked.
  short events(const link& l, const lane& in, const lane& out, bool eof) const {
    short e = 0;
    if (l.discarding ? !eof : (in.reading && in.queued < lane_capacity)) e |= POLLIN;
    if (!l.discarding && out.blocked && !out.queue.empty()) e |= POLLOUT;
    return e;
  }

  int timeout_ms() {
    auto now = clock_type::now();
    auto next = now + std::chrono::milliseconds(100);
    clock_type::time_point stalled;
    {
      std::lock_guard lock(mutex_);
      stalled = stalled_until_;
    }
    for (auto& l : links_)
      for (lane* x : {&l->up, &l->down})
        if (!x->queue.empty() && !x->blocked)
          next = std::min(next, std::max({x->queue.front().due, x->not_before, stalled}));
    if (next <= now) return 0;
    return static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(next - now).count());
  }

  void accept_clients() {
    for (;;) {
      int c = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) return;
      int t = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      // Entered as a vmmc client's socket; it asks when the client behind
      // it asks (mirror_client_entry), so the server answers when it would
      // answer that client, whether it asks at once or mid-stream.
      const std::uint64_t cookie =
          t >= 0 && pass_upgrades_ ? sockets::detail::presence::enter(t) : 0;
      if (t < 0 || ::connect(t, reinterpret_cast<const sockaddr*>(&target_), sizeof target_) != 0) {
        // The target refused: the client sees a reset, as from a closed port.
        set_reset_on_close(c);
        ::close(c);
        if (t >= 0) ::close(t);
        continue;
      }
      int on = 1;
      for (int fd : {c, t}) {
        ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
        ::setsockopt(fd, SOL_SOCKET, SO_OOBINLINE, &on, sizeof on);
        // Each piece we send is a segment: re-segmentation is what the
        // receiver sees, and a one-byte doorbell is never held back.
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
      }
      auto l = std::make_unique<link>();
      l->client = c;
      l->target = t;
      l->target_cookie = cookie;
      if (cookie) {
        sockaddr_storage local{}, peer{};
        socklen_t local_length = sizeof local, peer_length = sizeof peer;
        if (::getsockname(c, reinterpret_cast<sockaddr*>(&local), &local_length) == 0 &&
            ::getpeername(c, reinterpret_cast<sockaddr*>(&peer), &peer_length) == 0)
          l->client_entry = sockets::detail::presence::peer_socket(
              reinterpret_cast<sockaddr*>(&local), local_length, reinterpret_cast<sockaddr*>(&peer),
              peer_length);
      }
      std::uint64_t index = next_index_++;
      set_up_lane(l->up, c, t, up_plan_, index, true);
      set_up_lane(l->down, t, c, down_plan_, index, false);
      count(&relay_counters::connections, 1);
      mirror_client_entry(*l);  // a client that asks at once may have asked already
      links_.push_back(std::move(l));
      mark_points(links_.back()->up);
      mark_points(links_.back()->down);
    }
  }

  // Once the client behind `l` asks for the upgrade (or declines it), our
  // socket to the target says the same: the server looks at our entry.
  static void mirror_client_entry(link& l) {
    namespace presence = sockets::detail::presence;
    if (l.mirrored || !l.client_entry) return;
    switch (presence::entry_of(*l.client_entry)) {
      case presence::entry::asking:
        presence::ask(l.target_cookie);
        l.mirrored = true;
        break;
      case presence::entry::declined:
        presence::decline(l.target_cookie);
        l.mirrored = true;
        break;
      default:
        break;
    }
  }

  static void set_up_lane(lane& x, int from, int to, const fault_plan& plan, std::uint64_t index,
                          bool to_target) {
    x.from = from;
    x.to = to;
    x.plan = plan;
    x.rng.seed(plan.seed + index);
    x.to_target = to_target;
  }

  // Reads what `x.from` has; urgent bytes are read one at a time at the mark.
  void take_in(link& l, lane& x, bool& eof) {
    unsigned char buffer[read_size];
    for (int round = 0; round < 16; ++round) {
      if (l.discarding) {
        ssize_t n = ::recv(x.from, buffer, sizeof buffer, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
        if (n <= 0) {
          eof = true;
          return;
        }
        continue;
      }
      if (!x.reading || x.queued >= lane_capacity) return;
      int at_mark = 0;
      if (::ioctl(x.from, SIOCATMARK, &at_mark) != 0) at_mark = 0;
      ssize_t n = ::recv(x.from, buffer, at_mark ? 1 : sizeof buffer, MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
      if (n < 0) {
        // The sender reset: what it sent before still arrives, then the
        // reset is passed on.
        x.reading = false;
        eof = true;
        flush_held(x);
        push(x, item{item::reset_passed_on, {}, 0, {}, false});
        return;
      }
      if (n == 0) {
        x.reading = false;
        eof = true;
        flush_held(x);
        push(x, item{item::end, {}, 0, {}, false});
        return;
      }
      accept_bytes(x, buffer, static_cast<std::size_t>(n), at_mark != 0);
    }
  }

  // Applies the plan's offsets to bytes [x.offset, + n).
  void accept_bytes(lane& x, const unsigned char* p, std::size_t n, bool urgent) {
    const fault_plan& f = x.plan;
    while (n > 0) {
      std::uint64_t at = x.offset, next = at + n;
      auto cut = [&](std::uint64_t point) {
        if (point != never && point > at) next = std::min(next, point);
      };
      cut(f.drop_at);
      if (f.drop_at != never) cut(f.drop_at + f.drop_length);
      cut(f.reorder_at);
      if (f.reorder_at != never) cut(f.reorder_at + 2 * f.reorder_length);
      cut(f.stall_at);
      cut(f.close_at);
      cut(f.reset_at);
      std::size_t piece = static_cast<std::size_t>(next - at);
      bool after_end = at >= f.close_at || at >= f.reset_at;
      bool dropped = f.drop_at != never && at >= f.drop_at && at < f.drop_at + f.drop_length;
      bool reordered = f.reorder_at != never && f.reorder_length > 0 && at >= f.reorder_at &&
                       at < f.reorder_at + 2 * f.reorder_length;
      if (after_end) {
        // Nothing after a close or reset point goes on.
      } else if (dropped) {
        count(&relay_counters::dropped, piece);
      } else if (reordered) {
        x.held.insert(x.held.end(), p, p + piece);
        if (x.held.size() == 2 * f.reorder_length) {
          std::vector<unsigned char> first(x.held.begin(), x.held.begin() + f.reorder_length);
          std::vector<unsigned char> second(x.held.begin() + f.reorder_length, x.held.end());
          x.held.clear();
          push_data(x, second.data(), second.size(), false);
          push_data(x, first.data(), first.size(), false);
        }
      } else {
        push_data(x, p, piece, urgent);
      }
      x.offset += piece;
      p += piece;
      n -= piece;
      mark_points(x);
    }
  }

  // Faults that happen at the current offset.
  void mark_points(lane& x) {
    const fault_plan& f = x.plan;
    if (x.offset == f.stall_at) x.stall_pending = true;
    if (x.offset == f.close_at && x.reading) {
      flush_held(x);
      push(x, item{item::close_fault, {}, 0, {}, false});
      x.reading = false;
    }
    if (x.offset == f.reset_at && x.reading) {
      flush_held(x);
      push(x, item{item::reset_fault, {}, 0, {}, false});
      x.reading = false;
    }
  }

  void flush_held(lane& x) {
    if (x.held.empty()) return;
    std::vector<unsigned char> held;
    held.swap(x.held);
    push_data(x, held.data(), held.size(), false);
  }

  void push_data(lane& x, const unsigned char* p, std::size_t n, bool urgent) {
    while (n > 0) {
      std::size_t piece = n;
      if (x.plan.max_chunk > 0 && !urgent)
        piece = std::min<std::size_t>(n, 1 + x.rng() % x.plan.max_chunk);
      push(x, item{urgent ? item::urgent : item::data,
                   std::vector<unsigned char>(p, p + piece),
                   0,
                   {},
                   false});
      p += piece;
      n -= piece;
    }
  }

  void push(lane& x, item it) {
    auto due = clock_type::now();
    if (x.plan.max_delay.count() > 0)
      due += std::chrono::microseconds(x.rng() % (x.plan.max_delay.count() + 1));
    it.due = std::max(due, x.last_due);  // never overtakes an earlier chunk
    x.last_due = it.due;
    it.stall_before = x.stall_pending;
    x.stall_pending = false;
    x.queued += it.bytes.size();
    x.queue.push_back(std::move(it));
  }

  // Sends what is due of lane `x`.
  void pass_on(link& l, lane& x) {
    clock_type::time_point stalled;
    {
      std::lock_guard lock(mutex_);
      stalled = stalled_until_;
    }
    while (!x.queue.empty() && !x.blocked && !l.finished && !l.discarding) {
      auto now = clock_type::now();
      item& head = x.queue.front();
      if (now < stalled || now < x.not_before || now < head.due) return;
      if (head.stall_before) {
        head.stall_before = false;
        x.not_before = now + x.plan.stall_for;
        continue;
      }
      switch (head.kind) {
        case item::data:
        case item::urgent: {
          int flags = MSG_DONTWAIT | MSG_NOSIGNAL | (head.kind == item::urgent ? MSG_OOB : 0);
          ssize_t n =
              ::send(x.to, head.bytes.data() + head.sent, head.bytes.size() - head.sent, flags);
          if (n < 0 && errno == EINTR) continue;
          if (n < 0 && errno == EAGAIN) {
            x.blocked = true;
            return;
          }
          if (n < 0) {
            // The receiving end reset (or is gone): so is the connection.
            abort_link(l, nullptr);
            return;
          }
          head.sent += static_cast<std::size_t>(n);
          count(x.to_target ? &relay_counters::to_target : &relay_counters::from_target,
                static_cast<std::uint64_t>(n));
          if (head.kind == item::urgent) count(&relay_counters::urgent, 1);
          if (head.sent < head.bytes.size()) continue;
          x.queued -= head.bytes.size();
          x.queue.pop_front();
          break;
        }
        case item::end:
          ::shutdown(x.to, SHUT_WR);
          x.ended = true;
          x.queue.pop_front();
          break;
        case item::close_fault:
          close_fault(l);
          return;
        case item::reset_fault:
          abort_link(l, &relay_counters::reset);
          return;
        case item::reset_passed_on:
          abort_link(l, nullptr);
          return;
      }
    }
  }

  void close_fault(link& l) {
    if (l.finished || l.discarding) return;
    ::shutdown(l.client, SHUT_WR);
    ::shutdown(l.target, SHUT_WR);
    l.discarding = true;
    for (lane* x : {&l.up, &l.down}) {
      x->queue.clear();
      x->queued = 0;
      x->ended = true;
      x->reading = false;
    }
    count(&relay_counters::closed, 1);
  }

  void abort_link(link& l, std::uint64_t relay_counters::*counter) {
    if (l.finished) return;
    if (counter) count(counter, 1);
    close_link(l, true);
  }

  void close_link(link& l, bool reset) {
    if (l.finished) return;
    for (int fd : {l.client, l.target}) {
      if (reset) set_reset_on_close(fd);
      ::close(fd);
    }
    l.finished = true;
  }

  // Both directions ended and were passed on: close (a plain close; every
  // byte was read, so the kernel sends FIN, not a reset).
  void maybe_finish(link& l) {
    if (l.finished) return;
    if (l.discarding ? (l.client_eof && l.target_eof)
                     : (l.up.ended && l.down.ended && l.up.queue.empty() && l.down.queue.empty()))
      close_link(l, false);
  }

  sockaddr_in target_;
  fault_plan up_plan_, down_plan_;
  bool pass_upgrades_;
  int listener_ = -1, wake_ = -1;
  std::thread thread_;
  std::atomic<bool> stopping_{false}, reset_requested_{false}, close_requested_{false};
  std::vector<std::unique_ptr<link>> links_;  // the relay thread's only
  std::uint64_t next_index_ = 0;
  mutable std::mutex mutex_;  // guards what follows
  clock_type::time_point stalled_until_{};
  relay_counters counters_;
};

relay::relay(const sockaddr_in& target, fault_plan to_target, fault_plan from_target, upgrades mode)
    : impl_(std::make_unique<impl>(target, to_target, from_target, mode)) {
  port_ = impl_->start();
}

relay::~relay() = default;

sockaddr_in relay::address() const {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port_));
  return a;
}

void relay::stall(std::chrono::milliseconds duration) {
  impl_->stall(duration);
}
void relay::reset_all() {
  impl_->reset_all();
}
void relay::close_all() {
  impl_->close_all();
}
relay_counters relay::counters() const {
  return impl_->counters();
}

// ---- Control connections.

namespace {
// Inodes of the Unix stream sockets in /proc/<pid>/net/unix (the network
// namespace of that process).
std::set<unsigned long> unix_stream_inodes(pid_t pid) {
  std::set<unsigned long> out;
  std::ifstream in("/proc/" + std::to_string(pid) + "/net/unix");
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string num, refcount, protocol, flags, type, state;
    unsigned long inode = 0;
    if (words >> num >> refcount >> protocol >> flags >> type >> state >> inode && type == "0001")
      out.insert(inode);
  }
  return out;
}

// (descriptor, socket inode) of every socket the process holds.
std::vector<std::pair<int, unsigned long>> sockets_of(pid_t pid) {
  std::vector<std::pair<int, unsigned long>> out;
  std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char target[128];
    ssize_t n = ::readlink((dir + "/" + e->d_name).c_str(), target, sizeof target - 1);
    if (n <= 0) continue;
    target[n] = '\0';
    unsigned long inode = 0;
    if (std::sscanf(target, "socket:[%lu]", &inode) == 1)
      out.emplace_back(std::atoi(e->d_name), inode);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

pid_t resolve(pid_t pid) {
  return pid == 0 ? ::getpid() : pid;
}
}  // namespace

socket_snapshot::socket_snapshot(pid_t pid) : pid_(resolve(pid)) {
  auto unix_inodes = unix_stream_inodes(pid_);
  for (auto& [fd, inode] : sockets_of(pid_))
    if (unix_inodes.count(inode)) inodes_.push_back(inode);
  std::sort(inodes_.begin(), inodes_.end());
}

std::vector<int> socket_snapshot::opened_since() const {
  auto unix_inodes = unix_stream_inodes(pid_);
  std::vector<int> out;
  for (auto& [fd, inode] : sockets_of(pid_))
    if (unix_inodes.count(inode) && !std::binary_search(inodes_.begin(), inodes_.end(), inode))
      out.push_back(fd);
  return out;
}

int close_control_connection(const socket_snapshot& before) {
  std::vector<int> fds = before.opened_since();
  if (before.pid() == ::getpid()) {
    int done = 0;
    for (int fd : fds) done += ::shutdown(fd, SHUT_RDWR) == 0;
    return done;
  }
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, before.pid(), 0));
  if (pidfd < 0) return -errno;
  int done = 0, error = 0;
  for (int fd : fds) {
    int copy = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, fd, 0));
    if (copy < 0) {
      error = errno;
      continue;
    }
    done += ::shutdown(copy, SHUT_RDWR) == 0;
    ::close(copy);
  }
  ::close(pidfd);
  return done == 0 && error != 0 ? -error : done;
}

// ---- Descriptor exhaustion.

namespace {
// Highest descriptor open in this process, and one of them (to duplicate).
std::pair<int, int> highest_and_any_fd() {
  int highest = -1, any = -1;
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return {-1, -1};
  int own = ::dirfd(d);
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    int fd = std::atoi(e->d_name);
    if (fd == own) continue;
    highest = std::max(highest, fd);
    if (any < 0) any = fd;
  }
  ::closedir(d);
  return {highest, any};
}
}  // namespace

descriptor_exhaustion::descriptor_exhaustion(int leave_free) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  auto [highest, any] = highest_and_any_fd();
  if (any < 0) return;
  saved_soft_ = limit.rlim_cur;
  rlimit lowered = limit;
  lowered.rlim_cur = static_cast<rlim_t>(highest + 1 + std::max(leave_free, 0));
  if (lowered.rlim_cur > limit.rlim_max || ::setrlimit(RLIMIT_NOFILE, &lowered) != 0) return;
  for (;;) {
    int fd = ::fcntl(any, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) break;
    fillers_.push_back(fd);
  }
  std::sort(fillers_.begin(), fillers_.end());
  for (int i = 0; i < leave_free && !fillers_.empty(); ++i) {
    ::close(fillers_.back());
    fillers_.pop_back();
  }
  ok_ = true;
}

descriptor_exhaustion::~descriptor_exhaustion() {
  for (int fd : fillers_) ::close(fd);
  if (ok_) {
    rlimit limit{};
    ::getrlimit(RLIMIT_NOFILE, &limit);
    limit.rlim_cur = static_cast<rlim_t>(saved_soft_);
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
}

int descriptor_exhaustion::free_left() const {
  std::vector<int> probes;
  for (;;) {
    int fd = ::fcntl(0, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) fd = fillers_.empty() ? -1 : ::fcntl(fillers_.front(), F_DUPFD_CLOEXEC, 0);
    if (fd < 0) break;
    probes.push_back(fd);
  }
  for (int fd : probes) ::close(fd);
  return static_cast<int>(probes.size());
}

// ---- Stalled reader.

bool reader_gate::pass() {
  std::unique_lock lock(mutex_);
  if (!closed_) return true;
  parked_.store(true);
  bool opened = cv_.wait_for(lock, limit_, [&] { return !closed_; });
  parked_.store(false);
  return opened;
}

void reader_gate::close() {
  std::lock_guard lock(mutex_);
  closed_ = true;
}

void reader_gate::open() {
  {
    std::lock_guard lock(mutex_);
    closed_ = false;
  }
  cv_.notify_all();
}

bool reader_gate::wait_parked(std::chrono::milliseconds timeout) {
  auto deadline = clock_type::now() + timeout;
  while (!parked_.load()) {
    if (clock_type::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

bool wait_quiet(const std::function<std::uint64_t()>& progress, std::chrono::milliseconds quiet,
                std::chrono::milliseconds timeout, std::uint64_t* at) {
  auto start = clock_type::now(), since = start;
  std::uint64_t last = progress();
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    auto now = clock_type::now();
    std::uint64_t v = progress();
    if (v != last) {
      last = v;
      since = now;
    }
    if (now - since >= quiet) {
      if (at) *at = last;
      return true;
    }
    if (now - start >= timeout) return false;
  }
}

// ---- Pattern, checksum, verifier.

static_assert(std::endian::native == std::endian::little, "the pattern assumes little endian");

std::uint64_t pattern_word(std::uint64_t seed, std::uint64_t index) {
  std::uint64_t z = seed + (index + 1) * 0x9E3779B97F4A7C15ull;  // splitmix64
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

unsigned char pattern_byte(std::uint64_t seed, std::uint64_t offset) {
  return static_cast<unsigned char>(pattern_word(seed, offset >> 3) >> (8 * (offset & 7)));
}

void fill_pattern(std::uint64_t seed, std::uint64_t offset, unsigned char* data,
                  std::size_t length) {
  std::size_t i = 0;
  for (; i < length && ((offset + i) & 7) != 0; ++i) data[i] = pattern_byte(seed, offset + i);
  for (; i + 8 <= length; i += 8) {
    std::uint64_t word = pattern_word(seed, (offset + i) >> 3);
    std::memcpy(data + i, &word, 8);
  }
  for (; i < length; ++i) data[i] = pattern_byte(seed, offset + i);
}

std::vector<unsigned char> pattern(std::uint64_t seed, std::size_t length) {
  std::vector<unsigned char> v(length);
  fill_pattern(seed, 0, v.data(), length);
  return v;
}

std::size_t check_pattern(std::uint64_t seed, std::uint64_t offset, const unsigned char* data,
                          std::size_t length) {
  std::size_t i = 0;
  for (; i < length && ((offset + i) & 7) != 0; ++i)
    if (data[i] != pattern_byte(seed, offset + i)) return i;
  for (; i + 8 <= length; i += 8) {
    std::uint64_t word;
    std::memcpy(&word, data + i, 8);
    if (word != pattern_word(seed, (offset + i) >> 3)) break;
  }
  for (; i < length; ++i)
    if (data[i] != pattern_byte(seed, offset + i)) return i;
  return length;
}

void stream_checksum::update(const unsigned char* data, std::size_t length) {
  std::size_t i = 0;
  auto add_byte = [&](unsigned char b) {
    partial_ |= std::uint64_t{b} << (8 * filled_);
    if (++filled_ == 8) {
      mix(partial_);
      partial_ = 0;
      filled_ = 0;
    }
  };
  for (; i < length && filled_ != 0; ++i) add_byte(data[i]);
  for (; i + 8 <= length; i += 8) {
    std::uint64_t word;
    std::memcpy(&word, data + i, 8);
    mix(word);
  }
  for (; i < length; ++i) add_byte(data[i]);
}

std::uint64_t stream_checksum::value() const {
  stream_checksum last = *this;
  last.mix(partial_ ^ (std::uint64_t{filled_} << 56));
  return last.sum_;
}

namespace {
// What the bytes at a mismatch look like: the pattern from a later offset
// (bytes lost), from an earlier one (duplicated), or neither (corrupted).
std::string classify(std::uint64_t seed, std::uint64_t offset, const unsigned char* p,
                     std::size_t n) {
  constexpr std::uint64_t reach = 1 << 16;
  std::size_t k = std::min<std::size_t>(n, 32);
  if (k < 8) return "corrupted or misplaced (too few bytes to tell)";
  for (std::uint64_t d = 1; d <= reach; ++d)
    if (check_pattern(seed, offset + d, p, k) == k)
      return std::to_string(d) + " byte(s) lost (what came is the stream from offset " +
             std::to_string(offset + d) + ")";
  for (std::uint64_t d = 1; d <= std::min(offset, reach); ++d)
    if (check_pattern(seed, offset - d, p, k) == k)
      return std::to_string(d) + " byte(s) duplicated (what came is the stream from offset " +
             std::to_string(offset - d) + ")";
  return "corrupted (not the stream at any offset within 64 KiB)";
}
}  // namespace

bool stream_verifier::feed(const void* data, std::size_t length) {
  if (!error_.empty()) return false;
  const auto* p = static_cast<const unsigned char*>(data);
  std::size_t good = check_pattern(seed_, verified_, p, length);
  checksum_.update(p, good);
  verified_ += good;
  if (good == length) return true;
  char head[96];
  std::snprintf(head, sizeof head, "byte at offset %llu is 0x%02x, expected 0x%02x: ",
                static_cast<unsigned long long>(verified_), p[good],
                pattern_byte(seed_, verified_));
  error_ = head + classify(seed_, verified_, p + good, length - good);
  return false;
}

std::uint64_t pattern_checksum(std::uint64_t seed, std::uint64_t length) {
  stream_checksum sum;
  std::vector<unsigned char> chunk(std::size_t{1} << 20);
  for (std::uint64_t at = 0; at < length; at += chunk.size()) {
    std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size(), length - at));
    fill_pattern(seed, at, chunk.data(), n);
    sum.update(chunk.data(), n);
  }
  return sum.value();
}

}  // namespace vmmc::test::fault
