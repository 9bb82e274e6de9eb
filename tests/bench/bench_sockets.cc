// tests/bench/bench_sockets.cc: the `sockets` benchmark (see bench_sockets.h).
//
// Every socket experiment is written once, as templates over an api type whose
// static members are the socket calls, and runs twice: over kernel_api (the
// reference) and over vmmc_api (ours). The parent process is the client and
// does the timing; the forked child is the server and runs whatever plan the
// parent sends over the peer_link. Sockets carry SO_RCVTIMEO/SO_SNDTIMEO and
// the parent arms a watchdog around each measurement, so a stuck peer or a
// stuck library ends the run with an error instead of hanging it.
#include "bench_sockets.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "vmmc/sockets/socket.h"

namespace vmmc::bench {
namespace {

// The two sides measured. Function pointers known at compile time: the calls
// compile to direct calls, so neither side pays for the indirection.
struct kernel_api {
  static constexpr auto socket = &::socket;
  static constexpr auto bind = &::bind;
  static constexpr auto listen = &::listen;
  static constexpr auto accept = &::accept;
  static constexpr auto connect = &::connect;
  static constexpr auto read = &::read;
  static constexpr auto write = &::write;
  static constexpr auto setsockopt = &::setsockopt;
  static constexpr auto getsockname = &::getsockname;
  static constexpr auto close = &::close;
  static constexpr auto epoll_create1 = &::epoll_create1;
  static constexpr auto epoll_ctl = &::epoll_ctl;
  static constexpr auto epoll_wait = &::epoll_wait;
};

struct vmmc_api {
  static constexpr auto socket = &vmmc::sockets::socket;
  static constexpr auto bind = &vmmc::sockets::bind;
  static constexpr auto listen = &vmmc::sockets::listen;
  static constexpr auto accept = &vmmc::sockets::accept;
  static constexpr auto connect = &vmmc::sockets::connect;
  static constexpr auto read = &vmmc::sockets::read;
  static constexpr auto write = &vmmc::sockets::write;
  static constexpr auto setsockopt = &vmmc::sockets::setsockopt;
  static constexpr auto getsockname = &vmmc::sockets::getsockname;
  static constexpr auto close = &vmmc::sockets::close;
  static constexpr auto epoll_create1 = &vmmc::sockets::epoll_create1;
  static constexpr auto epoll_ctl = &vmmc::sockets::epoll_ctl;
  static constexpr auto epoll_wait = &vmmc::sockets::epoll_wait;
};

const std::vector<std::size_t> ping_pong_sizes = {1, 64, 1024, 16 * 1024, 64 * 1024};
const std::vector<std::size_t> stream_sizes = {64, 4 * 1024, 64 * 1024, 1 << 20, 8 << 20};
constexpr std::size_t max_message = 8 << 20;
// Large enough that a reader never limits a message to less than a whole one.
constexpr std::size_t stream_read_buffer = 8 << 20;
constexpr std::size_t request_size = 64;
constexpr std::size_t many_connections = 100;
constexpr std::size_t placement_size = 1 << 20;
constexpr int max_events = 128;
constexpr int io_timeout_s = 10;     // SO_RCVTIMEO, SO_SNDTIMEO, epoll_wait
constexpr unsigned watchdog_s = 60;  // one parent-side measurement

// ---------------------------------------------------------------- errors

volatile std::sig_atomic_t watchdog_fired = 0;

[[noreturn]] void fail(const std::string& what) {
  const int e = errno;
  const bool timed_out = e == EAGAIN || e == EWOULDBLOCK || (e == EINTR && watchdog_fired);
  throw std::runtime_error(what + ": " + (timed_out ? "timed out" : std::strerror(e)));
}

int check(int result, const char* what) {
  if (result < 0) fail(what);
  return result;
}

// A kernel call blocked on a socket returns EINTR when SIGALRM arrives (no
// SA_RESTART), and the I/O helpers below throw. A library that ignores the
// signal and keeps waiting is ended five seconds later; the child dies with
// us (run_pair sets PR_SET_PDEATHSIG).
void on_watchdog(int) {
  if (watchdog_fired) {
    static constexpr char message[] = "vmmc-bench sockets: a measurement hung, giving up\n";
    [[maybe_unused]] const ssize_t n = ::write(2, message, sizeof message - 1);
    ::_exit(1);
  }
  watchdog_fired = 1;
  ::alarm(5);
}

class watchdog {
 public:
  watchdog() {
    struct sigaction action {};
    action.sa_handler = on_watchdog;
    ::sigaction(SIGALRM, &action, nullptr);
    watchdog_fired = 0;
    ::alarm(watchdog_s);
  }
  ~watchdog() { ::alarm(0); }
  watchdog(const watchdog&) = delete;
  watchdog& operator=(const watchdog&) = delete;
};

// ---------------------------------------------------------------- resources

// A descriptor closed through Api::close: the library must see the close of
// every descriptor it manages.
template <class Api>
class owned_fd {
 public:
  explicit owned_fd(int fd = -1) : fd_(fd) {}
  owned_fd(owned_fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  owned_fd& operator=(owned_fd&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  ~owned_fd() {
    if (fd_ >= 0) Api::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// Page-aligned memory, touched once so that no page fault lands in a timed
// region; MAP_SHARED over `memfd` when one is given. Page alignment on
// purpose: see raw::memcpy_bandwidth_GBps.
class page_buffer {
 public:
  explicit page_buffer(std::size_t size, int memfd = -1) : size_(size) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE,
                     memfd < 0 ? MAP_PRIVATE | MAP_ANONYMOUS : MAP_SHARED, memfd, 0);
    if (p == MAP_FAILED) fail("mmap");
    data_ = static_cast<std::byte*>(p);
    std::memset(data_, 1, size);
  }
  ~page_buffer() { ::munmap(data_, size_); }
  page_buffer(const page_buffer&) = delete;
  page_buffer& operator=(const page_buffer&) = delete;
  std::byte* data() const { return data_; }

 private:
  std::byte* data_;
  std::size_t size_;
};

// ---------------------------------------------------------------- socket helpers

// One read: the bytes it returned, 0 at end of stream.
template <class Api>
std::size_t read_some(int fd, void* data, std::size_t size) {
  for (;;) {
    const ssize_t n = Api::read(fd, data, size);
    if (n >= 0) return static_cast<std::size_t>(n);
    if (errno != EINTR || watchdog_fired) fail("read");
  }
}

template <class Api>
void read_full(int fd, void* data, std::size_t size) {
  auto* p = static_cast<std::byte*>(data);
  while (size > 0) {
    const std::size_t n = read_some<Api>(fd, p, size);
    if (n == 0) throw std::runtime_error("read: the peer closed the connection");
    p += n;
    size -= n;
  }
}

template <class Api>
void write_full(int fd, const void* data, std::size_t size) {
  const auto* p = static_cast<const std::byte*>(data);
  while (size > 0) {
    const ssize_t n = Api::write(fd, p, size);
    if (n < 0) {
      if (errno != EINTR || watchdog_fired) fail("write");
      continue;
    }
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

template <class Api>
void set_option(int fd, int level, int name, const auto& value, const char* what) {
  check(Api::setsockopt(fd, level, name, &value, sizeof value), what);
}

// Every data socket: no Nagle, and no blocking call longer than io_timeout_s.
template <class Api>
void prepare(int fd) {
  set_option<Api>(fd, IPPROTO_TCP, TCP_NODELAY, 1, "TCP_NODELAY");
  const timeval timeout{io_timeout_s, 0};
  set_option<Api>(fd, SOL_SOCKET, SO_RCVTIMEO, timeout, "SO_RCVTIMEO");
  set_option<Api>(fd, SOL_SOCKET, SO_SNDTIMEO, timeout, "SO_SNDTIMEO");
}

// A listener on an ephemeral port of the child's address (loopback unless
// `vmmc-bench multihost` placed it on another host); its SO_RCVTIMEO
// bounds accept().
template <class Api>
owned_fd<Api> open_listener(std::uint16_t& port) {
  owned_fd<Api> listener(check(Api::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), "socket"));
  const timeval timeout{io_timeout_s, 0};
  set_option<Api>(listener.get(), SOL_SOCKET, SO_RCVTIMEO, timeout, "SO_RCVTIMEO");
  sockaddr_in address = child_address(0);
  socklen_t length = sizeof address;
  auto* generic = reinterpret_cast<sockaddr*>(&address);
  check(Api::bind(listener.get(), generic, length), "bind");
  check(Api::listen(listener.get(), SOMAXCONN), "listen");
  check(Api::getsockname(listener.get(), generic, &length), "getsockname");
  port = ntohs(address.sin_port);
  return listener;
}

template <class Api>
owned_fd<Api> connect_to(std::uint16_t port) {
  owned_fd<Api> fd(check(Api::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), "socket"));
  prepare<Api>(fd.get());
  const sockaddr_in address = child_address(port);
  check(Api::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address),
        "connect");
  return fd;
}

template <class Api>
owned_fd<Api> accept_from(int listener) {
  for (;;) {
    const int fd = Api::accept(listener, nullptr, nullptr);
    if (fd < 0 && errno == EINTR) continue;
    owned_fd<Api> accepted(check(fd, "accept"));
    prepare<Api>(fd);
    return accepted;
  }
}

template <class Api>
void watch_readable(int epoll_fd, int fd) {
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.fd = fd;
  check(Api::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &event), "epoll_ctl");
}

// Level-triggered: a descriptor with a request still unread comes back.
template <class Api>
int wait_readable(int epoll_fd, epoll_event* events) {
  for (;;) {
    const int n = Api::epoll_wait(epoll_fd, events, max_events, io_timeout_s * 1000);
    if (n > 0) return n;
    if (n == 0) throw std::runtime_error("epoll_wait: timed out");
    if (errno != EINTR || watchdog_fired) fail("epoll_wait");
  }
}

// ---------------------------------------------------------------- the protocol

enum class experiment : std::uint32_t {
  ping_pong,           // `count` round trips of `size` bytes
  stream,              // `count` messages of `size` bytes, read in large reads, then an ack
  stream_sized_reads,  // the same, read one message at a time
  connect,             // `count` connections, one 1-byte round trip each
  open_many,           // `count` connections kept open, watched by epoll
  requests,            // `count` requests of request_size bytes over those connections
  close_many,
  stop
};

struct plan {
  experiment what;
  std::uint32_t ours;  // which server runs it: 0 kernel_api, 1 vmmc_api
  std::uint64_t size;
  std::uint64_t count;
};

// The child's side for one api: a listener, the connection the parent made
// right after the listener's port reached it, and what a plan needs.
template <class Api>
class server {
 public:
  explicit server(peer_link& link) {
    std::uint16_t port = 0;
    listener_ = open_listener<Api>(port);
    link.send_value(port);
    conn_ = accept_from<Api>(listener_.get());
  }

  int connection() const { return conn_.get(); }

  void run(const plan& p) {
    const int conn = conn_.get();
    std::byte* buffer = buffer_.data();
    switch (p.what) {
      case experiment::ping_pong:
        for (std::uint64_t i = 0; i < p.count; ++i) {
          read_full<Api>(conn, buffer, p.size);
          write_full<Api>(conn, buffer, p.size);
        }
        break;
      case experiment::stream:
        for (std::uint64_t left = p.size * p.count; left > 0;) {
          const std::size_t n = read_some<Api>(conn, buffer, std::min(left, stream_read_buffer));
          if (n == 0) throw std::runtime_error("read: the peer closed the connection");
          left -= n;
        }
        write_full<Api>(conn, buffer, 1);
        break;
      case experiment::stream_sized_reads:
        for (std::uint64_t i = 0; i < p.count; ++i) read_full<Api>(conn, buffer, p.size);
        write_full<Api>(conn, buffer, 1);
        break;
      case experiment::connect:
        for (std::uint64_t i = 0; i < p.count; ++i) {
          const owned_fd<Api> fd = accept_from<Api>(listener_.get());
          read_full<Api>(fd.get(), buffer, 1);
          write_full<Api>(fd.get(), buffer, 1);
          // Closing after the client leaves its TIME_WAIT on the client side,
          // as for a typical request/response protocol.
          if (read_some<Api>(fd.get(), buffer, 1) != 0)
            throw std::runtime_error("connect: unexpected data");
        }
        break;
      case experiment::open_many:
        many_epoll_ = owned_fd<Api>(check(Api::epoll_create1(EPOLL_CLOEXEC), "epoll_create1"));
        for (std::uint64_t i = 0; i < p.count; ++i) {
          many_.push_back(accept_from<Api>(listener_.get()));
          watch_readable<Api>(many_epoll_.get(), many_.back().get());
        }
        break;
      case experiment::requests: {
        epoll_event events[max_events];
        for (std::uint64_t served = 0; served < p.count;) {
          const int n = wait_readable<Api>(many_epoll_.get(), events);
          for (int i = 0; i < n; ++i, ++served) {
            read_full<Api>(events[i].data.fd, buffer, request_size);
            write_full<Api>(events[i].data.fd, buffer, request_size);
          }
        }
        break;
      }
      case experiment::close_many:
        many_.clear();
        many_epoll_ = owned_fd<Api>();
        break;
      case experiment::stop:
        break;
    }
  }

 private:
  owned_fd<Api> listener_, conn_;
  page_buffer buffer_{max_message};
  std::vector<owned_fd<Api>> many_;
  owned_fd<Api> many_epoll_;
};

void print_description(const char* which, int fd);

// The child: serves the parent's plans on either api until `stop`.
void serve(peer_link& link) {
  server<kernel_api> kernel(link);
  server<vmmc_api> ours(link);
  for (;;) {
    const plan p = link.recv_value<plan>();
    if (p.what == experiment::stop) {
      print_description("connection, server end (received the streams)", ours.connection());
      std::cout.flush();
      link.send("done");
      return;
    }
    link.send("ready");
    if (p.ours)
      ours.run(p);
    else
      kernel.run(p);
    link.send("done");
  }
}

// The parent's side for one api: each call runs one plan with the child and
// returns the seconds it took.
template <class Api>
class client {
 public:
  explicit client(peer_link& link)
      : link_(link),
        port_(link.recv_value<std::uint16_t>()),
        conn_(connect_to<Api>(port_)),
        buffer_(max_message) {}
  client(const client&) = delete;
  client& operator=(const client&) = delete;

  int connection() const { return conn_.get(); }

  double ping_pong(std::size_t size, std::uint64_t count) {
    const watchdog guard;
    start(experiment::ping_pong, size, count);
    const auto t0 = bench_clock::now();
    for (std::uint64_t i = 0; i < count; ++i) {
      write_full<Api>(conn_.get(), buffer_.data(), size);
      read_full<Api>(conn_.get(), buffer_.data(), size);
    }
    const double seconds = seconds_between(t0, bench_clock::now());
    finish();
    return seconds;
  }

  // From the first byte written to the receiver's acknowledgement of the last.
  double stream(experiment how, std::size_t size, std::uint64_t count) {
    const watchdog guard;
    start(how, size, count);
    const auto t0 = bench_clock::now();
    for (std::uint64_t i = 0; i < count; ++i) write_full<Api>(conn_.get(), buffer_.data(), size);
    read_full<Api>(conn_.get(), buffer_.data(), 1);
    const double seconds = seconds_between(t0, bench_clock::now());
    finish();
    return seconds;
  }

  // The sum over connections of socket() to the 1-byte reply (close() is
  // left out: it is not set-up).
  double connect(std::uint64_t count) {
    const watchdog guard;
    start(experiment::connect, 1, count);
    double seconds = 0;
    for (std::uint64_t i = 0; i < count; ++i) {
      const auto t0 = bench_clock::now();
      const owned_fd<Api> fd = connect_to<Api>(port_);
      write_full<Api>(fd.get(), buffer_.data(), 1);
      read_full<Api>(fd.get(), buffer_.data(), 1);
      seconds += seconds_between(t0, bench_clock::now());
    }
    finish();
    return seconds;
  }

  void open_many(std::size_t count) {
    const watchdog guard;
    start(experiment::open_many, 0, count);
    many_epoll_ = owned_fd<Api>(check(Api::epoll_create1(EPOLL_CLOEXEC), "epoll_create1"));
    for (std::size_t i = 0; i < count; ++i) {
      many_.push_back(connect_to<Api>(port_));
      watch_readable<Api>(many_epoll_.get(), many_.back().get());
    }
    finish();
  }

  // `count` requests, one outstanding per connection: each answer is
  // followed by the next request on the same connection.
  double requests(std::uint64_t count) {
    const watchdog guard;
    start(experiment::requests, request_size, count);
    std::byte* request = buffer_.data();
    std::byte* response = buffer_.data() + request_size;
    epoll_event events[max_events];
    const auto t0 = bench_clock::now();
    std::uint64_t issued = 0;
    for (; issued < count && issued < many_.size(); ++issued)
      write_full<Api>(many_[issued].get(), request, request_size);
    for (std::uint64_t answered = 0; answered < count;) {
      const int n = wait_readable<Api>(many_epoll_.get(), events);
      for (int i = 0; i < n; ++i, ++answered) {
        read_full<Api>(events[i].data.fd, response, request_size);
        if (issued < count) {
          write_full<Api>(events[i].data.fd, request, request_size);
          ++issued;
        }
      }
    }
    const double seconds = seconds_between(t0, bench_clock::now());
    finish();
    return seconds;
  }

  void close_many() {
    start(experiment::close_many, 0, 0);
    many_.clear();
    many_epoll_ = owned_fd<Api>();
    finish();
  }

 private:
  void start(experiment what, std::uint64_t size, std::uint64_t count) {
    link_.send_value(plan{what, std::is_same_v<Api, vmmc_api>, size, count});
    if (link_.recv() != "ready") throw std::runtime_error("child out of step");
  }
  void finish() {
    if (link_.recv() != "done") throw std::runtime_error("child out of step");
  }

  peer_link& link_;
  std::uint16_t port_;
  owned_fd<Api> conn_;
  page_buffer buffer_;
  std::vector<owned_fd<Api>> many_;
  owned_fd<Api> many_epoll_;
};

// ---------------------------------------------------------------- measurements

struct clients {
  client<kernel_api> kernel;
  client<vmmc_api> ours;
};

struct socket_results {
  std::vector<double> latency, bandwidth, bandwidth_sized_reads, connect_us, requests_per_s;
  std::shared_ptr<socket_results> kernel_reference;  // measured beside these, same run
};

// As calibrated_median, for both apis at once: `run(side, n)` performs n
// iterations on client `side` and returns seconds. The repeats alternate
// between the sides, so that a disturbance that comes and goes over seconds
// (the machine has two cores) hits both alike and the gain stays honest.
// Appends the two medians of value(seconds, n) to `kernel` and `ours`.
template <class Run, class Value>
void side_by_side(clients& c, const effort& e, std::size_t probe, std::size_t most, Run run,
                  Value value, std::vector<double>& kernel, std::vector<double>& ours) {
  auto iterations = [&](auto& side) {
    return iterations_for(e.repeat_seconds, run(side, probe), probe, probe, most);
  };
  const std::size_t kernel_n = iterations(c.kernel);
  const std::size_t ours_n = iterations(c.ours);
  std::vector<double> kernel_values, ours_values;
  // Each side goes first every other repeat: neither always runs just after
  // the other has warmed or crowded the machine.
  for (int i = 0; i < e.repeats; ++i) {
    auto measure_kernel = [&] {
      kernel_values.push_back(value(run(c.kernel, kernel_n), kernel_n));
    };
    auto measure_ours = [&] { ours_values.push_back(value(run(c.ours, ours_n), ours_n)); };
    if (i % 2 == 0) {
      measure_kernel();
      measure_ours();
    } else {
      measure_ours();
      measure_kernel();
    }
  }
  kernel.push_back(median(std::move(kernel_values)));
  ours.push_back(median(std::move(ours_values)));
}

// Messages per stream: a fixed byte total, but not so many small messages
// that one write per message makes the run drag.
std::uint64_t stream_messages(std::size_t size, bool quick) {
  const std::uint64_t total = quick ? 64 << 20 : 512 << 20;
  const std::uint64_t most = quick ? 32 << 10 : 256 << 10;
  return std::clamp<std::uint64_t>(total / size, 1, most);
}

void print_description(const char* which, int fd) {
  std::cout << "# sockets: ours' " << which << ": ";
  const std::optional<vmmc::sockets::socket_info> info = vmmc::sockets::describe(fd);
  if (!info) {
    std::cout << "not managed\n";
    return;
  }
  std::cout << "path " << info->path << ", " << (info->accelerated ? "" : "not ") << "accelerated"
            << (info->plain ? " (peer is plain TCP)" : "") << "; bytes in/out over vmmc "
            << info->bytes_in << "/" << info->bytes_out << ", over tcp " << info->tcp_bytes_in
            << "/" << info->tcp_bytes_out << "; received bytes copied/redirected "
            << info->bytes_copied << "/" << info->bytes_redirected << "; doorbells in/out "
            << info->doorbells_in << "/" << info->doorbells_out << "\n";
}

// The ping-pong sizes of a scope: scope::latency takes 64 B, sockperf's
// default message.
std::vector<std::size_t> latency_sizes_of(scope what) {
  return what == scope::all ? ping_pong_sizes : std::vector<std::size_t>{64};
}

void measure_sockets(bool quick, scope what, socket_results& kernel, socket_results& ours) {
  run_pair(
      [&](peer_link& link) {
        clients c{client<kernel_api>(link), client<vmmc_api>(link)};
        auto both = [&](std::size_t probe, std::size_t most, auto run, auto value,
                        std::vector<double> socket_results::*into) {
          side_by_side(c, effort_for(quick, what), probe, most, run, value, kernel.*into,
                       ours.*into);
        };
        // Warm-up, and for ours the switch-over, which happens on first bytes.
        c.kernel.ping_pong(64, quick ? 200 : 2000);
        c.ours.ping_pong(64, quick ? 200 : 2000);
        for (std::size_t size : latency_sizes_of(what))
          both(
              50, 1'000'000, [&](auto& side, std::size_t n) { return side.ping_pong(size, n); },
              [](double seconds, std::size_t n) {
                return seconds / static_cast<double>(n) / 2 * 1e6;
              },
              &socket_results::latency);
        if (what == scope::all) {
          // A fixed count: the probe run is the same stream, so it warms up too.
          for (std::size_t size : stream_sizes) {
            const std::uint64_t n = stream_messages(size, quick);
            auto GBps = [size](double seconds, std::size_t count) {
              return static_cast<double>(size * count) / seconds / 1e9;
            };
            for (auto [how, into] : {std::pair{experiment::stream, &socket_results::bandwidth},
                                     std::pair{experiment::stream_sized_reads,
                                               &socket_results::bandwidth_sized_reads}})
              both(
                  n, n,
                  [&](auto& side, std::size_t count) { return side.stream(how, size, count); },
                  GBps, into);
          }

          // The probe takes each side's first-connection costs.
          both(
              20, quick ? 500 : 3000, [](auto& side, std::size_t n) { return side.connect(n); },
              [](double seconds, std::size_t n) { return seconds / static_cast<double>(n) * 1e6; },
              &socket_results::connect_us);

          c.kernel.open_many(many_connections);
          c.ours.open_many(many_connections);
          c.kernel.requests(4 * many_connections);  // every connection's first bytes
          c.ours.requests(4 * many_connections);
          both(
              2 * many_connections, 100'000'000,
              [](auto& side, std::size_t n) { return side.requests(n); },
              [](double seconds, std::size_t n) { return static_cast<double>(n) / seconds; },
              &socket_results::requests_per_s);
          c.kernel.close_many();
          c.ours.close_many();
        }
        print_description(what == scope::all ? "connection, client end (sent the streams)"
                                             : "connection, client end",
                          c.ours.connection());
        link.send_value(plan{experiment::stop, 0, 0, 0});
        if (link.recv() != "done") throw std::runtime_error("child out of step");
      },
      serve);
}

struct placement_results {
  double memcpy_GBps = not_measured;
  double process_vm_writev_GBps = not_measured;
};

// placement_size bytes into the child's private buffer, two ways: the parent
// calls process_vm_writev (the kernel places the bytes directly), or the child
// copies them out of a region both processes map (what the sockets layer does
// with its mapped ring). Both read a warm source and write a warm destination.
placement_results measure_placement(bool quick) {
  const owned_fd<kernel_api> memfd(::memfd_create("vmmc-bench-placement", MFD_CLOEXEC));
  if (memfd.get() < 0) fail("memfd_create");
  check(::ftruncate(memfd.get(), placement_size), "ftruncate");
  struct target {
    pid_t pid;
    std::uint64_t address;
  };
  auto GBps = [](double seconds, std::size_t n) {
    return static_cast<double>(placement_size) * static_cast<double>(n) / seconds / 1e9;
  };
  placement_results r;
  run_pair(
      [&](peer_link& link) {
        const page_buffer source(placement_size);
        const page_buffer shared(placement_size, memfd.get());
        const auto where = link.recv_value<target>();
        iovec local{source.data(), placement_size};
        iovec remote{reinterpret_cast<void*>(where.address), placement_size};
        auto writev = [&](std::size_t n) {
          const auto t0 = bench_clock::now();
          for (std::size_t i = 0; i < n; ++i)
            if (::process_vm_writev(where.pid, &local, 1, &remote, 1, 0) !=
                static_cast<ssize_t>(placement_size))
              fail("process_vm_writev");
          return seconds_between(t0, bench_clock::now());
        };
        try {
          r.process_vm_writev_GBps = calibrated_median(quick, 16, 1'000'000, writev, GBps);
        } catch (const std::runtime_error& e) {
          // Containers may forbid it (seccomp, ptrace policy): report the gap.
          std::cout << "# sockets/placement: " << e.what() << "\n";
        }
        auto copy_out = [&](std::size_t n) {
          link.send_value<std::uint64_t>(n);
          return link.recv_value<double>();
        };
        r.memcpy_GBps = calibrated_median(quick, 16, 1'000'000, copy_out, GBps);
        link.send_value<std::uint64_t>(0);
      },
      [&](peer_link& link) {
        const page_buffer shared(placement_size, memfd.get());
        const page_buffer destination(placement_size);
        link.send_value(target{::getpid(), reinterpret_cast<std::uint64_t>(destination.data())});
        while (const auto n = link.recv_value<std::uint64_t>()) {
          const auto t0 = bench_clock::now();
          for (std::uint64_t i = 0; i < n; ++i) {
            std::memcpy(destination.data(), shared.data(), placement_size);
            // Keep the copy: the compiler must assume the destination is read.
            __asm__ __volatile__("" : : "r"(destination.data()) : "memory");
          }
          link.send_value(seconds_between(t0, bench_clock::now()));
        }
      });
  return r;
}

}  // namespace

namespace {
// Ours runs on the path the core settings choose: "shm" = same-host mapped
// memory (the default), "tcp" = libfabric tcp;ofi_rxm as between hosts.
// The sockets layer makes its VMMC context once per process, so each
// provider is measured in a process of its own, which sends its results back.
socket_results measure_with_provider(const std::string& provider, bool quick, scope what) {
  int fds[2];
  if (::pipe(fds) != 0) fail("pipe");
  std::cout.flush();
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) fail("fork");
  if (pid == 0) {
    ::close(fds[0]);
    int code = 0;
    try {
      if (!provider.empty()) {
        ::setenv("VMMC_CORE_MAPPED", provider == "shm" ? "1" : "0", 1);
        ::setenv("VMMC_CORE_PROVIDERS", provider.c_str(), 1);
      }
      socket_results kernel, ours;
      measure_sockets(quick, what, kernel, ours);
      for (const socket_results* r : {&kernel, &ours})
        for (auto field : {&socket_results::latency, &socket_results::bandwidth,
                           &socket_results::bandwidth_sized_reads, &socket_results::connect_us,
                           &socket_results::requests_per_s}) {
          const std::vector<double>& v = r->*field;
          const std::uint64_t n = v.size();
          if (::write(fds[1], &n, sizeof n) != sizeof n ||
              ::write(fds[1], v.data(), n * sizeof(double)) !=
                  static_cast<ssize_t>(n * sizeof(double)))
            fail("write results");
        }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "vmmc-bench sockets (%s): %s\n", provider.c_str(), e.what());
      code = 1;
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  ::close(fds[1]);
  auto read_exactly = [&](void* data, std::size_t size) {
    auto* p = static_cast<char*>(data);
    while (size > 0) {
      const ssize_t n = ::read(fds[0], p, size);
      if (n <= 0) throw std::runtime_error("sockets benchmark (" + provider + ") failed");
      p += n;
      size -= static_cast<std::size_t>(n);
    }
  };
  socket_results kernel, ours;
  try {
    for (socket_results* r : {&kernel, &ours})
      for (auto field : {&socket_results::latency, &socket_results::bandwidth,
                         &socket_results::bandwidth_sized_reads, &socket_results::connect_us,
                         &socket_results::requests_per_s}) {
        std::uint64_t n = 0;
        read_exactly(&n, sizeof n);
        (r->*field).resize(n);
        read_exactly((r->*field).data(), n * sizeof(double));
      }
  } catch (...) {
    ::close(fds[0]);
    ::waitpid(pid, nullptr, 0);
    throw;
  }
  ::close(fds[0]);
  ::waitpid(pid, nullptr, 0);
  ours.kernel_reference = std::make_shared<socket_results>(std::move(kernel));
  return ours;
}
}  // namespace

void measure_sockets_rows(bool quick, const std::string& provider, const std::string& prefix,
                          std::vector<result_row>& rows, scope what) {
  // A peer that dies mid-write must surface as EPIPE, not kill us silently.
  ::signal(SIGPIPE, SIG_IGN);
  std::cerr << "measuring kernel_tcp and ours ("
            << (provider.empty() ? "default settings" : provider) << "), alternately\n";
  const socket_results ours = measure_with_provider(provider, quick, what);
  const socket_results& kernel = *ours.kernel_reference;
  add_rows(rows, prefix + "latency", metric::latency_us, latency_sizes_of(what), ours.latency,
           {{"kernel_tcp", kernel.latency}});
  if (what == scope::all) {
    add_rows(rows, prefix + "bandwidth", metric::bandwidth_GBps, stream_sizes, ours.bandwidth,
             {{"kernel_tcp", kernel.bandwidth}});
    add_rows(rows, prefix + "bandwidth_sized_reads", metric::bandwidth_GBps, stream_sizes,
             ours.bandwidth_sized_reads, {{"kernel_tcp", kernel.bandwidth_sized_reads}});
    add_rows(rows, prefix + "connect", metric::latency_us, {1}, ours.connect_us,
             {{"kernel_tcp", kernel.connect_us}});
    add_rows(rows, prefix + "many_connections", metric::rate_per_s, {request_size},
             ours.requests_per_s, {{"kernel_tcp", kernel.requests_per_s}});
  }
}

void run_sockets_benchmark(const options& opts, std::vector<result_row>& rows) {
  const bool quick = opts.quick;
  for (const std::string& provider : opts.providers)
    measure_sockets_rows(quick, provider,
                         provider == "shm" ? "sockets/" : "sockets-" + provider + "/", rows);
  std::cerr << "measuring placement\n";
  const placement_results placement = measure_placement(quick);
  add_rows(rows, "sockets/placement", metric::bandwidth_GBps, {placement_size},
           {placement.memcpy_GBps}, {{"process_vm_writev", {placement.process_vm_writev_GBps}}});
}

}  // namespace vmmc::bench
