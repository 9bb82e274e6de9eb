// vmmc-pingpong: the VMMC model in one page. Two processes each export a
// buffer and import the other's; a message is a deliberate update with a
// notification, and the notified side answers the same way. Prints the
// one-way latency per size and the path the imports took.
//
//   vmmc-pingpong [--provider shm|tcp] [--iterations N]
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "vmmc/core/context.h"

namespace {

using namespace vmmc::core;
using clock_type = std::chrono::steady_clock;

std::string read_line(int fd) {
  std::string s;
  char c;
  while (::read(fd, &c, 1) == 1 && c != '\n') s += c;
  return s;
}

void write_line(int fd, const std::string& s) {
  std::string l = s + "\n";
  if (::write(fd, l.data(), l.size()) < 0) std::perror("write");
}

struct side {
  context ctx;
  mappable_buffer inbox;
  volatile std::uint64_t arrived = 0;  // bumped by the notification handler
  import_handle peer{};
};

int run(bool first, int to_peer, int from_peer, const context_options& options, int iterations) {
  auto ctx = context::create(options);
  if (!ctx) {
    std::fprintf(stderr, "context: %s\n", ctx.error().message().c_str());
    return 1;
  }
  side me{std::move(*ctx), {}, 0, {}};
  auto inbox = me.ctx.allocate(1 << 20);
  if (!inbox) return 1;
  me.inbox = std::move(*inbox);
  export_options o;
  o.on_notify = [&me](const notification&) { me.arrived = me.arrived + 1; };
  if (!me.ctx.export_buffer("inbox", me.inbox.data(), me.inbox.size(), o)) return 1;

  write_line(to_peer, me.ctx.address());
  auto imported = me.ctx.import_buffer(read_line(from_peer), "inbox");
  if (!imported) {
    std::fprintf(stderr, "import: %s\n", imported.error().message().c_str());
    return 1;
  }
  me.peer = *imported;
  if (first)
    std::printf("path: %s\n%10s %14s\n", me.ctx.path_of(me.peer)->c_str(), "bytes", "one-way (us)");

  std::vector<std::byte> message(1 << 20, std::byte{42});
  for (std::size_t size : {8, 64, 1024, 16384, 131072, 1048576}) {
    const int rounds = size >= 131072 ? iterations / 10 : iterations;
    // Untimed rounds first: connection set-up, page faults, caches.
    for (int i = 0; i < std::max(rounds / 10, 10); ++i) {
      std::uint64_t target = me.arrived + 1;
      if (first && !me.ctx.send(me.peer, 0, message.data(), size, {true, size}).ok()) return 2;
      while (me.arrived < target) me.ctx.poll_notifications();
      if (!first && !me.ctx.send(me.peer, 0, message.data(), size, {true, size}).ok()) return 2;
    }
    std::uint64_t expected = me.arrived;
    auto start = clock_type::now();
    for (int i = 0; i < rounds; ++i) {
      if (first && !me.ctx.send(me.peer, 0, message.data(), size, {true, size}).ok()) return 2;
      ++expected;
      while (me.arrived < expected) me.ctx.poll_notifications();
      if (!first && !me.ctx.send(me.peer, 0, message.data(), size, {true, size}).ok()) return 2;
    }
    double us = std::chrono::duration<double, std::micro>(clock_type::now() - start).count();
    if (first) std::printf("%10zu %14.2f\n", size, us / rounds / 2);
  }
  write_line(to_peer, "done");
  read_line(from_peer);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  context_options options;
  int iterations = 10000;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--provider") && i + 1 < argc) {
      options.providers = {argv[++i]};
      options.mapped_path = 0;  // measure that provider, not the mapped path
    } else if (!std::strcmp(argv[i], "--iterations") && i + 1 < argc) {
      iterations = std::max(10, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--provider shm|tcp] [--iterations N]\n", argv[0]);
      return 2;
    }
  }
  int a[2], b[2];
  if (::pipe(a) != 0 || ::pipe(b) != 0) return 1;
  pid_t child = ::fork();
  if (child == 0) ::_exit(run(false, b[1], a[0], options, iterations));
  int rc = run(true, a[1], b[0], options, iterations);
  int status = 0;
  ::waitpid(child, &status, 0);
  return rc != 0 ? rc : (WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}
