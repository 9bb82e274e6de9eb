// The descriptor table, the process-wide VMMC context, settings and logging.
#include <sys/resource.h>

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "descriptor_map.h"
#include "sockets.h"

namespace vmmc::sockets::detail {

namespace settings {
// clang-format off
const core::setting enable    {"sockets", "enable",    core::setting_type::boolean, "1",
  "offer and accept VMMC on TCP connections (0: every socket stays kernel TCP)"};
const core::setting hold_us   {"sockets", "hold_us",   core::setting_type::integer, "10000",
  "a server that writes before reading waits up to this long (or two round trips) for the "
  "offer byte of a client on another host; plain clients of server-speaks-first protocols "
  "there see it once (on this host a server knows a plain client at accept)"};
const core::setting log_level {"sockets", "log_level", core::setting_type::integer, "0",
  "0 silent, 1 errors, 2 warnings, 3 debug (on stderr)"};
const core::setting ports     {"sockets", "ports",     core::setting_type::string,  "",
  "accelerate only connections to or accepted on these ports: '6379,5000-5100' (empty: all)"};
const core::setting exclude   {"sockets", "exclude",   core::setting_type::string,  "",
  "never accelerate connections whose peer or local port, or peer address, is listed: "
  "'22,8000-8080,10.1.2.3' (IPv4 or IPv6 addresses)"};
const core::setting remote    {"sockets", "remote",    core::setting_type::string,  "auto",
  "peers on another host: 'auto' upgrades only where an RDMA device (verbs, efa, cxi, opx) can "
  "beat kernel TCP (libfabric's tcp provider cannot: it is TCP underneath), 'fabric' always, "
  "'tcp' never"};
const core::setting preload_enable {"preload", "enable", core::setting_type::boolean, "1",
  "the LD_PRELOAD interposer routes calls to vmmc sockets (0: every call goes to libc)"};
const core::setting stat      {"sockets", "stat",      core::setting_type::boolean, "1",
  "publish this process's connections for vmmc-stat in <stat_dir>/vmmc-<uid>/<pid>"};
const core::setting stat_dir  {"sockets", "stat_dir",  core::setting_type::string,  "/dev/shm",
  "where processes publish their connections (vmmc-stat reads them) and their users' presence "
  "tables (which sockets run vmmc); the same for every process of the host"};
const core::setting inherit   {"sockets", "inherit",   core::setting_type::string,  "",
  "set by vmmc for a program it execs: connections handed over with the bytes the old image "
  "had taken off them ('fd:memfd,...')", true};
const core::setting upgrade_after {"sockets", "upgrade_after", core::setting_type::integer, "16",
  "a client connection sets up its channel once it has made this many reads and writes on "
  "kernel TCP, or moved 256 KiB: a connection that makes a few calls and closes never pays for "
  "a channel (0: at once)"};
// clang-format on
namespace {
const core::setting table[] = {enable, hold_us, log_level, ports,         exclude,
                               remote, stat,    stat_dir,  upgrade_after, inherit};
const core::setting preload_table[] = {preload_enable};
struct registrar {
  registrar() {
    core::register_settings(table);
    core::register_settings(preload_table);
  }
} const register_once;
}  // namespace
}  // namespace settings

namespace {
// Never destroyed: a fork() child that exits normally must not tear down
// its parent's channels (close_everything does it for the owner).
constinit descriptor_map<stream> streams;
descriptor_map<stream>& table() {
  return streams;
}

void set_slot(int fd, stream_ptr s) {
  auto& t = table();
  stream_ptr gone;  // one closed unseen: destroyed outside the lock (its channel talks to its peer)
  std::lock_guard lock(t.writer());
  gone = t.exchange_locked(fd, std::move(s));
}
}  // namespace

stream_ptr find(int fd) {
  return table().find(fd);
}

stream_ptr adopt(int fd, bool is_client) {
  install_fork_handlers();
  auto s = std::make_shared<stream>(fd);
  s->is_client = is_client;
  set_slot(fd, s);
  return s;
}

void alias(int fd, const stream_ptr& s) {
  forget(fd);
  s->aliases.fetch_add(1);
  set_slot(fd, s);
}

stream_ptr release_slot(int fd) {
  auto& t = table();
  std::lock_guard lock(t.writer());
  stream_ptr s = t.exchange_locked(fd, nullptr);
  if (!s) return s;
  if (s->aliases.fetch_sub(1) == 1) {
    s->closed.store(true);  // epoll sets drop their reference
    stat_forget(fd);
    return s;
  }
  // Other descriptors still name this stream: the kernel calls go through one
  // of them from now on.
  if (s->fd.load() == fd) {
    int other = -1;
    t.for_each_locked([&](int i, const stream_ptr& held) {
      if (held == s && other < 0) other = i;
    });
    if (other >= 0) s->fd.store(other);
    stat_forget(fd);
  }
  return nullptr;
}

void forget(int fd) {
  stream_ptr gone = release_slot(fd);  // destroyed outside the lock: a channel talks to its peer
}

std::vector<int> descriptors() {
  auto& t = table();
  std::lock_guard lock(t.writer());
  std::vector<int> fds;
  t.for_each_locked([&](int fd, const stream_ptr&) { fds.push_back(fd); });
  return fds;
}

namespace {
// Each stream once (a dup()ed socket has a slot per descriptor).
void keep_each_once(std::vector<stream_ptr>& all) {
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
}
}  // namespace

std::vector<stream_ptr> all_streams() {
  auto& t = table();
  std::lock_guard lock(t.writer());
  std::vector<stream_ptr> all;
  t.for_each_locked([&](int, const stream_ptr& s) { all.push_back(s); });
  keep_each_once(all);
  return all;
}

bool enabled() {
  static const bool on = core::setting_bool(settings::enable);
  return on;
}

namespace {
std::atomic<pthread_t> exiting_thread{};  // the thread that runs the exit handlers

// The process's context (core's, shared with the other layers) belongs to
// the process that made it: a fork() child has a copy without its threads,
// which it leaves alone (never lets go of) and replaces with its own on
// first need.
struct process_state {
  std::mutex mutex;
  std::shared_ptr<core::context> ctx;
  pid_t owner = 0;
  bool tried = false;
};
process_state& state() {
  static process_state& st = *new process_state;  // never destroyed, as the table
  return st;
}

// At exit, channels go before the context they live on (and the context
// before libfabric's own teardown), so peers see an orderly end and no
// shared-memory file is left behind. Unless another thread is inside a
// call: then nothing it may use is freed, and nothing is ended early (a
// peer that saw our end could answer, and wake that thread, before the
// process is gone): everything goes with the process, and each peer sees
// its connection end when our descriptors and control connections close,
// as with kernel TCP.
void close_everything() {
  auto& st = state();
  if (st.owner != ::getpid()) return;
  exiting_thread.store(::pthread_self());
  exiting.store(true);
  if (busy_calls.load() > 0) return;
  std::vector<stream_ptr> all;
  {
    auto& t = table();
    std::lock_guard lock(t.writer());
    std::vector<int> fds;
    t.for_each_locked([&](int fd, const stream_ptr&) { fds.push_back(fd); });
    for (int fd : fds) all.push_back(t.exchange_locked(fd, nullptr));
  }
  keep_each_once(all);  // a dup()ed socket is ended once
  // As at close(): the peer reads every byte we sent, then the end (not a
  // vanished peer: over a fabric it saw ETIMEDOUT); our presence entry
  // goes; bytes of our protocol left unread (a server's answer to a writer
  // that never reads) would make the kernel reset the connection when the
  // process is gone, dropping what its send queue still held.
  for (auto& s : all) end_stream(*s);
  all.clear();
  st.ctx.reset();
  // Streams still held elsewhere (an epoll set the program closes in its own
  // atexit handler, which runs after ours) must not reach the context now.
  context_ended.store(true);
}
}  // namespace

namespace {
// A client on this host asks before it has a context (it makes one with
// the server's answer), so close_everything may not be registered yet when
// the answer sits unread at exit; this ends its streams as it would (taking
// the answer, withdrawing an ask not answered yet: a server that has not
// looked yet then sends nothing). With a context, close_everything does.
void discard_at_exit() {
  if (exiting.load() || busy_calls.load() > 0 || context_started()) return;
  for (auto& s : all_streams()) end_stream(*s);
}
}  // namespace

void exit_takes_protocol_bytes() {
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(discard_at_exit); });
}

std::atomic<bool> context_ended{false};
thread_local bool inside_api = false;

std::atomic<int> busy_calls{0};
std::atomic<bool> exiting{false};

bool exiting_elsewhere() {
  return !::pthread_equal(exiting_thread.load(), ::pthread_self());
}

void wait_for_the_end() {
  busy_calls.fetch_sub(1);  // this call never gets further
  for (;;) ::pause();
}

core::context* process_context() {
  auto& st = state();
  std::lock_guard lock(st.mutex);
  pid_t self = ::getpid();
  if (st.owner == self) return st.ctx.get();
  abandon(st.ctx);  // the parent's: its threads are not here
  st.owner = self;
  // Providers open when the first peer on another host needs them; no key
  // file is read or made under the programs we are preloaded into.
  auto c = core::context::shared();
  if (c) {
    st.ctx = std::move(*c);
    if (!st.tried) std::atexit(close_everything);
    st.tried = true;
    stat_context_ready();
  } else {
    log(1, "cannot create the VMMC context (%s): connections stay kernel TCP",
        c.error().message().c_str());
  }
  return st.ctx.get();
}

bool context_started() {
  auto& st = state();
  std::lock_guard lock(st.mutex);
  return st.ctx && st.owner == ::getpid();
}

void log(int level, const char* format, ...) {
  static const int wanted = static_cast<int>(core::setting_integer(settings::log_level));
  if (level > wanted) return;
  char line[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(line, sizeof line, format, args);
  va_end(args);
  std::fprintf(stderr, "vmmc-sockets[%d]: %s\n", static_cast<int>(::getpid()), line);
}

}  // namespace vmmc::sockets::detail

namespace vmmc::sockets {
const bool* inside_flag() noexcept {
  return &detail::inside_api;
}
}  // namespace vmmc::sockets
