// nx/nxrun.cc: the NX launcher. `nxrun -n N program [args...]` starts N
// copies of program on this host as nodes 0..N-1 and relays one all-gather
// of their address blobs (see nx/src/bootstrap.cc for the framing). If a node
// dies (a signal, or a non-zero exit status), every other node is killed and
// nxrun exits with status 1; otherwise it exits with 0 once all have ended.
// Like mpirun, it binds node i to CPU i when there are enough CPUs; with
// more nodes than CPUs, node i goes to CPU i mod count: left unbound, the
// kernel kept moving the yielding nodes (at times all four of a 4-node job
// on one of two CPUs) and gsync took 30 us in place of 8-12
// (`--bind-to none` turns binding off).
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "parse.h"

namespace {

struct node {
  pid_t pid = -1;
  int fd = -1;
  std::string blob;
  std::uint32_t want = 0;  // blob length once the prefix is in
  bool have_length = false, have_blob = false, running = true;
};

std::vector<node> nodes;
volatile sig_atomic_t interrupted = 0;

void on_signal(int sig) {
  interrupted = sig;
}

void kill_all() {
  for (node& n : nodes)
    if (n.running && n.pid > 0) ::kill(n.pid, SIGKILL);
}

int usage() {
  std::fprintf(stderr, "usage: nxrun -n N [--bind-to none|core] program [args...]\n");
  return 2;
}

// Reads what is there of node n's blob; false on EOF/error before it is whole.
bool read_blob(node& n) {
  if (!n.have_length) {
    ssize_t k = ::recv(n.fd, &n.want, sizeof n.want, MSG_WAITALL);
    if (k != sizeof n.want) return false;
    n.have_length = true;
    if (n.want == 0) n.have_blob = true;
    return true;
  }
  char buf[4096];
  ssize_t k = ::read(n.fd, buf, std::min<std::size_t>(sizeof buf, n.want - n.blob.size()));
  if (k <= 0) return false;
  n.blob.append(buf, static_cast<std::size_t>(k));
  n.have_blob = n.blob.size() == n.want;
  return true;
}

// Reaps ended nodes; returns false (after reporting) when one failed.
bool reap(bool block) {
  for (;;) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, block ? 0 : WNOHANG);
    if (pid <= 0) return true;
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      node& n = nodes[i];
      if (n.pid != pid) continue;
      n.running = false;
      if (WIFSIGNALED(status)) {
        std::fprintf(stderr, "nxrun: node %zu (pid %d) killed by signal %d\n", i, pid,
                     WTERMSIG(status));
        return false;
      }
      if (WEXITSTATUS(status) != 0) {
        std::fprintf(stderr, "nxrun: node %zu (pid %d) exited with status %d\n", i, pid,
                     WEXITSTATUS(status));
        return false;
      }
    }
    if (block) return true;
  }
}

int fail() {
  kill_all();
  while (::waitpid(-1, nullptr, 0) > 0) {
  }
  std::fprintf(stderr, "nxrun: job aborted\n");
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  long count = 0;
  bool bind = true;
  int first = 1;
  while (first < argc && argv[first][0] == '-') {
    std::string a = argv[first];
    if ((a == "-n" || a == "-np") && first + 1 < argc) {
      count = std::strtol(argv[first + 1], nullptr, 10);
      first += 2;
    } else if (a == "--bind-to" && first + 1 < argc) {
      bind = std::string(argv[first + 1]) != "none";
      first += 2;
    } else {
      return usage();
    }
  }
  if (count < 1 || count > 1024 || first >= argc) return usage();

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGHUP, &sa, nullptr);

  const std::string job = std::to_string(::getpid());
  struct stat ns {};
  const std::string netns =
      ::stat("/proc/self/ns/net", &ns) == 0 ? std::to_string(ns.st_ino) : std::string();
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof allowed, &allowed) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  bind = bind && !cpus.empty();
  nodes.resize(static_cast<std::size_t>(count));
  for (long i = 0; i < count; ++i) {
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
      std::perror("nxrun: socketpair");
      return fail();
    }
    pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("nxrun: fork");
      return fail();
    }
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (bind) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpus[static_cast<std::size_t>(i) % cpus.size()], &one);
        (void)::sched_setaffinity(0, sizeof one, &one);
      }
      ::close(pair[0]);
      int fd = ::dup(pair[1]);  // without CLOEXEC: the program inherits it
      ::setenv("VMMC_NX_FD", std::to_string(fd).c_str(), 1);
      ::setenv("VMMC_NX_RANK", std::to_string(i).c_str(), 1);
      ::setenv("VMMC_NX_SIZE", std::to_string(count).c_str(), 1);
      ::setenv("VMMC_NX_JOB", job.c_str(), 1);
      ::setenv("VMMC_NX_NETNS", netns.c_str(), 1);  // a node elsewhere is on another host
      ::execvp(argv[first], argv + first);
      std::fprintf(stderr, "nxrun: cannot run %s: %s\n", argv[first], std::strerror(errno));
      std::_Exit(127);
    }
    ::close(pair[1]);
    nodes[static_cast<std::size_t>(i)].pid = pid;
    nodes[static_cast<std::size_t>(i)].fd = pair[0];
  }

  // Start-up: collect every blob, then send everyone the whole table.
  std::size_t complete = 0;
  bool exchanged = false;
  while (!exchanged) {
    if (interrupted) return fail();
    std::vector<pollfd> fds;
    for (node& n : nodes) fds.push_back({n.have_blob ? -1 : n.fd, POLLIN, 0});
    ::poll(fds.data(), fds.size(), 50);
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      node& n = nodes[i];
      if (n.have_blob || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      if (!read_blob(n)) {
        // Ended without joining: fine only if nobody joins (not an NX program).
        n.have_blob = true;
        n.want = UINT32_MAX;
      }
      if (n.have_blob) ++complete;
    }
    if (!reap(false)) return fail();
    if (complete == nodes.size()) {
      bool any_joined = false, any_left = false;
      for (node& n : nodes) (n.want == UINT32_MAX ? any_left : any_joined) = true;
      if (any_joined && any_left) {
        std::fprintf(stderr, "nxrun: a node ended before joining the job\n");
        return fail();
      }
      exchanged = true;
      if (!any_joined) break;
      std::string table;
      for (node& n : nodes) table += vmmc::nx::detail::record(n.blob);
      for (node& n : nodes) (void)vmmc::nx::detail::write_all(n.fd, table.data(), table.size());
    }
  }
  for (node& n : nodes) ::close(n.fd);

  // Run: the first failure ends the job.
  for (;;) {
    if (interrupted) return fail();
    bool any = false;
    for (node& n : nodes) any = any || n.running;
    if (!any) return 0;
    if (!reap(false)) return fail();
    ::usleep(20000);
  }
}
