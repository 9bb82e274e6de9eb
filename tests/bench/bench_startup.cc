// tests/bench/bench_startup.cc: the `startup` benchmark (bench_startup.h).
#include "bench_startup.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>

extern char** environ;

namespace vmmc::bench {

namespace {

// One process started under `preload` (empty: none), with its stdout in
// `out` and, for servers, its stdin a pipe the caller closes to stop it.
struct process {
  pid_t pid = -1;
  int in = -1;   // its stdin (servers)
  int out = -1;  // its stdout
};

process start(const std::vector<std::string>& argv, const std::string& preload, bool server) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "LD_PRELOAD=", 11) != 0) env_strings.emplace_back(*e);
  if (!preload.empty()) env_strings.push_back("LD_PRELOAD=" + preload);
  std::vector<char*> env, args;
  for (auto& s : env_strings) env.push_back(s.data());
  env.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);

  int out[2], in[2] = {-1, -1};
  if (::pipe2(out, O_CLOEXEC) != 0 || (server && ::pipe2(in, O_CLOEXEC) != 0))
    throw std::runtime_error("pipe");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  if (server) posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  process p;
  int rc = ::posix_spawn(&p.pid, args[0], &actions, nullptr, args.data(), env.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  if (server) ::close(in[0]);
  if (rc != 0) throw std::runtime_error("cannot start " + argv[0] + ": " + std::strerror(rc));
  p.out = out[0];
  p.in = in[1];
  return p;
}

std::string read_all(int fd) {
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    text.append(buf, static_cast<std::size_t>(n));
  }
  return text;
}

void finish(process& p, const std::string& what) {
  if (p.in >= 0) ::close(p.in);
  int status = 0;
  while (::waitpid(p.pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (p.out >= 0) ::close(p.out);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error(what + " failed (status " + std::to_string(status) + ")");
}

// Runs a process to its end; returns its stdout and wall time in seconds.
std::pair<std::string, double> run(const std::vector<std::string>& argv,
                                   const std::string& preload) {
  auto t0 = bench_clock::now();
  process p = start(argv, preload, false);
  std::string text = read_all(p.out);
  finish(p, argv[0]);
  return {text, seconds_between(t0, bench_clock::now())};
}

std::vector<double> numbers(const std::string& text) {
  std::vector<double> v;
  std::istringstream in(text);
  for (double x; in >> x;) v.push_back(x);
  return v;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return not_measured;
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(std::lround(p * static_cast<double>(v.size() - 1)))];
}

// A server under `preload`, stopped by the destructor.
struct server {
  process p;
  int port = 0;
  server(const std::string& preload) {
    p = start({VMMC_STARTUP_PEER, "server"}, preload, true);
    char line[32] = {};
    ssize_t n = ::read(p.out, line, sizeof line - 1);
    port = n > 0 ? std::atoi(line) : 0;
    if (port <= 0) throw std::runtime_error("startup server did not start");
  }
  ~server() {
    try {
      finish(p, "startup server");
    } catch (const std::exception& e) {
      std::cerr << "vmmc-bench startup: " << e.what() << "\n";
    }
  }
};

}  // namespace

void run_startup_benchmark(const options& opts, std::vector<result_row>& rows) {
  const std::string vmmc = VMMC_PRELOAD_MODULE, vrpc = VRPC_PRELOAD_MODULE;
  const int rounds = opts.quick ? 10 : 40;
  const int later = opts.quick ? 200 : 1000;

  // Ours and the reference alternate in every loop: the machine is shared.
  std::cout << "measuring exec\n" << std::flush;
  std::vector<double> plain, under_vmmc, under_vrpc;
  for (int i = 0; i < rounds; ++i) {
    plain.push_back(run({"/bin/true"}, "").second * 1e6);
    under_vmmc.push_back(run({"/bin/true"}, vmmc).second * 1e6);
    under_vrpc.push_back(run({"/bin/true"}, vrpc).second * 1e6);
  }
  add_rows(rows, "startup/exec_libvmmc_preload", metric::latency_us, {0}, {median(under_vmmc)},
           {{"kernel", {median(plain)}}});
  add_rows(rows, "startup/exec_libvrpc_preload", metric::latency_us, {0}, {median(under_vrpc)},
           {{"kernel", {median(plain)}}});

  server ours(vmmc), kernel("");
  std::cout << "measuring first connections\n" << std::flush;
  std::vector<double> first_ours, first_kernel, shot_ours, shot_kernel;
  for (int i = 0; i < rounds; ++i) {
    for (bool o : {true, false}) {
      auto [text, seconds] =
          run({VMMC_STARTUP_PEER, "client", std::to_string(o ? ours.port : kernel.port), "1"},
              o ? vmmc : "");
      auto v = numbers(text);
      if (v.size() != 1) throw std::runtime_error("startup client printed " + text);
      (o ? first_ours : first_kernel).push_back(v[0]);
      (o ? shot_ours : shot_kernel).push_back(seconds * 1e6);
    }
  }
  add_rows(rows, "startup/first_connection", metric::latency_us, {1}, {median(first_ours)},
           {{"kernel", {median(first_kernel)}}});
  add_rows(rows, "startup/one_shot_process", metric::latency_us, {1}, {median(shot_ours)},
           {{"kernel", {median(shot_kernel)}}});

  std::cout << "measuring later connections\n" << std::flush;
  std::vector<double> later_ours, later_kernel;
  for (int r = 0; r < 3; ++r) {
    for (bool o : {true, false}) {
      auto [text, seconds] =
          run({VMMC_STARTUP_PEER, "client", std::to_string(o ? ours.port : kernel.port),
               std::to_string(later / 3 + 1)},
              o ? vmmc : "");
      auto v = numbers(text);
      if (v.size() < 2) throw std::runtime_error("startup client printed " + text);
      auto& to = o ? later_ours : later_kernel;
      to.insert(to.end(), v.begin() + 1, v.end());  // the first one is measured above
    }
  }
  const std::size_t measured = later_ours.size();
  add_rows(rows, "startup/connect_p50", metric::latency_us, {measured},
           {percentile(later_ours, 0.5)}, {{"kernel", {percentile(later_kernel, 0.5)}}});
  add_rows(rows, "startup/connect_p99", metric::latency_us, {measured},
           {percentile(later_ours, 0.99)}, {{"kernel", {percentile(later_kernel, 0.99)}}});

  std::cout << "measuring resident memory\n" << std::flush;
  for (int k : {1, 100}) {
    std::vector<double> mb_ours, mb_kernel;
    for (int r = 0; r < 3; ++r) {
      for (bool o : {true, false}) {
        auto text = run({VMMC_STARTUP_PEER, "hold", std::to_string(o ? ours.port : kernel.port),
                         std::to_string(k)},
                        o ? vmmc : "")
                        .first;
        auto v = numbers(text);
        if (v.size() != 1) throw std::runtime_error("startup hold printed " + text);
        (o ? mb_ours : mb_kernel).push_back(v[0] / 1024.0);
      }
    }
    add_rows(rows, "startup/rss", metric::resident_MB, {static_cast<std::size_t>(k)},
             {median(mb_ours)}, {{"kernel", {median(mb_kernel)}}});
  }
}

}  // namespace vmmc::bench
