// The descriptor table, the process-wide VMMC context, settings and logging.
#include <sys/resource.h>

#include <pthread.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <shared_mutex>
#include <vector>

#include "sockets.h"

namespace vmmc::sockets::detail {

namespace settings {
// clang-format off
const core::setting enable    {"sockets", "enable",    core::setting_type::boolean, "1",
  "offer and accept VMMC on TCP connections (0: every socket stays kernel TCP)"};
const core::setting hold_us   {"sockets", "hold_us",   core::setting_type::integer, "10000",
  "a server that writes before reading waits up to this long (or two round trips) for the "
  "client's offer byte; plain clients of server-speaks-first protocols see it once"};
const core::setting log_level {"sockets", "log_level", core::setting_type::integer, "0",
  "0 silent, 1 errors, 2 warnings, 3 debug (on stderr)"};
// clang-format on
namespace {
const core::setting table[] = {enable, hold_us, log_level};
struct registrar {
  registrar() { core::register_settings(table); }
} const register_once;
}  // namespace
}  // namespace settings

namespace {
struct descriptor_table {
  std::shared_mutex mutex;
  std::vector<stream_ptr> slots;
};
descriptor_table& table() {
  static descriptor_table t;
  return t;
}
}  // namespace

stream_ptr find(int fd) {
  auto& t = table();
  std::shared_lock lock(t.mutex);
  if (fd < 0 || static_cast<std::size_t>(fd) >= t.slots.size()) return nullptr;
  return t.slots[static_cast<std::size_t>(fd)];
}

stream_ptr adopt(int fd, bool is_client) {
  auto s = std::make_shared<stream>(fd);
  s->is_client = is_client;
  auto& t = table();
  std::unique_lock lock(t.mutex);
  if (static_cast<std::size_t>(fd) >= t.slots.size())
    t.slots.resize(static_cast<std::size_t>(fd) * 2 + 64);
  t.slots[static_cast<std::size_t>(fd)] = s;
  return s;
}

void forget(int fd) {
  auto& t = table();
  stream_ptr gone;  // destroyed outside the lock: closing a channel talks to the peer
  {
    std::unique_lock lock(t.mutex);
    if (fd >= 0 && static_cast<std::size_t>(fd) < t.slots.size())
      gone = std::move(t.slots[static_cast<std::size_t>(fd)]);
  }
}

bool enabled() {
  static const bool on = core::setting_bool(settings::enable);
  return on;
}

namespace {
std::unique_ptr<core::context>& context_slot() {
  static std::unique_ptr<core::context> ctx;
  return ctx;
}

// At exit, channels go before the context they live on (and the context
// before libfabric's own teardown), so peers see an orderly end and no
// shared-memory file is left behind.
std::atomic<bool> forked{false};
void note_fork_in_child() {
  forked.store(true);
}

void close_everything() {
  if (forked.load()) return;  // the context's threads stayed in the parent
  std::vector<stream_ptr> all;
  {
    auto& t = table();
    std::unique_lock lock(t.mutex);
    all.swap(t.slots);
  }
  all.clear();
  context_slot().reset();
}
}  // namespace

core::context* process_context() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto c = core::context::create();
    if (c) {
      context_slot() = std::make_unique<core::context>(std::move(*c));
      std::atexit(close_everything);
      ::pthread_atfork(nullptr, nullptr, note_fork_in_child);
    } else {
      log(1, "cannot create the VMMC context (%s): connections stay kernel TCP",
          c.error().message().c_str());
    }
  });
  return forked.load() ? nullptr : context_slot().get();
}

bool in_forked_child() {
  return forked.load(std::memory_order_relaxed);
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
